/* Incremental decoding with a KV cache. The cache keeps each layer's rotated q|k|v rows
 * [B, Tmax, 3H] (q included: one contiguous copy per row serves, at 1.5x the bytes of K and V
 * alone); the attention op then reads keys and values straight from it through views. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/glm.h"

void glm_kvcache_init(glm_model *m, glm_kvcache *kv, int B, int Tmax) {
    glm_backend *be = m->be;
    int L = m->cfg.num_layers, H = m->cfg.hidden_size;
    *kv = (glm_kvcache){.B = B, .Tmax = Tmax, .len = 0};
    kv->qkv = glm_calloc(L, sizeof(void *));
    /* a pipeline stage caches only its own layers (NULL elsewhere) */
    for (int l = m->layer_lo; l < m->layer_hi; l++)
        kv->qkv[l] = be->alloc(be, (size_t)B * Tmax * 3 * H * glm_dtype_size(be->dtype));
}

static void free_scratch(glm_backend *be, glm_kvcache *kv) {
    void *bufs[] = {kv->h, kv->h2, kv->x, kv->qkv_new, kv->ctx, kv->ff, kv->ff2, kv->rows, kv->logits,
                    kv->mean, kv->rstd, kv->lse, kv->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) if (bufs[i]) be->free(be, bufs[i]);
    kv->cap_tokens = 0;
}

/* Work buffers for n new tokens (B rows included). */
static void ensure_scratch(glm_model *m, glm_kvcache *kv, int n) {
    if (n <= kv->cap_tokens) return;
    glm_backend *be = m->be;
    free_scratch(be, kv);
    const glm_config *c = &m->cfg;
    size_t es = glm_dtype_size(be->dtype), N = (size_t)n, H = c->hidden_size, F = c->inner_hidden_size;
    kv->h = be->alloc(be, N * H * es); kv->h2 = be->alloc(be, N * H * es); kv->x = be->alloc(be, N * H * es);
    kv->qkv_new = be->alloc(be, N * 3 * H * es); kv->ctx = be->alloc(be, N * H * es);
    kv->ff = be->alloc(be, N * F * es); kv->ff2 = be->alloc(be, N * F * es);
    kv->rows = be->alloc(be, (size_t)kv->B * H * es);
    kv->logits = be->alloc(be, (size_t)kv->B * c->vocab_size * es);
    kv->mean = be->alloc(be, N * 4); kv->rstd = be->alloc(be, N * 4);
    kv->lse = be->alloc(be, N * c->num_attention_heads * 4);
    kv->ints = be->alloc(be, N * 6 * 4);
    kv->cap_tokens = n;
}

void glm_kvcache_free(glm_model *m, glm_kvcache *kv) {
    free_scratch(m->be, kv);
    for (int l = m->layer_lo; l < m->layer_hi; l++) m->be->free(m->be, kv->qkv[l]);
    free(kv->qkv);
    *kv = (glm_kvcache){0};
}

int glm_forward_cached(glm_model *m, glm_kvcache *kv, int Tq, const int32_t *ids, const int32_t *pos,
                       const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi,
                       float *hidden_out, float *logits_out, glm_err *err) {
    return glm_stage_forward_cached(m, kv, Tq, ids, pos, block_pos, kv_lo, kv_hi, NULL, NULL, hidden_out, logits_out, err);
}

