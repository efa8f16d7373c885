/* GLM v1 (ChatGLM-6B), spec section 3, as a model family (model/family.h). Per layer:
 *   x = LN1(h); h1 = alpha*x + Dense(Attn(RoPE2D(QKV(x))));  y = LN2(h1); h' = alpha*y + FC2(gelu(FC1(y)))
 * q|k|v interleaved per head [NH, 3, HD]; the data layer's prefix-LM rule and 2D positions as
 * they come (data/batch.h). */
#include <math.h>
#include <string.h>
#include "model/family.h"
#include "model/glm.h"
#include "model/peft.h"

/* Views of q, k, v inside [.., NH, 3, HD] rows. */
static void qkv_views(const glm_model *m, void *qkv, long batch_stride, glm_qkv_view *q, glm_qkv_view *k,
                      glm_qkv_view *v) {
    int H = m->cfg.hidden_size, HD = glm_head_dim(&m->cfg);
    glm_qkv_view base = {qkv, batch_stride, 3L * H, 3L * HD, 1};
    *q = base;
    *k = base; k->base = glm_at(m->be, qkv, HD);
    *v = base; v->base = glm_at(m->be, qkv, 2 * HD);
}

static void block_qkv(glm_model *m, int l, glm_layer_acts *a, const void *h_in, int N, const int32_t *pos,
                      const int32_t *block_pos) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int H = c->hidden_size;
    be->layernorm_fwd(be, a->x, a->ln1_mean, a->ln1_rstd, h_in, p->ln1_w, p->ln1_b, N, H, c->layernorm_epsilon);
    glm_linear_fwd(m, l, 0, a, a->qkv, a->x, p->qkv_w, p->qkv_b, N, H, 3 * H);
    be->rope(be, a->qkv, pos, block_pos, N, c->num_attention_heads, glm_head_dim(c), 0);
}

static void norm2(glm_model *m, int l, glm_layer_acts *a, int N) {
    const glm_layer_ptrs *p = &m->w.layer[l];
    m->be->layernorm_fwd(m->be, a->y, a->ln2_mean, a->ln2_rstd, a->h1, p->ln2_w, p->ln2_b, N, m->cfg.hidden_size,
                         m->cfg.layernorm_epsilon);
}

/* After attention, on N rows: h1 = alpha*x + Dense(ctx), y = LN2(h1), h_out = alpha*y + MLP(y). */
static void block_rows(glm_model *m, int l, glm_layer_acts *a, int N, void *h_out) {
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    glm_linear_fwd_add(m, l, 1, a, a->h1, a->ctx, p->dense_w, p->dense_b, N, H, H, a->x, c->alpha); /* alpha x + attn */
    norm2(m, l, a, N);
    if (m->gradient_checkpointing == GLM_CKPT_SELECTIVE && glm_linear_reads_input(m, l, 3)) {
        /* backward rebuilds act from fc1 with gelu_fwd: the forward makes it the same way (an
         * epilogue's GELU of the unrounded sums would differ from it in the last bits) */
        glm_linear_fwd(m, l, 2, a, a->fc1, a->y, p->fc1_w, p->fc1_b, N, H, F);
        m->be->gelu_fwd(m->be, a->act, a->fc1, (size_t)N * F);
    } else {
        glm_linear_fwd_gelu(m, l, 2, a, a->act, a->fc1, a->y, p->fc1_w, p->fc1_b, N, H, F);
    }
    glm_linear_fwd_add(m, l, 3, a, h_out, a->act, p->fc2_w, p->fc2_b, N, F, H, a->y, c->alpha); /* alpha y + mlp */
}

static void block_recompute(glm_model *m, int l, glm_layer_acts *a, const void *h_in, glm_qkv_view q, glm_qkv_view k,
                            glm_qkv_view v, const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk) {
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int N = B * Tq, H = c->hidden_size;
    /* only what backward reads: the norms' outputs and the activation are the inputs of products
     * whose weights or adapters train; attention's output is read by its own backward */
    if (glm_linear_reads_input(m, l, 0))
        m->be->layernorm_fwd(m->be, a->x, a->ln1_mean, a->ln1_rstd, h_in, p->ln1_w, p->ln1_b, N, H, c->layernorm_epsilon);
    glm_attend(m, a, q, k, v, kv_lo, kv_hi, B, Tq, Tk);
    if (glm_linear_reads_input(m, l, 2)) norm2(m, l, a, N);
    if (glm_linear_reads_input(m, l, 3)) m->be->gelu_fwd(m->be, a->act, a->fc1, (size_t)N * c->inner_hidden_size);
}

