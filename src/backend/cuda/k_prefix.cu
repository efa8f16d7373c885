/* P-Tuning v2 kernels: the per-layer prefix keys/values joined with the sequence's (prefix_kv),
 * its backward (prefix_kv_bwd) and tanh for the prefix projection MLP. CPU twins in
 * backend/cpu/cpu_ops.c; semantics in backend/backend.h. Dropout uses the counter-based mask
 * of backend/mask_hash.h, so both backends drop the same elements. Memory-bound: one block row
 * per kv row (b, j), 16-byte packs when head size and pointers allow. fp32 products and sums are
 * rounded explicitly (__fmul_rn/__fadd_rn: no FMA contraction), in the CPU's order, so fp32
 * storage matches the CPU bit for bit; the sum over batch rows has a fixed order (no atomics). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/mask_hash.h"

/* V consecutive elements of T (V = 1, or one 16-byte pack) */
template <typename T, bool VEC> struct Lanes {
    static constexpr int V = VEC ? Pack<T>::N : 1;
    T v[V];
    __device__ __forceinline__ void load(const T *p) {
        if constexpr (VEC) {
            Pack<T> k = ld_pack(p);
#pragma unroll
            for (int i = 0; i < V; i++) v[i] = k.v[i];
        } else {
            v[0] = p[0];
        }
    }
    __device__ __forceinline__ void store(T *p) const {
        if constexpr (VEC) {
            Pack<T> k;
#pragma unroll
            for (int i = 0; i < V; i++) k.v[i] = v[i];
            st_pack(p, k);
        } else {
            p[0] = v[0];
        }
    }
};

/* Element e (a multiple of V) of a 2H-wide kv row -> head h, slot s (0 k, 1 v), dim d */
__device__ __forceinline__ void kv_split(int e, int HD, int &h, int &s, int &d) {
    h = e / (2 * HD);
    int rem = e - h * 2 * HD;
    s = rem >= HD;
    d = rem - s * HD;
}

/* grid.x = B*(P+T) kv rows, grid.y * blockDim.x * V covers the row's 2H elements */
template <typename T, bool VEC>
__global__ void prefix_kv_kernel(T *kv, const T *qkv, const T *pkv, int layer, int L, int Tn, int P, int NH, int HD,
                                 float ks, uint32_t th, uint64_t seed, bool drop) {
    typedef Lanes<T, VEC> LT;
    const int H = NH * HD, PT = P + Tn;
    const int e = (blockIdx.y * blockDim.x + threadIdx.x) * LT::V;
    if (e >= 2 * H) return;
    const int r = blockIdx.x, b = r / PT, j = r - b * PT;
    int h, s, d;
    kv_split(e, HD, h, s, d);
    const size_t i0 = (size_t)r * 2 * H + e;
    LT x;
    if (j < P) {
        x.load(pkv + (size_t)j * 2 * L * H + ((size_t)(2 * layer + s) * NH + h) * HD + d);
#pragma unroll
        for (int k = 0; k < LT::V; k++)
            x.v[k] = from_f<T>(drop && !glm_mask_keep(seed, i0 + k, th) ? 0.0f : __fmul_rn(to_f(x.v[k]), ks));
    } else {
        x.load(qkv + ((size_t)b * Tn + (j - P)) * 3 * H + ((size_t)h * 3 + 1 + s) * HD + d);
    }
    x.store(kv + i0);
}

/* grid.x = B*T sequence rows (dkv -> dqkv's k|v slots), then P prefix rows (summed over b) */
template <typename T, bool VEC>
__global__ void prefix_kv_bwd_kernel(T *dqkv, T *dpkv, const T *dkv, int layer, int L, int B, int Tn, int P, int NH,
                                     int HD, float ks, uint32_t th, uint64_t seed, bool drop) {
    typedef Lanes<T, VEC> LT;
    const int H = NH * HD, PT = P + Tn;
    const int e = (blockIdx.y * blockDim.x + threadIdx.x) * LT::V;
    if (e >= 2 * H) return;
    const long r = blockIdx.x, BT = (long)B * Tn;
    int h, s, d;
    kv_split(e, HD, h, s, d);
    if (r < BT) {
        const long b = r / Tn, t = r - b * Tn;
        LT g;
        g.load(dkv + ((size_t)b * PT + P + t) * 2 * H + e);
        g.store(dqkv + (size_t)r * 3 * H + ((size_t)h * 3 + 1 + s) * HD + d);
        return;
    }
    const int j = (int)(r - BT);
    float acc[LT::V];
#pragma unroll
    for (int k = 0; k < LT::V; k++) acc[k] = 0.0f;
    for (int b = 0; b < B; b++) {
        const size_t i0 = ((size_t)b * PT + j) * 2 * H + e;
        LT g;
        g.load(dkv + i0);
#pragma unroll
        for (int k = 0; k < LT::V; k++)
            acc[k] = __fadd_rn(acc[k], drop && !glm_mask_keep(seed, i0 + k, th) ? 0.0f : __fmul_rn(to_f(g.v[k]), ks));
    }
    T *dst = dpkv + (size_t)j * 2 * L * H + ((size_t)(2 * layer + s) * NH + h) * HD + d;
    LT o;
    o.load(dst);
#pragma unroll
    for (int k = 0; k < LT::V; k++) o.v[k] = from_f<T>(__fadd_rn(to_f(o.v[k]), acc[k]));
    o.store(dst);
}

