/* LoRA's down-projection with its input dropout in one pass (backend.h lora_down,
 * lora_down_bwd): peft's lora_A(dropout(x)) without the dropped-out copy of x written and read
 * back, in forward and in backward. The rank is small (<= 16), so these are reads of x (and of
 * dx): for 16-bit storage the products run on tensor cores (mma.sync), which leaves the passes
 * bound by memory and the mask's hash; fp32 storage takes CUDA-core kernels. The mask is
 * mask_scale's (backend/mask_hash.h: element i = n * C + c of x, the same seed; one hash per four
 * elements, as C is a multiple of the pack and so of 4). The CUDA-core kernels round each kept,
 * scaled value to S as mask_scale stores it; the tensor-core ones scale the sums instead (see
 * below): either way the results are those of mask_scale + the GEMMs up to rounding. The file
 * also holds the products whose inner size is at most 16 (LoRA's B side, K the rank):
 * glmk_small_k_fwd and glmk_small_k_bwd, on the same tensor-core operand helpers. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/mask_hash.h"

#define LORA_MAX_RANK 16
#define LORA_BATCH 4 /* rows a backward thread loads at once (8: more registers, fewer warps, slower) */

/* Bit e set: element off + e of the P from off (a multiple of 4) is kept. */
template <int P>
__device__ __forceinline__ uint32_t keep_bits(uint64_t seed, size_t off, uint32_t th, bool drop) {
    if (!drop) return ~0u;
    uint32_t k = 0;
#pragma unroll
    for (int q = 0; q < P / 4; q++) k |= glm_mask_keep4(seed, (off >> 2) + q, th) << (4 * q);
    return k;
}
/* x as the adapter sees it: dropped (0) or kept and scaled by 1/(1-p), rounded to S */
template <typename T>
__device__ __forceinline__ float dropped(T x, bool kept, float ks) { return kept ? to_f(from_f<T>(to_f(x) * ks)) : 0.0f; }

/* t[N, r] = scale * (dropout(x) a^T), a[r, C]. A block of 8 warps takes 16 rows (2 per warp);
 * a's columns pass through shared memory in chunks, rows of a beyond r read as zeros. A lane
 * loads all its packs of a chunk (both rows) before it multiplies: eight loads in flight. */
template <typename T, int R>
__global__ void lora_down_kernel(T *__restrict__ t, const T *__restrict__ x, const T *__restrict__ a, int N, int C, int r,
                                 float scale, float ks, uint32_t th, uint64_t seed, bool drop) {
    constexpr int P = Pack<T>::N, CH = 2048 / sizeof(T), ROWS = 2, PPL = CH / P / 32;
    __shared__ Pack<T> sa[R][CH / P];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n0 = (blockIdx.x * 8 + warp) * ROWS;
    float acc[ROWS][R];
#pragma unroll
    for (int i = 0; i < ROWS; i++)
#pragma unroll
        for (int j = 0; j < R; j++) acc[i][j] = 0.0f;
    for (int c0 = 0; c0 < C; c0 += CH) {
        int packs = min(CH, C - c0) / P;
        Pack<T> px[ROWS][PPL];
#pragma unroll
        for (int i = 0; i < ROWS; i++)
#pragma unroll
            for (int q = 0; q < PPL; q++) {
                int pk = lane + 32 * q;
                if (n0 + i < N && pk < packs) px[i][q] = ld_pack(x + (size_t)(n0 + i) * C + c0 + pk * P);
            }
        __syncthreads();
        for (int k = threadIdx.x; k < R * packs; k += blockDim.x) {
            int j = k / packs, pk = k % packs;
            Pack<T> z;
#pragma unroll
            for (int e = 0; e < P; e++) z.v[e] = from_f<T>(0.0f);
            sa[j][pk] = j < r ? ld_pack(a + (size_t)j * C + c0 + pk * P) : z;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ROWS; i++)
#pragma unroll
            for (int q = 0; q < PPL; q++) {
                int pk = lane + 32 * q;
                if (n0 + i >= N || pk >= packs) continue;
                size_t off = (size_t)(n0 + i) * C + c0 + pk * P;
                uint32_t kb = keep_bits<P>(seed, off, th, drop);
                float u[P];
#pragma unroll
                for (int e = 0; e < P; e++) u[e] = dropped(px[i][q].v[e], kb >> e & 1, ks);
#pragma unroll
                for (int j = 0; j < R; j++) {
                    Pack<T> pa = sa[j][pk];
#pragma unroll
                    for (int e = 0; e < P; e++) acc[i][j] += u[e] * to_f(pa.v[e]);
                }
            }
    }
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
        int n = n0 + i;
#pragma unroll
        for (int j = 0; j < R; j++) {
            float s = warp_sum(acc[i][j]);
            if (lane == j && n < N && j < r) t[(size_t)n * r + j] = from_f<T>(scale * s);
        }
    }
}

/* The backward, one pack of columns a thread (thread k of the grid's x) over the rows
 * [blockIdx.y * rows, + rows);
 *   DA: part[blockIdx.y][j][c] = sum over the rows of dt[n, j] u[n, c] (fp32 partial sums of da)
 *   DX: dx[n, c] += (kept ? 1/(1-p) : 0) * sum_j dt[n, j] a[j, c] */