/* The backward of block_rows on N rows: from dh_out, the attention output's gradient into
 * m->d_ctx and h1's into m->d_h1. */
static void block_rows_bwd(glm_model *m, int l, glm_layer_acts *a, const void *dh_out, int N) {
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int H = c->hidden_size, F = c->inner_hidden_size;
    /* h' = alpha*y + FC2(gelu(FC1(y))) */
    glm_linear_bwd_dgelu(m, l, 3, a, m->d_ff, g->fc2_w, g->fc2_b, dh_out, a->act, p->fc2_w, a->fc1, N, F, H);
    void *dy = m->d_x; /* reused: dy is dead before dx is needed */
    glm_linear_bwd_add(m, l, 2, a, dy, g->fc1_w, g->fc1_b, m->d_ff, a->y, p->fc1_w, N, H, F, dh_out, c->alpha);
    /* y = LN2(h1) */
    m->be->layernorm_bwd(m->be, m->d_h1, g->ln2_w, g->ln2_b, dy, a->h1, p->ln2_w, a->ln2_mean, a->ln2_rstd, N, H);
    /* h1 = alpha*x + Dense(ctx) */
    glm_linear_bwd(m, l, 1, a, m->d_ctx, g->dense_w, g->dense_b, m->d_h1, a->ctx, p->dense_w, N, H, H);
}

/* The rest of the backward on the model's batch (m->bd), from m->d_ctx and m->d_h1: attention,
 * rotary, QKV and LN1; writes dh_in (the gradient w.r.t. the layer's input) unless NULL. */
static void block_attn_bwd(glm_model *m, int l, glm_layer_acts *a, const void *h_in, void *dh_in) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int B = m->bd.B, T = m->bd.T, N = B * T, H = c->hidden_size;
    int NH = c->num_attention_heads, HD = glm_head_dim(c);
    glm_qkv_view q, k, v, dq, dk, dv;
    qkv_views(m, a->qkv, (long)T * 3 * H, &q, &k, &v);
    qkv_views(m, m->d_qkv, (long)T * 3 * H, &dq, &dk, &dv);
    int P = c->peft.pre_seq_len;
    if (P > 0) { /* keys/values rebuilt with the same dropout; their gradient via dkvbuf */
        glm_prefix_kv_views(m, l, a, &k, &v);
        dk = (glm_qkv_view){m->dkvbuf, k.batch_stride, k.tok_stride, k.head_stride, 1};
        dv = dk;
        dv.base = glm_at(be, m->dkvbuf, HD);
        be->attention_bwd(be, dq, dk, dv, m->d_ctx, a->ctx, a->lse, q, k, v, m->pkv_lo, m->pkv_hi, B, T, P + T, NH, HD,
                          1.0f / sqrtf((float)HD));
        glm_prefix_kv_grads(m, l);
    } else {
        be->attention_bwd(be, dq, dk, dv, m->d_ctx, a->ctx, a->lse, q, k, v, m->bd.kv_lo, m->bd.kv_hi, B, T, T, NH, HD,
                          1.0f / sqrtf((float)HD));
    }
    be->rope(be, m->d_qkv, m->bd.pos, m->bd.block_pos, N, NH, HD, 1);
    if (!dh_in) { /* the lowest layer that trains, over a frozen embedding */
        glm_linear_bwd(m, l, 0, a, NULL, g->qkv_w, g->qkv_b, m->d_qkv, a->x, p->qkv_w, N, H, 3 * H);
        return;
    }
    void *dx = m->d_x;
    glm_linear_bwd_add(m, l, 0, a, dx, g->qkv_w, g->qkv_b, m->d_qkv, a->x, p->qkv_w, N, H, 3 * H, m->d_h1, c->alpha);
    /* x = LN1(h_in): the residual branches leave from x, so h_in's gradient comes only through LN1 */
    be->layernorm_bwd(be, dh_in, g->ln1_w, g->ln1_b, dx, h_in, p->ln1_w, a->ln1_mean, a->ln1_rstd, N, H);
}


