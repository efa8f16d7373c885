/* Host quantizers and dequantizers of backend/quant.h: THUDM's INT8/INT4 and bitsandbytes' NF4. */
#include "backend/quant.h"
#include "backend/quant_codes.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/half.h"

/* The literals of both tables: backend/quant_codes.h (shared with the CUDA kernels). */
const float glm_nf4_code[16] = {GLM_NF4_CODE_INIT};
const float glm_dyn_code[256] = {GLM_DYN_CODE_INIT};

const char *glm_qtype_name(glm_qtype t) {
    switch (t) {
    case GLM_Q_INT8: return "int8";
    case GLM_Q_INT4: return "int4";
    case GLM_Q_NF4: return "nf4";
    default: return "none";
    }
}

/* bitsandbytes' dQuantizeNF4: the thresholds are the midpoints of neighbouring code values
 * (a NaN, from an all-zero block, falls to code 0 as there). */
static uint8_t nf4_code_of(float x) {
    if (x > 0.03979014977812767f) {
        if (x > 0.3893125355243683f) {
            if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 15 : 14;
            return x > 0.5016634166240692f ? 13 : 12;
        }
        if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 11 : 10;
        return x > 0.1202552504837513f ? 9 : 8;
    }
    if (x > -0.33967943489551544f) {
        if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 7 : 6;
        return x > -0.23460740596055984f ? 5 : 4;
    }
    if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 3 : 2;
    return x > -0.8480964004993439f ? 1 : 0;
}

/* bitsandbytes' dQuantize<0> over the dynamic map: a 7-step binary search, then the nearer of
 * the two neighbours by their midpoint (its exact comparisons kept, ties included). */
static uint8_t dyn_code_of(float x) {
    const float *code = glm_dyn_code;
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = code[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) { lower_pivot = pivot; lower = val; pivot += i; }
        else { upper_pivot = pivot; upper = val; pivot -= i; }
        val = code[pivot];
    }
    if (upper_pivot == 255) upper = code[upper_pivot];
    if (lower_pivot == 0) lower = code[lower_pivot];
    if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

static void quantize_rows_int(glm_qtype t, uint8_t *dst, const float *w, size_t OC, size_t C) {
    glm_qlayout L = glm_qlayout_of(t, OC, C);
    uint16_t *scale = (uint16_t *)(dst + L.scale);
    float qmax = t == GLM_Q_INT8 ? 127.0f : 7.0f;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < OC; r++) {
        const float *row = w + r * C;
        /* the original's weight is fp16: its absmax and every division are fp16 results */
        float amax = 0;
        for (size_t j = 0; j < C; j++) {
            float v = fabsf(glm_f16_to_f32(glm_f32_to_f16(row[j])));
            amax = v > amax ? v : amax;
        }
        uint16_t s16 = glm_f32_to_f16(amax / qmax);
        float s = glm_f16_to_f32(s16);
        scale[r] = s16;
        for (size_t j = 0; j < C; j++) {
            int q = 0;
            if (s > 0) {
                float h = glm_f16_to_f32(glm_f32_to_f16(glm_f16_to_f32(glm_f32_to_f16(row[j])) / s));
                q = (int)nearbyintf(h); /* round half to even, as torch.round */
                /* a subnormal fp16 scale rounds down so far that q can pass qmax; the original's
                 * int8 cast would wrap it to the other sign: kept at qmax instead */
                q = q > (int)qmax ? (int)qmax : q < -(int)qmax ? -(int)qmax : q;
            }
            if (t == GLM_Q_INT8) dst[r * C + j] = (uint8_t)(int8_t)q;
            else if (j % 2 == 0) dst[(r * C + j) / 2] = (uint8_t)(q << 4);
            else dst[(r * C + j) / 2] |= (uint8_t)(q & 0x0f);
        }
    }
}

