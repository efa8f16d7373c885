/* Collectives over NCCL for GPU ranks (device buffers in the backend's dtype). They run on a
 * stream of their own: each starts after the work queued on the backend's stream so far (an
 * event), so a gradient bucket is reduced while backward continues on the compute stream.
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): no call can block on a dead
 * peer; wait polls the per-collective events against the deadline and, on timeout, aborts
 * the communicator (ncclCommAbort) and reports the collective. Keep NCCL_NVLS_ENABLE=0 on the
 * lent machines (the launcher sets it; so does this file when unset). */
#ifdef GLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/comm/comm_nccl.h"
#include "parallel/comm/signals.h"

#define HOST_MAX 65536 /* doubles per sum_host */

typedef struct op_rec {
    cudaEvent_t done; /* recorded on the collectives' stream after it */
    const char *op;
    char what[80];
} op_rec;

typedef struct nccl_impl {
    ncclComm_t comm;
    cudaStream_t compute, cs;
    cudaEvent_t ready;
    op_rec *ops;
    int n, cap;
    double *dbuf, *hbuf; /* sum_host: device and pinned host */
    void *reg[4];        /* user buffers registered with the communicator */
    int nreg;
} nccl_impl;

static nccl_impl *IM(glm_comm *c) { return (nccl_impl *)c->impl; }

/* Ends the communicator at once, unblocking kernels that wait for a peer. */
static void abort_comm(glm_comm *c) {
    if (IM(c)->comm) ncclCommAbort(IM(c)->comm);
    IM(c)->comm = NULL;
    c->broken = 1;
}


static int nccl_failed(glm_comm *c, const char *op, const char *what, ncclResult_t r, glm_err *err) {
    glm_fail(err, "rank %d: %s '%s' at step %ld failed: NCCL %s (%s)", c->rank, op, what, c->step, ncclGetErrorString(r),
             ncclGetLastError(IM(c)->comm));
    abort_comm(c);
    return glm_hint(err, "another rank probably died; see its log (output_dir/logs/rank-N.log); NCCL_DEBUG=WARN tells more");
}

/* A non-blocking call returns ncclInProgress while NCCL still sets it up (connections to
 * peers are made lazily); it is usable once the async state leaves that. */
static int settle(glm_comm *c, ncclResult_t r, const char *op, const char *what, double timeout, glm_err *err) {
    double t0 = glm_now();
    for (long tries = 0; r == ncclInProgress; tries++) {
        int sig = glm_signal_pending();
        if (sig && c->interruptible) { abort_comm(c); return glm_comm_fail_signal(c, op, what, sig, err); }
        if (timeout > 0 && glm_now() - t0 > timeout) {
            abort_comm(c);
            return glm_comm_fail_timeout(c, op, what, glm_now() - t0, err);
        }
        glm_comm_backoff(tries);
        ncclCommGetAsyncError(IM(c)->comm, &r);
    }
    return r == ncclSuccess ? 0 : nccl_failed(c, op, what, r, err);
}
static int begin(glm_comm *c, const char *op, const char *what, glm_err *err) {
    if (c->broken) return glm_comm_fail_broken(c, op, what, err);
    nccl_impl *im = IM(c);
    if (c->detached) return 0;
    cudaEventRecord(im->ready, im->compute);
    cudaStreamWaitEvent(im->cs, im->ready, 0);
    return 0;
}

static int finish(glm_comm *c, ncclResult_t r, const char *op, const char *what, glm_err *err) {
    if (settle(c, r, op, what, c->timeout, err)) return -1;
    nccl_impl *im = IM(c);
    if (im->n == im->cap) {
        int cap = im->cap ? 2 * im->cap : 64;
        im->ops = glm_realloc(im->ops, sizeof *im->ops * (size_t)cap);
        for (int i = im->cap; i < cap; i++) cudaEventCreateWithFlags(&im->ops[i].done, cudaEventDisableTiming);
        im->cap = cap;
    }
    op_rec *o = &im->ops[im->n++];
    o->op = op;
    snprintf(o->what, sizeof o->what, "%s", what);
    cudaEventRecord(o->done, im->cs);
    return 0;
}

static int n_allreduce(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    if (begin(c, "allreduce", what, err)) return -1;
    ncclResult_t r = ncclAllReduce(buf, buf, n, glm_nccl_type(dt), ncclSum, IM(c)->comm, IM(c)->cs);
    return finish(c, r, "allreduce", what, err);
}

static int n_reduce_scatter(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, const char *what,
                            glm_err *err) {
    if (begin(c, "reduce_scatter", what, err)) return -1;
    ncclResult_t r = ncclReduceScatter(send, recv, n, glm_nccl_type(dt), ncclSum, IM(c)->comm, IM(c)->cs);
    return finish(c, r, "reduce_scatter", what, err);
}

