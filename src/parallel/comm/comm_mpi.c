/* Collectives and the pipeline's sends over MPI for CPU ranks (host buffers, fp32/fp64). Each
 * collective posts MPI_I* requests; wait polls them with MPI_Test against a deadline, so a dead
 * or hung peer becomes an error naming this rank, the collective and the step instead of a
 * hang. exchange posts its sends and receives and polls them at once. Errors are returned
 * (MPI_ERRORS_RETURN), never fatal inside MPI. */
#ifdef GLM_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/signals.h"

#define MAX_CHUNK ((size_t)1 << 30) /* elements per MPI call: counts are int */

typedef struct pending {
    MPI_Request req;
    const char *op; /* a literal */
    char what[80];  /* copied: callers may format it */
} pending;

typedef struct mpi_impl {
    pending *p;
    int n, cap;
    MPI_Datatype block64[2]; /* 64 floats / 64 doubles: counts above INT_MAX for allgather/gather */
    MPI_Comm comm;           /* MPI_COMM_WORLD, or a part of it (glm_comm_mpi_split) */
    int sub;                 /* comm is a split: closing frees it instead of finalising MPI */
} mpi_impl;

static mpi_impl *IM(glm_comm *c) { return (mpi_impl *)c->impl; }

static int mpi_type(glm_cdtype dt, MPI_Datatype *t) {
    if (dt == GLM_C_F32) *t = MPI_FLOAT;
    else if (dt == GLM_C_F64) *t = MPI_DOUBLE;
    else return -1;
    return 0;
}

static int check_start(glm_comm *c, const char *op, const char *what, glm_cdtype dt, MPI_Datatype *t, glm_err *err) {
    if (c->broken) return glm_comm_fail_broken(c, op, what, err);
    if (mpi_type(dt, t)) return glm_fail(err, "rank %d: %s '%s': MPI ranks exchange fp32/fp64 only", c->rank, op, what);
    return 0;
}

static int mpi_failed(glm_comm *c, const char *op, const char *what, int rc, glm_err *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    c->broken = 1;
    glm_fail(err, "rank %d: %s '%s' at step %ld failed: %s", c->rank, op, what, c->step, msg);
    return glm_hint(err, "another rank probably died; see its log (output_dir/logs/rank-N.log)");
}

static int push(glm_comm *c, MPI_Request r, const char *op, const char *what) {
    mpi_impl *im = IM(c);
    if (im->n == im->cap) {
        im->cap = im->cap ? 2 * im->cap : 64;
        im->p = glm_realloc(im->p, sizeof *im->p * (size_t)im->cap);
    }
    pending *p = &im->p[im->n++];
    p->req = r;
    p->op = op;
    snprintf(p->what, sizeof p->what, "%s", what);
    return 0;
}

/* A large count as (count, type): plain elements while they fit an int, else 64-element blocks. */
static int big_count(glm_comm *c, size_t n, glm_cdtype dt, MPI_Datatype t, int *cnt, MPI_Datatype *ct) {
    if (n <= INT_MAX) { *cnt = (int)n; *ct = t; return 0; }
    if (n % 64 || n / 64 > INT_MAX) return -1;
    *cnt = (int)(n / 64);
    *ct = IM(c)->block64[dt == GLM_C_F64];
    return 0;
}

static int m_allreduce(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    MPI_Datatype t;
    if (check_start(c, "allreduce", what, dt, &t, err)) return -1;
    size_t es = glm_cdtype_size(dt);
    for (size_t i = 0; i < n; i += MAX_CHUNK) {
        int k = (int)(n - i < MAX_CHUNK ? n - i : MAX_CHUNK);
        MPI_Request r;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + i * es, k, t, MPI_SUM, IM(c)->comm, &r);
        if (rc != MPI_SUCCESS) return mpi_failed(c, "allreduce", what, rc, err);
        push(c, r, "allreduce", what);
    }
    return 0;
}

/* One part: send[n] of every rank summed into recv[n] on root (recv may be send there). */
static int m_reduce(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, int root, const char *what,
                    glm_err *err) {
    MPI_Datatype t;
    if (check_start(c, "reduce_scatter", what, dt, &t, err)) return -1;
    size_t es = glm_cdtype_size(dt);
    for (size_t i = 0; i < n; i += MAX_CHUNK) {
        int k = (int)(n - i < MAX_CHUNK ? n - i : MAX_CHUNK);
        const char *s = (const char *)send + i * es;
        char *r = (char *)recv + i * es;
        MPI_Request q;
        int rc = c->rank != root ? MPI_Ireduce(s, NULL, k, t, MPI_SUM, root, IM(c)->comm, &q)
                 : s == r        ? MPI_Ireduce(MPI_IN_PLACE, r, k, t, MPI_SUM, root, IM(c)->comm, &q)
                                 : MPI_Ireduce(s, r, k, t, MPI_SUM, root, IM(c)->comm, &q);
        if (rc != MPI_SUCCESS) return mpi_failed(c, "reduce_scatter", what, rc, err);
        push(c, q, "reduce_scatter", what);
    }
    return 0;
}

