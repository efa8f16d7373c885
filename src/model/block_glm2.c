/* The ChatGLM2 block (ChatGLM2-6B, ChatGLM3-6B, GLM-4-9B; spec section 11) as a model family
 * (model/family.h). Per layer, pre-norm residuals without scaling:
 *   x = RMSNorm1(h); h1 = h + Dense(Attn(RoPE(QKV(x))));  y = RMSNorm2(h1); h' = h1 + FC2(SwiGLU(FC1(y)))
 * QKV's output is q (NH heads) | k (NKV heads) | v (NKV heads), each head HD = kv_channels wide;
 * query head h reads key/value head h / (NH / NKV). Rotary turns the first HD/2 dims of every q
 * and k head in interleaved pairs at position ids 0, 1, ... of each sequence; the mask is causal.
 * GLM-4-0414 (glm_family_glm4, config.h sandwich_norms) is the same block with two more norms:
 *   h1 = h + RMSNorm3(Dense(Attn(...)));  h' = h1 + RMSNorm4(FC2(SwiGLU(FC1(RMSNorm2(h1))))) */
#include <math.h>
#include "model/family.h"
#include "model/glm.h"
#include "model/peft.h"

static void qkv_views(const glm_model *m, void *qkv, long batch_stride, glm_qkv_view *q, glm_qkv_view *k,
                      glm_qkv_view *v) {
    const glm_config *c = &m->cfg;
    int NH = c->num_attention_heads, NKV = glm_kv_heads(c), HD = glm_head_dim(c), W = glm_qkv_width(c);
    *q = (glm_qkv_view){qkv, batch_stride, W, HD, 1};
    *k = (glm_qkv_view){glm_at(m->be, qkv, (size_t)NH * HD), batch_stride, W, HD, NH / NKV};
    *v = (glm_qkv_view){glm_at(m->be, qkv, (size_t)(NH + NKV) * HD), batch_stride, W, HD, NH / NKV};
}

/* Rotary on the q heads and the k heads of N rows of qkv (inverse: the backward): the k heads
 * follow the q heads in each row, so one call turns all NH + NKV of them. */
static void rope(glm_model *m, void *qkv, int N, const int32_t *pos, int inverse) {
    const glm_config *c = &m->cfg;
    int HD = glm_head_dim(c), W = glm_qkv_width(c);
    m->be->rope_pairs(m->be, qkv, W, N, c->num_attention_heads + glm_kv_heads(c), HD, HD / 2, pos, c->rope_theta, inverse);
}

static void block_qkv(glm_model *m, int l, glm_layer_acts *a, const void *h_in, int N, const int32_t *pos,
                      const int32_t *block_pos) {
    (void)block_pos;
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int H = c->hidden_size;
    a->in = h_in; /* the residual leaves from the block's input */
    be->rmsnorm_fwd(be, a->x, a->ln1_rstd, h_in, p->ln1_w, N, H, c->layernorm_epsilon);
    glm_linear_fwd(m, l, 0, a, a->qkv, a->x, p->qkv_w, p->qkv_b, N, H, glm_qkv_width(c));
    rope(m, a->qkv, N, pos, 0);
}

static void norm2(glm_model *m, int l, glm_layer_acts *a, int N) {
    m->be->rmsnorm_fwd(m->be, a->y, a->ln2_rstd, a->h1, m->w.layer[l].ln2_w, N, m->cfg.hidden_size, m->cfg.layernorm_epsilon);
}

/* After attention, on N rows: h1 = in + Dense(ctx), y = RMSNorm2(h1), h_out = h1 + MLP(y). */
static void block_rows(glm_model *m, int l, glm_layer_acts *a, int N, void *h_out) {
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    glm_linear_fwd_add(m, l, 1, a, a->h1, a->ctx, p->dense_w, NULL, N, glm_attn_width(c), H, a->in, 1.0f); /* in + attn */
    norm2(m, l, a, N);
    glm_linear_fwd(m, l, 2, a, a->fc1, a->y, p->fc1_w, NULL, N, H, 2 * F);
    m->be->swiglu_fwd(m->be, a->act, a->fc1, N, F);
    glm_linear_fwd_add(m, l, 3, a, h_out, a->act, p->fc2_w, NULL, N, F, H, a->h1, 1.0f); /* h1 + mlp */
}

