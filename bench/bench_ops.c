/* The small ops of a ChatGLM-6B LoRA step alone on the CUDA backend, each against the bytes it
 * must move: LoRA's A side (lora_down, lora_down_bwd's dA and dx), its B side (the adapter's
 * products: t B^T forward, dt and dB backward), LayerNorm forward and backward (frozen) and the
 * rotary pass, at the shapes of W1 (8 x 512 tokens) unless --tokens says otherwise. Prints each
 * op's mean time over --reps calls launched back to back after one warm-up call (as a step
 * launches them: the launch gaps count, a synchronisation's wait does not) and the GB/s of its
 * unavoidable reads and writes, against the copy speed measured the same way.
 *
 *   bench_ops [--tokens N] [--rank R] [--dropout P] [--reps R] [--out FILE.jsonl] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    glm_backend *be;
    int reps;
    FILE *out;
    double copy_gbs; /* device-to-device copy speed, the ceiling for the ops below */
} bench;

/* the bytes an op must move at least, and its name; fn runs it once */
typedef void (*op_fn)(glm_backend *be, void **buf, int N);
/* the op's mean time in us; printed with the GB/s of `bytes` against the copy speed */
static double time_op(bench *b, const char *name, op_fn fn, void **buf, int N, double bytes) {
    fn(b->be, buf, N); /* warm-up */
    b->be->sync(b->be);
    double t0 = now();
    for (int r = 0; r < b->reps; r++) fn(b->be, buf, N);
    b->be->sync(b->be);
    double us = (now() - t0) / b->reps * 1e6, gbs = bytes / (us * 1e-6) / 1e9;
    printf("%-28s %9.1f us %8.0f GB/s %5.0f%% of copy\n", name, us, gbs, b->copy_gbs > 0 ? 100 * gbs / b->copy_gbs : 0);
    if (b->out)
        fprintf(b->out, "{\"op\":\"%s\",\"tokens\":%d,\"us\":%.2f,\"gbs\":%.1f,\"copy_gbs\":%.1f}\n", name, N, us, gbs,
                b->copy_gbs);
    return us;
}

/* the shapes: C = 4096 input width, OC = 12288 (query_key_value), rank r, dropout p */
static int C = 4096, OC = 12288, R = 8, NH = 32, HD = 128;
static float P = 0.1f;
enum { X, A, T, DX, DA, DT, BW, DOUT, DB, Y, W, BIAS, MEAN, RSTD, QKV, POS, BPOS, COPY, NBUF };

static void op_copy(glm_backend *be, void **buf, int N) { be->copy(be, buf[COPY], buf[DOUT], (size_t)N * OC * glm_dtype_size(be->dtype)); }
static void op_lora_down(glm_backend *be, void **buf, int N) { be->lora_down(be, buf[T], buf[X], buf[A], N, C, R, 4.0f, P, 7); }
static void op_lora_bwd_da(glm_backend *be, void **buf, int N) {
    be->lora_down_bwd(be, buf[DA], NULL, buf[DT], buf[X], buf[A], N, C, R, P, 7);
}
static void op_lora_bwd_dx(glm_backend *be, void **buf, int N) {
    be->lora_down_bwd(be, NULL, buf[DX], buf[DT], buf[X], buf[A], N, C, R, P, 7);
}
static void op_lora_bwd(glm_backend *be, void **buf, int N) {
    be->lora_down_bwd(be, buf[DA], buf[DX], buf[DT], buf[X], buf[A], N, C, R, P, 7);
}
static void op_b_fwd(glm_backend *be, void **buf, int N) { be->matmul_fwd(be, buf[DOUT], buf[T], buf[BW], NULL, N, R, OC); }
static void op_b_bwd(glm_backend *be, void **buf, int N) {
    be->matmul_bwd(be, buf[DT], buf[DB], NULL, buf[DOUT], buf[T], buf[BW], N, R, OC, 0);
}
static void op_ln_fwd(glm_backend *be, void **buf, int N) {
    be->layernorm_fwd(be, buf[Y], buf[MEAN], buf[RSTD], buf[X], buf[W], buf[BIAS], N, C, 1e-5f);
}
static void op_ln_bwd(glm_backend *be, void **buf, int N) {
    be->layernorm_bwd(be, buf[DX], NULL, NULL, buf[Y], buf[X], buf[W], buf[MEAN], buf[RSTD], N, C);
}
static void op_rope(glm_backend *be, void **buf, int N) { be->rope(be, buf[QKV], buf[POS], buf[BPOS], N, NH, HD, 0); }

