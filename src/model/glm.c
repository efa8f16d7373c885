#include "model/glm.h"
#include "model/peft.h"
#include "backend/mask_hash.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- setup */

static void **field_of(glm_weights *w, const glm_tensor *t);
static void free_acts(glm_model *m);

/* Points w's fields at table tab's rows inside base. */
static void bind_rows(glm_model *m, const glm_table *tab, void *base, glm_weights *w) {
    for (int i = 0; i < tab->n; i++) {
        void **f = field_of(w, &tab->t[i]);
        if (f) *f = base ? glm_at(m->be, base, tab->t[i].offset) : NULL;
    }
    w->head = m->cfg.tie_word_embeddings ? w->wte : w->head;
}

void glm_model_bind_unit(glm_model *m, size_t lo, size_t hi, void *base) {
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (t->offset < lo || t->offset >= hi) continue;
        void **f = field_of(&m->w, t);
        if (f) *f = glm_at(m->be, base, t->offset - lo);
    }
    if (m->cfg.tie_word_embeddings) m->w.head = m->w.wte;
}

/* Weight views over both tables; gradient views over the trainable one only. */
static void bind_weights(glm_model *m, glm_weights *w, int grads) {
    *w = (glm_weights){.layer = glm_calloc((size_t)m->cfg.num_layers, sizeof *w->layer)};
    if (grads) {
        if (m->grads) bind_rows(m, &m->tab, m->grads, w);
        return;
    }
    bind_rows(m, &m->tab, m->params, w);
    if (m->fparams) bind_rows(m, &m->ftab, m->fparams, w);
    for (int i = 0; i < m->qtab.n; i++) { /* byte offsets */
        const glm_tensor *t = &m->qtab.t[i];
        w->layer[t->layer].qw[glm_linear_index(t->kind)] = (char *)m->qparams + t->offset;
    }
}

void glm_model_init(glm_model *m, const glm_config *c, glm_backend *be) {
    glm_model_init_stage(m, c, be, 0, c->num_layers, 1, 1);
}

static void init_common(glm_model *m, const glm_config *c, glm_backend *be, int l0, int l1, int first, int last,
                        int with_grads) {
    *m = (glm_model){0};
    m->cfg = *c;
    m->fam = glm_family_of(c);
    m->be = be;
    m->layer_lo = l0; m->layer_hi = l1; m->first = first; m->last = last;
    glm_table_build_range(&m->tab, c, l0, l1, first, last);
    glm_table_build_part(&m->ftab, c, l0, l1, first, last, 64, GLM_PART_FROZEN);
    size_t es = glm_dtype_size(be->dtype), bytes = m->tab.total * es;
    m->params = be->alloc(be, bytes);
    be->zero(be, m->params, bytes);
    if (m->ftab.total) {
        m->fparams = be->alloc(be, m->ftab.total * es);
        be->zero(be, m->fparams, m->ftab.total * es);
    }
    glm_table_build_part(&m->qtab, c, l0, l1, first, last, 64, GLM_PART_QUANT);
    if (m->qtab.n) {
        if (!be->dequantize) GLM_FATAL("use the CPU or CUDA backend", "backend %s has no quantized weights", be->name);
        m->qparams = be->alloc(be, m->qtab.total);
        be->zero(be, m->qparams, m->qtab.total);
        size_t big = 0;
        for (int i = 0; i < m->qtab.n; i++) big = m->qtab.t[i].numel > big ? m->qtab.t[i].numel : big;
        m->qscratch = be->alloc(be, big * es);
    }
    if (with_grads) {
        m->grads = be->alloc(be, bytes);
        be->zero(be, m->grads, bytes);
    }
    bind_weights(m, &m->w, 0);
    bind_weights(m, &m->g, 1);
    /* Rows of logits per head chunk. Each chunk re-reads and re-writes the head's weight
     * gradient ([V, H]: 1 GB at ChatGLM-6B in bf16), so the GPU wants few, large chunks
     * (2048 rows: eight times fewer passes over it than 256; docs/PERF.md has the measured
     * difference); the CPU keeps its logits small. */
    m->head_chunk = glm_backend_on_gpu(be) ? 2048 : 256;
    m->flat_cap = m->tab.total;
}

void glm_model_init_stage(glm_model *m, const glm_config *c, glm_backend *be, int l0, int l1, int first, int last) {
    init_common(m, c, be, l0, l1, first, last, 1);
}

void glm_model_init_staged(glm_model *m, const glm_config *c, glm_backend *be) {
    init_common(m, c, be, 0, c->num_layers, 1, 1, 0);
}

void glm_model_init_inference(glm_model *m, const glm_config *c, glm_backend *be) {
    glm_model_init_staged(m, c, be);
    m->weights_fixed = 1;
}

void glm_model_init_stage_inference(glm_model *m, const glm_config *c, glm_backend *be, int l0, int l1, int first,
                                    int last) {
    init_common(m, c, be, l0, l1, first, last, 0);
    m->weights_fixed = 1;
}

/* The rows that open a unit (the embedding, a layer, the final norm with the head): the
 * first trainable row of each, as the table builder marks them. */
static int starts_unit(const glm_tensor *t) { return t->opens_unit; }

/* Unit u's first flat offset in the trainable table (u = -1 the embedding, 0..L-1 a layer, L
 * the final norm and head), or SIZE_MAX when none of its rows trains. */
static size_t unit_lo(const glm_model *m, int u) {
    int L = m->cfg.num_layers;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        int tu = t->layer >= 0 ? t->layer : t->kind == T_WORD_EMB || glm_is_prefix(t->kind) ? -1 : L;
        if (tu == u && t->opens_unit) return t->offset;
    }
    return SIZE_MAX;
}

int glm_model_units(const glm_model *m, glm_span *out) { return glm_table_units(&m->tab, out); }

/* The params and grads buffers (those that exist) re-made with `elems` elements, each tensor
 * moved from its offset in m->tab to its offset in `to` (the rest zero). */
static void move_flat(glm_model *m, const glm_table *to, size_t elems) {
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype);
    void **bufs[2] = {&m->params, &m->grads};
    for (int b = 0; b < 2; b++) {
        if (!*bufs[b]) continue;
        void *p = be->alloc(be, elems * es);
        be->zero(be, p, elems * es);
        for (int i = 0; i < to->n; i++)
            be->copy(be, glm_at(be, p, to->t[i].offset), glm_at(be, *bufs[b], m->tab.t[i].offset), to->t[i].numel * es);
        be->free(be, *bufs[b]);
        *bufs[b] = p;
    }
    m->flat_cap = elems;
}

/* The weight and gradient views follow the buffers; without a gradient buffer (ZeRO-2) the
 * gradient views are placed unit by unit by grads_unit. */
static void rebind(glm_model *m) {
    free(m->w.layer);
    free(m->g.layer);
    bind_weights(m, &m->w, 0);
    bind_weights(m, &m->g, 1);
}

void glm_model_relayout(glm_model *m, size_t unit_align) {
    m->unit_align = unit_align;
    glm_table tab;
    glm_table_build_units(&tab, &m->cfg, m->layer_lo, m->layer_hi, m->first, m->last, unit_align);
    move_flat(m, &tab, tab.total);
    glm_table_free(&m->tab);
    m->tab = tab;
    rebind(m);
}

/* BAdam's switch (optim/badam.h). The trainable table holds one whole layer; the frozen one
 * every other row, in layer order. Layer `from` goes back into the frozen buffer, layer `to`
 * comes out of it, and the frozen layers between the two move by one layer's span (every layer
 * has the same rows, so the spans are equal and nothing else moves). The gradient buffer, the
 * size of one layer, holds `to` in between. Rows are copied in the order that reads each frozen
 * row before anything overwrites it. */
