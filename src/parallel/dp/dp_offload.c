/* The optimizer in host memory (--offload_optimizer cpu) and the update inside backward
 * (--optimizer_in_backward), for parallel/dp/dp.c.
 *
 * Offload: the AdamW state (fp32 or 8-bit moments and the fp32 master weights) of this rank's
 * shard lives in host memory. An update of flat elements [lo, hi) copies their gradients into
 * a page-locked staging buffer (`hbuf`, the shard's size in the backend dtype), runs the CPU
 * backend's AdamW on the host's cores, writes the new weights rounded to the backend dtype into
 * the same staging place and copies them back; the compute stream waits (on the device) for
 * that copy before it reads the weights again.
 *
 * One process offloaded, or updating in backward: no gradient buffer of the whole model exists on
 * the device. Backward writes each
 * unit (the embedding, a layer, the final norm with the head) into one of two staging slots (a
 * tied embedding into a third, as ZeRO-2 does). As soon as a unit's gradients are final:
 *   - offloaded (DeepSpeed's ZeRO-Offload): they are copied to the host, into the staging buffer
 *     in the step's first micro-batch, else into the slot's landing buffer, which a worker thread
 *     adds into the staging buffer while backward goes on; after the last micro-batch the norm,
 *     clipping and AdamW run on the host over the whole model, each unit's new weights sent back
 *     while the next one is updated;
 *   - inside backward (--optimizer_in_backward): the unit is updated right away, on the device,
 *     or (offloaded) on the host by the worker while backward goes on with the units before it,
 *     the new weights sent back; the next forward waits for the last of those copies. Gradient
 *     accumulation is then impossible (each unit is updated from one micro-batch) and so is
 *     clipping by the global norm (known only after the last unit); the training loop refuses
 *     both. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "core/half.h"
#include "core/log.h"
#include "parallel/dp/dp.h"

/* ---------------------------------------------------------------- copies */

static long to_host(glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->copy_async) return be->copy_async(be, dst, src, bytes, 1);
    memcpy(dst, src, bytes); /* a backend whose memory is the host's */
    return 0;
}
static long to_device(glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->copy_async) return be->copy_async(be, dst, src, bytes, 0);
    memcpy(dst, src, bytes);
    return 0;
}
static void host_waits(glm_backend *be, long t) { if (be->copy_wait && t > 0) be->copy_wait(be, t); }
static void device_waits(glm_backend *be, long t) { if (be->compute_wait && t > 0) be->compute_wait(be, t); }

static void *staging_alloc(glm_backend *be, size_t bytes) {
    return be->host_alloc ? be->host_alloc(be, bytes) : glm_calloc(1, bytes ? bytes : 1);
}
static void staging_free(glm_backend *be, void *p) {
    if (!p) return;
    if (be->host_free) be->host_free(be, p);
    else free(p);
}

/* ---------------------------------------------------------------- offloaded updates */

double glm_dp_off_update(glm_dp *dp, size_t lo, size_t hi, size_t k, void *param, const void *grad, float lr, float gs,
                         float bc1, float bc2) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype), bytes = (hi - lo) * es;
    char *buf = (char *)dp->hbuf + k * es;
    host_waits(be, to_host(be, buf, grad, bytes));
    double ss = glm_adamw_update_host(dp->opt, m, lo, hi, k, buf, lr, gs, bc1, bc2);
    dp->off_ticket = to_device(be, param, buf, bytes);
    return ss;
}

void glm_dp_off_done(glm_dp *dp) {
    device_waits(dp->m->be, dp->off_ticket);
    dp->off_ticket = 0;
}

/* ---------------------------------------------------------------- staged units */

/* What the worker does with a unit that reached the host: update it (inside backward), or add
 * it into the step's gradients (an offloaded step with several micro-batches). */
enum { JOB_UPDATE, JOB_ADD };
typedef struct ib_job { size_t lo, hi; long ticket; int kind, slot; } ib_job;

struct glm_dp_ib {
    int update;             /* 1: each unit updated inside backward; 0: its gradients collected on the host */
    glm_unit_slots us;      /* backward's staging, unit by unit (parallel/dp/unit_slots.h) */
    long slot_ticket[3];    /* offloaded: the copy that reads the slot */
    void *landing[3];       /* collecting, later micro-batches: the host copy of each slot before its add */
    int landing_busy[3];    /* its add has not run yet */
    int micro;
    float lr, bc1, bc2;
    double ss;              /* sum of squares of the step's gradients */
    long last_down;         /* the latest copy of gradients to the host */
    /* the host worker (offloaded state) */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ib_job *q;
    int qn, qcap, qhead, running, quit, started;
    long last_up;           /* the latest copy of updated weights to the device */
};

