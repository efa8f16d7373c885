/* The dropout mask of backend op mask_scale (and noise_add's draws, at the end), one formula for every backend so the CPU twin and
 * the CUDA kernels keep and drop the same elements. Element i of a call with `seed` is kept
 * when its 16-bit slice (i mod 4) of splitmix64(seed + (i / 4 + 1) * golden) is at or above
 * p * 2^16: one hash serves four neighbouring elements (the hash, not memory, bounded the
 * kernels that drew one per element), with p resolved to 1/65536. Counter-based, so backward
 * redraws the forward's mask from the seed alone. */
#ifndef GLM_MASK_HASH_H
#define GLM_MASK_HASH_H
#include <stdint.h>
#ifdef __CUDACC__
#define GLM_HD __host__ __device__ __forceinline__
#else
#define GLM_HD static inline
#endif

/* the 64 bits of elements 4q .. 4q + 3 (element 4q + k: bits 16k .. 16k + 15) */
GLM_HD uint64_t glm_mask_bits(uint64_t seed, uint64_t q) {
    uint64_t z = seed + (q + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* element k (0..3) of a glm_mask_bits word kept */
GLM_HD int glm_mask_bits_keep(uint64_t bits, int k, uint32_t threshold) {
    return (uint32_t)(bits >> (16 * k) & 0xffffu) >= threshold;
}
/* bit k (0..3) set: element 4q + k kept (a pack's elements from one hash) */
GLM_HD uint32_t glm_mask_keep4(uint64_t seed, uint64_t q, uint32_t threshold) {
    uint64_t b = glm_mask_bits(seed, q);
    uint32_t k = 0;
    for (int e = 0; e < 4; e++) k |= (uint32_t)glm_mask_bits_keep(b, e, threshold) << e;
    return k;
}
GLM_HD int glm_mask_keep(uint64_t seed, uint64_t i, uint32_t threshold) {
    return glm_mask_bits_keep(glm_mask_bits(seed, i >> 2), (int)(i & 3), threshold);
}
/* p in [0, 1) as the 16-bit threshold above */
GLM_HD uint32_t glm_mask_threshold(float p) { return (uint32_t)((double)p * 65536.0); }
/* Element i's uniform draw in [-1, 1) for backend op noise_add: the top 24 bits of half (i mod 2)
 * of glm_mask_bits(seed, i / 2), exact in fp32, so every backend draws the same numbers. */
GLM_HD float glm_uniform_pm1(uint64_t seed, uint64_t i) {
    uint32_t h = (uint32_t)(glm_mask_bits(seed, i >> 1) >> (32 * (i & 1)));
    return (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
}
#endif
