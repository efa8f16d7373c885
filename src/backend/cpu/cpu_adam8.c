/* backend.h adamw8 on the CPU: bitsandbytes' 8-bit blockwise AdamW, one OpenMP task per state
 * block (GLM_ADAM8_BLOCK elements), the per-element arithmetic of backend/quant8.h. A block is
 * done in passes over it (moments into a local buffer and their absmax, the parameter, the
 * codes), plain loops; nothing depends on the thread count. gcc vectorises the moments (gathers
 * from the maps) and, with -fno-math-errno, the parameter; the codes are found in AVX2 lanes
 * where the build has them: by counting thresholds through two tables built once from the
 * scalar search (three gathers a lane instead of the search's eight), or by the search itself
 * in lanes should a table's check fail. */
#include "backend/cpu/cpu_adam8.h"
#include <math.h>
#include <string.h>
#include "backend/quant8.h"
#ifdef __AVX2__
#include <immintrin.h>
#include <pthread.h>
#endif

#ifdef __AVX2__
/* glm_q8_encode's sign fix on the signed map, in lanes: a code whose sign differs from the
 * value's moves one code toward the value (uint8 wrap-around kept). */
static inline __m256i q8_sign_fix(__m256i c, __m256 value) {
    const __m256i neg_code = _mm256_cmpgt_epi32(_mm256_set1_epi32(127), c);
    const __m256i neg_val = _mm256_srai_epi32(_mm256_castps_si256(value), 31); /* signbit: all ones */
    const __m256i fix = _mm256_xor_si256(neg_code, neg_val);
    const __m256 pos = _mm256_cmp_ps(value, _mm256_setzero_ps(), _CMP_GT_OQ);
    const __m256i delta = _mm256_blendv_epi8(_mm256_set1_epi32(-1), _mm256_set1_epi32(1), _mm256_castps_si256(pos));
    return _mm256_and_si256(_mm256_blendv_epi8(c, _mm256_add_epi32(c, delta), fix), _mm256_set1_epi32(255));
}

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
    return kind == GLM_Q8_SIGNED ? q8_sign_fix(c, value) : c;
}

/* The search's result as a count of thresholds. glm_q8_search gives the code nearest to x, an
 * exact midpoint m_j = (code[j] + code[j+1]) * 0.5f going to whichever of j, j + 1 the search's
 * pivot was there; so its result is the number of thresholds t_j below x, t_j = m_j where the
 * midpoint goes down and the float below m_j where it goes up (x == m_j then counts). A table
 * over the top 16 bits of x's float bits holds, for every range of floats with those bits, the
 * thresholds certainly below it; at most two more lie inside a range and are compared. Both
 * tables are built once from glm_q8_search itself and checked against it (the step at every
 * threshold, the thresholds increasing, at most two per range); where a check fails the lanes
 * search as above. +inf (counted as all 255) is the one value the table cannot tell from NaN
 * (counted as none, as the search does): a select. */
typedef struct q8_table {
    float t[257];            /* thresholds t_0..t_254, then +inf twice (reads of base + 1) */
    uint8_t base[65536 + 4]; /* per top-16-bit pattern: thresholds below all its floats (+4: 32-bit reads) */
    int ok;
} q8_table;
static q8_table q8_tables[2];
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;