void glm_model_train_layer(glm_model *m, int to) {
    int from = m->cfg.peft.badam_layer;
    if (!m->cfg.peft.badam || to == from) return;
    if (!m->grads || m->qtab.n || m->layer_lo != 0 || m->layer_hi != m->cfg.num_layers)
        GLM_FATAL("train BAdam on one process, with a float base", "BAdam's switch needs the whole model, a gradient buffer "
                                                                    "and no quantized rows");
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype);
    glm_config c = m->cfg;
    c.peft.badam_layer = to;
    glm_table tab, ftab; /* laid out as the current ones were (units aligned for 8-bit moments' blocks) */
    if (m->unit_align) glm_table_build_units(&tab, &c, m->layer_lo, m->layer_hi, m->first, m->last, m->unit_align);
    else glm_table_build_range(&tab, &c, m->layer_lo, m->layer_hi, m->first, m->last);
    glm_table_build_part(&ftab, &c, m->layer_lo, m->layer_hi, m->first, m->last, 64, GLM_PART_FROZEN);
    if (tab.total != m->tab.total || ftab.total != m->ftab.total)
        GLM_FATAL("report this as a bug", "BAdam: layer %d's rows take another size than layer %d's", to, from);
#define ROW_COPY(dst_buf, dst_tab, src_buf, src_tab, l, k)                                                          \
    do {                                                                                                             \
        const glm_tensor *d_ = glm_table_get(dst_tab, l, k), *s_ = glm_table_get(src_tab, l, k);                     \
        if (d_ && s_) be->copy(be, glm_at(be, dst_buf, d_->offset), glm_at(be, src_buf, s_->offset), s_->numel * es); \
    } while (0)
    for (int k = 0; k < T_NKINDS; k++) ROW_COPY(m->grads, &tab, m->fparams, &m->ftab, to, k);
    int step = to > from ? -1 : 1; /* the layers between, the one nearest `to` first */
    for (int l = to + step; l != from; l += step)
        for (int k = 0; k < T_NKINDS; k++) ROW_COPY(m->fparams, &ftab, m->fparams, &m->ftab, l, k);
    for (int k = 0; k < T_NKINDS; k++) ROW_COPY(m->fparams, &ftab, m->params, &m->tab, from, k);
    be->copy(be, m->params, m->grads, tab.total * es);
    be->zero(be, m->grads, tab.total * es);
#undef ROW_COPY
    glm_table_free(&m->tab);
    glm_table_free(&m->ftab);
    m->tab = tab;
    m->ftab = ftab;
    m->cfg.peft.badam_layer = to;
    rebind(m);
    free_acts(m); /* the backward's floor moved: the next batch sizes the activations for it */
}

void *glm_model_swap_params(glm_model *m, void *p) {
    void *old = m->params;
    m->params = p;
    rebind(m);
    return old;
}

void glm_model_drop_grads(glm_model *m) {
    if (m->grads) m->be->free(m->be, m->grads);
    m->grads = NULL;
    rebind(m);
}

/* The field of tensor t in w (weights or gradients). */
static void **field_of(glm_weights *w, const glm_tensor *t) {
    glm_layer_ptrs *p = t->layer >= 0 ? &w->layer[t->layer] : NULL;
    if (glm_is_dora(t->kind)) return &p->lora_m[glm_lora_module(t->kind)];
    if (glm_is_lora(t->kind)) {
        int i = glm_lora_module(t->kind);
        return (t->kind - T_QKV_LA) % 2 ? &p->lora_b[i] : &p->lora_a[i];
    }
    switch (t->kind) {
    case T_PREFIX_EMB: return &w->prefix_emb;
    case T_PREFIX_W1: return &w->prefix_w1;
    case T_PREFIX_B1: return &w->prefix_b1;
    case T_PREFIX_W2: return &w->prefix_w2;
    case T_PREFIX_B2: return &w->prefix_b2;
    case T_WORD_EMB: return &w->wte;
    case T_LNF_W: return &w->lnf_w;
    case T_LNF_B: return &w->lnf_b;
    case T_LM_HEAD: return &w->head;
    case T_VHEAD_W: return &w->vhead_w;
    case T_VHEAD_B: return &w->vhead_b;
    case T_LN1_W: return &p->ln1_w;
    case T_LN1_B: return &p->ln1_b;
    case T_QKV_W: return &p->qkv_w;
    case T_QKV_B: return &p->qkv_b;
    case T_DENSE_W: return &p->dense_w;
    case T_DENSE_B: return &p->dense_b;
    case T_LN2_W: return &p->ln2_w;
    case T_LN2_B: return &p->ln2_b;
    case T_FC1_W: return &p->fc1_w;
    case T_FC1_B: return &p->fc1_b;
    case T_FC2_W: return &p->fc2_w;
    case T_FC2_B: return &p->fc2_b;
    case T_LN3_W: return &p->ln3_w;
    case T_LN4_W: return &p->ln4_w;
    default: return NULL;
    }
}

/* The end of the unit starting at flat offset lo (the next unit's start). */
static size_t unit_end(const glm_model *m, size_t lo) {
    size_t hi = m->tab.total;
    for (int j = 0; j < m->tab.n; j++)
        if (starts_unit(&m->tab.t[j]) && m->tab.t[j].offset > lo && m->tab.t[j].offset < hi) hi = m->tab.t[j].offset;
    return hi;
}

/* ZeRO-3: unit u's weights are needed now (u = -1 the embedding and the prefix encoder, 0..L-1 a
 * layer, L the final norm and head); nothing for a unit with no trainable row. */
static void need(glm_model *m, int u) {
    size_t lo = m->params_need ? unit_lo(m, u) : SIZE_MAX;
    if (lo != SIZE_MAX) m->params_need(m->params_ctx, lo, unit_end(m, lo));
}
/* The unit holding the head's weight: the embedding's when tied. */
static int head_unit(const glm_model *m) { return m->cfg.tie_word_embeddings ? -1 : m->cfg.num_layers; }

/* Before backward writes the gradients of the unit starting at flat offset lo: the grads_unit
 * hook may send them elsewhere (ZeRO-2 staging); the unit's gradient views follow. */
static void begin_unit(glm_model *m, size_t lo) {
    if (!m->grads_unit) return;
    size_t hi = unit_end(m, lo);
    void *base = m->grads_unit(m->grads_unit_ctx, lo, hi);
    if (!base) return;
    for (int j = 0; j < m->tab.n; j++) {
        const glm_tensor *t = &m->tab.t[j];
        if (t->offset < lo || t->offset >= hi) continue;
        void **f = field_of(&m->g, t);
        if (f) *f = glm_at(m->be, base, t->offset - lo);
        if (t->kind == T_WORD_EMB && m->cfg.tie_word_embeddings) m->g.head = m->g.wte;
    }
}

void glm_model_reserve_flat(glm_model *m, size_t elems) {
    if (elems <= m->flat_cap) return;
    move_flat(m, &m->tab, elems);
    rebind(m);
}

/* The buffers selective checkpointing rebuilds in backward (x, ctx, y, act)... */
static void acts_alloc_rebuilt(const glm_model *m, glm_layer_acts *a, size_t N) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    size_t es = glm_dtype_size(be->dtype), H = c->hidden_size, F = c->inner_hidden_size, A = glm_attn_width(c);
    a->x = be->alloc(be, N * H * es); a->ctx = be->alloc(be, N * A * es);
    a->y = be->alloc(be, N * H * es); a->act = be->alloc(be, N * F * es);
}

