#include "optim/adamw.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "core/half.h"
#include "backend/quant8.h"
#include "optim/galore.h"

/* Host updates go chunk by chunk, one chunk per thread at a time: its gradients converted to
 * fp32 into the thread's scratch, the CPU backend's op (serial inside a parallel region), the
 * new weights rounded back; every pass over a chunk stays in the core's cache. A multiple of
 * the 8-bit block. */
#define HOST_CHUNK (8 * GLM_ADAM8_BLOCK)

/* bitsandbytes' paged optimizers (QLoRA's recipes) update as their unpaged twins: paging moves
 * their state to host memory under pressure, which the memory plan here decides up front. */
int glm_optim_parse(const char *s) {
    if (!strcmp(s, "adamw_torch") || !strcmp(s, "adamw_hf") || !strcmp(s, "adamw_torch_fused") || !strcmp(s, "paged_adamw_32bit"))
        return GLM_OPTIM_ADAMW;
    if (!strcmp(s, "adamw_8bit") || !strcmp(s, "adamw_bnb_8bit") || !strcmp(s, "paged_adamw_8bit")) return GLM_OPTIM_ADAMW8;
    return -1;
}

double glm_optim_state_bytes(int kind, int with_master) {
    double moments = kind == GLM_OPTIM_ADAMW8 ? 2.0 + 8.0 / GLM_ADAM8_BLOCK : 8.0;
    return moments + (with_master ? 4.0 : 0.0);
}

/* ---------------------------------------------------------------- state */

/* Host memory zeroed by all threads at once, so its pages are made now (tens of GiB for a 6B
 * model) rather than one by one inside the first update. */
static void *host_zeroed(size_t bytes) {
    char *p = glm_malloc(bytes ? bytes : 1);
    const size_t C = (size_t)1 << 22;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (bytes + C - 1) / C; c++) memset(p + c * C, 0, bytes - c * C < C ? bytes - c * C : C);
    return p;
}

static void *state_alloc(glm_adamw *o, glm_backend *be, size_t bytes) {
    if (o->host) return host_zeroed(bytes);
    void *p = be->alloc(be, bytes);
    be->zero(be, p, bytes);
    return p;
}

static void state_free(glm_adamw *o, glm_backend *be, void *p) {
    if (!p) return;
    if (o->host) free(p);
    else be->free(be, p);
}

/* Elements of each fp32 moment array: the state's, or under GaLore the unprojected rows' alone. */
static size_t moments_n(const glm_adamw *o) { return o->galore ? o->galore->flat : o->n; }

