/* Helper for tests/py/test_safetensors.py and test_torchbin.py: the C readers and writer
 * driven from the command line.
 *   tool_ckpt dump st|bin PATH
 *       one line per tensor, sorted by name: NAME <tab> DTYPE <tab> d0,d1,.. <tab> HEX
 *       HEX = the bytes of the elements as float32 (float dtypes, via *_read_f32) or raw (others)
 *   tool_ckpt copy st|bin IN OUT MAX_SHARD_BYTES [F32|F16|BF16]
 *       reads every tensor and writes safetensors with st_save; with a dtype, float tensors are
 *       read as float32 and written in it, else each tensor keeps its dtype (raw copy)
 * Errors: "error: ..." on stderr, exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/safetensors.h"
#include "io/torchbin.h"

typedef struct rd {
    st_reader *st;
    tbin_reader *tb;
} rd;

static int rd_open(rd *r, const char *fmt, const char *path, glm_err *err) {
    memset(r, 0, sizeof *r);
    return strcmp(fmt, "bin") == 0 ? tbin_open(&r->tb, path, err) : st_open(&r->st, path, err);
}
static int rd_count(const rd *r) { return r->tb ? tbin_count(r->tb) : st_count(r->st); }
static const char *rd_name(const rd *r, int i) { return r->tb ? tbin_name(r->tb, i) : st_name(r->st, i); }
static void rd_info(const rd *r, const char *n, st_dtype *d, int *nd, int64_t *sh) {
    if (r->tb) tbin_info(r->tb, n, d, nd, sh); else st_info(r->st, n, d, nd, sh);
}
static int rd_f32(rd *r, const char *n, float *dst, int nd, const int64_t *sh, glm_err *err) {
    return r->tb ? tbin_read_f32(r->tb, n, dst, nd, sh, err) : st_read_f32(r->st, n, dst, nd, sh, err);
}
static int rd_raw(rd *r, const char *n, st_dtype d, void *dst, size_t b, glm_err *err) {
    return r->tb ? tbin_read_raw(r->tb, n, d, dst, b, err) : st_read_raw(r->st, n, d, dst, b, err);
}
static void rd_close(rd *r) { tbin_close(r->tb); st_close(r->st); }
static int is_float(st_dtype d) { return d == ST_F32 || d == ST_F16 || d == ST_BF16 || d == ST_F64; }

int main(int argc, char **argv) {
    glm_err err = {0};
    rd r;
    int dump = argc == 4 && strcmp(argv[1], "dump") == 0, copy = (argc == 6 || argc == 7) && strcmp(argv[1], "copy") == 0;
    if (!dump && !copy) {
        fprintf(stderr, "usage: tool_ckpt dump st|bin PATH | copy st|bin IN OUT MAX_SHARD_BYTES [F32|F16|BF16]\n");
        return 2;
    }
    if (rd_open(&r, argv[2], argv[3], &err) != 0) { glm_err_print(&err); return 1; }
    int n = rd_count(&r), rc = 0;
    st_dtype target = ST_NDTYPES;
    if (copy && argc == 7 && st_dtype_parse(argv[6], &target) != 0) { fprintf(stderr, "error: bad dtype %s\n", argv[6]); return 2; }
    st_entry *e = calloc((size_t)n + 1, sizeof *e);
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    for (int i = 0; i < n && rc == 0; i++) {
        const char *name = rd_name(&r, i);
        st_dtype dt;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        rd_info(&r, name, &dt, &nd, sh);
        size_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (size_t)sh[d];
        int as_f32 = is_float(dt) && (dump || target != ST_NDTYPES);
        size_t bytes = numel * (as_f32 ? 4 : st_dtype_size(dt));
        unsigned char *b = bufs[i] = malloc(bytes + 1);
        rc = as_f32 ? rd_f32(&r, name, (float *)(void *)b, nd, sh, &err) : rd_raw(&r, name, dt, b, bytes, &err);
        if (rc != 0) break;
        if (dump) {
            printf("%s\t%s\t", name, st_dtype_name(dt));
            for (int d = 0; d < nd; d++) printf("%s%lld", d ? "," : "", (long long)sh[d]);
            printf("\t");
            for (size_t k = 0; k < bytes; k++) printf("%02x", b[k]); /* memory order: little-endian */
            printf("\n");
        } else {
            e[i] = (st_entry){.name = name, .ndim = nd, .data = b, .data_dtype = as_f32 ? ST_F32 : dt, .file_dtype = as_f32 ? target : dt};
            memcpy(e[i].shape, sh, sizeof sh);
        }
    }
    if (rc == 0 && copy) rc = st_save(argv[4], e, n, (size_t)strtoull(argv[5], NULL, 10), &err);
    if (rc != 0) glm_err_print(&err);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(e);
    rd_close(&r);
    return rc ? 1 : 0;
}
