/* torch.save-compatible writing of a float32 state dict (torchbin.h tbin_save): a STORED zip
 * archive "archive/data.pkl" (a protocol-2 pickle of an OrderedDict name ->
 * torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False, OrderedDict())),
 * "archive/data/<i>" (each tensor's own FloatStorage, little-endian) and "archive/version".
 * Entries start on 64-byte boundaries as torch's own writer aligns them. For the small state
 * dicts THUDM's loaders take as pytorch_model.bin (a P-Tuning prefix encoder); archives over
 * 4 GB (zip64) are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "io/torchbin.h"

typedef struct buf { unsigned char *p; size_t n, cap; } buf;

static void put(buf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = glm_realloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void u8(buf *b, unsigned v) { unsigned char c = (unsigned char)v; put(b, &c, 1); }
static void le(buf *b, uint64_t v, int n) { for (int i = 0; i < n; i++) u8(b, (unsigned)(v >> (8 * i)) & 0xff); }

/* ---- the pickle ---- */
static void p_str(buf *b, const char *s) { u8(b, 'X'); le(b, strlen(s), 4); put(b, s, strlen(s)); } /* BINUNICODE */
static void p_int(buf *b, int64_t v) {
    if (v >= 0 && v < 256) { u8(b, 'K'); u8(b, (unsigned)v); }            /* BININT1 */
    else if (v >= INT32_MIN && v <= INT32_MAX) { u8(b, 'J'); le(b, (uint64_t)v, 4); } /* BININT */
    else { u8(b, 0x8a); u8(b, 8); le(b, (uint64_t)v, 8); }                  /* LONG1 */
}
static void p_global(buf *b, const char *mod, const char *name) {
    u8(b, 'c'); put(b, mod, strlen(mod)); u8(b, '\n'); put(b, name, strlen(name)); u8(b, '\n');
}
static void p_tuple(buf *b, int n, const int64_t *v) {
    u8(b, '(');
    for (int i = 0; i < n; i++) p_int(b, v[i]);
    u8(b, 't');
}

static void p_tensor(buf *b, int key, const st_entry *e, int64_t numel) {
    int64_t stride[ST_MAX_DIMS];
    for (int d = e->ndim - 1, s = 1; d >= 0; s *= (int)e->shape[d], d--) stride[d] = s;
    char k[32];
    snprintf(k, sizeof k, "%d", key);
    p_global(b, "torch._utils", "_rebuild_tensor_v2");
    u8(b, '(');
    u8(b, '('); p_str(b, "storage"); p_global(b, "torch", "FloatStorage"); p_str(b, k); p_str(b, "cpu"); p_int(b, numel);
    u8(b, 't'); u8(b, 'Q'); /* BINPERSID */
    p_int(b, 0);
    p_tuple(b, e->ndim, e->shape);
    p_tuple(b, e->ndim, stride);
    u8(b, 0x89);            /* NEWFALSE: requires_grad */
    p_global(b, "collections", "OrderedDict"); u8(b, ')'); u8(b, 'R'); /* backward hooks */
    u8(b, 't'); u8(b, 'R');
}

/* ---- the zip (STORED, CRCs 0: torch's reader does not check them, nor does ours) ---- */
typedef struct entry { char name[160]; const void *data; size_t len; uint64_t off; } entry;

static void local_header(buf *z, entry *e) {
    size_t nl = strlen(e->name), at = z->n + 30 + nl + 4, pad = (64 - at % 64) % 64; /* data 64-byte aligned */
    e->off = z->n;
    le(z, 0x04034b50, 4); le(z, 20, 2); le(z, 0, 2); le(z, 0, 2); le(z, 0, 4); le(z, 0, 4);
    le(z, e->len, 4); le(z, e->len, 4); le(z, nl, 2); le(z, 4 + pad, 2);
    put(z, e->name, nl);
    le(z, 0xcafe, 2); le(z, pad, 2); /* an extra field whose only job is the padding */
    for (size_t i = 0; i < pad; i++) u8(z, 0);
}

int tbin_save(const char *path, const st_entry *t, int n, glm_err *err) {
    buf pkl = {0};
    u8(&pkl, 0x80); u8(&pkl, 2);                                     /* PROTO 2 */
    p_global(&pkl, "collections", "OrderedDict"); u8(&pkl, ')'); u8(&pkl, 'R');
    entry *e = glm_calloc((size_t)n + 2, sizeof *e);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].data_dtype != ST_F32) { free(e); free(pkl.p); return glm_fail(err, "%s: only float32 tensors are written", path); }
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= t[i].shape[d];
        p_str(&pkl, t[i].name);
        p_tensor(&pkl, i, &t[i], numel);
        u8(&pkl, 's'); /* SETITEM */
        snprintf(e[i + 1].name, sizeof e[i + 1].name, "archive/data/%d", i);
        e[i + 1].data = t[i].data;
        e[i + 1].len = (size_t)numel * 4;
        total += e[i + 1].len;
    }
    u8(&pkl, '.');
    snprintf(e[0].name, sizeof e[0].name, "archive/data.pkl");
    e[0].data = pkl.p;
    e[0].len = pkl.n;
    snprintf(e[n + 1].name, sizeof e[n + 1].name, "archive/version");
    e[n + 1].data = "3\n";
    e[n + 1].len = 2;
    int rc = 0;
    if (total + pkl.n > 0xF0000000u) rc = glm_fail(err, "%s: %.1f GB is more than this writer's 4 GB (no zip64)", path, total / 1e9);
    buf z = {0};
    for (int i = 0; rc == 0 && i < n + 2; i++) {
        local_header(&z, &e[i]);
        put(&z, e[i].data, e[i].len);
    }
    uint64_t cd = z.n;
    for (int i = 0; rc == 0 && i < n + 2; i++) {
        size_t nl = strlen(e[i].name);
        le(&z, 0x02014b50, 4); le(&z, 20, 2); le(&z, 20, 2); le(&z, 0, 2); le(&z, 0, 2); le(&z, 0, 4); le(&z, 0, 4);
        le(&z, e[i].len, 4); le(&z, e[i].len, 4); le(&z, nl, 2); le(&z, 0, 2); le(&z, 0, 2); le(&z, 0, 2); le(&z, 0, 2);
        le(&z, 0, 4); le(&z, e[i].off, 4);
        put(&z, e[i].name, nl);
    }
    if (rc == 0) {
        uint64_t cdsize = z.n - cd;
        le(&z, 0x06054b50, 4); le(&z, 0, 2); le(&z, 0, 2); le(&z, (uint64_t)n + 2, 2); le(&z, (uint64_t)n + 2, 2);
        le(&z, cdsize, 4); le(&z, cd, 4); le(&z, 0, 2);
        rc = glm_write_file_atomic(path, z.p, z.n, err);
    }
    free(z.p);
    free(pkl.p);
    free(e);
    return rc;
}
