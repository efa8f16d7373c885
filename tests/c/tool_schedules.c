/* Test tool: the fp16 loss scaler and the learning-rate schedules (optim/loss_scale.h,
 * optim/schedule.h) for tests/py/test_deepspeed_config.py, which runs DeepSpeed's own classes on
 * the same inputs.
 *   tool_schedules scaler torch|ds INIT WINDOW HYSTERESIS CONSECUTIVE MIN_SCALE FLAGS
 *       FLAGS: a string of 0 (clean step) and 1 (overflow); prints one line a step,
 *       "skip scale" (skip 1 skipped, 0 applied, -1 stopped at the minimum scale: the tool ends there)
 *   tool_schedules lr KIND BASE_LR WARMUP TOTAL LOG MIN_LR WARMUP_MIN_RATIO COS_MIN_RATIO STEPS
 *       KIND: WarmupLR|WarmupDecayLR|WarmupCosineLR or a --lr_scheduler_type name; prints the
 *       rate of updates 0..STEPS-1, one a line */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "optim/loss_scale.h"
#include "optim/schedule.h"

static int scaler(int argc, char **argv) {
    if (argc != 9) return fprintf(stderr, "usage: tool_schedules scaler torch|ds INIT WINDOW HYST CONSEC MIN FLAGS\n"), 2;
    glm_loss_scaler s;
    if (!strcmp(argv[2], "ds"))
        glm_scaler_init_ds(&s, atof(argv[3]), atol(argv[4]), atoi(argv[5]), atoi(argv[6]), atof(argv[7]));
    else
        glm_scaler_init(&s, atof(argv[3]), atol(argv[4]));
    for (const char *f = argv[8]; *f; f++) {
        int r = glm_scaler_update(&s, *f == '1' ? 1.0 / 0.0 : 1.0);
        printf("%d %.17g\n", r, s.scale);
        if (r < 0) break;
    }
    return 0;
}

static int lr(int argc, char **argv) {
    if (argc != 11) return fprintf(stderr, "usage: tool_schedules lr KIND BASE WARMUP TOTAL LOG MIN_LR WMIN_RATIO COS_MIN STEPS\n"), 2;
    glm_lr_sched s = {.base_lr = (float)atof(argv[3]), .warmup = atol(argv[4]), .total = atol(argv[5]),
                      .log_warmup = atoi(argv[6]), .min_lr = atof(argv[7]), .warmup_min_ratio = atof(argv[8]),
                      .cos_min_ratio = atof(argv[9])};
    if (glm_lr_ds_kind_parse(argv[2], &s.kind) && glm_lr_kind_parse(argv[2], &s.kind))
        return fprintf(stderr, "unknown schedule %s\n", argv[2]), 2;
    glm_err err;
    if (s.kind < LR_DS_WARMUP && glm_lr_kwargs(&s, "{}", &err)) return fprintf(stderr, "%s\n", err.msg), 2;
    for (long u = 0; u < atol(argv[10]); u++) printf("%.9g\n", glm_lr_sched_at(&s, u));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "scaler")) return scaler(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "lr")) return lr(argc, argv);
    fprintf(stderr, "usage: tool_schedules scaler|lr ...\n");
    return 2;
}
