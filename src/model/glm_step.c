/* The model's step (model/glm.h): the forward through the stage's layers, the head and its loss
 * (or a reward model's value head), and the backward with its checkpointing, over the buffers
 * and units that glm.c sets up (model/glm_internal.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "model/glm_internal.h"
#include "model/peft.h"
#include "backend/mask_hash.h"

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
    return l < m->act_floor ? &m->acts[glm_act_sets(m) - 1] : &m->acts[l - m->act_floor];
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
    if (m->first || c->peft.pre_seq_len > 0) glm_need(m, -1);
    if (m->first) be->embedding_fwd(be, resid(m, m->layer_lo), m->bd.ids, m->w.wte, N, H);
    else be->copy(be, resid(m, m->layer_lo), h_in, bytes);
    if (m->first && m->training && c->neftune_alpha > 0) /* additive: the embedding's gradient is unchanged */
        be->noise_add(be, resid(m, m->layer_lo), (size_t)N * H, glm_neftune_mag(c->neftune_alpha, m->bd.T, H),
                      glm_neftune_seed(m->dropout_seed));
    if (c->peft.pre_seq_len > 0) glm_prefix_forward(m); /* every stage runs the encoder for its own layers */
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        glm_need(m, l);
        layer_forward(m, l, acts_for(m, l), resid(m, l), resid(m, l + 1));
    }
    if (m->last) {
        glm_need(m, c->num_layers);
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
    glm_need(m, glm_head_unit(m));
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
    glm_need(m, m->cfg.num_layers);
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
    glm_ensure_acts(m, b->B, b->T);
    glm_upload_batch(m, b);
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
    glm_need(m, glm_head_unit(m));
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
    glm_ensure_acts(m, b->B, b->T);
    glm_upload_batch(m, b);
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
    size_t lo = u < 0 ? 0 : glm_unit_lo(m, u);
    if (m->grads_ready && lo != SIZE_MAX) m->grads_ready(m->grads_ready_ctx, lo);
}

/* begin_unit for unit u when it has trainable rows. */
static void begin(glm_model *m, int u) {
    size_t lo = glm_unit_lo(m, u);
    if (lo != SIZE_MAX) glm_begin_unit(m, lo);
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
        glm_need(m, L);
        m->fam->final_norm_bwd(m, m->d_b, dlnf, resid(m, m->layer_hi), m->lnf_mean, m->lnf_rstd, out_rows(m));
        /* the table orders wte, layers, LNf, (lm_head): gradients become final from the back */
        grads_final_from(m, L);
    } else {
        be->copy(be, m->d_b, dh_out, bytes);
    }
    void *dcur = m->d_b, *dnext = m->d_a;
    int floor = m->act_floor; /* glm_backward_floor(m), as ensure_acts found it */
    for (int l = m->layer_hi - 1; l >= floor; l--) {
        glm_layer_acts *a = acts_for(m, l);
        glm_need(m, l);
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
        glm_need(m, -1);
        glm_prefix_backward(m); /* every stage holds the prefix encoder for its layers */
    }
    grads_final_from(m, -1);
    return loss;
}
