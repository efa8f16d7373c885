/* DoRA's three ops (backend.h dora_norm, dora_scale, dora_bwd); CPU twins in
 * backend/cpu/cpu_dora.c. Sums in float, each in a fixed order (no atomics), so a run repeats
 * bit for bit. All three are bound by memory: the weight (the norms: here its rows' sums of squares,
 * beside cuBLAS's W A^T), the module's output once or twice (the scale and its backward). */
#include "backend/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------- the row norms */

/* A warp a row: ||W_j||^2 from W (16-byte loads where the rows allow), then the terms of B A from
 * G = W A^T and M = A A^T (cuda_backend.c). The block's 8 warps take 8 rows. */
template <typename T>
__global__ void __launch_bounds__(256) dora_norm_rows(float *n, const T *w, const T *b, const float *g, const float *aat,
                                                      float scale, int OC, int C, int r) {
    int j = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (j >= OC) return;
    const T *wj = w + (size_t)j * C;
    float ss = 0.0f;
    constexpr int P = Pack<T>::N;
    if (C % P == 0 && ((uintptr_t)w & 15) == 0) { /* every row on 16 bytes: one vector load a lane at a time */
        for (int k = lane * P; k < C; k += 32 * P) {
            Pack<T> v = ld_pack(wj + k);
#pragma unroll
            for (int e = 0; e < P; e++) ss = fmaf(to_f(v.v[e]), to_f(v.v[e]), ss);
        }
    } else {
        for (int k = lane; k < C; k += 32) {
            float v = to_f(wj[k]);
            ss = fmaf(v, v, ss);
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane) return;
    const T *bj = b + (size_t)j * r;
    const float *gj = g + (size_t)j * r;
    float cross = 0.0f, quad = 0.0f;
    for (int p = 0; p < r; p++) {
        float bp = to_f(bj[p]), mb = 0.0f;
        cross = fmaf(bp, gj[p], cross);
        for (int q = 0; q < r; q++) mb = fmaf(aat[p * r + q], to_f(bj[q]), mb);
        quad = fmaf(bp, mb, quad);
    }
    n[j] = sqrtf(fmaxf(ss + 2.0f * scale * cross + scale * scale * quad, 0.0f));
}

extern "C" void glmk_dora_norm(glm_dtype dt, float *n, const void *w, const void *b, const float *g, const float *aat,
                               float scale, int OC, int C, int r, cudaStream_t st) {
    if (OC <= 0) return;
    GLMK_DISPATCH(dt, dora_norm_rows<T><<<(OC + 7) / 8, 256, 0, st>>>(n, (const T *)w, (const T *)b, g, aat, scale, OC, C, r));
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
