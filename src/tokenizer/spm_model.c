/* Reader for SentencePiece .model files: a protobuf ModelProto decoded straight from the wire
 * format (no protobuf library). Only the fields that change encoding or decoding are kept; the
 * others are skipped by wire type, as protobuf does with fields it does not know. Every length is
 * checked against the bytes left, so a truncated or foreign file gives an error naming the byte
 * offset instead of reading past the buffer. */
#include "tokenizer/spm.h"
#include <stdlib.h>
#include <string.h>

typedef struct rd {
    const uint8_t *p, *end, *base;
    const char *what;
    glm_err *err;
} rd;

static int rd_fail(rd *r, const char *why) {
    glm_fail(r->err, "%s: not a valid SentencePiece model: %s at byte %zu", r->what, why,
             (size_t)(r->p - r->base));
    return glm_hint(r->err, "pass a SentencePiece .model file (e.g. ice_text.model); the file may be truncated or corrupt");
}

static int rd_varint(rd *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return rd_fail(r, "truncated varint");
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) { *v = x; return 0; }
    }
    return rd_fail(r, "varint longer than 10 bytes");
}

/* Reads a field key; wire types 3/4 (groups) never occur in SentencePiece protos. */
static int rd_key(rd *r, uint32_t *field, int *wt) {
    uint64_t k = 0;
    if (rd_varint(r, &k)) return -1;
    *field = (uint32_t)(k >> 3);
    *wt = (int)(k & 7);
    if (*field == 0 || *wt == 3 || *wt == 4 || *wt > 5) return rd_fail(r, "invalid field key");
    return 0;
}

static int rd_bytes(rd *r, const uint8_t **s, size_t *n) {
    uint64_t len = 0;
    if (rd_varint(r, &len)) return -1;
    if (len > (uint64_t)(r->end - r->p)) return rd_fail(r, "length-delimited field runs past the end of the file");
    *s = r->p;
    *n = (size_t)len;
    r->p += len;
    return 0;
}

static int rd_skip(rd *r, int wt) {
    uint64_t v;
    const uint8_t *s;
    size_t n;
    switch (wt) {
    case 0: return rd_varint(r, &v);
    case 1: if (r->end - r->p < 8) return rd_fail(r, "truncated fixed64"); r->p += 8; return 0;
    case 2: return rd_bytes(r, &s, &n);
    case 5: if (r->end - r->p < 4) return rd_fail(r, "truncated fixed32"); r->p += 4; return 0;
    }
    return rd_fail(r, "invalid wire type");
}

/* A known field with an unexpected wire type means this is not a ModelProto. */
static int rd_expect(rd *r, uint32_t field, int wt, int want) {
    if (wt == want) return 0;
    char why[96];
    snprintf(why, sizeof why, "field %u has wire type %d (expected %d)", field, wt, want);
    return rd_fail(r, why);
}

static rd sub(const rd *r, const uint8_t *s, size_t n) {
    rd c = *r;
    c.p = s;
    c.end = s + n;
    return c;
}

typedef struct raw_piece { const uint8_t *s; size_t n; float score; int type; } raw_piece;

static int parse_piece(rd *r, raw_piece *pc) {
    pc->s = NULL; pc->n = 0; pc->score = 0; pc->type = SPM_NORMAL;
    while (r->p < r->end) {
        uint32_t f; int wt; uint64_t v;
        if (rd_key(r, &f, &wt)) return -1;
        if (f == 1) {
            if (rd_expect(r, f, wt, 2) || rd_bytes(r, &pc->s, &pc->n)) return -1;
        } else if (f == 2) {
            if (rd_expect(r, f, wt, 5)) return -1;
            if (r->end - r->p < 4) return rd_fail(r, "truncated score");
            uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
            memcpy(&pc->score, &u, 4);
            r->p += 4;
        } else if (f == 3) {
            if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1;
            if (v < 1 || v > 6) {
                glm_fail(r->err, "%s: piece type %llu is not supported (known: 1..6)", r->what, (unsigned long long)v);
                return -1;
            }
            pc->type = (int)v;
        } else if (rd_skip(r, wt)) return -1;
    }
    return 0;
}