/* Bit k: the tensor holding flat elements [64k, 64k + 64) decays (tensor offsets are multiples of 64). */
static void build_decay_bits(glm_adamw *o, glm_model *m) {
    size_t chunks = (m->flat_cap > m->tab.total ? m->flat_cap : m->tab.total) / 64 + 1, bytes = chunks / 8 + 1;
    uint8_t *bits = glm_calloc(1, bytes);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (!t->decay) continue;
        for (size_t c = t->offset / 64; c < (t->offset + t->numel + 63) / 64; c++) bits[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
    if (o->host) { o->decay = bits; return; }
    o->decay = m->be->alloc(m->be, bytes);
    m->be->upload(m->be, o->decay, bits, bytes);
    m->be->sync(m->be);
    free(bits);
}

void glm_adamw_alloc(glm_adamw *o, glm_model *m, int kind, int host, size_t n, float lr, float b1, float b2,
                     float eps, float wd) {
    glm_backend *be = m->be;
    *o = (glm_adamw){.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .kind = kind, .host = host, .n = n};
    if (m->cfg.peft.galore_rank > 0) { /* train/setup.c refuses the other layouts */
        GLM_ASSERT(kind == GLM_OPTIM_ADAMW && !host && n == m->tab.total);
        o->galore = glm_galore_new(m);
    }
    if (kind == GLM_OPTIM_ADAMW8) {
        size_t nb = glm_q8_blocks(n);
        o->qm = state_alloc(o, be, n);
        o->qv = state_alloc(o, be, n);
        o->am = state_alloc(o, be, nb * sizeof(float));
        o->av = state_alloc(o, be, nb * sizeof(float));
        build_decay_bits(o, m);
    } else {
        o->m = state_alloc(o, be, moments_n(o) * sizeof(float));
        o->v = state_alloc(o, be, moments_n(o) * sizeof(float));
    }
    if (host || be->dtype != GLM_F32) o->master = host ? host_zeroed(n * sizeof(float)) : be->alloc(be, n * sizeof(float));
    if (host) {
        o->cpu = glm_backend_cpu();
        o->scratch = glm_malloc((size_t)omp_get_max_threads() * HOST_CHUNK * sizeof(float));
    }
}

void glm_adamw_master_from(glm_adamw *o, glm_model *m, size_t k, size_t lo, size_t n) {
    glm_backend *be = m->be;
    if (!o->master || !n) return;
    const void *src = glm_at(be, m->params, lo);
    if (o->host) { be->download_f32(be, o->master + k, src, n); return; }
    if (be->to_f32) { be->to_f32(be, o->master + k, src, n); return; }
    /* no device conversion: a host round trip */
    float *tmp = glm_malloc(n * sizeof(float));
    be->download_f32(be, tmp, src, n);
    be->upload(be, o->master + k, tmp, n * sizeof(float));
    be->sync(be);
    free(tmp);
}

void glm_adamw_restart(glm_adamw *o, glm_model *m) {
    glm_backend *be = m->be;
    size_t nb = glm_q8_blocks(o->n);
    if (o->galore) glm_galore_restart(o->galore, m);
    struct { void *p; size_t bytes; } parts[] = {{o->m, moments_n(o) * sizeof(float)}, {o->v, moments_n(o) * sizeof(float)}, {o->qm, o->n},
                                                 {o->qv, o->n}, {o->am, nb * sizeof(float)}, {o->av, nb * sizeof(float)}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!parts[i].p) continue;
        if (o->host) memset(parts[i].p, 0, parts[i].bytes);
        else be->zero(be, parts[i].p, parts[i].bytes);
    }
    o->step = 0;
}

void glm_adamw_init(glm_adamw *o, glm_model *m, float lr, float b1, float b2, float eps, float wd) {
    glm_adamw_alloc(o, m, GLM_OPTIM_ADAMW, 0, m->tab.total, lr, b1, b2, eps, wd);
    /* the master copy starts from the stored weights: on the device when the backend can
     * (a host round trip is 27 GB each way for ChatGLM-6B) */
    glm_adamw_master_from(o, m, 0, 0, m->tab.total);
}

void glm_adamw_free(glm_adamw *o, glm_model *m) {
    glm_backend *be = m->be;
    state_free(o, be, o->m);
    state_free(o, be, o->v);
    state_free(o, be, o->qm);
    state_free(o, be, o->qv);
    state_free(o, be, o->am);
    state_free(o, be, o->av);
    state_free(o, be, o->decay);
    state_free(o, be, o->master);
    glm_galore_free(o->galore, m);
    if (o->cpu) o->cpu->destroy(o->cpu);
    free(o->scratch);
    *o = (glm_adamw){0};
}

/* ---------------------------------------------------------------- updates */

double glm_grad_norm(glm_model *m, float grad_scale) {
    /* padding between tensors is never written, so it stays zero and adds nothing */
    return sqrt(m->be->sumsq(m->be, m->grads, m->tab.total)) * grad_scale;
}

float glm_clip_coef(double norm, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    float coef = (float)(max_norm / (norm + 1e-6));
    return coef < 1.0f ? coef : 1.0f;
}

void glm_adamw_corrections(const glm_adamw *o, float *bc1, float *bc2) {
    *bc1 = 1.0f - powf(o->beta1, (float)o->step);
    *bc2 = 1.0f - powf(o->beta2, (float)o->step);
}