/* dst[n] += src[n] in the backend dtype, rounded once from fp32 (the host's share of a
 * gradient sum over micro-batches). */
static void add_into(void *dst, const void *src, size_t n, glm_dtype dt) {
    if (dt == GLM_F32) {
        float *d = dst;
        const float *a = src;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) d[i] += a[i];
        return;
    }
    uint16_t *d = dst;
    const uint16_t *a = src;
    if (dt == GLM_BF16) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = glm_f32_to_bf16(glm_bf16_to_f32(d[i]) + glm_bf16_to_f32(a[i]));
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) d[i] = glm_f32_to_f16(glm_f16_to_f32(d[i]) + glm_f16_to_f32(a[i]));
    }
}

static void *worker(void *arg) {
    glm_dp *dp = arg;
    glm_dp_ib *ib = dp->ib;
    glm_backend *be = dp->m->be;
    size_t es = glm_dtype_size(be->dtype);
    pthread_mutex_lock(&ib->mu);
    for (;;) {
        while (ib->qhead == ib->qn && !ib->quit) pthread_cond_wait(&ib->cv, &ib->mu);
        if (ib->qhead == ib->qn && ib->quit) break;
        ib_job j = ib->q[ib->qhead++];
        ib->running = 1;
        pthread_mutex_unlock(&ib->mu);
        char *buf = (char *)dp->hbuf + j.lo * es;
        host_waits(be, j.ticket);
        double ss = 0;
        long t = 0;
        if (j.kind == JOB_UPDATE) {
            ss = glm_adamw_update_host(dp->opt, dp->m, j.lo, j.hi, j.lo, buf, ib->lr, 1.0f, ib->bc1, ib->bc2);
            t = to_device(be, glm_at(be, dp->m->params, j.lo), buf, (j.hi - j.lo) * es);
        } else {
            add_into(buf, ib->landing[j.slot], j.hi - j.lo, be->dtype);
        }
        pthread_mutex_lock(&ib->mu);
        ib->ss += ss;
        if (t) ib->last_up = t;
        if (j.kind == JOB_ADD) ib->landing_busy[j.slot] = 0;
        ib->running = 0;
        pthread_cond_broadcast(&ib->cv);
    }
    pthread_mutex_unlock(&ib->mu);
    return NULL;
}

static void push_job(glm_dp_ib *ib, ib_job j) {
    pthread_mutex_lock(&ib->mu);
    if (ib->qn == ib->qcap) {
        ib->qcap = ib->qcap ? 2 * ib->qcap : 64;
        ib->q = realloc(ib->q, (size_t)ib->qcap * sizeof *ib->q);
        if (!ib->q) GLM_FATAL("the host is out of memory", "cannot grow the optimizer's work queue");
    }
    ib->q[ib->qn++] = j;
    if (j.kind == JOB_ADD) ib->landing_busy[j.slot] = 1;
    pthread_cond_broadcast(&ib->cv);
    pthread_mutex_unlock(&ib->mu);
}

static void *ib_on_unit(void *ctx, size_t lo, size_t hi) {
    glm_dp *dp = ctx;
    glm_dp_ib *ib = dp->ib;
    glm_backend *be = dp->m->be;
    int s;
    if (!glm_unit_slots_pick(&ib->us, lo, &s)) return ib->us.slot[s]; /* the embedding adds to what the head wrote */
    device_waits(be, ib->slot_ticket[s]); /* the slot's previous unit has left for the host */
    ib->slot_ticket[s] = 0;
    return glm_unit_slots_bind(&ib->us, be, s, lo, hi);
}

/* Backward is done with every unit from flat offset `first` on: the unit starting there is
 * updated, or its gradients go to the host (straight into the step's sums in its first
 * micro-batch, else through the slot's landing buffer and an add). */
