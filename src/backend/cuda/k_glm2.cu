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

/* Register-cached variants for rows of 16-byte packs (each thread up to RMS_NP packs of its row,
 * columns pk*P.. for pk = tid, tid + blockDim, ...): every input read from memory once. */
#define RMS_NP 4
#define RMS_BWD_BLOCKS 264 /* rows per block = N / 264: a fixed grid keeps the dw sums in a fixed order */
template <typename T>
__global__ void rmsnorm_fwd_vec(T *out, float *rstd, const T *x, const T *w, int C, float eps) {
    constexpr int P = Pack<T>::N;
    __shared__ float sh[32];
    int packs = C / P;
    const T *xr = x + (size_t)blockIdx.x * C;
    float v[RMS_NP][P], ss = 0;
#pragma unroll
    for (int k = 0; k < RMS_NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
        if (pk < packs) {
            Pack<T> a = ld_pack(xr + pk * P);
#pragma unroll
            for (int e = 0; e < P; e++) { v[k][e] = to_f(a.v[e]); ss += v[k][e] * v[k][e]; }
        }
    }
    float r = rsqrtf(block_sum(ss, sh) / C + eps);
    T *o = out + (size_t)blockIdx.x * C;
#pragma unroll
    for (int k = 0; k < RMS_NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
        if (pk < packs) {
            Pack<T> pw = ld_pack(w + pk * P), po;
#pragma unroll
            for (int e = 0; e < P; e++) po.v[e] = from_f<T>(to_f(pw.v[e]) * (v[k][e] * r));
            st_pack(o + pk * P, po);
        }
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

/* dx (may alias dout) of rows blockIdx.x + k*gridDim.x, plus res (NULL: none; not dx), and with
 * DW partial[blockIdx.x] of dw. A row's x, dout and res are held as loaded (16-byte packs, half the
 * registers of floats: more rows in flight), res fetched with the others so its latency hides under
 * the row's sum; a frozen norm (no DW: the base under LoRA, P-Tuning, a frozen layer) keeps no dw
 * sums and takes a row a block. */
template <typename T, bool DW>
__global__ void rmsnorm_bwd_vec(T *dx, float *pdw, const T *dout, const T *x, const T *w, const float *rstd, const T *res,
                                int N, int C) {
    constexpr int P = Pack<T>::N;
    __shared__ float sh[32];
    int packs = C / P;
    float aw[DW ? RMS_NP : 1][P] = {};
    Pack<T> pw[RMS_NP];
#pragma unroll
    for (int k = 0; k < RMS_NP; k++)
        if (threadIdx.x + k * blockDim.x < packs) pw[k] = ld_pack(w + (threadIdx.x + k * blockDim.x) * P);
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        size_t off = (size_t)n * C;
        float r = rstd[n], sgx = 0;
        Pack<T> px[RMS_NP], pg[RMS_NP], pr[RMS_NP];
#pragma unroll
        for (int k = 0; k < RMS_NP; k++) {
            int pk = threadIdx.x + k * blockDim.x;
            if (pk < packs) {
                px[k] = ld_pack(x + off + pk * P);
                pg[k] = ld_pack(dout + off + pk * P);
                if (res) pr[k] = ld_pack(res + off + pk * P);
            }
        }
#pragma unroll
        for (int k = 0; k < RMS_NP; k++)
            if (threadIdx.x + k * blockDim.x < packs)
#pragma unroll
                for (int e = 0; e < P; e++) {
                    float g = to_f(pg[k].v[e]), xh = to_f(px[k].v[e]) * r;
                    sgx += g * to_f(pw[k].v[e]) * xh;
                    if constexpr (DW) aw[k][e] += g * xh;
                }
        float bb = block_sum(sgx, sh) / C;
#pragma unroll
        for (int k = 0; k < RMS_NP; k++) {
            int pk = threadIdx.x + k * blockDim.x;
            if (pk < packs) {
                Pack<T> po;
#pragma unroll
                for (int e = 0; e < P; e++)
                    po.v[e] = from_f<T>(r * (to_f(pg[k].v[e]) * to_f(pw[k].v[e]) - (to_f(px[k].v[e]) * r) * bb) +
                                        (res ? to_f(pr[k].v[e]) : 0.0f));
                st_pack(dx + off + pk * P, po);
            }
        }
    }
    if constexpr (DW) {
#pragma unroll
        for (int k = 0; k < RMS_NP; k++) {
            int pk = threadIdx.x + k * blockDim.x;
            if (pk < packs)
#pragma unroll
                for (int e = 0; e < P; e++) pdw[(size_t)blockIdx.x * C + pk * P + e] = aw[k][e];
        }
    }
}

/* threads for the vector path (a multiple of 32, at most RMS_NP packs each), or 0 */
static int rms_vec_threads(glm_dtype dt, int C, const void *a, const void *b, const void *c, const void *d) {
    int P = (int)(16 / glm_dtype_size(dt));
    if (C % P || !aligned16(a) || !aligned16(b) || !aligned16(c) || !aligned16(d)) return 0;
    int packs = C / P, t = (packs + RMS_NP - 1) / RMS_NP;
    t = (t + 31) / 32 * 32;
    return t <= 1024 ? t : 0;
}

extern "C" void glmk_rmsnorm_fwd(glm_dtype dt, void *out, float *rstd, const void *x, const void *w, int N, int C,
                                 float eps, cudaStream_t st) {
    if (N <= 0) return;
    int vt = rms_vec_threads(dt, C, out, x, w, x);
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, {
        if (vt) rmsnorm_fwd_vec<T><<<N, vt, 0, st>>>((T *)out, rstd, (const T *)x, (const T *)w, C, eps);
        else rmsnorm_fwd_kernel<T><<<N, threads, 0, st>>>((T *)out, rstd, (const T *)x, (const T *)w, C, eps);
    });
    GLMK_CHECK_LAUNCH();
}

