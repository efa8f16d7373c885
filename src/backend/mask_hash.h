/* The dropout mask of backend op mask_scale, one formula for every backend so the CPU twin and
 * the CUDA kernel keep and drop the same elements: element i of a call with `seed` is kept
 * when the top 24 bits of splitmix64(seed + (i + 1) * golden) fall at or above p * 2^24.
 * Counter-based, so backward redraws the forward's mask from the seed alone. */
#ifndef GLM_MASK_HASH_H
#define GLM_MASK_HASH_H
#include <stdint.h>
#ifdef __CUDACC__
#define GLM_HD __host__ __device__ __forceinline__
#else
#define GLM_HD static inline
#endif

GLM_HD int glm_mask_keep(uint64_t seed, uint64_t i, uint32_t threshold) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (uint32_t)(z >> 40) >= threshold;
}
/* p in [0, 1) as the 24-bit threshold above */
GLM_HD uint32_t glm_mask_threshold(float p) { return (uint32_t)((double)p * 16777216.0); }
#endif
