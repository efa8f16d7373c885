/* The top layer's compact rows (model/glm.c choose_top_rows): past its attention the last
 * layer computes only the supervised rows. Against the same model computing every row
 * (keep_all_rows): the loss and every gradient, for both families, full fine-tuning, LoRA on
 * every module, P-Tuning v2 and freeze, each without checkpointing and with both levels, over
 * a padded batch whose prompts carry no labels; the same for evaluation's loss and for a
 * pipeline's last stage. Also: a batch whose every token is supervised (nothing to drop), the
 * recompute that checkpointing no longer runs for the top layer (its forward ran last), and a
 * weighed loss over a frozen head, whose product then runs once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/glm.h"
#include "micro_configs.h"
#include "test.h"

/* Three rows: prompt + [gMASK] <sop> + answer + <eop>, right padding; all_supervised: every
 * real token carries a label (the padding still none). */
static void make_batch(glm_batch *b, const glm_config *c, int all_supervised) {
    int lens_a[3] = {4, 2, 6}, lens_b[3] = {3, 5, 1};
    glm_rng rng;
    glm_rng_seed(&rng, 5);
    glm_batch_alloc(b, 3, 12);
    for (int r = 0; r < 3; r++) {
        int32_t ids[16], lab[16], n = 0;
        for (int i = 0; i < lens_a[r]; i++) ids[n++] = 4 + (int)glm_rng_below(&rng, 15);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        for (int i = 0; i < lens_b[r]; i++) ids[n++] = 4 + (int)glm_rng_below(&rng, 15);
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < n; i++) lab[i] = i < ctx && !all_supervised ? -100 : ids[(i + 1) % n];
        glm_batch_set_row(b, r, ids, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
}

static void randomize(glm_model *m) {
    glm_rng rng;
    glm_rng_seed(&rng, 11);
    for (int part = 0; part < 2; part++) {
        const glm_table *t = part ? &m->ftab : &m->tab;
        void *base = part ? m->fparams : m->params;
        if (!t->total) continue;
        float *h = calloc(t->total, sizeof(float));
        for (int i = 0; i < t->n; i++)
            for (size_t j = 0; j < t->t[i].numel; j++)
                h[t->t[i].offset + j] = (t->t[i].ndim == 2 ? 0.3f : 0.1f) * glm_rng_normal(&rng) +
                                         glm_is_norm_w(t->t[i].kind);
        m->be->upload_f32(m->be, base, h, t->total);
        free(h);
    }
}

typedef struct { double loss, eval; float *g; size_t n; } run_result;

/* A weighed loss (glm_forward_backward_weighted, as the preference losses use it): token i's
 * weight a fixed pattern of signs and sizes, the loss their weighted sum. The weights are powers
 * of two, so a gradient scaled by one before a product or after it is the same to the last bit. */
static double weigh_pattern(void *ctx, const glm_batch *b, const float *tok_loss, int n, float *w) {
    (void)ctx; (void)b;
    static const float pow2[5] = {-0.5f, 0.25f, 1.0f, -2.0f, 0.125f};
    double loss = 0;
    for (int i = 0; i < n; i++) {
        w[i] = pow2[i % 5];
        loss += (double)w[i] * tok_loss[i];
    }
    return loss;
}

/* One forward/backward (and an evaluation) of model kind ft at checkpointing level ckpt; with
 * weighed, the weighed loss's. */
static run_result run_loss(glm_config c, int ft, int ckpt, int keep_all, int all_supervised, int weighed);
static run_result run(glm_config c, int ft, int ckpt, int keep_all, int all_supervised) {
    return run_loss(c, ft, ckpt, keep_all, all_supervised, 0);
}
static run_result run_loss(glm_config c, int ft, int ckpt, int keep_all, int all_supervised, int weighed) {
    if (ft == GLM_FT_LORA) c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 2, .lora_alpha = 4, .lora_targets = GLM_LORA_ALL};
    if (ft == GLM_FT_PTUNING) c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = 3, .prefix_projection = 1};
    if (ft == GLM_FT_FREEZE) c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = 1};
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    randomize(&m);
    if (ft == GLM_FT_LORA || ft == GLM_FT_PTUNING) {
        glm_model_init_adapters(&m, 3);
        if (ft == GLM_FT_LORA) { /* B away from zero, so every adapter's path counts */
            float *h = calloc(m.tab.total, sizeof(float));
            for (size_t i = 0; i < m.tab.total; i++) h[i] = 0.05f * (float)((i * 7919) % 23) - 0.5f;
            glm_model_set_params(&m, h);
            free(h);
        }
    }
    m.gradient_checkpointing = ckpt;
    m.keep_all_rows = keep_all;
    glm_batch b;
    make_batch(&b, &c, all_supervised);
    glm_zero_grads(&m);
    run_result r = {.n = m.tab.total};
    r.loss = weighed ? glm_forward_backward_weighted(&m, &b, 1.0f / b.n_targets, weigh_pattern, NULL)
                     : glm_forward_backward(&m, &b, 1.0f / b.n_targets);
    r.g = malloc(r.n * sizeof(float));
    be->download_f32(be, r.g, m.grads, r.n);
    r.eval = glm_forward_loss(&m, &b);
    glm_batch_free(&b);
    glm_model_free(&m);
    be->destroy(be);
    return r;
}

