/* Attention for a few queries over many keys: decoding, one new token per row against a KV
 * cache of up to thousands of keys. The other kernels give each (query block, head) one thread
 * block, which for a single query leaves most of the GPU idle while it walks the keys. Here
 * each query's key range is cut into chunks of DEC_CHUNK keys, one block per (query, head,
 * chunk) walks them a warp per quarter and writes a partial result (max score,
 * sum of exponentials, weighted values, fp32), and a second kernel combines the chunks of each
 * query (split-key "flash-decoding"). Same contract as attention_fwd (backend.h): natural-log
 * lse of the scaled scores, out 0 and lse -inf for an empty key range. CPU twin:
 * cpu_attention_fwd. */
#include "backend/cuda/cuda_common.cuh"

#define DEC_CHUNK 64   /* keys per block: 16 per warp */
#define DEC_THREADS 128
#define DEC_MAXHD 128


/* grid (chunks, NH, B*Tq); part[(bi*NH + h)*S + s] = {max, sum, values[HD]} */
/* grid (chunks, NH, B*Tq); part[(bi*NH + h)*S + s] = {max, sum, values[HD]}. Each warp walks
 * its own DEC_CHUNK / 4 keys of the chunk with its own running max, sum and weighted values
 * (lane l holds head dims l*DPL .. l*DPL+DPL-1), DEC_UNROLL keys at a time with all their loads
 * issued first; the four warps are merged once at the end. No barrier inside the key loop. */
#define DEC_UNROLL 4
template <typename T, int DPL>
__global__ void __launch_bounds__(DEC_THREADS) decode_partial(float *part, glm_qkv_view q, glm_qkv_view k,
                                                               glm_qkv_view v, const int32_t *lo, const int32_t *hi,
                                                               int Tq, int NH, int HD, float scale, int S) {
    constexpr int NW = DEC_THREADS / 32, KPW = DEC_CHUNK / NW;
    __shared__ float wm[NW], wl[NW], wacc[NW][DEC_MAXHD];
    int s = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, b = bi / Tq, i = bi - b * Tq;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int c0 = lo[bi] + s * DEC_CHUNK, c1 = min(hi[bi], c0 + DEC_CHUNK), n = c1 - c0;
    float *dst = part + ((size_t)bi * NH + h) * S * (HD + 2) + (size_t)s * (HD + 2);
    if (n <= 0) { /* past this query's range: an empty partial (zero values: the combine reads them) */
        for (int d = threadIdx.x; d < HD; d += DEC_THREADS) dst[2 + d] = 0.0f;
        if (threadIdx.x == 0) { dst[0] = -INFINITY; dst[1] = 0.0f; }
        return;
    }
    float qv[DPL], acc[DPL];
    const T *qr = vrow<T>(q, b, i, h) + lane * DPL;
#pragma unroll
    for (int e = 0; e < DPL; e++) { qv[e] = to_f(qr[e]) * scale; acc[e] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    int r0 = w * KPW; /* this warp's keys: c0 + r0 .. c0 + r0 + KPW - 1 */
    for (int j0 = 0; j0 < KPW; j0 += DEC_UNROLL) {
        float kf[DEC_UNROLL][DPL], vf[DEC_UNROLL][DPL], sc[DEC_UNROLL];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            int r = r0 + j0 + u;
            bool ok = r < n;
            const T *kr = vrow<T>(k, b, c0 + (ok ? r : 0), h) + lane * DPL;
            const T *vr = vrow<T>(v, b, c0 + (ok ? r : 0), h) + lane * DPL;
#pragma unroll
            for (int e = 0; e < DPL; e++) { kf[u][e] = to_f(kr[e]); vf[u][e] = to_f(vr[e]); }
        }
        float mn = m;
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            float dot = 0;
#pragma unroll
            for (int e = 0; e < DPL; e++) dot += qv[e] * kf[u][e];
            dot = warp_sum(dot);
            sc[u] = r0 + j0 + u < n ? dot : -INFINITY;
            mn = fmaxf(mn, sc[u]);
        }
        if (mn == -INFINITY) continue; /* nothing visible in this group */
        float corr = expf(m - mn);
        l *= corr;
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[e] *= corr;
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            float p = sc[u] == -INFINITY ? 0.0f : expf(sc[u] - mn);
            l += p;
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[e] += p * vf[u][e];
        }
        m = mn;
    }
    if (lane == 0) { wm[w] = m; wl[w] = l; }
#pragma unroll
    for (int e = 0; e < DPL; e++) wacc[w][lane * DPL + e] = acc[e];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int x = 0; x < NW; x++) M = fmaxf(M, wm[x]);
    for (int d = threadIdx.x; d < HD; d += DEC_THREADS) {
        float a = 0;
#pragma unroll
        for (int x = 0; x < NW; x++)
            if (wm[x] > -INFINITY) a += wacc[x][d] * expf(wm[x] - M);
        dst[2 + d] = a;
    }
    if (threadIdx.x == 0) {
        float L = 0;
        for (int x = 0; x < NW; x++)
            if (wm[x] > -INFINITY) L += wl[x] * expf(wm[x] - M);
        dst[0] = M;
        dst[1] = L;
    }
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
        dim3 grid(S, NH, B * Tq);
        switch (HD / 32) {
        case 1: decode_partial<T, 1><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S); break;
        case 2: decode_partial<T, 2><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S); break;
        case 3: decode_partial<T, 3><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S); break;
        default: decode_partial<T, 4><<<grid, DEC_THREADS, 0, st>>>(scratch, q, k, v, lo, hi, Tq, NH, HD, scale, S); break;
        }
        GLMK_CHECK_LAUNCH();
        decode_combine<T><<<dim3(NH, B * Tq), DEC_GROUPS * HD, sizeof(float) * (S + DEC_GROUPS * HD), st>>>(
            (T *)out, lse, scratch, Tq, NH, HD, S);
    });
    GLMK_CHECK_LAUNCH();
}
