/* The parameter-efficient parts of a layer (model/peft.h): LoRA's branch of the four linear
 * modules (with DoRA's row scale), and P-Tuning v2's prefix encoder and prefix keys/values, on
 * the ops interface. */
#include "model/peft.h"
#include "model/hf_layout.h"
#include <stdint.h>
#include <stdlib.h>

/* ---- the linear modules, with their LoRA branch (peft's LoraLayer) where they have one:
 * out = inp W^T + b + (s * dropout(inp) A^T) B^T, s = glm_lora_scaling. Target i: 0
 * query_key_value, 1 dense, 2 dense_h_to_4h, 3 dense_4h_to_h. */

/* The adapters' scratch for N tokens (training batches and decoding steps alike): lora_tmp [N,
 * the widest output], and behind it as much again where q, k and v have adapters of their own
 * (one block's product, before it joins the others). */
static void lora_scratch(glm_model *m, int N) {
    if (N <= m->lora_cap) return;
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype);
    if (m->lora_tmp) be->free(be, m->lora_tmp);
    if (m->lora_u) be->free(be, m->lora_u);
    if (m->dora_g) be->free(be, m->dora_g);
    m->lora_tmp = be->alloc(be, (size_t)N * glm_linear_out_max(&m->cfg) * glm_lora_split(&m->cfg, 0) * es);
    m->dora_g = m->cfg.peft.use_dora ? be->alloc(be, (size_t)N * glm_linear_out_max(&m->cfg) * es) : NULL;
    m->lora_u = NULL; /* made by dropped_copy when first needed */
    m->lora_cap = N;
}

/* lora_u [lora_cap, the widest adapter input]: the dropped-out copy of an adapter's input, used
 * only where the backend has no lora_down / lora_down_bwd for the shape (the memory plan counts
 * it either way) */
static void *dropped_copy(glm_model *m) {
    if (!m->lora_u)
        m->lora_u = m->be->alloc(m->be, (size_t)m->lora_cap * glm_linear_in_max(&m->cfg) * glm_dtype_size(m->be->dtype));
    return m->lora_u;
}

static uint64_t lora_seed(const glm_model *m, int l, int i) { return m->dropout_seed + (uint64_t)(l * 4 + i + 1) * 0x100000001b3ULL; }

/* The dropout of the adapters' inputs: lora_dropout while training (unless the trainer turned
 * dropout off), else none. */
static float lora_dropout(const glm_model *m) { return m->training && !m->no_dropout ? m->cfg.peft.lora_dropout : 0.0f; }

/* The adapter's input: inp itself, or its dropped-out copy in lora_u while training (seed: the
 * mask's, lora_seed or a split adapter's own). */
static const void *lora_input_seeded(glm_model *m, const void *inp, size_t n, uint64_t seed) {
    float p = lora_dropout(m);
    if (p <= 0) return inp;
    void *u = dropped_copy(m);
    m->be->mask_scale(m->be, u, inp, n, 1.0f, p, seed);
    return u;
}
static const void *lora_input(glm_model *m, int l, int i, const void *inp, size_t n) {
    return lora_input_seeded(m, inp, n, lora_seed(m, l, i));
}

/* ---- q, k and v adapted each on its own (config.h glm_lora_split: transformers' GLM layout,
 * peft's q_proj, k_proj, v_proj): adapter k has rows [k r, (k + 1) r) of the stacked A, rows
 * [o_k, o_k + rows_k) of the stacked B and of the output, its own dropout mask, and its middle
 * t_k = s dropout_k(inp) A_k^T [N, r] at a->lora_t[i] + k N r. The products run on contiguous
 * blocks: a block of the output is gathered (copy_rows) before its products and scattered after.
 * Without dropout the three adapters' products with inp are one (A stacked is one matrix), in
 * the forward (inp A^T) and the backward (dA, dinp). */
static uint64_t split_seed(const glm_model *m, int l, int i, int k) { return lora_seed(m, l, i) + (uint64_t)k * 0x9e3779b97f4a7c15ULL; }

static void lora_add_split(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, int N, int C, int OC) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int r = m->cfg.peft.lora_rank;
    float s = glm_lora_scaling(&m->cfg.peft);
    lora_scratch(m, N);
    void *full = m->lora_tmp, *blk = glm_at(be, m->lora_tmp, (size_t)N * glm_linear_out_max(&m->cfg)); /* [N, OC], [N, rows_k] */
    int S = glm_lora_split(&m->cfg, i), one = lora_dropout(m) <= 0;
    if (one) { /* no dropout: the three down-products are one, inp A^T [N, S r], its blocks then moved apart */
        be->matmul_fwd(be, full, inp, p->lora_a[i], NULL, N, C, S * r);
        be->mask_scale(be, full, full, (size_t)N * S * r, s, 0.0f, 0);
        for (int k = 0; k < S; k++)
            be->copy_rows(be, glm_at(be, a->lora_t[i], (size_t)k * N * r), (size_t)r, glm_at(be, full, (size_t)k * r),
                          (size_t)S * r, (size_t)r, (size_t)N);
    }
    int64_t row0[3], rows[3];
    glm_lora_blocks(&m->cfg, S, OC, row0, rows);
    GLM_ASSERT(row0[S - 1] + rows[S - 1] == OC);
    for (int k = 0; k < S; k++) {
        void *t = glm_at(be, a->lora_t[i], (size_t)k * N * r);
        if (!one) {
            const void *u = lora_input_seeded(m, inp, (size_t)N * C, split_seed(m, l, i, k));
            be->matmul_fwd(be, t, u, glm_at(be, p->lora_a[i], (size_t)k * r * C), NULL, N, C, r);
            be->mask_scale(be, t, t, (size_t)N * r, s, 0.0f, 0);
        }
        be->matmul_fwd(be, blk, t, glm_at(be, p->lora_b[i], (size_t)row0[k] * r), NULL, N, r, (int)rows[k]);
        be->copy_rows(be, glm_at(be, full, (size_t)row0[k]), (size_t)OC, blk, (size_t)rows[k], (size_t)rows[k], (size_t)N);
    }
    be->scale_add(be, out, 1.0f, full, out, (size_t)N * OC);
}

