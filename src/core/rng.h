/* Deterministic random numbers (splitmix64 seeding + xoshiro256**). The state is a plain value
 * so it can be saved in a checkpoint and restored for exact resume. */
#ifndef GLM_RNG_H
#define GLM_RNG_H
#include <stdint.h>

typedef struct glm_rng { uint64_t s[4]; } glm_rng;

void glm_rng_seed(glm_rng *r, uint64_t seed);
uint64_t glm_rng_u64(glm_rng *r);
float glm_rng_uniform(glm_rng *r);            /* [0, 1) */
float glm_rng_normal(glm_rng *r);             /* N(0, 1), Box-Muller */
uint64_t glm_rng_below(glm_rng *r, uint64_t n); /* uniform in [0, n) without modulo bias */
void glm_rng_shuffle_i32(glm_rng *r, int32_t *a, int n); /* Fisher-Yates */

#endif
