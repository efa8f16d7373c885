/* Data parallelism for the training loop (train/train.c calls these in a few places).
 *
 * Every rank holds the whole model and trains on its share of each global batch (the loader's
 * DistributedSampler split). The loss is the mean over the supervised tokens of the whole
 * global batch: the loop sums the token count over ranks before backward and sets dscale to
 * 1/global count, so summing the ranks' gradients gives exactly the gradient of that mean, and
 * results do not depend on how the batch is split.
 *
 * Gradients are reduced in buckets: contiguous ranges of the flat gradient buffer, from its end
 * backwards, because backward completes gradients in that order (the model's grads_ready hook).
 * A bucket's reduction starts as soon as backward has passed its start, and only in the last
 * micro-batch of an accumulation step.
 *
 * Every bucket is cut into `world` equal pieces (buckets are padded to multiples of 64 * world
 * elements, so any size shards); rank r's shard is piece r of every bucket, so each bucket's
 * reduction is spread over all ranks and links. During backward each bucket is
 * reduce-scattered: rank r gets the sum of its pieces (half the traffic of an all-reduce, so
 * backward is slowed less). ZeRO-0 keeps the whole AdamW state on every rank: the update
 * all-gathers the summed gradients bucket by bucket while AdamW runs over the buckets already
 * there (an all-reduce split in two, its second half hidden under AdamW). ZeRO-1 and 2 keep
 * AdamW state (moments, fp32 master) for the shard only; the update runs piece by piece, each
 * piece's parameter all-gather starting as soon as its update is done. ZeRO-2 also keeps only
 * the shard of the gradients: the buckets are the model's units (embedding, layers, head),
 * written into staging slots and reduce-scattered in every micro-batch (dp_zero2.c); with
 * pipeline stages it falls back to stage 1.
 * Checkpoints keep the single-process format: shards are gathered to rank 0 for saving and
 * each rank reads its own pieces on load, so N ranks' checkpoints resume on M ranks. */
#ifndef GLM_PARALLEL_DP_H
#define GLM_PARALLEL_DP_H
#include "model/glm.h"
#include "optim/adamw.h"
#include "parallel/dp/unit_slots.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/dist.h"
#include "ckpt/checkpoint.h"

typedef struct glm_dp_cfg {
    int zero_stage;        /* 0, 1, 2, 3 */
    double bucket_mb;      /* gradient bucket size in MiB */
    double timeout;        /* --ddp_timeout: seconds a collective may wait */
    int save_on_interrupt; /* collectives are then not cut short by SIGINT/SIGTERM */
    double reserve_bytes;  /* device memory training still needs after attach (activations, scratch) */
    int optim;             /* --optim: glm_optim_kind */
    int offload;           /* --offload_optimizer cpu: the optimizer state in host memory */
    int in_backward;       /* --optimizer_in_backward: each unit updated as soon as backward finishes it */
} glm_dp_cfg;

typedef struct glm_dp_bucket { size_t lo, hi; int started; } glm_dp_bucket;

/* ZeRO-2's gradient staging (parallel/dp/dp_zero2.c). */
typedef struct glm_dp_z2 {
    void *sg;              /* [shard] this rank's summed gradients (S) */
    glm_unit_slots us;     /* backward's staging, unit by unit (parallel/dp/unit_slots.h) */
    void *tmp[3];          /* [slot/world] reduce-scatter output of later micro-batches */
    int op[3];             /* index of the reduce-scatter reading the slot (-1: none) */
    size_t add_off[3], add_n[3]; /* tmp to add into sg at add_off before the slot is reused */
    int begun;
} glm_dp_z2;

/* The copy-engine exchange between the GPUs of one node (parallel/dp/dp_peer.c). */
typedef struct glm_dp_peer glm_dp_peer;
/* The update inside backward (parallel/dp/dp_offload.c). */
typedef struct glm_dp_ib glm_dp_ib;
/* ZeRO-3's sharded weights (parallel/dp/dp_zero3.c). */
typedef struct glm_dp_z3 glm_dp_z3;

