/* Quantized weights (backend/quant.h's byte layouts): dequantize, the whole matrix into S for
 * the GEMMs, and qmatmul_fwd, the decode GEMV that reads the packed bytes directly. CPU twins
 * in backend/cpu/cpu_ops.c; semantics in backend/backend.h.
 *
 * Values: every weight is computed in fp32 exactly as glm_dequantize does it (INT8/INT4:
 * (float)q * fp16 scale; NF4: nf4[code] * (dyn[qa] * absmax2 + offset), each product and sum
 * rounded on its own: __fmul_rn/__fadd_rn, no FMA contraction), so dequantize rounded to S is
 * bit-identical to the CPU's weights rounded by upload_f32. The integers become floats without
 * I2F (a quarter-rate conversion): the nibble or byte, its sign bit flipped, is OR-ed under the
 * exponent of 2^k, and 2^k + 8 (or + 128) subtracted: exact, one LOP3 and one FADD.
 *
 * dequantize (default: variant 2): each thread converts 8 weights a step (INT4/NF4: one packed
 * word, INT8: two), four steps' loads in flight before their stores, so a warp's stores are
 * contiguous 512-byte runs (bf16/fp16); INT8/INT4 need C % 8 == 0 (a step inside one row), NF4
 * any C. Variant 1 (one 16-byte chunk, 16 or 32 weights, a thread) is kept for the shapes
 * between (C % 16 / C % 32 == 0) and for comparison: its strided stores ran at half the rate.
 *
 * qmatmul_fwd, SIMT (INT8, NF4; INT4 on fp32 storage): 16-byte chunks of the packed bytes (16
 * INT8 or 32 INT4/NF4 weights, in one row when C % 16 / 32 / 64 == 0: NF4's then also half of
 * one block). A block of 4 warps owns RB output rows per warp group and NT input rows; the KW
 * warps of a group split the columns, one chunk of each of the RB rows per thread per step (the
 * next step's chunks prefetched), the input's matching columns read from global/L1 as fp32 and
 * reused across the RB rows; the weights stream past L1 (ld.global.nc.L1::no_allocate) so the
 * small input stays there. Per-row sums in fp32: INT8/INT4 sum x * q and multiply by the row
 * scale at the end, NF4 sums x * nf4[code] per half block and multiplies by the block's absmax.
 * INT4 on bf16/fp16 storage with C % 128 == 0 runs on tensor cores (below). Reductions (warp
 * shuffles, then the warps in a fixed order) are deterministic.
 *
 * Both ops need the matrix start 16-byte aligned for the vector kernels (the layout's parts
 * start on 256-byte boundaries of it) and the input 16-byte aligned; other shapes or pointers
 * (4-byte alignment is the least: the fp32 absmax2) take the scalar kernels: one element at a
 * time, the same values. */
#include "backend/cuda/cuda_common.cuh"
extern "C" {
#include "backend/quant.h"
}
#include "backend/quant_codes.h"

__constant__ float c_nf4[16] = {GLM_NF4_CODE_INIT};
__constant__ float c_dyn[256] = {GLM_DYN_CODE_INIT};

/* ---------------------------------------------------------------- decoding */

/* The signed nibble at bits [P, P+4) of t as a float (P + 3 <= 22). */
template <int P> __device__ __forceinline__ float i4_at(uint32_t t) {
    const uint32_t bits = (t & (0xfu << P)) ^ (((uint32_t)(150 - P) << 23) | (0x8u << P));
    return __fsub_rn(__uint_as_float(bits), (float)((1 << (23 - P)) + 8));
}
/* The signed byte at bits [P, P+8) of t as a float (P + 7 <= 22). */
template <int P> __device__ __forceinline__ float i8_at(uint32_t t) {
    const uint32_t bits = (t & (0xffu << P)) ^ (((uint32_t)(150 - P) << 23) | (0x80u << P));
    return __fsub_rn(__uint_as_float(bits), (float)((1 << (23 - P)) + 128));
}
/* 4 INT8 weights of one little-endian word, in column order */
__device__ __forceinline__ void dec_int8(uint32_t w, float *f) {
    const uint32_t h = w >> 16;
    f[0] = i8_at<0>(w); f[1] = i8_at<8>(w); f[2] = i8_at<0>(h); f[3] = i8_at<8>(h);
}
/* 8 INT4 weights of one word: byte j holds column 2j in its high nibble, 2j + 1 in its low one */
__device__ __forceinline__ void dec_int4(uint32_t w, float *f) {
    const uint32_t h = w >> 12;
    f[0] = i4_at<4>(w); f[1] = i4_at<0>(w); f[2] = i4_at<12>(w); f[3] = i4_at<8>(w);
    f[4] = i4_at<8>(h); f[5] = i4_at<16>(w); f[6] = i4_at<16>(h); f[7] = i4_at<12>(h);
}
/* 8 NF4 code values of one word (same nibble order), from a table in shared memory */
__device__ __forceinline__ void dec_nf4(uint32_t w, const float *tbl, float *f) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = tbl[(w >> (8 * j + 4)) & 15u];
        f[2 * j + 1] = tbl[(w >> (8 * j)) & 15u];
    }
}
template <int Q> __device__ __forceinline__ void dec_word(uint32_t w, const float *tbl, float *f) {
    if constexpr (Q == GLM_Q_INT8) dec_int8(w, f);
    else if constexpr (Q == GLM_Q_INT4) dec_int4(w, f);
    else dec_nf4(w, tbl, f);
}