/* ... and the ones every level keeps per layer. */
static void acts_alloc_kept(const glm_model *m, glm_layer_acts *a, size_t N) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    size_t es = glm_dtype_size(be->dtype), H = c->hidden_size, NH = c->num_attention_heads, W = glm_qkv_width(c);
    size_t F1 = glm_fc1_width(c);
    a->ln1_mean = be->alloc(be, N * 4); a->ln1_rstd = be->alloc(be, N * 4);
    a->qkv = be->alloc(be, N * W * es); a->lse = be->alloc(be, N * NH * 4);
    a->h1 = be->alloc(be, N * H * es); a->ln2_mean = be->alloc(be, N * 4); a->ln2_rstd = be->alloc(be, N * 4);
    a->fc1 = be->alloc(be, N * F1 * es);
    if (c->sandwich_norms) {
        a->z1 = be->alloc(be, N * H * es); a->z2 = be->alloc(be, N * H * es);
        a->ln3_rstd = be->alloc(be, N * 4); a->ln4_rstd = be->alloc(be, N * 4);
    }
    for (int i = 0; i < 4; i++) { /* an adapter's middle, where any layer has one, and DoRA's output */
        int on = m->cfg.peft.kind == GLM_FT_LORA && (m->cfg.peft.lora_targets >> i & 1);
        a->lora_t[i] = on ? be->alloc(be, N * (size_t)m->cfg.peft.lora_rank * glm_lora_split(c, i) * es) : NULL;
        a->dora_z[i] = on && m->cfg.peft.use_dora ? be->alloc(be, N * (size_t)glm_linear_out(c, i) * es) : NULL;
    }
}

void glm_layer_acts_alloc(const glm_model *m, glm_layer_acts *a, size_t N) {
    acts_alloc_kept(m, a, N);
    acts_alloc_rebuilt(m, a, N);
}

void glm_layer_acts_free(const glm_model *m, glm_layer_acts *a) {
    void *ptrs[] = {a->x, a->ln1_mean, a->ln1_rstd, a->qkv, a->ctx, a->lse, a->h1, a->ln2_mean, a->ln2_rstd, a->y, a->fc1, a->act,
                    a->lora_t[0], a->lora_t[1], a->lora_t[2], a->lora_t[3], a->dora_z[0], a->dora_z[1], a->dora_z[2],
                    a->dora_z[3], a->z1, a->z2, a->ln3_rstd, a->ln4_rstd};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) if (ptrs[i]) m->be->free(m->be, ptrs[i]);
    *a = (glm_layer_acts){0};
}

/* Whether any row of trainable table tab belongs to layer l (a weight, a norm or an adapter). */
static int table_layer_trains(const glm_table *tab, int l) {
    for (int i = 0; i < tab->n; i++)
        if (tab->t[i].layer == l) return 1;
    return 0;
}

/* The lowest of layers [l0, l1) whose backward matters, for trainable table tab. On the first
 * stage over a frozen embedding, nothing below the lowest trainable layer wants a gradient
 * (freeze mode: the last N layers), unless P-Tuning's prefix, which every layer's attention
 * feeds, trains. The model and its memory plan both ask this. */
static int table_backward_floor(const glm_table *tab, const glm_config *c, int l0, int l1, int first) {
    if (!first || glm_table_get(tab, -1, T_WORD_EMB) || c->peft.pre_seq_len > 0) return l0;
    int l = l0;
    while (l < l1 && !table_layer_trains(tab, l)) l++;
    return l;
}
static int backward_floor(const glm_model *m) {
    return table_backward_floor(&m->tab, &m->cfg, m->layer_lo, m->layer_hi, m->first);
}

/* Activation sets, for the floor f = m->act_floor: without checkpointing one per layer of
 * [f, layer_hi); with selective checkpointing those plus the set they share (index
 * layer_hi - f, when there are such layers); one reused by every layer with full
 * checkpointing. Below the floor, where no backward runs, the layers share one more set, the
 * last (a pipeline's first stage may hold no trainable layer at all). */
static int below_floor(const glm_model *m) {
    return m->gradient_checkpointing != GLM_CKPT_FULL && m->act_floor > m->layer_lo;
}
/* The buffer layer input resid[i] uses (below = floor - layer_lo): its own from the floor up;
 * below it, where nothing reads them after the forward, one of the first two in turn (layer l
 * reads one and writes the other). */
static int resid_slot(int i, int below) { return i >= 2 && i < below ? i % 2 : i; }
/* how many distinct layer-input buffers layers [l0, l1) with that floor have */
static int resid_buffers(int l0, int l1, int floor) {
    int n = 0;
    for (int i = 0; i <= l1 - l0; i++) n += resid_slot(i, floor - l0) == i;
    return n;
}
static int act_sets(const glm_model *m) {
    int nk = m->layer_hi - m->act_floor;
    if (m->gradient_checkpointing == GLM_CKPT_FULL) return 1;
    return (m->gradient_checkpointing == GLM_CKPT_SELECTIVE ? nk + (nk > 0) : nk) + below_floor(m);
}

static void free_acts(glm_model *m) {
    glm_backend *be = m->be;
    if (!m->acts) return;
    int nsets = act_sets(m), nk = m->layer_hi - m->act_floor;
    if (m->gradient_checkpointing == GLM_CKPT_SELECTIVE) /* the shared buffers are freed once, with their set */
        for (int l = 0; l < nk; l++) m->acts[l].x = m->acts[l].ctx = m->acts[l].y = m->acts[l].act = NULL;
    for (int l = 0; l < nsets; l++) glm_layer_acts_free(m, &m->acts[l]);
    free(m->acts);
    for (int i = 0; i <= m->layer_hi - m->layer_lo; i++)
        if (resid_slot(i, m->act_floor - m->layer_lo) == i) be->free(be, m->resid[i]);
    free(m->resid);
    void *ptrs[] = {m->lnf_out, m->lnf_mean, m->lnf_rstd, m->d_a, m->d_b, m->d_x, m->d_h1, m->d_ctx, m->d_qkv, m->d_ff,
                    m->d_act, m->head_in, m->logits, m->d_head_in, m->losses, m->bd.ids, m->bd.pos, m->bd.block_pos,
                    m->bd.kv_lo, m->bd.kv_hi, m->bd.sup_idx, m->bd.sup_tgt, m->kvbuf, m->dkvbuf, m->pkv_lo, m->pkv_hi,
                    m->prefix_acc, m->tok_w};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) if (ptrs[i]) be->free(be, ptrs[i]);
    m->kvbuf = m->dkvbuf = m->d_act = m->prefix_acc = NULL;
    m->tok_w = NULL;
    m->pkv_lo = m->pkv_hi = NULL;
    m->acts = NULL;
    m->cap_tokens = 0;
}

void glm_model_free(glm_model *m) {
    free(m->adapters_saved);
    free_acts(m);
    m->be->free(m->be, m->params);
    if (m->grads) m->be->free(m->be, m->grads);
    if (m->fparams) m->be->free(m->be, m->fparams);
    if (m->qparams) m->be->free(m->be, m->qparams);
    if (m->qscratch) m->be->free(m->be, m->qscratch);
    if (m->lora_tmp) m->be->free(m->be, m->lora_tmp);
    if (m->lora_u) m->be->free(m->be, m->lora_u);
    void *pre[] = {m->pkv, m->prefix_h, m->dpkv, m->dprefix_h, m->dora_n, m->dora_g};
    for (int i = 0; i < 6; i++) if (pre[i]) m->be->free(m->be, pre[i]);
    free(m->dora_fresh);
    free(m->pissa_init);
    free(m->w.layer);
    free(m->g.layer);
    glm_table_free(&m->tab);
    glm_table_free(&m->ftab);
    glm_table_free(&m->qtab);
}

int glm_model_nrows(const glm_model *m) { return m->tab.n + m->ftab.n + m->qtab.n; }

const glm_tensor *glm_model_row(const glm_model *m, int i, void **ptr) {
    if (i >= m->tab.n + m->ftab.n) { /* quantized: byte offsets */
        const glm_tensor *r = &m->qtab.t[i - m->tab.n - m->ftab.n];
        if (ptr) *ptr = (char *)m->qparams + r->offset;
        return r;
    }
    const glm_table *t = i < m->tab.n ? &m->tab : &m->ftab;
    void *base = i < m->tab.n ? m->params : m->fparams;
    const glm_tensor *r = &t->t[i < m->tab.n ? i : i - m->tab.n];
    if (ptr) *ptr = glm_at(m->be, base, r->offset);
    return r;
}