template <typename T, int R, bool DA, bool DX>
__global__ void lora_bwd_kernel(float *__restrict__ part, T *__restrict__ dx, const T *__restrict__ dt, const T *__restrict__ x,
                                const T *__restrict__ a, int N, int C, int r, int rows,
                                float ks, uint32_t th, uint64_t seed, bool drop) {
    constexpr int P = Pack<T>::N;
    __shared__ float sdt[32][R];
    int pk = blockIdx.x * blockDim.x + threadIdx.x, c = pk * P;
    int nb = blockIdx.y * rows, ne = min(N, nb + rows);
    float acc[DA ? R : 1][P];
    Pack<T> pa[DX ? R : 1]; /* a's columns of the pack, as stored (half the registers of floats) */
#pragma unroll
    for (int j = 0; j < R; j++) {
#pragma unroll
        for (int e = 0; e < P; e++) {
            if (DA) acc[j][e] = 0.0f;
            if (DX) pa[j].v[e] = from_f<T>(0.0f);
        }
        if (DX && j < r && c < C) pa[j] = ld_pack(a + (size_t)j * C + c);
    }
    for (int n0 = nb; n0 < ne; n0 += 32) {
        __syncthreads();
        for (int k = threadIdx.x; k < 32 * R; k += blockDim.x) {
            int i = k / R, j = k % R, n = n0 + i;
            sdt[i][j] = n < ne && j < r ? to_f(dt[(size_t)n * r + j]) : 0.0f;
        }
        __syncthreads();
        if (c >= C) continue;
        int m = min(32, ne - n0);
        /* LORA_BATCH rows' packs loaded before any is used (dx's stores would otherwise wait
         * each next row's loads) */
        for (int i0 = 0; i0 < m; i0 += LORA_BATCH) {
            Pack<T> px[LORA_BATCH], pd[LORA_BATCH];
#pragma unroll
            for (int u = 0; u < LORA_BATCH; u++) {
                size_t off = (size_t)(n0 + i0 + u) * C + c;
                if (i0 + u < m && DA) px[u] = ld_pack(x + off);
                if (i0 + u < m && DX) pd[u] = ld_pack(dx + off);
            }
#pragma unroll
            for (int u = 0; u < LORA_BATCH; u++) {
                int i = i0 + u;
                if (i >= m) break;
                size_t off = (size_t)(n0 + i) * C + c;
                uint32_t kb = keep_bits<P>(seed, off, th, drop);
#pragma unroll
                for (int e = 0; e < P; e++) {
                    bool kept = kb >> e & 1;
                    if (DA) {
                        float uu = dropped(px[u].v[e], kept, ks);
#pragma unroll
                        for (int j = 0; j < R; j++) acc[j][e] += sdt[i][j] * uu;
                    }
                    if (DX) {
                        float v = 0.0f;
#pragma unroll
                        for (int j = 0; j < R; j++) v += sdt[i][j] * to_f(pa[j].v[e]);
                        pd[u].v[e] = from_f<T>(to_f(pd[u].v[e]) + (kept ? v * ks : 0.0f));
                    }
                }
                if (DX) st_pack(dx + off, pd[u]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        if (!DA || c >= C || j >= r) break;
        float *p = part + ((size_t)blockIdx.y * r + j) * C + c;
#pragma unroll
        for (int e = 0; e < P; e++) p[e] = acc[j][e];
    }
}

/* da[r, C] += mul * the partial sums, in a fixed order (the same bits on every run) */
template <typename T>
__global__ void lora_da_final_kernel(T *da, const float *part, int G, int rC, float mul) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rC; i += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int g = 0; g < G; g++) s += part[(size_t)g * rC + i];
        da[i] = from_f<T>(to_f(da[i]) + mul * s);
    }
}

/* ---------------------------------------------------------------- tensor cores (bf16, fp16)
 *
 * The products on mma.sync (16-bit in, fp32 sums), so the passes run at the speed of their
 * reads and writes rather than of their multiply-adds. The kept elements enter the products
 * unscaled and the sums are scaled by 1/(1-p) after (mask_scale rounds each scaled element to S
 * first: the results agree up to that rounding). A lane loads 16-byte packs of x (and dx):
 * row n, columns c .. c + 7 with c = c0 + 8 t4 in a chunk of 32 columns at c0 (lane = 4 g + t4).
 * The sums over columns (forward) and over rows (dA) may take their terms in any order, so the
 * operands' k positions are laid where the packs put them; the columns of dx's product (n
 * positions) are laid so each lane's outputs land on its own pack. Register q of a pack holds
 * columns c + 2q, c + 2q + 1. */

template <typename T> __device__ __forceinline__ uint32_t bits16(T v) { return (uint32_t)*reinterpret_cast<uint16_t *>(&v); }
/* The keep masks of a pack of 8 at element off (a multiple of 8): m[q] has 0xffff in the half of
 * each kept element of register q (all kept without dropout). Two hashes a pack, as mask_scale. */