void glm_dp_ib_ready(glm_dp *dp, size_t first) {
    glm_dp_ib *ib = dp->ib;
    glm_backend *be = dp->m->be;
    int s = glm_unit_slots_take(&ib->us, first);
    if (s < 0) return;
    void *slot = ib->us.slot[s];
    size_t lo = ib->us.lo[s], n = ib->us.n[s], hi = lo + n, es = glm_dtype_size(be->dtype), bytes = n * es;
    if (!ib->update) {
        long t;
        if (ib->micro <= 1) {
            t = to_host(be, (char *)dp->hbuf + lo * es, slot, bytes);
        } else {
            pthread_mutex_lock(&ib->mu); /* the landing buffer's previous add is done */
            while (ib->landing_busy[s]) pthread_cond_wait(&ib->cv, &ib->mu);
            pthread_mutex_unlock(&ib->mu);
            t = to_host(be, ib->landing[s], slot, bytes);
            push_job(ib, (ib_job){lo, hi, t, JOB_ADD, s});
        }
        ib->slot_ticket[s] = t;
        ib->last_down = t;
        return;
    }
    if (dp->opt->host) {
        long t = to_host(be, (char *)dp->hbuf + lo * es, slot, bytes);
        ib->slot_ticket[s] = t;
        push_job(ib, (ib_job){lo, hi, t, JOB_UPDATE, s});
        return;
    }
    ib->ss += be->sumsq(be, slot, n);
    glm_adamw_update(dp->opt, dp->m, lo, hi, lo, glm_at(be, dp->m->params, lo), slot, ib->lr, 1.0f, ib->bc1, ib->bc2);
}

static void ib_on_ready(void *ctx, size_t first) { glm_dp_ib_ready(ctx, first); }

void glm_dp_ib_begin(glm_dp *dp, float lr, int backward) {
    glm_dp_ib *ib = dp->ib;
    glm_adamw *o = dp->opt;
    if (ib->update && backward) {
        o->step++;
        glm_adamw_corrections(o, &ib->bc1, &ib->bc2);
    }
    ib->lr = lr;
    ib->ss = 0;
    ib->micro = 0;
}

void glm_dp_ib_micro(glm_dp *dp) {
    dp->ib->micro++;
    glm_unit_slots_micro(&dp->ib->us);
}

/* Sum of squares of n host values in S, in fp32 lanes per chunk summed in double. */
static double host_sumsq(const void *x, size_t n, glm_dtype dt) {
    const size_t C = 1 << 16;
    double ss = 0;
#pragma omp parallel for schedule(dynamic, 16) reduction(+ : ss)
    for (size_t c = 0; c < (n + C - 1) / C; c++) {
        float acc[16] = {0};
        size_t a = c * C, e = a + C < n ? a + C : n, i = a;
        if (dt == GLM_F32) {
            const float *f = x;
            for (; i + 16 <= e; i += 16)
                for (int l = 0; l < 16; l++) acc[l] += f[i + l] * f[i + l];
            for (; i < e; i++) acc[0] += f[i] * f[i];
        } else {
            const uint16_t *h = x;
            for (; i + 16 <= e; i += 16)
                for (int l = 0; l < 16; l++) {
                    float v = dt == GLM_BF16 ? glm_bf16_to_f32(h[i + l]) : glm_f16_to_f32(h[i + l]);
                    acc[l] += v * v;
                }
            for (; i < e; i++) {
                float v = dt == GLM_BF16 ? glm_bf16_to_f32(h[i]) : glm_f16_to_f32(h[i]);
                acc[0] += v * v;
            }
        }
        double t = 0;
        for (int l = 0; l < 16; l++) t += acc[l];
        ss += t;
    }
    return ss;
}

int glm_dp_ib_finish(glm_dp *dp, double *sumsq, glm_err *err) {
    glm_dp_ib *ib = dp->ib;
    glm_backend *be = dp->m->be;
    for (int s = 0; s < 3; s++)
        if (ib->us.busy[s]) return glm_fail(err, "internal: unit at %zu was never finished by backward", ib->us.lo[s]);
    if (ib->started) {
        pthread_mutex_lock(&ib->mu);
        while (ib->qhead < ib->qn || ib->running) pthread_cond_wait(&ib->cv, &ib->mu);
        ib->qhead = ib->qn = 0;
        long t = ib->last_up;
        pthread_mutex_unlock(&ib->mu);
        device_waits(be, t); /* the next forward reads the new weights */
    }
    if (!ib->update) { /* the step's gradients are all on the host now */
        host_waits(be, ib->last_down);
        /* a backend whose memory is the host's squares the sums as it would its own gradients */
        ib->ss = !ib->micro ? 0 : be->copy_async ? host_sumsq(dp->hbuf, dp->m->tab.total, be->dtype)
                                                  : be->sumsq(be, dp->hbuf, dp->m->tab.total);
        if (!ib->micro) memset(dp->hbuf, 0, dp->m->tab.total * glm_dtype_size(be->dtype)); /* no backward ran */
    }
    *sumsq = ib->ss;
    return 0;
}