static void final_norm(glm_model *m, void *out, float *mean, float *rstd, const void *x, int N) {
    m->be->layernorm_fwd(m->be, out, mean, rstd, x, m->w.lnf_w, m->w.lnf_b, N, m->cfg.hidden_size,
                         m->cfg.layernorm_epsilon);
}

static void final_norm_bwd(glm_model *m, void *dx, const void *dout, const void *x, const float *mean, const float *rstd,
                           int N) {
    m->be->layernorm_bwd(m->be, dx, m->g.lnf_w, m->g.lnf_b, dout, x, m->w.lnf_w, mean, rstd, N, m->cfg.hidden_size);
}

/* The data layer already applied v1's rule (data/batch.h). */
static void batch_rule(const glm_batch *b, int32_t *pos, int32_t *block_pos, int32_t *kv_lo, int32_t *kv_hi) {
    size_t bytes = (size_t)b->B * b->T * sizeof(int32_t);
    memcpy(pos, b->pos, bytes);
    memcpy(block_pos, b->block_pos, bytes);
    memcpy(kv_lo, b->kv_lo, bytes);
    memcpy(kv_hi, b->kv_hi, bytes);
}

/* The prompt ends in [gMASK] <sop> (spec 5.2): the context up to <sop> sees itself whole,
 * positions freeze at the mask while block positions count the answer. */
static int prompt_positions(const glm_config *c, const int32_t *ids, int n, int32_t *pos, int32_t *bpos, int32_t *hi,
                            int state[2]) {
    int ctx = -1, mask = -1;
    for (int i = 0; i < n && ctx < 0; i++) if (ids[i] == c->bos_token_id) ctx = i;
    for (int i = 0; i < n && mask < 0; i++) if (ids[i] == c->gmask_token_id) mask = i;
    for (int i = 0; i < n && mask < 0; i++) if (ids[i] == c->mask_token_id) mask = i;
    if (ctx < 0 || mask < 0) return -1;
    for (int i = 0; i < n; i++) {
        pos[i] = i < ctx ? i : mask;
        bpos[i] = i < ctx ? 0 : i - ctx + 1;
        hi[i] = ctx > i + 1 ? ctx : i + 1;
    }
    state[0] = ctx;
    state[1] = mask;
    return 0;
}

static void next_position(const int state[2], int t, int32_t *pos, int32_t *bpos) {
    *pos = state[1];
    *bpos = t - state[0] + 1;
}

const glm_family glm_family_glm = {
    .name = "chatglm",
    .embed = GLM_V1_EMBED,
    .final_norm_w = GLM_V1_FINAL_NORM_W,
    .final_norm_b = GLM_V1_FINAL_NORM_B,
    .head = GLM_V1_HEAD,
    .layer_fmt = "transformer.layers.%d.",
    .layer_row = {
        [T_LN1_W - T_LN1_W] = "input_layernorm.weight", [T_LN1_B - T_LN1_W] = "input_layernorm.bias",
        [T_QKV_W - T_LN1_W] = "attention.query_key_value.weight", [T_QKV_B - T_LN1_W] = "attention.query_key_value.bias",
        [T_DENSE_W - T_LN1_W] = "attention.dense.weight", [T_DENSE_B - T_LN1_W] = "attention.dense.bias",
        [T_LN2_W - T_LN1_W] = "post_attention_layernorm.weight", [T_LN2_B - T_LN1_W] = "post_attention_layernorm.bias",
        [T_FC1_W - T_LN1_W] = "mlp.dense_h_to_4h.weight", [T_FC1_B - T_LN1_W] = "mlp.dense_h_to_4h.bias",
        [T_FC2_W - T_LN1_W] = "mlp.dense_4h_to_h.weight", [T_FC2_B - T_LN1_W] = "mlp.dense_4h_to_h.bias",
    },
    .modules = {"attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"},
    .residual_from_norm = 1,
    .block_qkv = block_qkv, .block_rows = block_rows, .block_recompute = block_recompute,
    .block_rows_bwd = block_rows_bwd, .block_attn_bwd = block_attn_bwd, .qkv_views = qkv_views,
    .final_norm = final_norm, .final_norm_bwd = final_norm_bwd, .batch_rule = batch_rule,
    .prompt_positions = prompt_positions, .next_position = next_position,
};
