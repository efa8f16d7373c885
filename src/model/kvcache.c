/* Incremental decoding with a KV cache. The cache keeps each layer's rotated q|k|v rows
 * [B, Tmax, W] as the family lays them out (q included: one contiguous copy per row serves, at
 * 1.5x the bytes of K and V alone for v1; ChatGLM2's 2 key/value groups make its rows mostly
 * queries, so it keeps k|v only); the attention op then reads keys and values straight from it
 * through views. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "model/glm.h"
#include "model/peft.h"

/* A cached token's elements (3H for q|k|v, 2H for k|v behind a prefix) and the cache rows in
 * front of the tokens (the prefix's P). */
static size_t cfg_row_elems(const glm_config *c) {
    if (c->family == GLM_FAMILY_GLM2) return 2 * (size_t)glm_kv_heads(c) * glm_head_dim(c);
    return (c->peft.pre_seq_len > 0 ? 2 : 3) * (size_t)c->hidden_size;
}
static size_t row_elems(const glm_model *m) { return cfg_row_elems(&m->cfg); }
static int front(const glm_model *m) { return m->cfg.peft.pre_seq_len; }

double glm_kvcache_bytes(const glm_config *c, size_t es, int B, int Tmax) {
    return (double)c->num_layers * B * (c->peft.pre_seq_len + Tmax) * cfg_row_elems(c) * es;
}

void glm_kvcache_grow(glm_model *m, glm_kvcache *kv, int Tmax) {
    if (Tmax <= kv->Tmax) return;
    glm_backend *be = m->be;
    size_t row = row_elems(m), es = glm_dtype_size(be->dtype), P = (size_t)front(m);
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        void *n = be->alloc(be, (size_t)kv->B * (P + Tmax) * row * es);
        for (int b = 0; b < kv->B; b++) /* rows keep their cached prefix; the row stride grows */
            be->copy(be, glm_at(be, n, (size_t)b * (P + Tmax) * row), glm_at(be, kv->qkv[l], (size_t)b * (P + kv->Tmax) * row),
                     (P + kv->len) * row * es);
        be->free(be, kv->qkv[l]);
        kv->qkv[l] = n;
    }
    kv->Tmax = Tmax;
}

void glm_kvcache_init(glm_model *m, glm_kvcache *kv, int B, int Tmax) {
    glm_backend *be = m->be;
    int L = m->cfg.num_layers;
    *kv = (glm_kvcache){.B = B, .Tmax = Tmax, .len = 0};
    kv->qkv = glm_calloc(L, sizeof(void *));
    kv->prefix_at = glm_calloc((size_t)B, sizeof(int));
    /* a pipeline stage caches only its own layers (NULL elsewhere) */
    for (int l = m->layer_lo; l < m->layer_hi; l++)
        kv->qkv[l] = be->alloc(be, (size_t)B * (front(m) + Tmax) * row_elems(m) * glm_dtype_size(be->dtype));
}

/* P-Tuning: every row's cache starts with the prefix keys/values of each layer (no dropout). */
/* P-Tuning: layer l's prefix keys/values (no dropout) into every row's cache at slots
 * [prefix_at[b], prefix_at[b] + P): right before the row's first real token, over the left
 * padding's own slots, after the prompt's k|v were written. */
static void fill_prefix(glm_model *m, glm_kvcache *kv, int l, const void *pkv) {
    const glm_config *c = &m->cfg;
    int P = front(m), HD = glm_head_dim(c);
    for (int b = 0; b < kv->B; b++) {
        void *row = glm_at(m->be, kv->qkv[l], ((size_t)b * (P + kv->Tmax) + kv->prefix_at[b]) * row_elems(m));
        if (c->family == GLM_FAMILY_GLM2) glm_prefix_fill_cache(m, l, row);
        else m->be->prefix_kv(m->be, row, kv->a.qkv, pkv, l, c->num_layers, 1, 0, P, c->num_attention_heads, HD, 0.0f, 0);
    }
}