static void lora_bwd_split(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, const void *dout, const void *inp,
                           int N, int C, int OC) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    int r = m->cfg.peft.lora_rank;
    float s = glm_lora_scaling(&m->cfg.peft);
    void *dt = m->lora_tmp, *dy = glm_at(be, m->lora_tmp, (size_t)N * glm_linear_out_max(&m->cfg)); /* [N, r], [N, rows_k] */
    int S = glm_lora_split(&m->cfg, i);
    int64_t row0[3], rows[3];
    glm_lora_blocks(&m->cfg, S, OC, row0, rows);
    if (lora_dropout(m) <= 0) { /* no dropout: the blocks' dt side by side [N, S r], then one product each for dA, dinp */
        void *dtk = dropped_copy(m); /* [N, r] */
        for (int k = 0; k < S; k++) {
            be->copy_rows(be, dy, (size_t)rows[k], glm_at(be, dout, (size_t)row0[k]), (size_t)OC, (size_t)rows[k], (size_t)N);
            be->matmul_bwd(be, dtk, glm_at(be, g->lora_b[i], (size_t)row0[k] * r), NULL, dy,
                           glm_at(be, a->lora_t[i], (size_t)k * N * r), glm_at(be, p->lora_b[i], (size_t)row0[k] * r), N, r,
                           (int)rows[k], 0);
            be->copy_rows(be, glm_at(be, dt, (size_t)k * r), (size_t)S * r, dtk, (size_t)r, (size_t)r, (size_t)N);
        }
        be->mask_scale(be, dt, dt, (size_t)N * S * r, s, 0.0f, 0);
        be->matmul_bwd(be, dinp, g->lora_a[i], NULL, dt, inp, p->lora_a[i], N, C, S * r, 1);
        return;
    }
    for (int k = 0; k < S; k++) {
        const void *Ak = glm_at(be, p->lora_a[i], (size_t)k * r * C);
        void *dAk = glm_at(be, g->lora_a[i], (size_t)k * r * C);
        be->copy_rows(be, dy, (size_t)rows[k], glm_at(be, dout, (size_t)row0[k]), (size_t)OC, (size_t)rows[k], (size_t)N);
        /* dB_k += dy_k^T t_k, dt = s dy_k B_k, dA_k += dt^T u_k, dinp += dropout_k(dt A_k) */
        be->matmul_bwd(be, dt, glm_at(be, g->lora_b[i], (size_t)row0[k] * r), NULL, dy,
                       glm_at(be, a->lora_t[i], (size_t)k * N * r), glm_at(be, p->lora_b[i], (size_t)row0[k] * r), N, r,
                       (int)rows[k], 0);
        be->mask_scale(be, dt, dt, (size_t)N * r, s, 0.0f, 0);
        const void *u = lora_input_seeded(m, inp, (size_t)N * C, split_seed(m, l, i, k));
        if (u == inp) {
            be->matmul_bwd(be, dinp, dAk, NULL, dt, inp, Ak, N, C, r, 1);
        } else {
            be->matmul_bwd(be, NULL, dAk, NULL, dt, u, Ak, N, C, r, 0);
            if (dinp) {
                be->matmul_bwd(be, m->lora_u, NULL, NULL, dt, NULL, Ak, N, C, r, 0);
                be->mask_scale(be, m->lora_u, m->lora_u, (size_t)N * C, 1.0f, m->cfg.peft.lora_dropout, split_seed(m, l, i, k));
                be->scale_add(be, dinp, 1.0f, m->lora_u, dinp, (size_t)N * C);
            }
        }
    }
}

/* Decoding steps (few rows) read a quantized weight directly; larger batches dequantize it
 * once into qscratch for the GEMMs. On an H200 the direct product stays ahead of dequantize +
 * GEMM up to 16 rows for INT4 (tensor cores) but only to about 8 for INT8 and NF4. */
static int qmatmul_max_rows(int qtype) { return qtype == GLM_Q_INT4 ? 16 : 8; }

/* The weight of module i of layer l in S: w itself, or its quantized bytes dequantized into
 * qscratch (kept while the same matrix is asked for again, e.g. backward right after forward). */