/* dx = rstd * (g*w - xhat * mean(g*w*xhat)) (+ res), row by row; dx may alias dout. */
template <typename T>
__global__ void rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd, const T *res, int C) {
    __shared__ float sh[32];
    size_t off = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x], sgx = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sgx += to_f(dout[off + c]) * to_f(w[c]) * (to_f(x[off + c]) * r);
    float bb = block_sum(sgx, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = to_f(x[off + c]) * r;
        dx[off + c] = from_f<T>(r * (to_f(dout[off + c]) * to_f(w[c]) - xh * bb) + (res ? to_f(res[off + c]) : 0.0f));
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
    return (size_t)RMS_BWD_BLOCKS * C; /* covers both paths (the plain one has at most 256 row blocks) */
}

extern "C" void glmk_rmsnorm_bwd(glm_dtype dt, void *dx, void *dw, const void *dout, const void *x, const void *w,
                                 const float *rstd, const void *res, int N, int C, float *scratch, cudaStream_t st) {
    if (N <= 0) return;
    int vt = !res || aligned16(res) ? rms_vec_threads(dt, C, dx, dout, x, w) : 0;
    if (vt) { /* a frozen norm a row a block: no rows waiting on one block's loop */
        int G = !dw || N < RMS_BWD_BLOCKS ? N : RMS_BWD_BLOCKS;
        GLMK_DISPATCH(dt, {
            if (dw) {
                rmsnorm_bwd_vec<T, true><<<G, vt, 0, st>>>((T *)dx, scratch, (const T *)dout, (const T *)x, (const T *)w, rstd,
                                                           (const T *)res, N, C);
                rmsnorm_dw_final<T><<<(C + 255) / 256, 256, 0, st>>>((T *)dw, scratch, G, C);
            } else {
                rmsnorm_bwd_vec<T, false><<<G, vt, 0, st>>>((T *)dx, NULL, (const T *)dout, (const T *)x, (const T *)w, rstd,
                                                            (const T *)res, N, C);
            }
        });
        GLMK_CHECK_LAUNCH();
        return;
    }
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
        rmsnorm_dx_kernel<T><<<N, threads, 0, st>>>((T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd,
                                                    (const T *)res, C);
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

/* The same on 16-byte packs (F a multiple of the pack): one row index division per pack. */
template <typename T>
__global__ void swiglu_fwd_vec(T *out, const T *x, int N, int F) {
    constexpr int P = Pack<T>::N;
    size_t ppr = (size_t)F / P, n = (size_t)N * ppr;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ppr, f = (i - r * ppr) * P;
        Pack<T> g = ld_pack(x + r * 2 * F + f), u = ld_pack(x + r * 2 * F + F + f), o;
#pragma unroll
        for (int e = 0; e < P; e++) {
            float a = to_f(g.v[e]);
            o.v[e] = from_f<T>(a / (1.0f + expf(-a)) * to_f(u.v[e]));
        }
        st_pack(out + r * F + f, o);
    }
}

template <typename T>
__global__ void swiglu_bwd_vec(T *dx, const T *x, const T *dout, int N, int F) {
    constexpr int P = Pack<T>::N;
    size_t ppr = (size_t)F / P, n = (size_t)N * ppr;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ppr, f = (i - r * ppr) * P;
        Pack<T> g = ld_pack(x + r * 2 * F + f), u = ld_pack(x + r * 2 * F + F + f), d = ld_pack(dout + r * F + f), dg, du;
#pragma unroll
        for (int e = 0; e < P; e++) {
            float a = to_f(g.v[e]), b = to_f(u.v[e]), c = to_f(d.v[e]);
            float sg = 1.0f / (1.0f + expf(-a));
            dg.v[e] = from_f<T>(c * b * sg * (1.0f + a * (1.0f - sg)));
            du.v[e] = from_f<T>(c * a * sg);
        }
        st_pack(dx + r * 2 * F + f, dg);
        st_pack(dx + r * 2 * F + F + f, du);
    }
}

