/* ZeRO-3 for parallel/dp.c: the weights are sharded too.
 *
 * Everything ZeRO-2 does (parallel/dp_zero2.c: the units are the buckets, gradients staged per
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
 * Checkpoints, the final model, the parameter check before a save and evaluation (whose batches
 * need not be the same on every rank) gather the whole model into a buffer of its own first and
 * free it after (glm_dp_z3_gather_all / release_all).
 *
 * Not yet: prefetching the next unit while the current one computes (each gather waits), pipeline
 * stages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/dp.h"

struct glm_dp_z3 {
    void *ps;           /* [shard] this rank's pieces of the weights (S) */
    void *slot[2];      /* [largest unit] the gathered units, in turn */
    size_t slot_lo[2];  /* the unit in each slot (SIZE_MAX: none) */
    size_t slot_elems;
    int ring;
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

/* Unit i's pieces from every rank's shard into dst (the unit's first element at dst). */
static int gather_into(glm_dp *dp, int i, void *dst, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    glm_backend *be = dp->m->be;
    size_t lo = z->u[i].lo, n = z->u[i].n / (size_t)dp->world, off = lo / (size_t)dp->world;
    be->copy(be, glm_at(be, dst, (size_t)dp->rank * n), glm_at(be, z->ps, off), n * glm_dtype_size(be->dtype));
    char what[64];
    snprintf(what, sizeof what, "weights of unit at %zu", lo);
    if (dp->comm->allgather(dp->comm, dst, n, dp->gdt, what, err) || dp->comm->wait(dp->comm, -1, err)) return -1;
    return 0;
}

static void on_need(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_z3 *z = dp->z3;
    if (z->pinned || dp->hook_failed) return;
    for (int s = 0; s < 2; s++)
        if (z->slot_lo[s] == lo) return; /* still gathered, views bound there */
    int i = unit_of(z, lo);
    if (i < 0) return;
    int s = z->ring++ % 2;
    z->slot_lo[s] = SIZE_MAX;
    if (gather_into(dp, i, z->slot[s], &dp->hook_err)) { dp->hook_failed = 1; return; }
    z->slot_lo[s] = lo;
    glm_model_bind_unit(dp->m, lo, hi, z->slot[s]);
}

void glm_dp_z3_updated(glm_dp *dp) {
    if (dp->z3) dp->z3->slot_lo[0] = dp->z3->slot_lo[1] = SIZE_MAX; /* what the slots hold is the old weights */
}

int glm_dp_z3_gather_all(glm_dp *dp, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    if (!z || z->pinned) return 0;
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
    z->slot_lo[0] = z->slot_lo[1] = SIZE_MAX; /* the views point nowhere until the next need */
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
    for (int s = 0; s < 2; s++) {
        z->slot[s] = be->alloc(be, z->slot_elems * es);
        z->slot_lo[s] = SIZE_MAX;
    }
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
    if (strncmp(be->name, "cpu", 3) != 0 && dp->rank == 0)
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
    if (z->ps) be->free(be, z->ps);
    for (int s = 0; s < 2; s++)
        if (z->slot[s]) be->free(be, z->slot[s]);
    free(z->u);
    free(z);
    dp->z3 = NULL;
}
