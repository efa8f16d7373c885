/* Test helpers: build torch.save-like archives by hand (a pickle assembler and a STORED zip
 * writer, with optional zip64 records), so tests and fuzzers can make exact, odd and hostile
 * variants without Python. Shared by tests/c/test_torchbin.c and tests/fuzz/fuzz_torchbin.c. */
#ifndef GLM_TORCHBIN_FIXTURE_H
#define GLM_TORCHBIN_FIXTURE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_buf { unsigned char *p; size_t n, cap; } fx_buf;

static void fx_put(fx_buf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void fx_u8(fx_buf *b, unsigned v) { unsigned char c = (unsigned char)v; fx_put(b, &c, 1); }
static void fx_le(fx_buf *b, uint64_t v, int n) { for (int i = 0; i < n; i++) fx_u8(b, (unsigned)(v >> (8 * i)) & 0xff); }

/* ---- pickle assembly ---- */
static void pk_op(fx_buf *b, unsigned op) { fx_u8(b, op); }
static void pk_str(fx_buf *b, const char *s) { fx_u8(b, 'X'); fx_le(b, strlen(s), 4); fx_put(b, s, strlen(s)); }
static void pk_int(fx_buf *b, int64_t v) {
    if (v >= 0 && v < 256) { fx_u8(b, 'K'); fx_u8(b, (unsigned)v); }
    else if (v >= INT32_MIN && v <= INT32_MAX) { fx_u8(b, 'J'); fx_le(b, (uint64_t)v, 4); }
    else { fx_u8(b, 0x8a); fx_u8(b, 8); fx_le(b, (uint64_t)v, 8); }
}
static void pk_global(fx_buf *b, const char *mod, const char *name) {
    fx_u8(b, 'c'); fx_put(b, mod, strlen(mod)); fx_u8(b, '\n'); fx_put(b, name, strlen(name)); fx_u8(b, '\n');
}
static void pk_int_tuple(fx_buf *b, int n, const int64_t *v) {
    fx_u8(b, '(');
    for (int i = 0; i < n; i++) pk_int(b, v[i]);
    fx_u8(b, 't');
}
/* torch._utils._rebuild_tensor_v2((storage pid), offset, size, stride, False, OrderedDict()) */
static void pk_tensor(fx_buf *b, const char *stype, const char *key, int64_t numel, int64_t offset, int ndim,
                      const int64_t *shape, const int64_t *stride) {
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    fx_u8(b, '(');
    fx_u8(b, '('); pk_str(b, "storage"); pk_global(b, "torch", stype); pk_str(b, key); pk_str(b, "cpu"); pk_int(b, numel); fx_u8(b, 't');
    fx_u8(b, 'Q');
    pk_int(b, offset);
    pk_int_tuple(b, ndim, shape);
    pk_int_tuple(b, ndim, stride);
    fx_u8(b, 0x89);
    pk_global(b, "collections", "OrderedDict"); fx_u8(b, ')'); fx_u8(b, 'R');
    fx_u8(b, 't');
    fx_u8(b, 'R');
}

/* ---- zip writing (STORED; CRCs left 0: torch's reader and ours do not check them) ---- */
typedef struct fx_entry { const char *name; const void *data; size_t len; } fx_entry;

/* zip64 != 0 writes every size/offset as 0xFFFFFFFF plus zip64 extra fields and records. */
static void fx_zip(fx_buf *z, const fx_entry *e, int n, int zip64) {
    uint64_t *off = calloc((size_t)n + 1, sizeof *off);
    for (int i = 0; i < n; i++) {
        off[i] = z->n;
        size_t nl = strlen(e[i].name);
        fx_le(z, 0x04034b50, 4); fx_le(z, zip64 ? 45 : 20, 2); fx_le(z, 0, 2); fx_le(z, 0, 2); fx_le(z, 0, 4); fx_le(z, 0, 4);
        fx_le(z, zip64 ? 0xffffffffu : e[i].len, 4); fx_le(z, zip64 ? 0xffffffffu : e[i].len, 4);
        fx_le(z, nl, 2); fx_le(z, zip64 ? 20 : 0, 2);
        fx_put(z, e[i].name, nl);
        if (zip64) { fx_le(z, 1, 2); fx_le(z, 16, 2); fx_le(z, e[i].len, 8); fx_le(z, e[i].len, 8); }
        fx_put(z, e[i].data, e[i].len);
    }
    uint64_t cd = z->n;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(e[i].name);
        fx_le(z, 0x02014b50, 4); fx_le(z, 45, 2); fx_le(z, zip64 ? 45 : 20, 2); fx_le(z, 0, 2); fx_le(z, 0, 2); fx_le(z, 0, 4); fx_le(z, 0, 4);
        fx_le(z, zip64 ? 0xffffffffu : e[i].len, 4); fx_le(z, zip64 ? 0xffffffffu : e[i].len, 4);
        fx_le(z, nl, 2); fx_le(z, zip64 ? 28 : 0, 2); fx_le(z, 0, 2); fx_le(z, 0, 2); fx_le(z, 0, 2); fx_le(z, 0, 4);
        fx_le(z, zip64 ? 0xffffffffu : off[i], 4);
        fx_put(z, e[i].name, nl);
        if (zip64) { fx_le(z, 1, 2); fx_le(z, 24, 2); fx_le(z, e[i].len, 8); fx_le(z, e[i].len, 8); fx_le(z, off[i], 8); }
    }
    uint64_t cdsize = z->n - cd;
    if (zip64) {
        uint64_t rec = z->n;
        fx_le(z, 0x06064b50, 4); fx_le(z, 44, 8); fx_le(z, 45, 2); fx_le(z, 45, 2); fx_le(z, 0, 4); fx_le(z, 0, 4);
        fx_le(z, (uint64_t)n, 8); fx_le(z, (uint64_t)n, 8); fx_le(z, cdsize, 8); fx_le(z, cd, 8);
        fx_le(z, 0x07064b50, 4); fx_le(z, 0, 4); fx_le(z, rec, 8); fx_le(z, 1, 4);
    }
    fx_le(z, 0x06054b50, 4); fx_le(z, 0, 2); fx_le(z, 0, 2);
    fx_le(z, zip64 ? 0xffff : (uint64_t)n, 2); fx_le(z, zip64 ? 0xffff : (uint64_t)n, 2);
    fx_le(z, zip64 ? 0xffffffffu : cdsize, 4); fx_le(z, zip64 ? 0xffffffffu : cd, 4); fx_le(z, 0, 2);
    free(off);
}

/* An archive "<root>/data.pkl" + storages "<root>/data/<i>" (i < nst) + "<root>/version". */
static void fx_archive(fx_buf *z, const char *root, const fx_buf *pkl, const fx_buf *storages, int nst, int zip64) {
    char names[18][128];
    fx_entry e[18];
    int n = 0;
    snprintf(names[n], sizeof names[n], "%s/data.pkl", root);
    e[n] = (fx_entry){names[n], pkl->p, pkl->n}; n++;
    for (int i = 0; i < nst && n < 16; i++) {
        snprintf(names[n], sizeof names[n], "%s/data/%d", root, i);
        e[n] = (fx_entry){names[n], storages[i].p, storages[i].n}; n++;
    }
    snprintf(names[n], sizeof names[n], "%s/version", root);
    e[n] = (fx_entry){names[n], "3\n", 2}; n++;
    fx_zip(z, e, n, zip64);
}

static int fx_write(const char *path, const fx_buf *b) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(b->p, 1, b->n, f) == b->n;
    return fclose(f) == 0 && ok ? 0 : -1;
}
#endif