static bool swiglu_vec(glm_dtype dt, int F, const void *a, const void *b, const void *c) {
    return F % (int)(16 / glm_dtype_size(dt)) == 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

extern "C" void glmk_swiglu_fwd(glm_dtype dt, void *out, const void *x, int N, int F, cudaStream_t st) {
    size_t n = (size_t)N * F;
    if (!n) return;
    size_t np = n / (16 / glm_dtype_size(dt));
    GLMK_DISPATCH(dt, {
        if (swiglu_vec(dt, F, out, x, x)) swiglu_fwd_vec<T><<<glmk_blocks(np, 256, 65535), 256, 0, st>>>((T *)out, (const T *)x, N, F);
        else swiglu_fwd_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>((T *)out, (const T *)x, N, F);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_swiglu_bwd(glm_dtype dt, void *dx, const void *x, const void *dout, int N, int F, cudaStream_t st) {
    size_t n = (size_t)N * F;
    if (!n) return;
    size_t np = n / (16 / glm_dtype_size(dt));
    GLMK_DISPATCH(dt, {
        if (swiglu_vec(dt, F, dx, x, dout))
            swiglu_bwd_vec<T><<<glmk_blocks(np, 256, 65535), 256, 0, st>>>((T *)dx, (const T *)x, (const T *)dout, N, F);
        else swiglu_bwd_kernel<T><<<glmk_blocks(n, 256, 65535), 256, 0, st>>>((T *)dx, (const T *)x, (const T *)dout, N, F);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- rotary on pairs */

/* The frequencies travel as a kernel argument (at most 256 pairs: heads up to 512 wide). */
struct RopeFreq { float w[256]; };

/* One thread per (token, pair, slice of hs heads): its angle once, then the pair in each head of
 * its slice (a warp's threads cover consecutive pairs of one head: contiguous bytes). Many tokens
 * take one slice of all heads; a decode step's one token splits the heads over threads. f: the
 * host's fp32 frequencies (the CPU twin's). */
template <typename T>
__global__ void rope_pairs_kernel(T *x, long row_stride, int N, int nheads, int HD, int half, int hs, const int32_t *pos,
                                  const RopeFreq f, int inverse) {
    int slices = (nheads + hs - 1) / hs;
    size_t n = (size_t)N * half * slices;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(i % half);
        size_t r = i / half;
        int sl = (int)(r % slices), t = (int)(r / slices);
        float c, s;
        sincosf((float)pos[t] * f.w[p], &s, &c);
        if (inverse) s = -s;
        int h0 = sl * hs, h1 = min(nheads, h0 + hs);
        T *v = x + (size_t)t * row_stride + (size_t)h0 * HD + 2 * p;
        for (int h = h0; h < h1; h++, v += HD) {
            float a = to_f(v[0]), b = to_f(v[1]);
            v[0] = from_f<T>(a * c - b * s);
            v[1] = from_f<T>(b * c + a * s);
        }
    }
}

extern "C" void glmk_rope_pairs(glm_dtype dt, void *x, long row_stride, int N, int nheads, int HD, int rot,
                                const int32_t *pos, const float *w, int inverse, cudaStream_t st) {
    size_t n = (size_t)N * (rot / 2);
    if (!n || !nheads) return;
    RopeFreq f;
    for (int i = 0; i < rot / 2 && i < 256; i++) f.w[i] = w[i];
    int hs = n >= 32768 ? nheads : n >= 2048 ? 4 : 1; /* heads per thread: few tokens spread them */
    size_t threads = n * (size_t)((nheads + hs - 1) / hs);
    GLMK_DISPATCH(dt, rope_pairs_kernel<T><<<glmk_blocks(threads, 256, 65535), 256, 0, st>>>((T *)x, row_stride, N, nheads,
                                                                                            HD, rot / 2, hs, pos, f, inverse));
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
