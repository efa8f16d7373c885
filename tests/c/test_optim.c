/* Optimizer pieces with their reference semantics: the fp16 loss scaler (torch GradScaler:
 * init 65536, halve and skip on inf/nan, double after 2000 clean steps), the learning-rate
 * schedules (transformers get_scheduler), and clip_grad_norm_'s coefficient. */
#include <math.h>
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/schedule.h"
#include "test.h"

int main(void) {
    test_counts tc = {0};
    glm_loss_scaler s;
    glm_scaler_init(&s, 65536.0, 2000);
    int skip_inf = glm_scaler_update(&s, INFINITY);
    int skip_nan = glm_scaler_update(&s, NAN);
    TEST_CHECK(&tc, "scaler_overflow_skips_and_halves", skip_inf && skip_nan && s.scale == 16384.0 && s.skipped == 2,
               "skip %d/%d scale %g skipped %ld", skip_inf, skip_nan, s.scale, s.skipped);
    int any_skip = 0;
    for (int i = 0; i < 1999; i++) any_skip |= glm_scaler_update(&s, 1.0);
    TEST_CHECK(&tc, "scaler_holds_before_interval", !any_skip && s.scale == 16384.0, "scale %g", s.scale);
    glm_scaler_update(&s, 1.0);
    TEST_CHECK(&tc, "scaler_grows_after_2000_clean_steps", s.scale == 32768.0 && s.good_steps == 0, "scale %g", s.scale);
    glm_scaler_update(&s, 1.0);
    glm_scaler_update(&s, INFINITY);
    TEST_CHECK(&tc, "scaler_overflow_resets_clean_count", s.scale == 16384.0 && s.good_steps == 0, "scale %g good %ld",
               s.scale, s.good_steps);

    /* transformers: linear = step/warmup, then (total-step)/(total-warmup); cosine with 0.5 cycles */
    float lr = 1e-3f;
    int ok = fabsf(glm_lr_at(LR_LINEAR, lr, 0, 10, 110) - 0.0f) < 1e-12f &&
             fabsf(glm_lr_at(LR_LINEAR, lr, 5, 10, 110) - 5e-4f) < 1e-9f &&
             fabsf(glm_lr_at(LR_LINEAR, lr, 10, 10, 110) - 1e-3f) < 1e-9f &&
             fabsf(glm_lr_at(LR_LINEAR, lr, 60, 10, 110) - 5e-4f) < 1e-9f &&
             fabsf(glm_lr_at(LR_LINEAR, lr, 110, 10, 110)) < 1e-12f;
    TEST_CHECK(&tc, "lr_linear_with_warmup", ok, "%g %g %g", glm_lr_at(LR_LINEAR, lr, 5, 10, 110),
               glm_lr_at(LR_LINEAR, lr, 60, 10, 110), glm_lr_at(LR_LINEAR, lr, 110, 10, 110));
    ok = fabsf(glm_lr_at(LR_COSINE, lr, 60, 10, 110) - 5e-4f) < 1e-9f &&
         fabsf(glm_lr_at(LR_COSINE, lr, 35, 10, 110) - lr * 0.5f * (1 + cosf(3.14159265f * 0.25f))) < 1e-8f;
    TEST_CHECK(&tc, "lr_cosine", ok, "%g", glm_lr_at(LR_COSINE, lr, 35, 10, 110));
    ok = glm_lr_at(LR_CONSTANT, lr, 3, 10, 110) == lr && fabsf(glm_lr_at(LR_CONSTANT_WITH_WARMUP, lr, 3, 10, 110) - 3e-4f) < 1e-9f &&
         glm_lr_at(LR_CONSTANT_WITH_WARMUP, lr, 50, 10, 110) == lr;
    TEST_CHECK(&tc, "lr_constant_and_constant_with_warmup", ok, "mismatch");
    glm_lr_kind k;
    TEST_CHECK(&tc, "lr_kind_names", glm_lr_kind_parse("cosine", &k) == 0 && k == LR_COSINE && glm_lr_kind_parse("cosin", &k) == -1, "mismatch");

    TEST_CHECK(&tc, "clip_coefficient", glm_clip_coef(4.0, 1.0f) == (float)(1.0 / (4.0 + 1e-6)) && glm_clip_coef(0.5, 1.0f) == 1.0f &&
               glm_clip_coef(100.0, 0.0f) == 1.0f, "mismatch");
    TEST_EXIT(&tc);
}
