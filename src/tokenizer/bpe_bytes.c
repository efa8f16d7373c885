/* Byte-level BPE encode and decode, following tiktoken (the library GLM-4's tokenizer wraps) so
 * that ids are identical: special tokens first split the text (only when asked), the regex then
 * cuts each segment into pieces, a piece that is a whole token is that id, and any other piece is
 * merged from single bytes by repeatedly joining the adjacent pair whose bytes have the lowest
 * rank (the leftmost such pair on a tie) until no adjacent pair is a token.
 *
 * tiktoken rescans all pairs after every merge (quadratic in the piece); a heap of candidate pairs
 * gives the same merges in n log n, which matters for the long whitespace and symbol runs that
 * real training data has. Candidates go stale when a neighbour merges; they are recognised when
 * popped (the pair's left part no longer starts there, or the right part no longer ends there). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/bpe_bytes.h"
#include "core/utf8.h"
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

int bpe_utf8_char(const uint8_t *s, size_t n) {
    uint8_t need = 0, lo = 0, hi = 0;
    for (size_t k = 0;; k++) {
        if (k >= n) return -(int)k;
        int u = glm_utf8_step(&need, &lo, &hi, s[k]);
        if (u < 0) return k ? -(int)k : -1;
        if (!need) return (int)k + 1;
    }
}

int bpe_set_pattern(bpe_bytes *b, const char *pattern, glm_err *err) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return glm_fail(err, "the pre-tokenisation pattern does not compile (at offset %zu): %s", (size_t)at, (char *)msg);
    }
    /* Without JIT (a libpcre2 built without it) the interpreter gives the same matches, slower. */
    b->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    b->re = re;
    return 0;
}

int bpe_add_special(bpe_bytes *b, const char *text, glm_err *err) {
    if (b->n_special == BPE_MAX_SPECIAL || !text[0] || strlen(text) >= sizeof b->special[0])
        return glm_fail(err, "special token \"%s\": too many or too long", text);
    strcpy(b->special[b->n_special++], text);
    b->special_first[(uint8_t)text[0]] = 1;
    return 0;
}

/* ---- the merge of one piece ---- */
static inline int32_t rank_of(const bpe_bytes *b, const uint8_t *s, size_t len) {
    return len == 2 ? b->pair_rank[s[0] << 8 | s[1]] : bpe_rank(b, s, len);
}

typedef struct bpe_pair { int32_t rank; uint32_t pos, end; } bpe_pair; /* joins the parts at pos and up to end */

