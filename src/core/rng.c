#include "core/rng.h"
#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void glm_rng_seed(glm_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t glm_rng_u64(glm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

float glm_rng_uniform(glm_rng *r) { return (glm_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float glm_rng_normal(glm_rng *r) {
    /* one value per call keeps the state simple to save; the sine half is dropped */
    double u1 = ((glm_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (glm_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t glm_rng_below(glm_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
    do x = glm_rng_u64(r); while (x >= limit);
    return x % n;
}

void glm_rng_shuffle_i32(glm_rng *r, int32_t *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)glm_rng_below(r, (uint64_t)i + 1);
        int32_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}
