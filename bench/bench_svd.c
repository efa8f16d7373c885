/* GaLore's projections alone (backend/svd.c glm_svd_top) on the CUDA backend, at ChatGLM-6B's
 * weight shapes: the time of one top-r SVD of a float gradient on the device, its iterations,
 * and the time per iteration, for a matrix like a gradient (a few strong directions over a
 * decaying spectrum and noise). With --warm, the second call starts from the first's answer
 * (GaLore's warm start), on the matrix changed by a tenth.
 *
 *   bench_svd [--rank R] [--reps N] [--shape OCxC]... [--out FILE.jsonl] [--host_factor]
 * --host_factor: each Cholesky QR sweep's factor made on the host (before session 33's orth_f64). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/svd.h"
#include "core/rng.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* w [OC, C] = sum_k s_k a_k b_k^T over 64 random directions with s_k = 1 / (1 + k)^1.5, plus
 * noise of 1e-3: a gradient's shape of spectrum */
static void gradient_like(float *w, int OC, int C, uint64_t seed) {
    glm_rng r;
    glm_rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)OC * C; i++) w[i] = 1e-3f * glm_rng_normal(&r) / sqrtf((float)C);
    float *a = malloc(sizeof(float) * OC), *b = malloc(sizeof(float) * C);
    for (int k = 0; k < 64; k++) {
        float s = 1.0f / powf(1.0f + k, 1.5f);
        for (int i = 0; i < OC; i++) a[i] = glm_rng_normal(&r) / sqrtf((float)OC);
        for (int j = 0; j < C; j++) b[j] = glm_rng_normal(&r) / sqrtf((float)C);
#pragma omp parallel for
        for (int i = 0; i < OC; i++)
            for (int j = 0; j < C; j++) w[(size_t)i * C + j] += s * a[i] * b[j];
    }
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    int rank = 16, reps = 3, n_shapes = 0, shapes[8][2], host_factor = 0;
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rank") && i + 1 < argc) rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--host_factor")) host_factor = 1;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n_shapes < 8) {
            if (sscanf(argv[++i], "%dx%d", &shapes[n_shapes][0], &shapes[n_shapes][1]) != 2) return 2;
            n_shapes++;
        } else {
            fprintf(stderr, "usage: bench_svd [--rank R] [--reps N] [--shape OCxC]... [--out FILE.jsonl]\n");
            return 2;
        }
    }
    if (!n_shapes) { /* ChatGLM-6B: query_key_value, dense, dense_h_to_4h, dense_4h_to_h */
        int d[4][2] = {{12288, 4096}, {4096, 4096}, {16384, 4096}, {4096, 16384}};
        memcpy(shapes, d, sizeof d);
        n_shapes = 4;
    }
    char eb[512];
    if (!host_factor) setenv("GLM_CUDA_ORTH", "1", 1); /* orth_f64 on the device */
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, eb, sizeof eb);
    if (be && host_factor) be->orth_f64 = NULL; /* session 32's path: each sweep's factor made on the host */
    if (!be) { fprintf(stderr, "bench_svd: %s\n", eb); return 1; }
    FILE *out = out_path ? fopen(out_path, "a") : NULL;
    for (int k = 0; k < n_shapes; k++) {
        int OC = shapes[k][0], C = shapes[k][1];
        size_t n = (size_t)OC * C;
        float *w = malloc(n * sizeof(float));
        gradient_like(w, OC, C, 11 + k);
        void *dw = be->alloc(be, n * sizeof(float));
        be->upload(be, dw, w, n * sizeof(float));
        float *u = malloc(sizeof(float) * OC * rank), *s = malloc(sizeof(float) * rank), *v = malloc(sizeof(float) * C * rank);
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            int its = glm_svd_top(be, dw, OC, C, rank, 200, 5 + r, NULL, 0, u, s, v);
            double ms = (now() - t0) * 1e3;
            printf("svd %5dx%-5d r%-3d cold  %4d iterations %9.1f ms %7.2f ms/iteration  s0 %.4g s%d %.4g\n", OC, C, rank, its,
                   ms, its > 0 ? ms / its : 0, s[0], rank - 1, s[rank - 1]);
            if (out)
                fprintf(out, "{\"op\":\"svd_top\",\"OC\":%d,\"C\":%d,\"rank\":%d,\"start\":\"cold\",\"iterations\":%d,\"ms\":%.2f}\n",
                        OC, C, rank, its, ms);
        }
        /* the warm start GaLore takes: the previous right vectors, the matrix moved a little */
        glm_rng r;
        glm_rng_seed(&r, 99);
        for (size_t i = 0; i < n; i++) w[i] += 0.1f * fabsf(w[i]) * glm_rng_normal(&r);
        be->upload(be, dw, w, n * sizeof(float));
        double t0 = now();
        int its = glm_svd_top(be, dw, OC, C, rank, 200, 9, v, 1, u, s, v);
        double ms = (now() - t0) * 1e3;
        printf("svd %5dx%-5d r%-3d warm  %4d iterations %9.1f ms %7.2f ms/iteration\n", OC, C, rank, its, ms,
               its > 0 ? ms / its : 0);
        if (out)
            fprintf(out, "{\"op\":\"svd_top\",\"OC\":%d,\"C\":%d,\"rank\":%d,\"start\":\"warm\",\"iterations\":%d,\"ms\":%.2f}\n", OC,
                    C, rank, its, ms);
        be->free(be, dw);
        free(w); free(u); free(s); free(v);
    }
    if (out) fclose(out);
    be->destroy(be);
    return 0;
}
