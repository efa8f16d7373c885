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

/* The sm_80 instructions some kernels use (mma.sync m16n8k16, bf16 mma, cp.async, bf16x2 fma)
 * exist in the device passes for 8.0 and newer. The Turing pass (7.5) does fp16's m16n8k16 as
 * two m16n8k8 (the same sums: k 0-7, then 8-15) and k_flash.cu's copies as plain loads and
 * stores; what is left (bf16 arithmetic) is a trap there, never launched: a 7.5 device refuses
 * bf16 (cuda_backend.c). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define GLMK_SM80 1
#define GLMK_SM80_ASM(...) asm volatile(__VA_ARGS__)
#else
#define GLMK_SM80_ASM(...) __trap()
#endif

/* mma.sync, 16-bit inputs, fp32 sums, lane = 4 g + t:
 *   m16n8k16: A a0 (g, k 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..); B b0 (k 2t..2t+1,
 *             n g) b1 (k 2t+8.., n g); C c0,c1 (g, n 2t..2t+1) c2,c3 (g+8, 2t..2t+1)
 *   m16n8k8:  A a0, a1 and B b0 as the first halves above (fp16: sm_75 and newer) */
template <typename T> __device__ __forceinline__ void mma1688(float *c, const uint32_t *a, uint32_t b0);
template <> __device__ __forceinline__ void mma1688<bf16>(float *c, const uint32_t *a, uint32_t b0) {
    GLMK_SM80_ASM("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
}
template <> __device__ __forceinline__ void mma1688<f16>(float *c, const uint32_t *a, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b0));
}
template <typename T> __device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<bf16>(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    GLMK_SM80_ASM("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<f16>(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
#ifdef GLMK_SM80
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    mma1688<f16>(c, a, b0);
    mma1688<f16>(c, a + 2, b1);
#endif
}
/* the 8 x 8 matrix of 16-bit values the warp holds one register a lane (lane 4 i + k: row i,
 * columns 2k, 2k + 1), transposed */
__device__ __forceinline__ uint32_t trans8(uint32_t v) {
    uint32_t o;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(o) : "r"(v));
    return o;
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
