/* Lookup structures for the tokenizer: a double-array trie over pieces (so the Viterbi walks one
 * array slot per byte instead of scanning 130k pieces), a reader for SentencePiece's precompiled
 * charsmap (a darts-clone double array), a piece->id hash map, growable buffers and SentencePiece's
 * UTF-8 rules. */
#include "tokenizer/spm.h"
#include <stdlib.h>
#include <string.h>

/* ---------------- double-array builder ---------------- */

/* Free slots form a doubly-linked list so the base search visits only free slots, and slots more
 * than DA_WINDOW behind the newest are abandoned (left as holes, like darts-clone's closed
 * blocks): otherwise every many-child node rescans all old holes and building 130k pieces takes
 * minutes instead of tens of milliseconds. */
#define DA_WINDOW 8192

typedef struct da_builder {
    spm_da_unit *u;
    int32_t *next, *prev;    /* free list; -1 ends it */
    int32_t cap, used;       /* used = 1 + highest slot taken */
    int32_t head, tail;      /* first/last free slot, -1 when empty */
} da_builder;

static void da_grow(da_builder *b, int32_t need) {
    if (need <= b->cap) return;
    int32_t cap = b->cap ? b->cap : 1024;
    while (cap < need) cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
    b->u = glm_realloc(b->u, (size_t)cap * sizeof *b->u);
    b->next = glm_realloc(b->next, (size_t)cap * sizeof *b->next);
    b->prev = glm_realloc(b->prev, (size_t)cap * sizeof *b->prev);
    for (int32_t i = b->cap; i < cap; i++) {
        b->u[i].base = 0; b->u[i].check = -1; b->u[i].val = -1;
        b->prev[i] = b->tail;
        b->next[i] = -1;
        if (b->tail >= 0) b->next[b->tail] = i; else b->head = i;
        b->tail = i;
    }
    b->cap = cap;
}

static void da_take(da_builder *b, int32_t i, int32_t parent) {
    b->u[i].check = parent;
    if (b->prev[i] >= 0) b->next[b->prev[i]] = b->next[i]; else b->head = b->next[i];
    if (b->next[i] >= 0) b->prev[b->next[i]] = b->prev[i]; else b->tail = b->prev[i];
    if (i + 1 > b->used) b->used = i + 1;
}

/* Finds a base such that base + c is free for every label c (labels sorted ascending). */
static int32_t da_find_base(da_builder *b, const uint8_t *labels, int nl) {
    /* Abandon free slots far behind the frontier. */
    while (b->head >= 0 && b->head < b->used - DA_WINDOW) {
        int32_t h = b->head;
        b->head = b->next[h];
        if (b->head >= 0) b->prev[b->head] = -1; else b->tail = -1;
        b->u[h].check = -3; /* a hole: never matches a parent, never reused */
    }
    for (int32_t pos = b->head;; pos = b->next[pos]) {
        if (pos < 0) { /* list exhausted: grow and continue from the new slots */
            int32_t old = b->cap;
            da_grow(b, b->cap + 512);
            pos = old;
        }
        int32_t base = pos - labels[0];
        if (base < 1) continue;
        da_grow(b, base + 256);
        int ok = 1;
        for (int i = 1; i < nl && ok; i++) ok = b->u[base + labels[i]].check == -1;
        if (ok) return base;
    }
}

typedef struct da_frame { int32_t node, lo, hi, depth; } da_frame;