static void free_scratch(const glm_model *m, glm_kvcache *kv) {
    glm_layer_acts_free(m, &kv->a);
    void *bufs[] = {kv->h, kv->h2, kv->rows, kv->logits, kv->ints, kv->kvrows, kv->row_logits, kv->row_ints,
                    kv->row_losses, kv->row_x};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) if (bufs[i]) m->be->free(m->be, bufs[i]);
    kv->h = kv->h2 = kv->rows = kv->logits = kv->kvrows = kv->row_logits = kv->row_ints = kv->row_losses = NULL;
    kv->row_x = NULL;
    kv->last_rows = 0;
    if (kv->hints) {
        if (m->be->host_free) m->be->host_free(m->be, kv->hints);
        else free(kv->hints);
    }
    kv->hints = NULL;
    kv->ints = NULL;
    kv->cap_tokens = 0;
}

/* Work buffers for n new tokens (B rows included). */
static void ensure_scratch(glm_model *m, glm_kvcache *kv, int n) {
    if (n <= kv->cap_tokens) return;
    glm_backend *be = m->be;
    free_scratch(m, kv);
    const glm_config *c = &m->cfg;
    size_t es = glm_dtype_size(be->dtype), N = (size_t)n, H = c->hidden_size;
    glm_layer_acts_alloc(m, &kv->a, N);
    kv->h = be->alloc(be, N * H * es); kv->h2 = be->alloc(be, N * H * es);
    kv->rows = be->alloc(be, (size_t)kv->B * H * es);
    kv->logits = be->alloc(be, (size_t)kv->B * c->vocab_size * es);
    kv->ints = be->alloc(be, N * 7 * 4);
    kv->hints = be->host_alloc ? be->host_alloc(be, N * 7 * 4) : glm_malloc(N * 7 * 4);
    if (c->family == GLM_FAMILY_GLM2 || front(m) > 0) kv->kvrows = be->alloc(be, N * row_elems(m) * es);
    kv->cap_tokens = n;
}

