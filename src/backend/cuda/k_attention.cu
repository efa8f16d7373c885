/* Attention with per-query key ranges [lo, hi), SIMT version: any head size up to 256, any
 * storage type, fp32 math. The fp32 backend and odd shapes use it; bf16/fp16 at head size
 * 64/128 take the tensor-core kernels of k_flash.cu. Flash-attention structure: scores live
 * only in registers, key/value (or query/dout) tiles of 32 rows are staged in shared memory,
 * the forward saves the log-sum-exp, the backward recomputes probabilities from it and needs
 * no atomics (dq per query, dk/dv per key), so results are deterministic.
 * CPU twins: cpu_attention_fwd / cpu_attention_bwd. */
#include "backend/cuda/cuda_common.cuh"

#define SA_TILE 32  /* rows per staged tile: one per lane */
#define SA_WARPS 8  /* rows owned per block: one per warp */
#define SA_MAXR 8   /* head dims per lane: HD <= 256 */


/* Stages rows t0..t0+31 of a view (zeros past `end`) as floats, row stride `ld`. */
template <typename T>
__device__ __forceinline__ void stage(float *dst, int ld, const glm_qkv_view &v, int b, int h, int t0, int end, int HD) {
    for (int e = threadIdx.x; e < SA_TILE * HD; e += blockDim.x) {
        int r = e / HD, d = e - r * HD, t = t0 + r;
        dst[r * ld + d] = t < end ? to_f(vrow<T>(v, b, t, h)[d]) : 0.0f;
    }
}

/* Union of the key ranges of this block's rows: lo = min, hi = max over valid rows. */
__device__ __forceinline__ void block_range(const int32_t *lo, const int32_t *hi, int base, int row0, int nrows,
                                            int *klo, int *khi) {
    __shared__ int slo[SA_WARPS], shi[SA_WARPS];
    if (threadIdx.x < SA_WARPS) {
        int i = row0 + threadIdx.x;
        bool ok = i < nrows && lo[base + i] < hi[base + i];
        slo[threadIdx.x] = ok ? lo[base + i] : 0x7fffffff;
        shi[threadIdx.x] = ok ? hi[base + i] : -1;
    }
    __syncthreads();
    int a = 0x7fffffff, z = -1;
    for (int w = 0; w < SA_WARPS; w++) { a = min(a, slo[w]); z = max(z, shi[w]); }
    *klo = a;
    *khi = z;
}

/* ---------------------------------------------------------------- forward */

template <typename T>
__global__ void __launch_bounds__(256) attn_fwd_simt(T *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                                                     const int32_t *lo, const int32_t *hi, int Tq, int Tk, int NH,
                                                     int HD, float scale) {
    extern __shared__ float smem[];
    float *Ks = smem, *Vs = Ks + SA_TILE * (HD + 1), *Qs = Vs + SA_TILE * HD;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.z, h = blockIdx.y;
    int i = blockIdx.x * SA_WARPS + w;
    bool valid = i < Tq;
    int qlo = valid ? lo[b * Tq + i] : 0, qhi = valid ? hi[b * Tq + i] : 0;
    int klo, khi;
    block_range(lo, hi, b * Tq, blockIdx.x * SA_WARPS, Tq, &klo, &khi);
    if (valid)
        for (int d = lane; d < HD; d += 32) Qs[w * HD + d] = to_f(vrow<T>(q, b, i, h)[d]);
    float o[SA_MAXR] = {0}, m = -INFINITY, l = 0;
    for (int t0 = klo; t0 < khi; t0 += SA_TILE) {
        __syncthreads(); /* previous tile fully used (and Qs written) */
        stage<T>(Ks, HD + 1, k, b, h, t0, khi, HD);
        stage<T>(Vs, HD, v, b, h, t0, khi, HD);
        __syncthreads();
        if (!valid) continue;
        int j = t0 + lane;
        float s = -INFINITY;
        if (j >= qlo && j < qhi) {
            float dot = 0;
            for (int d = 0; d < HD; d++) dot += Qs[w * HD + d] * Ks[lane * (HD + 1) + d];
            s = dot * scale;
        }
        float mn = fmaxf(m, warp_max(s));
        if (mn == -INFINITY) continue; /* no visible key yet */
        float corr = expf(m - mn), p = s == -INFINITY ? 0.0f : expf(s - mn);
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int r = 0; r < SA_MAXR; r++) o[r] *= corr;
        for (int jj = 0; jj < SA_TILE; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            if (pj == 0.0f) continue;
#pragma unroll
            for (int r = 0; r < SA_MAXR; r++)
                if (lane + 32 * r < HD) o[r] += pj * Vs[jj * HD + lane + 32 * r];
        }
        m = mn;
    }
    if (!valid) return;
    float inv = l > 0 ? 1.0f / l : 0.0f;
    T *orow = out + ((size_t)b * Tq + i) * NH * HD + (size_t)h * HD;
