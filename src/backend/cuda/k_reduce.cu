/* Row and column reductions: LayerNorm forward/backward (fp32 statistics), bias gradients,
 * cross entropy over a chunk of logits, the gradient sum of squares, and fused AdamW.
 * Every reduction has a fixed order (no atomics), so results repeat bit for bit. */
#include "backend/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------- column sums */

/* Column sums run in two launches: partial sums over RB row blocks into scratch [RB, C], then one
 * thread per column adds the RB partials in order. RB depends only on (N, C). */
static int colsum_rb(int N, int C) {
    int colblocks = (C + 255) / 256, rb = (2 * 132 * 4 + colblocks - 1) / colblocks;
    int max_rb = (N + 15) / 16; /* at least 16 rows per block */
    if (rb > max_rb) rb = max_rb;
    if (rb > 256) rb = 256;
    return rb < 1 ? 1 : rb;
}
extern "C" size_t glmk_colsum_scratch(int N, int C) {
    int rb = colsum_rb(N, C);
    return (size_t)(rb > 264 ? rb : 264) * C; /* also covers the LayerNorm backward's fixed grid */
}

/* LN = false: p1 = sum_n a[n,c].  LN = true: p1 = sum_n a*(x-mean)*rstd, p2 = sum_n a. */
template <typename T, bool LN>
__global__ void colsum_partial_kernel(float *p1, float *p2, const T *a, const T *x, const float *mean, const float *rstd,
                                      int N, int C, int rows_per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, rb = blockIdx.y;
    if (c >= C) return;
    int n0 = rb * rows_per, n1 = min(N, n0 + rows_per);
    float s1 = 0, s2 = 0;
    for (int n = n0; n < n1; n++) {
        float g = to_f(a[(size_t)n * C + c]);
        if (LN) {
            s1 += g * (to_f(x[(size_t)n * C + c]) - mean[n]) * rstd[n];
            s2 += g;
        } else {
            s1 += g;
        }
    }
    p1[(size_t)rb * C + c] = s1;
    if (LN) p2[(size_t)rb * C + c] = s2;
}

template <typename T>
__global__ void colsum_final_kernel(T *d1, T *d2, const float *p1, const float *p2, int RB, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s1 = 0, s2 = 0;
    for (int r = 0; r < RB; r++) {
        s1 += p1[(size_t)r * C + c];
        if (d2) s2 += p2[(size_t)r * C + c];
    }
    d1[c] = from_f<T>(to_f(d1[c]) + s1);
    if (d2) d2[c] = from_f<T>(to_f(d2[c]) + s2);
}

