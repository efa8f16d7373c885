/* What the CUDA benchmarks (bench_train, bench_decode) share: the --quant flag, random
 * quantized weights, and the per-op table of a profiled step. */
#ifndef GLM_BENCH_COMMON_H
#define GLM_BENCH_COMMON_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_backend.h"
#include "backend/quant.h"
#include "core/half.h"
#include "model/glm.h"

/* --quant's value: int8, int4 or nf4 as a glm_qtype; -1 for anything else. */
static inline int bench_parse_quant(const char *s) {
    return !strcmp(s, "int8") ? GLM_Q_INT8 : !strcmp(s, "int4") ? GLM_Q_INT4 : !strcmp(s, "nf4") ? GLM_Q_NF4 : -1;
}

/* Random quantized weights, made on the device: the integers are random bits (any byte is a
 * valid int8 / two int4 / two NF4 codes) and the scales are set so the weights have about the
 * spread of a trained model's (std ~0.02), so losses stay finite. Quantizing 5.6B random floats
 * on the host instead would take minutes. */
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

/* Ends a step run under glm_cuda_profile(be, 2) (an event at every op) and prints its ops
 * sorted by time, headed "per-op (what, ...)". */
static void bench_print_ops(glm_backend *be, const char *what) {
    double split[GLM_PROF_NCAT] = {0}, ms[96], tot = 0;
    const char *names[96];
    glm_cuda_profile_read(be, split);
    glm_cuda_profile(be, 0);
    int n = glm_cuda_profile_ops(be, names, ms, 96);
    for (int i = 0; i < n; i++) tot += ms[i];
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (ms[j] > ms[i]) {
                double t = ms[i]; ms[i] = ms[j]; ms[j] = t;
                const char *s = names[i]; names[i] = names[j]; names[j] = s;
            }
    printf("  per-op (%s, an event per op: %.2f ms)\n", what, tot);
    for (int i = 0; i < n; i++) printf("    %-34s %8.3f ms %5.1f%%\n", names[i], ms[i], 100 * ms[i] / tot);
}

#endif