static const void *linear_weight(glm_model *m, int l, int i, const void *w, int C, int OC) {
    if (w) return w;
    const void *q = m->w.layer[l].qw[i];
    GLM_ASSERT(q != NULL);
    if (m->qscratch_of != q) {
        m->be->dequantize(m->be, m->qscratch, q, m->cfg.quant, OC, C);
        m->qscratch_of = q;
    }
    return m->qscratch;
}

/* The adapter's down-projection of linear i: a->lora_t[i] = s dropout(inp) A^T [N, r]. */
static void lora_down(glm_model *m, int l, int i, glm_layer_acts *a, const void *inp, int N, int C) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l];
    int r = m->cfg.peft.lora_rank;
    lora_scratch(m, N);
    float s = glm_lora_scaling(&m->cfg.peft);
    if (!be->lora_down || !be->lora_down(be, a->lora_t[i], inp, p->lora_a[i], N, C, r, s, lora_dropout(m), lora_seed(m, l, i))) {
        const void *u = lora_input(m, l, i, inp, (size_t)N * C);
        be->matmul_fwd(be, a->lora_t[i], u, p->lora_a[i], NULL, N, C, r);
        be->mask_scale(be, a->lora_t[i], a->lora_t[i], (size_t)N * r, s, 0.0f, 0);
    }
}

/* out += the adapter's share of linear i, s B dropout(A inp) (nothing without an adapter);
 * B's product adds into out in its epilogue where the backend has one. */
static void lora_add(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, int N, int C, int OC) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l];
    if (!p->lora_a[i]) return;
    if (glm_lora_split(&m->cfg, i) > 1) { lora_add_split(m, l, i, a, out, inp, N, C, OC); return; }
    int r = m->cfg.peft.lora_rank;
    lora_down(m, l, i, a, inp, N, C);
    if (be->matmul_fwd_add) {
        be->matmul_fwd_add(be, out, a->lora_t[i], p->lora_b[i], NULL, out, 1.0f, N, r, OC);
        return;
    }
    be->matmul_fwd(be, m->lora_tmp, a->lora_t[i], p->lora_b[i], NULL, N, r, OC);
    be->scale_add(be, out, 1.0f, m->lora_tmp, out, (size_t)N * OC);
}

/* the product runs as a plain matmul_fwd (not the few-row quantized kernel) */
static int plain_product(const glm_model *m, const void *w, int N) {
    return w || N > qmatmul_max_rows(m->cfg.quant) || !m->be->qmatmul_fwd;
}

/* ---- DoRA (peft's use_dora): out = (m / n) (inp W^T + s B A inp) + b, n = ||W + s B A|| per
 * output row, held constant in the gradient (dropout: dora_fwd). z, the part the magnitude
 * scales, is kept in a->dora_z for its gradient. */

void glm_dora_forget(glm_model *m) {
    if (!m->dora_fresh) return;
    for (int k = 0; k < (m->layer_hi - m->layer_lo) * 4; k++) m->dora_fresh[k] = 0;
}

/* Module (l, i)'s place among the layers held, and its row norms in m->dora_n. */
static size_t dora_slot(const glm_model *m, int l, int i) { return (size_t)(l - m->layer_lo) * 4 + i; }
static float *dora_norm_row(const glm_model *m, int l, int i) {
    return m->dora_n + dora_slot(m, l, i) * glm_linear_out_max(&m->cfg);
}

/* Module (l, i)'s row norms [OC]: computed in every forward of a model that trains (the
 * optimizer may have moved the weights since the last), and once for a model made for inference
 * until its weights are loaded again. */
static const float *dora_norms(glm_model *m, int l, int i, const void *w, int C, int OC) {
    glm_backend *be = m->be;
    if (!m->dora_n) {
        size_t slots = (size_t)(m->layer_hi - m->layer_lo) * 4;
        m->dora_n = be->alloc(be, slots * glm_linear_out_max(&m->cfg) * sizeof(float));
        m->dora_fresh = glm_calloc(slots, sizeof(int));
    }
    size_t slot = dora_slot(m, l, i);
    float *n = dora_norm_row(m, l, i);
    if (!m->weights_fixed || m->training || !m->dora_fresh[slot]) {
        /* split q, k, v (glm_lora_split): each row block with its own adapter, ||W_k + s B_k A_k|| */
        const glm_layer_ptrs *p = &m->w.layer[l];
        const void *W = linear_weight(m, l, i, w, C, OC);
        int r = m->cfg.peft.lora_rank;
        int64_t row0[3], rows[3];
        for (int k = 0, S = glm_lora_blocks(&m->cfg, glm_lora_split(&m->cfg, i), OC, row0, rows); k < S; k++)
            be->dora_norm(be, n + row0[k], glm_at(be, W, (size_t)(row0[k] * C)), glm_at(be, p->lora_a[i], (size_t)k * r * C),
                          glm_at(be, p->lora_b[i], (size_t)row0[k] * r), glm_lora_scaling(&m->cfg.peft), (int)rows[k], C, r);
        m->dora_fresh[slot] = m->weights_fixed && !m->training;
    }
    return n;
}

/* The base weight of module i of layer l (NULL where it is quantized). */
static const void *module_weight(const glm_model *m, int l, int i) {
    const glm_layer_ptrs *p = &m->w.layer[l];
    const void *w[4] = {p->qkv_w, p->dense_w, p->fc1_w, p->fc2_w};
    return w[i];
}