/* GLM-4-0414's: z1 = Dense(ctx), h1 = in + RMSNorm3(z1), y = RMSNorm2(h1), z2 = MLP(y),
 * h_out = h1 + RMSNorm4(z2); z1, z2 and the norms' statistics kept for the backward. */
static void block_rows_sandwich(glm_model *m, int l, glm_layer_acts *a, int N, void *h_out) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    float eps = c->layernorm_epsilon;
    glm_linear_fwd(m, l, 1, a, a->z1, a->ctx, p->dense_w, NULL, N, glm_attn_width(c), H);
    be->rmsnorm_fwd(be, a->h1, a->ln3_rstd, a->z1, p->ln3_w, N, H, eps);
    be->scale_add(be, a->h1, 1.0f, a->in, a->h1, (size_t)N * H);
    norm2(m, l, a, N);
    glm_linear_fwd(m, l, 2, a, a->fc1, a->y, p->fc1_w, NULL, N, H, 2 * F);
    be->swiglu_fwd(be, a->act, a->fc1, N, F);
    glm_linear_fwd(m, l, 3, a, a->z2, a->act, p->fc2_w, NULL, N, F, H);
    be->rmsnorm_fwd(be, h_out, a->ln4_rstd, a->z2, p->ln4_w, N, H, eps);
    be->scale_add(be, h_out, 1.0f, a->h1, h_out, (size_t)N * H);
}

static void block_recompute(glm_model *m, int l, glm_layer_acts *a, const void *h_in, glm_qkv_view q, glm_qkv_view k,
                            glm_qkv_view v, const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk) {
    const glm_config *c = &m->cfg;
    int N = B * Tq;
    /* only what backward reads (as v1's block_recompute) */
    if (glm_linear_reads_input(m, l, 0))
        m->be->rmsnorm_fwd(m->be, a->x, a->ln1_rstd, h_in, m->w.layer[l].ln1_w, N, c->hidden_size, c->layernorm_epsilon);
    glm_attend(m, a, q, k, v, kv_lo, kv_hi, B, Tq, Tk);
    if (glm_linear_reads_input(m, l, 2)) norm2(m, l, a, N);
    if (glm_linear_reads_input(m, l, 3)) m->be->swiglu_fwd(m->be, a->act, a->fc1, N, c->inner_hidden_size);
}

/* dx = RMSNorm's input gradient + res (the residual branch's): one pass where the backend fuses it */
static void norm_bwd_add(glm_model *m, void *dx, void *dw, const void *dout, const void *x, const void *w, const float *rstd,
                         const void *res, int N) {
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size;
    if (be->rmsnorm_bwd_add) {
        be->rmsnorm_bwd_add(be, dx, dw, dout, x, w, rstd, res, N, H);
        return;
    }
    be->rmsnorm_bwd(be, dx, dw, dout, x, w, rstd, N, H);
    be->scale_add(be, dx, 1.0f, res, dx, (size_t)N * H);
}

/* The backward of block_rows on N rows: from dh_out, the attention output's gradient into
 * m->d_ctx and h1's into m->d_h1. */
static void block_rows_bwd(glm_model *m, int l, glm_layer_acts *a, const void *dh_out, int N) {
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    /* h' = h1 + FC2(SwiGLU(FC1(y))) */
    glm_linear_bwd(m, l, 3, a, m->d_act, g->fc2_w, NULL, dh_out, a->act, p->fc2_w, N, F, H);
    m->be->swiglu_bwd(m->be, m->d_ff, a->fc1, m->d_act, N, F);
    void *dy = m->d_x; /* dead before dx is needed */
    glm_linear_bwd(m, l, 2, a, dy, g->fc1_w, NULL, m->d_ff, a->y, p->fc1_w, N, H, 2 * F);
    /* y = RMSNorm2(h1); h1 also feeds h' directly */
    norm_bwd_add(m, m->d_h1, g->ln2_w, dy, a->h1, p->ln2_w, a->ln2_rstd, dh_out, N);
    /* h1 = h_in + Dense(ctx) */
    glm_linear_bwd(m, l, 1, a, m->d_ctx, g->dense_w, NULL, m->d_h1, a->ctx, p->dense_w, N, glm_attn_width(c), H);
}

