/* ZeRO-2 for parallel/dp/dp.c: no rank ever holds the whole gradient.
 *
 * The flat buffers are laid out again so every unit (the embedding, each layer, the final norm
 * with the head) starts at a multiple of 64 * world elements, and the units are the buckets:
 * rank r keeps piece r of each unit's summed gradient in `sg` (its shard, 1/world of the
 * model). Backward writes a unit's gradients into a staging slot (the model's grads_unit hook),
 * and as soon as the unit is done its slot is reduce-scattered into the shard. Two slots take
 * the units in turn; before a slot is reused the compute stream waits (on the device) for the
 * reduce-scatter that reads it. A tied embedding gets a slot of its own, since the head writes
 * it at the start of backward and the embedding at the end.
 *
 * The first micro-batch of a step reduce-scatters straight into the shard; later ones into a
 * scratch piece per slot, added into the shard when the slot comes round again (or at the end).
 * Gradient memory per rank: total/world + the slots (+ the scratch pieces with accumulation),
 * instead of the whole gradient. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/dp/dp.h"


/* The slot's reduce-scatter has finished before the compute stream goes on, and a scratch
 * piece it wrote is added into the shard. */
static int release(glm_dp *dp, int s, glm_err *err) {
    glm_dp_z2 *z = &dp->z2;
    glm_backend *be = dp->m->be;
    if (z->op[s] >= 0 && dp->comm->fence(dp->comm, z->op[s], err)) return -1;
    z->op[s] = -1;
    if (z->add_n[s]) {
        void *dst = glm_at(be, z->sg, z->add_off[s]);
        be->scale_add(be, dst, 1.0f, z->tmp[s], dst, z->add_n[s]);
        z->add_n[s] = 0;
    }
    return 0;
}

static void *on_unit(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_z2 *z = &dp->z2;
    int s;
    if (!glm_unit_slots_pick(&z->us, lo, &s)) return z->us.slot[s]; /* the embedding adds to what the head wrote */
    if (!dp->hook_failed && release(dp, s, &dp->hook_err)) dp->hook_failed = 1;
    return glm_unit_slots_bind(&z->us, dp->m->be, s, lo, hi);
}

/* Backward is done with every unit from flat offset `first` on: the unit starting there is
 * reduce-scattered from its slot. */
void glm_dp_z2_ready(glm_dp *dp, size_t first) {
    glm_dp_z2 *z = &dp->z2;
    glm_backend *be = dp->m->be;
    int s = glm_unit_slots_take(&z->us, first);
    if (s < 0 || dp->hook_failed) return; /* not a unit start (never happens), or failed earlier */
    size_t n = z->us.n[s] / (size_t)dp->world, off = first / (size_t)dp->world;
    int direct = z->begun == 1; /* the step's first micro-batch */
    if (!direct && !z->tmp[s]) z->tmp[s] = be->alloc(be, z->us.elems[s] / (size_t)dp->world * glm_dtype_size(be->dtype));
    void *recv = direct ? glm_at(be, z->sg, off) : z->tmp[s];
    char what[64];
    snprintf(what, sizeof what, "gradients of unit at %zu", first);
    int k = dp->comm->started(dp->comm);
    if (dp->comm->reduce_scatter(dp->comm, z->us.slot[s], recv, n, dp->gdt, what, &dp->hook_err)) { dp->hook_failed = 1; return; }
    z->op[s] = dp->comm->started(dp->comm) > k ? dp->comm->started(dp->comm) - 1 : -1;
    if (!direct) { z->add_off[s] = off; z->add_n[s] = n; }
}

void glm_dp_z2_micro_begin(glm_dp *dp) {
    glm_unit_slots_micro(&dp->z2.us);
    dp->z2.begun++;
}

int glm_dp_z2_finish(glm_dp *dp, glm_err *err) {
    glm_dp_z2 *z = &dp->z2;
    for (int s = 0; s < 3; s++)
        if (release(dp, s, err)) return -1;
    if (z->begun == 0) dp->m->be->zero(dp->m->be, z->sg, dp->shard * glm_dtype_size(dp->m->be->dtype)); /* no backward ran */
    z->begun = 0;
    glm_unit_slots_rewind(&z->us);
    return 0;
}

int glm_dp_z2_attach(glm_dp *dp, glm_err *err) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    glm_dp_z2 *z = &dp->z2;
    glm_model_drop_grads(m); /* first: no moment with two copies of it */
    glm_model_relayout(m, dp->align * (size_t)dp->world);
    glm_span *u = glm_malloc(sizeof *u * (size_t)(m->cfg.num_layers + 2));
    int nu = glm_model_units(m, u);
    /* the buckets are the units, from the end of the flat buffer (backward's order) */
    dp->nb = nu;
    dp->b = glm_calloc((size_t)nu, sizeof *dp->b);
    for (int i = 0; i < nu; i++)
        dp->b[i] = (glm_dp_bucket){.lo = u[nu - 1 - i].lo, .hi = u[nu - 1 - i].lo + u[nu - 1 - i].n};
    free(u);
    size_t es = glm_dtype_size(be->dtype);
    dp->shard = m->tab.total / (size_t)dp->world;
    z->sg = be->alloc(be, dp->shard * es);
    be->zero(be, z->sg, dp->shard * es);
    glm_unit_slots_init(&z->us, m);
    for (int s = 0; s < 3; s++) z->op[s] = -1;
    m->grads_unit = on_unit;
    m->grads_unit_ctx = dp;
    double MiB = 1048576.0, staging = (double)glm_unit_slots_elems(&z->us);
    double mine = (double)dp->shard + staging, whole = (double)m->tab.total;
    glm_info("ZeRO-2: gradients %.1f MiB per rank (shard %.1f + staging %.1f) instead of %.1f", mine * es / MiB,
             (double)dp->shard * es / MiB, staging * es / MiB, whole * es / MiB);
    if (mine >= whole)
        glm_info("ZeRO-2 saves no memory here: staging the largest units (embedding, head) outweighs the shard; "
                 "--zero_stage 1 keeps the same optimizer sharding");
    (void)err;
    return 0;
}

void glm_dp_z2_free(glm_dp *dp) {
    glm_dp_z2 *z = &dp->z2;
    if (!dp->m || !z->sg) return;
    glm_backend *be = dp->m->be;
    be->free(be, z->sg);
    glm_unit_slots_free(&z->us, be);
    for (int s = 0; s < 3; s++)
        if (z->tmp[s]) be->free(be, z->tmp[s]);
    *z = (glm_dp_z2){0};
}