__device__ __forceinline__ void keep_masks8(uint32_t (&m)[4], uint64_t seed, size_t off, uint32_t th, bool drop) {
    if (!drop) {
#pragma unroll
        for (int q = 0; q < 4; q++) m[q] = 0xffffffffu;
        return;
    }
    uint64_t h0 = glm_mask_bits(seed, off >> 2), h1 = glm_mask_bits(seed, (off >> 2) + 1);
    uint32_t w[4] = {(uint32_t)h0, (uint32_t)(h0 >> 32), (uint32_t)h1, (uint32_t)(h1 >> 32)};
#pragma unroll
    for (int q = 0; q < 4; q++) m[q] = ((w[q] & 0xffffu) >= th ? 0xffffu : 0u) | ((w[q] >> 16) >= th ? 0xffff0000u : 0u);
}
/* a pack's kept elements (dropped ones zero), unscaled, as 4 registers */
template <typename T> __device__ __forceinline__ void kept_pack(uint32_t (&w)[4], const Pack<T> &p, const uint32_t (&m)[4]) {
    const uint32_t *raw = reinterpret_cast<const uint32_t *>(&p);
#pragma unroll
    for (int q = 0; q < 4; q++) w[q] = raw[q] & m[q];
}
template <typename T> __device__ __forceinline__ Pack<T> zero_pack() {
    Pack<T> z;
    *reinterpret_cast<int4 *>(&z) = make_int4(0, 0, 0, 0);
    return z;
}
/* The column that position g (m or n) of register q's 8 x 8 matrices stands for, in the chunk at
 * c0: lane (g, t) holds columns c0 + 8 t + 2 q + 0, 1 of register q */
__device__ __forceinline__ int pack_col(int c0, int q, int g) { return c0 + 8 * (g >> 1) + 2 * q + (g & 1); }
/* k positions over a pack's columns: registers q0 and q0 + 1 of rows g (wa) and g + 8 (wb) */
template <typename T>
__device__ __forceinline__ void mma_cols(float (&d)[4], const uint32_t *wa, const uint32_t *wb, int q0, uint32_t b0, uint32_t b1) {
    uint32_t a[4] = {wa[q0], wb[q0], wa[q0 + 1], wb[q0 + 1]};
    mma16816<T>(d, a, b0, b1);
}
/* k positions over 16 rows, m positions the columns of registers q0 and q0 + 1: the transposes
 * of rows 0-7 (ta) and 8-15 (tb) */
template <typename T>
__device__ __forceinline__ void mma_rows(float (&d)[4], const uint32_t *ta, const uint32_t *tb, int q0, uint32_t b0, uint32_t b1) {
    uint32_t a[4] = {ta[q0], ta[q0 + 1], tb[q0], tb[q0 + 1]};
    mma16816<T>(d, a, b0, b1);
}
/* The operands read from a small row-major matrix through f(n, k) (its 16-bit entry, 0 outside):
 * A over rows ra, rb and k = 2 t4 (+ 8); B over k = rows n0 + 2 t4 (+ 1, + 8, + 9) at column j */
template <class F> __device__ __forceinline__ void small_rows_a(uint32_t (&a)[4], F f, int ra, int rb, int t4) {
    a[0] = f(ra, 2 * t4) | f(ra, 2 * t4 + 1) << 16;
    a[1] = f(rb, 2 * t4) | f(rb, 2 * t4 + 1) << 16;
    a[2] = f(ra, 2 * t4 + 8) | f(ra, 2 * t4 + 9) << 16;
    a[3] = f(rb, 2 * t4 + 8) | f(rb, 2 * t4 + 9) << 16;
}
template <class F> __device__ __forceinline__ void small_rows_b(uint32_t (&b)[2], F f, int n0, int t4, int j) {
    int k = n0 + 2 * t4;
    b[0] = f(k, j) | f(k + 1, j) << 16;
    b[1] = f(k + 8, j) | f(k + 9, j) << 16;
}
/* The B operand of small_k_tile for the 8 columns q of a chunk at c0: f(col, k) the K-deep
 * matrix's 16-bit entry (0 outside), k = 2 t4 (+ 8) at column pack_col(c0, q, g) */
template <int NK, class F> __device__ __forceinline__ void small_k_cols(uint32_t (&b)[4][NK], F f, int c0, int g, int t4) {
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int h = 0; h < NK; h++) {
            int col = pack_col(c0, q, g), k = 2 * t4 + 8 * h;
            b[q][h] = f(col, k) | f(col, k + 1) << 16;
        }
}
/* a 16-row tile of the small matrix (a) times 8 columns q of a K-deep one (b: its B operand):
 * m16n8k8 for K <= 8, else m16n8k16; v = the lane's values of rows g, g + 8 at pack elements
 * 2q, 2q + 1 */
template <typename T, int NK> __device__ __forceinline__ void small_k_tile(float (&v)[4], const uint32_t (&a)[4], const uint32_t *b) {
    v[0] = v[1] = v[2] = v[3] = 0.0f;
    if (NK == 1) mma1688<T>(v, a, b[0]);
    else mma16816<T>(v, a, b[0], b[1]);
}
/* an accumulator tile (rows g, g + 8; columns j0 + 2 t4, + 1) into a warp's [16][R] slice */
template <int R> __device__ __forceinline__ void tile_to_shared(float (*sh)[R], const float (&d)[4], int g, int t4, int j0) {
    int j = j0 + 2 * t4;
    sh[g][j] = d[0];
    sh[g][j + 1] = d[1];
    sh[g + 8][j] = d[2];
    sh[g + 8][j + 1] = d[3];
}

#define LORA_TC_UNROLL 4 /* chunks whose packs a forward lane loads before it multiplies */

