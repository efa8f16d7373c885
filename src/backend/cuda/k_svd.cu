/* The SVD's small-matrix ops (backend.h gram_f64, mul_small_f64, orth_f64) for backend/svd.c: the
 * Gram matrix of two thin blocks, a thin block times a small matrix, and the Cholesky factor and
 * its inverse of a small Gram matrix, in double. Fixed orders (no atomics): results repeat bit for
 * bit. */
#include "backend/cuda/cuda_common.cuh"

#define GRAM_THREADS 256
#define GRAM_PER_THREAD 8 /* outputs a thread sums; the grid's second dimension covers the rest */

/* Rows of x and y a block holds in shared memory at once (floats: at most 12 KiB of each) */
static int gram_rows(int q, int k) {
    int rows = 6144 / (q + k);
    return rows < 1 ? 1 : rows > 32 ? 32 : rows;
}

/* part[b, o] = sum over the row chunks c = b, b + G, b + 2G, ... (in that order, each chunk's rows
 * in order) of x[i, a] y[i, j], o = a k + j, a thread a fixed set of outputs */
__global__ void gram_partial_kernel(double *part, const float *x, const float *y, int n, int q, int k, int rows) {
    extern __shared__ float sh[];
    float *xs = sh, *ys = sh + (size_t)rows * q;
    int qk = q * k, o0 = blockIdx.y * GRAM_THREADS * GRAM_PER_THREAD;
    double acc[GRAM_PER_THREAD];
    for (int t = 0; t < GRAM_PER_THREAD; t++) acc[t] = 0;
    for (int c = blockIdx.x; (size_t)c * rows < (size_t)n; c += gridDim.x) {
        size_t r0 = (size_t)c * rows;
        int m = n - (int)r0 < rows ? n - (int)r0 : rows;
        for (int e = threadIdx.x; e < m * q; e += blockDim.x) xs[e] = x[r0 * q + e];
        for (int e = threadIdx.x; e < m * k; e += blockDim.x) ys[e] = y[r0 * k + e];
        __syncthreads();
        for (int t = 0; t < GRAM_PER_THREAD; t++) {
            int o = o0 + t * GRAM_THREADS + threadIdx.x;
            if (o >= qk) break;
            int a = o / k, j = o - a * k;
            double s = acc[t];
            for (int i = 0; i < m; i++) s += (double)xs[i * q + a] * (double)ys[i * k + j];
            acc[t] = s;
        }
        __syncthreads();
    }
    for (int t = 0; t < GRAM_PER_THREAD; t++) {
        int o = o0 + t * GRAM_THREADS + threadIdx.x;
        if (o < qk) part[(size_t)blockIdx.x * qk + o] = acc[t];
    }
}

/* G[o] = sum_b part[b, o], b in order */
__global__ void gram_sum_kernel(double *G, const double *part, int qk, int blocks) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= qk) return;
    double s = 0;
    for (int b = 0; b < blocks; b++) s += part[(size_t)b * qk + o];
    G[o] = s;
}

extern "C" void glmk_gram_f64(double *part, double *G, const float *x, const float *y, int n, int q, int k,
                              cudaStream_t st) {
    int qk = q * k, rows = gram_rows(q, k);
    dim3 grid(GLMK_GRAM_BLOCKS, (qk + GRAM_THREADS * GRAM_PER_THREAD - 1) / (GRAM_THREADS * GRAM_PER_THREAD));
    size_t smem = (size_t)rows * (q + k) * sizeof(float);
    gram_partial_kernel<<<grid, GRAM_THREADS, smem, st>>>(part, x, y, n, q, k, rows);
    gram_sum_kernel<<<(qk + 255) / 256, 256, 0, st>>>(G, part, qk, GLMK_GRAM_BLOCKS);
    GLMK_CHECK_LAUNCH();
}

#define MUL_ROWS 8 /* rows of x a block reads whole before it writes them (y may be x) */

/* y[i, j] = sum_a x[i, a] M[a, j], a in order, in double, rounded once; nothing when *skip (a
 * Cholesky that failed: orth_f64) */
