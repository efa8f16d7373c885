/* `glmtrain train --nproc_per_node N` as its own launcher. Without a launcher's environment
 * (dist.h) and with N > 1 (or --nnodes > 1) this process starts the workers and supervises them:
 *   GPUs: N children of this binary with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
 *         LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT); NCCL meets over TCP there;
 *   CPU:  mpirun -np N of this binary (CPU ranks communicate through MPI), one node only.
 * Supervision: when a worker fails the others are stopped (SIGTERM, SIGKILL after a grace
 * period) and the launcher says which rank failed and how; SIGINT/SIGTERM to the launcher is
 * passed to the workers as SIGTERM (they stop at the next step boundary, after a checkpoint with
 * --save_on_interrupt); a second Ctrl-C kills them at once. */
#ifndef GLM_PARALLEL_LAUNCH_H
#define GLM_PARALLEL_LAUNCH_H
#include "core/err.h"
#include "parallel/par_opts.h"

/* 1 when this process must start the workers, 0 when it is one (or the only) process, -1 err. */
int glm_launch_wanted(const glm_par_opts *a, glm_err *err);
/* Starts and supervises the workers; returns the job's exit status (>= 0), or -1 with err when
 * they could not be started. argv: the train subcommand's flags, passed on unchanged. */
int glm_launch(const glm_par_opts *a, int argc, char **argv, glm_err *err);
/* The CUDA device of a worker: its local rank, modulo the visible GPUs (a launcher that gives
 * each task one GPU through CUDA_VISIBLE_DEVICES leaves device 0 for every local rank). */
int glm_local_device(int local_rank);
/* --nproc_per_node as a count: a positive number, or auto/gpu = the visible GPUs (1 without
 * GPUs or with --device cpu). */
int glm_launch_nproc(const char *s, const char *device, int *n, glm_err *err);

#endif