static int n_started(glm_comm *c) { return IM(c)->n; }

static int n_allgather(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    if (begin(c, "allgather", what, err)) return -1;
    const char *mine = (const char *)buf + (size_t)c->rank * n * glm_cdtype_size(dt);
    ncclResult_t r = ncclAllGather(mine, buf, n, glm_nccl_type(dt), IM(c)->comm, IM(c)->cs);
    return finish(c, r, "allgather", what, err);
}

static int n_gather(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, int root, const char *what,
                    glm_err *err) {
    if (begin(c, "gather", what, err)) return -1;
    nccl_impl *im = IM(c);
    size_t bytes = n * glm_cdtype_size(dt);
    ncclResult_t r = ncclGroupStart();
    if (c->rank == root) {
        cudaMemcpyAsync((char *)recv + (size_t)root * bytes, send, bytes, cudaMemcpyDeviceToDevice, im->cs);
        for (int p = 0; p < c->world && r == ncclSuccess; p++)
            if (p != root) r = ncclRecv((char *)recv + (size_t)p * bytes, n, glm_nccl_type(dt), p, im->comm, im->cs);
    } else {
        r = ncclSend(send, n, glm_nccl_type(dt), root, im->comm, im->cs);
    }
    ncclResult_t e = ncclGroupEnd();
    return finish(c, r == ncclSuccess || r == ncclInProgress ? e : r, "gather", what, err);
}

static int n_bcast(glm_comm *c, void *buf, size_t n, glm_cdtype dt, int root, const char *what, glm_err *err) {
    if (begin(c, "broadcast", what, err)) return -1;
    ncclResult_t r = ncclBroadcast(buf, buf, n, glm_nccl_type(dt), root, IM(c)->comm, IM(c)->cs);
    return finish(c, r, "broadcast", what, err);
}

static void n_poke(glm_comm *c) {} /* NCCL progresses on its own */

/* User-buffer registration: lets NCCL's NVLink transport read and write the gradient and
 * parameter buffers directly instead of through its own staging buffers (one copy fewer each
 * way; docs/PERF.md has the measured ZeRO all-gather). cudaMalloc'd buffers need NCCL_LOCAL_REGISTER and
 * NCCL_LEGACY_CUDA_REGISTER, set at communicator creation unless the user set them.
 * GLMTRAIN_NCCL_REGISTER=0 turns it off; a failure only logs. */
static void n_register(glm_comm *c, void *buf, size_t bytes) {
    nccl_impl *im = IM(c);
    const char *e = getenv("GLMTRAIN_NCCL_REGISTER");
    if ((e && strcmp(e, "0") == 0) || c->broken || im->nreg == (int)(sizeof im->reg / sizeof im->reg[0])) return;
    void *h = NULL;
    ncclResult_t r = ncclCommRegister(im->comm, buf, bytes, &h);
    for (double t0 = glm_now(); r == ncclInProgress && glm_now() - t0 < 60;) ncclCommGetAsyncError(im->comm, &r);
    if (r != ncclSuccess) { glm_info("NCCL buffer registration: %s; continuing without", ncclGetErrorString(r)); return; }
    im->reg[im->nreg++] = h;
}

static int n_wait(glm_comm *c, double timeout, glm_err *err) {
    nccl_impl *im = IM(c);
    if (timeout < 0) timeout = c->timeout;
    double t0 = glm_now();
    int rc = 0;
    for (int i = 0; i < im->n && rc == 0; i++) {
        op_rec *o = &im->ops[i];
        for (long tries = 0;; tries++) {
            cudaError_t q = cudaEventQuery(o->done);
            if (q == cudaSuccess) break;
            if (q != cudaErrorNotReady) {
                c->broken = 1;
                rc = glm_fail(err, "rank %d: %s '%s' at step %ld: CUDA error %s", c->rank, o->op, o->what, c->step,
                              cudaGetErrorString(q));
                break;
            }
            ncclResult_t a = ncclSuccess;
            ncclCommGetAsyncError(im->comm, &a);
            if (a != ncclSuccess && a != ncclInProgress) { rc = nccl_failed(c, o->op, o->what, a, err); break; }
            int sig = glm_signal_pending();
            if (sig && c->interruptible) { rc = glm_comm_fail_signal(c, o->op, o->what, sig, err); break; }
            double waited = glm_now() - t0;
            if (timeout > 0 && waited > timeout) { rc = glm_comm_fail_timeout(c, o->op, o->what, waited, err); break; }
            glm_comm_backoff(tries);
        }
    }
    if (rc) abort_comm(c); /* frees the kernels stuck waiting for the peer */
    else if (im->n > 0) /* the compute stream goes on after the last (they run in order) */
        cudaStreamWaitEvent(im->compute, im->ops[im->n - 1].done, 0);
    im->n = 0;
    return rc;
}

