/* backend.h adamw8 on the CPU: bitsandbytes' 8-bit blockwise AdamW, one OpenMP task per state
 * block (GLM_ADAM8_BLOCK elements), the per-element arithmetic of backend/quant8.h. A block is
 * done in passes over it (moments into a local buffer and their absmax, the parameter, the
 * codes), plain loops; nothing depends on the thread count. gcc vectorises the moments (gathers
 * from the maps) and, with -fno-math-errno, the parameter; the codes' search is written in AVX2
 * lanes where the build has them (gcc keeps its selects as branches). */
#include "backend/cpu/cpu_adam8.h"
#include <math.h>
#include <string.h>
#include "backend/quant8.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

#ifdef __AVX2__
/* glm_q8_encode of 8 values against one block's absmax, in AVX2 lanes: the same comparisons,
 * selects and float operations in the same order (so the same codes bit for bit, NaN included:
 * every "x > val" is false for it, as in the scalar search), without the scalar code's
 * data-dependent branches, which random moments mispredict at every step of the search. */
static inline __m256i q8_encode8(const float *code, int kind, __m256 value, __m256 amax) {
    const __m256 x = _mm256_div_ps(value, amax), half = _mm256_set1_ps(0.5f);
    __m256i pivot = _mm256_set1_epi32(127), up = _mm256_set1_epi32(255), lp = _mm256_setzero_si256();
    __m256 lower = _mm256_set1_ps(kind == GLM_Q8_SIGNED ? -1.0f : 0.0f), upper = _mm256_set1_ps(1.0f);
    __m256 val = _mm256_set1_ps(code[127]);
    for (int k = 6; k >= 0; k--) {
        const __m256 gt = _mm256_cmp_ps(x, val, _CMP_GT_OQ);
        const __m256i gti = _mm256_castps_si256(gt), step = _mm256_set1_epi32(1 << k);
        lp = _mm256_blendv_epi8(lp, pivot, gti);
        lower = _mm256_blendv_ps(lower, val, gt);
        up = _mm256_blendv_epi8(pivot, up, gti);
        upper = _mm256_blendv_ps(val, upper, gt);
        pivot = _mm256_blendv_epi8(_mm256_sub_epi32(pivot, step), _mm256_add_epi32(pivot, step), gti);
        val = _mm256_i32gather_ps(code, pivot, 4);
    }
    const __m256 gt = _mm256_cmp_ps(x, val, _CMP_GT_OQ);
    const __m256 above = _mm256_cmp_ps(x, _mm256_mul_ps(_mm256_add_ps(upper, val), half), _CMP_GT_OQ);
    const __m256 below = _mm256_cmp_ps(x, _mm256_mul_ps(_mm256_add_ps(lower, val), half), _CMP_LT_OQ);
    const __m256i r_gt = _mm256_blendv_epi8(pivot, up, _mm256_castps_si256(above));
    const __m256i r_le = _mm256_blendv_epi8(pivot, lp, _mm256_castps_si256(below));
    __m256i c = _mm256_blendv_epi8(r_le, r_gt, _mm256_castps_si256(gt));
    if (kind == GLM_Q8_SIGNED) { /* the sign fix: one code toward the value where the signs differ */
        const __m256i neg_code = _mm256_cmpgt_epi32(_mm256_set1_epi32(127), c);
        const __m256i neg_val = _mm256_srai_epi32(_mm256_castps_si256(value), 31); /* signbit: all ones */
        const __m256i fix = _mm256_xor_si256(neg_code, neg_val);
        const __m256 pos = _mm256_cmp_ps(value, _mm256_setzero_ps(), _CMP_GT_OQ);
        const __m256i delta = _mm256_blendv_epi8(_mm256_set1_epi32(-1), _mm256_set1_epi32(1), _mm256_castps_si256(pos));
        c = _mm256_and_si256(_mm256_blendv_epi8(c, _mm256_add_epi32(c, delta), fix), _mm256_set1_epi32(255)); /* uint8 wrap */
    }
    return c;
}

