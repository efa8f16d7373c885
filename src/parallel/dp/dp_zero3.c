/* ZeRO-3 for parallel/dp/dp.c: the weights are sharded too.
 *
 * Everything ZeRO-2 does (parallel/dp/dp_zero2.c: the units are the buckets, gradients staged per
 * unit and reduce-scattered into each rank's shard) and, besides: rank r keeps only piece r of
 * every unit's weights at rest (`ps`, the shard, in the backend dtype), which its AdamW updates
 * in place; no parameter all-gather follows the update, and the model has no buffer of all its
 * weights. Before forward or backward reads a unit (the model's params_need hook: the embedding
 * and prefix encoder, each layer in forward, in the recompute and in backward, the final norm,
 * the head) its pieces are all-gathered into one of two unit-sized slots and the unit's weight
 * views are bound there (glm_model_bind_unit); the slots take the units in turn, so a unit
 * stays gathered until the next but one is needed. The same code runs on CPU ranks (MPI) and
 * GPU ranks (NCCL, in place on the slot).
 *
 * While a unit computes, the unit expected next (the next one in the direction of the last two
 * needs: up through forward, down through backward) is already being all-gathered into the other
 * slot, so its transfer runs beside the compute (NCCL's stream; MPI progresses it at each
 * poll). A wrong guess costs only the transfer: the unit needed is then gathered as before. A
 * slot's contents are bound to the model's views only when its unit is needed, after its gather
 * completed; both slots are forgotten after each update.
 *
 * Checkpoints, the final model, the parameter check before a save and evaluation (whose batches
 * need not be the same on every rank) gather the whole model into a buffer of its own first and
 * free it after (glm_dp_z3_gather_all / release_all).
 *
 * Not yet: pipeline stages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/dp/dp.h"

struct glm_dp_z3 {
    void *ps;           /* [shard] this rank's pieces of the weights (S) */
    void *slot[2];      /* [largest unit] the gathered units, in turn */
    size_t slot_lo[2];  /* the unit in each slot (SIZE_MAX: none) */
    size_t slot_elems;
    int pending;        /* the slot whose gather is started and not yet waited for (-1: none) */
    int cur;            /* the slot of the unit needed last (-1: none) */
    int last, prev;     /* the units needed last and before (-1: none): the direction of the next */
    long gathers, prefetched; /* unit gathers since attach, and how many of them were started ahead */
    glm_span *u;        /* the units */
    int nu;
    int pinned;         /* the whole model gathered into m->params (gather_all) */
};

void *glm_dp_z3_shard(glm_dp *dp, size_t k) { return glm_at(dp->m->be, dp->z3->ps, k); }

static int unit_of(const glm_dp_z3 *z, size_t lo) {
    for (int i = 0; i < z->nu; i++)
        if (z->u[i].lo == lo) return i;
    return -1;
}

/* Starts the all-gather of unit i's pieces from every rank's shard into dst (the unit's first
 * element at dst); the next comm->wait completes it. */
static int start_gather(glm_dp *dp, int i, void *dst, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    glm_backend *be = dp->m->be;
    size_t lo = z->u[i].lo, n = z->u[i].n / (size_t)dp->world, off = lo / (size_t)dp->world;
    be->copy(be, glm_at(be, dst, (size_t)dp->rank * n), glm_at(be, z->ps, off), n * glm_dtype_size(be->dtype));
    char what[64];
    snprintf(what, sizeof what, "weights of unit at %zu", lo);
    z->gathers++;
    return dp->comm->allgather(dp->comm, dst, n, dp->gdt, what, err);
}

static int gather_into(glm_dp *dp, int i, void *dst, glm_err *err) {
    return start_gather(dp, i, dst, err) || dp->comm->wait(dp->comm, -1, err) ? -1 : 0;
}

/* Completes a prefetch in flight (its slot then holds its unit). */
static int finish_pending(glm_dp *dp, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    if (z->pending < 0) return 0;
    z->pending = -1;
    return dp->comm->wait(dp->comm, -1, err);
}

static void on_need(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_z3 *z = dp->z3;
    if (z->pinned || dp->hook_failed) return;
    int i = unit_of(z, lo);
    if (i < 0) return;
    int s = z->slot_lo[0] == lo ? 0 : z->slot_lo[1] == lo ? 1 : -1;
    if (s >= 0 && s == z->pending && finish_pending(dp, &dp->hook_err)) { dp->hook_failed = 1; return; }
    if (s < 0) { /* not there: gather it into the slot the last unit is not in */
        if (finish_pending(dp, &dp->hook_err)) { dp->hook_failed = 1; return; }
        s = z->cur == 0 ? 1 : 0;
        z->slot_lo[s] = SIZE_MAX;
        if (gather_into(dp, i, z->slot[s], &dp->hook_err)) { dp->hook_failed = 1; return; }
        z->slot_lo[s] = lo;
    }
    glm_model_bind_unit(dp->m, lo, hi, z->slot[s]);
    z->cur = s;
    if (i != z->last) { z->prev = z->last; z->last = i; }
    /* the next unit in the direction of the last two, into the other slot */
    int next = z->prev < 0 ? -1 : i + (i > z->prev ? 1 : -1), o = 1 - s;
    if (next < 0 || next >= z->nu || z->pending >= 0 || z->slot_lo[o] == z->u[next].lo) return;
    z->slot_lo[o] = SIZE_MAX;
    if (start_gather(dp, next, z->slot[o], &dp->hook_err)) { dp->hook_failed = 1; return; }
    z->slot_lo[o] = z->u[next].lo;
    z->pending = o;
    z->prefetched++;
}

