/* ZeRO-3 for parallel/dp.c: the weights are sharded too.
 *
 * Everything ZeRO-2 does (parallel/dp_zero2.c: the units are the buckets, gradients staged per
 * unit and reduce-scattered into each rank's shard) and, besides: rank r keeps only piece r of
 * every unit's weights at rest (`ps`, the shard, in the backend dtype), which its AdamW updates
 * in place; no parameter all-gather follows the update. The model's parameter buffer becomes a
 * window: the full flat address range, reserved but backed by memory only where a unit is
 * gathered. Before forward or backward reads a unit (the model's params_need hook) its pieces
 * are all-gathered into the window; when it is through with them (params_done) the unit's pages
 * are given back. So a rank holds its shard and the units in use, not the model. The layer
 * code is unchanged: it reads m->params at the table's offsets as always.
 *
 * The window is page-aligned: units start at multiples of 1024 x ranks elements (a 4 KiB page of
 * fp32 per rank). On CPU ranks it is an mmap'd range whose pages madvise(MADV_DONTNEED) returns.
 * Checkpoints, the final model and evaluation (whose batches need not be the same on every rank)
 * gather the whole model first and release it after.
 *
 * Not yet: GPU ranks (the window needs the CUDA driver's virtual memory calls), prefetching the
 * next unit while the current one computes, pipeline stages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "core/log.h"
#include "parallel/dp.h"

#define PAGE_ELEMS 1024 /* a 4 KiB page of fp32 */

struct glm_dp_z3 {
    void *ps;           /* [shard] this rank's pieces of the weights (S) */
    void *window;       /* the flat parameter range; backed only where gathered */
    size_t bytes;
    glm_span *u;        /* the units */
    int nu;
    int *gathered;      /* per unit */
    int pinned;         /* the whole model gathered (checkpoints, evaluation): done releases nothing */
};

size_t glm_dp_z3_align(const glm_dp *dp) { return dp->align > PAGE_ELEMS ? dp->align : PAGE_ELEMS; }

void *glm_dp_z3_shard(glm_dp *dp, size_t k) { return glm_at(dp->m->be, dp->z3->ps, k); }

static int unit_of(const glm_dp_z3 *z, size_t lo) {
    for (int i = 0; i < z->nu; i++)
        if (z->u[i].lo == lo) return i;
    return -1;
}

/* Unit i's pieces from every rank's shard into the window. */
static int gather(glm_dp *dp, int i, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    glm_backend *be = dp->m->be;
    size_t lo = z->u[i].lo, n = z->u[i].n / (size_t)dp->world, off = lo / (size_t)dp->world;
    be->copy(be, glm_at(be, z->window, lo + (size_t)dp->rank * n), glm_at(be, z->ps, off), n * glm_dtype_size(be->dtype));
    char what[64];
    snprintf(what, sizeof what, "weights of unit at %zu", lo);
    if (dp->comm->allgather(dp->comm, glm_at(be, z->window, lo), n, dp->gdt, what, err) || dp->comm->wait(dp->comm, -1, err))
        return -1;
    z->gathered[i] = 1;
    return 0;
}

/* Unit i's pages go back (the window reads zeros there until the next gather). */
static void release(glm_dp *dp, int i) {
    glm_dp_z3 *z = dp->z3;
    size_t es = glm_dtype_size(dp->m->be->dtype);
    madvise((char *)z->window + z->u[i].lo * es, z->u[i].n * es, MADV_DONTNEED);
    z->gathered[i] = 0;
}

static void on_need(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_z3 *z = dp->z3;
    int i = unit_of(z, lo);
    if (i < 0 || z->gathered[i] || dp->hook_failed) return;
    if (gather(dp, i, &dp->hook_err)) dp->hook_failed = 1;
}

static void on_done(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_z3 *z = dp->z3;
    int i = unit_of(z, lo);
    if (i >= 0 && z->gathered[i] && !z->pinned) release(dp, i);
}