static int parse_trainer(rd *r, spm_proto *p) {
    while (r->p < r->end) {
        uint32_t f; int wt; uint64_t v;
        const uint8_t *s = NULL; size_t n = 0;
        if (rd_key(r, &f, &wt)) return -1;
        switch (f) {
        case 3: /* model_type */
            if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1;
            if (v < 1 || v > 4) {
                glm_fail(r->err, "%s: model_type %llu is not supported (UNIGRAM=1, BPE=2, WORD=3, CHAR=4)", r->what,
                         (unsigned long long)v);
                return -1;
            }
            p->model_type = (int)v;
            break;
        case 4: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; p->vocab_size = (int)v; break;
        case 24: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; p->treat_ws_as_suffix = v != 0; break;
        case 35: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; p->byte_fallback = v != 0; break;
        case 40: case 41: case 42: case 43: { /* unk/bos/eos/pad ids: int32, negative as 10-byte varints */
            if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1;
            int32_t id = (int32_t)(uint32_t)v;
            if (f == 40) p->unk_id = id; else if (f == 41) p->bos_id = id; else if (f == 42) p->eos_id = id; else p->pad_id = id;
            break;
        }
        case 44: /* unk_surface */
            if (rd_expect(r, f, wt, 2) || rd_bytes(r, &s, &n)) return -1;
            if (n >= sizeof p->unk_surface) n = sizeof p->unk_surface - 1;
            memcpy(p->unk_surface, s, n);
            p->unk_surface[n] = 0;
            break;
        default:
            if (rd_skip(r, wt)) return -1;
        }
    }
    return 0;
}

static int parse_normspec(rd *r, spm_normspec *ns) {
    ns->present = 1;
    while (r->p < r->end) {
        uint32_t f; int wt; uint64_t v;
        const uint8_t *s = NULL; size_t n = 0;
        if (rd_key(r, &f, &wt)) return -1;
        switch (f) {
        case 1:
            if (rd_expect(r, f, wt, 2) || rd_bytes(r, &s, &n)) return -1;
            if (n >= sizeof ns->name) n = sizeof ns->name - 1;
            memcpy(ns->name, s, n);
            ns->name[n] = 0;
            break;
        case 2:
            if (rd_expect(r, f, wt, 2) || rd_bytes(r, &s, &n)) return -1;
            ns->charsmap = n ? s : NULL;
            ns->charsmap_len = n;
            break;
        case 3: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; ns->add_dummy_prefix = v != 0; break;
        case 4: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; ns->remove_extra_whitespaces = v != 0; break;
        case 5: if (rd_expect(r, f, wt, 0) || rd_varint(r, &v)) return -1; ns->escape_whitespaces = v != 0; break;
        default:
            if (rd_skip(r, wt)) return -1;
        }
    }
    return 0;
}

static void normspec_defaults(spm_normspec *ns) {
    memset(ns, 0, sizeof *ns);
    ns->add_dummy_prefix = ns->remove_extra_whitespaces = ns->escape_whitespaces = 1; /* proto defaults */
}

/* <0xAB> with upper-case hex, exactly as SentencePiece's ByteToPiece writes it. */
static int piece_to_byte(const char *s, int n) {
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    const char *h = strchr(hex, s[3]), *l = strchr(hex, s[4]);
    if (!s[3] || !s[4] || !h || !l) return -1;
    return (int)((h - hex) * 16 + (l - hex));
}

static int validate(spm_proto *p, const char *what, glm_err *err) {
    if (p->n == 0) {
        glm_fail(err, "%s: not a valid SentencePiece model: no pieces", what);
        return glm_hint(err, "pass a SentencePiece .model file (e.g. ice_text.model)");
    }
    int unk = -1, nbyte = 0;
    uint8_t seen[256] = {0};
    for (int i = 0; i < p->n; i++) {
        if (p->piece_len[i] == 0) return glm_fail(err, "%s: piece %d is empty", what, i);
        if (p->type[i] == SPM_UNKNOWN) {
            if (unk >= 0) return glm_fail(err, "%s: two <unk> pieces (%d and %d)", what, unk, i);
            unk = i;
        }
        if (p->type[i] == SPM_BYTE) {
            if (!p->byte_fallback)
                return glm_fail(err, "%s: byte piece %s found although byte_fallback is false", what, p->piece[i]);
            int b = piece_to_byte(p->piece[i], p->piece_len[i]);
            if (b < 0) return glm_fail(err, "%s: byte piece %s is invalid", what, p->piece[i]);
            if (!seen[b]) nbyte++;
            seen[b] = 1;
        }
    }
    if (unk < 0) return glm_fail(err, "%s: the model defines no <unk> piece", what);
    if (p->byte_fallback && nbyte != 256)
        return glm_fail(err, "%s: byte_fallback is true but only %d of the 256 byte pieces exist", what, nbyte);
    return 0;
}

