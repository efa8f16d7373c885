/* The SVD's small-matrix ops on the host (backend.h gram_f64, mul_small_f64, orth_f64): the CPU
 * backend's, and backend/svd.c's for a matrix on the host. */
#include "backend/cpu/cpu_ops.h"
#include <math.h>
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

int cpu_cholinv_f64(double *G, double *Ri, int q) {
    /* G = R^T R in place (R upper triangular, in G's upper part) */
    double big = 0;
    for (int j = 0; j < q; j++) big = G[(size_t)j * q + j] > big ? G[(size_t)j * q + j] : big;
    for (int j = 0; j < q; j++) {
        double d = G[(size_t)j * q + j];
        for (int k = 0; k < j; k++) d -= G[(size_t)k * q + j] * G[(size_t)k * q + j];
        if (!(d > 1e-13 * big)) return -1;
        double r = sqrt(d);
        G[(size_t)j * q + j] = r;
        for (int b = j + 1; b < q; b++) {
            double e = G[(size_t)j * q + b];
            for (int k = 0; k < j; k++) e -= G[(size_t)k * q + j] * G[(size_t)k * q + b];
            G[(size_t)j * q + b] = e / r;
        }
    }
    /* R^-1 (upper triangular), row by row from the bottom: row i of R R^-1 = e_i, so
     * Ri[i][j] = ([i == j] - sum_{i < k <= j} R[i][k] Ri[k][j]) / R[i][i], k ascending */
    for (int i = q - 1; i >= 0; i--) {
        double *ri = Ri + (size_t)i * q, rii = G[(size_t)i * q + i];
        for (int j = 0; j < q; j++) ri[j] = j == i ? 1.0 / rii : 0.0;
        for (int k = i + 1; k < q; k++) {
            double f = G[(size_t)i * q + k] / rii;
            const double *rk = Ri + (size_t)k * q;
            for (int j = k; j < q; j++) ri[j] -= f * rk[j];
        }
    }
    return 0;
}

int cpu_orth_f64(float *x, int n, int q) {
    double *G = glm_malloc((size_t)q * q * sizeof(double)), *Ri = glm_malloc((size_t)q * q * sizeof(double));
    int rc = 0;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        cpu_gram_f64(G, x, x, n, q, q);
        rc = cpu_cholinv_f64(G, Ri, q);
        if (rc == 0) cpu_mul_small_f64(x, x, Ri, n, q, q);
    }
    free(G);
    free(Ri);
    return rc;
}
