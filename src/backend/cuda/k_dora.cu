/* DoRA's three ops (backend.h dora_norm, dora_scale, dora_bwd); CPU twins in
 * backend/cpu/cpu_dora.c. Sums in float, each in a fixed order (no atomics), so a run repeats
 * bit for bit. */
#include "backend/cuda/cuda_common.cuh"

#define NORM_THREADS 256

/* One block per output row j: v[k] = w[j,k] + scale * sum_q b[j,q] a[q,k] over the row, summed
 * as squares per thread, then across the block. a [r, C] is read by every block (it stays in L2);
 * b's row in shared memory. */
template <typename T>
__global__ void dora_norm_kernel(float *n, const T *w, const T *a, const T *b, float scale, int C, int r) {
    extern __shared__ float sh[]; /* [r] b's row, then [NORM_THREADS / 32] the warps' sums */
    float *bj = sh, *part = sh + r;
    int j = blockIdx.x;
    for (int q = threadIdx.x; q < r; q += blockDim.x) bj[q] = to_f(b[(size_t)j * r + q]);
    __syncthreads();
    float ss = 0.0f;
    const T *wj = w + (size_t)j * C;
    for (int k = threadIdx.x; k < C; k += blockDim.x) {
        float d = 0.0f;
        for (int q = 0; q < r; q++) d = fmaf(bj[q], to_f(a[(size_t)q * C + k]), d);
        float v = fmaf(scale, d, to_f(wj[k]));
        ss = fmaf(v, v, ss);
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < NORM_THREADS / 32; i++) t += part[i];
        n[j] = sqrtf(t);
    }
}

extern "C" void glmk_dora_norm(glm_dtype dt, float *n, const void *w, const void *a, const void *b, float scale, int OC,
                               int C, int r, cudaStream_t st) {
    if (OC <= 0) return;
    size_t shm = ((size_t)r + NORM_THREADS / 32) * sizeof(float);
    GLMK_DISPATCH(dt, dora_norm_kernel<T><<<OC, NORM_THREADS, shm, st>>>(n, (const T *)w, (const T *)a, (const T *)b,
                                                                         scale, C, r));
    GLMK_CHECK_LAUNCH();
}

/* out = (mag / n - shift) z + bias + res_scale res, elementwise over [N, OC] */
template <typename T>
__global__ void dora_scale_kernel(T *out, const T *z, const T *mag, const float *n, float shift, const T *bias, const T *res,
                                  float res_scale, int N, int OC) {
    size_t total = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % OC);
        float v = (to_f(mag[j]) / n[j] - shift) * to_f(z[i]) + (bias ? to_f(bias[j]) : 0.0f);
        out[i] = from_f<T>(res ? v + res_scale * to_f(res[i]) : v);
    }
}

extern "C" void glmk_dora_scale(glm_dtype dt, void *out, const void *z, const void *mag, const float *n, float shift,
                                const void *bias, const void *res, float res_scale, int N, int OC, cudaStream_t st) {
    if (N <= 0 || OC <= 0) return;
    GLMK_DISPATCH(dt, dora_scale_kernel<T><<<glmk_blocks((size_t)N * OC, 256, 132 * 16), 256, 0, st>>>(
                          (T *)out, (const T *)z, (const T *)mag, n, shift, (const T *)bias, (const T *)res, res_scale, N,
                          OC));
    GLMK_CHECK_LAUNCH();
}

/* A block takes 32 columns; its 8 warps' lanes walk the rows 8 apart, writing dz and summing
 * dout z per column; the 8 partial sums of a column are added in warp order. */
#define BWD_ROWS 8
template <typename T>
__global__ void dora_bwd_kernel(T *dz, T *dmag, const T *dout, const T *z, const T *mag, const float *n, float shift, int N,
                                int OC) {
    __shared__ float part[BWD_ROWS][33];
    int j = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (j < OC) {
        float c = to_f(mag[j]) / n[j] - shift;
        for (int t = threadIdx.y; t < N; t += BWD_ROWS) {
            size_t i = (size_t)t * OC + j;
            float g = to_f(dout[i]);
            s = fmaf(g, to_f(z[i]), s);
            dz[i] = from_f<T>(c * g);
        }
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < OC) {
        float t = 0.0f;
        for (int y = 0; y < BWD_ROWS; y++) t += part[y][threadIdx.x];
        dmag[j] = from_f<T>(to_f(dmag[j]) + t / n[j]);
    }
}

extern "C" void glmk_dora_bwd(glm_dtype dt, void *dz, void *dmag, const void *dout, const void *z, const void *mag,
                              const float *n, float shift, int N, int OC, cudaStream_t st) {
    if (OC <= 0) return;
    dim3 block(32, BWD_ROWS);
    GLMK_DISPATCH(dt, dora_bwd_kernel<T><<<(OC + 31) / 32, block, 0, st>>>((T *)dz, (T *)dmag, (const T *)dout,
                                                                          (const T *)z, (const T *)mag, n, shift, N, OC));
    GLMK_CHECK_LAUNCH();
}