extern "C" void glmk_bias_grad(glm_dtype dt, void *dbias, const void *dout, int N, int OC, float *scratch, cudaStream_t st) {
    if (N <= 0 || OC <= 0) return;
    int rb = colsum_rb(N, OC), rows_per = (N + rb - 1) / rb;
    dim3 g((OC + 255) / 256, rb);
    GLMK_DISPATCH(dt, {
        colsum_partial_kernel<T, false><<<g, 256, 0, st>>>(scratch, NULL, (const T *)dout, NULL, NULL, NULL, N, OC, rows_per);
        colsum_final_kernel<T><<<(OC + 255) / 256, 256, 0, st>>>((T *)dbias, NULL, scratch, NULL, rb, OC);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- LayerNorm */

/* One block per row; statistics in fp32 from three passes over the row (the 2nd and 3rd hit L1). */
template <typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *x, const T *w, const T *b, int C, float eps) {
    __shared__ float sh[32];
    const T *xr = x + (size_t)blockIdx.x * C;
    float s = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += to_f(xr[c]);
    float m = block_sum(s, sh) / C;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) { float d = to_f(xr[c]) - m; ss += d * d; }
    float r = 1.0f / sqrtf(block_sum(ss, sh) / C + eps);
    T *o = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f<T>((to_f(xr[c]) - m) * r * to_f(w[c]) + to_f(b[c]));
    if (threadIdx.x == 0) { mean[blockIdx.x] = m; rstd[blockIdx.x] = r; }
}

/* Register-cached variants: each thread holds up to LN_NP 16-byte packs of its row (columns
 * pk*P.. for pk = tid, tid + blockDim, ...), so every input is read from memory once. The
 * backward block walks rows blockIdx.x, +gridDim.x, ... and keeps the dw/db partial sums of
 * its fixed columns in registers, written once per block: no second pass over dout and x. */
#define LN_NP 4
template <typename T>
__global__ void layernorm_fwd_vec(T *out, float *mean, float *rstd, const T *x, const T *w, const T *b, int C, float eps) {
    constexpr int P = Pack<T>::N;
    __shared__ float sh[32];
    int packs = C / P;
    const T *xr = x + (size_t)blockIdx.x * C;
    float v[LN_NP][P], s = 0;
#pragma unroll
    for (int k = 0; k < LN_NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
        if (pk < packs) {
            Pack<T> a = ld_pack(xr + pk * P);
#pragma unroll
            for (int e = 0; e < P; e++) { v[k][e] = to_f(a.v[e]); s += v[k][e]; }
        }
    }
    float m = block_sum(s, sh) / C, ss = 0;
#pragma unroll
    for (int k = 0; k < LN_NP; k++)
        if (threadIdx.x + k * blockDim.x < packs)
#pragma unroll
            for (int e = 0; e < P; e++) { float d = v[k][e] - m; ss += d * d; }
    float r = 1.0f / sqrtf(block_sum(ss, sh) / C + eps);
    T *o = out + (size_t)blockIdx.x * C;
#pragma unroll
    for (int k = 0; k < LN_NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
        if (pk < packs) {
            Pack<T> pw = ld_pack(w + pk * P), pb = ld_pack(b + pk * P), po;
#pragma unroll
            for (int e = 0; e < P; e++) po.v[e] = from_f<T>((v[k][e] - m) * r * to_f(pw.v[e]) + to_f(pb.v[e]));
            st_pack(o + pk * P, po);
        }
    }
    if (threadIdx.x == 0) { mean[blockIdx.x] = m; rstd[blockIdx.x] = r; }
}

/* dx (may alias dout) for rows blockIdx.x + k*gridDim.x; with GRADS, partial[blockIdx.x] of
 * dw and db. NP packs per thread: 2 where the row allows it (half the registers of 4: more
 * warps per SM). A frozen LayerNorm (no GRADS) runs a row a block: nothing carried between
 * rows, so every block's loads are in flight at once. */
template <typename T, int NP, bool GRADS>
__global__ void layernorm_bwd_vec(T *dx, float *pdw, float *pdb, const T *dout, const T *x, const T *w, const float *mean,
                                  const float *rstd, int N, int C) {
    constexpr int P = Pack<T>::N;
    __shared__ float sh[32];
    int packs = C / P;
    float aw[NP][P], ab[NP][P], wv[NP][P];
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
#pragma unroll
        for (int e = 0; e < P; e++) { aw[k][e] = ab[k][e] = 0.0f; wv[k][e] = 0.0f; }
        if (pk < packs) {
            Pack<T> pw = ld_pack(w + pk * P);
#pragma unroll
            for (int e = 0; e < P; e++) wv[k][e] = to_f(pw.v[e]);
        }
    }
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        size_t off = (size_t)n * C;
        float m = mean[n], r = rstd[n], sg = 0, sgx = 0;
        float xh[NP][P], g[NP][P];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            int pk = threadIdx.x + k * blockDim.x;
            if (pk < packs) {
                Pack<T> px = ld_pack(x + off + pk * P), pg = ld_pack(dout + off + pk * P);
#pragma unroll
                for (int e = 0; e < P; e++) {
                    xh[k][e] = (to_f(px.v[e]) - m) * r;
                    g[k][e] = to_f(pg.v[e]);
                    float dxh = g[k][e] * wv[k][e];
                    sg += dxh;
                    sgx += dxh * xh[k][e];
                    if (GRADS) {
                        aw[k][e] += g[k][e] * xh[k][e];
                        ab[k][e] += g[k][e];
                    }
                }
            }
        }
        float a = block_sum(sg, sh) / C, bb = block_sum(sgx, sh) / C;
