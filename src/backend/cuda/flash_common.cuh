/* Pieces shared by the two tensor-core attention files (k_flash.cu: mma.sync for sm_80 and
 * newer; k_flash90.cu: wgmma for sm_90a): fp32 -> 16-bit packs, quad reductions, the key-range
 * summaries that let a block skip tiles no row of it sees, and the accumulator-layout steps both
 * forwards share (the online softmax, the rows written out). */
#ifndef GLM_FLASH_COMMON_CUH
#define GLM_FLASH_COMMON_CUH
#include "backend/cuda/cuda_common.cuh"

#define FA_LOG2E 1.4426950408889634f

/* ---------------------------------------------------------------- packs and reductions */

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* Key-range summary of a group of rows: min lo / max hi over non-empty rows (the union), and
 * max lo / min hi over all rows (a tile inside [maxlo, minhi) needs no per-element mask). */
struct Range { int lo, hi, maxlo, minhi; };
/* one row; rows past the end (valid = false) neither widen the union nor need a mask */
__device__ __forceinline__ Range row_range(bool valid, int lo, int hi) {
    if (!valid) return Range{0x7fffffff, -1, -0x7fffffff, 0x7fffffff};
    bool ne = lo < hi;
    return Range{ne ? lo : 0x7fffffff, ne ? hi : -1, lo, hi};
}
__device__ __forceinline__ Range range_merge(Range a, Range b) {
    return Range{min(a.lo, b.lo), max(a.hi, b.hi), max(a.maxlo, b.maxlo), min(a.minhi, b.minhi)};
}
__device__ __forceinline__ Range warp_range(Range r) {
    for (int o = 16; o > 0; o >>= 1) {
        Range x{__shfl_xor_sync(0xffffffffu, r.lo, o), __shfl_xor_sync(0xffffffffu, r.hi, o),
                __shfl_xor_sync(0xffffffffu, r.maxlo, o), __shfl_xor_sync(0xffffffffu, r.minhi, o)};
        r = range_merge(r, x);
    }
    return r;
}

/* One key tile of the forward's online softmax, for a thread's two rows (g and g + 8 of its
 * 16-row slice). s holds the tile's N scores in the accumulator layout shared by mma.m16n8k16
 * and wgmma (s[4j + e]: row g + 8(e/2), column 8j + 2t + e%2, key n0 + that column). Keys
 * outside a row's [lo, hi) are masked unless `full`; the scores become exp2-unit probabilities
 * against the new running maxima mx0/mx1, the running sums l0/l1 take them, and c0/c1 return
 * the factors the output accumulators of the two rows are rescaled by. */
template <int N>
__device__ __forceinline__ void softmax_tile(float *s, int n0, int t4, bool full, int lo0, int hi0, int lo1, int hi1,
                                             float scale_log2, float &mx0, float &mx1, float &l0, float &l1, float &c0,
                                             float &c1) {
    float tm0 = -INFINITY, tm1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; i++) {
        int e = i & 3, key = n0 + (i >> 2) * 8 + 2 * t4 + (e & 1);
        float x = s[i] * scale_log2;
        if (!full) {
            bool ok = e < 2 ? (key >= lo0 && key < hi0) : (key >= lo1 && key < hi1);
            if (!ok) x = -INFINITY;
        }
        s[i] = x;
        if (e < 2) tm0 = fmaxf(tm0, x); else tm1 = fmaxf(tm1, x);
    }
    float nm0 = fmaxf(mx0, quad_max(tm0)), nm1 = fmaxf(mx1, quad_max(tm1));
    float mu0 = nm0 == -INFINITY ? 0.0f : nm0, mu1 = nm1 == -INFINITY ? 0.0f : nm1;
    c0 = exp2f(mx0 - mu0);
    c1 = exp2f(mx1 - mu1);
    mx0 = nm0;
    mx1 = nm1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        s[4 * j] = exp2f(s[4 * j] - mu0); s[4 * j + 1] = exp2f(s[4 * j + 1] - mu0);
        s[4 * j + 2] = exp2f(s[4 * j + 2] - mu1); s[4 * j + 3] = exp2f(s[4 * j + 3] - mu1);
        ps0 += s[4 * j] + s[4 * j + 1];
        ps1 += s[4 * j + 2] + s[4 * j + 3];
    }
    l0 = l0 * c0 + ps0;
    l1 = l1 * c1 + ps1;
}


/* Row g + 8 half of a thread's accumulator (the layout of softmax_tile, HD columns) times mul,
 * as 16-bit pairs into dst[0..HD): the thread's columns 8j + 2t, 8j + 2t + 1. */
template <typename T, int HD>
__device__ __forceinline__ void store_acc_row(T *dst, const float *acc, int half, int t4, float mul) {
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        *reinterpret_cast<uint32_t *>(dst + j * 8 + 2 * t4) =
            pack2<T>(acc[4 * j + 2 * half] * mul, acc[4 * j + 2 * half + 1] * mul);
}
/* The forward's end for one row (half as above; rows past Tq write nothing): out = o / l and
 * the natural-log lse (-inf for a row that saw no key). l is the row's quad-summed total. */
template <typename T, int HD>
__device__ __forceinline__ void store_fwd_row(T *out, float *lse, const float *o, int half, int t4, int b, int h,
                                              int row, int Tq, int NH, float mx, float l) {
    if (row >= Tq) return;
    store_acc_row<T, HD>(out + ((size_t)b * Tq + row) * NH * HD + (size_t)h * HD, o, half, t4, l > 0 ? 1.0f / l : 0.0f);
    if (t4 == 0) lse[((size_t)b * NH + h) * Tq + row] = l > 0 ? mx * 0.6931471805599453f + logf(l) : -INFINITY;
}
/* Row t of head h of batch b in a writable view. */
template <typename T> __device__ __forceinline__ T *view_row(const glm_qkv_view &v, int b, int t, int h) {
    return (T *)v.base + b * v.batch_stride + (long)t * v.tok_stride + h * v.head_stride;
}

#endif
