/* Learning-rate schedules with Hugging Face transformers semantics (get_scheduler):
 * linear, cosine, constant, constant_with_warmup, cosine_with_restarts (one cycle),
 * polynomial (lr_end 1e-7, power 1) and inverse_sqrt (timescale = the warmup steps). step is
 * 0-based (the LR used for the step-th optimizer update). */
#ifndef GLM_SCHEDULE_H
#define GLM_SCHEDULE_H

typedef enum {
    LR_LINEAR, LR_COSINE, LR_CONSTANT, LR_CONSTANT_WITH_WARMUP, LR_COSINE_WITH_RESTARTS, LR_POLYNOMIAL, LR_INVERSE_SQRT
} glm_lr_kind;

int glm_lr_kind_parse(const char *s, glm_lr_kind *out); /* 0 ok, -1 unknown */
const char *glm_lr_kind_name(glm_lr_kind k);
float glm_lr_at(glm_lr_kind k, float base_lr, long step, long warmup_steps, long total_steps);

#define GLM_LR_POLYNOMIAL_END 1e-7 /* get_polynomial_decay_schedule_with_warmup's lr_end default */

#endif