/* Both slots forgotten (a prefetch in flight is completed by the caller's next wait). */
static void forget_slots(glm_dp_z3 *z) {
    z->slot_lo[0] = z->slot_lo[1] = SIZE_MAX;
    z->pending = z->cur = -1;
}

void glm_dp_z3_updated(glm_dp *dp) {
    if (dp->z3) forget_slots(dp->z3); /* what the slots hold is the old weights */
}

int glm_dp_z3_gather_all(glm_dp *dp, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    if (!z || z->pinned) return 0;
    if (finish_pending(dp, err)) return -1;
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    size_t bytes = m->flat_cap * glm_dtype_size(be->dtype);
    void *full = be->alloc(be, bytes);
    be->zero(be, full, bytes);
    for (int i = 0; i < z->nu; i++)
        if (gather_into(dp, i, glm_at(be, full, z->u[i].lo), err)) { be->free(be, full); return -1; }
    glm_model_swap_params(m, full);
    z->pinned = 1;
    return 0;
}

void glm_dp_z3_release_all(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    if (!z || !z->pinned) return;
    dp->m->be->free(dp->m->be, glm_model_swap_params(dp->m, NULL));
    z->pinned = 0;
    forget_slots(z); /* the views point nowhere until the next need */
}

void glm_dp_z3_store_all(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    glm_backend *be = dp->m->be;
    for (int i = 0; i < z->nu; i++) {
        size_t n = z->u[i].n / (size_t)dp->world;
        be->copy(be, glm_at(be, z->ps, z->u[i].lo / (size_t)dp->world), glm_at(be, dp->m->params, z->u[i].lo + (size_t)dp->rank * n),
                 n * glm_dtype_size(be->dtype));
    }
    be->sync(be);
}

int glm_dp_z3_attach(glm_dp *dp, glm_err *err) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    glm_dp_z3 *z = glm_calloc(1, sizeof *z);
    dp->z3 = z;
    size_t es = glm_dtype_size(be->dtype);
    z->u = glm_malloc(sizeof *z->u * (size_t)(m->cfg.num_layers + 2));
    z->nu = glm_model_units(m, z->u);
    for (int i = 0; i < z->nu; i++) z->slot_elems = z->u[i].n > z->slot_elems ? z->u[i].n : z->slot_elems;
    z->ps = be->alloc(be, dp->shard * es);
    for (int s = 0; s < 2; s++) z->slot[s] = be->alloc(be, z->slot_elems * es);
    forget_slots(z);
    z->last = z->prev = -1;
    /* this rank's pieces of the (broadcast) weights; then the whole buffer goes */
    for (int i = 0; i < z->nu; i++) {
        size_t n = z->u[i].n / (size_t)dp->world;
        be->copy(be, glm_at(be, z->ps, z->u[i].lo / (size_t)dp->world), glm_at(be, m->params, z->u[i].lo + (size_t)dp->rank * n),
                 n * es);
    }
    be->sync(be);
    be->free(be, glm_model_swap_params(m, NULL));
    m->params_need = on_need;
    m->params_ctx = dp;
    double MiB = 1048576.0;
    glm_info("ZeRO-3: weights %.1f MiB per rank at rest (the shard) + two unit slots of %.1f MiB instead of %.1f MiB",
             dp->shard * es / MiB, z->slot_elems * es / MiB, m->tab.total * es / MiB);
    if (glm_backend_on_gpu(be) && dp->rank == 0)
        glm_info("ZeRO-3 on GPU ranks is new: proven on CPU ranks only so far (docs/OPTIMIZER.md)");
    (void)err;
    return 0;
}

void glm_dp_z3_free(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    if (!z) return;
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    if (!m->params) {
        /* a buffer of the model's own again, for its free (the weights were saved before: nothing
         * reads them after training) */
        size_t bytes = m->flat_cap * glm_dtype_size(be->dtype);
        void *p = be->alloc(be, bytes);
        be->zero(be, p, bytes);
        glm_model_swap_params(m, p);
    }
    m->params_need = NULL;
    m->params_ctx = NULL;
    if (z->gathers > 0)
        glm_info("ZeRO-3: %ld unit gathers, %ld of them started ahead while the unit before computed", z->gathers, z->prefetched);
    if (z->ps) be->free(be, z->ps);
    for (int s = 0; s < 2; s++)
        if (z->slot[s]) be->free(be, z->slot[s]);
    free(z->u);
    free(z);
    dp->z3 = NULL;
}
