/* GLM-4's tokenizer.model: a text file, one token per line, "<base64 of the token's bytes> <rank>"
 * (tiktoken's .tiktoken format), the ranks being the ids 0..n-1. THUDM's loader splits each line
 * at whitespace and fills a dict, so a broken file fails there or silently loses tokens; here every
 * line is checked and an error names the file and the line. The ranks go into an open-addressing
 * hash table (bytes -> rank), which is what the merge loop hits for every adjacent pair. */
#include "tokenizer/bpe_bytes.h"
#include <stdlib.h>
#include <string.h>

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 (padding required, '=' only at the end): the decoded length, or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    long o = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            int d = (i + k >= n - pad) ? 0 : b64_value((unsigned char)s[i + k]);
            if (d < 0) return -1;
            v = v << 6 | (uint32_t)d;
        }
        size_t keep = i + 4 < n ? 3 : 3 - pad;
        for (size_t k = 0; k < keep; k++) out[o++] = (uint8_t)(v >> (16 - 8 * k));
    }
    return o;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

int bpe_looks_like_ranks(const char *buf, size_t len) {
    if (len == 0 || b64_value((unsigned char)buf[0]) < 0) return 0;
    for (size_t i = 0; i < len && buf[i] != '\n'; i++)
        if (b64_value((unsigned char)buf[i]) < 0 && buf[i] != '=' && !is_blank(buf[i])) return 0;
    return 1;
}

/* FNV-1a: the keys are short (a few bytes), so a simple byte loop is as fast as anything. */
static uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

int32_t bpe_rank(const bpe_bytes *b, const uint8_t *s, size_t len) {
    uint64_t h = hash_bytes(s, len);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & b->mask;; i = (i + 1) & b->mask) {
        const bpe_slot *sl = &b->slots[i];
        if (sl->rank < 0) return -1;
        if (sl->hash == tag && b->len[sl->rank] == len && memcmp(b->arena + b->off[sl->rank], s, len) == 0)
            return sl->rank;
    }
}

/* Inserts rank r (its bytes already in the arena); returns the rank that has the same bytes, or -1. */
static int32_t insert(bpe_bytes *b, int32_t r) {
    const uint8_t *s = (const uint8_t *)b->arena + b->off[r];
    int32_t old = bpe_rank(b, s, b->len[r]);
    if (old >= 0) return old;
    uint64_t h = hash_bytes(s, b->len[r]);
    uint32_t i = (uint32_t)h & b->mask;
    while (b->slots[i].rank >= 0) i = (i + 1) & b->mask;
    b->slots[i] = (bpe_slot){(uint32_t)(h >> 32), r};
    return -1;
}