int main(int argc, char **argv) {
    int N = 4096, reps = 20;
    const char *outp = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--tokens")) { N = atoi(v); i++; }
        else if (!strcmp(a, "--rank")) { R = atoi(v); i++; }
        else if (!strcmp(a, "--dropout")) { P = (float)atof(v); i++; }
        else if (!strcmp(a, "--reps")) { reps = atoi(v); i++; }
        else if (!strcmp(a, "--out")) { outp = v; i++; }
        else { fprintf(stderr, "usage: see the header of bench/bench_ops.c (unknown %s)\n", a); return 2; }
    }
    if (N < 1 || R < 1 || R > 16 || reps < 1 || P < 0 || P >= 1) {
        fprintf(stderr, "bench_ops: --tokens >= 1, --rank 1..16, --dropout in [0, 1), --reps >= 1\n");
        return 2;
    }
    char err[256];
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, err, sizeof err);
    if (!be) { fprintf(stderr, "bench_ops: %s\n", err); return 1; }
    size_t es = glm_dtype_size(be->dtype), n = (size_t)N;
    size_t sz[NBUF] = {[X] = n * C * es, [A] = (size_t)R * C * es, [T] = n * R * es, [DX] = n * C * es, [DA] = (size_t)R * C * es,
                       [DT] = n * R * es, [BW] = (size_t)OC * R * es, [DOUT] = n * OC * es, [DB] = (size_t)OC * R * es,
                       [Y] = n * C * es, [W] = C * es, [BIAS] = C * es, [MEAN] = n * 4, [RSTD] = n * 4,
                       [QKV] = n * 3 * NH * HD * es, [POS] = n * 4, [BPOS] = n * 4, [COPY] = n * OC * es};
    void *buf[NBUF];
    for (int i = 0; i < NBUF; i++) {
        buf[i] = be->alloc(be, sz[i]);
        if (i != POS && i != BPOS && i != MEAN && i != RSTD) glm_cuda_fill_normal(be, buf[i], sz[i] / es, 100 + (uint64_t)i, 0.5f);
    }
    int32_t *pos = malloc(n * 4);
    for (size_t i = 0; i < n; i++) pos[i] = (int32_t)(i % 512);
    be->upload(be, buf[POS], pos, n * 4);
    be->upload(be, buf[BPOS], pos, n * 4);
    free(pos);
    bench b = {be, reps, outp ? fopen(outp, "a") : NULL, 0};
    printf("bench_ops: %d tokens, C %d, OC %d, rank %d, dropout %.2f, bf16, mean of %d\n", N, C, OC, R, P, reps);
    double xb = (double)n * C * es, ob = (double)n * OC * es;
    b.copy_gbs = 2 * ob / (time_op(&b, "copy N x OC", op_copy, buf, N, 2 * ob) * 1e-6) / 1e9; /* the others' ceiling */
    time_op(&b, "lora_down", op_lora_down, buf, N, xb);
    time_op(&b, "lora_down_bwd dA", op_lora_bwd_da, buf, N, xb);
    time_op(&b, "lora_down_bwd dx", op_lora_bwd_dx, buf, N, 2 * xb);
    time_op(&b, "lora_down_bwd dA+dx", op_lora_bwd, buf, N, 3 * xb);
    time_op(&b, "B fwd (t B^T)", op_b_fwd, buf, N, ob);
    time_op(&b, "B bwd (dt, dB)", op_b_bwd, buf, N, ob);
    time_op(&b, "layernorm_fwd", op_ln_fwd, buf, N, 2 * xb);
    time_op(&b, "layernorm_bwd (frozen)", op_ln_bwd, buf, N, 3 * xb);
    time_op(&b, "rope (q, k)", op_rope, buf, N, 2 * (2.0 / 3.0) * (double)sz[QKV]);
    if (b.out) fclose(b.out);
    for (int i = 0; i < NBUF; i++) be->free(be, buf[i]);
    be->destroy(be);
    return 0;
}