__device__ __forceinline__ float f16_bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* NF4 block b's absmax, as glm_nf4_absmax: dyn[qa[b]] * absmax2[b / 256] + offset */
__device__ __forceinline__ float nf4_absmax(const float *dyn, const uint8_t *qa, const float *absmax2, float off,
                                            size_t b) {
    return __fadd_rn(__fmul_rn(dyn[__ldg(qa + b)], __ldg(absmax2 + b / GLM_NF4_BLOCK2)), off);
}

/* Element i of the [OC, C] matrix, one at a time (the scalar kernels) */
__device__ __forceinline__ float deq_one(int Q, const uint8_t *q, const uint16_t *scale, const uint8_t *qa,
                                         const float *absmax2, float off, size_t i, int C) {
    if (Q == GLM_Q_NF4) {
        const uint8_t byte = __ldg(q + i / 2);
        return __fmul_rn(c_nf4[i % 2 ? byte & 15 : byte >> 4], nf4_absmax(c_dyn, qa, absmax2, off, i / GLM_NF4_BLOCK));
    }
    const float sc = f16_bits(__ldg(scale + i / (size_t)C));
    int v;
    if (Q == GLM_Q_INT8) {
        v = (int8_t)__ldg(q + i);
    } else {
        const int8_t b = (int8_t)__ldg(q + i / 2);
        v = i % 2 ? (int8_t)(b << 4) >> 4 : b >> 4; /* C is even: column parity = element parity */
    }
    return __fmul_rn((float)v, sc);
}

/* 16 bytes of weights, not kept in L1 (each is read once per call) */
__device__ __forceinline__ uint4 ld_stream(const uint8_t *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
__device__ __forceinline__ uint32_t word_of(const uint4 &v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

/* K consecutive S elements at p (K * sizeof(T) a multiple of 8, p aligned to it) as floats */
template <typename T, int K> __device__ __forceinline__ void ld_f(const T *p, float *f) {
    constexpr int B = K * (int)sizeof(T);
    static_assert(B % 8 == 0, "8-byte pieces");
    if constexpr (B % 16 == 0) {
#pragma unroll
        for (int i = 0; i < B / 16; i++) {
            const Pack<T> k = ld_pack(p + i * Pack<T>::N);
#pragma unroll
            for (int e = 0; e < Pack<T>::N; e++) f[i * Pack<T>::N + e] = to_f(k.v[e]);
        }
    } else {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));
        const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
        for (int i = 0; i < K; i++) f[i] = to_f(e[i]);
    }
}

/* The NF4 tables into shared memory (every thread of the block calls it, then syncs) */
__device__ __forceinline__ void load_tables(float *s_nf4, float *s_dyn) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_dyn[i] = c_dyn[i];
    if (threadIdx.x < 16) s_nf4[threadIdx.x] = c_nf4[threadIdx.x];
}

/* ---------------------------------------------------------------- dequantize */

/* One 16-byte chunk per thread per step: chunk ch is weights [ch * W, (ch + 1) * W) of the
 * flat matrix, in row ch / cpr (INT8/INT4; NF4 needs no row). */
template <int Q, typename T>
__global__ void __launch_bounds__(256) dequant_vec_kernel(T *__restrict__ w, const uint8_t *__restrict__ q,
                                                          const uint16_t *__restrict__ scale,
                                                          const uint8_t *__restrict__ qa,
                                                          const float *__restrict__ absmax2,
                                                          const float *__restrict__ offp, unsigned nchunks,
                                                          unsigned cpr) {
    constexpr int W = Q == GLM_Q_INT8 ? 16 : 32, WW = W / 4, P = Pack<T>::N;
    __shared__ float s_nf4[16], s_dyn[Q == GLM_Q_NF4 ? 256 : 1];
    float off = 0.0f;
    if constexpr (Q == GLM_Q_NF4) {
        load_tables(s_nf4, s_dyn);
        __syncthreads();
        off = __ldg(offp);
    }
    for (unsigned ch = blockIdx.x * blockDim.x + threadIdx.x; ch < nchunks; ch += gridDim.x * blockDim.x) {
        const uint4 v = ld_stream(q + (size_t)ch * 16);
        float f[W];
#pragma unroll
        for (int k = 0; k < 4; k++) dec_word<Q>(word_of(v, k), s_nf4, f + k * WW);
        const float m = Q == GLM_Q_NF4 ? nf4_absmax(s_dyn, qa, absmax2, off, ch / 2) : f16_bits(__ldg(scale + ch / cpr));
        T *dst = w + (size_t)ch * W;
#pragma unroll
        for (int i = 0; i < W / P; i++) {
            Pack<T> o;
#pragma unroll
            for (int e = 0; e < P; e++) o.v[e] = from_f<T>(__fmul_rn(f[i * P + e], m));
            st_pack(dst + i * P, o);
        }
    }
}