void glm_kvcache_free(glm_model *m, glm_kvcache *kv) {
    free_scratch(m, kv);
    for (int l = m->layer_lo; l < m->layer_hi; l++) m->be->free(m->be, kv->qkv[l]);
    free(kv->qkv);
    free(kv->prefix_at);
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
    int B = kv->B, N = B * Tq, H = c->hidden_size, V = c->vocab_size;
    int HD = glm_head_dim(c);
    if (kv->len + Tq > kv->Tmax)
        return glm_fail(err, "KV cache full: %d cached + %d new tokens > capacity %d", kv->len, Tq, kv->Tmax);
    int P = front(m);
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V) return glm_fail(err, "token id %d outside the vocabulary [0, %d)", ids[i], V);
        if (kv_lo[i] < 0 || kv_hi[i] > kv->len + Tq || kv_lo[i] > kv_hi[i])
            return glm_fail(err, "key range [%d, %d) outside the cache (%d tokens)", kv_lo[i], kv_hi[i], kv->len + Tq);
    }
    if (P > 0 && !kv->prefix_ready) /* each row's prefix goes where its real tokens' keys start: the
                                     * range of its last prompt token (a pad's own range is inside it) */
        for (int b = 0; b < B; b++) kv->prefix_at[b] = kv_lo[b * Tq + Tq - 1];
    for (int i = 0; P > 0 && i < N; i++)
        if (kv_lo[i] > kv->prefix_at[i / Tq]) /* it would see only part of the prefix */
            return glm_fail(err, "row %d: key range [%d, %d) starts after the row's P-Tuning prefix (at %d)", i / Tq,
                            kv_lo[i], kv_hi[i], kv->prefix_at[i / Tq]),
                   glm_hint(err, "left padding only: every real token of a row starts its keys at the row's first one");
    size_t es = glm_dtype_size(be->dtype), Nb = (size_t)N;
    ensure_scratch(m, kv, N);
    int32_t *d_ids = kv->ints, *d_pos = d_ids + N, *d_bpos = d_pos + N, *d_lo = d_bpos + N, *d_hi = d_lo + N;
    int32_t *d_last = d_hi + N;
    be->upload(be, d_ids, ids, Nb * 4); be->upload(be, d_pos, pos, Nb * 4); be->upload(be, d_bpos, block_pos, Nb * 4);
    be->upload(be, d_lo, kv_lo, Nb * 4);
    if (P > 0) { /* the prefix sits in front of the tokens: key k of the caller is cache slot P + k */
        int32_t *hi = glm_malloc(Nb * 4);
        for (size_t i = 0; i < Nb; i++) hi[i] = kv_hi[i] + P;
        be->upload(be, d_hi, hi, Nb * 4);
        free(hi);
    } else {
        be->upload(be, d_hi, kv_hi, Nb * 4);
    }
    glm_layer_acts *a = &kv->a;
    void *h = kv->h, *h2 = kv->h2;
    const void *pkv = P > 0 && !kv->prefix_ready ? glm_prefix_forward(m) : NULL;
    if (m->first) be->embedding_fwd(be, h, d_ids, m->w.wte, N, H);
    else be->upload_f32(be, h, h_in, Nb * H);
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        m->fam->block_qkv(m, l, a, h, N, d_pos, d_bpos);
        glm_qkv_view q, k, v;
        if (c->family == GLM_FAMILY_GLM2) { /* the new rows' k|v appended; queries from a->qkv */
            int W = glm_qkv_width(c), KV = (int)row_elems(m), NKV = glm_kv_heads(c);
            for (int b = 0; b < B; b++) /* behind the row's prefix (P-Tuning) and cached tokens */
                be->copy_rows(be, glm_at(be, kv->qkv[l], ((size_t)b * (P + kv->Tmax) + P + kv->len) * KV), KV,
                              glm_at(be, a->qkv, (size_t)b * Tq * W + (W - KV)), W, KV, Tq);
            glm_qkv_view unused;
            m->fam->qkv_views(m, a->qkv, (long)Tq * W, &q, &unused, &unused);
            /* cached rows [NKV heads of k | NKV heads of v], each query head reading its group's */
            long bs = (long)(P + kv->Tmax) * KV;
            int g = c->num_attention_heads / NKV;
            k = (glm_qkv_view){kv->qkv[l], bs, KV, HD, g};
            v = (glm_qkv_view){glm_at(be, kv->qkv[l], (size_t)NKV * HD), bs, KV, HD, g};
        } else if (P > 0) { /* the new rows' k|v behind the prefix (and the tokens before); queries from a->qkv */
            long bs = (long)(P + kv->Tmax) * 2 * H;
            for (int b = 0; b < B; b++)
                be->prefix_kv(be, glm_at(be, kv->qkv[l], (size_t)b * bs + (size_t)(P + kv->len) * 2 * H),
                              glm_at(be, a->qkv, (size_t)b * Tq * 3 * H), NULL, l, c->num_layers, 1, Tq, 0,
                              c->num_attention_heads, HD, 0.0f, 0);
            q = (glm_qkv_view){a->qkv, (long)Tq * 3 * H, 3L * H, 3L * HD, 1};
            k = (glm_qkv_view){kv->qkv[l], bs, 2L * H, 2L * HD, 1};
            v = k;
            v.base = glm_at(be, kv->qkv[l], HD);
        } else {
            for (int b = 0; b < B; b++) /* append this row's new q|k|v rows to the cache */
                be->copy(be, glm_at(be, kv->qkv[l], ((size_t)b * kv->Tmax + kv->len) * 3 * H),
                         glm_at(be, a->qkv, (size_t)b * Tq * 3 * H), (size_t)Tq * 3 * H * es);
            /* queries are the new rows; keys and values every cached row, read in place */
            long bs = (long)kv->Tmax * 3 * H;
            m->fam->qkv_views(m, kv->qkv[l], bs, &q, &k, &v);
            q.base = glm_at(be, kv->qkv[l], (size_t)kv->len * 3 * H);
        }
        if (pkv) fill_prefix(m, kv, l, pkv); /* over the left padding's k|v just written */
        glm_block_finish(m, l, a, q, k, v, d_lo, d_hi, B, Tq, P + kv->len + Tq, h2);
        void *t = h; h = h2; h2 = t;
    }
    if (pkv) kv->prefix_ready = 1;
    if (!m->last) { /* a stage before the last hands its output on */
        be->download_f32(be, h_out, h, Nb * H);
        kv->len += Tq;
        return 0;
    }
    void *x = a->x; /* final norm output */
    m->fam->final_norm(m, x, a->ln1_mean, a->ln1_rstd, h, N);
    kv->last_rows = N;
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