void glm_model_row_upload(glm_model *m, const glm_tensor *t, void *dst, const float *host) {
    if (!t->qtype) { m->be->upload_f32(m->be, dst, host, t->numel); return; }
    glm_qlayout L = glm_qlayout_of((glm_qtype)t->qtype, (size_t)t->shape[0], (size_t)t->shape[1]);
    void *q = glm_malloc(L.bytes);
    glm_quantize((glm_qtype)t->qtype, q, host, (size_t)t->shape[0], (size_t)t->shape[1]);
    m->be->upload(m->be, dst, q, L.bytes);
    free(q);
    m->qscratch_of = NULL;
}

void glm_model_row_download(glm_model *m, const glm_tensor *t, float *host, const void *src) {
    if (!t->qtype) { m->be->download_f32(m->be, host, src, t->numel); return; }
    glm_qlayout L = glm_qlayout_of((glm_qtype)t->qtype, (size_t)t->shape[0], (size_t)t->shape[1]);
    void *q = glm_malloc(L.bytes);
    m->be->download(m->be, q, src, L.bytes);
    glm_dequantize((glm_qtype)t->qtype, host, q, (size_t)t->shape[0], (size_t)t->shape[1]);
    free(q);
}

const glm_tensor *glm_model_find(const glm_model *m, const char *name, void **ptr) {
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        if (strcmp(t->name, name) == 0) { if (ptr) *ptr = p; return t; }
    }
    return NULL;
}

void glm_model_set_checkpointing(glm_model *m, int level) {
    GLM_ASSERT(level >= GLM_CKPT_NONE && level <= GLM_CKPT_SELECTIVE);
    free_acts(m); /* the number of saved activation sets changes with it */
    m->gradient_checkpointing = level;
}

void glm_zero_grads(glm_model *m) {
    GLM_ASSERT(m->grads); /* an inference model has none */
    m->be->zero(m->be, m->grads, m->tab.total * glm_dtype_size(m->be->dtype));
}

void glm_model_get_params(glm_model *m, float *host) {
    m->be->download_f32(m->be, host, m->params, m->tab.total);
}

void glm_model_set_params(glm_model *m, const float *host) {
    m->be->upload_f32(m->be, m->params, host, m->tab.total);
}

glm_mem_plan glm_memory_plan_stage(const glm_config *c, int l0, int l1, int embed, int head, glm_dtype dtype, int B,
                                   int T, int ckpt, int head_chunk, size_t unit_slots[2]) {
    glm_table tab, frozen, quant; /* the three tables glm_model_init_stage builds */
    glm_table_build_range(&tab, c, l0, l1, embed, head);
    glm_table_build_part(&frozen, c, l0, l1, embed, head, 64, GLM_PART_FROZEN);
    glm_table_build_part(&quant, c, l0, l1, embed, head, 64, GLM_PART_QUANT);
    double es = (double)glm_dtype_size(dtype), N = (double)B * T;
    double H = c->hidden_size, F = c->inner_hidden_size, V = c->vocab_size, NH = c->num_attention_heads;
    int nl = l1 - l0;
    glm_mem_plan p = {0};
    /* gradients, master weights and moments for the trainable rows only */
    p.params = (double)(tab.total + frozen.total) * es + (double)quant.total;
    p.grads = (double)tab.total * es;
    p.master = dtype == GLM_F32 ? 0 : (double)tab.total * 4;
    p.moments = 2.0 * tab.total * 4;
    size_t g_flat, g_low, g_scratch = 0; /* GaLore: projected moments for its rows, and one float row of scratch */
    if (c->peft.galore_rank > 0) {
        glm_galore_state(c, &tab, &g_flat, &g_low, &g_scratch, NULL);
        p.moments = (2.0 * g_flat + g_low) * 4;
    }
    if (unit_slots) /* the unit-by-unit gradient paths' staging (parallel/dp/unit_slots.h) */
        glm_table_unit_slots(&tab, c->tie_word_embeddings, &unit_slots[0], &unit_slots[1]);
    /* per layer set, as ensure_acts allocates: x, qkv(3), ctx, h1, y (7H) + fc1, act (2F) + the
     * adapters' middles in S; LayerNorm statistics (4 floats) and the attention lse (NH floats)
     * per token; the inputs of the layers and the output */
    int adapters = 0;
    /* the family's widths: q|k|v, the attention output, the first MLP linear (config.h) */
    double W = glm_qkv_width(c), A = glm_attn_width(c), F1 = glm_fc1_width(c), dora = 0;
    for (int i = 0; i < 4; i++) {
        int on = c->peft.kind == GLM_FT_LORA && (c->peft.lora_targets >> i & 1);
        adapters += on * glm_lora_split(c, i);
        dora += on && c->peft.use_dora ? glm_linear_out(c, i) : 0; /* DoRA's kept outputs (dora_z) */
    }
    double sandwich = c->sandwich_norms ? 2 * H : 0; /* GLM-4-0414's z1, z2 (and 2 floats of statistics) */
    double per_set = N * ((3 * H + A + W + F1 + F + sandwich + adapters * (double)c->peft.lora_rank + dora) * es +
                          (4 + NH + (sandwich > 0) * 2) * 4);
    double rebuilt = N * (2 * H + A + F) * es; /* x, ctx, y, act: what selective checkpointing shares */
    /* as act_sets: the layers from the backward's floor up keep theirs; those below share one */
    int nk = l1 - table_backward_floor(&tab, c, l0, l1, embed), below = nk < nl;
    double sets = ckpt == GLM_CKPT_FULL ? (nl > 0) * per_set
                  : (ckpt == GLM_CKPT_SELECTIVE ? nk * (per_set - rebuilt) + (nk > 0) * rebuilt : nk * per_set) +
                        below * per_set;
    p.activations = sets + resid_buffers(l0, l1, l1 - nk) * N * H * es;
    p.scratch = N * H * es * 5 /* lnf_out, d_a, d_b, d_x, d_h1 */ + N * (A + W + F1) * es /* d_ctx, d_qkv, d_ff */ +
                (c->family == GLM_FAMILY_GLM2 ? N * F * es : 0) /* d_act */ + N * 2 * 4 +
                (N < head_chunk ? N : head_chunk) * ((2 * H + V) * es + 4.0) + N * 7 * 4;
    if (c->peft.kind == GLM_FT_LORA) /* lora_tmp, lora_u */
        p.scratch += N * glm_linear_out_max(c) * es + (c->peft.lora_dropout > 0 ? N * glm_linear_in_max(c) * es : 0);
    if (c->peft.kind == GLM_FT_LORA && c->peft.use_dora) /* dora_g, and the row norms (float) */
        p.scratch += (N * es + nl * 4.0 * 4) * glm_linear_out_max(c);
    size_t qbig = 0; /* qscratch: the largest quantized matrix dequantized */
    for (int i = 0; i < quant.n; i++) qbig = quant.t[i].numel > qbig ? quant.t[i].numel : qbig;
    p.scratch += (double)qbig * es + (double)g_scratch * 4;
    p.total = p.params + p.grads + p.master + p.moments + p.activations + p.scratch;
    glm_table_free(&tab);
    glm_table_free(&frozen);
    glm_table_free(&quant);
    return p;
}

glm_mem_plan glm_memory_plan(const glm_config *c, glm_dtype dtype, int B, int T, int ckpt, int head_chunk) {
    return glm_memory_plan_stage(c, 0, c->num_layers, 1, 1, dtype, B, T, ckpt, head_chunk, NULL);
}

/* (Re)allocates activation buffers when a batch needs more room than the last one. */
static void ensure_acts(glm_model *m, int B, int T) {
    if (m->acts && B * T <= m->cap_tokens && B <= m->cap_B && T <= m->cap_T) return;
    free_acts(m);
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype);
    const glm_config *c = &m->cfg;
    int H = c->hidden_size, V = c->vocab_size;
    size_t N = (size_t)B * T, W = glm_qkv_width(c), A = glm_attn_width(c), F1 = glm_fc1_width(c);