#pragma unroll
        for (int k = 0; k < NP; k++) {
            int pk = threadIdx.x + k * blockDim.x;
            if (pk < packs) {
                Pack<T> po;
#pragma unroll
                for (int e = 0; e < P; e++) po.v[e] = from_f<T>(r * (g[k][e] * wv[k][e] - a - xh[k][e] * bb));
                st_pack(dx + off + pk * P, po);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int pk = threadIdx.x + k * blockDim.x;
        if (GRADS && pk < packs)
#pragma unroll
            for (int e = 0; e < P; e++) {
                pdw[(size_t)blockIdx.x * C + pk * P + e] = aw[k][e];
                pdb[(size_t)blockIdx.x * C + pk * P + e] = ab[k][e];
            }
    }
}

/* A frozen LayerNorm's backward, a row to four warps (two rows a block of 256 threads): lane k of
 * the row's 128 threads holds packs k, k + 128, ... (LN_ROWS_NP of them) of its row's x and dout
 * in registers as loaded, so they are read once and the row's sums are warp shuffles and one
 * exchange through shared memory: no block-wide reduction sits between a row's loads and its
 * stores. A row past N loads and stores nothing (it still reaches the barrier). (The forward
 * gained nothing this way over layernorm_fwd_vec's block a row.) */
#define LN_ROWS_NP 4
/* dx = rstd * (g w - mean(g w) - xhat mean(g w xhat)); dx may alias dout */
template <typename T>
__global__ void __launch_bounds__(256, 2) layernorm_dx_rows(T *dx, const T *dout, const T *x, const T *w, const float *mean,
                                                            const float *rstd, int N, int C) {
    constexpr int P = Pack<T>::N, NP = LN_ROWS_NP;
    __shared__ float2 sh[8];
    int warp = threadIdx.x >> 5, lane = (threadIdx.x & 127), row = blockIdx.x * 2 + (warp >> 2);
    int packs = C / P;
    bool in = row < N;
    size_t off = (size_t)row * C;
    float m = in ? mean[row] : 0.0f, r = in ? rstd[row] : 0.0f, sg = 0.0f, sgx = 0.0f;
    Pack<T> px[NP], pg[NP];
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int pk = lane + 128 * k;
        if (in && pk < packs) { px[k] = ld_pack(x + off + pk * P); pg[k] = ld_pack(dout + off + pk * P); }
    }
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int pk = lane + 128 * k;
        if (in && pk < packs) {
            Pack<T> pw = ld_pack(w + pk * P);
#pragma unroll
            for (int e = 0; e < P; e++) {
                float dxh = to_f(pg[k].v[e]) * to_f(pw.v[e]);
                sg += dxh;
                sgx += dxh * ((to_f(px[k].v[e]) - m) * r);
            }
        }
    }
    /* the row's four warps' sums, added in warp order (every warp of the row gets the same bits) */
    sg = warp_sum(sg);
    sgx = warp_sum(sgx);
    if ((threadIdx.x & 31) == 0) sh[warp] = make_float2(sg, sgx);
    __syncthreads();
    int w0 = warp & ~3;
    float2 t = sh[w0];
#pragma unroll
    for (int i = 1; i < 4; i++) { t.x += sh[w0 + i].x; t.y += sh[w0 + i].y; }
    float a = t.x / C, bb = t.y / C;
    if (!in) return;
#pragma unroll
    for (int k = 0; k < NP; k++) {
        int pk = lane + 128 * k;
        if (pk < packs) {
            Pack<T> pw = ld_pack(w + pk * P), po;
#pragma unroll
            for (int e = 0; e < P; e++)
                po.v[e] = from_f<T>(r * (to_f(pg[k].v[e]) * to_f(pw.v[e]) - a - (to_f(px[k].v[e]) - m) * r * bb));
            st_pack(dx + off + pk * P, po);
        }
    }
}
/* a row of C in 16-byte packs that four warps hold at LN_ROWS_NP packs a lane (wider rows, or
 * rows not in packs, take the block-a-row kernels) */
