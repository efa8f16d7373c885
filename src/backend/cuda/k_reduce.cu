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
extern "C" size_t glmk_colsum_scratch(int N, int C) { return (size_t)colsum_rb(N, C) * C; }

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

extern "C" void glmk_layernorm_fwd(glm_dtype dt, void *out, float *mean, float *rstd, const void *x, const void *w,
                                   const void *b, int N, int C, float eps, cudaStream_t st) {
    if (N <= 0) return;
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, layernorm_fwd_kernel<T><<<N, threads, 0, st>>>((T *)out, mean, rstd, (const T *)x, (const T *)w, (const T *)b, C, eps));
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
    int rb = colsum_rb(N, C), rows_per = (N + rb - 1) / rb;
    float *p1 = scratch, *p2 = scratch + (size_t)rb * C;
    dim3 g((C + 255) / 256, rb);
    int threads = C >= 2048 ? 256 : C >= 512 ? 128 : 32;
    GLMK_DISPATCH(dt, {
        /* parameter gradients first: dx may overwrite dout */
        colsum_partial_kernel<T, true><<<g, 256, 0, st>>>(p1, p2, (const T *)dout, (const T *)x, mean, rstd, N, C, rows_per);
        colsum_final_kernel<T><<<(C + 255) / 256, 256, 0, st>>>((T *)dw, (T *)db, p1, p2, rb, C);
        layernorm_dx_kernel<T><<<N, threads, 0, st>>>((T *)dx, (const T *)dout, (const T *)x, (const T *)w, mean, rstd, C);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- cross entropy */

/* One block per row: an online max/sum pass, the loss, then (dscale != 0) the gradient written
 * over the logits. fp32 throughout; the target's entry is computed and stored by one thread. */
template <typename T>
__global__ void cross_entropy_kernel(T *logits, float *losses, const int32_t *targets, int V, float dscale) {
    __shared__ float sh[32];
    T *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY, s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = to_f(l[j]);
        if (v > m) { s = s * expf(m - v) + 1.0f; m = v; }
        else s += expf(v - m);
    }
    float M = block_max(m, sh);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), sh);
    float lse = M + logf(S);
    int t = targets[blockIdx.x];
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_f(l[t]);
    if (dscale == 0.0f) return;
    __syncthreads(); /* l[t] is read above before any thread overwrites it */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = dscale * expf(to_f(l[j]) - lse);
        if (j == t) g -= dscale;
        l[j] = from_f<T>(g);
    }
}

extern "C" void glmk_cross_entropy(glm_dtype dt, void *logits, float *losses, const int32_t *targets, int R, int V,
                                   float dscale, cudaStream_t st) {
    if (R <= 0) return;
    int threads = V >= 8192 ? 1024 : V >= 1024 ? 256 : 32;
    GLMK_DISPATCH(dt, cross_entropy_kernel<T><<<R, threads, 0, st>>>((T *)logits, losses, targets, V, dscale));
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- sum of squares */

/* Fixed grid and fixed element-to-thread mapping, double accumulation: the same input gives
 * the same result on every run and every GPU. */
template <typename T>
__global__ void sumsq_partial_kernel(double *partial, const T *x, size_t n) {
    __shared__ double sh[256];
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double v = to_f(x[i]);
        s += v * v;
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
    GLMK_DISPATCH(dt, sumsq_partial_kernel<T><<<GLMK_SUMSQ_BLOCKS, 256, 0, st>>>(partial, (const T *)x, n));
    sumsq_final_kernel<<<1, 32, 0, st>>>(result, partial, GLMK_SUMSQ_BLOCKS);
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

template <typename T>
__global__ void adamw_kernel(T *param, float *master, const T *grad, float *m, float *v, size_t n, float b1, float b2,
                             float eps, float decay, float step_size, float bc2_sqrt, float gs) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        adamw_one(param, master, grad, m, v, i, b1, b2, eps, decay, step_size, bc2_sqrt, gs);
}

extern "C" void glmk_adamw(glm_dtype dt, void *param, float *master, const void *grad, float *m, float *v, size_t n,
                           float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                           cudaStream_t st) {
    if (n == 0) return;
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), decay = 1.0f - lr * wd;
    GLMK_DISPATCH(dt, adamw_kernel<T><<<glmk_blocks(n, 256, 132 * 32), 256, 0, st>>>(
        (T *)param, master, (const T *)grad, m, v, n, b1, b2, eps, decay, step_size, bc2_sqrt, grad_scale));
    GLMK_CHECK_LAUNCH();
}