int glm_dp_z3_gather_all(glm_dp *dp, glm_err *err) {
    glm_dp_z3 *z = dp->z3;
    if (!z) return 0;
    for (int i = 0; i < z->nu; i++)
        if (!z->gathered[i] && gather(dp, i, err)) return -1;
    z->pinned = 1;
    return 0;
}

void glm_dp_z3_release_all(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    if (!z) return;
    z->pinned = 0;
    for (int i = 0; i < z->nu; i++)
        if (z->gathered[i]) release(dp, i);
}

void glm_dp_z3_store_all(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    glm_backend *be = dp->m->be;
    for (int i = 0; i < z->nu; i++) {
        size_t n = z->u[i].n / (size_t)dp->world;
        be->copy(be, glm_at(be, z->ps, z->u[i].lo / (size_t)dp->world), glm_at(be, z->window, z->u[i].lo + (size_t)dp->rank * n),
                 n * glm_dtype_size(be->dtype));
    }
    be->sync(be);
}

int glm_dp_z3_attach(glm_dp *dp, glm_err *err) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    if (strncmp(be->name, "cpu", 3) != 0) {
        glm_fail(err, "--zero_stage 3 runs on CPU ranks only in this glmtrain (GPU ranks need the CUDA driver's virtual memory for its window)");
        return glm_hint(err, "on GPUs use --zero_stage 2 with --offload_optimizer cpu, which plans about as little device memory for the model states");
    }
    glm_dp_z3 *z = glm_calloc(1, sizeof *z);
    dp->z3 = z;
    size_t es = glm_dtype_size(be->dtype);
    z->u = glm_malloc(sizeof *z->u * (size_t)(m->cfg.num_layers + 2));
    z->nu = glm_model_units(m, z->u);
    z->gathered = glm_calloc((size_t)z->nu, sizeof *z->gathered);
    z->ps = be->alloc(be, dp->shard * es);
    z->bytes = (m->flat_cap > m->tab.total ? m->flat_cap : m->tab.total) * es;
    z->window = mmap(NULL, z->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (z->window == MAP_FAILED) return glm_fail(err, "cannot reserve %.2f GiB of address space for the ZeRO-3 window", z->bytes / 1073741824.0);
    /* this rank's pieces of the (broadcast) weights, then the window in place of the buffer */
    for (int i = 0; i < z->nu; i++) {
        size_t n = z->u[i].n / (size_t)dp->world;
        be->copy(be, glm_at(be, z->ps, z->u[i].lo / (size_t)dp->world), glm_at(be, m->params, z->u[i].lo + (size_t)dp->rank * n),
                 n * es);
    }
    be->free(be, glm_model_swap_params(m, z->window)); /* the whole model's buffer is what ZeRO-3 saves */
    m->params_need = on_need;
    m->params_done = on_done;
    m->params_ctx = dp;
    double MiB = 1048576.0, largest = 0;
    for (int i = 0; i < z->nu; i++) largest = (double)z->u[i].n > largest ? (double)z->u[i].n : largest;
    glm_info("ZeRO-3: weights %.1f MiB per rank at rest (the shard) + the units in use (the largest %.1f MiB) instead of %.1f MiB",
             dp->shard * es / MiB, largest * es / MiB, m->tab.total * es / MiB);
    return 0;
}

void glm_dp_z3_free(glm_dp *dp) {
    glm_dp_z3 *z = dp->z3;
    if (!z) return;
    glm_model *m = dp->m;
    if (m->params == z->window) {
        /* a buffer of the model's own again, for its free (the weights were saved before: nothing
         * reads them after training) */
        void *p = m->be->alloc(m->be, z->bytes);
        m->be->zero(m->be, p, z->bytes);
        glm_model_swap_params(m, p);
        m->params_need = NULL;
        m->params_done = NULL;
        m->params_ctx = NULL;
    }
    if (z->window && z->window != MAP_FAILED) munmap(z->window, z->bytes);
    if (z->ps) m->be->free(m->be, z->ps);
    free(z->u);
    free(z->gathered);
    free(z);
    dp->z3 = NULL;
}