void glm_dora_init_magnitudes(glm_model *m) {
    const glm_config *c = &m->cfg;
    float *host = glm_malloc((size_t)glm_linear_out_max(c) * sizeof(float));
    int training = m->training;
    m->training = 0;
    glm_dora_forget(m);
    for (int l = m->layer_lo; l < m->layer_hi; l++)
        for (int i = 0; i < 4; i++) {
            void *mag = m->w.layer[l].lora_m[i];
            if (!mag) continue;
            /* peft's: ||W + s B A|| at the adapter's creation */
            int OC = glm_linear_out(c, i);
            const float *n = dora_norms(m, l, i, module_weight(m, l, i), glm_linear_in(c, i), OC);
            m->be->download(m->be, host, n, (size_t)OC * sizeof(float));
            m->be->upload_f32(m->be, mag, host, (size_t)OC);
        }
    m->training = training;
    free(host);
}

/* inp W^T + b into out (the few-row quantized kernel where it applies) */
static void base_product(glm_model *m, int l, int i, void *out, const void *inp, const void *w, const void *b, int N, int C,
                         int OC) {
    if (plain_product(m, w, N)) m->be->matmul_fwd(m->be, out, inp, linear_weight(m, l, i, w, C, OC), b, N, C, OC);
    else m->be->qmatmul_fwd(m->be, out, inp, m->w.layer[l].qw[i], m->cfg.quant, b, N, C, OC);
}

/* out = the module's DoRA output + res_scale res (res NULL: none). Without dropout (p = 0):
 * z = inp W^T + s B A inp, out = c z + b, c = m / n. With dropout, peft's: the base takes inp,
 * the rest u = dropout(inp): out = inp W^T + b + (c - 1) u W^T + c s B A u, written as
 * z = u W^T + L, L = s B A u, out = inp W^T + b + (c - 1) z + L. */
static void dora_fwd(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, const void *w,
                     const void *b, int N, int C, int OC, const void *res, float res_scale) {
    glm_backend *be = m->be;
    const float *n = dora_norms(m, l, i, w, C, OC);
    const void *mag = m->w.layer[l].lora_m[i];
    void *z = a->dora_z[i];
    if (lora_dropout(m) <= 0) {
        base_product(m, l, i, z, inp, w, NULL, N, C, OC);
        lora_add(m, l, i, a, z, inp, N, C, OC);
        be->dora_scale(be, out, z, mag, n, 0.0f, b, res, res_scale, N, OC);
        return;
    }
    GLM_ASSERT(out != res);
    size_t no = (size_t)N * OC;
    if (glm_lora_split(&m->cfg, i) > 1) { /* each block its own u_k: z_k = u_k W_k^T + L_k */
        be->zero(be, z, no * glm_dtype_size(be->dtype));
        lora_add_split(m, l, i, a, z, inp, N, C, OC); /* z = L */
        base_product(m, l, i, out, inp, w, b, N, C, OC);
        if (res) be->scale_add(be, out, res_scale, res, out, no);
        be->scale_add(be, out, 1.0f, z, out, no); /* + L */
        const void *W = linear_weight(m, l, i, w, C, OC);
        void *blk = m->lora_tmp, *tmp = glm_at(be, m->lora_tmp, (size_t)N * glm_linear_out_max(&m->cfg)); /* [N, rows_k] */
        int64_t row0[3], rows[3];
        for (int k = 0, S = glm_lora_blocks(&m->cfg, glm_lora_split(&m->cfg, i), OC, row0, rows); k < S; k++) {
            const void *u = lora_input_seeded(m, inp, (size_t)N * C, split_seed(m, l, i, k));
            void *zk = glm_at(be, z, (size_t)row0[k]);
            be->copy_rows(be, blk, (size_t)rows[k], zk, (size_t)OC, (size_t)rows[k], (size_t)N);
            be->matmul_fwd(be, tmp, u, glm_at(be, W, (size_t)(row0[k] * C)), NULL, N, C, (int)rows[k]);
            be->scale_add(be, blk, 1.0f, tmp, blk, (size_t)N * rows[k]);
            be->copy_rows(be, zk, (size_t)OC, blk, (size_t)rows[k], (size_t)rows[k], (size_t)N);
        }
        be->dora_scale(be, out, z, mag, n, 1.0f, NULL, out, 1.0f, N, OC); /* + (c - 1) z */
        return;
    }
    lora_down(m, l, i, a, inp, N, C); /* t = s A u */
    void *L = m->lora_tmp;
    be->matmul_fwd(be, L, a->lora_t[i], m->w.layer[l].lora_b[i], NULL, N, m->cfg.peft.lora_rank, OC);
    base_product(m, l, i, z, lora_input(m, l, i, inp, (size_t)N * C), w, NULL, N, C, OC);
    be->scale_add(be, z, 1.0f, L, z, no);
    base_product(m, l, i, out, inp, w, b, N, C, OC);
    if (res) be->scale_add(be, out, res_scale, res, out, no);
    be->dora_scale(be, out, z, mag, n, 1.0f, NULL, out, 1.0f, N, OC);
    be->scale_add(be, out, 1.0f, L, out, no);
}

