#include "optim/loss_scale.h"
#include <math.h>

void glm_scaler_init(glm_loss_scaler *s, double init_scale, long growth_interval) {
    *s = (glm_loss_scaler){.scale = init_scale, .growth_interval = growth_interval, .hysteresis = 1, .hysteresis_left = 1};
}

void glm_scaler_init_ds(glm_loss_scaler *s, double init_scale, long scale_window, int hysteresis,
                        int consecutive_hysteresis, double min_scale) {
    *s = (glm_loss_scaler){.scale = init_scale, .growth_interval = scale_window, .ds = 1, .hysteresis = hysteresis,
                           .hysteresis_left = hysteresis, .consecutive_hysteresis = consecutive_hysteresis,
                           .min_scale = min_scale};
}

/* DeepSpeed's update_scale: good_steps counts the clean steps since the last overflow (its
 * cur_iter - last_overflow_iter), and is not reset by a doubling */
static int ds_update(glm_loss_scaler *s, int overflow) {
    if (overflow) {
        if (s->hysteresis == 1 || s->hysteresis_left == 1) {
            if (s->scale == s->min_scale) return -1;
            s->scale = fmax(s->scale / 2.0, s->min_scale);
        } else {
            s->hysteresis_left--;
        }
        s->good_steps = 0;
        s->skipped++;
        return 1;
    }
    if (s->consecutive_hysteresis) s->hysteresis_left = s->hysteresis;
    if (++s->good_steps % s->growth_interval == 0) {
        if (!s->consecutive_hysteresis) s->hysteresis_left = s->hysteresis;
        s->scale *= 2.0;
    }
    return 0;
}

int glm_scaler_update(glm_loss_scaler *s, double grad_norm) {
    if (s->ds) return ds_update(s, !isfinite(grad_norm));
    if (!isfinite(grad_norm)) {
        s->scale *= 0.5;
        s->good_steps = 0;
        s->skipped++;
        return 1;
    }
    if (++s->good_steps >= s->growth_interval) {
        s->scale *= 2.0;
        s->good_steps = 0;
    }
    return 0;
}
