/* The single-process communicator and what every implementation shares: the failure texts
 * and the polling pause. */
#include "parallel/comm/comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "parallel/comm/signals.h"

int glm_comm_fail_timeout(glm_comm *c, const char *op, const char *what, double waited, glm_err *err) {
    c->broken = 1;
    glm_fail(err, "rank %d: %s '%s' at step %ld timed out after %.0f s waiting for peers", c->rank, op, what, c->step,
             waited);
    return glm_hint(err, "another rank died, hangs or is much slower; see its log (output_dir/logs/rank-N.log) "
                         "and raise --ddp_timeout if a slow step is expected");
}

int glm_comm_fail_signal(glm_comm *c, const char *op, const char *what, int sig, glm_err *err) {
    c->broken = 1;
    glm_fail(err, "rank %d: %s '%s' at step %ld interrupted by %s", c->rank, op, what, c->step, glm_signal_name(sig));
    return glm_hint(err, "the launcher stops every rank when one exits or on Ctrl-C; look for the first failing rank");
}

int glm_comm_fail_broken(glm_comm *c, const char *op, const char *what, glm_err *err) {
    return glm_fail(err, "rank %d: %s '%s' at step %ld: the communicator failed earlier", c->rank, op, what, c->step);
}

int glm_comm_fail_exchange_timeout(glm_comm *c, const char *what, int to, int from, double waited, glm_err *err) {
    c->broken = 1;
    char peers[64] = "";
    if (to >= 0 && from >= 0) snprintf(peers, sizeof peers, " (to rank %d, from rank %d)", to, from);
    else if (to >= 0) snprintf(peers, sizeof peers, " (to rank %d)", to);
    else if (from >= 0) snprintf(peers, sizeof peers, " (from rank %d)", from);
    glm_fail(err, "rank %d: pipeline %s%s at step %ld timed out after %.0f s", c->rank, what, peers, c->step, waited);
    return glm_hint(err, "a neighbouring stage died, hangs or is much slower; see its log (output_dir/logs/rank-N.log) "
                         "and raise --ddp_timeout if a slow step is expected");
}

int glm_comm_fail_exchange_signal(glm_comm *c, const char *what, int sig, glm_err *err) {
    c->broken = 1;
    glm_fail(err, "rank %d: pipeline %s at step %ld interrupted by %s", c->rank, what, c->step, glm_signal_name(sig));
    return glm_hint(err, "the launcher stops every rank when one exits or on Ctrl-C; look for the first failing rank");
}

void glm_comm_backoff(long tries) {
    if (tries < 64) return;
    struct timespec ts = {0, tries < 4096 ? 20000 : 200000}; /* 20 us, then 0.2 ms */
    nanosleep(&ts, NULL);
}

int glm_comm_allreduce_sync(glm_comm *c, void *buf, size_t n, glm_cdtype dt, const char *what, glm_err *err) {
    if (c->allreduce(c, buf, n, dt, what, err)) return -1;
    return c->wait(c, -1, err);
}

int glm_comm_barrier(glm_comm *c, double timeout, const char *what, glm_err *err) {
    double z = 0;
    return c->sum_host(c, &z, 1, timeout, what, err);
}

/* ---------------------------------------------------------------- single process */

static int s_allreduce(glm_comm *c, void *b, size_t n, glm_cdtype t, const char *w, glm_err *e) { return 0; }
/* one rank: the sum is its own part, which callers reduce in place or copy themselves */
static int s_reduce_scatter(glm_comm *c, const void *s, void *r, size_t n, glm_cdtype t, const char *w, glm_err *e) {
    return s == r ? 0 : glm_fail(e, "reduce_scatter '%s' out of place on a single-process communicator", w);
}
static int s_started(glm_comm *c) { return 0; }
static int s_allgather(glm_comm *c, void *b, size_t n, glm_cdtype t, const char *w, glm_err *e) { return 0; }
static int s_bcast(glm_comm *c, void *b, size_t n, glm_cdtype t, int root, const char *w, glm_err *e) { return 0; }
static int s_wait(glm_comm *c, double timeout, glm_err *e) { return 0; }
static int s_fence(glm_comm *c, int k, glm_err *e) { return 0; }
static void s_poke(glm_comm *c) {}
static int s_sum_host(glm_comm *c, double *v, int n, double timeout, const char *w, glm_err *e) { return 0; }
static void s_close(glm_comm *c) { free(c); }
static int s_exchange(glm_comm *c, const void *sb, size_t sn, int to, void *rb, size_t rn, int from, int tag, const char *w,
                      glm_err *e) {
    return to < 0 && from < 0 ? 0 : glm_fail(e, "pipeline %s: one process has no other stage to exchange with", w);
}
static int s_split(glm_comm *c, int color, int key, glm_comm **out, glm_err *e) {
    *out = color < 0 ? NULL : glm_comm_single();
    return 0;
}

/* With one rank the gathered buffer is the sent one; the pointers may be device memory, which
 * this file cannot copy, so callers with world 1 skip the gather (dp.c does). */
static int s_gather(glm_comm *c, const void *send, void *recv, size_t n, glm_cdtype t, int root, const char *w,
                    glm_err *e) {
    return send == recv ? 0 : glm_fail(e, "gather '%s' on a single-process communicator", w);
}

glm_comm *glm_comm_single(void) {
    glm_comm *c = glm_calloc(1, sizeof *c);
    c->kind = "single";
    c->world = 1;
    c->ordered = 1;
    c->allreduce = s_allreduce;
    c->reduce_scatter = s_reduce_scatter;
    c->started = s_started;
    c->allgather = s_allgather;
    c->gather = s_gather;
    c->bcast = s_bcast;
    c->wait = s_wait;
    c->fence = s_fence;
    c->poke = s_poke;
    c->sum_host = s_sum_host;
    c->close = s_close;
    c->exchange = s_exchange;
    c->split = s_split;
    return c;
}
