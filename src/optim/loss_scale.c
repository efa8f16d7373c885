#include "optim/loss_scale.h"
#include <math.h>

void glm_scaler_init(glm_loss_scaler *s, double init_scale, long growth_interval) {
    *s = (glm_loss_scaler){.scale = init_scale, .growth_interval = growth_interval};
}

int glm_scaler_update(glm_loss_scaler *s, double grad_norm) {
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