/* t[N, r] = scale * (dropout(x) a^T): a block takes 16 rows (lanes' rows g and g + 8), its 8
 * warps the 32-column chunks in turn (chunk k to warp k mod 8). Per chunk and 8 values of j, two
 * m16n8k16 products: k positions 2 t4 + e and 2 t4 + 8 + e hold columns c + e and c + 2 + e
 * (the first), c + 4 + e and c + 6 + e (the second), e = 0, 1; a's rows j give the other operand
 * from a pack of their own at the same columns. The warps' sums meet in shared memory, added in
 * warp order (the same bits on every run). */
template <typename T, int R>
__global__ void __launch_bounds__(256) lora_down_tc(T *__restrict__ t, const T *__restrict__ x, const T *__restrict__ a,
                                                    int N, int C, int r, float scale, float ks, uint32_t th, uint64_t seed,
                                                    bool drop) {
    constexpr int NT = R / 8, U = LORA_TC_UNROLL;
    __shared__ float part[8][16][R];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    int n0 = blockIdx.x * 16, ra = n0 + g, rb = ra + 8, chunks = (C + 31) / 32;
    float d[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) d[nt][e] = 0.0f;
    for (int k0 = warp; k0 < chunks; k0 += 8 * U) {
        Pack<T> xa[U], xb[U], pa[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = (k0 + 8 * u) * 32 + 8 * t4;
            bool in = k0 + 8 * u < chunks && c < C;
            xa[u] = in && ra < N ? ld_pack(x + (size_t)ra * C + c) : zero_pack<T>();
            xb[u] = in && rb < N ? ld_pack(x + (size_t)rb * C + c) : zero_pack<T>();
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int j = nt * 8 + g;
                pa[u][nt] = in && j < r ? ld_pack(a + (size_t)j * C + c) : zero_pack<T>();
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = (k0 + 8 * u) * 32 + 8 * t4;
            uint32_t wa[4], wb[4], ma[4], mb[4];
            keep_masks8(ma, seed, (size_t)ra * C + c, th, drop);
            keep_masks8(mb, seed, (size_t)rb * C + c, th, drop);
            kept_pack<T>(wa, xa[u], ma);
            kept_pack<T>(wb, xb[u], mb);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t *b = reinterpret_cast<const uint32_t *>(&pa[u][nt]);
                mma_cols<T>(d[nt], wa, wb, 0, b[0], b[1]);
                mma_cols<T>(d[nt], wa, wb, 2, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) tile_to_shared<R>(part[warp], d[nt], g, t4, nt * 8);
    __syncthreads();
    for (int k = threadIdx.x; k < 16 * r; k += blockDim.x) {
        int i = k / r, j = k % r;
        if (n0 + i >= N) break;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; w++) s += part[w][i][j];
        t[(size_t)(n0 + i) * r + j] = from_f<T>(scale * ks * s);
    }
}

/* The backward on tensor cores: a warp takes one 32-column chunk (block x: 8 chunks, warp w the
 * w-th) over the rows [blockIdx.y * rows, + rows), 16 rows at a time.
 *   DA: the transposes of the lanes' dropped-out packs (register q of rows g and g + 8: two 8 x 8
 *       matrices each) are the A operand of m16n8k16 products over those 16 rows, m positions g and
 *       g + 8 the columns col(q, g) = c0 + 8 (g / 2) + 2 q + g % 2 of registers q = 0 and 1 (the
 *       first product) or 2 and 3 (the second); dt the other operand. The fp32 sums go to
 *       part[blockIdx.y][j][c].
 *   DX: dt's rows times a's columns, m16n8k8 (rank 8) or m16n8k16 (rank 16) per 8 columns q:
 *       n position 2 t4 + e holds column c + 2 q + e, so the 8 columns of a lane's outputs are its
 *       pack's; dx += (kept ? 1/(1-p) : 0) * that. */
template <typename T, int R, bool DA, bool DX>
__global__ void __launch_bounds__(256) lora_bwd_tc(float *__restrict__ part, T *__restrict__ dx, const T *__restrict__ dt,
                                                   const T *__restrict__ x, const T *__restrict__ a, int N, int C, int r,
                                                   int rows, float ks, uint32_t th, uint64_t seed, bool drop) {
    constexpr int NT = R / 8;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    int c0 = (blockIdx.x * 8 + warp) * 32, c = c0 + 8 * t4;
    if (c0 >= C) return; /* no barrier below: a warp past the last chunk may leave */
    bool in = c < C;
    int nb = blockIdx.y * rows, ne = min(N, nb + rows);
    auto dtv = [&](int n, int j) -> uint32_t { return n < ne && j < r ? bits16(dt[(size_t)n * r + j]) : 0u; };
    /* DX's B operand: a's rows j = 2 t4 + e (+ 8 for the second k half) at column pack_col(c0, q, g) */
    uint32_t bx[4][NT];
    if (DX)
        small_k_cols<NT>(bx, [&](int col, int j) -> uint32_t { return col < C && j < r ? bits16(a[(size_t)j * C + col]) : 0u; },
                         c0, g, t4);
    float da[2][NT][4];
#pragma unroll
    for (int p = 0; p < 2; p++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) da[p][nt][e] = 0.0f;
    /* the next 16 rows' packs load while the current ones are used */
    auto load = [&](int n0, Pack<T> &xa, Pack<T> &xb, Pack<T> &pa, Pack<T> &pb) {
        int ra = n0 + g, rb = ra + 8;
        size_t oa = (size_t)ra * C + c, ob = (size_t)rb * C + c;
        if (DA) {
            xa = in && ra < ne ? ld_pack(x + oa) : zero_pack<T>();
            xb = in && rb < ne ? ld_pack(x + ob) : zero_pack<T>();
        }
        if (DX) {
            pa = in && ra < ne ? ld_pack(dx + oa) : zero_pack<T>();
            pb = in && rb < ne ? ld_pack(dx + ob) : zero_pack<T>();
        }
    };
    Pack<T> xa, xb, pa, pb;
    if (nb < ne) load(nb, xa, xb, pa, pb);
    for (int n0 = nb; n0 < ne; n0 += 16) {
        Pack<T> nxa, nxb, npa, npb;
        if (n0 + 16 < ne) load(n0 + 16, nxa, nxb, npa, npb);
        int ra = n0 + g, rb = ra + 8;
        size_t oa = (size_t)ra * C + c, ob = (size_t)rb * C + c;
        uint32_t ma[4], mb[4];
        keep_masks8(ma, seed, oa, th, drop);
        keep_masks8(mb, seed, ob, th, drop);
        if (DA) {
            uint32_t wa[4], wb[4];
            kept_pack<T>(wa, xa, ma);
            kept_pack<T>(wb, xb, mb);
#pragma unroll
            for (int q = 0; q < 4; q++) { wa[q] = trans8(wa[q]); wb[q] = trans8(wb[q]); }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t b[2];
                small_rows_b(b, dtv, n0, t4, nt * 8 + g);
#pragma unroll
                for (int p = 0; p < 2; p++) mma_rows<T>(da[p][nt], wa, wb, 2 * p, b[0], b[1]);
            }
        }
        if (DX) {
            uint32_t af[4];
            small_rows_a(af, dtv, ra, rb, t4);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float v[4];
                small_k_tile<T, NT>(v, af, bx[q]);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int el = 2 * q + e;
                    pa.v[el] = from_f<T>(to_f(pa.v[el]) + (ma[q] >> (16 * e) & 1 ? v[e] * ks : 0.0f));
                    pb.v[el] = from_f<T>(to_f(pb.v[el]) + (mb[q] >> (16 * e) & 1 ? v[2 + e] * ks : 0.0f));
                }
            }
            if (in && ra < ne) st_pack(dx + oa, pa);
            if (in && rb < ne) st_pack(dx + ob, pb);
        }
        xa = nxa; xb = nxb; pa = npa; pb = npb;
    }
    if (DA)
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = nt * 8 + 2 * t4 + (e & 1), col = pack_col(c0, 2 * p + (e >> 1), g);
                    if (j < r && col < C) part[((size_t)blockIdx.y * r + j) * C + col] = da[p][nt][e];
                }
}

