/* fp16 / bf16 <-> fp32 conversions, round to nearest even, NaN and Inf preserved. */
#ifndef GLM_HALF_H
#define GLM_HALF_H
#include <stdint.h>
#include <string.h>

static inline uint32_t glm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float glm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t glm_f32_to_bf16(float f) {
    uint32_t u = glm_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float glm_bf16_to_f32(uint16_t h) { return glm_bits_f32((uint32_t)h << 16); }

static inline uint16_t glm_f32_to_f16(float f) {
    uint32_t u = glm_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* overflow to Inf (incl. rounding) */
    if (a < 0x38800000u) {                                            /* subnormal or zero in fp16 */
        if (a < 0x33000000u) return (uint16_t)sign;                   /* below half the smallest subnormal */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);                             /* 14 .. 24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u;                                     /* rebias exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
static inline float glm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return glm_bits_f32(sign);
        float f = (float)m * (1.0f / 16777216.0f);                    /* m * 2^-24 */
        return sign ? -f : f;
    }
    if (e == 31) return glm_bits_f32(sign | 0x7f800000u | (m << 13));
    return glm_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}
#endif
