/* Flash attention on tensor cores (mma.sync m16n8k16, bf16/fp16 in, fp32 accumulate) for head
 * size 64 or 128, with per-query key ranges [lo, hi). Same contract as the SIMT kernels of
 * k_attention.cu (which the tests compare against, besides the CPU twin).
 *
 *  forward  : a block = 64 queries (4 warps x 16 rows); loops over 64-key tiles of K and V in
 *             shared memory (cp.async, K of the next tile loads while P.V runs); online
 *             softmax in exp2 units; writes out and the natural-log lse.
 *  backward : two kernels, no atomics: dq (a block = 64 queries, loop over key tiles) and
 *             dk/dv (a block = 64 keys, 4 warps x 16 keys, loop over 32-query tiles).
 *             Probabilities are recomputed from lse; D = rowsum(dout * out) comes precomputed.
 *  buffers  : the tiles that stream through a loop are double-buffered (NB 2) where the device
 *             gives a block enough shared memory, else single-buffered (NB 1: Turing's 64 KiB,
 *             where the dq kernel also takes 32 queries a block); the launchers pick.
 *
 * Shared-memory tiles are [rows][HD] with 16-byte chunks XOR-swizzled by (row & 7), so the
 * ldmatrix reads of 8 rows at one logical chunk hit 8 different bank groups.
 * Fragment layouts (PTX ISA, mma.m16n8k16): g = lane/4, t = lane%4;
 *   A (16x16, row): a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
 *   B (16x8, col):  b0 (k=2t..2t+1, n=g) b1 (k=2t+8.., n=g)
 *   C (16x8):       c0,c1 (g, 2t..2t+1) c2,c3 (g+8, 2t..2t+1) */
#include "backend/cuda/flash_common.cuh"

/* ---------------------------------------------------------------- PTX wrappers */

__device__ __forceinline__ void ldsm_x4(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
/* 16-byte async copy global -> shared; bytes = 0 writes zeros (rows past the end). Turing has
 * no cp.async: a load and a store, done when the thread goes on (its kernels single-buffer). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int bytes) {
#ifdef GLMK_SM80
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
    uint4 x = bytes ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0, 0, 0, 0);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w) : "memory");
#endif
}
#ifdef GLMK_SM80
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#else
__device__ __forceinline__ void cp_commit() {}
template <int N> __device__ __forceinline__ void cp_wait() {}
#endif

template <typename T>
__device__ __forceinline__ const T *head_base(const glm_qkv_view &v, int b, int h) {
    return (const T *)v.base + b * v.batch_stride + vhead(v, h) * v.head_stride;
}

/* ---------------------------------------------------------------- tiles */

/* byte offset of (row, 16-byte chunk) inside a swizzled [rows][HD] tile of 2-byte elements */
template <int HD> __device__ __forceinline__ uint32_t swz(int row, int chunk) {
    return (uint32_t)((row * HD + ((chunk ^ (row & 7)) << 3)) * 2);
}

/* Async load of rows t0..t0+ROWS-1 (zero-filled at or past `end`) of one head from a view. */
template <typename T, int HD, int ROWS, int NT>
__device__ __forceinline__ void load_tile(uint32_t s, const T *g, long ts, int t0, int end) {
    constexpr int CPR = HD / 8;
    for (int e = threadIdx.x; e < ROWS * CPR; e += NT) {
        int r = e / CPR, c = e % CPR, t = t0 + r;
        bool in = t < end;
        cp_async16(s + swz<HD>(r, c), g + (long)(in ? t : t0) * ts + c * 8, in ? 16 : 0);
    }
}

/* ldmatrix addresses. A operand (16 rows x 16 k) at rows row0.., k-chunk pair kk:
 * lanes 0-15 give rows 0-15 at chunk 2kk, lanes 16-31 rows 0-15 at chunk 2kk+1. */
template <int HD> __device__ __forceinline__ uint32_t addr_a(uint32_t s, int row0, int kk, int lane) {
    return s + swz<HD>(row0 + (lane & 15), 2 * kk + (lane >> 4));
}
/* B operand from a [n][k] tile (non-transposed): two n-tiles (rows n0..n0+15) x one k-step.
 * Registers: r0,r1 = (b0,b1) of n-tile n0/8, r2,r3 = (b0,b1) of n-tile n0/8+1. */
template <int HD> __device__ __forceinline__ uint32_t addr_bn(uint32_t s, int n0, int kk, int lane) {
    return s + swz<HD>(n0 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1));
}
/* B operand from a [k][n] tile (transposed load): one k-step (rows k0..k0+15) x two n-tiles
 * (chunks 2np, 2np+1). Registers: r0,r1 = (b0,b1) of n-tile 2np, r2,r3 of n-tile 2np+1. */
