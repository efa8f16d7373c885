/* Pipeline point-to-point over MPI for CPU ranks (parallel/p2p.h). The communicator is a
 * duplicate of MPI_COMM_WORLD (or a split of one), so its messages never match those of the
 * data-parallel collectives. Requests are polled with MPI_Test against a deadline: a dead or
 * stuck neighbour becomes an error naming both ranks, not a hang. */
#ifdef GLM_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "core/log.h"
#include "parallel/p2p.h"
#include "parallel/signals.h"

#define CHUNK ((size_t)1 << 30) /* bytes per MPI call: counts are int */

typedef struct mpi_p2p { MPI_Comm comm; } mpi_p2p;
static MPI_Comm COMM(glm_p2p *c) { return ((mpi_p2p *)c->impl)->comm; }

static int mpi_failed(glm_p2p *c, const char *what, int rc, glm_err *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    c->broken = 1;
    glm_fail(err, "rank %d: pipeline %s at step %ld failed: %s", c->rank, what, c->step, msg);
    return glm_hint(err, "another rank probably died; see its log (output_dir/logs/rank-N.log)");
}

/* Waits for n requests; to/from name the peers in a timeout message. */
static int wait_all(glm_p2p *c, MPI_Request *r, int n, const char *what, int to, int from, glm_err *err) {
    double t0 = glm_now();
    for (long tries = 0;; tries++) {
        int done = 0, e = MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
        if (e != MPI_SUCCESS) return mpi_failed(c, what, e, err);
        if (done) return 0;
        int sig = glm_signal_pending();
        if (sig && c->interruptible) return glm_p2p_fail_signal(c, what, sig, err);
        double waited = glm_now() - t0;
        if (c->timeout > 0 && waited > c->timeout) return glm_p2p_fail_timeout(c, what, to, from, waited, err);
        glm_comm_backoff(tries);
    }
}

/* Posts a message as pieces of at most CHUNK bytes (one empty piece for 0 bytes). */
static int post(glm_p2p *c, int send, void *buf, size_t bytes, int peer, int tag, MPI_Request *r, int *n) {
    size_t o = 0;
    do {
        int k = (int)(bytes - o < CHUNK ? bytes - o : CHUNK), e;
        e = send ? MPI_Isend((char *)buf + o, k, MPI_BYTE, peer, tag, COMM(c), &r[(*n)++])
                 : MPI_Irecv((char *)buf + o, k, MPI_BYTE, peer, tag, COMM(c), &r[(*n)++]);
        if (e != MPI_SUCCESS) return e;
        o += (size_t)k;
    } while (o < bytes);
    return MPI_SUCCESS;
}

static int m_exchange(glm_p2p *c, const void *sbuf, size_t sbytes, int to, void *rbuf, size_t rbytes, int from, int tag,
                      const char *what, glm_err *err) {
    if (c->broken) return glm_fail(err, "rank %d: pipeline %s: the transport failed earlier", c->rank, what);
    size_t nreq = (to >= 0 ? sbytes / CHUNK + 1 : 0) + (from >= 0 ? rbytes / CHUNK + 1 : 0);
    MPI_Request *r = glm_malloc(sizeof *r * (nreq ? nreq : 1));
    int n = 0, e = MPI_SUCCESS;
    tag &= 0x7fff; /* MPI guarantees tags up to 32767 */
    if (from >= 0) e = post(c, 0, rbuf, rbytes, from, tag, r, &n);
    if (to >= 0 && e == MPI_SUCCESS) e = post(c, 1, (void *)sbuf, sbytes, to, tag, r, &n);
    int rc = e != MPI_SUCCESS ? mpi_failed(c, what, e, err) : wait_all(c, r, n, what, to, from, err);
    free(r);
    return rc;
}

static int m_allreduce(glm_p2p *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    if (dt != GLM_C_F32 && dt != GLM_C_F64)
        return glm_fail(err, "rank %d: pipeline %s: MPI ranks exchange fp32/fp64 only", c->rank, what);
    MPI_Datatype t = dt == GLM_C_F32 ? MPI_FLOAT : MPI_DOUBLE;
    size_t es = glm_cdtype_size(dt), step = CHUNK / es;
    for (size_t i = 0; i < n; i += step) {
        int k = (int)(n - i < step ? n - i : step);
        MPI_Request r;
        int e = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + i * es, k, t, MPI_SUM, COMM(c), &r);
        if (e != MPI_SUCCESS) return mpi_failed(c, what, e, err);
        if (wait_all(c, &r, 1, what, -1, -1, err)) return -1;
    }
    return 0;
}

static int m_sum_host(glm_p2p *c, double *v, int n, const char *what, glm_err *err) {
    return m_allreduce(c, v, (size_t)n, GLM_C_F64, what, err);
}

static void m_close(glm_p2p *c) {
    /* freeing a communicator is collective in spirit; a broken job must not wait on peers */
    if (!c->broken) MPI_Comm_free(&((mpi_p2p *)c->impl)->comm);
    free(c->impl);
    free(c);
}

static glm_p2p *wrap(MPI_Comm comm);

static int m_split(glm_p2p *c, int color, int key, glm_p2p **out, glm_err *err) {
    MPI_Comm nc;
    *out = NULL;
    int e = MPI_Comm_split(COMM(c), color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (e != MPI_SUCCESS) return mpi_failed(c, "communicator split", e, err);
    if (nc == MPI_COMM_NULL) return 0;
    *out = wrap(nc);
    (*out)->timeout = c->timeout;
    (*out)->step = c->step;
    (*out)->interruptible = c->interruptible;
    return 0;
}

static glm_p2p *wrap(MPI_Comm comm) {
    glm_p2p *c = glm_calloc(1, sizeof *c);
    mpi_p2p *im = glm_calloc(1, sizeof *im);
    im->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->world);
    c->kind = "mpi";
    c->impl = im;
    c->timeout = 1800;
    c->interruptible = 1;
    c->exchange = m_exchange;
    c->allreduce = m_allreduce;
    c->sum_host = m_sum_host;
    c->split = m_split;
    c->close = m_close;
    return c;
}

int glm_p2p_mpi(glm_p2p **out, glm_err *err) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return glm_fail(err, "pipeline transport: MPI is not initialised"), glm_hint(err, "launch CPU ranks with mpirun");
    MPI_Comm dup;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) return glm_fail(err, "pipeline transport: MPI_Comm_dup failed");
    *out = wrap(dup);
    return 0;
}
#endif
