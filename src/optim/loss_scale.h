/* Dynamic loss scaling for fp16 with torch.cuda.amp.GradScaler semantics: start at 65536,
 * double after 2000 consecutive clean steps, halve and skip the step on inf/nan gradients. */
#ifndef GLM_LOSS_SCALE_H
#define GLM_LOSS_SCALE_H

typedef struct glm_loss_scaler {
    double scale;
    long growth_interval, good_steps, skipped;
} glm_loss_scaler;

void glm_scaler_init(glm_loss_scaler *s, double init_scale, long growth_interval);
/* After computing the gradient norm of a step: returns 1 when the step must be skipped
 * (non-finite gradients; the scale is halved), 0 when it may be applied (the scale grows
 * every growth_interval clean steps). */
int glm_scaler_update(glm_loss_scaler *s, double grad_norm);

#endif