#pragma unroll
    for (int r = 0; r < SA_MAXR; r++)
        if (lane + 32 * r < HD) orow[lane + 32 * r] = from_f<T>(o[r] * inv);
    if (lane == 0) lse[((size_t)b * NH + h) * Tq + i] = l > 0 ? m + logf(l) : -INFINITY;
}

static void set_smem(const void *fn, size_t bytes) {
    if (bytes > 48 * 1024) GLMK_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static void check_hd(int HD) {
    if (HD > 32 * SA_MAXR)
        glm_cuda_check_at(cudaErrorInvalidValue, "attention: head size above 256 is not supported", __FILE__, __LINE__);
}

extern "C" void glmk_attention_fwd_simt(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k,
                                        glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk,
                                        int NH, int HD, float scale, cudaStream_t st) {
    if (B <= 0 || Tq <= 0) return;
    check_hd(HD);
    size_t smem = sizeof(float) * (SA_TILE * (HD + 1) + SA_TILE * HD + SA_WARPS * HD);
    dim3 grid((Tq + SA_WARPS - 1) / SA_WARPS, NH, B);
    GLMK_DISPATCH(dt, {
        set_smem((const void *)attn_fwd_simt<T>, smem);
        attn_fwd_simt<T><<<grid, 32 * SA_WARPS, smem, st>>>((T *)out, lse, q, k, v, lo, hi, Tq, Tk, NH, HD, scale);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- backward */

/* D[b,h,i] = dout . out over the head dims: one warp per (b, i, h). */
template <typename T>
__global__ void rowdot_kernel(float *D, const T *dout, const T *out, int B, int Tq, int NH, int HD) {
    size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (size_t)B * Tq * NH) return;
    int h = (int)(row % NH);
    size_t bi = row / NH;
    const T *a = dout + row * HD, *c = out + row * HD;
    float s = 0;
    for (int d = lane; d < HD; d += 32) s += to_f(a[d]) * to_f(c[d]);
    s = warp_sum(s);
    int b = (int)(bi / Tq), i = (int)(bi % Tq);
    if (lane == 0) D[((size_t)b * NH + h) * Tq + i] = s;
}

/* The same with a 16-byte pack a thread, tpr = HD / pack threads a row (a power of two <= 32). */
template <typename T>
__global__ void rowdot_vec_kernel(float *D, const T *dout, const T *out, int B, int Tq, int NH, int HD, int tpr) {
    constexpr int P = Pack<T>::N;
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, row = t / tpr, rows = (size_t)B * Tq * NH;
    int k = (int)(t % tpr);
    float s = 0;
    if (row < rows) {
        Pack<T> a = ld_pack(dout + row * HD + k * P), c = ld_pack(out + row * HD + k * P);
#pragma unroll
        for (int e = 0; e < P; e++) s += to_f(a.v[e]) * to_f(c.v[e]);
    }
    for (int o = tpr / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (k == 0 && row < rows) {
        int h = (int)(row % NH);
        size_t bi = row / NH;
        int b = (int)(bi / Tq), i = (int)(bi % Tq);
        D[((size_t)b * NH + h) * Tq + i] = s;
    }
}

extern "C" void glmk_attn_rowdot(glm_dtype dt, float *D, const void *dout, const void *out, int B, int Tq, int NH,
                                 int HD, cudaStream_t st) {
    size_t rows = (size_t)B * Tq * NH;
    if (rows == 0) return;
    int P = (int)(16 / glm_dtype_size(dt)), tpr = HD / P;
    if (HD % P == 0 && tpr <= 32 && (tpr & (tpr - 1)) == 0 && aligned16(dout) && aligned16(out)) {
        size_t threads = rows * tpr;
        GLMK_DISPATCH(dt, rowdot_vec_kernel<T><<<(unsigned)((threads + 255) / 256), 256, 0, st>>>(D, (const T *)dout, (const T *)out, B, Tq, NH, HD, tpr));
    } else {
        GLMK_DISPATCH(dt, rowdot_kernel<T><<<(unsigned)((rows + 7) / 8), 256, 0, st>>>(D, (const T *)dout, (const T *)out, B, Tq, NH, HD));
    }
    GLMK_CHECK_LAUNCH();
}

/* dq: one warp per query, key/value tiles staged; ds = p (dp - D) scale, dq = sum ds k. */
template <typename T>
__global__ void __launch_bounds__(256) attn_dq_simt(glm_qkv_view dq, const T *dout, const float *lse, const float *D,
                                                    glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *lo,
                                                    const int32_t *hi, int Tq, int Tk, int NH, int HD, float scale) {
    extern __shared__ float smem[];
    float *Ks = smem, *Vs = Ks + SA_TILE * (HD + 1), *Qs = Vs + SA_TILE * (HD + 1), *Os = Qs + SA_WARPS * HD;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.z, h = blockIdx.y;
    int i = blockIdx.x * SA_WARPS + w;
    bool valid = i < Tq;
    int qlo = valid ? lo[b * Tq + i] : 0, qhi = valid ? hi[b * Tq + i] : 0;
    size_t st = ((size_t)b * NH + h) * Tq + i;
    float L = valid ? lse[st] : 0, Di = valid ? D[st] : 0;
    int klo, khi;
    block_range(lo, hi, b * Tq, blockIdx.x * SA_WARPS, Tq, &klo, &khi);
    if (valid)
        for (int d = lane; d < HD; d += 32) {
            Qs[w * HD + d] = to_f(vrow<T>(q, b, i, h)[d]);
            Os[w * HD + d] = to_f(dout[((size_t)b * Tq + i) * NH * HD + (size_t)h * HD + d]);
        }
    float acc[SA_MAXR] = {0};
    for (int t0 = klo; t0 < khi; t0 += SA_TILE) {
        __syncthreads();
        stage<T>(Ks, HD + 1, k, b, h, t0, khi, HD);
        stage<T>(Vs, HD + 1, v, b, h, t0, khi, HD);
        __syncthreads();
        if (!valid) continue;
        int j = t0 + lane;
        float ds = 0;
        if (j >= qlo && j < qhi) {
            float s = 0, dp = 0;
            for (int d = 0; d < HD; d++) {
                s += Qs[w * HD + d] * Ks[lane * (HD + 1) + d];
                dp += Os[w * HD + d] * Vs[lane * (HD + 1) + d];
            }
            float p = expf(s * scale - L);
            ds = p * (dp - Di) * scale;
        }
        for (int jj = 0; jj < SA_TILE; jj++) {
            float dj = __shfl_sync(0xffffffffu, ds, jj);
            if (dj == 0.0f) continue;
#pragma unroll
            for (int r = 0; r < SA_MAXR; r++)
                if (lane + 32 * r < HD) acc[r] += dj * Ks[jj * (HD + 1) + lane + 32 * r];
        }
    }
    if (!valid) return;
    T *row = (T *)dq.base + b * dq.batch_stride + (long)i * dq.tok_stride + h * dq.head_stride;
#pragma unroll
    for (int r = 0; r < SA_MAXR; r++)
        if (lane + 32 * r < HD) row[lane + 32 * r] = from_f<T>(acc[r]);
}

/* dk, dv: one warp per key, query/dout tiles staged with their lse, D and ranges. */
template <typename T>
__global__ void __launch_bounds__(256) attn_dkv_simt(glm_qkv_view dk, glm_qkv_view dv, const T *dout, const float *lse,
                                                     const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                                                     const int32_t *lo, const int32_t *hi, int Tq, int Tk, int NH,
                                                     int HD, float scale) {
    extern __shared__ float smem[];
    float *Qs = smem, *Os = Qs + SA_TILE * (HD + 1), *Kw = Os + SA_TILE * (HD + 1), *Vw = Kw + SA_WARPS * HD;
    float *Ls = Vw + SA_WARPS * HD, *Ds = Ls + SA_TILE;
    int *los = (int *)(Ds + SA_TILE), *his = los + SA_TILE;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, b = blockIdx.z, h = blockIdx.y;
    int j = blockIdx.x * SA_WARPS + w;
    bool valid = j < Tk;
    if (valid)
        for (int d = lane; d < HD; d += 32) {
            Kw[w * HD + d] = to_f(vrow<T>(k, b, j, h)[d]);
            Vw[w * HD + d] = to_f(vrow<T>(v, b, j, h)[d]);
        }
    float ak[SA_MAXR] = {0}, av[SA_MAXR] = {0};
    for (int i0 = 0; i0 < Tq; i0 += SA_TILE) {
        __syncthreads();
        for (int e = threadIdx.x; e < SA_TILE * HD; e += blockDim.x) {
            int r = e / HD, d = e - r * HD, i = i0 + r;
            bool in = i < Tq;
            Qs[r * (HD + 1) + d] = in ? to_f(vrow<T>(q, b, i, h)[d]) : 0.0f;
            Os[r * (HD + 1) + d] = in ? to_f(dout[((size_t)b * Tq + i) * NH * HD + (size_t)h * HD + d]) : 0.0f;
        }
        if (threadIdx.x < SA_TILE) {
            int i = i0 + threadIdx.x;
            bool in = i < Tq;
            size_t st = ((size_t)b * NH + h) * Tq + i;
            Ls[threadIdx.x] = in ? lse[st] : 0;
            Ds[threadIdx.x] = in ? D[st] : 0;
            los[threadIdx.x] = in ? lo[b * Tq + i] : 0;
            his[threadIdx.x] = in ? hi[b * Tq + i] : 0;
        }
        __syncthreads();
        if (!valid) continue;
        float p = 0, ds = 0;
        if (j >= los[lane] && j < his[lane]) {
            float s = 0, dp = 0;
            for (int d = 0; d < HD; d++) {
                s += Qs[lane * (HD + 1) + d] * Kw[w * HD + d];
                dp += Os[lane * (HD + 1) + d] * Vw[w * HD + d];
            }
            p = expf(s * scale - Ls[lane]);
            ds = p * (dp - Ds[lane]) * scale;
        }
        for (int ii = 0; ii < SA_TILE; ii++) {
            float pi = __shfl_sync(0xffffffffu, p, ii), di = __shfl_sync(0xffffffffu, ds, ii);
            if (pi == 0.0f && di == 0.0f) continue;
#pragma unroll
            for (int r = 0; r < SA_MAXR; r++)
                if (lane + 32 * r < HD) {
                    av[r] += pi * Os[ii * (HD + 1) + lane + 32 * r];
                    ak[r] += di * Qs[ii * (HD + 1) + lane + 32 * r];
                }
        }
    }
    if (!valid) return;
    T *rk = (T *)dk.base + b * dk.batch_stride + (long)j * dk.tok_stride + h * dk.head_stride;
    T *rv = (T *)dv.base + b * dv.batch_stride + (long)j * dv.tok_stride + h * dv.head_stride;
#pragma unroll
    for (int r = 0; r < SA_MAXR; r++)
        if (lane + 32 * r < HD) {
            rk[lane + 32 * r] = from_f<T>(ak[r]);
            rv[lane + 32 * r] = from_f<T>(av[r]);
        }
}

extern "C" void glmk_attention_bwd_simt(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv,
                                        const void *dout, const float *lse, const float *D, glm_qkv_view q,
                                        glm_qkv_view k, glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B,
                                        int Tq, int Tk, int NH, int HD, float scale, int parts, cudaStream_t st) {
    if (B <= 0) return;
    check_hd(HD);
    size_t smem_q = sizeof(float) * (2 * SA_TILE * (HD + 1) + 2 * SA_WARPS * HD);
    size_t smem_kv = smem_q + sizeof(float) * 4 * SA_TILE;
    dim3 gq((Tq + SA_WARPS - 1) / SA_WARPS, NH, B), gk((Tk + SA_WARPS - 1) / SA_WARPS, NH, B);
    GLMK_DISPATCH(dt, {
        set_smem((const void *)attn_dq_simt<T>, smem_q);
        set_smem((const void *)attn_dkv_simt<T>, smem_kv);
        if (Tq > 0 && (parts & GLMK_ATTN_DQ)) attn_dq_simt<T><<<gq, 32 * SA_WARPS, smem_q, st>>>(dq, (const T *)dout, lse, D, q, k, v, lo, hi, Tq, Tk, NH, HD, scale);
        if (Tk > 0 && (parts & GLMK_ATTN_DKV)) attn_dkv_simt<T><<<gk, 32 * SA_WARPS, smem_kv, st>>>(dk, dv, (const T *)dout, lse, D, q, k, v, lo, hi, Tq, Tk, NH, HD, scale);
    });
    GLMK_CHECK_LAUNCH();
}