/* One line, trimmed: the two fields or an error. */
static int parse_line(bpe_bytes *b, const char *s, size_t n, int ln, int32_t n_lines, size_t *arena_n,
                      int32_t *line_of, const char *what, glm_err *err) {
    while (n && is_blank(s[n - 1])) n--;
    size_t i = 0;
    while (i < n && is_blank(s[i])) i++;
    if (i == n) return glm_fail(err, "%s line %d is empty", what, ln);
    size_t t0 = i;
    while (i < n && !is_blank(s[i])) i++;
    size_t t1 = i;
    while (i < n && is_blank(s[i])) i++;
    size_t r0 = i;
    while (i < n && !is_blank(s[i])) i++;
    size_t r1 = i;
    while (i < n && is_blank(s[i])) i++;
    if (r0 == r1) return glm_fail(err, "%s line %d: \"%.*s\" has no rank (a line is \"<base64> <rank>\")", what, ln,
                                  (int)(t1 - t0 > 60 ? 60 : t1 - t0), s + t0);
    if (i < n) return glm_fail(err, "%s line %d: more than two fields (a line is \"<base64> <rank>\")", what, ln);
    int64_t rank = 0;
    for (size_t k = r0; k < r1; k++) {
        if (s[k] < '0' || s[k] > '9' || rank > INT32_MAX)
            return glm_fail(err, "%s line %d: rank \"%.*s\" is not a number", what, ln, (int)(r1 - r0 > 30 ? 30 : r1 - r0),
                            s + r0);
        rank = rank * 10 + (s[k] - '0');
    }
    if (rank >= n_lines)
        return glm_fail(err, "%s line %d: rank %lld is out of range: the file has %d tokens, so ranks are 0 to %d", what,
                        ln, (long long)rank, (int)n_lines, (int)n_lines - 1);
    int32_t r = (int32_t)rank;
    if (line_of[r]) return glm_fail(err, "%s line %d: rank %d was already given on line %d", what, ln, (int)r, line_of[r]);
    long nb = b64_decode(s + t0, t1 - t0, (uint8_t *)b->arena + *arena_n);
    if (nb < 0) return glm_fail(err, "%s line %d: \"%.*s\" is not base64", what, ln, (int)(t1 - t0 > 60 ? 60 : t1 - t0), s + t0);
    b->off[r] = (uint32_t)*arena_n;
    b->len[r] = (uint32_t)nb;
    b->arena[*arena_n + (size_t)nb] = 0;
    *arena_n += (size_t)nb + 1;
    line_of[r] = ln;
    int32_t same = insert(b, r);
    if (same >= 0)
        return glm_fail(err, "%s line %d: token \"%.*s\" (rank %d) is the same bytes as rank %d on line %d", what, ln,
                        (int)(t1 - t0 > 60 ? 60 : t1 - t0), s + t0, (int)r, (int)same, line_of[same]);
    return 0;
}

int bpe_ranks_parse(bpe_bytes *b, const char *buf, size_t len, const char *what, glm_err *err) {
    memset(b, 0, sizeof *b);
    if (len >= UINT32_MAX) return glm_fail(err, "%s: %zu bytes is too large for a rank file", what, len);
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    if (len && buf[len - 1] != '\n') lines++;
    if (lines == 0 || lines > INT32_MAX / 2) return glm_fail(err, "%s: %lld lines is not a rank file", what, (long long)lines);
    int32_t n = (int32_t)lines;
    b->n = n;
    b->arena = glm_malloc(len + 1); /* base64 shrinks 4:3, and each line gives up a space for the NUL */
    b->off = glm_calloc((size_t)n, sizeof *b->off);
    b->len = glm_calloc((size_t)n, sizeof *b->len);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n) cap *= 2;
    b->slots = glm_malloc(cap * sizeof *b->slots);
    for (uint32_t i = 0; i < cap; i++) b->slots[i] = (bpe_slot){0, -1};
    b->mask = cap - 1;
    int32_t *line_of = glm_calloc((size_t)n, sizeof *line_of);
    size_t arena_n = 0, pos = 0;
    int rc = 0;
    for (int ln = 1; !rc && pos < len; ln++) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        rc = parse_line(b, buf + pos, end - pos, ln, n, &arena_n, line_of, what, err);
        pos = end + 1;
    }
    for (int c = 0; !rc && c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        b->byte_rank[c] = bpe_rank(b, &byte, 1);
        if (b->byte_rank[c] < 0) {
            glm_fail(err, "%s: no token is the single byte 0x%02x", what, c);
            rc = glm_hint(err, "byte-level BPE needs all 256 single bytes as tokens; is this GLM-4's tokenizer.model?");
        }
    }
    free(line_of);
    if (!rc) {
        b->pair_rank = glm_malloc(65536 * sizeof *b->pair_rank);
        for (int i = 0; i < 65536; i++) b->pair_rank[i] = bpe_rank(b, (const uint8_t[]){(uint8_t)(i >> 8), (uint8_t)i}, 2);
    }
    if (rc) {
        if (!err || !err->hint[0])
            glm_hint(err, "GLM-4's tokenizer.model has one \"<base64 of the token's bytes> <rank>\" line per token, "
                     "ranks 0 to n-1");
        bpe_free(b);
    }
    return rc;
}
