#include "optim/schedule.h"
#include <math.h>
#include <string.h>

static const char *names[] = {"linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial",
                              "inverse_sqrt"};

int glm_lr_kind_parse(const char *s, glm_lr_kind *out) {
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(s, names[i]) == 0) { *out = (glm_lr_kind)i; return 0; }
    return -1;
}

const char *glm_lr_kind_name(glm_lr_kind k) { return names[k]; }

float glm_lr_at(glm_lr_kind k, float base_lr, long step, long warmup, long total) {
    /* transformers' lambdas: warmup factor step/max(1,warmup) while step < warmup */
    if (k == LR_CONSTANT) return base_lr;
    if (step < warmup) return base_lr * (float)step / (float)(warmup > 1 ? warmup : 1);
    if (k == LR_CONSTANT_WITH_WARMUP) return base_lr;
    double progress = (double)(step - warmup) / (double)((total - warmup) > 1 ? (total - warmup) : 1);
    if (k == LR_LINEAR) {
        double f = (double)(total - step) / (double)((total - warmup) > 1 ? (total - warmup) : 1);
        return base_lr * (float)(f > 0 ? f : 0);
    }
    if (k == LR_COSINE_WITH_RESTARTS) { /* num_cycles 1: one hard restart-free cosine, 0 from the end on */
        if (progress >= 1.0) return 0.0f;
        double f = 0.5 * (1.0 + cos(M_PI * fmod(progress, 1.0)));
        return base_lr * (float)(f > 0 ? f : 0);
    }
    if (k == LR_POLYNOMIAL) { /* from base_lr down to lr_end, power 1 */
        double lr_end = GLM_LR_POLYNOMIAL_END;
        if (step > total) return (float)lr_end;
        double remaining = 1.0 - (double)(step - warmup) / (double)(total - warmup);
        return (float)((base_lr - lr_end) * remaining + lr_end);
    }
    if (k == LR_INVERSE_SQRT) /* timescale = warmup (> 0: checked where the schedule is chosen) */
        return base_lr * (float)(1.0 / sqrt((double)step / (double)warmup));
    /* cosine with num_cycles 0.5 */
    double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
    return base_lr * (float)(f > 0 ? f : 0);
}

int glm_lr_ds_kind_parse(const char *s, glm_lr_kind *k) {
    static const char *ds[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, ds[i])) { *k = (glm_lr_kind)(LR_DS_WARMUP + i); return 0; }
    return -1;
}

/* DeepSpeed's warmup fraction at iteration step < W (W = max(2, warmup), as its schedulers clamp it) */
static double ds_warmup_gamma(const glm_lr_sched *s, long step, long W) {
    return s->log_warmup ? log((double)step + 1.0) / log((double)W) : (double)step / (double)W;
}

float glm_lr_sched_at(const glm_lr_sched *s, long step) {
    if (s->kind < LR_DS_WARMUP) return glm_lr_at(s->kind, s->base_lr, step, s->warmup, s->total);
    long W = s->warmup > 2 ? s->warmup : 2;
    if (s->kind == LR_DS_WARMUP_COSINE) {
        double r;
        if (step < W) r = s->warmup_min_ratio + ds_warmup_gamma(s, step, W) * (1.0 - s->warmup_min_ratio);
        else { /* the total > W is checked where the schedule is read */
            double c = (1.0 + cos(M_PI * (double)(step - W + 1) / (double)(s->total - W))) / 2.0;
            r = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
            if (r < 0) r = 0;
        }
        return (float)(s->base_lr * r);
    }
    double g;
    if (step < W) g = ds_warmup_gamma(s, step, W);
    else if (s->kind == LR_DS_WARMUP) g = 1.0;
    else {
        double den = (double)(s->total - W) > 1.0 ? (double)(s->total - W) : 1.0;
        g = (double)(s->total - step) / den;
        if (g < 0) g = 0;
    }
    return (float)(s->min_lr + ((double)s->base_lr - s->min_lr) * g);
}