/* ---- continuous batching (glm.h glm_forward_cached_slots): every row of a call is one cache
 * slot with its own length, so requests of different lengths share the pool and the decode
 * step; each row's keys are its own slot's [lo, hi), the other slots never in its range. */

void glm_kvcache_reserve(glm_model *m, glm_kvcache *kv, int ntokens) { ensure_scratch(m, kv, ntokens); }

void glm_kvcache_copy_slot(glm_model *m, glm_kvcache *kv, int src, int dst, int n) {
    glm_backend *be = m->be;
    size_t row = row_elems(m), P = (size_t)front(m), stride = (P + kv->Tmax) * row;
    GLM_ASSERT(src >= 0 && dst >= 0 && src < kv->B && dst < kv->B && n >= 0 && n <= kv->Tmax);
    for (int l = m->layer_lo; l < m->layer_hi; l++)
        be->copy(be, glm_at(be, kv->qkv[l], (size_t)dst * stride), glm_at(be, kv->qkv[l], (size_t)src * stride),
                 (P + n) * row * glm_dtype_size(be->dtype));
    kv->prefix_at[dst] = kv->prefix_at[src];
}

int glm_forward_cached_slots(glm_model *m, glm_kvcache *kv, int slot0, int nrows, int Tq, const int *len,
                             const int32_t *ids, const int32_t *pos, const int32_t *block_pos, const int32_t *kv_lo,
                             const int32_t *kv_hi, float *logits_out, glm_err *err) {
    if (!m->first || !m->last) return glm_fail(err, "cache slots: a whole model is needed (not a pipeline stage)");
    return glm_stage_forward_cached_slots(m, kv, slot0, nrows, Tq, len, NULL, ids, pos, block_pos, kv_lo, kv_hi, NULL,
                                          NULL, logits_out, NULL, NULL, err);
}