template <typename T>
__global__ void dequant_scalar_kernel(T *__restrict__ w, const uint8_t *__restrict__ q, int Q,
                                      const uint16_t *__restrict__ scale, const uint8_t *__restrict__ qa,
                                      const float *__restrict__ absmax2, const float *__restrict__ offp, size_t n,
                                      int C) {
    const float off = Q == GLM_Q_NF4 ? __ldg(offp) : 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = from_f<T>(deq_one(Q, q, scale, qa, absmax2, off, i, C));
}

/* Variant 2: 8 weights per thread per step (INT4/NF4: one word, INT8: two), so a warp's stores
 * are one contiguous 512-byte run (bf16/fp16); 4 steps' loads issued before their stores.
 * INT8/INT4 need C % 8 == 0; chunk i lies in row i / upr. */
template <int Q, typename T>
__global__ void __launch_bounds__(256) dequant_v2_kernel(T *__restrict__ w, const uint8_t *__restrict__ q,
                                                         const uint16_t *__restrict__ scale,
                                                         const uint8_t *__restrict__ qa,
                                                         const float *__restrict__ absmax2,
                                                         const float *__restrict__ offp, unsigned nunits,
                                                         unsigned upr) {
    constexpr int U = 4, P = Pack<T>::N;
    __shared__ float s_nf4[16], s_dyn[Q == GLM_Q_NF4 ? 256 : 1];
    float off = 0.0f;
    if constexpr (Q == GLM_Q_NF4) {
        load_tables(s_nf4, s_dyn);
        __syncthreads();
        off = __ldg(offp);
    }
    const unsigned stride = gridDim.x * blockDim.x;
    for (unsigned i0 = blockIdx.x * blockDim.x + threadIdx.x; i0 < nunits; i0 += U * stride) {
        uint32_t lo[U], hi[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const unsigned i = i0 + u * stride;
            lo[u] = hi[u] = 0;
            if (i < nunits) {
                if constexpr (Q == GLM_Q_INT8) {
                    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(q) + i);
                    lo[u] = v.x;
                    hi[u] = v.y;
                } else {
                    lo[u] = __ldg(reinterpret_cast<const uint32_t *>(q) + i);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const unsigned i = i0 + u * stride;
            if (i >= nunits) break;
            float f[8];
            if constexpr (Q == GLM_Q_INT8) {
                dec_int8(lo[u], f);
                dec_int8(hi[u], f + 4);
            } else {
                dec_word<Q>(lo[u], s_nf4, f);
            }
            const float m = Q == GLM_Q_NF4 ? nf4_absmax(s_dyn, qa, absmax2, off, i / 8) : f16_bits(__ldg(scale + i / upr));
            T *dst = w + (size_t)i * 8;
#pragma unroll
            for (int k = 0; k < 8 / P; k++) {
                Pack<T> o;
#pragma unroll
                for (int e = 0; e < P; e++) o.v[e] = from_f<T>(__fmul_rn(f[k * P + e], m));
                st_pack(dst + k * P, o);
            }
        }
    }
}

/* ---------------------------------------------------------------- qmatmul_fwd */

#define QMM_THREADS 128
#define QMM_WARPS (QMM_THREADS / 32)

/* grid.x = ceil(OC / (RB * RG)) * ngroups: block (row block rb, input group g) with g fastest,
 * so the groups that read the same weights run side by side (the later reads hit L2). The 4
 * warps form RG = 4 / KW row groups of RB rows; the KW warps of a group split the columns. */
template <int Q, typename T, int NT, int RB, int KW>
__global__ void __launch_bounds__(QMM_THREADS)
    qmm_vec_kernel(T *__restrict__ out, const T *__restrict__ inp, const uint8_t *__restrict__ q,
                   const uint16_t *__restrict__ scale, const uint8_t *__restrict__ qa,
                   const float *__restrict__ absmax2, const float *__restrict__ offp, const T *__restrict__ bias,
                   int N, int C, int OC, int ngroups) {
    constexpr int W = Q == GLM_Q_INT8 ? 16 : 32, WW = W / 4, RG = QMM_WARPS / KW, KT = 32 * KW;
    /* NF4: per-chunk partial sums scaled once by the absmax (few accumulators), or each
     * weight scaled before the NT products (many) */
    constexpr bool PART = Q == GLM_Q_NF4 && NT <= 4;
    __shared__ float s_nf4[16], s_dyn[Q == GLM_Q_NF4 ? 256 : 1];
    __shared__ float red[QMM_WARPS][RB * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rg = warp / KW, kw = warp - rg * KW;
    const int g = blockIdx.x % ngroups, o0 = ((blockIdx.x / ngroups) * RG + rg) * RB, n0 = g * NT;
    const int nch = C / W;
    const size_t row_bytes = (size_t)nch * 16;
    int orow[RB];
    const uint8_t *qrow[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) {
        orow[r] = min(o0 + r, OC - 1); /* rows past OC: computed, never written */
        qrow[r] = q + (size_t)orow[r] * row_bytes;
    }
    const T *xrow[NT];
#pragma unroll
    for (int k = 0; k < NT; k++) xrow[k] = inp + (size_t)min(n0 + k, N - 1) * C;

    int ch = kw * 32 + lane;
    uint4 cur[RB];
#pragma unroll
    for (int r = 0; r < RB; r++) cur[r] = ch < nch ? ld_stream(qrow[r] + (size_t)ch * 16) : make_uint4(0, 0, 0, 0);
    float off = 0.0f;
    if constexpr (Q == GLM_Q_NF4) {
        load_tables(s_nf4, s_dyn);
        __syncthreads();
        off = __ldg(offp);
    }
    float acc[RB][NT];
#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
        for (int k = 0; k < NT; k++) acc[r][k] = 0.0f;

    for (; ch < nch; ch += KT) {
        const int chn = ch + KT;
        uint4 nxt[RB];
#pragma unroll
        for (int r = 0; r < RB; r++) nxt[r] = chn < nch ? ld_stream(qrow[r] + (size_t)chn * 16) : make_uint4(0, 0, 0, 0);
        float am[RB];
        if constexpr (Q == GLM_Q_NF4) {
#pragma unroll
            for (int r = 0; r < RB; r++)
                am[r] = nf4_absmax(s_dyn, qa, absmax2, off, (size_t)orow[r] * (size_t)(C / GLM_NF4_BLOCK) + ch / 2);
        }
        float part[PART ? RB : 1][PART ? NT : 1];
        if constexpr (PART) {
#pragma unroll
            for (int r = 0; r < RB; r++)
#pragma unroll
                for (int k = 0; k < NT; k++) part[r][k] = 0.0f;
        }
#pragma unroll
        for (int wd = 0; wd < 4; wd++) {
            float x[NT][WW];
#pragma unroll
            for (int k = 0; k < NT; k++) ld_f<T, WW>(xrow[k] + (size_t)ch * W + wd * WW, x[k]);
#pragma unroll
            for (int r = 0; r < RB; r++) {
                float f[WW];
                dec_word<Q>(word_of(cur[r], wd), s_nf4, f);
                if constexpr (Q == GLM_Q_NF4 && !PART) {
#pragma unroll
                    for (int j = 0; j < WW; j++) f[j] *= am[r];
                }
#pragma unroll
                for (int k = 0; k < NT; k++)
#pragma unroll
                    for (int j = 0; j < WW; j++) {
                        if constexpr (PART) part[r][k] = fmaf(x[k][j], f[j], part[r][k]);
                        else acc[r][k] = fmaf(x[k][j], f[j], acc[r][k]);
                    }
            }
        }
        if constexpr (PART) {
#pragma unroll
            for (int r = 0; r < RB; r++)
#pragma unroll
                for (int k = 0; k < NT; k++) acc[r][k] = fmaf(part[r][k], am[r], acc[r][k]);
        }
#pragma unroll
        for (int r = 0; r < RB; r++) cur[r] = nxt[r];
    }

#pragma unroll
    for (int r = 0; r < RB; r++)
#pragma unroll
        for (int k = 0; k < NT; k++) {
            const float v = warp_sum(acc[r][k]);
            if (lane == 0) red[warp][r * NT + k] = v;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < RG * RB * NT; t += QMM_THREADS) {
        const int grp = t / (RB * NT), e = t - grp * (RB * NT), r = e / NT, k = e - r * NT;
        const int o = ((blockIdx.x / ngroups) * RG + grp) * RB + r, n = n0 + k;
        if (o >= OC || n >= N) continue;
        float s = red[grp * KW][e];
#pragma unroll
        for (int w = 1; w < KW; w++) s += red[grp * KW + w][e];
        if (Q != GLM_Q_NF4) s *= f16_bits(__ldg(scale + o));
        if (bias) s += to_f(bias[o]);
        out[(size_t)n * OC + o] = from_f<T>(s);
    }
}

/* ---- INT4 on tensor cores (bf16/fp16 storage, C % 128 == 0): mma.sync m16n8k16, fp32 sums.
 * The INT4 values and the inputs are exact in S, so every product is exact and only the fp32
 * accumulation order differs from the SIMT kernel. A warp owns 16 * MT rows and every
 * MMA_KS-th step of 128 columns; lane (g = lane / 4, t = lane % 4) reads the 16-byte chunk of
 * columns [128 s + 32 t, +32) of rows g and g + 8 of each 16-row tile, and the same columns of
 * input row g (the B operand's column n = g: 8 input rows per n-tile). The k order inside an
 * mma is free as long as A and B agree: a nibble-extracting LOP3 puts columns (1, 5), (0, 4),
 * (3, 7), (2, 6) of each 8-column word in one register (S pair = 128 + u, then one fma to q),
 * and a byte permute pairs the inputs the same way. The MMA_KS warps of a block split the
 * columns; their sums meet in shared memory in a fixed order. */
#define MMA_KS 8

template <typename T> struct I4Magic;
template <> struct I4Magic<bf16> { /* 128 + u, 1.0, -136 */
    static constexpr uint32_t OR = 0x43084308u, ONE = 0x3f803f80u, SUB = 0xc308c308u;
};
template <> struct I4Magic<f16> { /* 1024 + u, 1.0, -1032 */
    static constexpr uint32_t OR = 0x64086408u, ONE = 0x3c003c00u, SUB = 0xe408e408u;
};
template <typename T> __device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c);
template <> __device__ __forceinline__ uint32_t hfma2_u<bf16>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d = 0;
#ifdef GLMK_SM80
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
#else
    __trap();
#endif
    return d;
}
template <> __device__ __forceinline__ uint32_t hfma2_u<f16>(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* the signed nibbles at bits [s, s+4) and [s+16, s+20) of w as an S pair */
template <typename T, int SH> __device__ __forceinline__ uint32_t i4_pair(uint32_t w) {
    return hfma2_u<T>(((w >> SH) & 0x000f000fu) ^ I4Magic<T>::OR, I4Magic<T>::ONE, I4Magic<T>::SUB);
}
template <typename T> __device__ __forceinline__ void mma_16816(float *d, uint32_t a0, uint32_t a1, uint32_t a2,
                                                                 uint32_t a3, uint32_t b0, uint32_t b1) {
    const uint32_t a[4] = {a0, a1, a2, a3};
    mma16816<T>(d, a, b0, b1);
}

/* grid.x = ceil(OC / (16 * MT)) * ngroups (input group fastest), 32 * MMA_KS threads */
template <typename T, int NTILE, int MT>
__global__ void __launch_bounds__(32 * MMA_KS)
    qmm_int4_mma_kernel(T *__restrict__ out, const T *__restrict__ inp, const uint8_t *__restrict__ q,
                        const uint16_t *__restrict__ scale, const T *__restrict__ bias, int N, int C, int OC,
                        int ngroups) {
    constexpr int ROWS = 16 * MT, NB = 8 * NTILE;
    __shared__ float red[MMA_KS][ROWS][NB];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int grp = blockIdx.x % ngroups, o0 = (blockIdx.x / ngroups) * ROWS, n0 = grp * NB;
    const int nsteps = C / 128;
    const size_t row_bytes = (size_t)C / 2;
    const uint8_t *qr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) qr[m][h] = q + (size_t)min(o0 + 16 * m + 8 * h + g, OC - 1) * row_bytes + 16 * t;
    const T *xr[NTILE];
    bool xv[NTILE];
#pragma unroll
    for (int j = 0; j < NTILE; j++) {
        const int n = n0 + 8 * j + g;
        xv[j] = n < N;
        xr[j] = inp + (size_t)min(n, N - 1) * C + 32 * t;
    }
    float acc[MT][NTILE][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NTILE; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][j][e] = 0.0f;

    uint4 wc[MT][2], xc[NTILE][4];
    int s = warp;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) wc[m][h] = s < nsteps ? ld_stream(qr[m][h] + (size_t)s * 64) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < NTILE; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            xc[j][i] = s < nsteps && xv[j] ? __ldg(reinterpret_cast<const uint4 *>(xr[j] + (size_t)s * 128) + i)
                                           : make_uint4(0, 0, 0, 0);
    for (; s < nsteps; s += MMA_KS) {
        const int sn = s + MMA_KS;
        uint4 wn[MT][2], xn[NTILE][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) wn[m][h] = sn < nsteps ? ld_stream(qr[m][h] + (size_t)sn * 64) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < NTILE; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                xn[j][i] = sn < nsteps && xv[j] ? __ldg(reinterpret_cast<const uint4 *>(xr[j] + (size_t)sn * 128) + i)
                                                : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 4; k++) { /* word k: columns 8k .. 8k+7 of the lane's chunk */
            uint32_t b[NTILE][4];
#pragma unroll
            for (int j = 0; j < NTILE; j++) { /* inputs x0..x7 as pairs (x1,x5) (x0,x4) (x3,x7) (x2,x6) */
                const uint4 v = xc[j][k];
                b[j][0] = __byte_perm(v.x, v.z, 0x7632);
                b[j][1] = __byte_perm(v.x, v.z, 0x5410);
                b[j][2] = __byte_perm(v.y, v.w, 0x7632);
                b[j][3] = __byte_perm(v.y, v.w, 0x5410);
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const uint32_t lo = word_of(wc[m][0], k), hi = word_of(wc[m][1], k);
                const uint32_t l15 = i4_pair<T, 0>(lo), l04 = i4_pair<T, 4>(lo), l37 = i4_pair<T, 8>(lo),
                               l26 = i4_pair<T, 12>(lo);
                const uint32_t h15 = i4_pair<T, 0>(hi), h04 = i4_pair<T, 4>(hi), h37 = i4_pair<T, 8>(hi),
                               h26 = i4_pair<T, 12>(hi);
#pragma unroll
                for (int j = 0; j < NTILE; j++) {
                    mma_16816<T>(acc[m][j], l15, h15, l04, h04, b[j][0], b[j][1]);
                    mma_16816<T>(acc[m][j], l37, h37, l26, h26, b[j][2], b[j][3]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) wc[m][h] = wn[m][h];
#pragma unroll
        for (int j = 0; j < NTILE; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) xc[j][i] = xn[j][i];
    }
    /* D fragment: (row g, n 2t / 2t+1), (row g+8, n 2t / 2t+1) */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NTILE; j++) {
            red[warp][16 * m + g][8 * j + 2 * t] = acc[m][j][0];
            red[warp][16 * m + g][8 * j + 2 * t + 1] = acc[m][j][1];
            red[warp][16 * m + g + 8][8 * j + 2 * t] = acc[m][j][2];
            red[warp][16 * m + g + 8][8 * j + 2 * t + 1] = acc[m][j][3];
        }
    __syncthreads();
    for (int e = threadIdx.x; e < ROWS * NB; e += 32 * MMA_KS) {
        const int r = e / NB, k = e - r * NB, o = o0 + r, n = n0 + k;
        if (o >= OC || n >= N) continue;
        float v = red[0][r][k];
#pragma unroll
        for (int w = 1; w < MMA_KS; w++) v += red[w][r][k];
        v *= f16_bits(__ldg(scale + o));
        if (bias) v += to_f(bias[o]);
        out[(size_t)n * OC + o] = from_f<T>(v);
    }
}