static void quantize_nf4(uint8_t *dst, const float *w, size_t n) {
    glm_qlayout L = glm_qlayout_of(GLM_Q_NF4, 1, n);
    float *absmax = glm_malloc(L.nb * sizeof(float));
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < L.nb; b++) {
        const float *x = w + b * GLM_NF4_BLOCK;
        float a = 0;
        for (int j = 0; j < GLM_NF4_BLOCK; j++) a = fmaxf(a, fabsf(x[j]));
        absmax[b] = a;
        float inv = 1.0f / a;
        for (int j = 0; j < GLM_NF4_BLOCK; j += 2)
            dst[(b * GLM_NF4_BLOCK + j) / 2] = (uint8_t)(nf4_code_of(x[j] * inv) << 4 | nf4_code_of(x[j + 1] * inv));
    }
    /* double quantization: offset = the mean absmax, summed in double and rounded to float once
     * (bitsandbytes takes torch's float32 mean, which may differ from it by an ulp) */
    double sum = 0;
    for (size_t b = 0; b < L.nb; b++) sum += absmax[b];
    float offset = (float)(sum / (double)L.nb);
    float *absmax2 = (float *)(dst + L.absmax2);
    uint8_t *qa = dst + L.qa;
    for (size_t b2 = 0; b2 < L.nb2; b2++) {
        size_t lo = b2 * GLM_NF4_BLOCK2, hi = lo + GLM_NF4_BLOCK2 < L.nb ? lo + GLM_NF4_BLOCK2 : L.nb;
        float a2 = 0;
        for (size_t b = lo; b < hi; b++) a2 = fmaxf(a2, fabsf(absmax[b] - offset));
        absmax2[b2] = a2;
        float inv = 1.0f / a2;
        for (size_t b = lo; b < hi; b++) qa[b] = dyn_code_of((absmax[b] - offset) * inv);
    }
    memcpy(dst + L.offset, &offset, sizeof offset);
    free(absmax);
}

void glm_quantize(glm_qtype t, void *dst, const float *w, size_t OC, size_t C) {
    glm_qlayout L = glm_qlayout_of(t, OC, C);
    memset(dst, 0, L.bytes);
    if (t == GLM_Q_NF4) quantize_nf4(dst, w, OC * C);
    else quantize_rows_int(t, dst, w, OC, C);
}

void glm_dequantize_rows(glm_qtype t, float *w, const void *src, size_t OC, size_t C, size_t r0, size_t r1) {
    const uint8_t *s = src;
    glm_qlayout L = glm_qlayout_of(t, OC, C);
    if (t == GLM_Q_NF4) {
        float offset;
        memcpy(&offset, s + L.offset, sizeof offset);
        const float *absmax2 = (const float *)(s + L.absmax2);
#pragma omp parallel for schedule(static)
        for (size_t i = r0 * C; i < r1 * C; i++) {
            uint8_t byte = s[i / 2];
            w[i - r0 * C] = glm_nf4_code[i % 2 ? byte & 15 : byte >> 4] * glm_nf4_absmax(s + L.qa, absmax2, offset, i / GLM_NF4_BLOCK);
        }
        return;
    }
    const uint16_t *scale = (const uint16_t *)(s + L.scale);
#pragma omp parallel for schedule(static)
    for (size_t r = r0; r < r1; r++) {
        float sc = glm_f16_to_f32(scale[r]);
        for (size_t j = 0; j < C; j++) {
            int q;
            if (t == GLM_Q_INT8) q = (int8_t)s[r * C + j];
            else { int8_t b = (int8_t)s[(r * C + j) / 2]; q = j % 2 ? (int8_t)(b << 4) >> 4 : b >> 4; }
            w[(r - r0) * C + j] = (float)q * sc;
        }
    }
}

void glm_dequantize(glm_qtype t, float *w, const void *src, size_t OC, size_t C) {
    glm_dequantize_rows(t, w, src, OC, C, 0, OC);
}