/* GLM-4-0414's block_rows backward; m->d_x holds each norm's input gradient in turn. */
static void block_rows_bwd_sandwich(glm_model *m, int l, glm_layer_acts *a, const void *dh_out, int N) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    void *dz = m->d_x;
    /* h' = h1 + RMSNorm4(z2), z2 = FC2(SwiGLU(FC1(y))) */
    be->rmsnorm_bwd(be, dz, g->ln4_w, dh_out, a->z2, p->ln4_w, a->ln4_rstd, N, H);
    glm_linear_bwd(m, l, 3, a, m->d_act, g->fc2_w, NULL, dz, a->act, p->fc2_w, N, F, H);
    be->swiglu_bwd(be, m->d_ff, a->fc1, m->d_act, N, F);
    void *dy = m->d_x; /* dz is read: free again */
    glm_linear_bwd(m, l, 2, a, dy, g->fc1_w, NULL, m->d_ff, a->y, p->fc1_w, N, H, 2 * F);
    norm_bwd_add(m, m->d_h1, g->ln2_w, dy, a->h1, p->ln2_w, a->ln2_rstd, dh_out, N);
    /* h1 = h_in + RMSNorm3(z1), z1 = Dense(ctx) */
    be->rmsnorm_bwd(be, dz, g->ln3_w, m->d_h1, a->z1, p->ln3_w, a->ln3_rstd, N, H);
    glm_linear_bwd(m, l, 1, a, m->d_ctx, g->dense_w, NULL, dz, a->ctx, p->dense_w, N, glm_attn_width(c), H);
}

/* The rest of the backward on the model's batch (m->bd), from m->d_ctx and m->d_h1: attention,
 * rotary, QKV and RMSNorm1; writes dh_in unless NULL. */
static void block_attn_bwd(glm_model *m, int l, glm_layer_acts *a, const void *h_in, void *dh_in) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int B = m->bd.B, T = m->bd.T, N = B * T, H = c->hidden_size;
    int NH = c->num_attention_heads, HD = glm_head_dim(c), W = glm_qkv_width(c);
    glm_qkv_view q, k, v, dq, dk, dv;
    qkv_views(m, a->qkv, (long)T * W, &q, &k, &v);
    qkv_views(m, m->d_qkv, (long)T * W, &dq, &dk, &dv);
    int P = c->peft.pre_seq_len;
    if (P > 0) { /* keys/values rebuilt with the same dropout; their gradient via dkvbuf */
        glm_prefix_kv_views(m, l, a, &k, &v);
        dk = k;
        dk.base = m->dkvbuf;
        dv = dk;
        dv.base = glm_at(be, m->dkvbuf, (size_t)glm_kv_heads(c) * HD);
        be->attention_bwd(be, dq, dk, dv, m->d_ctx, a->ctx, a->lse, q, k, v, m->pkv_lo, m->pkv_hi, B, T, P + T, NH, HD,
                          1.0f / sqrtf((float)HD));
        glm_prefix_kv_grads(m, l); /* the sequence's k|v gradient into d_qkv, the prefix's summed over rows */
    } else {
        be->attention_bwd(be, dq, dk, dv, m->d_ctx, a->ctx, a->lse, q, k, v, m->bd.kv_lo, m->bd.kv_hi, B, T, T, NH, HD,
                          1.0f / sqrtf((float)HD));
    }
    rope(m, m->d_qkv, N, m->bd.pos, 1);
    void *dx = dh_in ? m->d_x : NULL; /* none for the lowest layer that trains, over a frozen embedding */
    glm_linear_bwd(m, l, 0, a, dx, g->qkv_w, g->qkv_b, m->d_qkv, a->x, p->qkv_w, N, H, W);
    if (!dh_in) return;
    /* x = RMSNorm1(h_in); h_in also feeds h1 directly */
    norm_bwd_add(m, dh_in, g->ln1_w, dx, h_in, p->ln1_w, a->ln1_rstd, m->d_h1, N);
}

static void final_norm(glm_model *m, void *out, float *mean, float *rstd, const void *x, int N) {
    (void)mean;
    m->be->rmsnorm_fwd(m->be, out, rstd, x, m->w.lnf_w, N, m->cfg.hidden_size, m->cfg.layernorm_epsilon);
}