/* the packs these kernels read: rows of C in 16-byte packs, x, a (and dx) 16-byte aligned */
static bool lora_vec_ok(glm_dtype dt, int C, int r, const void *x, const void *a, const void *dx) {
    int P = (int)(16 / glm_dtype_size(dt));
    return r >= 1 && r <= LORA_MAX_RANK && C % P == 0 && aligned16(x) && aligned16(a) && (!dx || aligned16(dx));
}

extern "C" int glmk_lora_down(glm_dtype dt, void *t, const void *x, const void *a, int N, int C, int r, float scale,
                              float p, uint64_t seed, cudaStream_t st) {
    if (!lora_vec_ok(dt, C, r, x, a, NULL)) return 0;
    if (N <= 0) return 1;
    unsigned g = (unsigned)((N + 15) / 16);
    float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t th = glm_mask_threshold(p);
#define LORA_FWD(K, T, R) K<T, R><<<g, 256, 0, st>>>((T *)t, (const T *)x, (const T *)a, N, C, r, scale, ks, th, seed, p > 0)
    if (dt == GLM_F32) {
        if (r <= 8) LORA_FWD(lora_down_kernel, float, 8);
        else LORA_FWD(lora_down_kernel, float, 16);
    } else if (dt == GLM_BF16) {
        if (r <= 8) LORA_FWD(lora_down_tc, bf16, 8);
        else LORA_FWD(lora_down_tc, bf16, 16);
    } else {
        if (r <= 8) LORA_FWD(lora_down_tc, f16, 8);
        else LORA_FWD(lora_down_tc, f16, 16);
    }
#undef LORA_FWD
    GLMK_CHECK_LAUNCH();
    return 1;
}

/* fp32 (CUDA cores): row blocks of da's partial sums, at least 32 rows each, at most
 * LORA_DA_PARTS of them (the fp32 scratch: parts * r * C floats) */
#define LORA_DA_PARTS 128
static int da_parts(int N) {
    int g = (N + 31) / 32;
    return g < LORA_DA_PARTS ? g : LORA_DA_PARTS;
}
/* 16-bit (tensor cores): row groups of a multiple of 16 rows, as many as give about 16 warps
 * (one per 32-column chunk and group) to each multiprocessor of an H100/H200 (one wave: a second,
 * partial wave would leave most of the GPU idle), at least 64 rows each */
static int tc_rows(int N, int C) {
    int chunks = (C + 31) / 32, G = (132 * 16 + chunks - 1) / chunks, Gmax = (N + 63) / 64;
    if (G > Gmax) G = Gmax;
    if (G < 1) G = 1;
    int rows = (N + G - 1) / G;
    return (rows + 15) / 16 * 16;
}
extern "C" size_t glmk_lora_down_bwd_scratch(glm_dtype dt, int N, int C, int r) {
    if (r > LORA_MAX_RANK || N <= 0) return 0;
    int G = dt == GLM_F32 ? da_parts(N) : (N + tc_rows(N, C) - 1) / tc_rows(N, C);
    return (size_t)G * r * C;
}

