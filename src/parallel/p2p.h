/* Point-to-point transport for pipeline stages, beside the collectives of parallel/comm.h:
 *   mpi   CPU ranks (host buffers; MPI_Isend/Irecv on a duplicate of MPI_COMM_WORLD, polled
 *         with MPI_Test against a deadline);
 *   nccl  GPU ranks (device buffers; ncclSend/ncclRecv in one group on the backend's stream, so
 *         they are ordered with the compute; a non-blocking communicator polled against a
 *         deadline and aborted on timeout).
 * exchange sends one buffer and receives another at once (either may be absent), which is
 * what the 1F1B schedule needs to stay deadlock-free: a stage's "send activations forward,
 * receive gradients back" pairs with the next stage's "send gradients back, receive the next
 * activations". split makes sub-communicators (MPI_Comm_split / ncclCommSplit): the two ends of
 * a tied embedding, or the replicas of one stage. A wait that runs past `timeout` seconds (or
 * meets SIGINT/SIGTERM when `interruptible`) fails naming the rank, the peer, the operation and
 * the step, and marks the transport broken. */
#ifndef GLM_PARALLEL_P2P_H
#define GLM_PARALLEL_P2P_H
#include <stddef.h>
#include "core/err.h"
#include "parallel/comm.h"

typedef struct glm_p2p glm_p2p;
struct glm_p2p {
    const char *kind;  /* "mpi", "nccl" */
    int rank, world;   /* in this communicator */
    double timeout;    /* seconds; <= 0 waits without limit */
    long step;         /* named in error messages */
    int interruptible;
    int broken;
    void *impl;

    /* Sends sbuf[sbytes] to rank `to` and receives rbuf[rbytes] from rank `from` (-1: none),
     * both in flight at once; returns when both are complete. tag tells messages between the
     * same pair apart (MPI; NCCL matches in order). */
    int (*exchange)(glm_p2p *c, const void *sbuf, size_t sbytes, int to, void *rbuf, size_t rbytes, int from, int tag,
                    const char *what, glm_err *err);
    /* In-place sum over the ranks, blocking. */
    int (*allreduce)(glm_p2p *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err);
    /* Host doubles summed over the ranks, blocking. */
    int (*sum_host)(glm_p2p *c, double *v, int n, const char *what, glm_err *err);
    /* Every rank calls it: ranks with the same color >= 0 form *out (ordered by key); color < 0
     * takes part and gets NULL. */
    int (*split)(glm_p2p *c, int color, int key, glm_p2p **out, glm_err *err);
    void (*close)(glm_p2p *c);
};

#ifdef GLM_HAVE_MPI
/* Over a duplicate of MPI_COMM_WORLD; MPI must be initialised (glm_comm_mpi does it). */
int glm_p2p_mpi(glm_p2p **out, glm_err *err);
#endif
#ifdef GLM_HAVE_CUDA
/* NCCL over `world` ranks from a 128-byte ncclUniqueId every rank got from rank 0; stream is
 * the backend's (glm_cuda_stream). */
int glm_p2p_nccl(glm_p2p **out, int rank, int world, const void *id, void *stream, double timeout, glm_err *err);
#endif

/* The uniform failure texts; they mark c broken. */
int glm_p2p_fail_timeout(glm_p2p *c, const char *what, int to, int from, double waited, glm_err *err);
int glm_p2p_fail_signal(glm_p2p *c, const char *what, int sig, glm_err *err);

#endif