static bool ln_rows_fit(glm_dtype dt, int C, const void *a, const void *b, const void *c, const void *d) {
    int P = (int)(16 / glm_dtype_size(dt));
    return C % P == 0 && C / P <= 128 * LN_ROWS_NP && aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

/* threads for the vector path (a multiple of 32 with at most LN_NP packs each), or 0 when the
 * row does not split into 16-byte packs */
static int ln_vec_threads(glm_dtype dt, int C, const void *a, const void *b, const void *c, const void *d, int np) {
    int P = (int)(16 / glm_dtype_size(dt));
    if (C % P || !aligned16(a) || !aligned16(b) || !aligned16(c) || !aligned16(d)) return 0;
    int packs = C / P, t = (packs + np - 1) / np;
    t = (t + 31) / 32 * 32;
    return t <= 1024 ? t : 0;
}
#define LN_BWD_BLOCKS 264 /* rows per block = N / 264: a fixed grid keeps the dw/db sums in a fixed order */

extern "C" void glmk_layernorm_fwd(glm_dtype dt, void *out, float *mean, float *rstd, const void *x, const void *w,
                                   const void *b, int N, int C, float eps, cudaStream_t st) {
    if (N <= 0) return;
    /* fewer rows than half the multiprocessors (decoding) leave most of the GPU idle: one pack a
     * thread shortens each row's chain */
    int vt = ln_vec_threads(dt, C, out, x, w, b, N < 66 ? 1 : LN_NP);
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, {
        if (vt) layernorm_fwd_vec<T><<<N, vt, 0, st>>>((T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, C, eps);
        else layernorm_fwd_kernel<T><<<N, threads, 0, st>>>((T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, C, eps);
    });
    GLMK_CHECK_LAUNCH();
}

/* dx row by row: dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)). dx may alias dout. */
template <typename T>
__global__ void layernorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *mean, const float *rstd, int C) {
    __shared__ float sh[32];
    size_t off = (size_t)blockIdx.x * C;
    float m = mean[blockIdx.x], r = rstd[blockIdx.x], sg = 0, sgx = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dxh = to_f(dout[off + c]) * to_f(w[c]), xh = (to_f(x[off + c]) - m) * r;
        sg += dxh;
        sgx += dxh * xh;
    }
    float a = block_sum(sg, sh) / C, bb = block_sum(sgx, sh) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (to_f(x[off + c]) - m) * r;
        dx[off + c] = from_f<T>(r * (to_f(dout[off + c]) * to_f(w[c]) - a - xh * bb));
    }
}