static int pair_before(bpe_pair a, bpe_pair b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(bpe_pair *h, int *n, bpe_pair x) {
    int i = (*n)++;
    while (i > 0 && pair_before(x, h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = x;
}

static bpe_pair heap_pop(bpe_pair *h, int *n) {
    bpe_pair top = h[0], x = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_before(h[c + 1], h[c])) c++;
        if (!pair_before(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
    return top;
}

static void merge_piece(const bpe_bytes *b, const uint8_t *p, uint32_t n, spm_scratch *sc, glm_ids *out) {
    size_t bytes = (size_t)n * (2 * sizeof(uint32_t) + sizeof(int32_t) + 3 * sizeof(bpe_pair));
    uint32_t *next = spm_scratch_work(&sc->work, &sc->work_cap, bytes); /* next[i]: where the part at i ends */
    uint32_t *prev = next + n;                                            /* prev[i]: where the part before i starts */
    int32_t *rank = (int32_t *)(prev + n);     /* the part at i's rank; -1 when i lies inside a part */
    bpe_pair *heap = (bpe_pair *)(rank + n);   /* at most n-1 first pairs and 2 more per merge */
    int nh = 0;
    for (uint32_t i = 0; i < n; i++) {
        next[i] = i + 1;
        prev[i] = i - 1;
        rank[i] = b->byte_rank[p[i]];
    }
    for (uint32_t i = 0; i + 1 < n; i++) {
        int32_t r = b->pair_rank[p[i] << 8 | p[i + 1]];
        if (r >= 0) heap_push(heap, &nh, (bpe_pair){r, i, i + 2});
    }
    while (nh) {
        bpe_pair m = heap_pop(heap, &nh);
        uint32_t right = next[m.pos];
        if (rank[m.pos] < 0 || right >= n || next[right] != m.end) continue; /* stale */
        rank[m.pos] = m.rank;
        rank[right] = -1;
        next[m.pos] = m.end;
        if (m.end < n) prev[m.end] = m.pos;
        if (m.pos > 0) {
            uint32_t l = prev[m.pos];
            int32_t r = rank_of(b, p + l, m.end - l);
            if (r >= 0) heap_push(heap, &nh, (bpe_pair){r, l, m.end});
        }
        if (m.end < n) {
            uint32_t e = next[m.end];
            int32_t r = rank_of(b, p + m.pos, e - m.pos);
            if (r >= 0) heap_push(heap, &nh, (bpe_pair){r, m.pos, e});
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) glm_ids_push(out, rank[i]);
}

/* ---- encode ---- */

/* Splits s[0..n) with the pattern and encodes each piece, as tiktoken's encode_ordinary. */
static int encode_ordinary(const bpe_bytes *b, const char *s, size_t n, pcre2_match_data *md, spm_scratch *sc,
                           glm_ids *out, glm_err *err) {
    const pcre2_code *re = b->re;
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break; /* like tiktoken, text no alternative matches is dropped */
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return glm_fail(err, "splitting the text at byte %zu failed: %s", pos, (char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) return glm_fail(err, "the pre-tokenisation pattern matched an empty piece at byte %zu", pos);
        const uint8_t *p = (const uint8_t *)s + ov[0];
        size_t len = ov[1] - ov[0];
        int32_t r = len == 1 ? b->byte_rank[p[0]] : rank_of(b, p, len);
        if (r >= 0) glm_ids_push(out, r);
        else merge_piece(b, p, (uint32_t)len, sc, out);
        pos = ov[1];
    }
    return 0;
}

/* The first special token at or after `from` (the longest one starting there): its position, or n. */
static size_t find_special(const bpe_bytes *b, const char *s, size_t n, size_t from, int *id, size_t *slen) {
    for (size_t i = from; i < n; i++) {
        if (!b->special_first[(uint8_t)s[i]]) continue;
        size_t best = 0;
        for (int k = 0; k < b->n_special; k++) {
            size_t l = strlen(b->special[k]);
            if (l > best && l <= n - i && memcmp(s + i, b->special[k], l) == 0) { best = l; *id = b->n + k; }
        }
        if (best) { *slen = best; return i; }
    }
    return n;
}

int bpe_encode(const bpe_bytes *b, const char *text, size_t len, int allow_special, spm_scratch *sc, glm_ids *out,
               glm_err *err) {
    if (len > UINT32_MAX / 2) return glm_fail(err, "text of %zu bytes is too long to tokenize", len);
    /* Checked once here so that every match can skip PCRE2's own check (which rescans to the end). */
    for (size_t i = 0; i < len;) {
        int c = bpe_utf8_char((const uint8_t *)text + i, len - i);
        if (c < 0) {
            glm_fail(err, "text is not valid UTF-8 at byte %zu (0x%02x): GLM-4's tokenizer splits text by Unicode "
                     "character classes", i, (uint8_t)text[i]);
            return glm_hint(err, "decode the data as UTF-8 (or repair it, e.g. with errors=\"replace\") before training");
        }
        i += (size_t)c;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
    if (!md) GLM_FATAL("the machine is out of memory", "pcre2_match_data_create_from_pattern failed");
    int rc = 0;
    for (size_t pos = 0; !rc;) {
        int id = -1;
        size_t slen = 0, at = allow_special ? find_special(b, text, len, pos, &id, &slen) : len;
        rc = encode_ordinary(b, text + pos, at - pos, md, sc, out, err);
        if (at == len) break;
        glm_ids_push(out, id);
        pos = at + slen;
    }
    pcre2_match_data_free(md);
    return rc;
}

/* ---- decode ---- */

const char *bpe_token(const bpe_bytes *b, int32_t id, size_t *len) {
    if (id >= 0 && id < b->n) { *len = b->len[id]; return b->arena + b->off[id]; }
    if (id >= b->n && id - b->n < b->n_special) { *len = strlen(b->special[id - b->n]); return b->special[id - b->n]; }
    return NULL;
}

void bpe_decode(const bpe_bytes *b, const int32_t *ids, int n, int skip_special, int utf8_replace, spm_buf *out) {
    size_t start = out->n;
    for (int i = 0; i < n; i++) {
        size_t l;
        const char *s = bpe_token(b, ids[i], &l);
        if (s && !(skip_special && ids[i] >= b->n && !b->special_text[ids[i] - b->n])) spm_buf_put(out, s, l);
    }
    if (!utf8_replace) return;
    size_t i = start;
    while (i < out->n) { /* most text is valid: copy only from the first malformed byte on */
        int c = bpe_utf8_char((const uint8_t *)out->s + i, out->n - i);
        if (c < 0) break;
        i += (size_t)c;
    }
    if (i == out->n) return;
    size_t tail = out->n - i;
    char *copy = glm_malloc(tail);
    memcpy(copy, out->s + i, tail);
    out->n = i;
    for (size_t k = 0; k < tail;) {
        int c = bpe_utf8_char((const uint8_t *)copy + k, tail - k);
        if (c < 0) { spm_buf_put(out, "\xEF\xBF\xBD", 3); k += (size_t)-c; }
        else { spm_buf_put(out, copy + k, (size_t)c); k += (size_t)c; }
    }
    free(copy);
}

void bpe_free(bpe_bytes *b) {
    if (!b) return;
    pcre2_code_free(b->re);
    free(b->arena);
    free(b->off);
    free(b->len);
    free(b->slots);
    free(b->pair_rank);
    memset(b, 0, sizeof *b);
}