static float bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static void q8_build(q8_table *q, int kind) {
    const float *code = glm_q8_map(kind);
    const int sg = kind == GLM_Q8_SIGNED;
    q->ok = 1;
    for (int j = 0; j < 255; j++) {
        float m = (code[j] + code[j + 1]) * 0.5f;
        q->t[j] = glm_q8_search(code, sg, m) == j + 1 ? nextafterf(m, -INFINITY) : m;
        /* the search's step must sit exactly there */
        if (glm_q8_search(code, sg, q->t[j]) != j || glm_q8_search(code, sg, nextafterf(q->t[j], INFINITY)) != j + 1 ||
            (j && !(q->t[j] > q->t[j - 1])))
            q->ok = 0;
    }
    q->t[255] = q->t[256] = INFINITY;
    for (uint32_t idx = 0; idx < 65536 && q->ok; idx++) {
        uint32_t b0 = idx << 16, b1 = b0 | 0xffffu;
        if (((b0 >> 23) & 0xff) == 0xff) { q->base[idx] = 0; continue; } /* inf and NaN: see above */
        float lo = bits_float(idx & 0x8000 ? b1 : b0), hi = bits_float(idx & 0x8000 ? b0 : b1); /* lo <= hi */
        int below = 0, inside = 0;
        for (int j = 0; j < 255; j++) {
            below += q->t[j] < lo;
            inside += q->t[j] >= lo && q->t[j] < hi;
        }
        if (inside > 2) q->ok = 0;
        q->base[idx] = (uint8_t)below;
    }
    memset(q->base + 65536, 0, 4);
}

static void q8_build_both(void) {
    q8_build(&q8_tables[GLM_Q8_SIGNED], GLM_Q8_SIGNED);
    q8_build(&q8_tables[GLM_Q8_UNSIGNED], GLM_Q8_UNSIGNED);
}

/* glm_q8_search of 8 normalised values by the tables. */
static inline __m256i q8_count8(const q8_table *q, __m256 x) {
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i idx = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    const __m256i base = _mm256_and_si256(_mm256_i32gather_epi32((const int *)q->base, idx, 1), _mm256_set1_epi32(255));
    const __m256 t0 = _mm256_i32gather_ps(q->t, base, 4), t1 = _mm256_i32gather_ps(q->t, _mm256_add_epi32(base, one), 4);
    __m256i c = _mm256_sub_epi32(base, _mm256_castps_si256(_mm256_cmp_ps(x, t0, _CMP_GT_OQ))); /* true is -1 */
    c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(x, t1, _CMP_GT_OQ)));
    const __m256 pinf = _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
    return _mm256_blendv_epi8(c, _mm256_set1_epi32(255), _mm256_castps_si256(pinf));
}

/* glm_q8_encode of 8 values by the tables: the count, then the sign fix. */
static inline __m256i q8_fast8(const q8_table *q, int kind, __m256 value, __m256 amax) {
    const __m256i c = q8_count8(q, _mm256_div_ps(value, amax));
    return kind == GLM_Q8_SIGNED ? q8_sign_fix(c, value) : c;
}

/* codes[j] = glm_q8_encode(code, kind, x[j], amax), j < n */
void cpu_q8_encode_n(uint8_t *codes, const float *code, int kind, const float *x, float amax, size_t n) {
    pthread_once(&q8_once, q8_build_both);
    const q8_table *q = &q8_tables[kind == GLM_Q8_SIGNED ? GLM_Q8_SIGNED : GLM_Q8_UNSIGNED];
    const int fast = q->ok && code == glm_q8_map(kind);
    const __m256 a = _mm256_set1_ps(amax);
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        int32_t c[8];
        const __m256 v = _mm256_loadu_ps(x + j);
        _mm256_storeu_si256((__m256i *)c, fast ? q8_fast8(q, kind, v, a) : q8_encode8(code, kind, v, a));
        for (int e = 0; e < 8; e++) codes[j + e] = (uint8_t)c[e];
    }
    for (; j < n; j++) codes[j] = glm_q8_encode(code, kind, x[j], amax);
}

int cpu_q8_encode_tables_ok(void) {
    pthread_once(&q8_once, q8_build_both);
    return q8_tables[0].ok && q8_tables[1].ok;
}
#else
void cpu_q8_encode_n(uint8_t *codes, const float *code, int kind, const float *x, float amax, size_t n) {
    for (size_t j = 0; j < n; j++) codes[j] = glm_q8_encode(code, kind, x[j], amax);
}
int cpu_q8_encode_tables_ok(void) { return 0; }
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