void glm_adamw_update(glm_adamw *o, glm_model *m, size_t lo, size_t hi, size_t k, void *param, const void *grad,
                      float lr, float gs, float bc1, float bc2) {
    glm_backend *be = m->be;
    if (o->kind == GLM_OPTIM_ADAMW8) {
        size_t B = GLM_ADAM8_BLOCK;
        be->adamw8(be, param, o->master ? o->master + k : NULL, grad, o->qm + k, o->qv + k,
                   o->am + k / B, o->av + k / B, hi - lo, o->decay, lo, lr, o->beta1, o->beta2, o->eps,
                   o->weight_decay, bc1, bc2, gs);
        return;
    }
    for (int j = 0, gk = 0; j < m->tab.n; j++) {
        const glm_tensor *t = &m->tab.t[j];
        size_t a = t->offset > lo ? t->offset : lo, e = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= e) { gk += t->galore; continue; }
        size_t kk = k + (a - lo);
        float lr_t = lr * t->lr_scale, wd_t = t->decay ? o->weight_decay : 0.0f;
        if (!o->galore) {
            be->adamw(be, glm_at(be, param, a - lo), o->master ? o->master + kk : NULL, glm_at(be, grad, a - lo), o->m + kk,
                      o->v + kk, e - a, lr_t, o->beta1, o->beta2, o->eps, wd_t, bc1, bc2, gs);
            continue;
        }
        if (t->galore) { /* a projected row is updated whole (its state is not per element) */
            GLM_ASSERT(a == t->offset && e == t->offset + t->numel);
            glm_galore_update(o->galore, m, gk++, glm_at(be, param, a - lo), o->master ? o->master + kk : NULL,
                              glm_at(be, grad, a - lo), o->step, lr_t, wd_t, o->beta1, o->beta2, o->eps, bc1, bc2, gs);
            continue;
        }
        /* galore_torch's AdamW through torch's order: p (1 - lr wd) - lr (1 - lr wd) sqrt(bc2) / bc1 *
         * m / (sqrt(v) + eps) is the op's p (1 - lr' wd') - lr' / bc1 * m / (sqrt(v) / sqrt(bc2) + eps')
         * with lr' = lr (1 - lr wd), wd' = wd / (1 - lr wd), eps' = eps / sqrt(bc2) */
        float keep = 1.0f - lr_t * wd_t;
        size_t mk = o->galore->moff[j] + (a - t->offset);
        be->adamw(be, glm_at(be, param, a - lo), o->master ? o->master + kk : NULL, glm_at(be, grad, a - lo), o->m + mk,
                  o->v + mk, e - a, lr_t * keep, o->beta1, o->beta2, o->eps / sqrtf(bc2), wd_t / keep, bc1, bc2, gs);
    }
}

void glm_adamw_step(glm_adamw *o, glm_model *m, float lr, float grad_scale) {
    o->step++;
    float bc1, bc2;
    glm_adamw_corrections(o, &bc1, &bc2);
    glm_adamw_update(o, m, 0, m->tab.total, 0, m->params, m->grads, lr, grad_scale, bc1, bc2);
}

static void to_f32(float *dst, const void *src, glm_dtype dt, size_t n) {
    if (dt == GLM_F32) { memcpy(dst, src, n * sizeof(float)); return; }
    const uint16_t *s = src;
    if (dt == GLM_BF16) for (size_t i = 0; i < n; i++) dst[i] = glm_bf16_to_f32(s[i]);
    else for (size_t i = 0; i < n; i++) dst[i] = glm_f16_to_f32(s[i]);
}

static void from_f32(void *dst, const float *src, glm_dtype dt, size_t n) {
    if (dt == GLM_F32) { memcpy(dst, src, n * sizeof(float)); return; }
    uint16_t *d = dst;
    if (dt == GLM_BF16) for (size_t i = 0; i < n; i++) d[i] = glm_f32_to_bf16(src[i]);
    else for (size_t i = 0; i < n; i++) d[i] = glm_f32_to_f16(src[i]);
}