int spm_proto_parse(spm_proto *p, uint8_t *buf, size_t len, const char *what, glm_err *err) {
    memset(p, 0, sizeof *p);
    p->buf = buf;
    p->buf_len = len;
    p->model_type = SPM_UNIGRAM;
    p->unk_id = 0; p->bos_id = 1; p->eos_id = 2; p->pad_id = -1;
    strcpy(p->unk_surface, " \xE2\x81\x87 ");
    normspec_defaults(&p->norm);
    normspec_defaults(&p->denorm);
    p->norm.present = p->denorm.present = 0;
    if (len == 0) {
        glm_fail(err, "%s: empty file", what);
        return glm_hint(err, "pass a SentencePiece .model file (e.g. ice_text.model)");
    }
    rd r = {buf, buf + len, buf, what, err};
    /* Pass 1: count pieces and their bytes so the arrays are allocated once. */
    size_t npieces = 0, bytes = 0;
    while (r.p < r.end) {
        uint32_t f; int wt;
        const uint8_t *s = NULL; size_t n = 0;
        if (rd_key(&r, &f, &wt)) return -1;
        if (f >= 1 && f <= 5) {
            if (rd_expect(&r, f, wt, 2) || rd_bytes(&r, &s, &n)) return -1;
            if (f == 1) { npieces++; bytes += n + 1; }
        } else if (rd_skip(&r, wt)) return -1;
    }
    if (npieces > INT32_MAX / 2) return glm_fail(err, "%s: too many pieces", what);
    p->piece = glm_calloc(npieces + 1, sizeof *p->piece);
    p->piece_len = glm_calloc(npieces + 1, sizeof *p->piece_len);
    p->score = glm_calloc(npieces + 1, sizeof *p->score);
    p->type = glm_calloc(npieces + 1, 1);
    p->arena = glm_malloc(bytes + 1);
    size_t used = 0;
    /* Pass 2: decode. */
    r.p = buf;
    while (r.p < r.end) {
        uint32_t f; int wt;
        const uint8_t *s = NULL; size_t n = 0;
        if (rd_key(&r, &f, &wt)) return -1;
        if (f < 1 || f > 5) { if (rd_skip(&r, wt)) return -1; continue; }
        if (rd_bytes(&r, &s, &n)) return -1;
        rd c = sub(&r, s, n);
        if (f == 1) {
            raw_piece pc;
            if (parse_piece(&c, &pc)) return -1;
            char *dst = p->arena + used;
            if (pc.n) memcpy(dst, pc.s, pc.n);
            dst[pc.n] = 0;
            used += pc.n + 1;
            p->piece[p->n] = dst;
            p->piece_len[p->n] = (int32_t)pc.n;
            if (pc.n > INT32_MAX / 4) return glm_fail(err, "%s: piece %d is too long", what, p->n);
            p->score[p->n] = pc.score;
            p->type[p->n] = (uint8_t)pc.type;
            p->n++;
        } else if (f == 2) {
            if (parse_trainer(&c, p)) return -1;
        } else if (f == 3) {
            if (parse_normspec(&c, &p->norm)) return -1;
        } else if (f == 5) {
            if (parse_normspec(&c, &p->denorm)) return -1;
        } /* f == 4: self_test_data, not needed */
    }
    return validate(p, what, err);
}

void spm_proto_free(spm_proto *p) {
    if (!p) return;
    free(p->buf);
    free(p->piece);
    free(p->piece_len);
    free(p->score);
    free(p->type);
    free(p->arena);
    memset(p, 0, sizeof *p);
}
