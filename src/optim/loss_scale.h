/* Dynamic loss scaling for fp16. Two rules:
 *   - torch.cuda.amp.GradScaler's (the default): start at 65536, double after 2000 consecutive
 *     clean steps, halve and skip the step on inf/nan gradients;
 *   - DeepSpeed's DynamicLossScaler (a --deepspeed file's fp16 section): double every
 *     scale_window clean steps since the last overflow; an overflow skips the step, and halves
 *     the scale (never below min_scale) only once `hysteresis` overflows have used up the
 *     tolerance (restored at each doubling, or at each clean step with consecutive_hysteresis);
 *     an overflow at min_scale stops the run, as DeepSpeed raises there. */
#ifndef GLM_LOSS_SCALE_H
#define GLM_LOSS_SCALE_H

typedef struct glm_loss_scaler {
    double scale;
    long growth_interval, good_steps, skipped;
    /* DeepSpeed's rule when ds: its delayed shift and what is left of it, its floor */
    int ds, hysteresis, hysteresis_left, consecutive_hysteresis;
    double min_scale;
} glm_loss_scaler;

void glm_scaler_init(glm_loss_scaler *s, double init_scale, long growth_interval);
/* DeepSpeed's rule: scale_window clean steps a doubling, hysteresis >= 1, min_scale > 0. */
void glm_scaler_init_ds(glm_loss_scaler *s, double init_scale, long scale_window, int hysteresis,
                        int consecutive_hysteresis, double min_scale);
/* After computing the gradient norm of a step: returns 1 when the step must be skipped
 * (non-finite gradients), 0 when it may be applied, -1 when DeepSpeed's rule would lower the
 * scale below its minimum (the run cannot go on). */
int glm_scaler_update(glm_loss_scaler *s, double grad_norm);

#endif