static int n_fence(glm_comm *c, int k, glm_err *err) {
    nccl_impl *im = IM(c);
    if (k < 0 || k >= im->n) return glm_fail(err, "rank %d: fence on collective %d of %d started", c->rank, k, im->n);
    cudaStreamWaitEvent(im->compute, im->ops[k].done, 0);
    return 0;
}

static int n_sum_host(glm_comm *c, double *v, int n, double timeout, const char *what, glm_err *err) {
    nccl_impl *im = IM(c);
    if (n > HOST_MAX) return glm_fail(err, "sum_host '%s': %d values (at most %d)", what, n, HOST_MAX);
    if (c->broken) return glm_comm_fail_broken(c, "allreduce", what, err);
    memcpy(im->hbuf, v, sizeof(double) * (size_t)n);
    cudaMemcpyAsync(im->dbuf, im->hbuf, sizeof(double) * (size_t)n, cudaMemcpyHostToDevice, im->cs);
    ncclResult_t r = ncclAllReduce(im->dbuf, im->dbuf, (size_t)n, ncclFloat64, ncclSum, im->comm, im->cs);
    if (settle(c, r, "allreduce", what, timeout < 0 ? c->timeout : timeout, err)) return -1;
    cudaMemcpyAsync(im->hbuf, im->dbuf, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost, im->cs);
    if (finish(c, ncclSuccess, "allreduce", what, err) || n_wait(c, timeout, err)) return -1;
    memcpy(v, im->hbuf, sizeof(double) * (size_t)n);
    return 0;
}

static void n_close(glm_comm *c) {
    nccl_impl *im = IM(c);
    if (c->broken) {
        abort_comm(c);
    } else {
        for (int i = 0; i < im->nreg; i++) ncclCommDeregister(im->comm, im->reg[i]);
        ncclResult_t r = ncclCommFinalize(im->comm);
        glm_err e;
        if (settle(c, r, "finalize", "communicator", c->timeout, &e) == 0) ncclCommDestroy(im->comm);
    }
    for (int i = 0; i < im->cap; i++) cudaEventDestroy(im->ops[i].done);
    cudaEventDestroy(im->ready);
    cudaStreamDestroy(im->cs);
    cudaFree(im->dbuf);
    cudaFreeHost(im->hbuf);
    free(im->ops);
    free(im);
    free(c);
}

int glm_nccl_unique_id(void *id, glm_err *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return glm_fail(err, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

int glm_comm_nccl(glm_comm **out, int rank, int world, const void *id, void *compute_stream, double timeout,
                  glm_err *err) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* never NVLink multicast on the lent machines (DESIGN.md) */
    setenv("NCCL_LOCAL_REGISTER", "1", 0);       /* user buffers (n_register) ... */
    setenv("NCCL_LEGACY_CUDA_REGISTER", "1", 0); /* ... allocated with cudaMalloc */
    glm_comm *c = glm_calloc(1, sizeof *c);
    nccl_impl *im = glm_calloc(1, sizeof *im);
    c->kind = "nccl";
    c->ordered = 1;
    c->rank = rank;
    c->world = world;
    c->timeout = timeout;
    c->impl = im;
    im->compute = (cudaStream_t)compute_stream;
    /* the collectives' stream has the highest priority: a collective kernel gets SMs as soon as
     * any free up, so a ZeRO piece's all-gather runs beside the AdamW of the next piece instead
     * of after it (docs/PERF.md) */
    int lo_prio = 0, hi_prio = 0;
    cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio);
    if (cudaStreamCreateWithPriority(&im->cs, cudaStreamNonBlocking, hi_prio) != cudaSuccess ||
        cudaEventCreateWithFlags(&im->ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaMalloc((void **)&im->dbuf, sizeof(double) * HOST_MAX) != cudaSuccess ||
        cudaMallocHost((void **)&im->hbuf, sizeof(double) * HOST_MAX) != cudaSuccess) {
        free(im); free(c);
        return glm_fail(err, "rank %d: cannot set up the NCCL stream and buffers", rank);
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&im->comm, world, u, rank, &cfg);
    c->allreduce = n_allreduce;
    c->reduce_scatter = n_reduce_scatter;
    c->started = n_started;
    c->register_buffer = n_register;
    c->allgather = n_allgather;
    c->gather = n_gather;
    c->bcast = n_bcast;
    c->wait = n_wait;
    c->fence = n_fence;
    c->poke = n_poke;
    c->sum_host = n_sum_host;
    c->close = n_close;
    if (settle(c, r, "init", "NCCL communicator", timeout, err)) { n_close(c); return -1; }
    *out = c;
    return 0;
}
#endif