static void final_norm_bwd(glm_model *m, void *dx, const void *dout, const void *x, const float *mean, const float *rstd,
                           int N) {
    (void)mean;
    m->be->rmsnorm_bwd(m->be, dx, m->g.lnf_w, dout, x, m->w.lnf_w, rstd, N, m->cfg.hidden_size);
}

/* Causal within each segment (an example, or the padding after the last one), positions
 * counting from the segment's start: what ChatGLM2's position_ids = arange and its causal mask
 * give an example alone in its row. */
static void batch_rule(const glm_batch *b, int32_t *pos, int32_t *block_pos, int32_t *kv_lo, int32_t *kv_hi) {
    for (int r = 0; r < b->B; r++)
        for (int i = 0; i < b->T; i++) {
            size_t k = (size_t)r * b->T + i;
            int start = b->kv_lo[k];
            pos[k] = i - start;
            block_pos[k] = 0;
            kv_lo[k] = start;
            kv_hi[k] = i + 1;
        }
}

/* Causal, positions 0, 1, ... from the row's first real token (what THUDM's left-padding
 * tokenizer gives); any prompt will do. */
static int prompt_positions(const glm_config *c, const int32_t *ids, int n, int32_t *pos, int32_t *bpos, int32_t *hi,
                            int state[2]) {
    (void)c; (void)ids;
    for (int i = 0; i < n; i++) { pos[i] = i; bpos[i] = 0; hi[i] = i + 1; }
    state[0] = state[1] = 0;
    return 0;
}

static void next_position(const int state[2], int t, int32_t *pos, int32_t *bpos) {
    (void)state;
    *pos = t;
    *bpos = 0;
}

/* What the ChatGLM2 block's families share: names, the block's functions but the rows after
 * attention, and the positions rule. */
#define CHATGLM2_BLOCK_ROWS                                                   \
    [T_LN1_W - T_LN1_W] = "input_layernorm.weight",                           \
    [T_QKV_W - T_LN1_W] = "self_attention.query_key_value.weight",           \
    [T_QKV_B - T_LN1_W] = "self_attention.query_key_value.bias",             \
    [T_DENSE_W - T_LN1_W] = "self_attention.dense.weight",                   \
    [T_LN2_W - T_LN1_W] = "post_attention_layernorm.weight",                 \
    [T_FC1_W - T_LN1_W] = "mlp.dense_h_to_4h.weight",                        \
    [T_FC2_W - T_LN1_W] = "mlp.dense_4h_to_h.weight"
#define CHATGLM2_BLOCK_SHARED                                                                                       \
    .embed = GLM_V2_EMBED, .final_norm_w = GLM_V2_FINAL_NORM_W, .final_norm_b = NULL, .head = GLM_V2_HEAD,          \
    .layer_fmt = "transformer.encoder.layers.%d.",                                                                  \
    .modules = {"self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"}, \
    .residual_from_norm = 0, .causal = 1, .block_qkv = block_qkv, .block_recompute = block_recompute,                           \
    .block_attn_bwd = block_attn_bwd, .qkv_views = qkv_views, .final_norm = final_norm,                            \
    .final_norm_bwd = final_norm_bwd, .batch_rule = batch_rule, .prompt_positions = prompt_positions,              \
    .next_position = next_position

const glm_family glm_family_glm2 = {
    .name = "chatglm2",
    .layer_row = {CHATGLM2_BLOCK_ROWS},
    .block_rows = block_rows, .block_rows_bwd = block_rows_bwd,
    CHATGLM2_BLOCK_SHARED,
};

/* GLM-4-0414: the same block with its two more norms (transformers' names, as its folders are the
 * only ones; model/hf_layout.h keeps them) */
const glm_family glm_family_glm4 = {
    .name = "glm4",
    .layer_row = {CHATGLM2_BLOCK_ROWS,
                  [12] = "post_self_attn_layernorm.weight", [13] = "post_mlp_layernorm.weight"}, /* glm_layer_place */
    .block_rows = block_rows_sandwich, .block_rows_bwd = block_rows_bwd_sandwich,
    CHATGLM2_BLOCK_SHARED,
};