static void compare(test_counts *tc, const char *family, glm_config c, int ft, int ckpt) {
    static const char *fts[] = {"full", "lora", "ptuning", "freeze"};
    run_result all = run(c, ft, ckpt, 1, 0), top = run(c, ft, ckpt, 0, 0);
    double worst = 0;
    for (size_t i = 0; i < all.n; i++) {
        double d = fabs((double)all.g[i] - top.g[i]) / (fabs(all.g[i]) + 1e-6);
        worst = d > worst ? d : worst;
    }
    char name[96];
    snprintf(name, sizeof name, "top_rows_%s_%s_%s", family, fts[ft], glm_ckpt_level_name(ckpt));
    /* the same sums in the same order: equal to the last bit on the CPU */
    TEST_CHECK(tc, name, all.loss == top.loss && all.eval == top.eval && worst == 0,
               "loss %.9g vs %.9g, eval %.9g vs %.9g, worst relative gradient difference %.3g", all.loss, top.loss,
               all.eval, top.eval, worst);
    free(all.g); free(top.g);
}

/* The pipeline's last stage compacts too: its loss and gradients over the same h_in; a last
 * stage of no layers (the final norm and the head alone: l0 = 3) reads every row it is given. */
static void test_last_stage(test_counts *tc, int l0) {
    glm_config c = micro_v1_config();
    glm_backend *be = glm_backend_cpu();
    double loss[2];
    float *g[2] = {0};
    size_t n = 0;
    glm_batch b;
    make_batch(&b, &c, 0);
    size_t N = (size_t)b.B * b.T, H = (size_t)c.hidden_size;
    glm_rng rng;
    glm_rng_seed(&rng, 17);
    float *h_host = malloc(N * H * sizeof(float));
    for (size_t i = 0; i < N * H; i++) h_host[i] = glm_rng_normal(&rng);
    for (int keep = 0; keep < 2; keep++) {
        glm_model st;
        glm_model_init_stage(&st, &c, be, l0, 3, 0, 1);
        randomize(&st);
        st.keep_all_rows = keep;
        void *h_in = be->alloc(be, N * H * glm_dtype_size(be->dtype)), *dh_in = be->alloc(be, N * H * glm_dtype_size(be->dtype));
        be->upload_f32(be, h_in, h_host, N * H);
        glm_zero_grads(&st);
        loss[keep] = glm_stage_backward(&st, &b, h_in, NULL, dh_in, 1.0f / b.n_targets);
        n = st.tab.total;
        g[keep] = malloc((n + N * H) * sizeof(float));
        be->download_f32(be, g[keep], st.grads, n);
        be->download_f32(be, g[keep] + n, dh_in, N * H); /* the input's gradient, handed to the stage before */
        be->free(be, h_in);
        be->free(be, dh_in);
        glm_model_free(&st);
    }
    TEST_CHECK(tc, l0 < 3 ? "top_rows_last_stage" : "top_rows_last_stage_without_layers", loss[0] == loss[1] && memcmp(g[0], g[1], (n + N * H) * sizeof(float)) == 0,
               "loss %.9g vs %.9g, or the gradients differ", loss[0], loss[1]);
    free(g[0]); free(g[1]); free(h_host);
    glm_batch_free(&b);
    be->destroy(be);
}

/* Nothing to drop when every real token is supervised but the padding: still equal, and the
 * choice is made per batch. */
static void test_mostly_supervised(test_counts *tc) {
    run_result all = run(micro_v1_config(), GLM_FT_FULL, GLM_CKPT_NONE, 1, 1), top = run(micro_v1_config(), GLM_FT_FULL, GLM_CKPT_NONE, 0, 1);
    TEST_CHECK(tc, "top_rows_every_token_supervised", all.loss == top.loss && memcmp(all.g, top.g, all.n * 4) == 0,
               "loss %.9g vs %.9g", all.loss, top.loss);
    free(all.g); free(top.g);
}

/* The recompute checkpointing skips for the top layer: one layer's forward fewer. */
static int qkv_products, head_products;
static void (*real_matmul_fwd)(glm_backend *, void *, const void *, const void *, const void *, int, int, int);
static void counting_matmul_fwd(glm_backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC) {
    qkv_products += OC == 3 * 16; /* v1_config's q|k|v width */
    head_products += OC == 24;    /* its vocabulary */
    real_matmul_fwd(be, out, inp, w, bias, N, C, OC);
}