extern "C" void glmk_layernorm_bwd(glm_dtype dt, void *dx, void *dw, void *db, const void *dout, const void *x,
                                   const void *w, const float *mean, const float *rstd, int N, int C, float *scratch,
                                   cudaStream_t st) {
    if (N <= 0) return;
    if (!dw && ln_rows_fit(dt, C, dx, dout, x, w)) { /* frozen: a row four warps, x and dout held */
        unsigned g = (unsigned)((N + 1) / 2);
        GLMK_DISPATCH(dt, layernorm_dx_rows<T><<<g, 256, 0, st>>>((T *)dx, (const T *)dout, (const T *)x, (const T *)w, mean,
                                                                 rstd, N, C));
        GLMK_CHECK_LAUNCH();
        return;
    }
    /* the register-cached kernels hold up to ~190 registers a thread (4 packs with dw, db): at most
     * 512 threads of 2 packs, 256 of 4, or the launch asks for more registers than a
     * multiprocessor has; wider rows take the two-pass kernels below */
    int vt2 = ln_vec_threads(dt, C, dx, dout, x, w, 2), vt4 = ln_vec_threads(dt, C, dx, dout, x, w, LN_NP);
    bool two = vt2 && vt2 <= 512;
    int vt = two ? vt2 : vt4 && vt4 <= 256 ? vt4 : 0;
    if (vt) {
        int G = !dw ? N : N < LN_BWD_BLOCKS ? N : LN_BWD_BLOCKS;
        float *p1 = scratch, *p2 = scratch + (size_t)G * C;
#define LN_BWD(NP, GRADS) layernorm_bwd_vec<T, NP, GRADS><<<G, vt, 0, st>>>((T *)dx, p1, p2, (const T *)dout, (const T *)x, \
                                                                         (const T *)w, mean, rstd, N, C)
        GLMK_DISPATCH(dt, {
            if (dw && two) LN_BWD(2, true);
            else if (dw) LN_BWD(LN_NP, true);
            else if (two) LN_BWD(2, false);
            else LN_BWD(LN_NP, false);
            if (dw) colsum_final_kernel<T><<<(C + 255) / 256, 256, 0, st>>>((T *)dw, (T *)db, p1, p2, G, C);
        });
#undef LN_BWD
        GLMK_CHECK_LAUNCH();
        return;
    }
    int rb = colsum_rb(N, C), rows_per = (N + rb - 1) / rb;
    float *p1 = scratch, *p2 = scratch + (size_t)rb * C;
    dim3 g((C + 255) / 256, rb);
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, {
        /* parameter gradients first: dx may overwrite dout */
        if (dw) { /* a frozen LayerNorm has no parameter gradients */
            colsum_partial_kernel<T, true><<<g, 256, 0, st>>>(p1, p2, (const T *)dout, (const T *)x, mean, rstd, N, C, rows_per);
            colsum_final_kernel<T><<<(C + 255) / 256, 256, 0, st>>>((T *)dw, (T *)db, p1, p2, rb, C);
        }
        layernorm_dx_kernel<T><<<N, threads, 0, st>>>((T *)dx, (const T *)dout, (const T *)x, (const T *)w, mean, rstd, C);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- cross entropy */

/* One block per row: an online max/sum pass, the loss, then (dscale != 0) the gradient written
 * over the logits. fp32 throughout; the target's entry is computed and stored by one thread.
 * VEC: 16-byte packs (V a multiple of the pack, rows aligned), the running maximum moved once a
 * pack. */
template <typename T, bool VEC>
__global__ void cross_entropy_kernel(T *logits, float *losses, const int32_t *targets, int V, float dscale,
                                     const float *row_scale) {
    constexpr int P = Pack<T>::N;
    __shared__ float sh[32];
    T *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY, s = 0;
    if (VEC) {
        for (int j = threadIdx.x * P; j < V; j += blockDim.x * P) {
            Pack<T> pv = ld_pack(l + j);
            float v[P], pm = -INFINITY;
#pragma unroll
            for (int e = 0; e < P; e++) { v[e] = to_f(pv.v[e]); pm = fmaxf(pm, v[e]); }
            if (pm > m) { s = m == -INFINITY ? 0.0f : s * expf(m - pm); m = pm; }
            if (m != -INFINITY)
#pragma unroll
                for (int e = 0; e < P; e++) s += expf(v[e] - m);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float v = to_f(l[j]);
            if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
            else s += expf(v - m);
        }
    }
    float M = block_max(m, sh);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sh);
    float lse = M + logf(S);
    int t = targets[blockIdx.x];
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_f(l[t]);
    if (dscale == 0.0f) return;
    if (row_scale) dscale *= row_scale[blockIdx.x];
    __syncthreads(); /* l[t] is read above before any thread overwrites it */
    if (VEC) {
        for (int j = threadIdx.x * P; j < V; j += blockDim.x * P) {
            Pack<T> pv = ld_pack(l + j);
#pragma unroll
            for (int e = 0; e < P; e++) {
                float g = dscale * expf(to_f(pv.v[e]) - lse);
                if (j + e == t) g -= dscale;
                pv.v[e] = from_f<T>(g);
            }
            st_pack(l + j, pv);
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float g = dscale * expf(to_f(l[j]) - lse);
            if (j == t) g -= dscale;
            l[j] = from_f<T>(g);
        }
    }
}