int glm_stage_forward_cached_slots(glm_model *m, glm_kvcache *kv, int slot0, int nrows, int Tq, const int *len,
                                   const int *n_new, const int32_t *ids, const int32_t *pos, const int32_t *block_pos,
                                   const int32_t *kv_lo, const int32_t *kv_hi, const float *h_in, float *h_out, float *logits_out,
                                   int32_t *greedy_out, float *last_hidden_out, glm_err *err) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int N = nrows * Tq, H = c->hidden_size, V = c->vocab_size, HD = glm_head_dim(c), P = front(m);
    if (nrows <= 0 || Tq <= 0 || slot0 < 0 || slot0 + nrows > kv->B)
        return glm_fail(err, "cache slots [%d, %d) x %d tokens outside the pool of %d slots", slot0, slot0 + nrows, Tq, kv->B);
    int Tk = 0;
    for (int b = 0; b < nrows; b++) {
        if (len[b] < 0 || len[b] + Tq > kv->Tmax)
            return glm_fail(err, "cache slot %d full: %d cached + %d new tokens > capacity %d", slot0 + b, len[b], Tq, kv->Tmax);
        if (len[b] + Tq > Tk) Tk = len[b] + Tq;
        if (n_new && (n_new[b] < 1 || n_new[b] > Tq))
            return glm_fail(err, "cache slot %d: %d real new tokens of a call of %d", slot0 + b, n_new[b], Tq);
    }
    for (int i = 0; i < N; i++) {
        int b = i / Tq;
        if (ids[i] < 0 || ids[i] >= V) return glm_fail(err, "token id %d outside the vocabulary [0, %d)", ids[i], V);
        if (kv_lo[i] < 0 || kv_hi[i] > len[b] + Tq || kv_lo[i] > kv_hi[i])
            return glm_fail(err, "slot %d: key range [%d, %d) outside its %d tokens", slot0 + b, kv_lo[i], kv_hi[i], len[b] + Tq);
        if (P > 0 && kv_lo[i] > 0) /* it would see only part of the prefix */
            return glm_fail(err, "slot %d: key range [%d, %d) starts after the slot's P-Tuning prefix", slot0 + b,
                            kv_lo[i], kv_hi[i]);
    }
    size_t Nb = (size_t)N, row = row_elems(m);
    ensure_scratch(m, kv, N);
    int32_t *d_ids = kv->ints, *d_pos = d_ids + N, *d_bpos = d_pos + N, *d_lo = d_bpos + N, *d_hi = d_lo + N;
    int32_t *d_last = d_hi + N, *d_at = d_last + N;
    /* every input of the call in one upload from page-locked memory (a decode step is a few
     * milliseconds: seven staged copies were a noticeable part of it). The buffer is free: the
     * previous call ended with a download, which waits for the stream. */
    int32_t *hb = kv->hints;
    memcpy(hb, ids, Nb * 4); memcpy(hb + N, pos, Nb * 4); memcpy(hb + 2 * N, block_pos, Nb * 4);
    memcpy(hb + 3 * N, kv_lo, Nb * 4); memcpy(hb + 4 * N, kv_hi, Nb * 4);
    for (int b = 0; b < nrows; b++) hb[5 * N + b] = b * Tq + (n_new ? n_new[b] : Tq) - 1; /* each row's last token */
    /* where each new token's cache row goes, counted in rows from the first slot of the call: one
     * scatter per layer writes every row's k|v (a copy per row would be nrows launches a layer);
     * a P-Tuning prefix holds each slot's first P rows, and key k of the caller is row P + k */
    for (int i = 0; i < N; i++) hb[6 * N + i] = (i / Tq) * (P + kv->Tmax) + P + len[i / Tq] + i % Tq;
    for (int i = 0; P > 0 && i < N; i++) hb[4 * N + i] += P;
    be->upload(be, d_ids, hb, Nb * 7 * 4);
    glm_layer_acts *a = &kv->a;
    void *h = kv->h, *h2 = kv->h2;
    /* every slot's prefix keys/values, once for the pool: the same prefix serves every request */
    const void *pkv = P > 0 && !kv->prefix_ready ? glm_prefix_forward(m) : NULL;
    if (m->first) be->embedding_fwd(be, h, d_ids, m->w.wte, N, H);
    else be->upload_f32(be, h, h_in, Nb * H);
    long bs = (long)(P + kv->Tmax) * (long)row; /* one slot */
    for (int l = m->layer_lo; l < m->layer_hi; l++) {
        if (pkv) fill_prefix(m, kv, l, pkv);
        m->fam->block_qkv(m, l, a, h, N, d_pos, d_bpos);
        void *pool = glm_at(be, kv->qkv[l], (size_t)slot0 * bs);
        glm_qkv_view q, k, v, unused;
        int W = glm_qkv_width(c);
        if (c->family == GLM_FAMILY_GLM2) { /* k|v appended at each slot's length; queries from a->qkv */
            int KV = (int)row, NKV = glm_kv_heads(c);
            be->copy_rows(be, kv->kvrows, KV, glm_at(be, a->qkv, (size_t)(W - KV)), W, KV, Nb);
            be->scatter_rows(be, pool, kv->kvrows, d_at, N, KV);
            m->fam->qkv_views(m, a->qkv, (long)Tq * W, &q, &unused, &unused);
            int g = c->num_attention_heads / NKV;
            k = (glm_qkv_view){pool, bs, KV, HD, g};
            v = (glm_qkv_view){glm_at(be, pool, (size_t)NKV * HD), bs, KV, HD, g};
        } else if (P > 0) { /* behind a prefix the slots keep k|v only (prefix_kv's layout) */
            be->prefix_kv(be, kv->kvrows, a->qkv, NULL, l, c->num_layers, 1, N, 0, c->num_attention_heads, HD, 0.0f, 0);
            be->scatter_rows(be, pool, kv->kvrows, d_at, N, (int)row);
            m->fam->qkv_views(m, a->qkv, (long)Tq * W, &q, &unused, &unused);
            k = (glm_qkv_view){pool, bs, (long)row, 2L * HD, 1};
            v = k;
            v.base = glm_at(be, pool, HD);
        } else { /* the q|k|v rows appended at each slot's length; queries read from a->qkv */
            be->scatter_rows(be, pool, a->qkv, d_at, N, W);
            m->fam->qkv_views(m, a->qkv, (long)Tq * W, &q, &unused, &unused);
            m->fam->qkv_views(m, pool, bs, &unused, &k, &v);
        }
        glm_block_finish(m, l, a, q, k, v, d_lo, d_hi, nrows, Tq, P + Tk, h2);
        void *t = h; h = h2; h2 = t;
    }
    if (pkv) kv->prefix_ready = 1;
    if (!m->last) { /* a stage before the last hands its output on */
        be->download_f32(be, h_out, h, Nb * H);
        return 0;
    }
    void *x = a->x;
    m->fam->final_norm(m, x, a->ln1_mean, a->ln1_rstd, h, N);
    kv->last_rows = N;
    if (greedy_out && !be->argmax_rows) return glm_fail(err, "cache slots: backend %s has no argmax_rows", be->name);
    if (logits_out || greedy_out || last_hidden_out) {
        be->gather_rows(be, kv->rows, x, d_last, nrows, H);
        if (last_hidden_out) be->download_f32(be, last_hidden_out, kv->rows, (size_t)nrows * H);
    }
    if (logits_out || greedy_out) {
        be->matmul_fwd(be, kv->logits, kv->rows, m->w.head, NULL, nrows, H, V);
        if (greedy_out) be->argmax_rows(be, greedy_out, kv->logits, nrows, V); /* only nrows ints come back */
        if (logits_out) be->download_f32(be, logits_out, kv->logits, (size_t)nrows * V);
    } else if (!last_hidden_out) {
        be->sync(be); /* the inputs' buffer is reused by the next call */
    }
    return 0;
}

