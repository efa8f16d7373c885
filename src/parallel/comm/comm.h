/* One communicator interface for data and pipeline parallelism, four implementations:
 *   single     one process: every operation is a no-op (world 1);
 *   mpi        CPU ranks under mpirun (host buffers; MPI_I* collectives and sends polled with
 *              MPI_Test): the data-parallel collectives and the pipeline's transport alike (the
 *              pipeline takes a split of its own, so its messages never match the collectives');
 *   nccl       GPU ranks' data-parallel collectives (device buffers, own stream; the unique id
 *              from a TCP rendezvous or MPI);
 *   nccl-pipe  GPU ranks' pipeline transport (comm_nccl_pipe.c: sends, receives and sums queued
 *              on the backend's stream so they are ordered with the compute, on a non-blocking
 *              NCCL communicator polled against a deadline and aborted on timeout; its
 *              operations complete before they return).
 *
 * Collectives on buffers are STARTED by the calls below and complete at comm->wait, so a
 * gradient bucket's reduction can run while backward goes on. Every rank must start the same
 * collectives in the same order. No wait blocks forever: after `timeout` seconds without
 * completion (or when SIGINT/SIGTERM arrives and `interruptible` is set) it fails with
 *   "rank R: allreduce 'grads' at step S timed out after T s waiting for peers"
 * and the communicator is marked broken (later calls fail at once; closing it skips the
 * collective shutdown that a dead peer would hang). Counts are elements of `dt`. */
#ifndef GLM_PARALLEL_COMM_H
#define GLM_PARALLEL_COMM_H
#include <stddef.h>
#include "core/err.h"

typedef enum glm_cdtype { GLM_C_F32, GLM_C_BF16, GLM_C_F16, GLM_C_F64 } glm_cdtype;
static inline size_t glm_cdtype_size(glm_cdtype t) { return t == GLM_C_F64 ? 8 : t == GLM_C_F32 ? 4 : 2; }

typedef struct glm_comm glm_comm;
struct glm_comm {
    const char *kind;   /* "single", "mpi", "nccl" */
    int rank, world;
    double timeout;     /* seconds a wait may take; <= 0 waits without limit */
    long step;          /* the training step, named in error messages */
    int interruptible;  /* a pending SIGINT/SIGTERM ends a wait (off with --save_on_interrupt) */
    int broken;         /* a collective failed or timed out */
    int ordered;        /* collectives run in the order started (NCCL: one stream) */
    int detached;       /* collectives started now need nothing queued on the compute stream
                         * since the last wait (their data is final): they may start at once */
    void *impl;

    /* sum over ranks, in place */
    int (*allreduce)(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err);
    /* recv[n] = the sum over ranks of part `rank` of send[world * n]; in place when recv is
     * send + rank * n (the rest of send is then left undefined) */
    int (*reduce_scatter)(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, const char *what,
                          glm_err *err);
    /* collectives started since the last wait (the next one started gets this index) */
    int (*started)(glm_comm *c);
    /* in place: rank r contributes buf[r*n, (r+1)*n) and every rank receives all world*n */
    int (*allgather)(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err);
    /* recv[r*n ...] on root = send of rank r (recv unused elsewhere) */
    int (*gather)(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, int root, const char *what,
                  glm_err *err);
    int (*bcast)(glm_comm *c, void *buf, size_t n, glm_cdtype dt, int root, const char *what, glm_err *err);
    /* Completes everything started. timeout: < 0 uses c->timeout, 0 waits without limit. */
    int (*wait)(glm_comm *c, double timeout, glm_err *err);
    /* Work queued on the compute stream from now on runs after collective number k (counting
     * from 0 since the last wait) has completed. NCCL: a device-side wait, the host does not
     * block; MPI: completes everything started. Hangs are still caught by the next wait. */
    int (*fence)(glm_comm *c, int k, glm_err *err);
    /* Lets started collectives progress without waiting (MPI has no progress thread). */
    void (*poke)(glm_comm *c);
    /* Host doubles summed over ranks, blocking (barrier = one zero). timeout as in wait. */
    int (*sum_host)(glm_comm *c, double *v, int n, double timeout, const char *what, glm_err *err);
    void (*close)(glm_comm *c);
    /* optional (NULL: nothing to do): tells the library a long-lived buffer that collectives
     * will use, so it can move data straight from and to it (NCCL user-buffer registration) */
    void (*register_buffer)(glm_comm *c, void *buf, size_t bytes);