extern "C" void glmk_cross_entropy(glm_dtype dt, void *logits, float *losses, const int32_t *targets, int R, int V,
                                   float dscale, const float *row_scale, cudaStream_t st) {
    if (R <= 0) return;
    int threads = V >= 8192 ? 1024 : V >= 1024 ? 256 : 32;
    bool vec = V % (int)(16 / glm_dtype_size(dt)) == 0 && aligned16(logits);
    GLMK_DISPATCH(dt, {
        if (vec) cross_entropy_kernel<T, true><<<R, threads, 0, st>>>((T *)logits, losses, targets, V, dscale, row_scale);
        else cross_entropy_kernel<T, false><<<R, threads, 0, st>>>((T *)logits, losses, targets, V, dscale, row_scale);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- sum of squares */

/* Fixed grid and fixed element-to-thread mapping, double accumulation: the same input gives
 * the same result on every run and every GPU. */
template <typename T>
__global__ void sumsq_partial_kernel(double *partial, const T *__restrict__ x, size_t n, int vec) {
    __shared__ double sh[256];
    double s = 0;
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) { /* 16-byte packs; the n % P tail goes to block 0 below */
        constexpr int P = Pack<T>::N;
        size_t np = n / P;
        for (size_t i = t; i < np; i += stride) {
            Pack<T> p = ld_pack(x + i * P);
#pragma unroll
            for (int e = 0; e < P; e++) { double v = to_f(p.v[e]); s += v * v; }
        }
        done = np * P;
        if (blockIdx.x == 0)
            for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) { double v = to_f(x[i]); s += v * v; }
    } else {
        for (size_t i = t; i < n; i += stride) { double v = to_f(x[i]); s += v * v; }
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}
__global__ void sumsq_final_kernel(double *result, const double *partial, int nb) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        double s = 0;
        for (int i = 0; i < nb; i++) s += partial[i];
        *result = s;
    }
}

extern "C" void glmk_sumsq(glm_dtype dt, const void *x, size_t n, double *partial, double *result, cudaStream_t st) {
    int vec = aligned16(x);
    GLMK_DISPATCH(dt, sumsq_partial_kernel<T><<<GLMK_SUMSQ_BLOCKS, 256, 0, st>>>(partial, (const T *)x, n, vec));
    sumsq_final_kernel<<<1, 32, 0, st>>>(result, partial, GLMK_SUMSQ_BLOCKS);
    GLMK_CHECK_LAUNCH();
}

/* One row of blocks per span (blockIdx.y); each span's partials then reduce in a fixed order.
 * With y: first x[lo + j] += y[yoff + j] (rounded to T), and the squares are of the sums. */
template <typename T>
__global__ void sumsq_spans_kernel(double *partial, T *__restrict__ x, const T *__restrict__ y, const glm_span *spans,
                                   const size_t *yoff, int vec) {
    glm_span s = spans[blockIdx.y];
    __shared__ double sh[256];
    double acc = 0;
    T *p = x + s.lo;
    const T *q = y ? y + yoff[blockIdx.y] : nullptr;
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x, done = 0;
    if (vec) {
        constexpr int P = Pack<T>::N;
        size_t np = s.n / P;
        for (size_t i = t; i < np; i += stride) {
            Pack<T> a = ld_pack(p + i * P);
            if (q) {
                Pack<T> b = ld_pack(q + i * P);
#pragma unroll
                for (int e = 0; e < P; e++) a.v[e] = from_f<T>(to_f(a.v[e]) + to_f(b.v[e]));
                st_pack(p + i * P, a);
            }
#pragma unroll
            for (int e = 0; e < P; e++) { double v = to_f(a.v[e]); acc += v * v; }
        }
        done = np * P;
    }
    if (blockIdx.x == 0 || !vec)
        for (size_t i = done + (vec ? threadIdx.x : t); i < s.n; i += vec ? blockDim.x : stride) {
            if (q) p[i] = from_f<T>(to_f(p[i]) + to_f(q[i]));
            double v = to_f(p[i]);
            acc += v * v;
        }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.y * gridDim.x + blockIdx.x] = sh[0];
}
__global__ void sumsq_spans_final_kernel(double *result, const double *partial, int k, int nb) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k) return;
    double s = 0;
    for (int j = 0; j < nb; j++) s += partial[(size_t)i * nb + j];
    result[i] = s;
}