/* Any shape: one warp per output row, every input row in turn. */
template <typename T>
__global__ void qmm_scalar_kernel(T *__restrict__ out, const T *__restrict__ inp, const uint8_t *__restrict__ q, int Q,
                                  const uint16_t *__restrict__ scale, const uint8_t *__restrict__ qa,
                                  const float *__restrict__ absmax2, const float *__restrict__ offp,
                                  const T *__restrict__ bias, int N, int C, int OC) {
    const int lane = threadIdx.x & 31, o = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (o >= OC) return;
    const float off = Q == GLM_Q_NF4 ? __ldg(offp) : 0.0f;
    for (int n = 0; n < N; n++) {
        float s = 0.0f;
        for (int j = lane; j < C; j += 32)
            s = fmaf(to_f(inp[(size_t)n * C + j]), deq_one(Q, q, scale, qa, absmax2, off, (size_t)o * C + j, C), s);
        s = warp_sum(s);
        if (lane == 0) out[(size_t)n * OC + o] = from_f<T>(s + (bias ? to_f(bias[o]) : 0.0f));
    }
}

/* ---------------------------------------------------------------- launchers */

struct QParts {
    const uint8_t *q, *qa;
    const uint16_t *scale;
    const float *absmax2, *offset;
};

static QParts parts_of(const void *qv, int qtype, int OC, int C, const char *op) {
    if (qtype != GLM_Q_INT8 && qtype != GLM_Q_INT4 && qtype != GLM_Q_NF4)
        glm_cuda_check_at(cudaErrorInvalidValue, op, __FILE__, __LINE__); /* not a quantized type */
    size_t n = (size_t)OC * (size_t)C;
    if ((qtype == GLM_Q_INT4 && C % 2) || (qtype == GLM_Q_NF4 && n % GLM_NF4_BLOCK))
        glm_cuda_check_at(cudaErrorInvalidValue, op, __FILE__, __LINE__); /* INT4: C even; NF4: OC*C % 64 == 0 */
    glm_qlayout L = glm_qlayout_of((glm_qtype)qtype, (size_t)OC, (size_t)C);
    const uint8_t *b = (const uint8_t *)qv;
    QParts p;
    p.q = b;
    p.scale = (const uint16_t *)(b + L.scale);
    p.qa = b + L.qa;
    p.absmax2 = (const float *)(b + L.absmax2);
    p.offset = (const float *)(b + L.offset);
    return p;
}