/* codes[j] = glm_q8_encode(code, kind, x[j], amax), j < n */
void cpu_q8_encode_n(uint8_t *codes, const float *code, int kind, const float *x, float amax, size_t n) {
    const __m256 a = _mm256_set1_ps(amax);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        int32_t c[8];
        _mm256_storeu_si256((__m256i *)c, q8_encode8(code, kind, _mm256_loadu_ps(x + j), a));
        for (int e = 0; e < 8; e++) codes[j + e] = (uint8_t)c[e];
    }
    for (; j < n; j++) codes[j] = glm_q8_encode(code, kind, x[j], amax);
}
#else
void cpu_q8_encode_n(uint8_t *codes, const float *code, int kind, const float *x, float amax, size_t n) {
    for (size_t j = 0; j < n; j++) codes[j] = glm_q8_encode(code, kind, x[j], amax);
}
#endif

typedef struct {
    float *param, *master;
    const float *grad;
    uint8_t *qm, *qv;
    float *absm, *absv;
    size_t n, flat0;
    const uint8_t *bits;
    float grad_scale;
    glm_adam8_scalars s;
} adam8_call;

static void adam8_block(const adam8_call *a, size_t b) {
    float m[GLM_ADAM8_BLOCK], v[GLM_ADAM8_BLOCK];
    const glm_adam8_scalars *s = &a->s;
    const float *cs = glm_q8_signed_map, *cu = glm_q8_unsigned_map, gs = a->grad_scale;
    const size_t lo = b * GLM_ADAM8_BLOCK, len = a->n - lo < GLM_ADAM8_BLOCK ? a->n - lo : GLM_ADAM8_BLOCK;
    const float am = a->absm[b], av = a->absv[b];
    const float *gb = a->grad + lo;
    const uint8_t *cm = a->qm + lo, *cv = a->qv + lo;
    /* the moments, from the decoded state */
    for (size_t j = 0; j < len; j++) {
        float g = gb[j] * gs;
        m[j] = glm_adam8_m(s, glm_q8_decode(cs, cm[j], am), g);
        v[j] = glm_adam8_v(s, glm_q8_decode(cu, cv[j], av), g);
    }
    /* the block's new absmax */
    float nm = 0.0f, nv = 0.0f;
    for (size_t j = 0; j < len; j++) {
        nm = fmaxf(nm, fabsf(m[j]));
        nv = fmaxf(nv, fabsf(v[j]));
    }
    /* the parameter from the unquantized moments: one decay bit per 64 elements (flat0 and lo
     * are multiples of 64) */
    float *pb = (a->master ? a->master : a->param) + lo;
    for (size_t c = 0; c < len; c += 64) {
        const float f = glm_adam8_factor(s, glm_adam8_decays(a->bits, a->flat0, lo + c));
        const size_t e = len - c < 64 ? len - c : 64;
        for (size_t j = c; j < c + e; j++) pb[j] = glm_adam8_param(s, pb[j], m[j], v[j], f);
    }
    if (a->master) memcpy(a->param + lo, pb, len * sizeof(float));
    /* the codes (into local bytes first: stores through uint8_t may alias anything, and the
     * vectoriser would then not gather from the maps) */
    uint8_t c1[GLM_ADAM8_BLOCK], c2[GLM_ADAM8_BLOCK];
    cpu_q8_encode_n(c1, cs, GLM_Q8_SIGNED, m, nm, len);
    cpu_q8_encode_n(c2, cu, GLM_Q8_UNSIGNED, v, nv, len);
    memcpy(a->qm + lo, c1, len);
    memcpy(a->qv + lo, c2, len);
    a->absm[b] = nm;
    a->absv[b] = nv;
}

void cpu_adamw8(float *param, float *master, const float *grad, uint8_t *qm, uint8_t *qv, float *absm, float *absv,
                size_t n, const uint8_t *decay_bits, size_t flat0, float lr, float b1, float b2, float eps, float wd,
                float bc1, float bc2, float grad_scale) {
    const adam8_call a = {param, master, grad, qm, qv, absm, absv, n, flat0, decay_bits, grad_scale,
                          glm_adam8_prepare(lr, b1, b2, eps, wd, bc1, bc2)};
    const size_t nb = glm_q8_blocks(n);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) adam8_block(&a, b);
}
