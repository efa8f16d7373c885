// The ChatGLM2 family's ops (backend.h): RMSNorm, SwiGLU, rotary on interleaved pairs, and the
// sum of expanded key/value gradients over their query-head groups. fp32 arithmetic; the CPU
// twins are in backend/cpu/cpu_ops.c.
#include "backend/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------- RMSNorm */

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int C, float eps) {
    __shared__ float sh[32];
    size_t off = (size_t)blockIdx.x * C;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { float v = to_f(x[off + c]); ss += v * v; }
    float r = rsqrtf(block_sum(ss, sh) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[off + c] = from_f<T>(to_f(w[c]) * (to_f(x[off + c]) * r));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

extern "C" void glmk_rmsnorm_fwd(glm_dtype dt, void *out, float *rstd, const void *x, const void *w, int N, int C,
                                 float eps, cudaStream_t st) {
    if (N <= 0) return;
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, rmsnorm_fwd_kernel<T><<<N, threads, 0, st>>>((T *)out, rstd, (const T *)x, (const T *)w, C, eps));
    GLMK_CHECK_LAUNCH();
}

/* dx = rstd * (g*w - xhat * mean(g*w*xhat)), row by row; dx may alias dout. */
template <typename T>
__global__ void rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd, int C) {
    __shared__ float sh[32];
    size_t off = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x], sgx = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sgx += to_f(dout[off + c]) * to_f(w[c]) * (to_f(x[off + c]) * r);
    float bb = block_sum(sgx, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = to_f(x[off + c]) * r;
        dx[off + c] = from_f<T>(r * (to_f(dout[off + c]) * to_f(w[c]) - xh * bb));
    }
}

/* dw partial sums: block (cx, ry) sums rows [ry*rows_per, ...) of column c in order. */
template <typename T>
__global__ void rmsnorm_dw_partial(float *part, const T *dout, const T *x, const float *rstd, int N, int C, int rows_per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float s = 0;
    for (int n = r0; n < r1; n++) s += to_f(dout[(size_t)n * C + c]) * (to_f(x[(size_t)n * C + c]) * rstd[n]);
    part[(size_t)blockIdx.y * C + c] = s;
}

template <typename T>
__global__ void rmsnorm_dw_final(T *dw, const float *part, int RB, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0;
    for (int r = 0; r < RB; r++) s += part[(size_t)r * C + c];
    dw[c] = from_f<T>(to_f(dw[c]) + s);
}

extern "C" size_t glmk_rmsnorm_bwd_scratch(int N, int C) {
    int rb = (N + 63) / 64;
    return (size_t)(rb > 256 ? 256 : rb) * C;
}

extern "C" void glmk_rmsnorm_bwd(glm_dtype dt, void *dx, void *dw, const void *dout, const void *x, const void *w,
                                 const float *rstd, int N, int C, float *scratch, cudaStream_t st) {
    if (N <= 0) return;
    int rb = (N + 63) / 64;
    if (rb > 256) rb = 256;
    int rows_per = (N + rb - 1) / rb;
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, {
        if (dw) { /* before dx, which may overwrite dout */
            rmsnorm_dw_partial<T><<<dim3((C + 255) / 256, rb), 256, 0, st>>>(scratch, (const T *)dout, (const T *)x, rstd, N, C,
                                                                            rows_per);
            rmsnorm_dw_final<T><<<(C + 255) / 256, 256, 0, st>>>((T *)dw, scratch, rb, C);
        }
        rmsnorm_dx_kernel<T><<<N, threads, 0, st>>>((T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, C);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- SwiGLU */

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *x, int N, int F) {
    size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, f = i - r * F;
        float g = to_f(x[r * 2 * F + f]), u = to_f(x[r * 2 * F + F + f]);
        out[i] = from_f<T>(g / (1.0f + expf(-g)) * u);
    }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dx, const T *x, const T *dout, int N, int F) {
    size_t n = (size_t)N * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / F, f = i - r * F;
        float g = to_f(x[r * 2 * F + f]), u = to_f(x[r * 2 * F + F + f]), d = to_f(dout[i]);
        float s = 1.0f / (1.0f + expf(-g));
        dx[r * 2 * F + f] = from_f<T>(d * u * s * (1.0f + g * (1.0f - s)));
        dx[r * 2 * F + F + f] = from_f<T>(d * g * s);
    }
}