/* One chunk: flat [a, a + n), state at kk, decay wd (fp32 kind), by the calling thread alone. */
static double host_chunk(glm_adamw *o, float *g, void *buf_a, glm_dtype dt, size_t a, size_t kk, size_t n, float wd,
                         float lr, float gs, float bc1, float bc2) {
    to_f32(g, buf_a, dt, n);
    float acc[16] = {0}; /* in lanes, so it vectorises: only the norm a log line shows */
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += g[i + l] * g[i + l];
    for (; i < n; i++) acc[0] += g[i] * g[i];
    double ss = 0;
    for (int l = 0; l < 16; l++) ss += acc[l];
    glm_backend *c = o->cpu;
    if (o->kind == GLM_OPTIM_ADAMW8) {
        size_t B = GLM_ADAM8_BLOCK;
        c->adamw8(c, o->master + kk, NULL, g, o->qm + kk, o->qv + kk, o->am + kk / B, o->av + kk / B, n, o->decay, a,
                  lr, o->beta1, o->beta2, o->eps, o->weight_decay, bc1, bc2, gs);
    } else {
        c->adamw(c, o->master + kk, NULL, g, o->m + kk, o->v + kk, n, lr, o->beta1, o->beta2, o->eps, wd, bc1, bc2, gs);
    }
    from_f32(buf_a, o->master + kk, dt, n);
    return ss;
}

/* Chunks of flat [lo, hi) (state at k) spread over the threads. */
static double host_range(glm_adamw *o, void *buf, glm_dtype dt, size_t base, size_t lo, size_t hi, size_t k, float wd,
                         float lr, float gs, float bc1, float bc2) {
    size_t es = glm_dtype_size(dt), nc = (hi - lo + HOST_CHUNK - 1) / HOST_CHUNK;
    double ss = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : ss)
    for (size_t c = 0; c < nc; c++) {
        float *g = o->scratch + (size_t)omp_get_thread_num() * HOST_CHUNK;
        size_t a = lo + c * HOST_CHUNK, n = hi - a < HOST_CHUNK ? hi - a : HOST_CHUNK;
        ss += host_chunk(o, g, (char *)buf + (a - base) * es, dt, a, k + (a - lo), n, wd, lr, gs, bc1, bc2);
    }
    return ss;
}

double glm_adamw_update_host(glm_adamw *o, glm_model *m, size_t lo, size_t hi, size_t k, void *buf, float lr,
                             float gs, float bc1, float bc2) {
    glm_dtype dt = m->be->dtype;
    double ss = 0;
    if (o->kind == GLM_OPTIM_ADAMW8) return host_range(o, buf, dt, lo, lo, hi, k, 0, lr, gs, bc1, bc2) * gs * gs;
    for (int j = 0; j < m->tab.n; j++) {
        const glm_tensor *t = &m->tab.t[j];
        size_t a = t->offset > lo ? t->offset : lo, e = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= e) continue;
        ss += host_range(o, buf, dt, lo, a, e, k + (a - lo), t->decay ? o->weight_decay : 0.0f, lr * t->lr_scale, gs, bc1, bc2);
    }
    /* the padding between tensors needs nothing: its gradients and its weights are zeros */
    return ss * gs * gs;
}

/* ---------------------------------------------------------------- state I/O */

static void fetch(const glm_adamw *o, glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (o->host) memcpy(dst, src, bytes);
    else be->download(be, dst, src, bytes);
}

static void store(glm_adamw *o, glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (o->host) memcpy(dst, src, bytes);
    else { be->upload(be, dst, src, bytes); be->sync(be); }
}

/* Blocks [k/B, ceil((k+n)/B)) of an 8-bit state (k a multiple of B). */
static size_t q8_span(size_t k, size_t n, size_t *b0) {
    *b0 = k / GLM_ADAM8_BLOCK;
    return glm_q8_blocks(k + n) - *b0;
}

/* GaLore's flat moments: each unprojected row's part of flat [k, k + n) between host h (at flat
 * index k) and the state (put: to the state; get: from it, the rest of h zero). */
