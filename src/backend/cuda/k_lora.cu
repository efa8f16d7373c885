/* LoRA's down-projection with its input dropout in one pass (backend.h lora_down,
 * lora_down_bwd): peft's lora_A(dropout(x)) without the dropped-out copy of x written and read
 * back, in forward and in backward. The rank is small (<= 16), so these are reads of x (and of
 * dx) at memory speed with the products on CUDA cores, not tensor-core GEMMs. The mask is
 * mask_scale's (backend/mask_hash.h: element i = n * C + c of x, the same seed; one hash per
 * four elements, as C is a multiple of the pack and so of 4), the dropped-out
 * value rounded to S as mask_scale stores it, so the results are those of mask_scale + the
 * GEMMs up to the rounding of the products' sums. */
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

/* da[r, C] += the partial sums, in a fixed order (the same bits on every run) */
template <typename T>
__global__ void lora_da_final_kernel(T *da, const float *part, int G, int rC) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rC; i += gridDim.x * blockDim.x) {
        float s = to_f(da[i]);
        for (int g = 0; g < G; g++) s += part[(size_t)g * rC + i];
        da[i] = from_f<T>(s);
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
    GLMK_DISPATCH(dt, {
        if (r <= 8) lora_down_kernel<T, 8><<<g, 256, 0, st>>>((T *)t, (const T *)x, (const T *)a, N, C, r, scale, ks, th, seed, p > 0);
        else lora_down_kernel<T, 16><<<g, 256, 0, st>>>((T *)t, (const T *)x, (const T *)a, N, C, r, scale, ks, th, seed, p > 0);
    });
    GLMK_CHECK_LAUNCH();
    return 1;
}

/* row blocks of da's partial sums: at least 32 rows each, at most LORA_DA_PARTS of them (the
 * fp32 scratch: parts * r * C floats) */
#define LORA_DA_PARTS 128
static int da_parts(int N) {
    int g = (N + 31) / 32;
    return g < LORA_DA_PARTS ? g : LORA_DA_PARTS;
}
extern "C" size_t glmk_lora_down_bwd_scratch(int N, int C, int r) {
    return r <= LORA_MAX_RANK ? (size_t)da_parts(N) * r * C : 0;
}

extern "C" int glmk_lora_down_bwd(glm_dtype dt, void *da, void *dx, const void *dtv, const void *x, const void *a, int N,
                                  int C, int r, float p, uint64_t seed, float *scratch, cudaStream_t st) {
    if (!lora_vec_ok(dt, C, r, x, a, dx)) return 0;
    if (N <= 0) return 1;
    int P = (int)(16 / glm_dtype_size(dt));
    float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t th = glm_mask_threshold(p);
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
    GLMK_DISPATCH(dt, {
        if (da && r <= 8) LORA_BWD(8, true, false);
        else if (da) LORA_BWD(16, true, false);
        if (dx && r <= 8) LORA_BWD(8, false, true);
        else if (dx) LORA_BWD(16, false, true);
        if (da) lora_da_final_kernel<T><<<glmk_blocks((size_t)r * C, 256, 264), 256, 0, st>>>((T *)da, scratch, G, r * C);
    });
#undef LORA_BWD
    GLMK_CHECK_LAUNCH();
    return 1;
}