/* One forward/backward of v1_config (LoRA on every module with lora; the weighed loss with
 * weighed) at checkpointing level ckpt, its products counted (qkv_products, head_products). */
static void count_products(int lora, int weighed, int ckpt) {
    glm_config c = micro_v1_config();
    if (lora) c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 2, .lora_alpha = 4, .lora_targets = GLM_LORA_ALL};
    glm_backend *be = glm_backend_cpu();
    real_matmul_fwd = be->matmul_fwd;
    be->matmul_fwd = counting_matmul_fwd;
    glm_model m;
    glm_model_init(&m, &c, be);
    randomize(&m);
    if (lora) glm_model_init_adapters(&m, 3);
    m.gradient_checkpointing = ckpt;
    glm_batch b;
    make_batch(&b, &c, 0);
    qkv_products = head_products = 0;
    glm_zero_grads(&m);
    if (weighed) glm_forward_backward_weighted(&m, &b, 1.0f / b.n_targets, weigh_pattern, NULL);
    else glm_forward_backward(&m, &b, 1.0f / b.n_targets);
    glm_batch_free(&b);
    glm_model_free(&m);
    be->destroy(be);
}

/* A weighed loss (the preference losses') over a head that does not train: its input gradient is
 * made once with unit weights and each row scaled after (model/glm.c weigh_tokens), where the
 * head's rows kept whole (keep_all_rows) take the weights before the product. With weights that
 * are powers of two the loss and every gradient are the same to the last bit (with a head that
 * trains both paths take the weights first). The head's product: once a micro-batch for a frozen
 * head, twice for one that trains. */
static void test_weighed_frozen_head(test_counts *tc) {
    static const char *fts[] = {"full", "lora", "ptuning", "freeze"};
    for (int fam = 0; fam < 2; fam++)
        for (int ft = GLM_FT_FULL; ft <= GLM_FT_FREEZE; ft++) {
            if (ft == GLM_FT_PTUNING) continue;
            glm_config c = fam ? micro_v2_config() : micro_v1_config();
            run_result all = run_loss(c, ft, GLM_CKPT_NONE, 1, 0, 1), top = run_loss(c, ft, GLM_CKPT_NONE, 0, 0, 1);
            double worst = 0;
            for (size_t i = 0; i < all.n; i++) {
                double d = fabs((double)all.g[i] - top.g[i]) / (fabs(all.g[i]) + 1e-6);
                worst = d > worst ? d : worst;
            }
            char name[96];
            snprintf(name, sizeof name, "weighed_loss_%s_%s_top_rows_equal_all_rows", fam ? "chatglm2" : "chatglm", fts[ft]);
            TEST_CHECK(tc, name, all.loss == top.loss && worst == 0,
                       "loss %.9g vs %.9g, worst relative gradient difference %.3g", all.loss, top.loss, worst);
            free(all.g); free(top.g);
        }
    int count[2];
    for (int lora = 0; lora < 2; lora++) {
        count_products(lora, 1, GLM_CKPT_NONE);
        count[lora] = head_products;
    }
    TEST_CHECK(tc, "weighed_loss_frozen_head_one_product", count[0] == 2 && count[1] == 1,
               "the head's products: full fine-tuning %d, LoRA %d", count[0], count[1]);
}
static void test_top_layer_not_recomputed(test_counts *tc) {
    int count[3];
    for (int ckpt = 0; ckpt < 3; ckpt++) {
        count_products(0, 0, ckpt);
        count[ckpt] = qkv_products;
    }
    /* 3 layers: the forward's 3, and with full checkpointing the recompute of the 2 below the top */
    TEST_CHECK(tc, "top_layer_not_recomputed", count[GLM_CKPT_NONE] == 3 && count[GLM_CKPT_FULL] == 5 &&
                   count[GLM_CKPT_SELECTIVE] == 3, "q|k|v products: none %d, full %d, selective %d",
               count[0], count[1], count[2]);
}

int main(void) {
    test_counts tc = {0};
    for (int fam = 0; fam < 2; fam++)
        for (int ft = GLM_FT_FULL; ft <= GLM_FT_FREEZE; ft++)
            for (int ckpt = GLM_CKPT_NONE; ckpt <= GLM_CKPT_SELECTIVE; ckpt++)
                compare(&tc, fam ? "chatglm2" : "chatglm", fam ? micro_v2_config() : micro_v1_config(), ft, ckpt);
    test_last_stage(&tc, 1);
    test_last_stage(&tc, 3);
    test_mostly_supervised(&tc);
    test_top_layer_not_recomputed(&tc);
    test_weighed_frozen_head(&tc);
    TEST_EXIT(&tc);
}