typedef struct glm_dp {
    glm_dp_cfg cfg;
    glm_dist dist;
    int rank, world;
    glm_comm *comm;        /* the collectives of training: single, mpi or nccl */
    glm_comm *boot;        /* MPI when an MPI launcher started us (== comm on CPU ranks) */
    glm_model *m;
    glm_adamw *opt;
    int sharded;           /* ZeRO >= 1 with world > 1: opt->m/v/master hold this rank's shard only */
    size_t shard;          /* elements per rank: one piece of every bucket, in flat order */
    glm_cdtype gdt;        /* storage dtype of params/grads */
    glm_dp_bucket *b;      /* b[0] ends at the end of the flat buffer */
    int nb, armed, hook_failed;
    int last_batch;        /* the first bucket of the latest batch started together (one hook call) */
    int debug;             /* GLMTRAIN_DP_DEBUG=1: log the host time spent issuing collectives */
    double hook_s;         /* host time spent starting buckets in this backward (GLMTRAIN_DP_DEBUG) */
    int no_overlap;        /* GLMTRAIN_DP_NO_OVERLAP=1, a diagnostic: buckets wait for the end of backward */
    int zero2;             /* ZeRO-2 staging on (a whole model on world > 1 ranks) */
    char q8_file[64];      /* where checkpoints keep this model's 8-bit moments ("": optimizer_8bit.safetensors;
                            * a pipeline stage's own file, set by parallel/pipe/pipe_train.c) */
    glm_dp_z2 z2;
    glm_dp_peer *peer;     /* ZeRO 0/1 on the GPUs of one node: gradients move by copy engines (or NULL) */
    int z0_ag_backward;    /* GLMTRAIN_DP_Z0_AG_BACKWARD=1: ZeRO-0 all-gathers each bucket's sums right after its reduce-scatter */
    size_t align;          /* buckets, pieces and units start at multiples of align elements (x world) */
    void *hbuf;            /* offloaded: page-locked staging of the shard's gradients, then its new weights (S) */
    long off_ticket;       /* offloaded: the latest copy of new weights to the device */
    glm_dp_ib *ib;         /* the update inside backward, or NULL */
    glm_dp_z3 *z3;         /* ZeRO-3, or NULL */
    double ib_ss;          /* its sum of squares of the step's gradients */
    glm_err hook_err;      /* a failure inside the backward hook, returned by reduce_grads */
    int saved_stderr;      /* ranks > 0 log to a file; the terminal's stderr kept here (-1) */
} glm_dp;

/* ZeRO-2 (dp_zero2.c). */
int glm_dp_z2_attach(glm_dp *dp, glm_err *err);
void glm_dp_z2_micro_begin(glm_dp *dp);
void glm_dp_z2_ready(glm_dp *dp, size_t first);
int glm_dp_z2_finish(glm_dp *dp, glm_err *err);
void glm_dp_z2_free(glm_dp *dp);
/* The ranks that exchange gradients by the copy engines (dp_peer.c), the one rule the exchange
 * and the memory plan share: `world` GPU ranks over NCCL on one node, each holding the whole model
 * (one pipeline stage), ZeRO 0 or 1: 2 of them (measured faster than NCCL), any count up to 16
 * with GLMTRAIN_DP_PEER=1, none with GLMTRAIN_DP_PEER=0. 0 when the exchange is not used, and
 * with whole_update (GaLore: its update needs every bucket's sums before any projected row, which
 * NCCL's all-gathers give). */
int glm_dp_peer_ranks(int gpus_nccl, int world, int zero_stage, int one_node, int one_stage, int whole_update);
/* The copy-engine exchange (dp_peer.c; every call a no-op or 0 without CUDA). open: after the
 * buckets exist; sets dp->peer when every rank of the group can use it, else leaves NCCL. */
int glm_dp_peer_open(glm_dp *dp, glm_err *err);
void glm_dp_peer_free(glm_dp *dp);
/* Bucket i is final: copy each peer's piece of it into that peer's landing buffer. */
void glm_dp_peer_send(glm_dp *dp, int i);
/* After every bucket is sent (the last batch from bucket `last_batch` on): this rank's pieces
 * become the sums over all ranks (waits). */