extern "C" void glmk_sumsq_spans(glm_dtype dt, void *x, const void *y, const glm_span *spans, const size_t *yoff, int k,
                                 int vec, double *partial, double *result, cudaStream_t st) {
    if (k <= 0) return;
    dim3 grid(GLMK_SUMSQ_SPAN_BLOCKS, k);
    GLMK_DISPATCH(dt, sumsq_spans_kernel<T><<<grid, 256, 0, st>>>(partial, (T *)x, (const T *)y, spans, yoff, vec));
    sumsq_spans_final_kernel<<<(k + 127) / 128, 128, 0, st>>>(result, partial, k, GLMK_SUMSQ_SPAN_BLOCKS);
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- AdamW */

/* The operation order of torch.optim.AdamW's single-tensor path, as cpu_adamw. p is the fp32
 * master (or the fp32 param itself); the S param is written from it, rounded to nearest. */
template <typename T>
__device__ __forceinline__ void adamw_one(T *param, float *master, const T *grad, float *m, float *v, size_t i, float b1,
                                          float b2, float eps, float decay, float step_size, float bc2_sqrt, float gs) {
    float g = to_f(grad[i]) * gs;
    float p = master ? master[i] : to_f(param[i]);
    p *= decay;
    float mi = m[i] * b1 + (1.0f - b1) * g;
    float vi = v[i] * b2 + (1.0f - b2) * g * g;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p -= step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    if (master) master[i] = p;
    param[i] = from_f<T>(p);
}

template <typename T> struct alignas(4 * sizeof(T)) Vec4 { T v[4]; };

/* Memory-bound (28 bytes per bf16 parameter, each touched once per step): four elements per
 * group with 16-byte fp32 and 8-byte bf16 accesses, two groups in flight per thread, streaming
 * (evict-first) cache hints; the n % 4 tail goes scalar. */
template <typename T>
__device__ __forceinline__ void adamw4(T *__restrict__ param, float *__restrict__ master, const T *__restrict__ grad,
                                       float *__restrict__ m, float *__restrict__ v, size_t i, float b1, float b2,
                                       float eps, float decay, float step_size, float bc2_sqrt, float gs) {
    Vec4<T> g4 = reinterpret_cast<const Vec4<T> *>(grad)[i], p4;
    float4 m4 = __ldcs(reinterpret_cast<const float4 *>(m) + i), v4 = __ldcs(reinterpret_cast<const float4 *>(v) + i), w4;
    if (master) w4 = __ldcs(reinterpret_cast<const float4 *>(master) + i);
    else {
        p4 = reinterpret_cast<const Vec4<T> *>(param)[i];
        w4 = make_float4(to_f(p4.v[0]), to_f(p4.v[1]), to_f(p4.v[2]), to_f(p4.v[3]));
    }
    float *mp = &m4.x, *vp = &v4.x, *wp = &w4.x;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float g = to_f(g4.v[k]) * gs, p = wp[k] * decay;
        float mi = mp[k] * b1 + (1.0f - b1) * g;
        float vi = vp[k] * b2 + (1.0f - b2) * g * g;
        p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        mp[k] = mi;
        vp[k] = vi;
        wp[k] = p;
        p4.v[k] = from_f<T>(p);
    }
    __stcs(reinterpret_cast<float4 *>(m) + i, m4);
    __stcs(reinterpret_cast<float4 *>(v) + i, v4);
    if (master) __stcs(reinterpret_cast<float4 *>(master) + i, w4);
    reinterpret_cast<Vec4<T> *>(param)[i] = p4;
}

