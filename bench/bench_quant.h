/* Random quantized weights for the benchmarks, made on the device: the integers are random
 * bits (any byte is a valid int8 / two int4 / two NF4 codes) and the scales are set so the
 * weights have about the spread of a trained model's (std ~0.02), so losses stay finite.
 * Quantizing 5.6B random floats on the host instead would take minutes. */
#ifndef GLM_BENCH_QUANT_H
#define GLM_BENCH_QUANT_H
#include <stdlib.h>
#include "backend/cuda/cuda_backend.h"
#include "backend/quant.h"
#include "core/half.h"
#include "model/glm.h"

static void bench_fill_quantized(glm_model *m, const glm_tensor *t, void *p, uint64_t seed) {
    glm_backend *be = m->be;
    size_t OC = (size_t)t->shape[0], C = (size_t)t->shape[1], es = glm_dtype_size(be->dtype);
    glm_qlayout L = glm_qlayout_of((glm_qtype)t->qtype, OC, C);
    glm_cuda_fill_normal(be, p, L.q_bytes / es, seed, 1.0f);
    if (t->qtype == GLM_Q_NF4) {
        uint8_t *qa = malloc(L.nb);
        for (size_t b = 0; b < L.nb; b++) qa[b] = (uint8_t)(128 + (b * 7) % 64); /* absmax ~ offset + small */
        float *a2 = malloc(L.nb2 * sizeof(float)), off = 0.05f;
        for (size_t b = 0; b < L.nb2; b++) a2[b] = 0.02f;
        be->upload(be, (char *)p + L.qa, qa, L.nb);
        be->upload(be, (char *)p + L.absmax2, a2, L.nb2 * sizeof(float));
        be->upload(be, (char *)p + L.offset, &off, sizeof off);
        free(qa);
        free(a2);
    } else {
        uint16_t *s = malloc(OC * 2), v = glm_f32_to_f16(t->qtype == GLM_Q_INT8 ? 0.04f / 127 : 0.04f / 7);
        for (size_t r = 0; r < OC; r++) s[r] = v;
        be->upload(be, (char *)p + L.scale, s, OC * 2);
        free(s);
    }
    m->qscratch_of = NULL;
}

#endif