/* The offloaded step from the gradients collected on the host: unit by unit from the last (the
 * order backward made them), each unit's new weights sent back while the next is updated. */
int glm_dp_ib_step(glm_dp *dp, float lr, float gs) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    glm_adamw *o = dp->opt;
    o->step++;
    float bc1, bc2;
    glm_adamw_corrections(o, &bc1, &bc2);
    glm_span *u = glm_malloc(sizeof *u * (size_t)(m->cfg.num_layers + 2));
    int nu = glm_model_units(m, u);
    size_t es = glm_dtype_size(be->dtype);
    long t = 0;
    for (int i = nu - 1; i >= 0; i--) {
        char *buf = (char *)dp->hbuf + u[i].lo * es;
        glm_adamw_update_host(o, m, u[i].lo, u[i].lo + u[i].n, u[i].lo, buf, lr, gs, bc1, bc2);
        t = to_device(be, glm_at(be, m->params, u[i].lo), buf, u[i].n * es);
    }
    free(u);
    device_waits(be, t);
    return 0;
}

int glm_dp_ib_attach(glm_dp *dp, glm_err *err) {
    glm_model *m = dp->m;
    glm_backend *be = m->be;
    glm_dp_ib *ib = glm_calloc(1, sizeof *ib);
    dp->ib = ib;
    ib->update = dp->cfg.in_backward;
    size_t es = glm_dtype_size(be->dtype);
    glm_unit_slots_init(&ib->us, m);
    for (int s = 0; s < 3; s++)
        if (!ib->update && ib->us.elems[s]) ib->landing[s] = staging_alloc(be, ib->us.elems[s] * es);
    m->grads_unit = ib_on_unit;
    m->grads_unit_ctx = dp;
    m->grads_ready = ib_on_ready;
    m->grads_ready_ctx = dp;
    if (dp->opt->host) {
        pthread_mutex_init(&ib->mu, NULL);
        pthread_cond_init(&ib->cv, NULL);
        if (pthread_create(&ib->th, NULL, worker, dp) != 0) return glm_fail(err, "cannot start the optimizer's host thread");
        ib->started = 1;
    }
    double MiB = 1048576.0, staged = (double)glm_unit_slots_elems(&ib->us) * es / MiB;
    if (ib->update)
        glm_info("optimizer in backward: each unit updated as soon as its gradients are final%s; gradients staged in %.1f MiB "
                 "instead of %.1f MiB", dp->opt->host ? " (on the host)" : "", staged, (double)m->tab.total * es / MiB);
    else
        glm_info("gradients streamed to the host unit by unit during backward (summed there over micro-batches); on the "
                 "device %.1f MiB of staging instead of %.1f MiB", staged, (double)m->tab.total * es / MiB);
    return 0;
}

void glm_dp_ib_free(glm_dp *dp) {
    glm_dp_ib *ib = dp->ib;
    if (!ib) return;
    if (ib->started) {
        pthread_mutex_lock(&ib->mu);
        ib->quit = 1;
        pthread_cond_broadcast(&ib->cv);
        pthread_mutex_unlock(&ib->mu);
        pthread_join(ib->th, NULL);
        pthread_mutex_destroy(&ib->mu);
        pthread_cond_destroy(&ib->cv);
    }
    glm_backend *be = dp->m->be;
    glm_unit_slots_free(&ib->us, be);
    for (int s = 0; s < 3; s++) staging_free(be, ib->landing[s]);
    free(ib->q);
    free(ib);
    dp->ib = NULL;
}

/* ---------------------------------------------------------------- staging buffer */

void glm_dp_off_attach(glm_dp *dp, size_t elems) {
    glm_backend *be = dp->m->be;
    size_t bytes = elems * glm_dtype_size(be->dtype);
    dp->hbuf = staging_alloc(be, bytes);
    glm_info("optimizer offloaded to host memory: %s state %.2f GiB, staging %.2f GiB (page-locked)",
             dp->opt->kind == GLM_OPTIM_ADAMW8 ? "8-bit" : "fp32",
             (double)dp->opt->n * glm_optim_state_bytes(dp->opt->kind, 1) / 1073741824.0, bytes / 1073741824.0);
}

void glm_dp_off_free(glm_dp *dp) {
    if (!dp->m) return;
    staging_free(dp->m->be, dp->hbuf);
    dp->hbuf = NULL;
}