static void lora_bwd(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, const void *dout, const void *inp, int N,
                     int C, int OC);

/* dinp = dout W (+ res_scale res when res), in the product's epilogue where the backend has one */
static void input_grad(glm_model *m, void *dinp, const void *dout, const void *inp, const void *W, int N, int C, int OC,
                       const void *res, float res_scale) {
    glm_backend *be = m->be;
    if (res && be->matmul_bwd_add) { be->matmul_bwd_add(be, dinp, dout, W, res, res_scale, N, C, OC); return; }
    be->matmul_bwd(be, dinp, NULL, NULL, dout, inp, W, N, C, OC, 0);
    if (res) be->scale_add(be, dinp, res_scale, res, dinp, (size_t)N * C);
}

/* dmag +=; dA, dB += from c dout; dinp = c dout through W and the adapter (+ res_scale res).
 * With dropout: dinp = dout W + dropout((c - 1) dout W + the adapter's, from c dout). */
static void dora_bwd(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, const void *dout, const void *inp,
                     const void *w, int N, int C, int OC, const void *res, float res_scale) {
    glm_backend *be = m->be;
    const float *n = dora_norm_row(m, l, i); /* this step's, from the forward */
    void *gz = m->dora_g, *dmag = m->g.layer[l].lora_m[i];
    const void *mag = m->w.layer[l].lora_m[i], *W = dinp ? linear_weight(m, l, i, w, C, OC) : NULL;
    float p = lora_dropout(m);
    if (p <= 0) {
        be->dora_bwd(be, gz, dmag, dout, a->dora_z[i], mag, n, 0.0f, N, OC);
        if (dinp) input_grad(m, dinp, gz, inp, W, N, C, OC, res, res_scale);
        lora_bwd(m, l, i, a, dinp, gz, inp, N, C, OC);
        return;
    }
    be->dora_bwd(be, gz, dmag, dout, a->dora_z[i], mag, n, 1.0f, N, OC); /* (c - 1) dout: no cancellation */
    if (dinp) {
        input_grad(m, dinp, dout, inp, W, N, C, OC, res, res_scale);
        void *du = dropped_copy(m); /* the gradient at u, through the mask */
        int64_t row0[3], rows[3];
        int S = glm_lora_blocks(&m->cfg, glm_lora_split(&m->cfg, i), OC, row0, rows);
        for (int k = 0; k < S; k++) { /* split q, k, v: block k's (c - 1) dout through W_k and its own mask */
            const void *g = gz;
            if (S > 1) {
                be->copy_rows(be, m->lora_tmp, (size_t)rows[k], glm_at(be, gz, (size_t)row0[k]), (size_t)OC, (size_t)rows[k],
                              (size_t)N);
                g = m->lora_tmp;
            }
            be->matmul_bwd(be, du, NULL, NULL, g, NULL, glm_at(be, W, (size_t)(row0[k] * C)), N, C, (int)rows[k], 0);
            be->mask_scale(be, du, du, (size_t)N * C, 1.0f, p, S > 1 ? split_seed(m, l, i, k) : lora_seed(m, l, i));
            be->scale_add(be, dinp, 1.0f, du, dinp, (size_t)N * C);
        }
    }
    be->scale_add(be, gz, 1.0f, dout, gz, (size_t)N * OC); /* c dout */
    lora_bwd(m, l, i, a, dinp, gz, inp, N, C, OC);
}

void glm_linear_fwd(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, const void *w,
                       const void *b, int N, int C, int OC) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l];
    if (p->lora_m[i]) { dora_fwd(m, l, i, a, out, inp, w, b, N, C, OC, NULL, 0.0f); return; }
    if (p->lora_a[i] && be->matmul_fwd_add && plain_product(m, w, N) && glm_lora_split(&m->cfg, i) == 1) {
        /* the adapter's small product first, written once; the base product adds it in its
         * epilogue (rather than a second pass reading and writing the whole output) */
        lora_down(m, l, i, a, inp, N, C);
        be->matmul_fwd(be, out, a->lora_t[i], p->lora_b[i], NULL, N, m->cfg.peft.lora_rank, OC);
        be->matmul_fwd_add(be, out, inp, linear_weight(m, l, i, w, C, OC), b, out, 1.0f, N, C, OC);
        return;
    }
    base_product(m, l, i, out, inp, w, b, N, C, OC);
    lora_add(m, l, i, a, out, inp, N, C, OC);
}

void glm_linear_fwd_add(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, const void *w,
                        const void *b, int N, int C, int OC, const void *res, float res_scale) {
    glm_backend *be = m->be;
    if (m->w.layer[l].lora_m[i]) { dora_fwd(m, l, i, a, out, inp, w, b, N, C, OC, res, res_scale); return; }
    if (!be->matmul_fwd_add || !plain_product(m, w, N)) {
        glm_linear_fwd(m, l, i, a, out, inp, w, b, N, C, OC);
        be->scale_add(be, out, res_scale, res, out, (size_t)N * OC);
        return;
    }
    be->matmul_fwd_add(be, out, inp, linear_weight(m, l, i, w, C, OC), b, res, res_scale, N, C, OC);
    lora_add(m, l, i, a, out, inp, N, C, OC);
}


