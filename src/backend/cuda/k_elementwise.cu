/* Elementwise and row-copy kernels: conversions, fills, embedding, GELU, scale_add, row
 * gather/scatter, 2D rotary, bias add. Each has a CPU twin in backend/cpu/cpu_ops.c.
 * Memory-bound: 16-byte packs where the pointers and sizes allow, scalar otherwise. */
#include "backend/cuda/cuda_common.cuh"
#include <stdio.h>
#include "backend/mask_hash.h"

/* ---------------------------------------------------------------- conversions, fills */

template <typename D, typename S>
__global__ void convert_kernel(D *dst, const S *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<D>(to_f(src[i]));
}

extern "C" void glmk_convert(void *dst, glm_dtype ddt, const void *src, glm_dtype sdt, size_t n, cudaStream_t st) {
    if (n == 0) return;
    unsigned g = glmk_blocks(n, 256, 132 * 16);
    GLMK_DISPATCH(ddt, {
        typedef T DT;
        GLMK_DISPATCH(sdt, convert_kernel<DT, T><<<g, 256, 0, st>>>((DT *)dst, (const T *)src, n));
    });
    GLMK_CHECK_LAUNCH();
}

/* Whether this build carries code the device runs: machine code for its architecture or PTX the
 * driver can compile for it (cudaFuncGetAttributes loads the module, compiling PTX if need be).
 * Asked once at start, so a GPU newer than the build gets one clear error, not a failed launch. */
