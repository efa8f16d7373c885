/* The training loop's one view of data and pipeline parallelism. A run is either data parallel
 * only (dp: one process is the case of one rank) or a pipeline of stages (pp, which holds its
 * stage's data-parallel replicas in pp->dp); every call here goes to whichever the run has, so
 * train/ never branches on it. */
#ifndef GLM_PARALLEL_PAR_H
#define GLM_PARALLEL_PAR_H
#include "parallel/dp/dp.h"
#include "parallel/pipe/pipe_train.h"

typedef struct glm_par {
    glm_dp *dp;   /* data parallelism (a pipeline run: this stage's replicas) */
    glm_pp *pp;   /* the pipeline, or NULL */
} glm_par;

/* Host doubles summed over every rank of the run (long_wait: rank 0 may be doing I/O). */
int glm_par_sum(const glm_par *p, double *v, int n, int long_wait, const char *what, glm_err *err);
/* The step's batch counts (supervised tokens, tokens, ...) over the run, each batch counted once
 * (every stage of a pipeline replica sees the same batches). */
int glm_par_sum_batch(const glm_par *p, double *v, int n, glm_err *err);
/* The step's k micro-batches forward and backward (gradients accumulate; dropout masks from
 * run_seed, step, the rank and the micro-batch); *loss_sum gets their summed token losses. With
 * weigh (not NULL), each micro-batch's loss is the caller's of its token losses
 * (glm_forward_backward_weighted, weigh_ctx[i] for micro-batch i; no pipeline stages). */
int glm_par_forward_backward(const glm_par *p, glm_model *m, const glm_batch *micro, int k, float dscale,
                             uint64_t run_seed, long step, glm_token_weigh weigh, void *const *weigh_ctx,
                             double *loss_sum, glm_err *err);
/* The global gradient norm (times grad_scale); *loss_sum is summed over the run on the way. */
int glm_par_grad_norm(const glm_par *p, float grad_scale, double *loss_sum, double *norm, glm_err *err);
/* One evaluation batch: v[0] += its summed token losses, v[1] += its supervised tokens (on the
 * rank that computes the loss). */
int glm_par_eval_batch(const glm_par *p, glm_model *m, const glm_batch *b, double v[2], glm_err *err);
/* The whole model's weights in place on every rank (ZeRO-3) around evaluation and saves. */
int glm_par_gather_params(const glm_par *p, glm_err *err);
void glm_par_release_params(const glm_par *p);
/* A checkpoint of the run (every rank calls it). */
int glm_par_save(const glm_par *p, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                 const char *args_json, glm_err *err);

#endif
