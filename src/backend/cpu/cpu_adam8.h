/* The CPU twin of backend.h's adamw8 (8-bit blockwise AdamW; backend/quant8.h), exposed for the
 * CUDA tests and the test tools. param and grad are fp32; master may be NULL. */
#ifndef GLM_CPU_ADAM8_H
#define GLM_CPU_ADAM8_H
#include <stddef.h>
#include <stdint.h>

void cpu_adamw8(float *param, float *master, const float *grad, uint8_t *qm, uint8_t *qv, float *absm, float *absv,
                size_t n, const uint8_t *decay_bits, size_t flat0, float lr, float b1, float b2, float eps, float wd,
                float bc1, float bc2, float grad_scale);
/* codes[j] = glm_q8_encode(code, kind, x[j], amax) for j < n (backend/quant8.h): the encoder the
 * op uses, in AVX2 lanes where the build has them (tests compare it with the scalar one). */
void cpu_q8_encode_n(uint8_t *codes, const float *code, int kind, const float *x, float amax, size_t n);
/* Whether the encoder counts thresholds by its tables (1; built once and checked against
 * glm_q8_search) or searches (0: no AVX2, or a check failed). */
int cpu_q8_encode_tables_ok(void);
#endif