int glm_stage_forward_cached(glm_model *m, glm_kvcache *kv, int Tq, const int32_t *ids, const int32_t *pos,
                             const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi, const float *h_in,
                             float *h_out, float *hidden_out, float *logits_out, glm_err *err) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int B = kv->B, N = B * Tq, H = c->hidden_size, F = c->inner_hidden_size, V = c->vocab_size;
    int NH = c->num_attention_heads, HD = glm_head_dim(c);
    if (kv->len + Tq > kv->Tmax)
        return glm_fail(err, "KV cache full: %d cached + %d new tokens > capacity %d", kv->len, Tq, kv->Tmax);
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V) return glm_fail(err, "token id %d outside the vocabulary [0, %d)", ids[i], V);
        if (kv_lo[i] < 0 || kv_hi[i] > kv->len + Tq || kv_lo[i] > kv_hi[i])
            return glm_fail(err, "key range [%d, %d) outside the cache (%d tokens)", kv_lo[i], kv_hi[i], kv->len + Tq);
    }
    size_t es = glm_dtype_size(be->dtype), Nb = (size_t)N;
    ensure_scratch(m, kv, N);
    int32_t *d_ids = kv->ints, *d_pos = d_ids + N, *d_bpos = d_pos + N, *d_lo = d_bpos + N, *d_hi = d_lo + N;
    int32_t *d_last = d_hi + N;
    be->upload(be, d_ids, ids, Nb * 4); be->upload(be, d_pos, pos, Nb * 4); be->upload(be, d_bpos, block_pos, Nb * 4);
    be->upload(be, d_lo, kv_lo, Nb * 4); be->upload(be, d_hi, kv_hi, Nb * 4);
    void *h = kv->h, *h2 = kv->h2, *x = kv->x, *qkv = kv->qkv_new, *ctx = kv->ctx, *ff = kv->ff, *ff2 = kv->ff2;
    float *mean = kv->mean, *rstd = kv->rstd, *lse = kv->lse;
    if (m->first) be->embedding_fwd(be, h, d_ids, m->w.wte, N, H);
    else be->upload_f32(be, h, h_in, Nb * H);
    float scale = 1.0f / sqrtf((float)HD);
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        const glm_layer_ptrs *p = &m->w.layer[l];
        be->layernorm_fwd(be, x, mean, rstd, h, p->ln1_w, p->ln1_b, N, H, c->layernorm_epsilon);
        be->matmul_fwd(be, qkv, x, p->qkv_w, p->qkv_b, N, H, 3 * H);
        be->rope(be, qkv, d_pos, d_bpos, N, NH, HD, 0);
        for (int b = 0; b < B; b++) /* append this row's new q|k|v rows to the cache */
            be->copy(be, glm_at(be, kv->qkv[l], ((size_t)b * kv->Tmax + kv->len) * 3 * H),
                     glm_at(be, qkv, (size_t)b * Tq * 3 * H), (size_t)Tq * 3 * H * es);
        long bs = (long)kv->Tmax * 3 * H;
        glm_qkv_view q = {glm_at(be, kv->qkv[l], (size_t)kv->len * 3 * H), bs, 3L * H, 3L * HD};
        glm_qkv_view k = {glm_at(be, kv->qkv[l], HD), bs, 3L * H, 3L * HD};
        glm_qkv_view v = {glm_at(be, kv->qkv[l], 2 * HD), bs, 3L * H, 3L * HD};
        be->attention_fwd(be, ctx, lse, q, k, v, d_lo, d_hi, B, Tq, kv->len + Tq, NH, HD, scale);
        be->matmul_fwd(be, h2, ctx, p->dense_w, p->dense_b, N, H, H);
        be->scale_add(be, h2, c->alpha, x, h2, Nb * H);                      /* h1 */
        be->layernorm_fwd(be, x, mean, rstd, h2, p->ln2_w, p->ln2_b, N, H, c->layernorm_epsilon); /* y */
        be->matmul_fwd(be, ff, x, p->fc1_w, p->fc1_b, N, H, F);
        be->gelu_fwd(be, ff2, ff, Nb * F);
        be->matmul_fwd(be, h, ff2, p->fc2_w, p->fc2_b, N, F, H);
        be->scale_add(be, h, c->alpha, x, h, Nb * H);
    }
    if (!m->last) { /* a stage before the last hands its output on */
        be->download_f32(be, h_out, h, Nb * H);
        kv->len += Tq;
        return 0;
    }
    be->layernorm_fwd(be, x, mean, rstd, h, m->w.lnf_w, m->w.lnf_b, N, H, c->layernorm_epsilon);
    if (hidden_out) be->download_f32(be, hidden_out, x, Nb * H);
    if (logits_out) {
        int32_t *last = glm_malloc(sizeof(int32_t) * B);
        for (int b = 0; b < B; b++) last[b] = b * Tq + Tq - 1;
        be->upload(be, d_last, last, (size_t)B * 4);
        be->gather_rows(be, kv->rows, x, d_last, B, H);
        be->matmul_fwd(be, kv->logits, kv->rows, m->w.head, NULL, B, H, V);
        be->download_f32(be, logits_out, kv->logits, (size_t)B * V);
        free(last);
    }
    kv->len += Tq;
    return 0;
}