template <typename T>
static void lora_bwd_tc_launch(float *scratch, void *da, void *dx, const void *dtv, const void *x, const void *a, int N,
                               int C, int r, float ks, uint32_t th, uint64_t seed, bool drop, cudaStream_t st) {
    int rows = tc_rows(N, C), G = (N + rows - 1) / rows, chunks = (C + 31) / 32;
    dim3 grid((unsigned)((chunks + 7) / 8), (unsigned)G);
#define LORA_BWD_TC(R, DA, DX)                                                                                        \
    lora_bwd_tc<T, R, DA, DX><<<grid, 256, 0, st>>>(scratch, (T *)dx, (const T *)dtv, (const T *)x, (const T *)a, N, C, r, \
                                                    rows, ks, th, seed, drop)
    if (da && dx) { if (r <= 8) LORA_BWD_TC(8, true, true); else LORA_BWD_TC(16, true, true); }
    else if (da) { if (r <= 8) LORA_BWD_TC(8, true, false); else LORA_BWD_TC(16, true, false); }
    else { if (r <= 8) LORA_BWD_TC(8, false, true); else LORA_BWD_TC(16, false, true); }
#undef LORA_BWD_TC
    if (da) lora_da_final_kernel<T><<<glmk_blocks((size_t)r * C, 256, 264), 256, 0, st>>>((T *)da, scratch, G, r * C, ks);
}

extern "C" int glmk_lora_down_bwd(glm_dtype dt, void *da, void *dx, const void *dtv, const void *x, const void *a, int N,
                                  int C, int r, float p, uint64_t seed, float *scratch, cudaStream_t st) {
    if (!lora_vec_ok(dt, C, r, x, a, dx)) return 0;
    if (N <= 0 || (!da && !dx)) return 1;
    float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t th = glm_mask_threshold(p);
    if (dt != GLM_F32) {
        if (dt == GLM_BF16) lora_bwd_tc_launch<bf16>(scratch, da, dx, dtv, x, a, N, C, r, ks, th, seed, p > 0, st);
        else lora_bwd_tc_launch<f16>(scratch, da, dx, dtv, x, a, N, C, r, ks, th, seed, p > 0, st);
        GLMK_CHECK_LAUNCH();
        return 1;
    }
    typedef float T;
    int P = (int)(16 / glm_dtype_size(dt));
    /* row blocks: da's partial sums fix their number (at most LORA_DA_PARTS); dx alone takes
     * enough of them to fill the GPU */
    int cb = (C / P + 63) / 64, G = da ? da_parts(N) : (N + 15) / 16;
    if (!da && G > 132 * 16 / cb + 1) G = 132 * 16 / cb + 1;
    int rows = (N + G - 1) / G;
    G = (N + rows - 1) / rows;
    dim3 grid((unsigned)cb, (unsigned)G);
#define LORA_BWD(R, DA, DX)                                                                                           \
    lora_bwd_kernel<T, R, DA, DX><<<grid, 64, 0, st>>>(scratch, (T *)dx, (const T *)dtv, (const T *)x, (const T *)a, N, C, \
                                                       r, rows, ks, th, seed, p > 0)
    /* da's pass, then dx's: one pass doing both would hold a's columns and da's sums in one
     * thread's registers (about 230 at rank 8: a quarter of the warps a multiprocessor holds) */
    if (da && r <= 8) LORA_BWD(8, true, false);
    else if (da) LORA_BWD(16, true, false);
    if (dx && r <= 8) LORA_BWD(8, false, true);
    else if (dx) LORA_BWD(16, false, true);
    if (da) lora_da_final_kernel<T><<<glmk_blocks((size_t)r * C, 256, 264), 256, 0, st>>>((T *)da, scratch, G, r * C, 1.0f);
#undef LORA_BWD
    GLMK_CHECK_LAUNCH();
    return 1;
}

/* out[N, OC] = t[N, K] w[OC, K]^T for K <= 16 (LoRA's B product: K is the rank), 16-bit storage:
 * a pure write of out at memory speed, where a GEMM library's kernels for so short a sum run
 * well below it. A warp takes a 32-column chunk (block x: 8 chunks) over a group of rows (block
 * y), 16 rows at a time: per 8 columns q one m16n8k8 (K <= 8) or m16n8k16 product, n position
 * 2 t4 + e holding column c0 + 8 t4 + 2 q + e (so a lane's outputs are one 16-byte pack of each
 * of its rows g and g + 8), w's entries beyond K and t's read as zeros. */