static void galore_moments(const glm_adamw *o, glm_backend *be, size_t k, size_t n, float *h, float *state, int put) {
    const glm_galore *g = o->galore;
    if (!put) memset(h, 0, n * sizeof(float));
    const glm_table *tab = g->tab;
    for (int j = 0; j < tab->n; j++) {
        const glm_tensor *t = &tab->t[j];
        size_t a = t->offset > k ? t->offset : k, e = t->offset + t->numel < k + n ? t->offset + t->numel : k + n;
        if (a >= e || t->galore) continue;
        float *s = state + g->moff[j] + (a - t->offset);
        if (put) store((glm_adamw *)o, be, s, h + (a - k), (e - a) * sizeof(float));
        else fetch(o, be, h + (a - k), s, (e - a) * sizeof(float));
    }
}

void glm_adamw_get(const glm_adamw *o, glm_backend *be, size_t k, size_t n, float *m, float *v, float *master) {
    if (master && o->master) fetch(o, be, master, o->master + k, n * sizeof(float));
    if (o->galore) {
        if (m) galore_moments(o, be, k, n, m, o->m, 0);
        if (v) galore_moments(o, be, k, n, v, o->v, 0);
        return;
    }
    if (o->kind != GLM_OPTIM_ADAMW8) {
        if (m) fetch(o, be, m, o->m + k, n * sizeof(float));
        if (v) fetch(o, be, v, o->v + k, n * sizeof(float));
        return;
    }
    size_t b0, nb = q8_span(k, n, &b0);
    uint8_t *q = glm_malloc(n + 1);
    float *a = glm_malloc(nb * sizeof(float) + 1);
    for (int s = 0; s < 2; s++) {
        float *out = s ? v : m;
        if (!out) continue;
        fetch(o, be, q, (s ? o->qv : o->qm) + k, n);
        fetch(o, be, a, (s ? o->av : o->am) + b0, nb * sizeof(float));
        glm_q8_dequantize_state(s ? GLM_Q8_UNSIGNED : GLM_Q8_SIGNED, out, q, a, n);
    }
    free(q);
    free(a);
}

void glm_adamw_put(glm_adamw *o, glm_backend *be, size_t k, size_t n, const float *m, const float *v, const float *master) {
    if (master && o->master) store(o, be, o->master + k, master, n * sizeof(float));
    if (o->galore) {
        if (m) galore_moments(o, be, k, n, (float *)m, o->m, 1);
        if (v) galore_moments(o, be, k, n, (float *)v, o->v, 1);
        return;
    }
    if (o->kind != GLM_OPTIM_ADAMW8) {
        if (m) store(o, be, o->m + k, m, n * sizeof(float));
        if (v) store(o, be, o->v + k, v, n * sizeof(float));
        return;
    }
    size_t b0, nb = q8_span(k, n, &b0);
    uint8_t *q = glm_malloc(n + 1);
    float *a = glm_malloc(nb * sizeof(float) + 1);
    for (int s = 0; s < 2; s++) {
        const float *in = s ? v : m;
        if (!in) continue;
        glm_q8_quantize_state(s ? GLM_Q8_UNSIGNED : GLM_Q8_SIGNED, q, a, in, n);
        store(o, be, (s ? o->qv : o->qm) + k, q, n);
        store(o, be, (s ? o->av : o->am) + b0, a, nb * sizeof(float));
    }
    free(q);
    free(a);
}

void glm_adamw_get_q8(const glm_adamw *o, glm_backend *be, size_t k, size_t n, uint8_t *qm, uint8_t *qv, float *am,
                      float *av) {
    size_t b0, nb = q8_span(k, n, &b0);
    fetch(o, be, qm, o->qm + k, n);
    fetch(o, be, qv, o->qv + k, n);
    fetch(o, be, am, o->am + b0, nb * sizeof(float));
    fetch(o, be, av, o->av + b0, nb * sizeof(float));
}

void glm_adamw_put_q8(glm_adamw *o, glm_backend *be, size_t k, size_t n, const uint8_t *qm, const uint8_t *qv,
                      const float *am, const float *av) {
    size_t b0, nb = q8_span(k, n, &b0);
    store(o, be, o->qm + k, qm, n);
    store(o, be, o->qv + k, qv, n);
    store(o, be, o->am + b0, am, nb * sizeof(float));
    store(o, be, o->av + b0, av, nb * sizeof(float));
}
