/* Device-side helpers shared by the kernel files: storage-type conversions, 16-byte packs,
 * warp/block reductions, checked launches and the dtype dispatch used by every launcher.
 * Storage type S is float, __nv_bfloat16 or __half; all arithmetic is fp32. */
#ifndef GLM_CUDA_COMMON_CUH
#define GLM_CUDA_COMMON_CUH
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "backend/cuda/cuda_kernels.h"

typedef __nv_bfloat16 bf16;
typedef __half f16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half_rn(x); }

/* 16 bytes of T: one vector load/store. */
template <typename T> struct alignas(16) Pack {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
template <typename T> __device__ __forceinline__ Pack<T> ld_pack(const T *p) {
    Pack<T> r;
    *reinterpret_cast<int4 *>(&r) = *reinterpret_cast<const int4 *>(p);
    return r;
}
template <typename T> __device__ __forceinline__ void st_pack(T *p, const Pack<T> &r) {
    *reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(&r);
}
/* Two floats rounded to a 16-bit type, lo in the low half: one register of a tensor-core operand. */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<bf16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<f16>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* True when p is 16-byte aligned (host side, before choosing a vector kernel). */
static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The view's head of query head h: h itself, or its key/value group's (backend.h glm_qkv_view). */
__device__ __forceinline__ int vhead(const glm_qkv_view &v, int h) { return v.group > 1 ? h / v.group : h; }
/* Row (b, t, h) of a query/key/value view: its HD elements. */
template <typename T>
__device__ __forceinline__ const T *vrow(const glm_qkv_view &v, int b, int t, int h) {
    return (const T *)v.base + b * v.batch_stride + (long)t * v.tok_stride + vhead(v, h) * v.head_stride;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * `sh` holds 32 floats; the reduction order is fixed, so results are deterministic. */
__device__ __forceinline__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}

/* Launch checks: a bad launch configuration is reported at the launching line. */
#define GLMK_CHECK_LAUNCH() glm_cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#define GLMK_CHECK(call) glm_cuda_check_at((call), #call, __FILE__, __LINE__)

/* Runs the body with T bound to the storage type of `dt`. */
#define GLMK_DISPATCH(dt, ...)                                            \
    do {                                                                  \
        if ((dt) == GLM_F32) { typedef float T; __VA_ARGS__; }            \
        else if ((dt) == GLM_BF16) { typedef bf16 T; __VA_ARGS__; }       \
        else { typedef f16 T; __VA_ARGS__; }                              \
    } while (0)

static inline unsigned glmk_blocks(size_t n, unsigned threads, unsigned cap) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > cap ? cap : b);
}
#endif