/* dinp = dout W (+ the adapter's share); dW, db += where they train; dA, dB += for the adapter.
 * dinp NULL: no input gradient (the products for it are skipped). */
void glm_linear_bwd(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db,
                       const void *dout, const void *inp, const void *w, int N, int C, int OC) {
    glm_backend *be = m->be;
    if (m->w.layer[l].lora_m[i]) { /* the base does not train under LoRA: no dw, db */
        GLM_ASSERT(!dw && !db);
        dora_bwd(m, l, i, a, dinp, dout, inp, w, N, C, OC, NULL, 0.0f);
        return;
    }
    if (dinp || dw || db) /* else a quantized weight is not even dequantized */
        be->matmul_bwd(be, dinp, dw, db, dout, inp, linear_weight(m, l, i, w, C, OC), N, C, OC, 0);
    lora_bwd(m, l, i, a, dinp, dout, inp, N, C, OC);
}

/* glm_linear_bwd with res_scale * res added to dinp (a residual's gradient), in the input
 * gradient's epilogue where the backend has one. */
void glm_linear_bwd_add(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OC, const void *res, float res_scale) {
    glm_backend *be = m->be;
    if (m->w.layer[l].lora_m[i]) {
        GLM_ASSERT(!dw && !db);
        dora_bwd(m, l, i, a, dinp, dout, inp, w, N, C, OC, res, res_scale);
        return;
    }
    const void *W = linear_weight(m, l, i, w, C, OC);
    if (dw || db) be->matmul_bwd(be, NULL, dw, db, dout, inp, W, N, C, OC, 0);
    input_grad(m, dinp, dout, inp, W, N, C, OC, res, res_scale);
    lora_bwd(m, l, i, a, dinp, dout, inp, N, C, OC);
}

/* the adapter's share of linear i's backward: dA, dB +=, dinp += (nothing without an adapter) */
static void lora_bwd(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, const void *dout, const void *inp, int N,
                     int C, int OC) {
    glm_backend *be = m->be;
    const glm_layer_ptrs *p = &m->w.layer[l], *g = &m->g.layer[l];
    if (!p->lora_a[i]) return;
    if (glm_lora_split(&m->cfg, i) > 1) { lora_bwd_split(m, l, i, a, dinp, dout, inp, N, C, OC); return; }
    int r = m->cfg.peft.lora_rank;
    /* t = s A u, out += B t: dB += dout^T t, dt = s (dout B), dA += dt^T u, du = dt A */
    void *dt = m->lora_tmp; /* [N, r] */
    be->matmul_bwd(be, dt, g->lora_b[i], NULL, dout, a->lora_t[i], p->lora_b[i], N, r, OC, 0);
    be->mask_scale(be, dt, dt, (size_t)N * r, glm_lora_scaling(&m->cfg.peft), 0.0f, 0);
    if (be->lora_down_bwd && be->lora_down_bwd(be, g->lora_a[i], dinp, dt, inp, p->lora_a[i], N, C, r, lora_dropout(m),
                                               lora_seed(m, l, i)))
        return;
    const void *u = lora_input(m, l, i, inp, (size_t)N * C);
    if (u == inp) { /* no dropout: du goes straight into dinp */
        be->matmul_bwd(be, dinp, g->lora_a[i], NULL, dt, u, p->lora_a[i], N, C, r, 1);
        return;
    }
    /* dropout: du through the same mask (lora_u, free again once dA is done) */
    be->matmul_bwd(be, NULL, g->lora_a[i], NULL, dt, u, p->lora_a[i], N, C, r, 0);
    if (!dinp) return;
    be->matmul_bwd(be, m->lora_u, NULL, NULL, dt, NULL, p->lora_a[i], N, C, r, 0);
    be->mask_scale(be, m->lora_u, m->lora_u, (size_t)N * C, 1.0f, m->cfg.peft.lora_dropout, lora_seed(m, l, i));
    be->scale_add(be, dinp, 1.0f, m->lora_u, dinp, (size_t)N * C);
}

void glm_linear_fwd_gelu(glm_model *m, int l, int i, glm_layer_acts *a, void *act, void *pre, const void *inp,
                         const void *w, const void *b, int N, int C, int OC) {
    glm_backend *be = m->be;
    if (be->matmul_fwd_gelu && !m->w.layer[l].lora_a[i] && plain_product(m, w, N)) {
        be->matmul_fwd_gelu(be, act, pre, inp, linear_weight(m, l, i, w, C, OC), b, N, C, OC);
        return;
    }
    glm_linear_fwd(m, l, i, a, pre, inp, w, b, N, C, OC);
    be->gelu_fwd(be, act, pre, (size_t)N * OC);
}

void glm_linear_bwd_dgelu(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db, const void *dout,
                          const void *inp, const void *w, const void *pre, int N, int C, int OC) {
    glm_backend *be = m->be;
    if (be->matmul_bwd_dgelu && !m->w.layer[l].lora_a[i]) {
        const void *W = linear_weight(m, l, i, w, C, OC);
        if (dw || db) be->matmul_bwd(be, NULL, dw, db, dout, inp, W, N, C, OC, 0);
        be->matmul_bwd_dgelu(be, dinp, dout, W, pre, N, C, OC);
        return;
    }
    glm_linear_bwd(m, l, i, a, dinp, dw, db, dout, inp, w, N, C, OC);
    be->gelu_bwd(be, dinp, pre, dinp, (size_t)N * C);
}

