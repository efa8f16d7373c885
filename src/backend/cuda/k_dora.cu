/* DoRA's three ops (backend.h dora_norm, dora_scale, dora_bwd); CPU twins in
 * backend/cpu/cpu_dora.c. Sums in float, each in a fixed order (no atomics), so a run repeats
 * bit for bit. All three are bound by memory: the weight once (the norms), the module's output
 * once or twice (the scale and its backward). */
#include "backend/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------- the row norms */

/* One block a row; A (r x C, a few tens of KB) is read from L2 for every row. A form with 32 rows
 * a block and a chunk of A in shared memory (each lane's A values serving 4 rows) measured 2.7x
 * slower on an H100 (docs/PERF.md, session 26) and was dropped. */
template <typename T>
__global__ void dora_norm_rows(float *n, const T *w, const T *a, const T *b, float scale, int C, int r) {
    __shared__ float part[8];
    int j = blockIdx.x;
    float ss = 0.0f;
    const T *wj = w + (size_t)j * C, *bj = b + (size_t)j * r;
    for (int k = threadIdx.x; k < C; k += blockDim.x) {
        float d = 0.0f;
        for (int q = 0; q < r; q++) d = fmaf(to_f(bj[q]), to_f(a[(size_t)q * C + k]), d);
        float v = fmaf(scale, d, to_f(wj[k]));
        ss = fmaf(v, v, ss);
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < 8; i++) t += part[i];
        n[j] = sqrtf(t);
    }
}

extern "C" void glmk_dora_norm(glm_dtype dt, float *n, const void *w, const void *a, const void *b, float scale, int OC,
                               int C, int r, cudaStream_t st) {
    if (OC <= 0) return;
    GLMK_DISPATCH(dt, dora_norm_rows<T><<<OC, 256, 0, st>>>(n, (const T *)w, (const T *)a, (const T *)b, scale, C, r));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- the row scale and its backward */

/* Both walk [N, OC] as columns across the threads (consecutive threads, consecutive columns: whole
 * lines a warp) and rows down a block's chunk of ROWS, so a column's factor is worked out once. */
#define COLS 256
#define ROWS 64

/* out = (mag / n - shift) z + bias + res_scale res */
template <typename T>
__global__ void __launch_bounds__(COLS) dora_scale_kernel(T *out, const T *z, const T *mag, const float *n, float shift,
                                                          const T *bias, const T *res, float res_scale, int N, int OC) {
    int j = blockIdx.x * COLS + threadIdx.x, t0 = blockIdx.y * ROWS, t1 = t0 + ROWS < N ? t0 + ROWS : N;
    if (j >= OC) return;
    float c = to_f(mag[j]) / n[j] - shift, bj = bias ? to_f(bias[j]) : 0.0f;
    for (int t = t0; t < t1; t++) {
        size_t i = (size_t)t * OC + j;
        float v = c * to_f(z[i]) + bj;
        out[i] = from_f<T>(res ? v + res_scale * to_f(res[i]) : v);
    }
}

extern "C" void glmk_dora_scale(glm_dtype dt, void *out, const void *z, const void *mag, const float *n, float shift,
                                const void *bias, const void *res, float res_scale, int N, int OC, cudaStream_t st) {
    if (N <= 0 || OC <= 0) return;
    dim3 grid((OC + COLS - 1) / COLS, (N + ROWS - 1) / ROWS);
    GLMK_DISPATCH(dt, dora_scale_kernel<T><<<grid, COLS, 0, st>>>((T *)out, (const T *)z, (const T *)mag, n, shift,
                                                                  (const T *)bias, (const T *)res, res_scale, N, OC));
    GLMK_CHECK_LAUNCH();
}

/* dz = (mag / n - shift) dout; part[y][j] = the sum of dout z over chunk y's rows */
template <typename T>
__global__ void __launch_bounds__(COLS) dora_bwd_kernel(T *dz, float *part, const T *dout, const T *z, const T *mag,
                                                        const float *n, float shift, int N, int OC) {
    int j = blockIdx.x * COLS + threadIdx.x, t0 = blockIdx.y * ROWS, t1 = t0 + ROWS < N ? t0 + ROWS : N;
    if (j >= OC) return;
    float c = to_f(mag[j]) / n[j] - shift, s = 0.0f;
    for (int t = t0; t < t1; t++) {
        size_t i = (size_t)t * OC + j;
        float g = to_f(dout[i]);
        s = fmaf(g, to_f(z[i]), s);
        dz[i] = from_f<T>(c * g);
    }
    part[(size_t)blockIdx.y * OC + j] = s;
}

/* dmag[j] += (the chunks' sums in chunk order) / n[j] */
template <typename T>
__global__ void dora_mag_grad(T *dmag, const float *part, const float *n, int chunks, int OC) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= OC) return;
    float s = 0.0f;
    for (int y = 0; y < chunks; y++) s += part[(size_t)y * OC + j];
    dmag[j] = from_f<T>(to_f(dmag[j]) + s / n[j]);
}

extern "C" size_t glmk_dora_bwd_scratch(int N, int OC) { return (size_t)((N + ROWS - 1) / ROWS) * (size_t)OC; }

extern "C" void glmk_dora_bwd(glm_dtype dt, void *dz, void *dmag, const void *dout, const void *z, const void *mag,
                              const float *n, float shift, int N, int OC, float *scratch, cudaStream_t st) {
    if (OC <= 0) return;
    int chunks = (N + ROWS - 1) / ROWS;
    if (N > 0) {
        dim3 grid((OC + COLS - 1) / COLS, chunks);
        GLMK_DISPATCH(dt, dora_bwd_kernel<T><<<grid, COLS, 0, st>>>((T *)dz, scratch, (const T *)dout, (const T *)z,
                                                                    (const T *)mag, n, shift, N, OC));
    }
    GLMK_DISPATCH(dt, dora_mag_grad<T><<<(OC + 255) / 256, 256, 0, st>>>((T *)dmag, scratch, n, N > 0 ? chunks : 0, OC));
    GLMK_CHECK_LAUNCH();
}
