/* Pipeline parallelism for training: P stages x D data-parallel replicas, one process per
 * (stage, replica), rank = replica * P + stage (a replica's stages are neighbouring ranks).
 *
 * Each process holds one stage's model (glm_model_init_stage with the device map's range) and
 * runs the 1F1B schedule over the optimizer step's micro-batches: stage s first runs
 * min(P - s - 1, M) forwards, then alternates one forward and one backward, then drains the
 * remaining backwards; the last stage does each micro-batch's forward, loss and backward at
 * once. Hidden states [B*T, H] go forward and their gradients back through parallel/comm/comm.h.
 * glm_stage_backward recomputes the stage's forward from its input, so a stage stashes only the
 * inputs of its in-flight micro-batches (at most P - s of them); with gradient_checkpointing
 * the recompute also keeps one layer's activations at a time.
 *
 * Every stage reads the same micro-batches (its own loader, same order): ids, positions and
 * key ranges are needed everywhere, the targets on the last stage.
 *
 * Tied head: the last stage holds a copy of word_embeddings as its head. Its copy starts equal
 * to the first stage's (glm_pipe_sync_tied), the two gradients are summed between the two
 * stages before the optimizer step (glm_pipe_reduce_tied), and both apply the same AdamW update
 * with the same state, so they stay equal; checkpoints write it once (from the first stage)
 * and the gradient norm counts it once. */
#ifndef GLM_PARALLEL_PIPELINE_H
#define GLM_PARALLEL_PIPELINE_H
#include "data/batch.h"
#include "model/glm.h"
#include "parallel/pipe/device_map.h"
#include "parallel/comm/comm.h"

typedef struct glm_pipe {
    glm_device_map map;
    int P, D;                 /* stages, replicas */
    int stage, replica;       /* this rank's */
    glm_comm *world;           /* all P x D ranks (not owned) */
    glm_comm *tied;            /* this replica's first and last stage (tied head, P > 1), else NULL */
    glm_comm *dp;              /* this stage's D replicas (D > 1), else NULL */
    glm_comm *stages;          /* this replica's P stages (P-Tuning v2 over P > 1: the prefix copies), else NULL */
    glm_model *m;             /* this stage's model (not owned) */
    /* backend buffers sized for cap elements [N*H]: stashed stage inputs, send/recv */
    void **stash;
    int n_stash, slots;       /* stash buffers held (none on the first stage), slots asked for */
    void *h_out, *dh_out, *dh_in;
    size_t cap;
    /* the last step: seconds computing (forward/backward, synchronised) and in total */
    double busy_s, step_s;
    long step;                /* named in error messages (the step being made: steps done + 1) */
    uint64_t run_seed;        /* the run's --seed: micro-batch i's dropout masks (glm_dropout_seed) */
    /* called before each backward, last = 1 for the step's last micro-batch (data parallel
     * reduces gradient buckets during that one: glm_dp_micro_begin); may be NULL */
    void (*before_backward)(void *ctx, int last);
    void *hook_ctx;
} glm_pipe;

/* The ranks and sub-communicators: world->world must be a multiple of map->n. Every rank calls
 * it (the splits are collective). */
int glm_pipe_init(glm_pipe *p, glm_comm *world, const glm_device_map *map, const glm_config *c, glm_err *err);
/* This rank's part of the map. */
const glm_stage *glm_pipe_my_stage(const glm_pipe *p);
/* Builds this stage's model on be (the caller owns it and frees it with glm_model_free). */
void glm_pipe_model_init(glm_pipe *p, glm_model *m, const glm_config *c, glm_backend *be);
void glm_pipe_free(glm_pipe *p);

/* The last stage's tied word_embeddings := the first stage's (after init or load). */
int glm_pipe_sync_tied(glm_pipe *p, glm_err *err);
/* Forward and backward of k micro-batches in the 1F1B schedule. Gradients accumulate (zero
 * them at the start of an optimizer step); dscale as glm_forward_backward. *loss_sum: the sum
 * of the token losses on the last stage, 0 elsewhere. */
int glm_pipe_forward_backward(glm_pipe *p, const glm_batch *mb, int k, float dscale, double *loss_sum, glm_err *err);
/* Evaluation forward of one batch; *loss_sum on the last stage, 0 elsewhere. */
int glm_pipe_forward_loss(glm_pipe *p, const glm_batch *b, double *loss_sum, glm_err *err);
/* Sums the tied head's gradient into both copies (no-op without a tied head split over stages). */
int glm_pipe_reduce_tied(glm_pipe *p, glm_err *err);
/* P-Tuning v2: every stage runs its own copy of the prefix encoder for its layers; their
 * gradients are summed over the stages (each then makes the same update), before the
 * data-parallel reduction. Nothing without a prefix. */
int glm_pipe_reduce_prefix(glm_pipe *p, glm_err *err);
/* The flat elements [0, skip) that the gradient norm leaves out: the last stage's copy of a
 * tied embedding (0 otherwise). */
size_t glm_pipe_grad_skip(const glm_pipe *p);
/* Plain data parallel without ZeRO (tests, and the tool drivers): sums the gradients over this
 * stage's replicas. */
int glm_pipe_dp_allreduce(glm_pipe *p, glm_err *err);

/* 1 when this stage writes tensor t to checkpoints: all but the last stage's tied copy of
 * word_embeddings (the first stage writes it). */
int glm_pipe_owns_tensor(const glm_pipe *p, const glm_tensor *t);
/* Whether a stage holding the embedding (`first`) or not keeps only a copy of row kind k: a later
 * stage's tied embedding and prefix encoder, which the first stage owns (checkpoints, the norm). */
static inline int glm_stage_row_is_copy(int first, glm_tkind k) { return !first && (k == T_WORD_EMB || glm_is_prefix(k)); }

#endif