int glm_linear_reads_input(const glm_model *m, int l, int i) {
    /* from the tables, not the gradient views: ZeRO-2/3 bind those only when the unit's
     * backward begins */
    static const int kinds[4] = {T_QKV_W, T_DENSE_W, T_FC1_W, T_FC2_W};
    return glm_table_get(&m->tab, l, kinds[i]) != NULL || m->w.layer[l].lora_a[i] != NULL;
}

/* ---- P-Tuning v2: the prefix encoder (THUDM's PrefixEncoder) and the prefix keys/values */

static void ensure_prefix(glm_model *m) {
    if (!m->cfg.peft.prefix_projection || m->pkv) return;
    glm_backend *be = m->be;
    size_t es = glm_dtype_size(be->dtype), P = m->cfg.peft.pre_seq_len, H = m->cfg.hidden_size;
    size_t KV = glm_prefix_width(&m->cfg);
    if (m->cfg.peft.prefix_projection) {
        m->pkv = be->alloc(be, P * KV * es);
        m->prefix_h = be->alloc(be, P * H * es);
        m->dprefix_h = be->alloc(be, P * H * es);
    }
}

const void *glm_prefix_forward(glm_model *m) {
    ensure_prefix(m);
    const glm_weights *w = &m->w;
    if (!m->cfg.peft.prefix_projection) return w->prefix_emb; /* the embedding is the output */
    glm_backend *be = m->be;
    int P = m->cfg.peft.pre_seq_len, H = m->cfg.hidden_size, KV = glm_prefix_width(&m->cfg), E = glm_prefix_emb_width(&m->cfg);
    be->matmul_fwd(be, m->prefix_h, w->prefix_emb, w->prefix_w1, w->prefix_b1, P, E, H);
    be->tanh_fwd(be, m->prefix_h, m->prefix_h, (size_t)P * H);
    be->matmul_fwd(be, m->pkv, m->prefix_h, w->prefix_w2, w->prefix_b2, P, H, KV);
    return m->pkv;
}

/* Where the layers add their prefix key/value gradients: without the projection the prefix
 * embedding IS the keys/values, so straight into its gradient (no [P, 2LH] buffer), unless
 * ZeRO-2 places that gradient only when the embedding's unit begins (after the layers). */
static int prefix_grads_direct(const glm_model *m) { return !m->cfg.peft.prefix_projection && !m->grads_unit; }

static void *prefix_dkv(glm_model *m) {
    if (prefix_grads_direct(m)) return m->g.prefix_emb;
    if (!m->dpkv) {
        size_t P = m->cfg.peft.pre_seq_len, KV = glm_prefix_width(&m->cfg);
        m->dpkv = m->be->alloc(m->be, P * KV * glm_dtype_size(m->be->dtype));
    }
    return m->dpkv;
}

void glm_prefix_backward_begin(glm_model *m) {
    if (prefix_grads_direct(m)) return; /* accumulates into the gradient itself */
    size_t P = m->cfg.peft.pre_seq_len, KV = glm_prefix_width(&m->cfg);
    m->be->zero(m->be, prefix_dkv(m), P * KV * glm_dtype_size(m->be->dtype));
}

/* The gradient of the prefix keys/values (summed in dpkv over the layers) into the encoder's. */
void glm_prefix_backward(glm_model *m) {
    glm_backend *be = m->be;
    const glm_weights *w = &m->w, *g = &m->g;
    int P = m->cfg.peft.pre_seq_len, H = m->cfg.hidden_size, KV = glm_prefix_width(&m->cfg), E = glm_prefix_emb_width(&m->cfg);
    if (prefix_grads_direct(m)) return; /* already there */
    if (!m->cfg.peft.prefix_projection) {
        be->scale_add(be, g->prefix_emb, 1.0f, m->dpkv, g->prefix_emb, (size_t)P * KV);
        return;
    }
    be->matmul_bwd(be, m->dprefix_h, g->prefix_w2, g->prefix_b2, m->dpkv, m->prefix_h, w->prefix_w2, P, H, KV, 0);
    be->tanh_bwd(be, m->dprefix_h, m->prefix_h, m->dprefix_h, (size_t)P * H);
    be->matmul_bwd(be, g->prefix_emb, g->prefix_w1, g->prefix_b1, m->dprefix_h, w->prefix_emb, w->prefix_w1, P, E, H, 1);
}

static uint64_t prefix_seed(const glm_model *m, int l) { return m->dropout_seed ^ ((uint64_t)(l + 1) * 0xd1b54a32d192ed03ULL); }

/* The ChatGLM2 block's prefix + sequence keys/values, rows of KV = 2 NKV HD laid out [2, NKV,
 * HD] (k heads then v heads, as the k|v tail of its q|k|v rows and as the prefix encoder's
 * output per layer): batch row b's prefix is layer l's slice of the encoder output, dropped
 * out with a mask of its own (seed per layer and row), then its tokens' k|v. Built from
 * copy_rows and mask_scale, so every backend has it. */
