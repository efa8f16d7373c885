/* The SVD's small-matrix ops on the host (backend.h gram_f64, mul_small_f64): the CPU backend's,
 * and backend/svd.c's for a matrix on the host. */
#include "backend/cpu/cpu_ops.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

/* Rows per partial sum: the sums over rows go chunk by chunk, each chunk's in order, then the
 * chunks' in order, so the result does not depend on the thread count. */
#define SMALL_CHUNK 512

void cpu_gram_f64(double *G, const float *x, const float *y, int n, int q, int k) {
    int nc = (n + SMALL_CHUNK - 1) / SMALL_CHUNK;
    size_t qk = (size_t)q * k;
    double *part = glm_malloc((size_t)(nc ? nc : 1) * qk * sizeof(double));
#pragma omp parallel for schedule(static) if (nc > 1 && (size_t)n * qk > 262144)
    for (int c = 0; c < nc; c++) {
        double *pc = part + (size_t)c * qk;
        for (size_t e = 0; e < qk; e++) pc[e] = 0;
        double *xd = glm_malloc((size_t)q * sizeof(double)), *yd = glm_malloc((size_t)k * sizeof(double));
        for (int i = c * SMALL_CHUNK; i < n && i < (c + 1) * SMALL_CHUNK; i++) {
            for (int a = 0; a < q; a++) xd[a] = x[(size_t)i * q + a];
            for (int b = 0; b < k; b++) yd[b] = y[(size_t)i * k + b];
            for (int a = 0; a < q; a++) { /* whole rows of the square: loops of one length, which vectorize */
                double xa = xd[a], *pa = pc + (size_t)a * k;
                for (int b = 0; b < k; b++) pa[b] += xa * yd[b];
            }
        }
        free(xd);
        free(yd);
    }
    for (size_t e = 0; e < qk; e++) G[e] = 0;
    for (int c = 0; c < nc; c++)
        for (size_t e = 0; e < qk; e++) G[e] += part[(size_t)c * qk + e];
    free(part);
}

void cpu_mul_small_f64(float *y, const float *x, const double *M, int n, int q, int k) {
    int nc = (n + SMALL_CHUNK - 1) / SMALL_CHUNK;
#pragma omp parallel for schedule(static) if ((size_t)n * q * k > 262144)
    for (int c = 0; c < nc; c++) {
        double *acc = glm_malloc((size_t)k * sizeof(double));
        for (int i = c * SMALL_CHUNK; i < n && i < (c + 1) * SMALL_CHUNK; i++) {
            const float *row = x + (size_t)i * q;
            for (int j = 0; j < k; j++) acc[j] = 0;
            for (int a = 0; a < q; a++) { /* M's rows scaled by the row's entries: contiguous adds */
                double xa = row[a];
                const double *ma = M + (size_t)a * k;
                for (int j = 0; j < k; j++) acc[j] += xa * ma[j];
            }
            float *out = y + (size_t)i * k; /* the row was read whole: y may be x */
            for (int j = 0; j < k; j++) out[j] = (float)acc[j];
        }
        free(acc);
    }
}