    /* ---- point to point (the pipeline's stages; NULL on the nccl data-parallel communicator,
     * whose ranks are replicas, and only exchange, allreduce, wait, sum_host, split and close
     * on nccl-pipe) ---- */
    /* Sends sbuf[sbytes] to rank `to` and receives rbuf[rbytes] from rank `from` (-1: none),
     * both in flight at once; returns when both are complete, which is what the 1F1B schedule
     * needs to stay deadlock-free (a stage's "send activations forward, receive gradients back"
     * pairs with the next stage's "send gradients back, receive the next activations"). tag
     * tells messages between the same pair apart (MPI; NCCL matches in order). A wait past the
     * timeout fails naming both peers and the step (glm_comm_fail_exchange_timeout). */
    int (*exchange)(glm_comm *c, const void *sbuf, size_t sbytes, int to, void *rbuf, size_t rbytes, int from, int tag,
                    const char *what, glm_err *err);
    /* Every rank calls it: ranks with the same color >= 0 form *out (ordered by key); color < 0
     * takes part and gets NULL. The result keeps c's timeout, step and interruptible. */
    int (*split)(glm_comm *c, int color, int key, glm_comm **out, glm_err *err);
};

glm_comm *glm_comm_single(void);
#ifdef GLM_HAVE_MPI
/* MPI_Init (thread level funneled) and MPI_COMM_WORLD with errors returned, not fatal. */
int glm_comm_mpi(glm_comm **out, glm_err *err);
/* The ranks of parent with the same color >= 0 as a communicator of their own, ordered by key
 * (MPI_Comm_split; every rank of parent calls it, color < 0 gets NULL): e.g. the data-parallel
 * replicas of one pipeline stage. Closing it leaves MPI running. */
int glm_comm_mpi_split(glm_comm *parent, int color, int key, glm_comm **out, glm_err *err);
#endif
#ifdef GLM_HAVE_CUDA
/* NCCL over `world` ranks of which this is `rank`; `id` is the 128-byte ncclUniqueId every rank
 * got from rank 0; compute_stream the backend's stream (collectives start after the work queued
 * there so far). Init itself is bounded by timeout. */
int glm_comm_nccl(glm_comm **out, int rank, int world, const void *id, void *compute_stream, double timeout,
                  glm_err *err);
/* A fresh ncclUniqueId (on rank 0) into id[128]. */
int glm_nccl_unique_id(void *id, glm_err *err);
/* The pipeline's transport over `world` GPU ranks (kind "nccl-pipe", see above) from a
 * 128-byte ncclUniqueId every rank got from rank 0; stream is the backend's (glm_cuda_stream). */
int glm_comm_nccl_pipe(glm_comm **out, int rank, int world, const void *id, void *stream, double timeout,
                       glm_err *err);
#endif

/* Blocking forms: start + wait with c->timeout. */
int glm_comm_allreduce_sync(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err);
int glm_comm_barrier(glm_comm *c, double timeout, const char *what, glm_err *err);

/* ---- for the implementations ---- */
/* The uniform failure text; marks c broken. */
int glm_comm_fail_timeout(glm_comm *c, const char *op, const char *what, double waited, glm_err *err);
int glm_comm_fail_signal(glm_comm *c, const char *op, const char *what, int sig, glm_err *err);
int glm_comm_fail_broken(glm_comm *c, const char *op, const char *what, glm_err *err);
/* The pipeline's texts: "rank R: pipeline WHAT (to rank X, from rank Y) at step S timed out after
 * T s" (to/from -1: not named), and the same for a signal; they mark c broken. */
int glm_comm_fail_exchange_timeout(glm_comm *c, const char *what, int to, int from, double waited, glm_err *err);
int glm_comm_fail_exchange_signal(glm_comm *c, const char *what, int sig, glm_err *err);
/* A polling loop's pause: nothing for the first tries, then short sleeps (ranks may share cores). */
void glm_comm_backoff(long tries);

#endif