/* As one reduce per part to the rank that keeps it: MPI_Reduce_scatter_block has no in-place
 * form that leaves rank r's part at r*n, and the parts' traffic is the same. */
static int m_reduce_scatter(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, const char *what,
                            glm_err *err) {
    size_t es = glm_cdtype_size(dt);
    for (int r = 0; r < c->world; r++) {
        const char *part = (const char *)send + (size_t)r * n * es;
        if (m_reduce(c, part, r == c->rank ? recv : NULL, n, dt, r, what, err)) return -1;
    }
    return 0;
}

static int m_started(glm_comm *c) { return IM(c)->n; }

static int m_allgather(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    MPI_Datatype t = MPI_FLOAT, ct;
    int cnt;
    if (check_start(c, "allgather", what, dt, &t, err)) return -1;
    if (big_count(c, n, dt, t, &cnt, &ct)) return glm_fail(err, "rank %d: allgather '%s': %zu elements per rank is too many for MPI", c->rank, what, n);
    MPI_Request r;
    int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, ct, IM(c)->comm, &r);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "allgather", what, rc, err);
    return push(c, r, "allgather", what);
}

static int m_gather(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype dt, int root, const char *what,
                    glm_err *err) {
    MPI_Datatype t = MPI_FLOAT, ct;
    int cnt;
    if (check_start(c, "gather", what, dt, &t, err)) return -1;
    if (big_count(c, n, dt, t, &cnt, &ct)) return glm_fail(err, "rank %d: gather '%s': %zu elements per rank is too many for MPI", c->rank, what, n);
    MPI_Request r;
    int rc = MPI_Igather(send, cnt, ct, c->rank == root ? recv : NULL, cnt, ct, root, IM(c)->comm, &r);
    if (rc != MPI_SUCCESS) return mpi_failed(c, "gather", what, rc, err);
    return push(c, r, "gather", what);
}

static int m_bcast(glm_comm *c, void *buf, size_t n, glm_cdtype dt, int root, const char *what, glm_err *err) {
    MPI_Datatype t;
    if (check_start(c, "broadcast", what, dt, &t, err)) return -1;
    size_t es = glm_cdtype_size(dt);
    for (size_t i = 0; i < n; i += MAX_CHUNK) {
        int k = (int)(n - i < MAX_CHUNK ? n - i : MAX_CHUNK);
        MPI_Request r;
        int rc = MPI_Ibcast((char *)buf + i * es, k, t, root, IM(c)->comm, &r);
        if (rc != MPI_SUCCESS) return mpi_failed(c, "broadcast", what, rc, err);
        push(c, r, "broadcast", what);
    }
    return 0;
}

static void m_poke(glm_comm *c) {
    mpi_impl *im = IM(c);
    for (int i = 0; i < im->n; i++) {
        int done = 0;
        if (im->p[i].req != MPI_REQUEST_NULL) MPI_Test(&im->p[i].req, &done, MPI_STATUS_IGNORE);
    }
}

/* Completes the requests in the order they were started; the first one that does not finish
 * in time is the one named. */
static int m_wait(glm_comm *c, double timeout, glm_err *err) {
    mpi_impl *im = IM(c);
    if (timeout < 0) timeout = c->timeout;
    double t0 = glm_now();
    int rc = 0;
    for (int i = 0; i < im->n && rc == 0; i++) {
        pending *p = &im->p[i];
        for (long tries = 0; p->req != MPI_REQUEST_NULL; tries++) {
            int done = 0, e = MPI_Test(&p->req, &done, MPI_STATUS_IGNORE);
            if (e != MPI_SUCCESS) { rc = mpi_failed(c, p->op, p->what, e, err); break; }
            if (done) break;
            int sig = glm_signal_pending();
            if (sig && c->interruptible) { rc = glm_comm_fail_signal(c, p->op, p->what, sig, err); break; }
            double waited = glm_now() - t0;
            if (timeout > 0 && waited > timeout) { rc = glm_comm_fail_timeout(c, p->op, p->what, waited, err); break; }
            glm_comm_backoff(tries);
        }
    }
    /* after a failure the remaining requests stay posted: the process is about to exit */
    im->n = 0;
    return rc;
}

static int m_fence(glm_comm *c, int k, glm_err *err) { return IM(c)->n ? m_wait(c, -1, err) : 0; }

static int m_sum_host(glm_comm *c, double *v, int n, double timeout, const char *what, glm_err *err) {
    if (m_allreduce(c, v, (size_t)n, GLM_C_F64, what, err)) return -1;
    return m_wait(c, timeout, err);
}

/* ---- point to point ---- */

#define BYTE_CHUNK ((size_t)1 << 30) /* bytes per MPI send: counts are int */

