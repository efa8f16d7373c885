/* Attention for a few queries over many keys: decoding, one new token per row against a KV
 * cache of up to thousands of keys. The other kernels give each (query block, head) one thread
 * block, which for a single query leaves most of the GPU idle while it walks the keys. Here
 * each query's key range is cut into chunks of DEC_CHUNK keys, one block per (query, head,
 * chunk) stages its keys and values in shared memory and writes a partial result (max score,
 * sum of exponentials, weighted values, fp32), and a second kernel combines the chunks of each
 * query (split-key "flash-decoding"). Same contract as attention_fwd (backend.h): natural-log
 * lse of the scaled scores, out 0 and lse -inf for an empty key range. CPU twin:
 * cpu_attention_fwd. */
#include "backend/cuda/cuda_common.cuh"

#define DEC_CHUNK 32   /* keys per block */
#define DEC_THREADS 128
#define DEC_MAXHD 128

template <typename T>
__device__ __forceinline__ const T *drow(const glm_qkv_view &v, int b, int t, int h) {
    return (const T *)v.base + b * v.batch_stride + (long)t * v.tok_stride + h * v.head_stride;
}

/* grid (chunks, NH, B*Tq); part[(bi*NH + h)*S + s] = {max, sum, values[HD]} */
/* 16-byte pieces of a row: VEC elements of T */
template <typename T> struct vec_of { static constexpr int n = 16 / sizeof(T); };