extern "C" int glmk_image_ok(char *why, size_t whylen) {
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, (const void *)convert_kernel<float, float>);
    (void)cudaGetLastError(); /* an answer here, not an error for the next launch */
    if (e != cudaSuccess && why) snprintf(why, whylen, "%s", cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* splitmix64 finaliser: a counter-based generator, so any element can be drawn independently */
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_normal_kernel(T *dst, size_t n, uint64_t seed, float std) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ULL + i);
        float u1 = ((r >> 40) + 1) * (1.0f / 16777217.0f), u2 = ((r >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        dst[i] = from_f<T>(std * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}
template <typename T>
__global__ void fill_kernel(T *dst, size_t n, float value) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<T>(value);
}

extern "C" void glmk_fill_normal(glm_dtype dt, void *dst, size_t n, uint64_t seed, float std, cudaStream_t st) {
    if (n == 0) return;
    GLMK_DISPATCH(dt, fill_normal_kernel<T><<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>((T *)dst, n, seed, std));
    GLMK_CHECK_LAUNCH();
}
extern "C" void glmk_fill(glm_dtype dt, void *dst, size_t n, float value, cudaStream_t st) {
    if (n == 0) return;
    GLMK_DISPATCH(dt, fill_kernel<T><<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>((T *)dst, n, value));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- row copies */

/* dst row r = src row srow(r): one block per row; VEC selects 16-byte packs. */
template <typename T, bool VEC>
__device__ __forceinline__ void copy_row(T *dst, const T *src, int C) {
    if (VEC) {
        constexpr int P = Pack<T>::N;
        for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) st_pack(dst + c, ld_pack(src + c));
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
    }
}

/* mode 0: out[r] = x[idx[r]] (gather, embedding); mode 1: out[idx[r]] = x[r] (scatter) */
template <typename T, bool VEC>
__global__ void rows_kernel(T *out, const T *x, const int32_t *idx, int C, int scatter) {
    int r = blockIdx.x;
    size_t src = scatter ? (size_t)r : (size_t)idx[r], dst = scatter ? (size_t)idx[r] : (size_t)r;
    copy_row<T, VEC>(out + dst * C, x + src * C, C);
}

static void rows(glm_dtype dt, void *out, const void *x, const int32_t *idx, int R, int C, int scatter, cudaStream_t st) {
    if (R <= 0 || C <= 0) return;
    size_t es = glm_dtype_size(dt);
    bool vec = aligned16(out) && aligned16(x) && ((size_t)C * es) % 16 == 0;
    int threads = C / (int)(16 / es) >= 256 ? 256 : 128;
    GLMK_DISPATCH(dt, {
        if (vec) rows_kernel<T, true><<<R, threads, 0, st>>>((T *)out, (const T *)x, idx, C, scatter);
        else rows_kernel<T, false><<<R, threads, 0, st>>>((T *)out, (const T *)x, idx, C, scatter);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_embedding_fwd(glm_dtype dt, void *out, const int32_t *ids, const void *wte, int N, int H, cudaStream_t st) {
    rows(dt, out, wte, ids, N, H, 0, st);
}
extern "C" void glmk_gather_rows(glm_dtype dt, void *out, const void *x, const int32_t *idx, int R, int C, cudaStream_t st) {
    rows(dt, out, x, idx, R, C, 0, st);
}
extern "C" void glmk_scatter_rows(glm_dtype dt, void *out, const void *x, const int32_t *idx, int R, int C, cudaStream_t st) {
    rows(dt, out, x, idx, R, C, 1, st);
}

/* Embedding backward without atomics: the block of the FIRST token carrying an id sums, in
 * token order, the gradient rows of every token with that id and adds the sum to dwte once;
 * other blocks exit. Matching tokens are compacted in order, 256 at a time (ballots), and each
 * thread keeps EMB_CPT columns in registers. Deterministic, and for fp32 bit-equal to the
 * CPU's sequential sum. Block size must be 256. */
#define EMB_CPT 16
template <typename T>
__global__ void __launch_bounds__(256) embedding_bwd_kernel(T *dwte, const T *dout, const int32_t *ids, int N, int H) {
    __shared__ int list[256], wcnt[8], dup;
    int n = blockIdx.x, id = ids[n], lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (threadIdx.x == 0) dup = 0;
    __syncthreads();
    for (int m = threadIdx.x; m < n; m += blockDim.x)
        if (ids[m] == id) dup = 1; /* every writer stores the same value */
    __syncthreads();
    if (dup) return;
    T *row = dwte + (size_t)id * H;
    for (int c0 = 0; c0 < H; c0 += EMB_CPT * 256) {
        float acc[EMB_CPT];
#pragma unroll
        for (int k = 0; k < EMB_CPT; k++) {
            int c = c0 + k * 256 + threadIdx.x;
            acc[k] = c < H ? to_f(row[c]) : 0.0f;
        }
        for (int base = n; base < N; base += 256) {
            int m = base + threadIdx.x;
            bool match = m < N && ids[m] == id;
            unsigned bal = __ballot_sync(0xffffffffu, match);
            if (lane == 0) wcnt[w] = __popc(bal);
            __syncthreads();
            int off = 0, total = 0;
            for (int i = 0; i < 8; i++) { off += i < w ? wcnt[i] : 0; total += wcnt[i]; }
            if (match) list[off + __popc(bal & ((1u << lane) - 1))] = m;
            __syncthreads();
            for (int i = 0; i < total; i++) {
                const T *g = dout + (size_t)list[i] * H;
#pragma unroll
                for (int k = 0; k < EMB_CPT; k++) {
                    int c = c0 + k * 256 + threadIdx.x;
                    if (c < H) acc[k] += to_f(g[c]);
                }
            }
            __syncthreads(); /* list and wcnt are rewritten next round */
        }
#pragma unroll
        for (int k = 0; k < EMB_CPT; k++) {
            int c = c0 + k * 256 + threadIdx.x;
            if (c < H) row[c] = from_f<T>(acc[k]);
        }
    }
}

extern "C" void glmk_embedding_bwd(glm_dtype dt, void *dwte, const void *dout, const int32_t *ids, int N, int H, cudaStream_t st) {
    if (N <= 0) return;
    GLMK_DISPATCH(dt, embedding_bwd_kernel<T><<<N, 256, 0, st>>>((T *)dwte, (const T *)dout, ids, N, H));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- GELU, scale_add */

#define GELU_C 0.7978845608028654f
__device__ __forceinline__ float gelu_f(float a) {
    return 0.5f * a * (1.0f + tanhf(GELU_C * a * (1.0f + 0.044715f * a * a)));
}
__device__ __forceinline__ float gelu_grad(float a) {
    float t = tanhf(GELU_C * a * (1.0f + 0.044715f * a * a));
    float du = GELU_C * (1.0f + 3.0f * 0.044715f * a * a);
    return 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * du;
}

/* op 0: out = gelu(a); op 1: out = b * gelu'(a); op 2: out = alpha * a + b */
template <typename T, int OP>
__device__ __forceinline__ float ew_op(float a, float b, float alpha) {
    if (OP == 0) return gelu_f(a);
    if (OP == 1) return b * gelu_grad(a);
    return alpha * a + b;
}

template <typename T, int OP, bool VEC>
__global__ void ew_kernel(T *out, const T *a, const T *b, float alpha, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (VEC) {
        constexpr int P = Pack<T>::N;
        for (size_t i = t * P; i < n; i += stride * P) {
            Pack<T> pa = ld_pack(a + i), pb, po;
            if (OP != 0) pb = ld_pack(b + i);
#pragma unroll
            for (int k = 0; k < P; k++) po.v[k] = from_f<T>(ew_op<T, OP>(to_f(pa.v[k]), OP != 0 ? to_f(pb.v[k]) : 0.0f, alpha));
            st_pack(out + i, po);
        }
    } else {
        for (size_t i = t; i < n; i += stride)
            out[i] = from_f<T>(ew_op<T, OP>(to_f(a[i]), OP != 0 ? to_f(b[i]) : 0.0f, alpha));
    }
}

template <int OP>
static void ew(glm_dtype dt, void *out, const void *a, const void *b, float alpha, size_t n, cudaStream_t st) {
    if (n == 0) return;
    size_t P = 16 / glm_dtype_size(dt);
    bool vec = aligned16(out) && aligned16(a) && (!b || aligned16(b)) && n % P == 0;
    unsigned g = glmk_blocks(vec ? n / P : n, 256, 132 * 32);
    GLMK_DISPATCH(dt, {
        if (vec) ew_kernel<T, OP, true><<<g, 256, 0, st>>>((T *)out, (const T *)a, (const T *)b, alpha, n);
        else ew_kernel<T, OP, false><<<g, 256, 0, st>>>((T *)out, (const T *)a, (const T *)b, alpha, n);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_gelu_fwd(glm_dtype dt, void *out, const void *x, size_t n, cudaStream_t st) { ew<0>(dt, out, x, NULL, 0, n, st); }
extern "C" void glmk_gelu_bwd(glm_dtype dt, void *dx, const void *x, const void *dout, size_t n, cudaStream_t st) {
    ew<1>(dt, dx, x, dout, 0, n, st);
}
extern "C" void glmk_scale_add(glm_dtype dt, void *out, float alpha, const void *x, const void *y, size_t n, cudaStream_t st) {
    ew<2>(dt, out, x, y, alpha, n, st);
}

/* x[r, :] *= s[r]; VEC: 16-byte packs (C a multiple of the pack) */
template <typename T, bool VEC>
__global__ void scale_rows_kernel(T *x, const float *s, int R, int C) {
    constexpr int P = VEC ? Pack<T>::N : 1;
    size_t per_row = (size_t)C / P, n = (size_t)R * per_row;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += stride) {
        float f = s[t / per_row];
        if (VEC) {
            Pack<T> p = ld_pack(x + t * P);
#pragma unroll
            for (int k = 0; k < P; k++) p.v[k] = from_f<T>(to_f(p.v[k]) * f);
            st_pack(x + t * P, p);
        } else {
            x[t] = from_f<T>(to_f(x[t]) * f);
        }
    }
}

extern "C" void glmk_scale_rows(glm_dtype dt, void *x, const float *s, int R, int C, cudaStream_t st) {
    if (R <= 0 || C <= 0) return;
    size_t P = 16 / glm_dtype_size(dt);
    bool vec = aligned16(x) && C % P == 0;
    unsigned g = glmk_blocks(vec ? (size_t)R * C / P : (size_t)R * C, 256, 132 * 32);
    GLMK_DISPATCH(dt, {
        if (vec) scale_rows_kernel<T, true><<<g, 256, 0, st>>>((T *)x, s, R, C);
        else scale_rows_kernel<T, false><<<g, 256, 0, st>>>((T *)x, s, R, C);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- mask_scale (dropout) */

/* VEC: 16-byte packs, one hash per four elements (n a multiple of the pack) */
template <typename T, bool VEC>
__global__ void mask_scale_kernel(T *out, const T *x, size_t n, float keep_scale, uint32_t th, uint64_t seed, bool drop) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (VEC) {
        constexpr int P = Pack<T>::N;
        for (size_t i = t * P; i < n; i += stride * P) {
            Pack<T> px = ld_pack(x + i), po;
#pragma unroll
            for (int q = 0; q < P / 4; q++) {
                uint32_t kb = drop ? glm_mask_keep4(seed, (i >> 2) + q, th) : 0xfu;
#pragma unroll
                for (int e = 0; e < 4; e++) po.v[4 * q + e] = from_f<T>(kb >> e & 1 ? to_f(px.v[4 * q + e]) * keep_scale : 0.0f);
            }
            st_pack(out + i, po);
        }
    } else {
        for (size_t i = t; i < n; i += stride)
            out[i] = from_f<T>(drop && !glm_mask_keep(seed, i, th) ? 0.0f : to_f(x[i]) * keep_scale);
    }
}
extern "C" void glmk_mask_scale(glm_dtype dt, void *out, const void *x, size_t n, float scale, float p, uint64_t seed,
                                cudaStream_t st) {
    if (n == 0) return;
    size_t P = 16 / glm_dtype_size(dt);
    bool vec = aligned16(out) && aligned16(x) && n % P == 0;
    unsigned g = glmk_blocks(vec ? n / P : n, 256, 132 * 16);
    float ks = p > 0 ? scale / (1.0f - p) : scale;
    uint32_t th = glm_mask_threshold(p);
    GLMK_DISPATCH(dt, {
        if (vec) mask_scale_kernel<T, true><<<g, 256, 0, st>>>((T *)out, (const T *)x, n, ks, th, seed, p > 0);
        else mask_scale_kernel<T, false><<<g, 256, 0, st>>>((T *)out, (const T *)x, n, ks, th, seed, p > 0);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- noise_add (NEFTune) */

/* fma as the CPU twin's fmaf, so both round once and agree to the last bit in fp32 */
template <typename T>
__global__ void noise_add_kernel(T *x, size_t n, float mag, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_f<T>(__fmaf_rn(mag, glm_uniform_pm1(seed, i), to_f(x[i])));
}
extern "C" void glmk_noise_add(glm_dtype dt, void *x, size_t n, float mag, uint64_t seed, cudaStream_t st) {
    if (n == 0) return;
    GLMK_DISPATCH(dt, noise_add_kernel<T><<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>((T *)x, n, mag, seed));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- bias add */

template <typename T>
__global__ void bias_add_kernel(T *out, const T *bias, int N, int OC) {
    size_t total = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<T>(to_f(out[i]) + to_f(bias[i % OC]));
}
extern "C" void glmk_bias_add(glm_dtype dt, void *out, const void *bias, int N, int OC, cudaStream_t st) {
    if (N <= 0 || OC <= 0) return;
    GLMK_DISPATCH(dt, bias_add_kernel<T><<<glmk_blocks((size_t)N * OC, 256, 132 * 16), 256, 0, st>>>((T *)out, (const T *)bias, N, OC));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- 2D rotary */

struct InvFreq { float w[128]; };

/* One block per token (and per group of heads: gridDim.y groups): the 2 x HD/4 distinct angles
 * of the token (position, block position) are computed once into shared memory (fp32, accurate
 * sincosf: positions reach thousands of radians), then the block rotates every (head, q|k,
 * half, pair) of its heads with 32-bit index math. Consecutive threads take consecutive pairs
 * j: 64 contiguous bytes per half-warp access. Decoding has one token a row: there the heads are
 * spread over blocks, or a single block would do all the work. */
template <typename T, bool VEC>
__global__ void rope_kernel(T *qkv, const int32_t *pos, const int32_t *bpos, int NH, int HD, int inverse, InvFreq f) {
    __shared__ float cs[256], sn[256];
    int n = blockIdx.x, R = HD / 2, hp = R / 2;
    for (int t = threadIdx.x; t < 2 * hp; t += blockDim.x) {
        int half = t / hp, j = t - half * hp;
        float s, c;
        sincosf((float)(half ? bpos[n] : pos[n]) * f.w[j], &s, &c);
        cs[t] = c;
        sn[t] = inverse ? -s : s;
    }
    __syncthreads();
    int per = NH / gridDim.y; /* heads of this block: [blockIdx.y * per, + per) */
    T *base = qkv + (size_t)n * NH * 3 * HD + (size_t)blockIdx.y * per * 3 * HD;
    if (VEC) { /* a pack of pairs j .. j + P - 1 a thread: 16-byte loads and stores */
        constexpr int P = Pack<T>::N;
        int hpp = hp / P, total = per * 4 * hpp;
        for (int e = threadIdx.x; e < total; e += blockDim.x) {
            int j = e % hpp * P, r = e / hpp, half = r & 1, part = (r >> 1) & 1, h = r >> 2;
            T *x = base + h * 3 * HD + part * HD + half * R;
            Pack<T> pa = ld_pack(x + j), pb = ld_pack(x + j + hp), oa, ob;
#pragma unroll
            for (int k = 0; k < P; k++) {
                float c = cs[half * hp + j + k], s = sn[half * hp + j + k];
                float a = to_f(pa.v[k]), b = to_f(pb.v[k]);
                oa.v[k] = from_f<T>(a * c - b * s);
                ob.v[k] = from_f<T>(b * c + a * s);
            }
            st_pack(x + j, oa);
            st_pack(x + j + hp, ob);
        }
        return;
    }
    int total = per * 4 * hp;
    for (int e = threadIdx.x; e < total; e += blockDim.x) {
        int j = e % hp, r = e / hp, half = r & 1, part = (r >> 1) & 1, h = r >> 2;
        T *x = base + h * 3 * HD + part * HD + half * R;
        float c = cs[half * hp + j], s = sn[half * hp + j];
        float a = to_f(x[j]), b = to_f(x[j + hp]);
        x[j] = from_f<T>(a * c - b * s);
        x[j + hp] = from_f<T>(b * c + a * s);
    }
}

extern "C" void glmk_rope(glm_dtype dt, void *qkv, const int32_t *pos, const int32_t *bpos, int N, int NH, int HD,
                          int inverse, const float *inv_freq, cudaStream_t st) {
    int hp = HD / 4;
    if (N <= 0 || hp <= 0) return;
    if (hp > 128) glm_cuda_check_at(cudaErrorInvalidValue, "rope: head size above 512", __FILE__, __LINE__);
    InvFreq f;
    for (int j = 0; j < hp; j++) f.w[j] = inv_freq[j];
    int P = (int)(16 / glm_dtype_size(dt));
    bool vec = hp % P == 0 && aligned16(qkv); /* every quarter-head starts on a pack */
    int groups = N < 64 ? NH : 1; /* few tokens: a block per head */
    int work = NH / groups * 4 * (vec ? hp / P : hp), threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
    dim3 grid(N, groups);
    GLMK_DISPATCH(dt, {
        if (vec) rope_kernel<T, true><<<grid, threads, 0, st>>>((T *)qkv, pos, bpos, NH, HD, inverse, f);
        else rope_kernel<T, false><<<grid, threads, 0, st>>>((T *)qkv, pos, bpos, NH, HD, inverse, f);
    });
    GLMK_CHECK_LAUNCH();
}