static uint64_t prefix_row_seed(const glm_model *m, int l, int b) {
    return prefix_seed(m, l) + (uint64_t)(b + 1) * 0x9e3779b97f4a7c15ULL;
}

static void glm2_prefix_kv(glm_model *m, int l, const void *qkv, void *kv, int B, int T, float p) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    size_t P = c->peft.pre_seq_len, KVW = 2 * (size_t)glm_kv_heads(c) * glm_head_dim(c), W = glm_qkv_width(c);
    const void *pkv = c->peft.prefix_projection ? m->pkv : m->w.prefix_emb;
    for (int b = 0; b < B; b++) {
        void *row = glm_at(be, kv, (size_t)b * (P + T) * KVW);
        be->copy_rows(be, row, KVW, glm_at(be, pkv, (size_t)l * KVW), glm_prefix_width(c), KVW, P);
        if (p > 0) be->mask_scale(be, row, row, P * KVW, 1.0f, p, prefix_row_seed(m, l, b));
        if (T) be->copy_rows(be, glm_at(be, row, P * KVW), KVW, glm_at(be, qkv, (size_t)b * T * W + (W - KVW)), W, KVW, T);
    }
}

static void glm2_prefix_kv_grads(glm_model *m, int l, float p) {
    glm_backend *be = m->be;
    const glm_config *c = &m->cfg;
    int B = m->bd.B, T = m->bd.T;
    size_t P = c->peft.pre_seq_len, KVW = 2 * (size_t)glm_kv_heads(c) * glm_head_dim(c), W = glm_qkv_width(c);
    size_t PW = glm_prefix_width(c);
    void *acc = m->prefix_acc, *tmp = glm_at(be, m->prefix_acc, P * KVW);
    be->zero(be, acc, P * KVW * glm_dtype_size(be->dtype));
    for (int b = 0; b < B; b++) { /* the rows' prefix gradients summed in row order, each through its mask */
        const void *row = glm_at(be, m->dkvbuf, (size_t)b * (P + T) * KVW);
        be->mask_scale(be, tmp, row, P * KVW, 1.0f, p, prefix_row_seed(m, l, b));
        be->scale_add(be, acc, 1.0f, tmp, acc, P * KVW);
        be->copy_rows(be, glm_at(be, m->d_qkv, (size_t)b * T * W + (W - KVW)), W, glm_at(be, row, P * KVW), KVW, KVW, T);
    }
    void *dst = glm_at(be, prefix_dkv(m), (size_t)l * KVW); /* layer l's slice of [P, 2L NKV HD] */
    be->copy_rows(be, tmp, KVW, dst, PW, KVW, P);
    be->scale_add(be, tmp, 1.0f, acc, tmp, P * KVW);
    be->copy_rows(be, dst, PW, tmp, KVW, KVW, P);
}

/* Layer l's keys and values with the prefix in front, into kvbuf; k and v view them. */
void glm_prefix_kv_views(glm_model *m, int l, glm_layer_acts *a, glm_qkv_view *k, glm_qkv_view *v) {
    const glm_config *c = &m->cfg;
    int B = m->bd.B, T = m->bd.T, P = c->peft.pre_seq_len, H = c->hidden_size, HD = glm_head_dim(c);
    float p = m->training && !m->no_dropout ? c->peft.prefix_dropout : 0.0f;
    if (c->family == GLM_FAMILY_GLM2) {
        int NKV = glm_kv_heads(c), g = c->num_attention_heads / NKV;
        long KVW = 2L * NKV * HD;
        glm2_prefix_kv(m, l, a->qkv, m->kvbuf, B, T, p);
        *k = (glm_qkv_view){m->kvbuf, (long)(P + T) * KVW, KVW, HD, g};
        *v = *k;
        v->base = glm_at(m->be, m->kvbuf, (size_t)NKV * HD);
        return;
    }
    const void *pkv = c->peft.prefix_projection ? m->pkv : m->w.prefix_emb;
    m->be->prefix_kv(m->be, m->kvbuf, a->qkv, pkv, l, c->num_layers, B, T, P, c->num_attention_heads, HD, p,
                     prefix_seed(m, l));
    *k = (glm_qkv_view){m->kvbuf, (long)(P + T) * 2 * H, 2L * H, 2L * HD, 1};
    *v = *k;
    v->base = glm_at(m->be, m->kvbuf, HD);
}

void glm_prefix_kv_grads(glm_model *m, int l) {
    const glm_config *c = &m->cfg;
    float p = m->training && !m->no_dropout ? c->peft.prefix_dropout : 0.0f;
    if (c->family == GLM_FAMILY_GLM2) { glm2_prefix_kv_grads(m, l, p); return; }
    m->be->prefix_kv_bwd(m->be, m->d_qkv, prefix_dkv(m), m->dkvbuf, l, c->num_layers, m->bd.B, m->bd.T, c->peft.pre_seq_len,
                         c->num_attention_heads, glm_head_dim(c), p, prefix_seed(m, l));
}

void glm_prefix_fill_cache(glm_model *m, int l, void *row) {
    glm2_prefix_kv(m, l, NULL, row, 1, 0, 0.0f);
}