int spm_da_build(spm_da *da, int nkeys, char *const *keys, const int32_t *lens, const int32_t *vals, glm_err *err) {
    da->u = NULL;
    da->n = 0;
    /* Keys must be sorted bytewise, shorter first, without duplicates (checked here). */
    for (int i = 1; i < nkeys; i++) {
        int32_t la = lens[i - 1], lb = lens[i];
        int c = memcmp(keys[i - 1], keys[i], (size_t)(la < lb ? la : lb));
        if (c > 0 || (c == 0 && la >= lb)) return glm_fail(err, "trie keys are not sorted and unique (internal error)");
    }
    da_builder b = {0};
    b.head = b.tail = -1;
    da_grow(&b, 1024);
    da_take(&b, 0, -2); /* the root: -2 is never a valid parent id */
    /* Depth-first with an explicit stack: piece length is unbounded in a hostile file. */
    int32_t cap_st = 64, nst = 0;
    da_frame *st = glm_malloc((size_t)cap_st * sizeof *st);
    st[nst++] = (da_frame){0, 0, nkeys, 0};
    uint8_t labels[256];
    int32_t starts[257];
    while (nst > 0) {
        da_frame fr = st[--nst];
        int32_t lo = fr.lo;
        if (lo < fr.hi && lens[lo] == fr.depth) { b.u[fr.node].val = vals[lo]; lo++; }
        int nl = 0;
        for (int32_t i = lo; i < fr.hi; i++) {
            uint8_t c = (uint8_t)keys[i][fr.depth];
            if (nl == 0 || labels[nl - 1] != c) { labels[nl] = c; starts[nl] = i; nl++; }
        }
        if (nl == 0) continue;
        starts[nl] = fr.hi;
        int32_t base = da_find_base(&b, labels, nl);
        b.u[fr.node].base = base;
        for (int i = 0; i < nl; i++) da_take(&b, base + labels[i], fr.node);
        if (nst + nl > cap_st) {
            while (nst + nl > cap_st) cap_st *= 2;
            st = glm_realloc(st, (size_t)cap_st * sizeof *st);
        }
        for (int i = nl - 1; i >= 0; i--) st[nst++] = (da_frame){base + labels[i], starts[i], starts[i + 1], fr.depth + 1};
    }
    free(st);
    free(b.next);
    free(b.prev);
    da->u = glm_realloc(b.u, (size_t)b.used * sizeof *b.u);
    da->n = b.used;
    return 0;
}

void spm_da_free(spm_da *da) {
    free(da->u);
    da->u = NULL;
    da->n = 0;
}

size_t spm_da_longest(const spm_da *da, const char *s, size_t len, int32_t *val) {
    size_t best = 0;
    int32_t node = 0;
    if (da->n == 0) return 0;
    for (size_t i = 0; i < len; i++) {
        node = spm_da_next(da, node, (uint8_t)s[i]);
        if (node < 0) break;
        if (da->u[node].val >= 0) { best = i + 1; *val = da->u[node].val; }
    }
    return best;
}

/* ---------------- precompiled charsmap (darts-clone units) ---------------- */

/* Unit layout (darts-clone): bit 8 = has a leaf child, bits 0..7 (+bit 31) = label,
 * bits 10..31 = offset, shifted left by 8 more when bit 9 is set; a leaf holds value in 0..30. */
static inline uint32_t dc_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static inline uint32_t dc_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static inline int dc_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static inline uint32_t dc_value(uint32_t u) { return u & ((1u << 31) - 1); }

int spm_charsmap_init(spm_charsmap *cm, const uint8_t *blob, size_t len, const char *what, glm_err *err) {
    memset(cm, 0, sizeof *cm);
    if (!blob || len == 0) return 0;
    if (len <= 4) return glm_fail(err, "%s: precompiled_charsmap is broken (%zu bytes)", what, len);
    uint32_t tsize = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
    /* SentencePiece reads floor(tsize / 4) units; a trie without units cannot even hold a root */
    if ((size_t)tsize > len - 4 || tsize < 4)
        return glm_fail(err, "%s: precompiled_charsmap is broken (trie size %u of %zu bytes)", what, tsize, len);
    cm->n = tsize / 4;
    cm->units = glm_malloc(cm->n * sizeof *cm->units);
    for (size_t i = 0; i < cm->n; i++) {
        const uint8_t *q = blob + 4 + 4 * i;
        cm->units[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    }
    cm->strs = (const char *)blob + 4 + tsize;
    cm->strs_len = len - 4 - tsize;
    return 0;
}

void spm_charsmap_free(spm_charsmap *cm) {
    free(cm->units);
    memset(cm, 0, sizeof *cm);
}

size_t spm_charsmap_match(const spm_charsmap *cm, const char *s, size_t len, const char **repl, size_t *repl_len) {
    if (cm->n == 0) return 0;
    size_t best = 0;
    uint32_t best_val = 0;
    uint32_t u = cm->units[0];
    size_t node = dc_offset(u);
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        node ^= c;
        if (node >= cm->n) break; /* out of the array: only a corrupt map gets here */
        u = cm->units[node];
        if (dc_label(u) != c) break;
        node ^= dc_offset(u);
        if (dc_has_leaf(u)) {
            if (node >= cm->n) break;
            best = i + 1;
            best_val = dc_value(cm->units[node]);
        }
    }
    if (best == 0) return 0;
    if (best_val >= cm->strs_len) { /* corrupt value: treat as deleting the match */
        *repl = "";
        *repl_len = 0;
        return best;
    }
    *repl = cm->strs + best_val;
    *repl_len = strnlen(*repl, cm->strs_len - best_val);
    return best;
}