#define S_BUF(n) be->alloc(be, (size_t)(n) * es)
#define F_BUF(n) ((float *)be->alloc(be, (size_t)(n) * sizeof(float)))
#define I_BUF(n) ((int32_t *)be->alloc(be, (size_t)(n) * sizeof(int32_t)))
    m->act_floor = backward_floor(m);
    int nl = m->layer_hi - m->layer_lo, nk = m->layer_hi - m->act_floor, nsets = act_sets(m);
    m->acts = glm_calloc(nsets, sizeof *m->acts);
    if (m->gradient_checkpointing == GLM_CKPT_SELECTIVE) {
        if (nk > 0) {
            glm_layer_acts *shared = &m->acts[nk];
            acts_alloc_rebuilt(m, shared, N);
            for (int l = 0; l < nk; l++) {
                glm_layer_acts *a = &m->acts[l];
                acts_alloc_kept(m, a, N);
                a->x = shared->x; a->ctx = shared->ctx; a->y = shared->y; a->act = shared->act;
            }
        }
        if (below_floor(m)) glm_layer_acts_alloc(m, &m->acts[nsets - 1], N);
    } else {
        for (int l = 0; l < nsets; l++) glm_layer_acts_alloc(m, &m->acts[l], N);
    }
    m->resid = glm_calloc(nl + 1, sizeof *m->resid);
    for (int i = 0, s; i <= nl; i++)
        m->resid[i] = (s = resid_slot(i, m->act_floor - m->layer_lo)) == i ? S_BUF(N * H) : m->resid[s];
    m->lnf_out = S_BUF(N * H); m->lnf_mean = F_BUF(N); m->lnf_rstd = F_BUF(N);
    m->d_a = S_BUF(N * H); m->d_b = S_BUF(N * H); m->d_x = S_BUF(N * H); m->d_h1 = S_BUF(N * H);
    m->d_ctx = S_BUF(N * A); m->d_qkv = S_BUF(N * W); m->d_ff = S_BUF(N * F1);
    if (c->family == GLM_FAMILY_GLM2) m->d_act = S_BUF(N * c->inner_hidden_size);
    int ch = m->head_chunk < (int)N ? m->head_chunk : (int)N; /* a chunk never holds more rows than the batch has tokens */
    m->head_in = S_BUF((size_t)ch * H); m->logits = S_BUF((size_t)ch * V); m->d_head_in = S_BUF((size_t)ch * H);
    m->losses = F_BUF(ch);
    m->bd.ids = I_BUF(N); m->bd.pos = I_BUF(N); m->bd.block_pos = I_BUF(N);
    m->bd.kv_lo = I_BUF(N); m->bd.kv_hi = I_BUF(N); m->bd.sup_idx = I_BUF(N); m->bd.sup_tgt = I_BUF(N);
    m->tok_w = F_BUF(N);
    int P = m->cfg.peft.pre_seq_len;
    if (P > 0) { /* one layer's prefix + sequence keys/values at a time, rebuilt in backward */
        size_t KVW = c->family == GLM_FAMILY_GLM2 ? 2 * (size_t)glm_kv_heads(c) * glm_head_dim(c) : 2 * (size_t)H;
        m->kvbuf = S_BUF((size_t)B * (P + T) * KVW);
        m->dkvbuf = S_BUF((size_t)B * (P + T) * KVW);
        if (c->family == GLM_FAMILY_GLM2) m->prefix_acc = S_BUF(2 * (size_t)P * KVW);
        m->pkv_lo = I_BUF(N); m->pkv_hi = I_BUF(N);
    }
#undef S_BUF
#undef F_BUF
#undef I_BUF
    m->cap_tokens = (int)N; m->cap_B = B; m->cap_T = T;
}

/* Uploads the batch; the supervised rows are compacted on the host. */
static void upload_batch(glm_model *m, const glm_batch *b) {
    glm_backend *be = m->be;
    size_t N = (size_t)b->B * b->T, bytes = N * sizeof(int32_t);
    be->upload(be, m->bd.ids, b->ids, bytes);
    int32_t *rule = glm_malloc(4 * bytes); /* the family's positions and key ranges */
    m->fam->batch_rule(b, rule, rule + N, rule + 2 * N, rule + 3 * N);
    be->upload(be, m->bd.pos, rule, bytes);
    be->upload(be, m->bd.block_pos, rule + N, bytes);
    be->upload(be, m->bd.kv_lo, rule + 2 * N, bytes);
    be->upload(be, m->bd.kv_hi, rule + 3 * N, bytes);
    int32_t *idx = glm_malloc(bytes), *tgt = glm_malloc(bytes);
    int n = 0;
    if (m->cfg.value_head) { /* one row a batch row: its last token, the one its last target predicts */
        for (int r = 0; r < b->B; r++)
            for (int i = b->T - 1; i >= 0; i--)
                if (b->targets[(size_t)r * b->T + i] != -100) {
                    idx[n] = (int32_t)((size_t)r * b->T + i + 1); tgt[n] = 0; n++;
                    break;
                }
    } else {
        for (size_t i = 0; i < N; i++)
            if (b->targets[i] != -100) {
                GLM_ASSERT(b->targets[i] >= 0 && b->targets[i] < m->cfg.vocab_size);
                idx[n] = (int32_t)i; tgt[n] = b->targets[i]; n++;
            }
    }
    if (n) {
        be->upload(be, m->bd.sup_idx, idx, (size_t)n * sizeof(int32_t));
        be->upload(be, m->bd.sup_tgt, tgt, (size_t)n * sizeof(int32_t));
    }
    free(idx); free(tgt);
    int P = m->cfg.peft.pre_seq_len;
    if (P > 0) { /* every query also sees the P prefix keys in front: [0, P + hi). Real tokens'
                  * ranges start at 0 (packing is refused with P-Tuning); a padding position's
                  * own segment widens to its row's start, which no loss and no real token sees */
        int32_t *lo = glm_malloc(bytes), *hi = glm_malloc(bytes);
        for (size_t i = 0; i < N; i++) {
            lo[i] = 0;
            hi[i] = rule[3 * N + i] + P; /* the family's key range, behind the prefix */
        }
        be->upload(be, m->pkv_lo, lo, bytes);
        be->upload(be, m->pkv_hi, hi, bytes);
        free(lo); free(hi);
    }
    free(rule);
    m->bd.B = b->B; m->bd.T = b->T; m->bd.n_sup = n;
}

/* ---------------------------------------------------------------- forward */

static void *resid(glm_model *m, int l);

/* Layer l's attention inputs on the model's batch: q, k, v views of a->qkv (behind the P-Tuning
 * prefix, rebuilt into kvbuf with the same dropout, when there is one), the key ranges and the
 * number of keys. */
static int attention_views(glm_model *m, int l, glm_layer_acts *a, glm_qkv_view *q, glm_qkv_view *k, glm_qkv_view *v,
                           const int32_t **lo, const int32_t **hi) {
    int T = m->bd.T, P = m->cfg.peft.pre_seq_len;
    m->fam->qkv_views(m, a->qkv, (long)T * glm_qkv_width(&m->cfg), q, k, v);
    if (P > 0) {
        glm_prefix_kv_views(m, l, a, k, v);
        *lo = m->pkv_lo; *hi = m->pkv_hi;
        return P + T;
    }
    *lo = m->bd.kv_lo; *hi = m->bd.kv_hi;
    return T;
}

void glm_attend(glm_model *m, glm_layer_acts *a, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *kv_lo,
                const int32_t *kv_hi, int B, int Tq, int Tk) {
    int NH = m->cfg.num_attention_heads, HD = glm_head_dim(&m->cfg);
    m->be->attention_fwd(m->be, a->ctx, a->lse, q, k, v, kv_lo, kv_hi, B, Tq, Tk, NH, HD, 1.0f / sqrtf((float)HD));
}

void glm_block_finish(glm_model *m, int l, glm_layer_acts *a, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                      const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, void *h_out) {
    glm_attend(m, a, q, k, v, kv_lo, kv_hi, B, Tq, Tk);
    m->fam->block_rows(m, l, a, B * Tq, h_out);
}