template <typename T>
__global__ void adamw_kernel(T *__restrict__ param, float *__restrict__ master, const T *__restrict__ grad,
                             float *__restrict__ m, float *__restrict__ v, size_t n, float b1, float b2, float eps,
                             float decay, float step_size, float bc2_sqrt, float gs) {
    size_t n4 = n / 4, stride = (size_t)gridDim.x * blockDim.x, i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {
        adamw4(param, master, grad, m, v, i, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
        adamw4(param, master, grad, m, v, i + stride, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
    }
    if (i < n4) adamw4(param, master, grad, m, v, i, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
    if (blockIdx.x == 0)
        for (size_t j = n4 * 4 + threadIdx.x; j < n; j += blockDim.x)
            adamw_one(param, master, grad, m, v, j, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
}

template <typename T>
__global__ void adamw_scalar_kernel(T *param, float *master, const T *grad, float *m, float *v, size_t n, float b1,
                                    float b2, float eps, float decay, float step_size, float bc2_sqrt, float gs) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_one(param, master, grad, m, v, i, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
}

static bool al(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

extern "C" void glmk_adamw(glm_dtype dt, void *param, float *master, const void *grad, float *m, float *v, size_t n,
                           float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                           cudaStream_t st) {
    if (n == 0) return;
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), decay = 1.0f - lr * wd;
    size_t es = glm_dtype_size(dt);
    bool vec = al(param, 4 * es) && al(grad, 4 * es) && al(m, 16) && al(v, 16) && (!master || al(master, 16));
    GLMK_DISPATCH(dt, {
        if (vec)
            adamw_kernel<T><<<glmk_blocks(n / 4 + 1, 256, 132 * 16), 256, 0, st>>>(
                (T *)param, master, (const T *)grad, m, v, n, b1, b2, eps, decay, step_size, bc2_sqrt, grad_scale);
        else
            adamw_scalar_kernel<T><<<glmk_blocks(n, 256, 132 * 32), 256, 0, st>>>(
                (T *)param, master, (const T *)grad, m, v, n, b1, b2, eps, decay, step_size, bc2_sqrt, grad_scale);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- GaLore's steps */

/* backend.h adam_dir, in cpu_adam_dir's order of operations */
__global__ void adam_dir_kernel(float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(1.0f - b1, gi));
        float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(1.0f - b2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        dir[i] = mi / __fadd_rn(sqrtf(vi), eps);
    }
}

extern "C" void glmk_adam_dir(float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps,
                              cudaStream_t st) {
    if (n == 0) return;
    adam_dir_kernel<<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>(dir, g, m, v, n, b1, b2, eps);
    GLMK_CHECK_LAUNCH();
}

/* backend.h apply_dir */
template <typename T>
__global__ void apply_dir_kernel(T *param, float *master, const float *dir, size_t n, float alpha, float shrink) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float p = master ? master[i] : to_f(param[i]);
        p = __fadd_rn(p, __fmul_rn(alpha, dir[i]));
        p = __fadd_rn(p, __fmul_rn(shrink, p));
        if (master) master[i] = p;
        param[i] = from_f<T>(p);
    }
}

extern "C" void glmk_apply_dir(glm_dtype dt, void *param, float *master, const float *dir, size_t n, float alpha,
                               float shrink, cudaStream_t st) {
    if (n == 0) return;
    GLMK_DISPATCH(dt, { apply_dir_kernel<T><<<glmk_blocks(n, 256, 132 * 16), 256, 0, st>>>((T *)param, master, dir, n, alpha, shrink); });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- greedy choice */

/* One block per row: each thread keeps the first maximum of its strided elements, then the
 * block keeps the smallest index among equal maxima (torch.argmax's first maximum); any NaN or
 * infinity makes the row's answer 5 (glm_sample_next's rule). */
template <typename T>
__global__ void argmax_rows_kernel(int32_t *out, const T *x, int V) {
    const T *row = x + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int bi = -1, bad = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = to_f(row[j]);
        if (!isfinite(v)) bad = 1;
        else if (bi < 0 || v > best) { best = v; bi = j; }
    }
    __shared__ float sv[32];
    __shared__ int si[32], sb[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, best, o);
        int oi = __shfl_down_sync(0xffffffffu, bi, o), ob = __shfl_down_sync(0xffffffffu, bad, o);
        if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) { best = ov; bi = oi; }
        bad |= ob;
    }
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (lane == 0) { sv[w] = best; si[w] = bi; sb[w] = bad; }
    __syncthreads();
    if (w == 0) {
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : -1;
        bad = lane < nw ? sb[lane] : 0;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, best, o);
            int oi = __shfl_down_sync(0xffffffffu, bi, o), ob = __shfl_down_sync(0xffffffffu, bad, o);
            if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) { best = ov; bi = oi; }
            bad |= ob;
        }
        if (lane == 0) out[blockIdx.x] = bad ? (V > 5 ? 5 : 0) : (bi < 0 ? 0 : bi);
    }
}

extern "C" void glmk_argmax_rows(glm_dtype dt, int32_t *out, const void *x, int R, int V, cudaStream_t st) {
    if (R <= 0 || V <= 0) return;
    GLMK_DISPATCH(dt, argmax_rows_kernel<T><<<R, 1024, 0, st>>>(out, (const T *)x, V));
    GLMK_CHECK_LAUNCH();
}