/* Waits for an exchange's n requests; to/from name the peers in a timeout message. */
static int wait_exchange(glm_comm *c, MPI_Request *r, int n, const char *what, int to, int from, glm_err *err) {
    double t0 = glm_now();
    for (long tries = 0;; tries++) {
        int done = 0, e = MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (e != MPI_SUCCESS) return mpi_failed(c, "pipeline", what, e, err);
        if (done) return 0;
        int sig = glm_signal_pending();
        if (sig && c->interruptible) return glm_comm_fail_exchange_signal(c, what, sig, err);
        double waited = glm_now() - t0;
        if (c->timeout > 0 && waited > c->timeout) return glm_comm_fail_exchange_timeout(c, what, to, from, waited, err);
        glm_comm_backoff(tries);
    }
}

/* Posts a message as pieces of at most BYTE_CHUNK bytes (one empty piece for 0 bytes). */
static int post(glm_comm *c, int send, void *buf, size_t bytes, int peer, int tag, MPI_Request *r, int *n) {
    size_t o = 0;
    do {
        int k = (int)(bytes - o < BYTE_CHUNK ? bytes - o : BYTE_CHUNK), e;
        e = send ? MPI_Isend((char *)buf + o, k, MPI_BYTE, peer, tag, IM(c)->comm, &r[(*n)++])
                 : MPI_Irecv((char *)buf + o, k, MPI_BYTE, peer, tag, IM(c)->comm, &r[(*n)++]);
        if (e != MPI_SUCCESS) return e;
        o += (size_t)k;
    } while (o < bytes);
    return MPI_SUCCESS;
}

static int m_exchange(glm_comm *c, const void *sbuf, size_t sbytes, int to, void *rbuf, size_t rbytes, int from, int tag,
                      const char *what, glm_err *err) {
    if (c->broken) return glm_fail(err, "rank %d: pipeline %s: the transport failed earlier", c->rank, what);
    size_t nreq = (to >= 0 ? sbytes / BYTE_CHUNK + 1 : 0) + (from >= 0 ? rbytes / BYTE_CHUNK + 1 : 0);
    MPI_Request *r = glm_malloc(sizeof *r * (nreq ? nreq : 1));
    int n = 0, e = MPI_SUCCESS;
    tag &= 0x7fff; /* MPI guarantees tags up to 32767 */
    if (from >= 0) e = post(c, 0, rbuf, rbytes, from, tag, r, &n);
    if (to >= 0 && e == MPI_SUCCESS) e = post(c, 1, (void *)sbuf, sbytes, to, tag, r, &n);
    int rc = e != MPI_SUCCESS ? mpi_failed(c, "pipeline", what, e, err) : wait_exchange(c, r, n, what, to, from, err);
    free(r);
    return rc;
}

static int m_split(glm_comm *c, int color, int key, glm_comm **out, glm_err *err) {
    if (glm_comm_mpi_split(c, color, key, out, err)) return -1;
    if (*out) (*out)->step = c->step;
    return 0;
}

static void m_close(glm_comm *c) {
    mpi_impl *im = IM(c);
    /* a broken job must not enter MPI_Finalize: it synchronises with peers that may be gone */
    if (!c->broken) {
        MPI_Type_free(&im->block64[0]);
        MPI_Type_free(&im->block64[1]);
        if (im->sub) MPI_Comm_free(&im->comm); /* the world communicator finalises MPI */
        else MPI_Finalize();
    }
    free(im->p);
    free(im);
    free(c);
}

int glm_comm_mpi(glm_comm **out, glm_err *err) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return glm_fail(err, "MPI_Init failed"), glm_hint(err, "launch CPU ranks with mpirun (OpenMPI) or --nproc_per_node");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    glm_comm *c = glm_calloc(1, sizeof *c);
    mpi_impl *im = glm_calloc(1, sizeof *im);
    MPI_Type_contiguous(64, MPI_FLOAT, &im->block64[0]);
    MPI_Type_contiguous(64, MPI_DOUBLE, &im->block64[1]);
    MPI_Type_commit(&im->block64[0]);
    MPI_Type_commit(&im->block64[1]);
    im->comm = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    c->kind = "mpi";
    c->impl = im;
    c->timeout = 1800;
    c->allreduce = m_allreduce;
    c->reduce_scatter = m_reduce_scatter;
    c->started = m_started;
    c->allgather = m_allgather;
    c->gather = m_gather;
    c->bcast = m_bcast;
    c->wait = m_wait;
    c->fence = m_fence;
    c->poke = m_poke;
    c->sum_host = m_sum_host;
    c->close = m_close;
    c->exchange = m_exchange;
    c->split = m_split;
    *out = c;
    return 0;
}

int glm_comm_mpi_split(glm_comm *parent, int color, int key, glm_comm **out, glm_err *err) {
    MPI_Comm nc;
    *out = NULL;
    int rc = MPI_Comm_split(IM(parent)->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) return mpi_failed(parent, "split", "communicator", rc, err);
    if (nc == MPI_COMM_NULL) return 0;
    glm_comm *c;
    if (glm_comm_mpi(&c, err)) return -1; /* MPI is up: this only builds the object */
    IM(c)->comm = nc;
    IM(c)->sub = 1;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(nc, &c->rank);
    MPI_Comm_size(nc, &c->world);
    c->timeout = parent->timeout;
    c->interruptible = parent->interruptible;
    *out = c;
    return 0;
}
#endif