/* Only the supervised rows go on past the top layer's attention (m->top_rows of them), when a
 * loss is all the last stage's forward is for and some rows carry no label: everything after
 * the attention works row by row, and no other row's output reaches the loss. (A last stage
 * without layers, the final norm and the head alone, reads its input's every row.) */
static void choose_top_rows(glm_model *m) {
    int N = m->bd.B * m->bd.T, n = m->bd.n_sup;
    m->top_rows = m->last && m->layer_hi > m->layer_lo && !m->keep_all_rows && n > 0 && n < N ? n : 0;
}
static int top_compact(const glm_model *m, int l) { return m->top_rows > 0 && l == m->layer_hi - 1; }
/* rows of the stage's output, the final norm's and their gradients */
static int out_rows(const glm_model *m) { return m->top_rows ? m->top_rows : m->bd.B * m->bd.T; }

/* The top layer's activations for its compact rows: the attention outputs of the supervised
 * rows in d_qkv (free until this layer's attention backward writes it), the residual source's
 * rows in lnf_out (free until the final norm, and only block_rows reads them), the rest in the
 * layer's own buffers, their first top_rows rows. Forward and backward make the same view. */
static glm_layer_acts top_view(glm_model *m, const glm_layer_acts *a) {
    glm_layer_acts t = *a;
    t.ctx = m->d_qkv;
    if (m->fam->residual_from_norm) t.x = m->lnf_out;
    else t.in = m->lnf_out;
    return t;
}

static void layer_forward(glm_model *m, int l, glm_layer_acts *a, const void *h_in, void *h_out) {
    int B = m->bd.B, T = m->bd.T;
    m->fam->block_qkv(m, l, a, h_in, B * T, m->bd.pos, m->bd.block_pos);
    glm_qkv_view q, k, v;
    const int32_t *lo, *hi;
    int Tk = attention_views(m, l, a, &q, &k, &v, &lo, &hi);
    glm_attend(m, a, q, k, v, lo, hi, B, T, Tk);
    if (!top_compact(m, l)) {
        m->fam->block_rows(m, l, a, B * T, h_out);
        return;
    }
    glm_backend *be = m->be;
    glm_layer_acts t = top_view(m, a);
    be->gather_rows(be, t.ctx, a->ctx, m->bd.sup_idx, m->top_rows, glm_attn_width(&m->cfg));
    be->gather_rows(be, m->lnf_out, m->fam->residual_from_norm ? a->x : a->in, m->bd.sup_idx, m->top_rows,
                    m->cfg.hidden_size);
    m->fam->block_rows(m, l, &t, m->top_rows, h_out); /* h_out's first top_rows rows */
}

/* x [top_rows, C] compact -> x [N, C], the supervised rows in their places and zero elsewhere
 * (through scratch, at least top_rows x C). */
static void spread_top_rows(glm_model *m, void *x, void *scratch, int C) {
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype), n = (size_t)m->top_rows, N = (size_t)m->bd.B * m->bd.T;
    be->copy(be, scratch, x, n * C * es);
    be->zero(be, x, N * C * es);
    be->scatter_rows(be, x, scratch, m->bd.sup_idx, (int)n, C);
}

/* Layer l's backward from dh_out into dh_in: its rows after attention (the top layer's compact
 * ones, their gradients then spread over the batch's rows), then attention and below. */
static void layer_backward(glm_model *m, int l, glm_layer_acts *a, const void *dh_out, void *dh_in) {
    if (top_compact(m, l)) {
        glm_layer_acts t = top_view(m, a);
        m->fam->block_rows_bwd(m, l, &t, dh_out, m->top_rows);
        /* d_qkv (the compact attention outputs, read) and d_x (dy, dead) are free until written */
        spread_top_rows(m, m->d_ctx, m->d_qkv, glm_attn_width(&m->cfg));
        spread_top_rows(m, m->d_h1, m->d_x, m->cfg.hidden_size);
    } else {
        m->fam->block_rows_bwd(m, l, a, dh_out, m->bd.B * m->bd.T);
    }
    m->fam->block_attn_bwd(m, l, a, resid(m, l), dh_in);
}

/* Selective checkpointing: rebuilds layer l's shared activations (x, ctx, y, act) from what it
 * kept (its input, qkv, h1, fc1), as its forward made them. */
static void layer_recompute(glm_model *m, int l, glm_layer_acts *a, const void *h_in) {
    glm_qkv_view q, k, v;
    const int32_t *lo, *hi;
    int Tk = attention_views(m, l, a, &q, &k, &v, &lo, &hi);
    m->fam->block_recompute(m, l, a, h_in, q, k, v, lo, hi, m->bd.B, m->bd.T, Tk);
}

static glm_layer_acts *acts_for(glm_model *m, int l) {
    if (m->gradient_checkpointing == GLM_CKPT_FULL) return &m->acts[0];
    return l < m->act_floor ? &m->acts[act_sets(m) - 1] : &m->acts[l - m->act_floor];
}
/* input of global layer l (l = layer_hi: the stage's output) */
static void *resid(glm_model *m, int l) { return m->resid[l - m->layer_lo]; }

/* Embedding (first stage) or the given stage input, this stage's layers, and the final norm
 * (last stage). */
static void forward_trunk(glm_model *m, const void *h_in) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int N = m->bd.B * m->bd.T, H = c->hidden_size;
    size_t bytes = (size_t)N * H * glm_dtype_size(be->dtype);
    if (m->first || c->peft.pre_seq_len > 0) need(m, -1);
    if (m->first) be->embedding_fwd(be, resid(m, m->layer_lo), m->bd.ids, m->w.wte, N, H);
    else be->copy(be, resid(m, m->layer_lo), h_in, bytes);
    if (m->first && m->training && c->neftune_alpha > 0) /* additive: the embedding's gradient is unchanged */
        be->noise_add(be, resid(m, m->layer_lo), (size_t)N * H, glm_neftune_mag(c->neftune_alpha, m->bd.T, H),
                      glm_neftune_seed(m->dropout_seed));
    if (c->peft.pre_seq_len > 0) glm_prefix_forward(m); /* every stage runs the encoder for its own layers */
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        need(m, l);
        layer_forward(m, l, acts_for(m, l), resid(m, l), resid(m, l + 1));
    }
    if (m->last) {
        need(m, c->num_layers);
        m->fam->final_norm(m, m->lnf_out, m->lnf_mean, m->lnf_rstd, resid(m, m->layer_hi), out_rows(m));
    }
}

/* The final norm's output of supervised rows r0 .. r0 + R: the compact top rows themselves, or
 * gathered into head_in. */
static const void *head_rows(glm_model *m, int r0, int R) {
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size;
    if (m->top_rows) return glm_at(be, m->lnf_out, (size_t)r0 * H);
    be->gather_rows(be, m->head_in, m->lnf_out, m->bd.sup_idx + r0, R, H);
    return m->head_in;
}

static double value_head(glm_model *m, float dscale, void *dlnf, const float *dvals, float *vals);
/* LM head + cross entropy over the supervised rows, chunk by chunk (gathered from lnf_out, or
 * its first rows when the top layer computed only those). With backward, also writes d(lnf_out)
 * into dlnf (zero on the other rows) and accumulates the head's weight gradient; with tok_w
 * (device, [n_sup]) each row's gradient is weighed by it. tok_loss (host, [n_sup], or NULL) gets
 * every row's loss. */