extern "C" void glmk_swiglu_fwd(glm_dtype dt, void *out, const void *x, int N, int F, cudaStream_t st) {
    size_t n = (size_t)N * F;
    if (!n) return;
    GLMK_DISPATCH(dt, swiglu_fwd_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>((T *)out, (const T *)x, N, F));
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_swiglu_bwd(glm_dtype dt, void *dx, const void *x, const void *dout, int N, int F, cudaStream_t st) {
    size_t n = (size_t)N * F;
    if (!n) return;
    GLMK_DISPATCH(dt, swiglu_bwd_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>((T *)dx, (const T *)x,
                                                                                      (const T *)dout, N, F));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- rotary on pairs */

/* The frequencies travel as a kernel argument (at most 256 pairs: heads up to 512 wide). */
struct RopeFreq { float w[256]; };

/* One thread per (token, head, pair); f the host's fp32 frequencies (the CPU twin's). */
template <typename T>
__global__ void rope_pairs_kernel(T *x, long row_stride, int N, int nheads, int HD, int half, const int32_t *pos,
                                  const RopeFreq f, int inverse) {
    const float *w = f.w;
    size_t n = (size_t)N * nheads * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(i % half);
        size_t th = i / half;
        int h = (int)(th % nheads), t = (int)(th / nheads);
        T *v = x + (size_t)t * row_stride + (size_t)h * HD + 2 * p;
        float ang = (float)pos[t] * w[p], c, s;
        sincosf(ang, &s, &c);
        if (inverse) s = -s;
        float a = to_f(v[0]), b = to_f(v[1]);
        v[0] = from_f<T>(a * c - b * s);
        v[1] = from_f<T>(b * c + a * s);
    }
}

extern "C" void glmk_rope_pairs(glm_dtype dt, void *x, long row_stride, int N, int nheads, int HD, int rot,
                                const int32_t *pos, const float *w, int inverse, cudaStream_t st) {
    size_t n = (size_t)N * nheads * (rot / 2);
    if (!n) return;
    RopeFreq f;
    for (int i = 0; i < rot / 2 && i < 256; i++) f.w[i] = w[i];
    GLMK_DISPATCH(dt, rope_pairs_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>((T *)x, row_stride, N, nheads, HD,
                                                                                      rot / 2, pos, f, inverse));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- grouped key/value gradients */

/* dst (a grouped view over NKV heads) = the sum over each group's g query heads of src
 * [B, Tk, NH, HD] (contiguous), in head order in fp32. */
template <typename T>
__global__ void group_sum_kernel(glm_qkv_view dst, const T *src, int B, int Tk, int NKV, int g, int HD) {
    size_t n = (size_t)B * Tk * NKV * HD;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % HD);
        size_t r = i / HD;
        int hk = (int)(r % NKV);
        size_t bt = r / NKV;
        int t = (int)(bt % Tk), b = (int)(bt / Tk);
        const T *s = src + ((size_t)bt * NKV * g + (size_t)hk * g) * HD + d;
        float acc = 0;
        for (int k = 0; k < g; k++) acc += to_f(s[(size_t)k * HD]);
        ((T *)dst.base)[b * dst.batch_stride + (long)t * dst.tok_stride + hk * dst.head_stride + d] = from_f<T>(acc);
    }
}

extern "C" void glmk_group_sum(glm_dtype dt, glm_qkv_view dst, const void *src, int B, int Tk, int NKV, int g, int HD,
                               cudaStream_t st) {
    size_t n = (size_t)B * Tk * NKV * HD;
    if (!n) return;
    GLMK_DISPATCH(dt, group_sum_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>(dst, (const T *)src, B, Tk, NKV, g, HD));
    GLMK_CHECK_LAUNCH();
}