/* threads per block and blocks along the row for rows of 2H elements in groups of V */
static void row_geometry(int H, int V, unsigned &threads, unsigned &chunks) {
    int groups = 2 * H / V;
    threads = groups >= 256 ? 256 : (unsigned)((groups + 31) / 32 * 32);
    chunks = (unsigned)((groups + (int)threads - 1) / (int)threads);
}

extern "C" void glmk_prefix_kv(glm_dtype dt, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int Tn,
                               int P, int NH, int HD, float p, uint64_t seed, cudaStream_t st) {
    long rows = (long)B * (P + Tn);
    if (rows <= 0 || NH <= 0 || HD <= 0) return;
    if (rows > 0x7fffffffL) glm_cuda_check_at(cudaErrorInvalidValue, "prefix_kv: B*(P+T) above 2^31", __FILE__, __LINE__);
    int V = (int)(16 / glm_dtype_size(dt));
    bool vec = HD % V == 0 && aligned16(kv) && aligned16(qkv) && aligned16(pkv);
    unsigned threads, chunks;
    row_geometry(NH * HD, vec ? V : 1, threads, chunks);
    dim3 grid((unsigned)rows, chunks);
    float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t th = glm_mask_threshold(p);
    GLMK_DISPATCH(dt, {
        if (vec)
            prefix_kv_kernel<T, true><<<grid, threads, 0, st>>>((T *)kv, (const T *)qkv, (const T *)pkv, layer, L, Tn,
                                                                 P, NH, HD, ks, th, seed, p > 0);
        else
            prefix_kv_kernel<T, false><<<grid, threads, 0, st>>>((T *)kv, (const T *)qkv, (const T *)pkv, layer, L, Tn,
                                                                  P, NH, HD, ks, th, seed, p > 0);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_prefix_kv_bwd(glm_dtype dt, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B,
                                   int Tn, int P, int NH, int HD, float p, uint64_t seed, cudaStream_t st) {
    long rows = (long)B * Tn + (B > 0 ? P : 0);
    if (rows <= 0 || NH <= 0 || HD <= 0) return;
    if (rows > 0x7fffffffL) glm_cuda_check_at(cudaErrorInvalidValue, "prefix_kv_bwd: B*T+P above 2^31", __FILE__, __LINE__);
    int V = (int)(16 / glm_dtype_size(dt));
    bool vec = HD % V == 0 && aligned16(dqkv) && aligned16(dpkv) && aligned16(dkv);
    unsigned threads, chunks;
    row_geometry(NH * HD, vec ? V : 1, threads, chunks);
    dim3 grid((unsigned)rows, chunks);
    float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t th = glm_mask_threshold(p);
    GLMK_DISPATCH(dt, {
        if (vec)
            prefix_kv_bwd_kernel<T, true><<<grid, threads, 0, st>>>((T *)dqkv, (T *)dpkv, (const T *)dkv, layer, L, B,
                                                                     Tn, P, NH, HD, ks, th, seed, p > 0);
        else
            prefix_kv_bwd_kernel<T, false><<<grid, threads, 0, st>>>((T *)dqkv, (T *)dpkv, (const T *)dkv, layer, L, B,
                                                                      Tn, P, NH, HD, ks, th, seed, p > 0);
    });
    GLMK_CHECK_LAUNCH();
}

/* ---------------------------------------------------------------- tanh */

/* OP 0: out = tanh(a); OP 1: out = b * (1 - a^2) (a = the forward's output, b = dout) */
template <int OP>
__device__ __forceinline__ float tanh_op(float a, float b) {
    if (OP == 0) return tanhf(a);
    return __fmul_rn(b, __fsub_rn(1.0f, __fmul_rn(a, a)));
}

template <typename T, int OP, bool VEC>
__global__ void tanh_kernel(T *out, const T *a, const T *b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x, t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (VEC) {
        constexpr int P = Pack<T>::N;
        for (size_t i = t * P; i < n; i += stride * P) {
            Pack<T> pa = ld_pack(a + i), pb, po;
            if (OP != 0) pb = ld_pack(b + i);
#pragma unroll
            for (int k = 0; k < P; k++) po.v[k] = from_f<T>(tanh_op<OP>(to_f(pa.v[k]), OP != 0 ? to_f(pb.v[k]) : 0.0f));
            st_pack(out + i, po);
        }
    } else {
        for (size_t i = t; i < n; i += stride)
            out[i] = from_f<T>(tanh_op<OP>(to_f(a[i]), OP != 0 ? to_f(b[i]) : 0.0f));
    }
}

template <int OP>
static void tanh_launch(glm_dtype dt, void *out, const void *a, const void *b, size_t n, cudaStream_t st) {
    if (n == 0) return;
    size_t P = 16 / glm_dtype_size(dt);
    bool vec = aligned16(out) && aligned16(a) && (!b || aligned16(b)) && n % P == 0;
    unsigned g = glmk_blocks(vec ? n / P : n, 256, 132 * 32);
    GLMK_DISPATCH(dt, {
        if (vec) tanh_kernel<T, OP, true><<<g, 256, 0, st>>>((T *)out, (const T *)a, (const T *)b, n);
        else tanh_kernel<T, OP, false><<<g, 256, 0, st>>>((T *)out, (const T *)a, (const T *)b, n);
    });
    GLMK_CHECK_LAUNCH();
}

extern "C" void glmk_tanh_fwd(glm_dtype dt, void *out, const void *x, size_t n, cudaStream_t st) {
    tanh_launch<0>(dt, out, x, NULL, n, st);
}
extern "C" void glmk_tanh_bwd(glm_dtype dt, void *dx, const void *out, const void *dout, size_t n, cudaStream_t st) {
    tanh_launch<1>(dt, dx, out, dout, n, st);
}
