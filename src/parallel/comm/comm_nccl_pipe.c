/* The pipeline's transport over NCCL for GPU ranks (parallel/comm/comm.h, kind "nccl-pipe"): exchange,
 * allreduce, sum_host and split, each complete when it returns (wait has nothing left to do).
 * Sends and receives are
 * queued on the backend's own stream, so they follow the compute that produced the data and
 * precede the compute that uses it without extra events. The communicator is non-blocking
 * (ncclConfig_t.blocking = 0), so no call can block on a dead peer: each operation records an
 * event that is polled against the deadline, and a timeout aborts the communicator
 * (ncclCommAbort), which frees the kernels waiting for the peer. NCCL_NVLS_ENABLE=0 is kept
 * (DESIGN.md: never NVLink multicast on the lent machines). */
#ifdef GLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/comm/comm_nccl.h"
#include "parallel/comm/signals.h"

#define HOST_MAX 4096 /* doubles per sum_host */

typedef struct nccl_pipe {
    ncclComm_t comm;
    cudaStream_t st;   /* the backend's stream (not owned) */
    cudaEvent_t done;
    double *dbuf, *hbuf; /* sum_host: device and pinned host */
} nccl_pipe;

static nccl_pipe *IM(glm_comm *c) { return (nccl_pipe *)c->impl; }

static void abort_comm(glm_comm *c) {
    if (IM(c)->comm) ncclCommAbort(IM(c)->comm);
    IM(c)->comm = NULL;
    c->broken = 1;
}


static int failed(glm_comm *c, const char *what, ncclResult_t r, glm_err *err) {
    glm_fail(err, "rank %d: pipeline %s at step %ld failed: NCCL %s", c->rank, what, c->step, ncclGetErrorString(r));
    abort_comm(c);
    return glm_hint(err, "another rank probably died; see its log (output_dir/logs/rank-N.log); NCCL_DEBUG=WARN tells more");
}

/* Waits until NCCL has accepted a non-blocking call (it returns ncclInProgress meanwhile). */
static int settle(glm_comm *c, ncclResult_t r, const char *what, glm_err *err) {
    double t0 = glm_now();
    for (long tries = 0; r == ncclInProgress; tries++) {
        int sig = glm_signal_pending();
        if (sig && c->interruptible) { abort_comm(c); return glm_comm_fail_exchange_signal(c, what, sig, err); }
        if (c->timeout > 0 && glm_now() - t0 > c->timeout) {
            abort_comm(c);
            return glm_comm_fail_exchange_timeout(c, what, -1, -1, glm_now() - t0, err);
        }
        glm_comm_backoff(tries);
        ncclCommGetAsyncError(IM(c)->comm, &r);
    }
    return r == ncclSuccess ? 0 : failed(c, what, r, err);
}

/* Polls the event recorded after the queued operation. */
static int wait_done(glm_comm *c, const char *what, int to, int from, glm_err *err) {
    nccl_pipe *im = IM(c);
    cudaEventRecord(im->done, im->st);
    double t0 = glm_now();
    for (long tries = 0;; tries++) {
        cudaError_t q = cudaEventQuery(im->done);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) {
            c->broken = 1;
            return glm_fail(err, "rank %d: pipeline %s at step %ld: CUDA error %s", c->rank, what, c->step,
                            cudaGetErrorString(q));
        }
        ncclResult_t a = ncclSuccess;
        ncclCommGetAsyncError(im->comm, &a);
        if (a != ncclSuccess && a != ncclInProgress) return failed(c, what, a, err);
        int sig = glm_signal_pending();
        if (sig && c->interruptible) { abort_comm(c); return glm_comm_fail_exchange_signal(c, what, sig, err); }
        double waited = glm_now() - t0;
        if (c->timeout > 0 && waited > c->timeout) {
            abort_comm(c);
            return glm_comm_fail_exchange_timeout(c, what, to, from, waited, err);
        }
        glm_comm_backoff(tries);
    }
}

static int n_exchange(glm_comm *c, const void *sbuf, size_t sbytes, int to, void *rbuf, size_t rbytes, int from, int tag,
                      const char *what, glm_err *err) {
    if (c->broken) return glm_fail(err, "rank %d: pipeline %s: the transport failed earlier", c->rank, what);
    nccl_pipe *im = IM(c);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess && to >= 0) r = ncclSend(sbuf, sbytes, ncclInt8, to, im->comm, im->st);
    if ((r == ncclSuccess || r == ncclInProgress) && from >= 0) r = ncclRecv(rbuf, rbytes, ncclInt8, from, im->comm, im->st);
    ncclResult_t e = ncclGroupEnd();
    if (settle(c, r == ncclSuccess || r == ncclInProgress ? e : r, what, err)) return -1;
    return wait_done(c, what, to, from, err);
}

static int sum_values(glm_comm *c, double *v, int n, const char *what, glm_err *err);

