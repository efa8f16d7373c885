/* Learning-rate schedules with Hugging Face transformers semantics (get_scheduler and its
 * scheduler_specific_kwargs): linear, cosine (num_cycles 0.5), constant, constant_with_warmup,
 * cosine_with_restarts (num_cycles 1), polynomial (lr_end 1e-7, power 1), inverse_sqrt
 * (timescale = the warmup steps) and cosine_with_min_lr (min_lr or min_lr_rate). step is
 * 0-based (the LR used for the step-th optimizer update). reduce_lr_on_plateau is torch's
 * ReduceLROnPlateau as the Trainer drives it: no warmup, the rate cut by factor after each
 * evaluation that ends more than patience evaluations without an improvement
 * (glm_lr_plateau_step), its state carried by checkpoints. */
#ifndef GLM_SCHEDULE_H
#define GLM_SCHEDULE_H
#include "core/err.h"

typedef enum {
    LR_LINEAR, LR_COSINE, LR_CONSTANT, LR_CONSTANT_WITH_WARMUP, LR_COSINE_WITH_RESTARTS, LR_POLYNOMIAL, LR_INVERSE_SQRT,
    LR_COSINE_WITH_MIN_LR, LR_REDUCE_ON_PLATEAU,
    /* DeepSpeed's schedulers (a --deepspeed file's scheduler section), not --lr_scheduler_type names */
    LR_DS_WARMUP, LR_DS_WARMUP_DECAY, LR_DS_WARMUP_COSINE
} glm_lr_kind;

int glm_lr_kind_parse(const char *s, glm_lr_kind *out); /* 0 ok, -1 unknown */
const char *glm_lr_kind_name(glm_lr_kind k);
/* The rate of a schedule with transformers' default settings. */
float glm_lr_at(glm_lr_kind k, float base_lr, long step, long warmup_steps, long total_steps);

/* A schedule with everything it needs. DeepSpeed's (deepspeed/runtime/lr_schedules.py): over
 * max(2, warmup) steps a log (log(step + 1) / log(warmup)) or linear (step / warmup) rise from
 * min_lr to base_lr (WarmupLR: then flat; WarmupDecayLR: then linear to 0 at total), or for
 * WarmupCosineLR from base_lr * warmup_min_ratio to base_lr, then a cosine down to
 * base_lr * cos_min_ratio. Step u is the u-th update's rate: DeepSpeed before 0.15.2 applied the
 * optimizer's own rate (base_lr) to the first update, a bug it fixed, which is not copied here. */
/* ReduceLROnPlateau's state (what torch's state_dict keeps): the rate now, the best metric, the
 * evaluations without an improvement and those still to wait after a cut. */
typedef struct glm_lr_plateau {
    double lr, best;
    long num_bad, cooldown_left;
} glm_lr_plateau;

typedef struct glm_lr_sched {
    glm_lr_kind kind;
    float base_lr;
    long warmup, total;
    /* transformers' kinds: their settings, which glm_lr_kwargs sets (the defaults with "{}") */
    double num_cycles, min_lr_rate, lr_end, power, timescale;
    /* DeepSpeed's kinds only */
    int log_warmup;
    double min_lr, warmup_min_ratio, cos_min_ratio;
    /* reduce_lr_on_plateau: torch's settings (min_lr above is its min_lrs) and its state */
    int plateau_max, plateau_abs; /* mode "max", threshold_mode "abs" */
    double factor, threshold, eps;
    long patience, cooldown;
    glm_lr_plateau plateau;
} glm_lr_sched;
/* The name DeepSpeed gives the kind ("WarmupLR", ...) into *k; 0 ok, -1 not one of the three. */
int glm_lr_ds_kind_parse(const char *s, glm_lr_kind *k);
/* The rate of update `step`; a transformers kind's settings come from glm_lr_kwargs first. */
float glm_lr_sched_at(const glm_lr_sched *s, long step);
/* reduce_lr_on_plateau: one evaluation's metric, as torch's ReduceLROnPlateau.step(metric).
 * Returns 1 when the rate was cut. */
int glm_lr_plateau_step(glm_lr_sched *s, double metric);
/* Reads transformers' scheduler_specific_kwargs (a JSON object's text, --lr_scheduler_kwargs)
 * for s->kind into s, and checks them with s->base_lr, s->warmup: a key the kind does not take,
 * a value out of range, and what transformers refuses (min_lr and min_lr_rate both or neither,
 * lr_end above the rate, inverse_sqrt's timescale 0) are errors naming the key. */
int glm_lr_kwargs(glm_lr_sched *s, const char *json, glm_err *err);

#define GLM_LR_POLYNOMIAL_END 1e-7 /* get_polynomial_decay_schedule_with_warmup's lr_end default */

#endif
