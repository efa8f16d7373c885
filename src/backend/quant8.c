/* bitsandbytes' dynamic maps and whole-state conversions (backend/quant8.h). */
#include "backend/quant8.h"

const float glm_q8_signed_map[256] = {GLM_DYN_CODE_INIT};
const float glm_q8_unsigned_map[256] = {GLM_Q8_UNSIGNED_INIT};

void glm_q8_dequantize_state(int kind, float *out, const uint8_t *q, const float *absmax, size_t n) {
    const float *code = glm_q8_map(kind);
    for (size_t j = 0; j < n; j++) out[j] = glm_q8_decode(code, q[j], absmax[j / GLM_ADAM8_BLOCK]);
}

void glm_q8_quantize_state(int kind, uint8_t *q, float *absmax, const float *x, size_t n) {
    const float *code = glm_q8_map(kind);
    size_t nb = glm_q8_blocks(n);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * GLM_ADAM8_BLOCK, hi = lo + GLM_ADAM8_BLOCK < n ? lo + GLM_ADAM8_BLOCK : n;
        float a = 0.0f;
        for (size_t j = lo; j < hi; j++) a = fmaxf(a, fabsf(x[j]));
        absmax[b] = a;
        for (size_t j = lo; j < hi; j++) q[j] = glm_q8_encode(code, kind, x[j], a);
    }
}
