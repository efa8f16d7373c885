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
    for (int l = 0; l < L; l++) kv->qkv[l] = be->alloc(be, (size_t)B * Tmax * 3 * H * glm_dtype_size(be->dtype));
}

void glm_kvcache_free(glm_model *m, glm_kvcache *kv) {
    for (int l = 0; l < m->cfg.num_layers; l++) m->be->free(m->be, kv->qkv[l]);
    free(kv->qkv);
    *kv = (glm_kvcache){0};
}

int glm_forward_cached(glm_model *m, glm_kvcache *kv, int Tq, const int32_t *ids, const int32_t *pos,
                       const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi,
                       float *hidden_out, float *logits_out, glm_err *err) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int B = kv->B, N = B * Tq, H = c->hidden_size, F = c->inner_hidden_size, V = c->vocab_size;
    int NH = c->num_attention_heads, HD = glm_head_dim(c), L = c->num_layers;
    if (kv->len + Tq > kv->Tmax)
        return glm_fail(err, "KV cache full: %d cached + %d new tokens > capacity %d", kv->len, Tq, kv->Tmax);
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V) return glm_fail(err, "token id %d outside the vocabulary [0, %d)", ids[i], V);
        if (kv_lo[i] < 0 || kv_hi[i] > kv->len + Tq || kv_lo[i] > kv_hi[i])
            return glm_fail(err, "key range [%d, %d) outside the cache (%d tokens)", kv_lo[i], kv_hi[i], kv->len + Tq);
    }
    size_t es = glm_dtype_size(be->dtype), Nb = (size_t)N;
    int32_t *d_ids = be->alloc(be, Nb * 4), *d_pos = be->alloc(be, Nb * 4), *d_bpos = be->alloc(be, Nb * 4);
    int32_t *d_lo = be->alloc(be, Nb * 4), *d_hi = be->alloc(be, Nb * 4);
    be->upload(be, d_ids, ids, Nb * 4); be->upload(be, d_pos, pos, Nb * 4); be->upload(be, d_bpos, block_pos, Nb * 4);
    be->upload(be, d_lo, kv_lo, Nb * 4); be->upload(be, d_hi, kv_hi, Nb * 4);
    void *h = be->alloc(be, Nb * H * es), *h2 = be->alloc(be, Nb * H * es), *x = be->alloc(be, Nb * H * es);
    void *qkv = be->alloc(be, Nb * 3 * H * es), *ctx = be->alloc(be, Nb * H * es), *ff = be->alloc(be, Nb * F * es);
    void *ff2 = be->alloc(be, Nb * F * es);
    float *mean = be->alloc(be, Nb * 4), *rstd = be->alloc(be, Nb * 4), *lse = be->alloc(be, Nb * NH * 4);
    be->embedding_fwd(be, h, d_ids, m->w.wte, N, H);
    float scale = 1.0f / sqrtf((float)HD);
    for (int l = 0; l < L; l++) {
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
    be->layernorm_fwd(be, x, mean, rstd, h, m->w.lnf_w, m->w.lnf_b, N, H, c->layernorm_epsilon);
    if (hidden_out) be->download_f32(be, hidden_out, x, Nb * H);
    if (logits_out) {
        int32_t *last = glm_malloc(sizeof(int32_t) * B);
        for (int b = 0; b < B; b++) last[b] = b * Tq + Tq - 1;
        int32_t *d_last = be->alloc(be, (size_t)B * 4);
        be->upload(be, d_last, last, (size_t)B * 4);
        void *rows = be->alloc(be, (size_t)B * H * es), *lg = be->alloc(be, (size_t)B * V * es);
        be->gather_rows(be, rows, x, d_last, B, H);
        be->matmul_fwd(be, lg, rows, m->w.head, NULL, B, H, V);
        be->download_f32(be, logits_out, lg, (size_t)B * V);
        be->free(be, rows); be->free(be, lg); be->free(be, d_last);
        free(last);
    }
    kv->len += Tq;
    void *bufs[] = {d_ids, d_pos, d_bpos, d_lo, d_hi, h, h2, x, qkv, ctx, ff, ff2, mean, rstd, lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    return 0;
}