int glm_dp_peer_reduce(glm_dp *dp, int last_batch, glm_err *err);
/* The sum of squares of this rank's pieces after glm_dp_peer_reduce (computed by its adds). */
double glm_dp_peer_sumsq(const glm_dp *dp);
/* The all-gathers go by copies too (unless GLMTRAIN_DP_PEER_AG=0). */
int glm_dp_peer_gathers(const glm_dp *dp);
/* Copies this rank's piece of bucket i (i < 0: none) of the gradients or parameters to the same
 * place on every peer once the compute stream's work so far is done, then (v != 0) sets each
 * peer's gathered flag for this rank to v. */
void glm_dp_peer_put(glm_dp *dp, int params, int i, unsigned v);
/* The compute stream goes on once every peer's gathered flag is >= v. */
void glm_dp_peer_wait_gathered(glm_dp *dp, unsigned v);
/* Steps exchanged so far (this step's number after glm_dp_peer_reduce). */
unsigned glm_dp_peer_step(const glm_dp *dp);
/* The update's copies are done before later work; waits (host) with --ddp_timeout, naming the
 * peers whose gathered flag stays below v. */
int glm_dp_peer_end_update(glm_dp *dp, unsigned v, glm_err *err);
/* Offload and the update inside backward (dp_offload.c). off_update: flat [lo, hi) with its state
 * at k updated on the host from grad (device, S), the new weights on their way back to param (off_done:
 * later compute waits for them); returns the gradients' sum of squares (times grad_scale^2). */
void glm_dp_off_attach(glm_dp *dp, size_t elems);
void glm_dp_off_free(glm_dp *dp);
double glm_dp_off_update(glm_dp *dp, size_t lo, size_t hi, size_t k, void *param, const void *grad, float lr,
                         float grad_scale, float bc1, float bc2);
void glm_dp_off_done(glm_dp *dp);
int glm_dp_ib_attach(glm_dp *dp, glm_err *err);
void glm_dp_ib_free(glm_dp *dp);
void glm_dp_ib_begin(glm_dp *dp, float lr, int backward);
void glm_dp_ib_ready(glm_dp *dp, size_t first);
void glm_dp_ib_micro(glm_dp *dp);
int glm_dp_ib_finish(glm_dp *dp, double *sumsq, glm_err *err);
int glm_dp_ib_step(glm_dp *dp, float lr, float grad_scale);
/* ZeRO-3 (dp_zero3.c): attach after the sharded optimizer state exists; the shard's weights at
 * state index k; the whole model gathered into a buffer of its own on every rank (collective,
 * kept until release_all: evaluation, saves; nothing without ZeRO-3) and back into the shard
 * (store_all, after loading a checkpoint). */
int glm_dp_z3_attach(glm_dp *dp, glm_err *err);
void glm_dp_z3_free(glm_dp *dp);
void *glm_dp_z3_shard(glm_dp *dp, size_t k);
int glm_dp_z3_gather_all(glm_dp *dp, glm_err *err);
void glm_dp_z3_release_all(glm_dp *dp);
void glm_dp_z3_store_all(glm_dp *dp);
/* After the update of the shard: the gathered units are stale. */
void glm_dp_z3_updated(glm_dp *dp);
/* Before a step's micro-batches, with the step's learning rate (the update inside backward needs
 * it then); backward = 0: the step has nothing to train on (no backward runs, no update). */
void glm_dp_begin_step(glm_dp *dp, float lr, int backward);
/* Before a step's micro-batches: zeroes the gradients (the model's, or nothing under ZeRO-2,
 * whose first micro-batch overwrites the shard). */
void glm_dp_zero_grads(glm_dp *dp);
/* Piece `rank` of bucket i: flat elements [*lo, *lo + returned count), kept at offset *off of
 * that rank's shard (pieces lie in the shard in flat order). */