/* Rows [r0, r0 + n) of the last call's final-norm output through the head, into kv->row_logits. */
static int rows_head(glm_model *m, glm_kvcache *kv, int r0, int n, glm_err *err) {
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (!m->last) return glm_fail(err, "rows' logits: only the last stage has the head");
    if (n < 1 || n > GLM_ROWS_LOGITS_MAX || r0 < 0 || r0 + n > kv->last_rows)
        return glm_fail(err, "rows' logits: rows [%d, %d) outside the last call's %d (at most %d a call)", r0, r0 + n,
                        kv->last_rows, GLM_ROWS_LOGITS_MAX);
    if (!kv->row_logits) kv->row_logits = be->alloc(be, (size_t)GLM_ROWS_LOGITS_MAX * V * glm_dtype_size(be->dtype));
    be->matmul_fwd(be, kv->row_logits, glm_at(be, kv->a.x, (size_t)r0 * H), m->w.head, NULL, n, H, V);
    return 0;
}

int glm_cached_rows_logits(glm_model *m, glm_kvcache *kv, int r0, int n, float *logits_out, glm_err *err) {
    if (rows_head(m, kv, r0, n, err)) return -1;
    m->be->download_f32(m->be, logits_out, kv->row_logits, (size_t)n * m->cfg.vocab_size);
    return 0;
}

