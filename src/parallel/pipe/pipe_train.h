/* Pipeline parallelism inside `glmtrain train` (train/train.c calls these when
 * --pipeline_parallel_size P > 1; parallel/pipe/pipeline.h has the schedule).
 *
 * The job's W = P x D ranks (mpirun, torchrun, or --nproc_per_node W) are laid out as
 * rank = replica * P + stage. glm_pp_open turns the data-parallel object (parallel/dp/dp.h) into
 * the stage's data-parallel group: dp->rank is the replica, dp->world = D, dp->comm reaches
 * the D replicas of this stage only — so everything dp.c does (loader shares, gradient buckets,
 * ZeRO shards and their checkpoints) works per stage unchanged. What must span the whole job
 * goes through glm_pp_sum (all W ranks): the loss (known on last stages), the gradient norm
 * (every stage's part, the tied head's copy once), votes to stop, barriers around checkpoints.
 *
 * GPUs: one rendezvous at MASTER_ADDR:MASTER_PORT brings P + 1 NCCL ids from rank 0: the
 * pipeline's send/receive communicator over all ranks and one per stage's replicas. CPU ranks:
 * MPI, with the replicas split off MPI_COMM_WORLD. */
#ifndef GLM_PARALLEL_PIPE_TRAIN_H
#define GLM_PARALLEL_PIPE_TRAIN_H
#include <stdio.h>
#include "parallel/dp/dp.h"
#include "parallel/pipe/pipe_ckpt.h"
#include "parallel/pipe/pipeline.h"
#include "parallel/par_opts.h"

typedef struct glm_pp {
    glm_pipe pipe;
    glm_comm *world;      /* all ranks */
    glm_dp *dp;          /* not owned */
    int world_rank, world_size;
    double busy_acc, step_acc; /* seconds since the last stats line */
    long steps_acc;
} glm_pp;

/* The map the flags describe (also for P = 1: the whole model as one stage), for the memory
 * check and `glmtrain info`. */
int glm_pp_map(const glm_par_opts *a, const glm_config *c, int cuda, glm_device_map *map, glm_stage_shape *sh,
               glm_err *err);
/* Refuses a run whose memory plan of any stage exceeds --max_memory_per_gpu (nothing to do
 * without the flag). D: data-parallel replicas (ZeRO >= 1 divides the optimizer state). */
int glm_pp_check_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, glm_err *err);
/* Without --max_memory_per_gpu, the same check against the GPU's whole memory (device_bytes): a
 * run planned past it cannot fit, so it is refused before anything is allocated, with the
 * layouts that would fit, instead of running out of memory part-way. The plan has come out 2-5%
 * under the measured peaks, never over, so a run that fits is not refused. */
int glm_pp_check_device_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, size_t device_bytes,
                               glm_err *err);
/* "12.5 GiB", or MiB below 1 GiB (tiny models), so the plans' numbers say something. */
const char *glm_plan_size_str(char *buf, size_t n, double bytes);
/* --gradient_checkpointing auto: the level with the least recompute (none, then selective, then
 * full) whose plan fits every stage in cap bytes (cap <= 0: none); full when nothing fits (the
 * memory check then says what would). *plan: that level's largest stage plan. */
int glm_pp_pick_checkpointing(const glm_par_opts *a, const glm_config *c, int cuda, int D, double cap, double *plan);
/* With --offload_optimizer cpu: refuses a plan whose host memory (times the ranks on this node)
 * exceeds what the node has available, naming both and the layouts that need less. On the CPU
 * backend (cuda 0) the same for the whole plan, which lives in host memory there. */
int glm_pp_check_host_memory(const glm_par_opts *a, const glm_config *c, int cuda, int D, int local_ranks, glm_err *err);
/* The memory plan of each stage (the whole model when there is no pipeline), one line each,
 * computed from the tensor table before anything is allocated. */
void glm_pp_print_plan(const glm_par_opts *a, const glm_config *c, int cuda, int D, FILE *out);

/* After glm_dp_open and the backend are made, before the model: see above. */
int glm_pp_open(glm_pp **out, glm_dp *dp, const glm_par_opts *a, const glm_config *c, glm_backend *be, glm_err *err);
/* Closes the pipeline's communicators (before glm_dp_close). */
void glm_pp_close(glm_pp *pp, int ok);
/* This stage's model. */
void glm_pp_model_init(glm_pp *pp, glm_model *m, const glm_config *c, glm_backend *be);
/* After glm_dp_attach (or a resume): the tied head's copy from the first stage. */
int glm_pp_ready(glm_pp *pp, glm_err *err);

/* Host doubles summed over every rank (long: without the usual timeout, e.g. while rank 0
 * builds the data cache). */
int glm_pp_sum(glm_pp *pp, double *v, int n, int long_wait, const char *what, glm_err *err);
/* Forward and backward of the step's k micro-batches (1F1B) and the tied head's gradient sum;
 * *loss_sum on last stages. glm_dp_reduce_grads follows. */
int glm_pp_forward_backward(glm_pp *pp, const glm_batch *mb, int k, float dscale, double *loss_sum, glm_err *err);
/* After glm_dp_reduce_grads: the loss and the global gradient norm (times grad_scale) over
 * every rank. */
int glm_pp_grad_norm(glm_pp *pp, float grad_scale, double *loss_sum, double *norm, glm_err *err);
/* Evaluation of one batch: v[0] += loss sum, v[1] += supervised tokens (on last stages; sum
 * over ranks afterwards). */
int glm_pp_eval(glm_pp *pp, const glm_batch *b, double v[2], glm_err *err);
/* Checkpoint / final model in the shared layout (parallel/pipe/pipe_ckpt.h). */
int glm_pp_save(glm_pp *pp, const char *output_dir, const glm_train_state *st, const char *tokenizer_path,
                const char *args_json, glm_err *err);
int glm_pp_save_final(glm_pp *pp, const char *output_dir, int file_dtype, const char *tokenizer_path,
                      const char *args_json, glm_err *err);
/* A log line on rank 0 about the steps since the last call: each stage's compute time and
 * the bubble (the share of the step a stage waits), next to 1F1B's (P - 1) / (M + P - 1).
 * Collective; line is "" on other ranks. */
int glm_pp_stats(glm_pp *pp, int M, char *line, size_t n, glm_err *err);

#endif