size_t glm_dp_piece(const glm_dp *dp, int rank, int i, size_t *lo, size_t *off);
/* This rank's shard as flat ranges in ascending order (nb of them; free the result). */
glm_span *glm_dp_shard_spans(const glm_dp *dp);
/* Sum of squares of this rank's shard of the gradients, leaving out flat elements below skip
 * (one wait for the host). */
double glm_dp_shard_sumsq(glm_dp *dp, size_t skip);
/* Reads the launcher's environment and joins an MPI job when there is one. */
int glm_dp_open(glm_dp **out, const glm_dp_cfg *cfg, glm_err *err);
/* Whether glm_dp_attach keeps a gradient buffer of the model (or of a pipeline stage, when
 * whole_model is 0): 0 when it stages the gradients unit by unit (one process offloaded or
 * updating inside backward; ZeRO-2/3 over several ranks of a whole model), so the model is built
 * without one (glm_model_init_staged). */
int glm_dp_whole_grads(const glm_dp *dp, int whole_model);
/* BAdam's switch (optim/badam.h): the optimizer state afresh, its master copy (this rank's shard
 * of it under ZeRO-1) refilled from the weights now in the trainable buffer. */
void glm_dp_restart_optimizer(glm_dp *dp);
/* Ranks > 0 send stderr to <output_dir>/logs/rank-R.log. */
int glm_dp_redirect_log(glm_dp *dp, const char *output_dir, glm_err *err);
/* After the model is built on its backend: the GPU communicator (NCCL), the shard layout,
 * parameters broadcast from rank 0, buckets, the backward hook and the optimizer state (full,
 * or sharded). Replaces glm_adamw_init. */
int glm_dp_attach(glm_dp *dp, glm_model *m, glm_adamw *opt, float lr, float b1, float b2, float eps, float wd,
                  glm_err *err);
/* The step named in collective error messages. */
void glm_dp_set_step(glm_dp *dp, long step);
/* Host doubles summed over ranks (timeout: --ddp_timeout; long = rank 0 may be doing I/O). */
int glm_dp_sum(glm_dp *dp, double *v, int n, const char *what, glm_err *err);
int glm_dp_sum_long(glm_dp *dp, double *v, int n, const char *what, glm_err *err);
/* Before each micro-batch's forward_backward: buckets start during backward of the last one. */
void glm_dp_micro_begin(glm_dp *dp, int last);
/* Starts any bucket not started yet and waits for all gradient reductions. */
int glm_dp_reduce_grads(glm_dp *dp, glm_err *err);
/* The global gradient norm (times grad_scale); *loss_sum is summed over ranks on the way. */
int glm_dp_grad_norm(glm_dp *dp, float grad_scale, double *loss_sum, double *norm, glm_err *err);
/* AdamW (on this rank's shard when sharded) and the parameter all-gather. */
int glm_dp_optimizer_step(glm_dp *dp, float lr, float grad_scale, glm_err *err);
/* Checkpoints (dp_ckpt.c): rank 0 writes; every rank returns its result. */
int glm_dp_save(glm_dp *dp, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                const char *args_json, glm_err *err);
int glm_dp_load(glm_dp *dp, const char *dir, glm_train_state *st, glm_err *err);
/* The model's weights alone from a folder of the final save's layout (a --save_only_model
 * checkpoint), into every rank's model (ZeRO-3: into each rank's piece). */
int glm_dp_load_weights(glm_dp *dp, const char *dir, glm_err *err);
/* ok = 0 after a failure: MPI/NCCL are then torn down without the collective shutdown. */
void glm_dp_close(glm_dp *dp, int ok);
/* The whole optimizer state in host memory on rank 0 (o->m owns the block; free(o->m)), gathered
 * from the shards under ZeRO, with 8-bit moments' codes as stored (free them with
 * glm_opt_state_free_q8); every rank calls it. For writers with their own layout
 * (parallel/pipe/pipe_ckpt.c). */
int glm_dp_opt_state(glm_dp *dp, glm_opt_state *o, glm_err *err);

#endif