int glm_cached_picked_logits(glm_model *m, glm_kvcache *kv, const int32_t *rows, int n, float *logits_out, glm_err *err) {
    glm_backend *be = m->be;
    int H = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (!m->last) return glm_fail(err, "rows' logits: only the last stage has the head");
    if (n < 1 || n > GLM_ROWS_LOGITS_MAX) return glm_fail(err, "rows' logits: %d rows (1 to %d a call)", n, GLM_ROWS_LOGITS_MAX);
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= kv->last_rows)
            return glm_fail(err, "rows' logits: row %d outside the last call's %d", rows[i], kv->last_rows);
    size_t es = glm_dtype_size(be->dtype);
    if (!kv->row_logits) kv->row_logits = be->alloc(be, (size_t)GLM_ROWS_LOGITS_MAX * V * es);
    if (!kv->row_x) kv->row_x = be->alloc(be, (size_t)GLM_ROWS_LOGITS_MAX * H * es);
    if (!kv->row_ints) {
        kv->row_ints = be->alloc(be, GLM_ROWS_LOGITS_MAX * sizeof(int32_t));
        kv->row_losses = be->alloc(be, GLM_ROWS_LOGITS_MAX * sizeof(float));
    }
    be->upload(be, kv->row_ints, rows, (size_t)n * sizeof(int32_t));
    be->gather_rows(be, kv->row_x, kv->a.x, kv->row_ints, n, H);
    be->matmul_fwd(be, kv->row_logits, kv->row_x, m->w.head, NULL, n, H, V);
    be->download_f32(be, logits_out, kv->row_logits, (size_t)n * V);
    return 0;
}

/* lp[i] = log_softmax(kv->row_logits[i])[ids[i]] for i < n: minus the cross entropy (logsumexp
 * minus the id's logit; dscale 0 keeps the logits). */
static void rows_logprob(glm_model *m, glm_kvcache *kv, int n, const int32_t *ids, float *lp) {
    glm_backend *be = m->be;
    be->upload(be, kv->row_ints, ids, (size_t)n * sizeof(int32_t));
    be->cross_entropy(be, kv->row_logits, kv->row_losses, kv->row_ints, n, m->cfg.vocab_size, 0.0f, NULL);
    be->download(be, lp, kv->row_losses, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) lp[i] = -lp[i];
}

int glm_cached_rows_logprobs(glm_model *m, glm_kvcache *kv, int r0, int n, const int32_t *targets, float *lp,
                             int32_t *best_id, float *best_lp, glm_err *err) {
    glm_backend *be = m->be;
    int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (targets[i] < 0 || targets[i] >= V)
            return glm_fail(err, "rows' log-probabilities: token %d outside [0, %d)", targets[i], V);
    if (best_id && !be->argmax_rows) return glm_fail(err, "rows' log-probabilities: backend %s has no argmax_rows", be->name);
    if (rows_head(m, kv, r0, n, err)) return -1;
    if (!kv->row_ints) {
        kv->row_ints = be->alloc(be, GLM_ROWS_LOGITS_MAX * sizeof(int32_t));
        kv->row_losses = be->alloc(be, GLM_ROWS_LOGITS_MAX * sizeof(float));
    }
    rows_logprob(m, kv, n, targets, lp);
    if (best_id) {
        be->argmax_rows(be, best_id, kv->row_logits, n, V);
        rows_logprob(m, kv, n, best_id, best_lp);
    }
    return 0;
}
