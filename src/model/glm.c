#include "model/glm_internal.h"
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
size_t glm_unit_lo(const glm_model *m, int u) {
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
void glm_need(glm_model *m, int u) {
    size_t lo = m->params_need ? glm_unit_lo(m, u) : SIZE_MAX;
    if (lo != SIZE_MAX) m->params_need(m->params_ctx, lo, unit_end(m, lo));
}
/* The unit holding the head's weight: the embedding's when tied. */
int glm_head_unit(const glm_model *m) { return m->cfg.tie_word_embeddings ? -1 : m->cfg.num_layers; }

/* Before backward writes the gradients of the unit starting at flat offset lo: the grads_unit
 * hook may send them elsewhere (ZeRO-2 staging); the unit's gradient views follow. */
void glm_begin_unit(glm_model *m, size_t lo) {
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
int glm_backward_floor(const glm_model *m) {
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
int glm_act_sets(const glm_model *m) {
    int nk = m->layer_hi - m->act_floor;
    if (m->gradient_checkpointing == GLM_CKPT_FULL) return 1;
    return (m->gradient_checkpointing == GLM_CKPT_SELECTIVE ? nk + (nk > 0) : nk) + below_floor(m);
}

static void free_acts(glm_model *m) {
    glm_backend *be = m->be;
    if (!m->acts) return;
    int nsets = glm_act_sets(m), nk = m->layer_hi - m->act_floor;
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
void glm_ensure_acts(glm_model *m, int B, int T) {
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
    m->act_floor = glm_backward_floor(m);
    int nl = m->layer_hi - m->layer_lo, nk = m->layer_hi - m->act_floor, nsets = glm_act_sets(m);
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
void glm_upload_batch(glm_model *m, const glm_batch *b) {
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