__device__ __forceinline__ void unpack(const uint4 &u, float *dst, const float *) {
    dst[0] = __uint_as_float(u.x); dst[1] = __uint_as_float(u.y); dst[2] = __uint_as_float(u.z); dst[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack(const uint4 &u, float *dst, const bf16 *) {
    const bf16 *e = (const bf16 *)&u;
#pragma unroll
    for (int j = 0; j < 8; j++) dst[j] = __bfloat162float(e[j]);
}
__device__ __forceinline__ void unpack(const uint4 &u, float *dst, const f16 *) {
    const f16 *e = (const f16 *)&u;
#pragma unroll
    for (int j = 0; j < 8; j++) dst[j] = __half2float(e[j]);
}

/* The chunk's n keys and values into shared memory as floats. With VEC16 every row starts on a
 * 16-byte boundary: each thread issues all its 16-byte loads before it stores any (the loads
 * are in flight together instead of one load's latency per element). */
template <typename T, bool VEC16>
__device__ __forceinline__ void stage_chunk(float (*Ks)[DEC_MAXHD + 1], float (*Vs)[DEC_MAXHD], const glm_qkv_view &k,
                                            const glm_qkv_view &v, int b, int h, int c0, int n, int HD) {
    if (!VEC16) {
        for (int e = threadIdx.x; e < n * HD; e += DEC_THREADS) {
            int r = e / HD, d = e - r * HD;
            Ks[r][d] = to_f(drow<T>(k, b, c0 + r, h)[d]);
            Vs[r][d] = to_f(drow<T>(v, b, c0 + r, h)[d]);
        }
        return;
    }
    constexpr int VEC = vec_of<T>::n, MAXV = DEC_CHUNK * DEC_MAXHD / VEC / DEC_THREADS;
    int vpr = HD / VEC, nv = n * vpr;
    uint4 kr[MAXV], vr[MAXV];
#pragma unroll
    for (int u = 0; u < MAXV; u++) {
        int e = threadIdx.x + u * DEC_THREADS;
        if (e < nv) {
            int r = e / vpr, c = e - r * vpr;
            kr[u] = *(const uint4 *)(drow<T>(k, b, c0 + r, h) + c * VEC);
            vr[u] = *(const uint4 *)(drow<T>(v, b, c0 + r, h) + c * VEC);
        }
    }
#pragma unroll
    for (int u = 0; u < MAXV; u++) {
        int e = threadIdx.x + u * DEC_THREADS;
        if (e < nv) {
            int r = e / vpr, c = e - r * vpr;
            float f[VEC];
            unpack(kr[u], f, (const T *)nullptr);
#pragma unroll
            for (int j = 0; j < VEC; j++) Ks[r][c * VEC + j] = f[j];
            unpack(vr[u], f, (const T *)nullptr);
#pragma unroll
            for (int j = 0; j < VEC; j++) Vs[r][c * VEC + j] = f[j];
        }
    }
}

/* grid (chunks, NH, B*Tq); part[(bi*NH + h)*S + s] = {max, sum, values[HD]} */
template <typename T, bool VEC16>
__global__ void __launch_bounds__(DEC_THREADS) decode_partial(float *part, glm_qkv_view q, glm_qkv_view k,
                                                               glm_qkv_view v, const int32_t *lo, const int32_t *hi,
                                                               int Tq, int NH, int HD, float scale, int S) {
    __shared__ float Ks[DEC_CHUNK][DEC_MAXHD + 1], Vs[DEC_CHUNK][DEC_MAXHD], Qs[DEC_MAXHD], P[DEC_CHUNK], red[32];
    int s = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, b = bi / Tq, i = bi - b * Tq;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int c0 = lo[bi] + s * DEC_CHUNK, c1 = min(hi[bi], c0 + DEC_CHUNK), n = c1 - c0;
    float *dst = part + ((size_t)bi * NH + h) * S * (HD + 2) + (size_t)s * (HD + 2);
    if (n <= 0) { /* past this query's range: an empty partial (zero values: the combine reads them) */
        for (int d = threadIdx.x; d < HD; d += DEC_THREADS) dst[2 + d] = 0.0f;
        if (threadIdx.x == 0) { dst[0] = -INFINITY; dst[1] = 0.0f; }
        return;
    }
    const T *qr = drow<T>(q, b, i, h);
    for (int d = threadIdx.x; d < HD; d += DEC_THREADS) Qs[d] = to_f(qr[d]);
    stage_chunk<T, VEC16>(Ks, Vs, k, v, b, h, c0, n, HD);
    __syncthreads();
    /* scores: one warp per key, the head dims over the lanes */
    for (int r = w; r < n; r += DEC_THREADS / 32) {
        float dot = 0;
        for (int d = lane; d < HD; d += 32) dot += Qs[d] * Ks[r][d];
        dot = warp_sum(dot);
        if (lane == 0) P[r] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int r = 0; r < n; r++) m = fmaxf(m, P[r]);
    __syncthreads(); /* every thread has read the scores before they turn into weights */
    if (threadIdx.x < n) P[threadIdx.x] = expf(P[threadIdx.x] - m);
    __syncthreads();
    float l = block_sum(threadIdx.x < n ? P[threadIdx.x] : 0.0f, red);
    for (int d = threadIdx.x; d < HD; d += DEC_THREADS) {
        float acc = 0;
        for (int r = 0; r < n; r++) acc += P[r] * Vs[r][d];
        dst[2 + d] = acc;
    }
    if (threadIdx.x == 0) { dst[0] = m; dst[1] = l; }
}

/* grid (NH, B*Tq), DEC_GROUPS * HD threads (HD a multiple of 32), S + DEC_GROUPS * HD floats of
 * dynamic shared memory: the chunks of one query and head. The chunk maxima and weights are
 * read by all threads at once; each head dim's sum over the chunks is split over DEC_GROUPS
 * thread groups (chunks s = g, g + G, ...) so many loads are in flight (one thread walking all
 * chunks would wait out each load's latency in turn), then the groups' sums are added in a
 * fixed order: deterministic. */
#define DEC_GROUPS 4
template <typename T>
__global__ void __launch_bounds__(DEC_GROUPS * DEC_MAXHD) decode_combine(T *out, float *lse, const float *part, int Tq,
                                                                         int NH, int HD, int S) {
    extern __shared__ float wsh[]; /* [S] chunk weights, then [DEC_GROUPS][HD] partial sums */
    __shared__ float red[32];
    int h = blockIdx.x, bi = blockIdx.y, t = threadIdx.x, g = t / HD, d = t - g * HD;
    const float *p = part + ((size_t)bi * NH + h) * S * (HD + 2);
    float mloc = -INFINITY;
    for (int s = t; s < S; s += blockDim.x) mloc = fmaxf(mloc, p[(size_t)s * (HD + 2)]);
    float M = block_max(mloc, red);
    float lloc = 0;
    for (int s = t; s < S; s += blockDim.x) {
        float ms = p[(size_t)s * (HD + 2)], w = ms == -INFINITY ? 0.0f : expf(ms - M);
        wsh[s] = w;
        lloc += w * p[(size_t)s * (HD + 2) + 1];
    }
    float L = block_sum(lloc, red); /* its barriers also publish wsh */
    float acc = 0;
#pragma unroll 8
    for (int s = g; s < S; s += DEC_GROUPS) acc += wsh[s] * p[(size_t)s * (HD + 2) + 2 + d];
    float *sums = wsh + S;
    sums[g * HD + d] = acc;
    __syncthreads();
    if (g != 0) return;
    acc = 0;
    for (int k = 0; k < DEC_GROUPS; k++) acc += sums[k * HD + d];
    int b = bi / Tq, i = bi - b * Tq;
    out[(size_t)bi * NH * HD + (size_t)h * HD + d] = from_f<T>(L > 0 ? acc / L : 0.0f);
    if (d == 0) lse[((size_t)b * NH + h) * Tq + i] = L > 0 ? M + logf(L) : -INFINITY;
}

extern "C" int glmk_decode_attention_supported(int Tq, int Tk, int HD) {
    return Tq <= 4 && Tk >= 2 * DEC_CHUNK && Tk <= 10240 * DEC_CHUNK && HD <= DEC_MAXHD && HD % 32 == 0;
}

extern "C" size_t glmk_decode_attention_scratch(int B, int Tq, int Tk, int NH, int HD) {
    size_t S = (size_t)(Tk + DEC_CHUNK - 1) / DEC_CHUNK;
    return (size_t)B * Tq * NH * S * (HD + 2) * sizeof(float);
}

extern "C" void glmk_decode_attention(glm_dtype dt, void *out, float *lse, float *scratch, glm_qkv_view q,
                                      glm_qkv_view k, glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B,
                                      int Tq, int Tk, int NH, int HD, float scale, cudaStream_t st) {
    if (B <= 0 || Tq <= 0) return;
    int S = (Tk + DEC_CHUNK - 1) / DEC_CHUNK;
    GLMK_DISPATCH(dt, {
        /* 16-byte rows: the bases aligned and every stride a whole number of 16-byte pieces */
        long vec = 16 / (long)sizeof(T);
        bool v16 = aligned16(k.base) && aligned16(v.base) && HD % vec == 0 && k.batch_stride % vec == 0 &&
                   k.tok_stride % vec == 0 && k.head_stride % vec == 0 && v.batch_stride % vec == 0 &&
                   v.tok_stride % vec == 0 && v.head_stride % vec == 0;
        dim3 grid(S, NH, B * Tq);
        if (v16) decode_partial<T, true><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S);
        else decode_partial<T, false><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S);
        GLMK_CHECK_LAUNCH();
        decode_combine<T><<<dim3(NH, B * Tq), DEC_GROUPS * HD, sizeof(float) * (S + DEC_GROUPS * HD), st>>>(
            (T *)out, lse, scratch, Tq, NH, HD, S);
    });
    GLMK_CHECK_LAUNCH();
}