/* weights per 16-byte chunk, and the column multiple that keeps a chunk in one row (and one NF4 half block) */
static int chunk_weights(int qtype) { return qtype == GLM_Q_INT8 ? 16 : 32; }
static int vec_cols(int qtype) { return qtype == GLM_Q_INT8 ? 16 : qtype == GLM_Q_INT4 ? 32 : 64; }

template <int Q, typename T>
static void dequant_vec_launch(T *w, const QParts &p, size_t n, int C, cudaStream_t st) {
    const unsigned nchunks = (unsigned)(n / chunk_weights(Q)), cpr = (unsigned)(C / chunk_weights(Q));
    dequant_vec_kernel<Q, T><<<glmk_blocks(nchunks, 256, 132 * 8), 256, 0, st>>>(w, p.q, p.scale, p.qa, p.absmax2,
                                                                                p.offset, nchunks, cpr);
}
template <int Q, typename T>
static void dequant_v2_launch(T *w, const QParts &p, size_t n, int C, cudaStream_t st) {
    const unsigned nunits = (unsigned)(n / 8), upr = (unsigned)(C / 8);
    dequant_v2_kernel<Q, T><<<glmk_blocks((nunits + 3) / 4, 256, 132 * 8), 256, 0, st>>>(w, p.q, p.scale, p.qa,
                                                                                        p.absmax2, p.offset, nunits, upr);
}