/* ---------------- piece -> id map ---------------- */

static inline uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 16777619u; }
    return h;
}

void spm_map_init(spm_map *m, int capacity_hint) {
    uint32_t cap = 16;
    while (cap < (uint32_t)capacity_hint * 2u) cap *= 2;
    m->slots = glm_malloc(cap * sizeof *m->slots);
    for (uint32_t i = 0; i < cap; i++) m->slots[i] = -1;
    m->mask = cap - 1;
}

void spm_map_free(spm_map *m) {
    free(m->slots);
    m->slots = NULL;
}

int32_t spm_map_put(spm_map *m, const spm_proto *p, int32_t id) {
    const char *s = p->piece[id];
    size_t n = (size_t)p->piece_len[id];
    for (uint32_t h = hash_bytes(s, n) & m->mask;; h = (h + 1) & m->mask) {
        int32_t e = m->slots[h];
        if (e < 0) { m->slots[h] = id; return -1; }
        if ((size_t)p->piece_len[e] == n && memcmp(p->piece[e], s, n) == 0) return e;
    }
}

int32_t spm_map_get(const spm_map *m, const spm_proto *p, const char *s, size_t n) {
    for (uint32_t h = hash_bytes(s, n) & m->mask;; h = (h + 1) & m->mask) {
        int32_t e = m->slots[h];
        if (e < 0) return -1;
        if ((size_t)p->piece_len[e] == n && memcmp(p->piece[e], s, n) == 0) return e;
    }
}

/* ---------------- buffers and scratch ---------------- */

void spm_buf_reserve(spm_buf *b, size_t extra) {
    if (b->n + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    b->s = glm_realloc(b->s, cap);
    b->cap = cap;
}

void *spm_scratch_work(void **p, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < bytes) c *= 2;
        free(*p);
        *p = glm_malloc(c);
        *cap = c;
    }
    return *p;
}

void spm_tok_push(spm_scratch *sc, int32_t id, uint32_t off, uint32_t len) {
    if (sc->ntok == sc->cap_tok) {
        sc->cap_tok = sc->cap_tok ? sc->cap_tok * 2 : 256;
        sc->tok = glm_realloc(sc->tok, (size_t)sc->cap_tok * sizeof *sc->tok);
    }
    sc->tok[sc->ntok++] = (spm_tok){id, off, len};
}

void spm_scratch_free(spm_scratch *sc) {
    free(sc->norm.s);
    free(sc->pre.s);
    free(sc->tok);
    free(sc->work);
    free(sc->work2);
    memset(sc, 0, sizeof *sc);
}

/* ---------------- UTF-8 ---------------- */

int spm_utf8_valid_len(const uint8_t *s, size_t len) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (len >= 2 && (c & 0xE0) == 0xC0) {
        uint32_t cp = (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && cp >= 0x80) return 2;
    } else if (len >= 3 && (c & 0xF0) == 0xE0) {
        uint32_t cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && cp >= 0x800 && (cp < 0xD800 || cp >= 0xE000)) return 3;
    } else if (len >= 4 && (c & 0xF8) == 0xF0) {
        uint32_t cp = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
                      (s[3] & 0x3F);
        if ((s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80 && (s[3] & 0xC0) == 0x80 && cp >= 0x10000 &&
            cp <= 0x10FFFF)
            return 4;
    }
    return 0;
}