template <typename T, int KP>
__global__ void __launch_bounds__(256) small_k_fwd(T *__restrict__ out, const T *__restrict__ t, const T *__restrict__ w, int N,
                                                   int K, int OC, int rows) {
    constexpr int NK = KP / 8;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    int c0 = (blockIdx.x * 8 + warp) * 32, c = c0 + 8 * t4;
    if (c0 >= OC) return;
    int nb = blockIdx.y * rows, ne = min(N, nb + rows);
    auto tv = [&](int n, int k) -> uint32_t { return n < ne && k < K ? bits16(t[(size_t)n * K + k]) : 0u; };
    uint32_t bw[4][NK];
    small_k_cols<NK>(bw, [&](int col, int k) -> uint32_t { return col < OC && k < K ? bits16(w[(size_t)col * K + k]) : 0u; },
                     c0, g, t4);
    /* four 16-row tiles at a time, t's entries of all four loaded before the products: the loop
     * is otherwise a chain of short loads */
    for (int n00 = nb; n00 < ne; n00 += 64) {
        uint32_t fa[4][4];
#pragma unroll
        for (int u = 0; u < 4; u++) small_rows_a(fa[u], tv, n00 + 16 * u + g, n00 + 16 * u + g + 8, t4);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int ra = n00 + 16 * u + g, rb = ra + 8;
            Pack<T> oa, ob;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float v[4];
                small_k_tile<T, NK>(v, fa[u], bw[q]);
                oa.v[2 * q] = from_f<T>(v[0]);
                oa.v[2 * q + 1] = from_f<T>(v[1]);
                ob.v[2 * q] = from_f<T>(v[2]);
                ob.v[2 * q + 1] = from_f<T>(v[3]);
            }
            if (c < OC && ra < ne) st_pack(out + (size_t)ra * OC + c, oa);
            if (c < OC && rb < ne) st_pack(out + (size_t)rb * OC + c, ob);
        }
    }
}

extern "C" int glmk_small_k_fwd(glm_dtype dt, void *out, const void *t, const void *w, int N, int K, int OC, cudaStream_t st) {
    if (dt == GLM_F32 || K < 1 || K > 16 || OC % 8 || !aligned16(out)) return 0;
    if (N <= 0) return 1;
    int chunks = (OC + 31) / 32, G = (132 * 16 + chunks - 1) / chunks, Gmax = (N + 15) / 16;
    if (G > Gmax) G = Gmax;
    int rows = ((N + G - 1) / G + 63) / 64 * 64; /* whole groups of four tiles */
    G = (N + rows - 1) / rows;
    dim3 grid((unsigned)((chunks + 7) / 8), (unsigned)G);
#define SMALL_K(T, KP) small_k_fwd<T, KP><<<grid, 256, 0, st>>>((T *)out, (const T *)t, (const T *)w, N, K, OC, rows)
    if (dt == GLM_BF16) { if (K <= 8) SMALL_K(bf16, 8); else SMALL_K(bf16, 16); }
    else { if (K <= 8) SMALL_K(f16, 8); else SMALL_K(f16, 16); }
#undef SMALL_K
    GLMK_CHECK_LAUNCH();
    return 1;
}

/* Its backward in one read of dout [N, OC]: dinp[N, K] (= or +=) dout w and dw[OC, K] += dout^T t,
 * for K <= 16, 16-bit storage. A warp takes SKB_CG 32-column chunks (block x: 8 warps) over a
 * group of rows (block y), 16 rows at a time:
 *   dinp: per chunk two m16n8k16 products as lora_down_tc's (k positions the pack's columns, w's
 *         columns j the other operand), summed over the warp's chunks, then over the block's 8
 *         warps in shared memory, written as fp32 partial sums part_in[block x][n][j];
 *   dw:   the transposes of the packs against t's rows, as lora_bwd_tc's dA, summed over the
 *         warp's rows into part_w[row group][o][j].
 * Two final passes add the partial sums in a fixed order (the same bits on every run). */
#define SKB_CG 4
template <typename T, int KP>
__global__ void __launch_bounds__(256) small_k_bwd(float *__restrict__ part_in, float *__restrict__ part_w,
                                                   const T *__restrict__ dout, const T *__restrict__ t, const T *__restrict__ w,
                                                   int N, int K, int OC, int rows) {
    constexpr int NT = KP / 8, CG = SKB_CG;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    __shared__ float sdi[8][16][KP];
    int c0 = (blockIdx.x * 8 + warp) * CG * 32; /* a warp past OC computes zeros: the block's barriers */
    int nb = blockIdx.y * rows, ne = min(N, nb + rows);
    auto tv = [&](int n, int k) -> uint32_t { return n < ne && k < K ? bits16(t[(size_t)n * K + k]) : 0u; };
    /* dinp's B operand: w's column j = nt 8 + g at the columns of each chunk's pack */
    uint32_t bw[CG][NT][4];
#pragma unroll
    for (int u = 0; u < CG; u++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int c = c0 + u * 32 + 8 * t4 + 2 * q, j = nt * 8 + g;
                uint32_t lo = c < OC && j < K ? bits16(w[(size_t)c * K + j]) : 0u;
                uint32_t hi = c + 1 < OC && j < K ? bits16(w[(size_t)(c + 1) * K + j]) : 0u;
                bw[u][nt][q] = lo | hi << 16;
            }
    float dw[CG][2][NT][4];
#pragma unroll
    for (int u = 0; u < CG; u++)
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) dw[u][p][nt][e] = 0.0f;
    for (int n0 = nb; n0 < ne; n0 += 16) {
        int ra = n0 + g, rb = ra + 8;
        Pack<T> xa[CG], xb[CG];
#pragma unroll
        for (int u = 0; u < CG; u++) {
            int c = c0 + u * 32 + 8 * t4;
            xa[u] = c < OC && ra < ne ? ld_pack(dout + (size_t)ra * OC + c) : zero_pack<T>();
            xb[u] = c < OC && rb < ne ? ld_pack(dout + (size_t)rb * OC + c) : zero_pack<T>();
        }
        float di[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) di[nt][e] = 0.0f;
        uint32_t bt[NT][2]; /* dw's B operand: t's rows at column j = nt 8 + g */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) small_rows_b(bt[nt], tv, n0, t4, nt * 8 + g);