static double head_loss(glm_model *m, float dscale, void *dlnf, const float *tok_w, float *tok_loss) {
    if (m->cfg.value_head) return value_head(m, dscale, dlnf, tok_w, tok_loss);
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size, N = m->bd.B * m->bd.T;
    if (dlnf && !m->top_rows) be->zero(be, dlnf, (size_t)N * H * glm_dtype_size(be->dtype));
    need(m, head_unit(m));
    double total = 0;
    float *host_losses = glm_malloc(sizeof(float) * m->head_chunk);
    for (int r0 = 0; r0 < m->bd.n_sup; r0 += m->head_chunk) {
        int R = m->bd.n_sup - r0 < m->head_chunk ? m->bd.n_sup - r0 : m->head_chunk;
        const void *in = head_rows(m, r0, R);
        be->matmul_fwd(be, m->logits, in, m->w.head, NULL, R, H, V);
        be->cross_entropy(be, m->logits, m->losses, m->bd.sup_tgt + r0, R, V, dlnf ? dscale : 0.0f,
                          tok_w ? tok_w + r0 : NULL);
        if (dlnf) { /* compact rows take their gradient in place; gathered ones go back to theirs */
            void *din = m->top_rows ? glm_at(be, dlnf, (size_t)r0 * H) : m->d_head_in;
            be->matmul_bwd(be, din, m->g.head, NULL, m->logits, in, m->w.head, R, H, V, 0);
            if (!m->top_rows) be->scatter_rows(be, dlnf, m->d_head_in, m->bd.sup_idx + r0, R, H);
        }
        be->download(be, host_losses, m->losses, sizeof(float) * R);
        for (int r = 0; r < R; r++) total += host_losses[r];
        if (tok_loss) memcpy(tok_loss + r0, host_losses, sizeof(float) * R);
    }
    free(host_losses);
    return total;
}

/* The value head in place of head_loss (--stage rm, TRL's ValueHead): each scored row's value
 * v = dropout(h) . w + b (h its final-norm output) into vals; with backward, dvals [n_sup] the
 * loss's derivative by each value (device): d h into dlnf (zero elsewhere) and the head's gradients.
 * A dot product per row: on the host, in double, from the rows brought over (B rows of H). */
static double value_head(glm_model *m, float dscale, void *dlnf, const float *dvals, float *vals) {
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size, N = m->bd.B * m->bd.T, n = m->bd.n_sup, chunk = m->head_chunk;
    if (dlnf && !m->top_rows) be->zero(be, dlnf, (size_t)N * H * glm_dtype_size(be->dtype));
    need(m, m->cfg.num_layers);
    float p = m->training ? m->cfg.value_head_dropout : 0.0f, bias;
    uint32_t thr = glm_mask_threshold(p);
    uint64_t seed = m->dropout_seed ^ 0x5bd1e9955bd1e995ULL;
    float *w = glm_malloc(sizeof(float) * H), *h = glm_malloc(sizeof(float) * (size_t)chunk * H);
    double *gw = glm_calloc((size_t)H, sizeof(double)), gb = 0;
    float *dv = NULL; /* the derivatives, from the device (glm_forward_backward_weighted put them there) */
    if (dlnf) {
        GLM_ASSERT(dvals); /* a value has no loss of its own */
        dv = glm_malloc(sizeof(float) * (n ? n : 1));
        if (n) be->download(be, dv, dvals, sizeof(float) * n);
    }
    be->download_f32(be, w, m->w.vhead_w, (size_t)H);
    be->download_f32(be, &bias, m->w.vhead_b, 1);
    for (int r0 = 0; r0 < n; r0 += chunk) {
        int R = n - r0 < chunk ? n - r0 : chunk;
        const void *in = head_rows(m, r0, R);
        be->download_f32(be, h, in, (size_t)R * H);
        for (int r = 0; r < R; r++) {
            float *x = h + (size_t)r * H;
            double v = bias, g = dlnf ? (double)dscale * dv[r0 + r] : 0;
            for (int j = 0; j < H; j++) { /* x becomes dropout(h), then d h */
                size_t e = (size_t)(r0 + r) * H + j;
                float keep = p > 0 ? (glm_mask_keep(seed, e, thr) ? 1.0f / (1.0f - p) : 0.0f) : 1.0f;
                x[j] *= keep;
                v += (double)x[j] * w[j];
                gw[j] += g * x[j];
                x[j] = (float)(g * w[j] * keep);
            }
            gb += g;
            if (vals) vals[r0 + r] = (float)v;
        }
        if (dlnf) { /* compact rows take their gradient in place; gathered ones go back to theirs */
            void *din = m->top_rows ? glm_at(be, dlnf, (size_t)r0 * H) : m->d_head_in;
            be->upload_f32(be, din, h, (size_t)R * H);
            if (!m->top_rows) be->scatter_rows(be, dlnf, m->d_head_in, m->bd.sup_idx + r0, R, H);
        }
    }
    if (dlnf) { /* gradients accumulate over micro-batches */
        float *g = glm_malloc(sizeof(float) * (H + 1));
        be->download_f32(be, g, m->g.vhead_w, (size_t)H);
        be->download_f32(be, g + H, m->g.vhead_b, 1);
        for (int j = 0; j < H; j++) g[j] += (float)gw[j];
        g[H] += (float)gb;
        be->upload_f32(be, m->g.vhead_w, g, (size_t)H);
        be->upload_f32(be, m->g.vhead_b, g + H, 1);
        free(g);
    }
    free(w); free(h); free(gw); free(dv);
    return 0;
}

double glm_forward_loss(glm_model *m, const glm_batch *b) {
    GLM_ASSERT(m->first && m->last);
    return glm_stage_loss(m, b, NULL);
}

/* A last stage's forward up to the head's input (the final norm's output): in training (dropout on)
 * before a backward, or for evaluation. */
static void forward_to_head(glm_model *m, const glm_batch *b, const void *h_in, int training) {
    m->training = training;
    ensure_acts(m, b->B, b->T);
    upload_batch(m, b);
    choose_top_rows(m);
    forward_trunk(m, h_in);
}

/* The evaluation forward: the loss sum, and each token's loss into tok_loss when given. */
static double eval_losses(glm_model *m, const glm_batch *b, const void *h_in, float *tok_loss) {
    GLM_ASSERT(m->last);
    forward_to_head(m, b, h_in, 0);
    return head_loss(m, 0.0f, NULL, NULL, tok_loss);
}

double glm_stage_loss(glm_model *m, const glm_batch *b, const void *h_in) { return eval_losses(m, b, h_in, NULL); }

void glm_model_adapters_off(glm_model *m, int off) {
    int L = m->layer_hi - m->layer_lo;
    if (off && !m->adapters_saved) {
        m->adapters_saved = glm_malloc(sizeof(glm_layer_ptrs) * (size_t)(L ? L : 1));
        for (int i = 0; i < L; i++) {
            glm_layer_ptrs *p = &m->w.layer[m->layer_lo + i];
            m->adapters_saved[i] = *p;
            for (int k = 0; k < 4; k++) p->lora_a[k] = p->lora_b[k] = p->lora_m[k] = NULL;
        }
    } else if (!off && m->adapters_saved) {
        for (int i = 0; i < L; i++) {
            glm_layer_ptrs *p = &m->w.layer[m->layer_lo + i];
            for (int k = 0; k < 4; k++) {
                p->lora_a[k] = m->adapters_saved[i].lora_a[k];
                p->lora_b[k] = m->adapters_saved[i].lora_b[k];
                p->lora_m[k] = m->adapters_saved[i].lora_m[k];
            }
        }
        free(m->adapters_saved);
        m->adapters_saved = NULL;
    }
}

void glm_forward_logits_at(glm_model *m, const glm_batch *b, const int32_t *cols, int ncols, float *out) {
    GLM_ASSERT(m->first && m->last && !m->cfg.value_head);
    forward_to_head(m, b, NULL, 0);
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    need(m, head_unit(m));
    float *row = glm_malloc(sizeof(float) * (size_t)V);
    for (int r0 = 0; r0 < m->bd.n_sup; r0 += m->head_chunk) {
        int R = m->bd.n_sup - r0 < m->head_chunk ? m->bd.n_sup - r0 : m->head_chunk;
        const void *in = head_rows(m, r0, R);
        be->matmul_fwd(be, m->logits, in, m->w.head, NULL, R, H, V);
        for (int r = 0; r < R; r++) { /* a row at a time: the few columns asked for */
            be->download_f32(be, row, glm_at(be, m->logits, (size_t)r * V), (size_t)V);
            for (int c = 0; c < ncols; c++) out[(size_t)(r0 + r) * ncols + c] = row[cols[c]];
        }
    }
    free(row);
}

