/* Attention alone on the CUDA backend: the training ops attention_fwd and attention_bwd on
 * ChatGLM-6B's layout (q|k|v interleaved per head, [B, T, NH, 3, HD]), random bf16 inputs, in
 * TFLOP/s, beside bench/pytorch_attn.py (SDPA) for issue 20's table.
 *
 *   bench_attn [--runs 512x8,2048x2,8192x1] [--masks prefix,causal,full] [--heads 32] [--hd 128]
 *              [--reps 10] [--fp16] [--out FILE]
 *
 * Masks (each query's key range [lo, hi)): prefix = GLM's prefix-LM rule on rows of half prompt
 * and half answer (a prompt token sees the whole prompt, an answer token the prompt and the
 * answer up to itself); causal = [0, i + 1); full = [0, T).
 * FLOPs count the pairs the mask lets through, S = sum over queries of (hi - lo): forward
 * 4 * HD * NH * B * S (the two products), backward 2.5 times that (FlashAttention's convention:
 * five products of the forward's size against two). Times are medians of --reps calls after one
 * warm-up call, each call timed alone (synchronised before and after). */
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
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

/* The key range of every query of B rows of T tokens under `mask`; returns S, the pairs let through. */
static double make_ranges(const char *mask, int B, int T, int32_t *lo, int32_t *hi) {
    double S = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            int l = 0, h = T;
            if (!strcmp(mask, "causal")) h = i + 1;
            else if (!strcmp(mask, "prefix")) h = i < T / 2 ? T / 2 : i + 1;
            lo[b * T + i] = l;
            hi[b * T + i] = h;
            S += h - l;
        }
    return S;
}

static double median_ms(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2] * 1e3;
}

int main(int argc, char **argv) {
    char runs[256] = "512x8,2048x2,8192x1", masks[128] = "prefix,causal,full";
    int NH = 32, HD = 128, reps = 10;
    glm_dtype dt = GLM_BF16;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--runs")) { snprintf(runs, sizeof runs, "%s", v); i++; }
        else if (!strcmp(a, "--masks")) { snprintf(masks, sizeof masks, "%s", v); i++; }
        else if (!strcmp(a, "--heads")) { NH = atoi(v); i++; }
        else if (!strcmp(a, "--hd")) { HD = atoi(v); i++; }
        else if (!strcmp(a, "--reps")) { reps = atoi(v); i++; }
        else if (!strcmp(a, "--fp16")) dt = GLM_F16;
        else if (!strcmp(a, "--out")) { out = v; i++; }
        else { fprintf(stderr, "usage: see the header of bench/bench_attn.c (unknown %s)\n", a); return 2; }
    }
    if (NH < 1 || (HD != 64 && HD != 128) || reps < 1) {
        fprintf(stderr, "bench_attn: --heads >= 1, --hd 64 or 128, --reps >= 1\n");
        return 2;
    }
    char err[256];
    glm_backend *be = glm_backend_cuda(0, dt, err, sizeof err);
    if (!be) { fprintf(stderr, "bench_attn: %s\n", err); return 1; }
    FILE *f = out ? fopen(out, "a") : NULL;
    printf("%-8s %-7s %10s %9s %10s %9s   (%s, NH %d, HD %d)\n", "run", "mask", "fwd_ms", "TFLOP/s", "bwd_ms", "TFLOP/s",
           dt == GLM_BF16 ? "bf16" : "fp16", NH, HD);
    for (char *tok = strtok(runs, ","); tok; tok = strtok(NULL, ",")) {
        int T = 0, B = 0;
        if (sscanf(tok, "%dx%d", &T, &B) != 2 || T < 1 || B < 1) { fprintf(stderr, "bad run %s\n", tok); return 2; }
        size_t N = (size_t)B * T, W = 3 * (size_t)NH * HD, A = (size_t)NH * HD, es = glm_dtype_size(dt);
        void *qkv = be->alloc(be, N * W * es), *dqkv = be->alloc(be, N * W * es);
        void *o = be->alloc(be, N * A * es), *dout = be->alloc(be, N * A * es);
        float *lse = be->alloc(be, N * NH * sizeof(float));
        int32_t *lo = malloc(N * sizeof *lo), *hi = malloc(N * sizeof *hi);
        int32_t *dlo = be->alloc(be, N * sizeof *lo), *dhi = be->alloc(be, N * sizeof *hi);
        glm_cuda_fill_normal(be, qkv, N * W, 11, 1.0f);
        glm_cuda_fill_normal(be, dout, N * A, 12, 1.0f);
        /* q, k, v inside [B, T, NH, 3, HD] rows, as the v1 block lays them out */
        glm_qkv_view q = {qkv, (long)T * (long)W, (long)W, 3L * HD, 1}, k = q, v = q;
        k.base = (char *)qkv + (size_t)HD * es;
        v.base = (char *)qkv + (size_t)2 * HD * es;
        glm_qkv_view dq = {dqkv, (long)T * (long)W, (long)W, 3L * HD, 1}, dk = dq, dv = dq;
        dk.base = (char *)dqkv + (size_t)HD * es;
        dv.base = (char *)dqkv + (size_t)2 * HD * es;
        float scale = 1.0f / sqrtf((float)HD);
        char mcopy[128];
        snprintf(mcopy, sizeof mcopy, "%s", masks);
        char *save = NULL;
        for (char *mask = strtok_r(mcopy, ",", &save); mask; mask = strtok_r(NULL, ",", &save)) {
            if (strcmp(mask, "prefix") && strcmp(mask, "causal") && strcmp(mask, "full")) {
                fprintf(stderr, "bench_attn: mask %s: prefix, causal or full\n", mask);
                return 2;
            }
            double S = make_ranges(mask, B, T, lo, hi);
            be->upload(be, dlo, lo, N * sizeof *lo);
            be->upload(be, dhi, hi, N * sizeof *hi);
            double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
            for (int r = -1; r < reps; r++) { /* r = -1: the warm-up */
                be->sync(be);
                double t0 = now();
                be->attention_fwd(be, o, lse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
                be->sync(be);
                double t1 = now();
                be->attention_bwd(be, dq, dk, dv, dout, o, lse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
                be->sync(be);
                double t2 = now();
                if (r >= 0) { tf[r] = t1 - t0; tb[r] = t2 - t1; }
            }
            double fwd = median_ms(tf, reps), bwd = median_ms(tb, reps);
            double flops = 4.0 * HD * NH * S, tff = flops / (fwd * 1e-3) / 1e12, tfb = 2.5 * flops / (bwd * 1e-3) / 1e12;
            printf("%-8s %-7s %10.3f %9.1f %10.3f %9.1f\n", tok, mask, fwd, tff, bwd, tfb);
            if (f)
                fprintf(f, "{\"impl\":\"glmtrain\",\"run\":\"%s\",\"seq\":%d,\"batch\":%d,\"heads\":%d,\"hd\":%d,\"mask\":\"%s\","
                           "\"pairs\":%.0f,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.2f,\"bwd_tflops\":%.2f}\n",
                        tok, T, B, NH, HD, mask, S, fwd, bwd, tff, tfb);
            free(tf);
            free(tb);
        }
        void *bufs[] = {qkv, dqkv, o, dout, lse, dlo, dhi};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
        free(lo);
        free(hi);
    }
    if (f) fclose(f);
    be->destroy(be);
    return 0;
}