#pragma unroll
        for (int u = 0; u < CG; u++) {
            const uint32_t *wa = reinterpret_cast<const uint32_t *>(&xa[u]), *wb = reinterpret_cast<const uint32_t *>(&xb[u]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                mma_cols<T>(di[nt], wa, wb, 0, bw[u][nt][0], bw[u][nt][1]);
                mma_cols<T>(di[nt], wa, wb, 2, bw[u][nt][2], bw[u][nt][3]);
            }
            uint32_t ta[4], tb[4];
#pragma unroll
            for (int q = 0; q < 4; q++) { ta[q] = trans8(wa[q]); tb[q] = trans8(wb[q]); }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int p = 0; p < 2; p++)
                    mma_rows<T>(dw[u][p][nt], ta, tb, 2 * p, bt[nt][0], bt[nt][1]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) tile_to_shared<KP>(sdi[warp], di[nt], g, t4, nt * 8);
        __syncthreads();
        for (int i = threadIdx.x; i < 16 * K; i += blockDim.x) {
            int r = i / K, j = i % K;
            float v = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) v += sdi[q][r][j];
            if (n0 + r < ne) part_in[((size_t)blockIdx.x * N + n0 + r) * K + j] = v;
        }
        __syncthreads(); /* sdi is rewritten by the next tile */
    }
#pragma unroll
    for (int u = 0; u < CG; u++)
#pragma unroll
        for (int p = 0; p < 2; p++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int j = nt * 8 + 2 * t4 + (e & 1), col = pack_col(c0 + u * 32, 2 * p + (e >> 1), g);
                    if (j < K && col < OC) part_w[((size_t)blockIdx.y * OC + col) * K + j] = dw[u][p][nt][e];
                }
}
/* dinp[n, j] (= or +=) the column groups' sums; dw[o, j] += the row groups' sums */
template <typename T>
__global__ void small_k_bwd_final(T *dinp, T *dw, const float *part_in, const float *part_w, int N, int K, int OC, int groups,
                                  int G, int accumulate) {
    size_t nin = (size_t)N * K, nw = (size_t)OC * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nin + nw; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        if (i < nin) {
            for (int q = 0; q < groups; q++) s += part_in[(size_t)q * nin + i];
            dinp[i] = from_f<T>(accumulate ? to_f(dinp[i]) + s : s);
        } else {
            for (int q = 0; q < G; q++) s += part_w[(size_t)q * nw + (i - nin)];
            dw[i - nin] = from_f<T>(to_f(dw[i - nin]) + s);
        }
    }
}

/* small_k_bwd's grid: blocks of 8 column groups (dinp's partial sums, one per block x), row
 * groups of a multiple of 16 rows, enough warps for about one wave */
static void small_k_bwd_grid(int N, int OC, int *groups, int *G, int *rows) {
    *groups = (OC + 8 * SKB_CG * 32 - 1) / (8 * SKB_CG * 32);
    int g = (132 * 2 + *groups - 1) / *groups, gmax = (N + 15) / 16;
    if (g > gmax) g = gmax;
    *rows = ((N + g - 1) / g + 15) / 16 * 16;
    *G = (N + *rows - 1) / *rows;
}
extern "C" size_t glmk_small_k_bwd_scratch(int N, int K, int OC) {
    int groups, G, rows;
    if (N <= 0 || K < 1 || K > 16) return 0;
    small_k_bwd_grid(N, OC, &groups, &G, &rows);
    return ((size_t)groups * N + (size_t)G * OC) * K;
}
extern "C" int glmk_small_k_bwd(glm_dtype dt, void *dinp, void *dw, const void *dout, const void *t, const void *w, int N, int K,
                                int OC, int accumulate, float *scratch, cudaStream_t st) {
    if (dt == GLM_F32 || K < 1 || K > 16 || OC % 8 || !dinp || !dw || !aligned16(dout)) return 0;
    if (N <= 0) return 1;
    int groups, G, rows;
    small_k_bwd_grid(N, OC, &groups, &G, &rows);
    float *part_in = scratch, *part_w = scratch + (size_t)groups * N * K;
    dim3 grid((unsigned)groups, (unsigned)G);
#define SMALL_K_BWD(T, KP)                                                                                               \
    small_k_bwd<T, KP><<<grid, 256, 0, st>>>(part_in, part_w, (const T *)dout, (const T *)t, (const T *)w, N, K, OC, rows); \
    small_k_bwd_final<T><<<glmk_blocks((size_t)(N + OC) * K, 256, 1024), 256, 0, st>>>((T *)dinp, (T *)dw, part_in, part_w, N, \
                                                                                       K, OC, groups, G, accumulate)
    if (dt == GLM_BF16) { if (K <= 8) { SMALL_K_BWD(bf16, 8); } else { SMALL_K_BWD(bf16, 16); } }
    else { if (K <= 8) { SMALL_K_BWD(f16, 8); } else { SMALL_K_BWD(f16, 16); } }
#undef SMALL_K_BWD
    GLMK_CHECK_LAUNCH();
    return 1;
}
