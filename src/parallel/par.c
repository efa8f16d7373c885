#include "parallel/par.h"

int glm_par_sum(const glm_par *p, double *v, int n, int long_wait, const char *what, glm_err *err) {
    if (p->pp) return glm_pp_sum(p->pp, v, n, long_wait, what, err);
    return long_wait ? glm_dp_sum_long(p->dp, v, n, what, err) : glm_dp_sum(p->dp, v, n, what, err);
}

int glm_par_sum_batch(const glm_par *p, double *v, int n, glm_err *err) {
    if (glm_par_sum(p, v, n, 0, "batch token counts", err)) return -1;
    if (p->pp)
        for (int i = 0; i < n; i++) v[i] /= p->pp->pipe.P;
    return 0;
}

int glm_par_forward_backward(const glm_par *p, glm_model *m, const glm_batch *micro, int k, float dscale,
                             uint64_t run_seed, long step, glm_token_weigh weigh, void *const *weigh_ctx,
                             double *loss_sum, glm_err *err) {
    if (p->pp && weigh) return glm_fail(err, "a weighed loss over pipeline stages is not supported (a bug: refused earlier)");
    if (p->pp) return glm_pp_forward_backward(p->pp, micro, k, dscale, loss_sum, err);
    for (int i = 0; i < k; i++) {
        glm_dp_micro_begin(p->dp, i == k - 1); /* gradients are reduced during the last backward */
        /* dropout masks from the step, the rank and the micro-batch: a resumed run draws the same */
        glm_model_set_dropout_seed(m, glm_dropout_seed(run_seed, step, p->dp->rank, i));
        *loss_sum += weigh ? glm_forward_backward_weighted(m, &micro[i], dscale, weigh, weigh_ctx[i])
                           : glm_forward_backward(m, &micro[i], dscale);
    }
    return 0;
}

int glm_par_grad_norm(const glm_par *p, float grad_scale, double *loss_sum, double *norm, glm_err *err) {
    return p->pp ? glm_pp_grad_norm(p->pp, grad_scale, loss_sum, norm, err)
                 : glm_dp_grad_norm(p->dp, grad_scale, loss_sum, norm, err);
}

int glm_par_eval_batch(const glm_par *p, glm_model *m, const glm_batch *b, double v[2], glm_err *err) {
    if (p->pp) return glm_pp_eval(p->pp, b, v, err);
    v[0] += glm_forward_loss(m, b);
    v[1] += b->n_targets;
    return 0;
}

int glm_par_gather_params(const glm_par *p, glm_err *err) { return p->pp ? 0 : glm_dp_z3_gather_all(p->dp, err); }

void glm_par_release_params(const glm_par *p) {
    if (!p->pp) glm_dp_z3_release_all(p->dp);
}

int glm_par_save(const glm_par *p, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                 const char *args_json, glm_err *err) {
    return p->pp ? glm_pp_save(p->pp, output_dir, st, tokenizer_path, args_json, err)
                 : glm_dp_save(p->dp, output_dir, st, tokenizer_path, args_json, err);
}