void glm_forward_token_losses(glm_model *m, const glm_batch *b, float *tok_loss) {
    GLM_ASSERT(m->first);
    eval_losses(m, b, NULL, tok_loss);
}

static void stage_forward(glm_model *m, const glm_batch *b, const void *h_in, void *h_out, int training) {
    m->training = training; /* dropout (LoRA's, the prefix's) only in training */
    ensure_acts(m, b->B, b->T);
    upload_batch(m, b);
    m->top_rows = 0; /* h_out hands every row on */
    forward_trunk(m, h_in);
    if (h_out)
        m->be->copy(m->be, h_out, resid(m, m->layer_hi), (size_t)b->B * b->T * m->cfg.hidden_size * glm_dtype_size(m->be->dtype));
}

void glm_stage_forward(glm_model *m, const glm_batch *b, const void *h_in, void *h_out) {
    stage_forward(m, b, h_in, h_out, 1); /* a training pipeline's forward, which its backward recomputes */
}

void glm_stage_forward_eval(glm_model *m, const glm_batch *b, const void *h_in, void *h_out) {
    stage_forward(m, b, h_in, h_out, 0);
}

/* ---------------------------------------------------------------- backward */

double glm_forward_backward(glm_model *m, const glm_batch *b, float dscale) {
    GLM_ASSERT(m->first && m->last);
    return glm_stage_backward(m, b, NULL, NULL, NULL, dscale);
}

/* Tells the data-parallel hook that every gradient from unit u's first flat offset on is final
 * (u = -1: all of them); nothing when the unit has no trainable rows. */
static void grads_final_from(glm_model *m, int u) {
    size_t lo = u < 0 ? 0 : unit_lo(m, u);
    if (m->grads_ready && lo != SIZE_MAX) m->grads_ready(m->grads_ready_ctx, lo);
}

/* begin_unit for unit u when it has trainable rows. */
static void begin(glm_model *m, int u) {
    size_t lo = unit_lo(m, u);
    if (lo != SIZE_MAX) begin_unit(m, lo);
}

/* Layer l's input gradient is wanted: by the layer below, the embedding or the previous stage,
 * or by the layer's own input norm when it trains. */
static int wants_input_grad(const glm_model *m, int l, int floor) {
    return l > floor || !m->first || glm_table_get(&m->tab, -1, T_WORD_EMB) || glm_table_get(&m->tab, l, T_LN1_W) ||
           glm_table_get(&m->tab, l, T_LN1_B);
}

static double stage_backward(glm_model *m, const glm_batch *b, const void *h_in, const void *dh_out, void *dh_in,
                             float dscale, glm_token_weigh weigh, void *weigh_ctx);

double glm_stage_backward(glm_model *m, const glm_batch *b, const void *h_in, const void *dh_out, void *dh_in,
                          float dscale) {
    return stage_backward(m, b, h_in, dh_out, dh_in, dscale, NULL, NULL);
}

double glm_forward_backward_weighted(glm_model *m, const glm_batch *b, float dscale, glm_token_weigh weigh, void *ctx) {
    GLM_ASSERT(m->first && m->last && weigh);
    return stage_backward(m, b, NULL, NULL, NULL, dscale, weigh, ctx);
}

/* The weighed loss's first head pass: every token's loss, then the caller's weights, uploaded
 * into tok_w. With dlnf (a head that does not train, whose gradient is only its input's) the same
 * pass also makes that gradient: each token's row of it depends on the token's logits alone, so it
 * is made with unit weights beside the losses and each row then scaled by its weight (the compact
 * top rows, one a token), and the head's product runs once instead of twice. */
static double weigh_tokens(glm_model *m, const glm_batch *b, float dscale, void *dlnf, glm_token_weigh weigh,
                           void *ctx) {
    int n = m->bd.n_sup;
    float *loss = glm_malloc(sizeof(float) * (n ? n : 1)), *w = glm_malloc(sizeof(float) * (n ? n : 1));
    head_loss(m, dlnf ? dscale : 0.0f, dlnf, NULL, loss);
    double total = weigh(ctx, b, loss, n, w);
    if (n) {
        m->be->upload(m->be, m->tok_w, w, sizeof(float) * n);
        if (dlnf) m->be->scale_rows(m->be, dlnf, m->tok_w, n, m->cfg.hidden_size);
    }
    free(loss);
    free(w);
    return total;
}

static double stage_backward(glm_model *m, const glm_batch *b, const void *h_in, const void *dh_out, void *dh_in,
                             float dscale, glm_token_weigh weigh, void *weigh_ctx) {
    forward_to_head(m, b, h_in, 1);
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int N = b->B * b->T, H = c->hidden_size;
    size_t bytes = (size_t)N * H * glm_dtype_size(be->dtype);
    double loss = 0;
    if (c->peft.pre_seq_len > 0) glm_prefix_backward_begin(m); /* where the layers add their prefix gradients */
    if (m->last) { /* loss, then LNf backward: d(h_hi) into d_b */
        void *dlnf = m->d_a;
        int L = c->num_layers;
        begin(m, L);
        /* the head writes into the tied embedding's gradient: its unit opens now when it trains */
        if (c->tie_word_embeddings && glm_table_get(&m->tab, -1, T_WORD_EMB)) begin(m, -1);
        if (weigh) {
            /* once for a frozen head's compact rows; not in fp16, where the unweighted rows (the
             * loss scale in them, not yet the weights' smaller factors) could overflow what the
             * weighed ones would not: there the head runs again with the weights */
            int once = !m->g.head && m->top_rows && !c->value_head && be->dtype != GLM_F16;
            loss = weigh_tokens(m, b, dscale, once ? dlnf : NULL, weigh, weigh_ctx);
            if (!once) head_loss(m, dscale, dlnf, m->tok_w, NULL);
        } else {
            loss = head_loss(m, dscale, dlnf, NULL, NULL);
        }
        need(m, L);
        m->fam->final_norm_bwd(m, m->d_b, dlnf, resid(m, m->layer_hi), m->lnf_mean, m->lnf_rstd, out_rows(m));
        /* the table orders wte, layers, LNf, (lm_head): gradients become final from the back */
        grads_final_from(m, L);
    } else {
        be->copy(be, m->d_b, dh_out, bytes);
    }
    void *dcur = m->d_b, *dnext = m->d_a;
    int floor = m->act_floor; /* backward_floor(m), as ensure_acts found it */
    for (int l = m->layer_hi - 1; l >= floor; l--) {
        glm_layer_acts *a = acts_for(m, l);
        need(m, l);
        /* recompute, except the top layer: its forward ran last, so what it wrote is all there */
        int top = l == m->layer_hi - 1;
        if (m->gradient_checkpointing == GLM_CKPT_FULL && !top) layer_forward(m, l, a, resid(m, l), resid(m, l + 1));
        if (m->gradient_checkpointing == GLM_CKPT_SELECTIVE && !top) layer_recompute(m, l, a, resid(m, l));
        begin(m, l);
        layer_backward(m, l, a, dcur, wants_input_grad(m, l, floor) ? dnext : NULL);
        void *t = dcur; dcur = dnext; dnext = t;
        grads_final_from(m, l);
    }
    if (m->first) {
        begin(m, -1);
        if (m->g.wte) be->embedding_bwd(be, m->g.wte, dcur, m->bd.ids, N, H, c->vocab_size);
    } else {
        be->copy(be, dh_in, dcur, bytes);
    }
    if (c->peft.pre_seq_len > 0) {
        need(m, -1);
        glm_prefix_backward(m); /* every stage holds the prefix encoder for its layers */
    }
    grads_final_from(m, -1);
    return loss;
}