__global__ void mul_small_kernel(float *y, const float *x, const double *M, int n, int q, int k, const int *skip) {
    extern __shared__ float xs[]; /* [MUL_ROWS, q] */
    if (skip && *skip) return;
    size_t r0 = (size_t)blockIdx.x * MUL_ROWS;
    int m = n - (int)r0 < MUL_ROWS ? n - (int)r0 : MUL_ROWS;
    for (int e = threadIdx.x; e < m * q; e += blockDim.x) xs[e] = x[r0 * q + e];
    __syncthreads();
    for (int e = threadIdx.x; e < m * k; e += blockDim.x) {
        int i = e / k, j = e - i * k;
        double s = 0;
        for (int a = 0; a < q; a++) s += (double)xs[i * q + a] * M[(size_t)a * k + j];
        y[(r0 + i) * k + j] = (float)s;
    }
}

extern "C" void glmk_mul_small_f64(float *y, const float *x, const double *M, int n, int q, int k, cudaStream_t st) {
    int blocks = (n + MUL_ROWS - 1) / MUL_ROWS;
    mul_small_kernel<<<blocks, 256, (size_t)MUL_ROWS * q * sizeof(float), st>>>(y, x, M, n, q, k, NULL);
    GLMK_CHECK_LAUNCH();
}

/* G = R^T R in place (R in G's upper part) and Ri = R^-1, one block, in the order of the host's
 * cpu_cholinv_f64: each pivot by one thread (k ascending), a row's other entries and then each
 * row of the inverse (from the bottom, k ascending) a thread an entry. *fail set when a pivot is
 * not clearly positive; nothing done when it is already set (an earlier pass failed). */
#define CHOL_THREADS 64
__global__ void cholinv_kernel(double *G, double *Ri, int *fail, int q) {
    __shared__ double big;
    __shared__ int bad;
    int t = threadIdx.x;
    if (*fail) return;
    if (t == 0) {
        double b = 0;
        for (int j = 0; j < q; j++) b = G[(size_t)j * q + j] > b ? G[(size_t)j * q + j] : b;
        big = b;
        bad = 0;
    }
    __syncthreads();
    for (int j = 0; j < q; j++) {
        if (t == 0) {
            double d = G[(size_t)j * q + j];
            for (int k = 0; k < j; k++) d = d - G[(size_t)k * q + j] * G[(size_t)k * q + j];
            if (!(d > 1e-13 * big)) bad = 1;
            else G[(size_t)j * q + j] = sqrt(d);
        }
        __syncthreads();
        if (bad) break;
        double r = G[(size_t)j * q + j];
        for (int b = j + 1 + t; b < q; b += blockDim.x) {
            double e = G[(size_t)j * q + b];
            for (int k = 0; k < j; k++) e = e - G[(size_t)k * q + j] * G[(size_t)k * q + b];
            G[(size_t)j * q + b] = e / r;
        }
        __syncthreads();
    }
    if (bad) {
        if (t == 0) *fail = 1;
        return;
    }
    for (int i = q - 1; i >= 0; i--) {
        double rii = G[(size_t)i * q + i];
        for (int j = t; j < q; j += blockDim.x) {
            double v = j == i ? 1.0 / rii : 0.0;
            for (int k = i + 1; k <= j; k++) v = v - (G[(size_t)i * q + k] / rii) * Ri[(size_t)k * q + j];
            Ri[(size_t)i * q + j] = v;
        }
        __syncthreads();
    }
}

extern "C" void glmk_orth_f64(double *part, double *G, double *Ri, int *fail, float *x, int n, int q, cudaStream_t st) {
    int blocks = (n + MUL_ROWS - 1) / MUL_ROWS;
    cudaMemsetAsync(fail, 0, sizeof(int), st);
    for (int pass = 0; pass < 2; pass++) {
        glmk_gram_f64(part, G, x, x, n, q, q, st);
        cholinv_kernel<<<1, CHOL_THREADS, 0, st>>>(G, Ri, fail, q);
        mul_small_kernel<<<blocks, 256, (size_t)MUL_ROWS * q * sizeof(float), st>>>(x, x, Ri, n, q, q, fail);
    }
    GLMK_CHECK_LAUNCH();
}