extern "C" void glmk_dequantize_cfg(glm_dtype dt, void *w, const void *qv, int qtype, int OC, int C, int variant,
                                    cudaStream_t st) {
    if (OC <= 0 || C <= 0) return;
    const QParts p = parts_of(qv, qtype, OC, C, "dequantize: bad quantized type or shape");
    const size_t n = (size_t)OC * (size_t)C;
    /* NF4's chunks are half blocks of the flat matrix whatever C is; INT8/INT4 keep them in one row */
    const bool aligned = aligned16(w) && aligned16(qv) && n / 8 < 0x7fffffffu;
    const bool v1 = aligned && (qtype == GLM_Q_NF4 || C % vec_cols(qtype) == 0);
    const bool v2 = aligned && (qtype == GLM_Q_NF4 || C % 8 == 0);
    if (variant == 0) variant = 2; /* on an H200: 3.2-3.9 TB/s against 1.7-2.6 for variant 1 */
    GLMK_DISPATCH(dt, {
        if (variant == 2 && v2) {
            if (qtype == GLM_Q_INT8) dequant_v2_launch<GLM_Q_INT8, T>((T *)w, p, n, C, st);
            else if (qtype == GLM_Q_INT4) dequant_v2_launch<GLM_Q_INT4, T>((T *)w, p, n, C, st);
            else dequant_v2_launch<GLM_Q_NF4, T>((T *)w, p, n, C, st);
        } else if (variant != 3 && v1) {
            if (qtype == GLM_Q_INT8) dequant_vec_launch<GLM_Q_INT8, T>((T *)w, p, n, C, st);
            else if (qtype == GLM_Q_INT4) dequant_vec_launch<GLM_Q_INT4, T>((T *)w, p, n, C, st);
            else dequant_vec_launch<GLM_Q_NF4, T>((T *)w, p, n, C, st);
        } else {
            dequant_scalar_kernel<T><<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>((T *)w, p.q, qtype, p.scale, p.qa,
                                                                                   p.absmax2, p.offset, n, C);
        }
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_dequantize(glm_dtype dt, void *w, const void *qv, int qtype, int OC, int C, cudaStream_t st) {
    glmk_dequantize_cfg(dt, w, qv, qtype, OC, C, 0, st);
}

template <int Q, typename T, int NT, int RB, int KW>
static void qmm_launch(T *out, const T *inp, const QParts &p, const T *bias, int N, int C, int OC, cudaStream_t st) {
    constexpr int ROWS = RB * (QMM_WARPS / KW);
    const int ngroups = (N + NT - 1) / NT;
    const long blocks = (long)((OC + ROWS - 1) / ROWS) * ngroups;
    if (blocks > 0x7fffffffL) glm_cuda_check_at(cudaErrorInvalidValue, "qmatmul_fwd: grid too large", __FILE__, __LINE__);
    qmm_vec_kernel<Q, T, NT, RB, KW><<<(unsigned)blocks, QMM_THREADS, 0, st>>>(out, inp, p.q, p.scale, p.qa, p.absmax2,
                                                                               p.offset, bias, N, C, OC, ngroups);
}

/* input rows per block (NT) and output rows per warp group (RB) by N: registers ~ RB*NT
 * accumulators + NT*8 inputs + RB*8 packed words (with the prefetch) */
template <int Q, typename T, int KW>
static void qmm_dispatch_n(T *out, const T *inp, const QParts &p, const T *bias, int N, int C, int OC, int rb1,
                           cudaStream_t st) {
    if (N == 1 && rb1 == 4) qmm_launch<Q, T, 1, 4, KW>(out, inp, p, bias, N, C, OC, st);
    else if (N == 1) qmm_launch<Q, T, 1, 8, KW>(out, inp, p, bias, N, C, OC, st);
    else if (N == 2) qmm_launch<Q, T, 2, 8, KW>(out, inp, p, bias, N, C, OC, st);
    else if (N <= 4) qmm_launch<Q, T, 4, 4, KW>(out, inp, p, bias, N, C, OC, st);
    else qmm_launch<Q, T, 8, 4, KW>(out, inp, p, bias, N, C, OC, st);
}
template <int Q, typename T>
static void qmm_dispatch_kw(T *out, const T *inp, const QParts &p, const T *bias, int N, int C, int OC, int kw,
                            int rb1, cudaStream_t st) {
    if (kw == 1) qmm_dispatch_n<Q, T, 1>(out, inp, p, bias, N, C, OC, rb1, st);
    else qmm_dispatch_n<Q, T, 4>(out, inp, p, bias, N, C, OC, rb1, st);
}

/* (16-bit S only: the caller checks) mt: 16-row tiles per warp, 1 or 2 */
template <typename T>
static void qmm_mma_launch(T *out, const T *inp, const QParts &p, const T *bias, int N, int C, int OC, int mt,
                           cudaStream_t st) {
    if constexpr (sizeof(T) == 2) {
        const int ROWS = 16 * mt;
        const int nt = N <= 8 ? 1 : 2, ngroups = (N + 8 * nt - 1) / (8 * nt);
        const long blocks = (long)((OC + ROWS - 1) / ROWS) * ngroups;
        if (blocks > 0x7fffffffL)
            glm_cuda_check_at(cudaErrorInvalidValue, "qmatmul_fwd: grid too large", __FILE__, __LINE__);
        const unsigned nb = (unsigned)blocks, th = 32 * MMA_KS;
        if (nt == 1 && mt == 1) qmm_int4_mma_kernel<T, 1, 1><<<nb, th, 0, st>>>(out, inp, p.q, p.scale, bias, N, C, OC, ngroups);
        else if (nt == 1) qmm_int4_mma_kernel<T, 1, 2><<<nb, th, 0, st>>>(out, inp, p.q, p.scale, bias, N, C, OC, ngroups);
        else if (mt == 1) qmm_int4_mma_kernel<T, 2, 1><<<nb, th, 0, st>>>(out, inp, p.q, p.scale, bias, N, C, OC, ngroups);
        else qmm_int4_mma_kernel<T, 2, 2><<<nb, th, 0, st>>>(out, inp, p.q, p.scale, bias, N, C, OC, ngroups);
    }
}

extern "C" void glmk_qmatmul_fwd_cfg(glm_dtype dt, void *out, const void *inp, const void *qv, int qtype,
                                     const void *bias, int N, int C, int OC, int path, int kw, int rb1,
                                     cudaStream_t st) {
    if (N <= 0 || OC <= 0) return;
    const QParts p = parts_of(qv, qtype, OC, C, "qmatmul_fwd: bad quantized type or shape");
    const bool vec = C > 0 && aligned16(qv) && aligned16(inp) && C % vec_cols(qtype) == 0;
    const bool mma = vec && qtype == GLM_Q_INT4 && dt != GLM_F32 && C % 128 == 0;
    /* Defaults from timings on an H200 (test_cuda_ops GLM_QUANT_BENCH=1): INT4 on tensor cores,
     * 16-row tiles per warp while 32-row blocks would number under ~2 per SM (OC < 8192) and
     * N <= 8; the SIMT kernel's column split over 4 warps, or over 1 for NF4/INT4 from N = 4 */
    if (path == 0) {
        path = mma ? 2 : 1;
        if (path == 2 && rb1 == 0) rb1 = N <= 8 && OC < 8192 ? 1 : 2;
    }
    if (path == 1 && kw == 0) kw = qtype != GLM_Q_INT8 && N >= 4 ? 1 : 4;
    GLMK_DISPATCH(dt, {
        T *o = (T *)out;
        const T *x = (const T *)inp, *b = (const T *)bias;
        if (!vec)
            qmm_scalar_kernel<T><<<(unsigned)((OC + 3) / 4), 128, 0, st>>>(o, x, p.q, qtype, p.scale, p.qa, p.absmax2,
                                                                          p.offset, b, N, C, OC);
        else if (path == 2 && mma) qmm_mma_launch<T>(o, x, p, b, N, C, OC, rb1 == 1 ? 1 : 2, st);
        else if (qtype == GLM_Q_INT8) qmm_dispatch_kw<GLM_Q_INT8, T>(o, x, p, b, N, C, OC, kw, rb1, st);
        else if (qtype == GLM_Q_INT4) qmm_dispatch_kw<GLM_Q_INT4, T>(o, x, p, b, N, C, OC, kw, rb1, st);
        else qmm_dispatch_kw<GLM_Q_NF4, T>(o, x, p, b, N, C, OC, kw, rb1, st);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_qmatmul_fwd(glm_dtype dt, void *out, const void *inp, const void *qv, int qtype, const void *bias,
                                 int N, int C, int OC, cudaStream_t st) {
    glmk_qmatmul_fwd_cfg(dt, out, inp, qv, qtype, bias, N, C, OC, 0, 0, 0, st);
}
