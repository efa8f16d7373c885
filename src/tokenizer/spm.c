/* The SentencePiece processor: builds the lookup structures from a parsed ModelProto, runs
 * normalise -> model -> unknown handling for encoding, and re-assembles text for decoding, with
 * the rules of SentencePiece 0.1.97's SentencePieceProcessor (see spm.h). */
#include "tokenizer/spm.h"
#include <stdlib.h>
#include <string.h>
#include <float.h>

static const char kSpace[] = "\xe2\x96\x81";

int32_t spm_piece_to_id(const spm_model *m, const char *s, size_t len) {
    int32_t id = spm_map_get(&m->reserved, &m->p, s, len);
    if (id >= 0) return id;
    return spm_map_get(&m->normal, &m->p, s, len);
}

static int is_normal_class(int type) { return type == SPM_NORMAL || type == SPM_USER_DEFINED || type == SPM_UNUSED; }

/* Sorts piece ids bytewise by piece (the trie builder wants sorted keys). */
static int cmp_piece(const void *a, const void *b, void *ctx) {
    const spm_proto *p = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int32_t lx = p->piece_len[x], ly = p->piece_len[y];
    int c = memcmp(p->piece[x], p->piece[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    return (lx > ly) - (lx < ly);
}

/* Builds a trie over the pieces with ids in sel[0..n) (values = ids). */
static int build_trie(spm_da *da, const spm_proto *p, int32_t *sel, int n, glm_err *err) {
    qsort_r(sel, (size_t)n, sizeof *sel, cmp_piece, (void *)p);
    char **keys = glm_malloc((size_t)(n + 1) * sizeof *keys);
    int32_t *lens = glm_malloc((size_t)(n + 1) * sizeof *lens);
    for (int i = 0; i < n; i++) { keys[i] = p->piece[sel[i]]; lens[i] = p->piece_len[sel[i]]; }
    int rc = spm_da_build(da, n, keys, lens, sel, err);
    free(keys);
    free(lens);
    return rc;
}

static int init_normalizer(spm_normalizer *nz, const spm_normspec *spec, const char *what, glm_err *err) {
    nz->spec = spec;
    return spm_charsmap_init(&nz->cm, spec->charsmap, spec->charsmap_len, what, err);
}

int spm_model_load(spm_model *m, uint8_t *buf, size_t len, const char *what, glm_err *err) {
    memset(m, 0, sizeof *m);
    if (spm_proto_parse(&m->p, buf, len, what, err)) { spm_model_free(m); return -1; }
    spm_proto *p = &m->p;
    int nnormal = 0;
    for (int32_t i = 0; i < p->n; i++) nnormal += is_normal_class(p->type[i]);
    spm_map_init(&m->normal, nnormal); /* sized from the counts: a full map would never terminate */
    spm_map_init(&m->reserved, p->n - nnormal);
    m->unk_id = -1;
    m->min_score = FLT_MAX;
    m->max_score = FLT_MIN; /* sic: SentencePiece starts from FLT_MIN, the smallest positive float */
    int32_t *sel = glm_malloc((size_t)(p->n + 1) * sizeof *sel), *usel = glm_malloc((size_t)(p->n + 1) * sizeof *usel);
    int nsel = 0, nuser = 0;
    for (int32_t i = 0; i < p->n; i++) {
        int t = p->type[i];
        int32_t dup = spm_map_put(is_normal_class(t) ? &m->normal : &m->reserved, p, i);
        if (dup >= 0) {
            free(sel); free(usel);
            glm_fail(err, "%s: piece %s is defined twice (ids %d and %d)", what, p->piece[i], dup, i);
            spm_model_free(m);
            return -1;
        }
        if (t == SPM_UNKNOWN) m->unk_id = i;
        if (t == SPM_NORMAL) {
            if (p->score[i] < m->min_score) m->min_score = p->score[i];
            if (p->score[i] > m->max_score) m->max_score = p->score[i];
        }
        if (t == SPM_NORMAL || t == SPM_USER_DEFINED) sel[nsel++] = i;
        if (t == SPM_USER_DEFINED) usel[nuser++] = i;
    }
    for (int b = 0; b < 256; b++) {
        char pc[8];
        snprintf(pc, sizeof pc, "<0x%02X>", b);
        m->byte_id[b] = p->byte_fallback ? spm_piece_to_id(m, pc, 6) : -1;
    }
    int rc = 0;
    if (p->model_type == SPM_UNIGRAM) {
        m->vscore = glm_malloc((size_t)p->n * sizeof *m->vscore);
        for (int32_t i = 0; i < p->n; i++)
            m->vscore[i] = p->type[i] == SPM_USER_DEFINED ? (double)((float)p->piece_len[i] * m->max_score) - 0.1
                                                          : (double)p->score[i];
        rc = build_trie(&m->trie, p, sel, nsel, err);
    }
    if (!rc && nuser > 0) {
        m->has_user = 1;
        for (int i = 0; i < nuser; i++) m->user_first[(uint8_t)p->piece[usel[i]][0]] = 1;
        rc = build_trie(&m->user, p, usel, nuser, err);
    }
    free(sel);
    free(usel);
    if (!rc) rc = init_normalizer(&m->norm, &p->norm, what, err);
    if (!rc && p->denorm.present && p->denorm.charsmap) {
        m->has_denorm = 1;
        rc = init_normalizer(&m->denorm, &p->denorm, what, err);
    }
    if (rc) { spm_model_free(m); return -1; }
    m->norm.treat_ws_as_suffix = p->treat_ws_as_suffix;
    m->norm.user = m->has_user ? &m->user : NULL;
    m->norm.user_first = m->user_first;
    return 0;
}

void spm_model_free(spm_model *m) {
    if (!m) return;
    spm_map_free(&m->normal);
    spm_map_free(&m->reserved);
    spm_da_free(&m->trie);
    spm_da_free(&m->user);
    free(m->vscore);
    spm_charsmap_free(&m->norm.cm);
    spm_charsmap_free(&m->denorm.cm);
    spm_proto_free(&m->p);
    memset(m, 0, sizeof *m);
}

/* WORD model: split before every U+2581 (whole words with their leading space). */
static void word_encode(const spm_model *m, spm_scratch *sc) {
    const char *s = sc->norm.s;
    size_t n = sc->norm.n, start = 0;
    for (size_t off = 0; off < n;) {
        size_t cl = (size_t)spm_one_char_len((uint8_t)s[off]);
        if (cl > n - off) cl = n - off;
        if (off > 0 && cl == 3 && memcmp(s + off, kSpace, 3) == 0) {
            int32_t id = spm_piece_to_id(m, s + start, off - start);
            spm_tok_push(sc, id < 0 ? m->unk_id : id, (uint32_t)start, (uint32_t)(off - start));
            start = off;
        }
        off += cl;
    }
    int32_t id = spm_piece_to_id(m, s + start, n - start);
    spm_tok_push(sc, id < 0 ? m->unk_id : id, (uint32_t)start, (uint32_t)(n - start));
}

/* CHAR model: one piece per character (or user-defined symbol). */
static void char_encode(const spm_model *m, spm_scratch *sc) {
    const char *s = sc->norm.s;
    size_t n = sc->norm.n;
    for (size_t off = 0; off < n;) {
        size_t len = 0;
        int32_t v;
        if (m->has_user && m->user_first[(uint8_t)s[off]]) len = spm_da_longest(&m->user, s + off, n - off, &v);
        if (!len) {
            len = (size_t)spm_one_char_len((uint8_t)s[off]);
            if (len > n - off) len = n - off;
        }
        int32_t id = spm_piece_to_id(m, s + off, len);
        spm_tok_push(sc, id < 0 ? m->unk_id : id, (uint32_t)off, (uint32_t)len);
        off += len;
    }
}

int spm_encode(const spm_model *m, const char *text, size_t len, spm_scratch *sc, glm_err *err) {
    sc->ntok = 0;
    if (len > SPM_MAX_TEXT)
        return glm_fail(err, "text of %zu bytes is too long to tokenize (limit %zu bytes)", len, SPM_MAX_TEXT);
    spm_normalize(&m->norm, text, len, &sc->norm);
    if (sc->norm.n > SPM_MAX_TEXT * 3)
        return glm_fail(err, "normalised text of %zu bytes is too long to tokenize", sc->norm.n);
    if (sc->norm.n == 0) return 0;
    switch (m->p.model_type) {
    case SPM_UNIGRAM: spm_unigram_encode(m, sc); break;
    case SPM_BPE: spm_bpe_encode(m, sc); break;
    case SPM_WORD: word_encode(m, sc); break;
    default: char_encode(m, sc); break;
    }
    /* Unknown pieces: spelled out as byte pieces with byte_fallback, else consecutive ones merged
     * into a single <unk> (SentencePiece's PopulateSentencePieceText). Rewritten in place: the
     * output never gets longer than the input except with byte fallback, handled by copying. */
    int any_unk = 0;
    for (int i = 0; i < sc->ntok && !any_unk; i++) any_unk = sc->tok[i].id == m->unk_id;
    if (!any_unk) return 0;
    if (m->p.byte_fallback) {
        int n0 = sc->ntok;
        size_t bytes = (size_t)n0 * sizeof(spm_tok);
        spm_tok *copy = spm_scratch_work(&sc->work2, &sc->work2_cap, bytes);
        memcpy(copy, sc->tok, bytes);
        sc->ntok = 0;
        for (int i = 0; i < n0; i++) {
            spm_tok t = copy[i];
            if (t.id != m->unk_id) { spm_tok_push(sc, t.id, t.off, t.len); continue; }
            for (uint32_t k = 0; k < t.len; k++)
                spm_tok_push(sc, m->byte_id[(uint8_t)sc->norm.s[t.off + k]], t.off + k, 1);
        }
    } else {
        int w = 0;
        for (int i = 0; i < sc->ntok; i++) {
            spm_tok t = sc->tok[i];
            if (t.id == m->unk_id && w > 0 && sc->tok[w - 1].id == m->unk_id &&
                sc->tok[w - 1].off + sc->tok[w - 1].len == t.off)
                sc->tok[w - 1].len += t.len;
            else
                sc->tok[w++] = t;
        }
        sc->ntok = w;
    }
    return 0;
}

/* ---------------- decoding ---------------- */

/* Byte pieces are gathered into runs; each run is split into UTF-8 characters, a malformed byte
 * becoming U+FFFD on its own. */
static void flush_bytes(spm_buf *out, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n;) {
        int cl = spm_utf8_valid_len(b + i, n - i);
        if (cl == 0) { spm_buf_put(out, "\xEF\xBF\xBD", 3); i++; }
        else { spm_buf_put(out, (const char *)b + i, (size_t)cl); i += (size_t)cl; }
    }
}

void spm_decode(const spm_model *m, const int32_t *ids, int n, spm_buf *out) { spm_decode_lit(m, ids, NULL, n, out); }

void spm_decode_lit(const spm_model *m, const int32_t *ids, const char *const *lit, int n, spm_buf *out) {
    const spm_proto *p = &m->p;
    size_t start = out->n;
    uint8_t bytes_small[256];
    uint8_t *bytes = bytes_small;
    size_t nb = 0, capb = sizeof bytes_small;
    /* is_bos_ws: we still expect the dummy-prefix space to strip. With remove_extra_whitespaces
     * every leading U+2581 is stripped until some text has been produced. */
    int is_bos_ws = 1, bos_ws_seen = 0;
    const int strip_ok = p->norm.add_dummy_prefix || p->norm.remove_extra_whitespaces;
    for (int i = 0; i <= n; i++) {
        int32_t id = -1;
        if (i < n && !(lit && lit[i])) {
            id = ids[i];
            if (id < 0 || id >= p->n) continue;
            if (p->type[id] == SPM_BYTE) {
                if (nb == capb) {
                    capb *= 2;
                    bytes = bytes == bytes_small ? memcpy(glm_malloc(capb), bytes_small, nb) : glm_realloc(bytes, capb);
                }
                bytes[nb++] = (uint8_t)strtol(p->piece[id] + 3, NULL, 16);
                continue;
            }
        }
        if (nb) { flush_bytes(out, bytes, nb); nb = 0; }
        if (i == n) break;
        if (bos_ws_seen || out->n > start) is_bos_ws = 0;
        bos_ws_seen = 0;
        if (lit && lit[i]) { spm_buf_put(out, lit[i], strlen(lit[i])); continue; } /* copied as it is */
        int t = p->type[id];
        if (t == SPM_CONTROL) continue;
        if (t == SPM_UNKNOWN) { spm_buf_put(out, p->unk_surface, strlen(p->unk_surface)); continue; }
        const char *s = p->piece[id];
        size_t len = (size_t)p->piece_len[id];
        if (is_bos_ws && strip_ok && len >= 3 && memcmp(s, kSpace, 3) == 0) {
            s += 3;
            len -= 3;
            bos_ws_seen = !p->norm.remove_extra_whitespaces;
        }
        for (size_t k = 0; k < len;) {
            if (k + 3 <= len && memcmp(s + k, kSpace, 3) == 0) { spm_buf_put(out, " ", 1); k += 3; }
            else { spm_buf_put(out, s + k, 1); k++; }
        }
    }
    if (bytes != bytes_small) free(bytes);
    if (m->has_denorm) {
        spm_buf tmp = {0};
        spm_normalize(&m->denorm, out->s + start, out->n - start, &tmp);
        out->n = start;
        spm_buf_put(out, tmp.s, tmp.n);
        free(tmp.s);
    }
}