static int n_allreduce(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    if (c->broken) return glm_fail(err, "rank %d: pipeline %s: the transport failed earlier", c->rank, what);
    ncclResult_t r = ncclAllReduce(buf, buf, n, glm_nccl_type(dt), ncclSum, IM(c)->comm, IM(c)->st);
    if (settle(c, r, what, err)) return -1;
    return wait_done(c, what, -1, -1, err);
}

static int n_sum_host(glm_comm *c, double *v, int n, double timeout, const char *what, glm_err *err) {
    double keep = c->timeout;
    if (timeout >= 0) c->timeout = timeout; /* 0: no limit, as comm.h's wait */
    int rc = sum_values(c, v, n, what, err);
    c->timeout = keep;
    return rc;
}

static int n_wait(glm_comm *c, double timeout, glm_err *err) {
    return c->broken ? glm_fail(err, "rank %d: pipeline transport: it failed earlier", c->rank) : 0;
}

static int sum_values(glm_comm *c, double *v, int n, const char *what, glm_err *err) {
    nccl_pipe *im = IM(c);
    if (n > HOST_MAX) return glm_fail(err, "pipeline %s: %d values (at most %d)", what, n, HOST_MAX);
    memcpy(im->hbuf, v, sizeof(double) * (size_t)n);
    cudaMemcpyAsync(im->dbuf, im->hbuf, sizeof(double) * (size_t)n, cudaMemcpyHostToDevice, im->st);
    if (n_allreduce(c, im->dbuf, (size_t)n, GLM_C_F64, what, err)) return -1;
    cudaMemcpyAsync(im->hbuf, im->dbuf, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost, im->st);
    if (wait_done(c, what, -1, -1, err)) return -1;
    memcpy(v, im->hbuf, sizeof(double) * (size_t)n);
    return 0;
}

static void n_close(glm_comm *c) {
    nccl_pipe *im = IM(c);
    if (c->broken || !im->comm) {
        abort_comm(c);
    } else {
        ncclResult_t r = ncclCommFinalize(im->comm);
        glm_err e;
        if (settle(c, r, "shutdown", &e) == 0) ncclCommDestroy(im->comm);
    }
    cudaEventDestroy(im->done);
    cudaFree(im->dbuf);
    cudaFreeHost(im->hbuf);
    free(im);
    free(c);
}

static glm_comm *make(int rank, int world, cudaStream_t st, double timeout, glm_err *err);

static int n_split(glm_comm *c, int color, int key, glm_comm **out, glm_err *err) {
    *out = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(IM(c)->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) return failed(c, "communicator split", r, err);
    /* A non-blocking split completes in the background and may hand out the child's handle
     * only then: wait until the parent is idle again (the split done) before looking at nc.
     * (Looking first dropped the child on the GPUs: the tied embedding's gradients were then
     * never summed between the first and last pipeline stage.) */
    if (settle(c, ncclInProgress, "communicator split", err)) { if (nc) ncclCommAbort(nc); return -1; }
    if (color >= 0 && !nc) return glm_fail(err, "rank %d: communicator split (color %d) gave no communicator", c->rank, color);
    if (!nc) return 0;
    glm_comm *s = make(0, 0, IM(c)->st, c->timeout, err);
    if (!s) { ncclCommAbort(nc); return -1; }
    IM(s)->comm = nc;
    if (settle(s, ncclInProgress, "communicator split", err)) { n_close(s); return -1; }
    ncclCommUserRank(nc, &s->rank);
    ncclCommCount(nc, &s->world);
    s->step = c->step;
    s->interruptible = c->interruptible;
    *out = s;
    return 0;
}

static glm_comm *make(int rank, int world, cudaStream_t st, double timeout, glm_err *err) {
    glm_comm *c = glm_calloc(1, sizeof *c);
    nccl_pipe *im = glm_calloc(1, sizeof *im);
    c->kind = "nccl-pipe";
    c->rank = rank;
    c->world = world;
    c->timeout = timeout;
    c->interruptible = 1;
    c->impl = im;
    im->st = st;
    if (cudaEventCreateWithFlags(&im->done, cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc((void **)&im->dbuf, sizeof(double) * HOST_MAX) != cudaSuccess ||
        cudaMallocHost((void **)&im->hbuf, sizeof(double) * HOST_MAX) != cudaSuccess) {
        free(im);
        free(c);
        glm_fail(err, "rank %d: cannot set up the pipeline's NCCL buffers", rank);
        return NULL;
    }
    c->exchange = n_exchange;
    c->allreduce = n_allreduce;
    c->wait = n_wait;
    c->sum_host = n_sum_host;
    c->split = n_split;
    c->close = n_close;
    return c;
}

int glm_comm_nccl_pipe(glm_comm **out, int rank, int world, const void *id, void *stream, double timeout, glm_err *err) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    glm_comm *c = make(rank, world, (cudaStream_t)stream, timeout, err);
    if (!c) return -1;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&IM(c)->comm, world, u, rank, &cfg);
    if (settle(c, r, "communicator init", err)) { n_close(c); return -1; }
    *out = c;
    return 0;
}
#endif
