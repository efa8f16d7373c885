/* backend.h adamw8 on the CPU: bitsandbytes' 8-bit blockwise AdamW, one OpenMP task per state
 * block (GLM_ADAM8_BLOCK elements), the per-element arithmetic of backend/quant8.h. A block is
 * done in passes over it (moments into a local buffer and their absmax, the parameter, the
 * codes), plain loops; nothing depends on the thread count. gcc vectorises the moments and the
 * codes (gathers from the maps); the parameter loop stays scalar while the build keeps
 * -fmath-errno (sqrtf's errno path is a branch to it; -fno-math-errno vectorises it with the
 * same values). */
#include "backend/cpu/cpu_adam8.h"
#include <math.h>
#include <string.h>
#include "backend/quant8.h"

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
    for (size_t j = 0; j < len; j++) {
        c1[j] = glm_q8_encode(cs, GLM_Q8_SIGNED, m[j], nm);
        c2[j] = glm_q8_encode(cu, GLM_Q8_UNSIGNED, v[j], nv);
    }
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