template <int HD> __device__ __forceinline__ uint32_t addr_bt(uint32_t s, int k0, int np, int lane) {
    return s + swz<HD>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * np + (lane >> 4));
}

/* ---------------------------------------------------------------- forward */

template <typename T, int HD, int NB>
__global__ void __launch_bounds__(128) flash_fwd_kernel(T *out, float *lse, glm_qkv_view q, glm_qkv_view k,
                                                        glm_qkv_view v, const int32_t *lo, const int32_t *hi, int Tq,
                                                        int Tk, int NH, float scale_log2) {
    constexpr int KS = HD / 16, ND = HD / 8, KV_BYTES = 2 * 64 * HD * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* [Q][K0 V0][K1 V1] (NB = 2), [Q][K V] (NB = 1) */
    uint32_t sQ = (uint32_t)__cvta_generic_to_shared(smem_raw), sK = sQ + 64 * HD * 2, sV = sK + 64 * HD * 2;
    __shared__ Range wr[4];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * 64;
    int r0 = m0 + w * 16 + g, r1 = r0 + 8;
    int lo0 = r0 < Tq ? lo[b * Tq + r0] : 0, hi0 = r0 < Tq ? hi[b * Tq + r0] : 0;
    int lo1 = r1 < Tq ? lo[b * Tq + r1] : 0, hi1 = r1 < Tq ? hi[b * Tq + r1] : 0;
    Range R = range_merge(row_range(r0 < Tq, lo0, hi0), row_range(r1 < Tq, lo1, hi1));
    R = warp_range(R);
    if (lane == 0) wr[w] = R;
    const T *qb = head_base<T>(q, b, h), *kb = head_base<T>(k, b, h), *vb = head_base<T>(v, b, h);
    load_tile<T, HD, 64, 128>(sQ, qb, q.tok_stride, m0, Tq);
    cp_commit();
    __syncthreads();
    int klo = min(min(wr[0].lo, wr[1].lo), min(wr[2].lo, wr[3].lo));
    int khi = max(max(wr[0].hi, wr[1].hi), max(wr[2].hi, wr[3].hi));
    if (klo < khi) {
        load_tile<T, HD, 64, 128>(sK, kb, k.tok_stride, klo, khi);
        load_tile<T, HD, 64, 128>(sV, vb, v.tok_stride, klo, khi);
    }
    cp_commit();
    cp_wait<1>(); /* Q has landed */
    __syncthreads();
    uint32_t qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm_x4(qf[kk], addr_a<HD>(sQ, w * 16, kk, lane));

    float o[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    /* K/V tiles double-buffered (NB 2): the next pair loads while this one is used; in one
     * buffer (NB 1, where two do not fit a block's shared memory: Turing) after the last is done */
    for (int n0 = klo, buf = 0; n0 < khi; n0 += 64, buf ^= NB - 1) {
        uint32_t cK = sK + buf * KV_BYTES, cV = sV + buf * KV_BYTES;
        if (NB == 2 && n0 + 64 < khi) {
            load_tile<T, HD, 64, 128>(sK + (buf ^ 1) * KV_BYTES, kb, k.tok_stride, n0 + 64, khi);
            load_tile<T, HD, 64, 128>(sV + (buf ^ 1) * KV_BYTES, vb, v.tok_stride, n0 + 64, khi);
        } else if (NB == 1 && n0 > klo) {
            load_tile<T, HD, 64, 128>(cK, kb, k.tok_stride, n0, khi);
            load_tile<T, HD, 64, 128>(cV, vb, v.tok_stride, n0, khi);
        }
        cp_commit();
        cp_wait<NB - 1>(); /* tile n0 has landed */
        __syncthreads();
        if (n0 < R.hi && n0 + 64 > R.lo) { /* this warp sees some key of the tile */
            float s[8][4];
#pragma unroll
            for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t r[4];
                    ldsm_x4(r, addr_bn<HD>(cK, np * 16, kk, lane));
                    mma16816<T>(s[2 * np], qf[kk], r[0], r[1]);
                    mma16816<T>(s[2 * np + 1], qf[kk], r[2], r[3]);
                }
            bool full = n0 >= R.maxlo && n0 + 64 <= R.minhi;
            float c0, c1;
            softmax_tile<32>(&s[0][0], n0, t4, full, lo0, hi0, lo1, hi1, scale_log2, mx0, mx1, l0, l1, c0, c1);
#pragma unroll
            for (int i = 0; i < ND; i++) { o[i][0] *= c0; o[i][1] *= c0; o[i][2] *= c1; o[i][3] *= c1; }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                uint32_t a[4] = {pack2<T>(s[2 * c][0], s[2 * c][1]), pack2<T>(s[2 * c][2], s[2 * c][3]),
                                 pack2<T>(s[2 * c + 1][0], s[2 * c + 1][1]), pack2<T>(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
                for (int np = 0; np < ND / 2; np++) {
                    uint32_t r[4];
                    ldsm_x4_t(r, addr_bt<HD>(cV, c * 16, np, lane));
                    mma16816<T>(o[2 * np], a, r[0], r[1]);
                    mma16816<T>(o[2 * np + 1], a, r[2], r[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
    }
    cp_wait<0>();
    store_fwd_row<T, HD>(out, lse, &o[0][0], 0, t4, b, h, r0, Tq, NH, mx0, quad_sum(l0));
    store_fwd_row<T, HD>(out, lse, &o[0][0], 1, t4, b, h, r1, Tq, NH, mx1, quad_sum(l1));
}

/* ---------------------------------------------------------------- backward: dq */

/* NW warps of 16 query rows each: 4, or 2 where a block's shared memory is small (Turing) */
template <typename T, int HD, int NB, int NW>
__global__ void __launch_bounds__(32 * NW) flash_dq_kernel(glm_qkv_view dq, const T *dout, const float *lse, const float *D,
                                                       glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                                                       const int32_t *lo, const int32_t *hi, int Tq, int Tk, int NH,
                                                       float scale, float scale_log2) {
    constexpr int KS = HD / 16, ND = HD / 8, KV_BYTES = 2 * 64 * HD * 2, QR = 16 * NW, NT = 32 * NW;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* [Q][dout][K0 V0][K1 V1] (NB = 2), [Q][dout][K V] (NB = 1) */
    uint32_t sQ = (uint32_t)__cvta_generic_to_shared(smem_raw), sO = sQ + QR * HD * 2, sK = sO + QR * HD * 2,
             sV = sK + 64 * HD * 2;
    __shared__ Range wr[NW];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * QR;
    int r0 = m0 + w * 16 + g, r1 = r0 + 8;
    int lo0 = r0 < Tq ? lo[b * Tq + r0] : 0, hi0 = r0 < Tq ? hi[b * Tq + r0] : 0;
    int lo1 = r1 < Tq ? lo[b * Tq + r1] : 0, hi1 = r1 < Tq ? hi[b * Tq + r1] : 0;
    size_t srow = ((size_t)b * NH + h) * Tq;
    float L0 = r0 < Tq ? lse[srow + r0] * FA_LOG2E : 0.0f, L1 = r1 < Tq ? lse[srow + r1] * FA_LOG2E : 0.0f;
    float D0 = r0 < Tq ? D[srow + r0] : 0.0f, D1 = r1 < Tq ? D[srow + r1] : 0.0f;
    Range R = warp_range(range_merge(row_range(r0 < Tq, lo0, hi0), row_range(r1 < Tq, lo1, hi1)));
    if (lane == 0) wr[w] = R;
    const T *qb = head_base<T>(q, b, h), *kb = head_base<T>(k, b, h), *vb = head_base<T>(v, b, h);
    const T *ob = dout + (size_t)b * Tq * NH * HD + (size_t)h * HD;
    load_tile<T, HD, QR, NT>(sQ, qb, q.tok_stride, m0, Tq);
    load_tile<T, HD, QR, NT>(sO, ob, (long)NH * HD, m0, Tq);
    cp_commit();
    __syncthreads();
    int klo, khi;
    if constexpr (NW == 4) {
        klo = min(min(wr[0].lo, wr[1].lo), min(wr[2].lo, wr[3].lo));
        khi = max(max(wr[0].hi, wr[1].hi), max(wr[2].hi, wr[3].hi));
    } else {
        klo = min(wr[0].lo, wr[1].lo);
        khi = max(wr[0].hi, wr[1].hi);
    }
    float acc[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    if (klo < khi) {
        load_tile<T, HD, 64, NT>(sK, kb, k.tok_stride, klo, khi);
        load_tile<T, HD, 64, NT>(sV, vb, v.tok_stride, klo, khi);
    }
    cp_commit();
    /* K/V tiles in two buffers or one, as the forward's */
    for (int n0 = klo, buf = 0; n0 < khi; n0 += 64, buf ^= NB - 1) {
        uint32_t cK = sK + buf * KV_BYTES, cV = sV + buf * KV_BYTES;
        if (NB == 2 && n0 + 64 < khi) {
            load_tile<T, HD, 64, NT>(sK + (buf ^ 1) * KV_BYTES, kb, k.tok_stride, n0 + 64, khi);
            load_tile<T, HD, 64, NT>(sV + (buf ^ 1) * KV_BYTES, vb, v.tok_stride, n0 + 64, khi);
        } else if (NB == 1 && n0 > klo) {
            load_tile<T, HD, 64, NT>(cK, kb, k.tok_stride, n0, khi);
            load_tile<T, HD, 64, NT>(cV, vb, v.tok_stride, n0, khi);
        }
        cp_commit();
        cp_wait<NB - 1>(); /* Q, dout and tile n0 have landed */
        __syncthreads();
        if (n0 < R.hi && n0 + 64 > R.lo) {
            float s[8][4], dp[8][4];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t aq[4], ao[4];
                ldsm_x4(aq, addr_a<HD>(sQ, w * 16, kk, lane));
                ldsm_x4(ao, addr_a<HD>(sO, w * 16, kk, lane));
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t r[4];
                    ldsm_x4(r, addr_bn<HD>(cK, np * 16, kk, lane));
                    mma16816<T>(s[2 * np], aq, r[0], r[1]);
                    mma16816<T>(s[2 * np + 1], aq, r[2], r[3]);
                    ldsm_x4(r, addr_bn<HD>(cV, np * 16, kk, lane));
                    mma16816<T>(dp[2 * np], ao, r[0], r[1]);
                    mma16816<T>(dp[2 * np + 1], ao, r[2], r[3]);
                }
            }
            bool full = n0 >= R.maxlo && n0 + 64 <= R.minhi;
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = n0 + nt * 8 + 2 * t4 + (e & 1);
                    bool ok = full || (e < 2 ? (key >= lo0 && key < hi0) : (key >= lo1 && key < hi1));
                    float p = ok ? exp2f(s[nt][e] * scale_log2 - (e < 2 ? L0 : L1)) : 0.0f;
                    s[nt][e] = p * (dp[nt][e] - (e < 2 ? D0 : D1)) * scale; /* ds */
                }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                uint32_t a[4] = {pack2<T>(s[2 * c][0], s[2 * c][1]), pack2<T>(s[2 * c][2], s[2 * c][3]),
                                 pack2<T>(s[2 * c + 1][0], s[2 * c + 1][1]), pack2<T>(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
                for (int np = 0; np < ND / 2; np++) {
                    uint32_t r[4];
                    ldsm_x4_t(r, addr_bt<HD>(cK, c * 16, np, lane));
                    mma16816<T>(acc[2 * np], a, r[0], r[1]);
                    mma16816<T>(acc[2 * np + 1], a, r[2], r[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
    }
    cp_wait<0>();
    if (r0 < Tq) store_acc_row<T, HD>(view_row<T>(dq, b, r0, h), &acc[0][0], 0, t4, 1.0f);
    if (r1 < Tq) store_acc_row<T, HD>(view_row<T>(dq, b, r1, h), &acc[0][0], 1, t4, 1.0f);
}

/* ---------------------------------------------------------------- backward: dk, dv */

#define FA_QT 32        /* queries per step of the dk/dv loop */
#define FA_MAXTILES 256 /* query tiles summarised in shared memory (Tq <= 8192); beyond: no skipping */

template <typename T, int HD, int NB>
__global__ void __launch_bounds__(128) flash_dkdv_kernel(glm_qkv_view dk, glm_qkv_view dv, const T *dout,
                                                         const float *lse, const float *D, glm_qkv_view q,
                                                         glm_qkv_view k, glm_qkv_view v, const int32_t *lo,
                                                         const int32_t *hi, int Tq, int Tk, int NH, float scale,
                                                         float scale_log2) {
    constexpr int KS = HD / 16, ND = HD / 8, QO_BYTES = 2 * FA_QT * HD * 2;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    /* [K][V][Q0 dout0][Q1 dout1]: query-side tiles double-buffered (NB 2), or one [Q dout] (NB 1) */
    uint32_t sK = (uint32_t)__cvta_generic_to_shared(smem_raw), sV = sK + 64 * HD * 2, sQ = sV + 64 * HD * 2,
             sO = sQ + FA_QT * HD * 2;
    __shared__ float Ls[2][FA_QT], Ds[2][FA_QT];
    __shared__ int los[2][FA_QT], his[2][FA_QT];
    __shared__ Range tiles[FA_MAXTILES];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * 64, kw0 = j0 + w * 16;
    int kr0 = kw0 + g, kr1 = kr0 + 8;
    const T *qb = head_base<T>(q, b, h), *kb = head_base<T>(k, b, h), *vb = head_base<T>(v, b, h);
    const T *ob = dout + (size_t)b * Tq * NH * HD + (size_t)h * HD;
    load_tile<T, HD, 64, 128>(sK, kb, k.tok_stride, j0, Tk);
    load_tile<T, HD, 64, 128>(sV, vb, v.tok_stride, j0, Tk);
    cp_commit();
    int ntiles = (Tq + FA_QT - 1) / FA_QT;
    bool summarised = ntiles <= FA_MAXTILES;
    if (summarised)
        for (int tt = threadIdx.x; tt < ntiles; tt += blockDim.x) {
            Range r = row_range(false, 0, 0);
            for (int i = tt * FA_QT; i < min(Tq, tt * FA_QT + FA_QT); i++)
                r = range_merge(r, row_range(true, lo[b * Tq + i], hi[b * Tq + i]));
            if (tt * FA_QT + FA_QT > Tq) r.minhi = -1; /* zero-filled rows past the end: always mask */
            tiles[tt] = r;
        }
    float adk[ND][4], adv[ND][4];
#pragma unroll
    for (int i = 0; i < ND; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) adk[i][e] = adv[i][e] = 0.0f;
    size_t srow = ((size_t)b * NH + h) * Tq;
    __syncthreads();
    /* query tile tt overlaps this block's keys [j0, j0 + 64) (block-uniform: tiles[] is shared) */
#define FA_OVERLAP(tt) (!summarised || (tiles[tt].lo < j0 + 64 && tiles[tt].hi > j0))
    /* cp.async of query tile tt's q and dout, plain loads of its lse, D and ranges, into buffer bf */
#define FA_LOAD_Q(tt, bf)                                                                              \
    do {                                                                                               \
        int i0_ = (tt) * FA_QT;                                                                        \
        load_tile<T, HD, FA_QT, 128>(sQ + (bf) * QO_BYTES, qb, q.tok_stride, i0_, Tq);                 \
        load_tile<T, HD, FA_QT, 128>(sO + (bf) * QO_BYTES, ob, (long)NH * HD, i0_, Tq);                \
        if (threadIdx.x < FA_QT) {                                                                     \
            int i_ = i0_ + threadIdx.x;                                                                \
            bool in_ = i_ < Tq;                                                                        \
            Ls[bf][threadIdx.x] = in_ ? lse[srow + i_] * FA_LOG2E : 0.0f;                              \
            Ds[bf][threadIdx.x] = in_ ? D[srow + i_] : 0.0f;                                           \
            los[bf][threadIdx.x] = in_ ? lo[b * Tq + i_] : 0;                                          \
            his[bf][threadIdx.x] = in_ ? hi[b * Tq + i_] : 0;                                          \
        }                                                                                              \
    } while (0)
    int cur = 0;
    while (cur < ntiles && !FA_OVERLAP(cur)) cur++;
    if (cur < ntiles) FA_LOAD_Q(cur, 0);
    cp_commit();
    for (int buf = 0; cur < ntiles; buf ^= NB - 1) {
        int nxt = cur + 1;
        while (nxt < ntiles && !FA_OVERLAP(nxt)) nxt++;
        if (NB == 2 && nxt < ntiles) FA_LOAD_Q(nxt, buf ^ 1); /* buffer buf^1 was released by the last barrier */
        cp_commit();
        cp_wait<NB - 1>(); /* K, V and query tile cur have landed */
        __syncthreads();
        Range info = summarised ? tiles[cur] : Range{0, 0x7fffffff, 0x7fffffff, -1};
        uint32_t cQ = sQ + buf * QO_BYTES, cO = sO + buf * QO_BYTES;
        const float *cL = Ls[buf], *cD = Ds[buf];
        const int *clo = los[buf], *chi = his[buf];
        if (info.lo < kw0 + 16 && info.hi > kw0) {
            float s[4][4], dp[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t ak[4], av[4];
                ldsm_x4(ak, addr_a<HD>(sK, w * 16, kk, lane));
                ldsm_x4(av, addr_a<HD>(sV, w * 16, kk, lane));
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t r[4];
                    ldsm_x4(r, addr_bn<HD>(cQ, np * 16, kk, lane));
                    mma16816<T>(s[2 * np], ak, r[0], r[1]);
                    mma16816<T>(s[2 * np + 1], ak, r[2], r[3]);
                    ldsm_x4(r, addr_bn<HD>(cO, np * 16, kk, lane));
                    mma16816<T>(dp[2 * np], av, r[0], r[1]);
                    mma16816<T>(dp[2 * np + 1], av, r[2], r[3]);
                }
            }
            bool full = kw0 >= info.maxlo && kw0 + 16 <= info.minhi;
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qi = nt * 8 + 2 * t4 + (e & 1), key = e < 2 ? kr0 : kr1;
                    bool ok = full || (key >= clo[qi] && key < chi[qi]);
                    float p = ok ? exp2f(s[nt][e] * scale_log2 - cL[qi]) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = p * (dp[nt][e] - cD[qi]) * scale; /* ds */
                }
#pragma unroll
            for (int c = 0; c < 2; c++) {
                uint32_t ap[4] = {pack2<T>(s[2 * c][0], s[2 * c][1]), pack2<T>(s[2 * c][2], s[2 * c][3]),
                                  pack2<T>(s[2 * c + 1][0], s[2 * c + 1][1]), pack2<T>(s[2 * c + 1][2], s[2 * c + 1][3])};
                uint32_t ad[4] = {pack2<T>(dp[2 * c][0], dp[2 * c][1]), pack2<T>(dp[2 * c][2], dp[2 * c][3]),
                                  pack2<T>(dp[2 * c + 1][0], dp[2 * c + 1][1]), pack2<T>(dp[2 * c + 1][2], dp[2 * c + 1][3])};
#pragma unroll
                for (int np = 0; np < ND / 2; np++) {
                    uint32_t r[4];
                    ldsm_x4_t(r, addr_bt<HD>(cO, c * 16, np, lane));
                    mma16816<T>(adv[2 * np], ap, r[0], r[1]);
                    mma16816<T>(adv[2 * np + 1], ap, r[2], r[3]);
                    ldsm_x4_t(r, addr_bt<HD>(cQ, c * 16, np, lane));
                    mma16816<T>(adk[2 * np], ad, r[0], r[1]);
                    mma16816<T>(adk[2 * np + 1], ad, r[2], r[3]);
                }
            }
        }
        __syncthreads(); /* buffer buf (tiles and row data) is refilled next step */
        if (NB == 1 && nxt < ntiles) FA_LOAD_Q(nxt, 0); /* one buffer: refilled once it is free */
        cur = nxt;
    }
#undef FA_OVERLAP
#undef FA_LOAD_Q
    cp_wait<0>();
    if (kr0 < Tk) {
        store_acc_row<T, HD>(view_row<T>(dk, b, kr0, h), &adk[0][0], 0, t4, 1.0f);
        store_acc_row<T, HD>(view_row<T>(dv, b, kr0, h), &adv[0][0], 0, t4, 1.0f);
    }
    if (kr1 < Tk) {
        store_acc_row<T, HD>(view_row<T>(dk, b, kr1, h), &adk[0][0], 1, t4, 1.0f);
        store_acc_row<T, HD>(view_row<T>(dv, b, kr1, h), &adv[0][0], 1, t4, 1.0f);
    }
}

/* ---------------------------------------------------------------- launchers */

static bool view_ok(const glm_qkv_view &v) {
    return aligned16(v.base) && v.batch_stride % 8 == 0 && v.tok_stride % 8 == 0 && v.head_stride % 8 == 0;
}

extern "C" int glmk_flash_supported(glm_dtype dt, int HD, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                                    const void *o1, const void *o2) {
    return dt != GLM_F32 && (HD == 64 || HD == 128) && view_ok(q) && view_ok(k) && view_ok(v) &&
           (!o1 || aligned16(o1)) && (!o2 || aligned16(o2));
}

/* Readies kernel fn for `dyn` bytes of dynamic shared memory when those and its static ones fit
 * in smem_max, what a block may take on the device (64 KiB on Turing, 99 KiB on sm_86/89, 163 or
 * 227 KiB on A100 or H100); false, nothing done, when they do not. Each kernel runs
 * double-buffered where that fits, else single-buffered, else not at all. One attribute query a
 * launch; the dynamic limit is raised at the first launch only. */
template <typename K> static bool ready(K *fn, size_t dyn, int smem_max) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, (const void *)fn) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (fa.sharedSizeBytes + dyn > (size_t)smem_max) return false;
    if ((size_t)fa.maxDynamicSharedSizeBytes < dyn)
        GLMK_CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
    return true;
}

template <typename T, int HD>
static int fwd_t(void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *lo,
                 const int32_t *hi, int B, int Tq, int Tk, int NH, float scale, int smem_max, cudaStream_t st) {
    size_t s2 = 5 * 64 * HD * 2, s1 = 3 * 64 * HD * 2; /* Q and two or one K/V pairs */
    dim3 grid((Tq + 63) / 64, NH, B);
    if (ready(flash_fwd_kernel<T, HD, 2>, s2, smem_max)) {
        flash_fwd_kernel<T, HD, 2><<<grid, 128, s2, st>>>((T *)out, lse, q, k, v, lo, hi, Tq, Tk, NH, scale * FA_LOG2E);
    } else if (ready(flash_fwd_kernel<T, HD, 1>, s1, smem_max)) {
        flash_fwd_kernel<T, HD, 1><<<grid, 128, s1, st>>>((T *)out, lse, q, k, v, lo, hi, Tq, Tk, NH, scale * FA_LOG2E);
    } else
        return 0;
    GLMK_CHECK_LAUNCH();
    return 1;
}

template <typename T, int HD>
static int bwd_t(glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout, const float *lse, const float *D,
                 glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B, int Tq,
                 int Tk, int NH, float scale, int smem_max, cudaStream_t st) {
    int done = 0;
    size_t q2 = 6 * 64 * HD * 2, q1 = (2 * 32 + 2 * 64) * HD * 2;                 /* Q, dout, K/V pairs */
    size_t kv2 = (2 * 64 + 4 * FA_QT) * HD * 2, kv1 = (2 * 64 + 2 * FA_QT) * HD * 2; /* K, V, Q/dout pairs */
    dim3 gq((Tq + 63) / 64, NH, B), gk((Tk + 63) / 64, NH, B);
    const T *o = (const T *)dout;
    if (ready(flash_dq_kernel<T, HD, 2, 4>, q2, smem_max)) {
        if (Tq > 0) flash_dq_kernel<T, HD, 2, 4><<<gq, 128, q2, st>>>(dq, o, lse, D, q, k, v, lo, hi, Tq, Tk, NH, scale, scale * FA_LOG2E);
        done |= GLMK_ATTN_DQ;
    } else if (ready(flash_dq_kernel<T, HD, 1, 2>, q1, smem_max)) { /* 32 query rows a block */
        if (Tq > 0)
            flash_dq_kernel<T, HD, 1, 2><<<dim3((Tq + 31) / 32, NH, B), 64, q1, st>>>(dq, o, lse, D, q, k, v, lo, hi, Tq, Tk, NH,
                                                                                     scale, scale * FA_LOG2E);
        done |= GLMK_ATTN_DQ;
    }
    if (ready(flash_dkdv_kernel<T, HD, 2>, kv2, smem_max)) {
        if (Tk > 0) flash_dkdv_kernel<T, HD, 2><<<gk, 128, kv2, st>>>(dk, dv, o, lse, D, q, k, v, lo, hi, Tq, Tk, NH, scale, scale * FA_LOG2E);
        done |= GLMK_ATTN_DKV;
    } else if (ready(flash_dkdv_kernel<T, HD, 1>, kv1, smem_max)) {
        if (Tk > 0) flash_dkdv_kernel<T, HD, 1><<<gk, 128, kv1, st>>>(dk, dv, o, lse, D, q, k, v, lo, hi, Tq, Tk, NH, scale, scale * FA_LOG2E);
        done |= GLMK_ATTN_DKV;
    }
    GLMK_CHECK_LAUNCH();
    return done;
}

#define FA_DISPATCH(dt, HD, FN, ...)                                                   \
    ((dt) == GLM_BF16 ? ((HD) == 128 ? FN<bf16, 128>(__VA_ARGS__) : FN<bf16, 64>(__VA_ARGS__))       \
                      : ((HD) == 128 ? FN<f16, 128>(__VA_ARGS__) : FN<f16, 64>(__VA_ARGS__)))

extern "C" int glmk_flash_fwd(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                              const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                              int smem_max, cudaStream_t st) {
    if (B <= 0 || Tq <= 0) return 1;
    return FA_DISPATCH(dt, HD, fwd_t, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, scale, smem_max, st);
}

extern "C" int glmk_flash_bwd(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout,
                               const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                               const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                               int smem_max, cudaStream_t st) {
    if (B <= 0) return GLMK_ATTN_DQ | GLMK_ATTN_DKV;
    return FA_DISPATCH(dt, HD, bwd_t, dq, dk, dv, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, scale, smem_max, st);
}
