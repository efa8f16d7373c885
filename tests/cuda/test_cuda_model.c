/* The whole model on the CUDA backend against the CPU backend (the oracle):
 *  - the THUDM oracle (glm_model.data, via GLM_SHARED) through the CUDA fp32 path + KV cache;
 *  - forward + backward of a tiny and a medium config (head size 8 and 128: SIMT and
 *    tensor-core attention): loss and every gradient tensor, CUDA fp32 / bf16 vs CPU fp32,
 *    with gradient checkpointing bit-identical and repeated runs bit-identical on the GPU;
 *  - a 50-step AdamW run (with clipping) whose loss follows the CPU fp32 curve. */
#include <stdlib.h>
#include "core/fileutil.h"
#include "cuda_test_util.h"
#include "oracle.h"
#include "model/glm.h"
#include "model/peft.h"
#include "model/pissa.h"
#include "optim/adamw.h"
#include "train/pref.h"

/* ---------------------------------------------------------------- oracle */

static void test_oracle(test_counts *tc) {
    glm_err err;
    glm_backend *be = glm_backend_cuda(0, GLM_F32, err.msg, sizeof err.msg);
    if (!be) { TEST_FAIL(tc, "cuda_oracle_glm_model", "%s", err.msg); return; }
    double e[3];
    int rc = oracle_glm_model(be, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, "cuda_oracle_glm_model", "%s/oracles not found (set GLM_SHARED)", oracle_dir()); return; }
    TEST_CHECK(tc, "cuda_f32_oracle_glm_prompt", rc == 0 && e[0] < 1e-5, "max abs err %.3g", e[0]);
    TEST_CHECK(tc, "cuda_f32_oracle_glm_decode_step1", rc == 0 && e[1] < 1e-5, "max abs err %.3g", e[1]);
    TEST_CHECK(tc, "cuda_f32_oracle_glm_decode_step2", rc == 0 && e[2] < 1e-5, "max abs err %.3g", e[2]);
    printf("  cuda fp32 oracle max abs errors: prompt %.3g, step1 %.3g, step2 %.3g\n", e[0], e[1], e[2]);
}

/* The ChatGLM2 oracle (glm2_model.data) through the CUDA fp32 path + its k|v cache. */
static void test_oracle_glm2(test_counts *tc) {
    glm_err err;
    glm_backend *be = glm_backend_cuda(0, GLM_F32, err.msg, sizeof err.msg);
    if (!be) { TEST_FAIL(tc, "cuda_oracle_glm2_model", "%s", err.msg); return; }
    double e[3];
    int rc = oracle_glm2_run(be, "glm2_model.data", 0, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, "cuda_oracle_glm2_model", "%s/oracles not found (set GLM_SHARED)", oracle_dir()); return; }
    TEST_CHECK(tc, "cuda_f32_oracle_glm2", rc == 0 && e[0] < 1e-5 && e[1] < 1e-5 && e[2] < 1e-5,
               "max abs err %.3g %.3g %.3g", e[0], e[1], e[2]);
    printf("  cuda fp32 ChatGLM2 oracle max abs errors: prompt %.3g, step1 %.3g, step2 %.3g\n", e[0], e[1], e[2]);
}

/* ---------------------------------------------------------------- configs, batches, weights */

static glm_config config(int medium);
/* The ChatGLM2 block on the same sizes: attention width NH*HD != H, 2 key/value groups (the
 * medium one takes the tensor-core attention at head size 128). */
static glm_config config_glm2(int medium) {
    glm_config c = config(medium);
    c.family = GLM_FAMILY_GLM2;
    c.num_attention_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = medium ? 128 : 8;
    c.qkv_bias = 1;
    c.rope_theta = 10000.0f;
    c.alpha = 1.0f;
    c.position_encoding_2d = 0;
    return c;
}

static glm_config config(int medium) {
    glm_config c = {.vocab_size = 24, .hidden_size = 16, .num_layers = 2, .num_attention_heads = 2,
                    .inner_hidden_size = 32, .max_sequence_length = 512, .layernorm_epsilon = 1e-5f,
                    .position_encoding_2d = 1, .tie_word_embeddings = 0, .bos_token_id = 21, .eos_token_id = 22,
                    .mask_token_id = 19, .gmask_token_id = 20, .pad_token_id = 3, .alpha = 7.483314773547883f};
    if (medium) {
        c.vocab_size = 1000; c.hidden_size = 256; c.num_attention_heads = 2; c.inner_hidden_size = 1024;
        c.mask_token_id = 995; c.gmask_token_id = 996; c.bos_token_id = 997; c.eos_token_id = 998;
    }
    return c;
}

/* Rows of prompt + [gMASK] <sop> answer <eop>, random lengths, right padding. */
static void make_batch(glm_batch *b, const glm_config *c, glm_rng *r, int B, int T) {
    glm_batch_alloc(b, B, T);
    int32_t *ids = malloc(sizeof(int32_t) * T), *lab = malloc(sizeof(int32_t) * T);
    int top = c->vocab_size < 100 ? 15 : c->vocab_size - 10;
    for (int row = 0; row < B; row++) {
        int n = 0, na = 1 + (int)glm_rng_below(r, (T - 4) / 2), np = 1 + (int)glm_rng_below(r, T - 4 - na);
        for (int i = 0; i < np; i++) ids[n++] = 4 + (int)glm_rng_below(r, top);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        for (int i = 0; i < na; i++) ids[n++] = 4 + (int)glm_rng_below(r, top);
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < n; i++) lab[i] = i < ctx ? -100 : ids[i];
        glm_batch_set_row(b, row, ids, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
    free(ids);
    free(lab);
}

/* Random weights with non-trivial LayerNorm parameters and biases, representable in dt. */
static float *random_weights(const glm_table *tab, uint64_t seed, glm_dtype dt, float mat_std) {
    float *h = calloc(tab->total, sizeof(float));
    glm_rng rng;
    glm_rng_seed(&rng, seed);
    for (int i = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        int lnw = glm_is_norm_w(t->kind);
        for (size_t j = 0; j < t->numel; j++)
            h[t->offset + j] = round_one(dt, lnw ? 1.0f + 0.2f * glm_rng_normal(&rng)
                                                 : (t->ndim == 2 ? mat_std : 0.05f) * glm_rng_normal(&rng));
    }
    return h;
}

/* ---------------------------------------------------------------- forward + backward */

static float *grads_of(glm_model *m, const glm_batch *b, double *loss) {
    glm_zero_grads(m);
    *loss = glm_forward_backward(m, b, 1.0f / b->n_targets) / b->n_targets;
    float *g = malloc(sizeof(float) * m->tab.total);
    m->be->download_f32(m->be, g, m->grads, m->tab.total);
    return g;
}

/* Gradients with selective checkpointing (*gs) and without checkpointing (*gn), the second with
 * the first MLP product's GELU epilogue off: a selective run whose backward rebuilds the
 * activation makes it with gelu_fwd in forward too, so the two then run the same sums. */
static void selective_and_none(glm_model *m, const glm_batch *b, float **gs, double *ls, float **gn, double *ln) {
    glm_model_set_checkpointing(m, GLM_CKPT_SELECTIVE);
    *gs = grads_of(m, b, ls);
    void (*fused)(glm_backend *, void *, void *, const void *, const void *, const void *, int, int, int) =
        m->be->matmul_fwd_gelu;
    glm_model_set_checkpointing(m, GLM_CKPT_NONE);
    int rebuilds_act = 0;
    for (int l = 0; l < m->cfg.num_layers; l++) rebuilds_act |= glm_linear_reads_input(m, l, 3);
    if (rebuilds_act) m->be->matmul_fwd_gelu = NULL;
    *gn = grads_of(m, b, ln);
    m->be->matmul_fwd_gelu = fused;
}

/* glm2: 0 GLM v1, 1 the ChatGLM2 block, 2 GLM-4-0414's (its two more norms a layer) */
static void test_fwd_bwd(test_counts *tc, int medium, glm_dtype dt, int glm2) {
    char name[160], err[256];
    glm_config c = glm2 ? config_glm2(medium) : config(medium);
    c.sandwich_norms = glm2 == 2;
    int B = medium ? 3 : 2, T = medium ? 150 : 12;
    const char *cfg = glm2 == 2 ? (medium ? "glm4_0414_medium" : "glm4_0414_tiny")
                      : glm2 ? (medium ? "glm2_medium" : "glm2_tiny") : medium ? "medium" : "tiny";
    glm_backend *cpu = glm_backend_cpu(), *gpu = glm_backend_cuda(0, dt, err, sizeof err);
    glm_model mc, mg;
    glm_model_init(&mc, &c, cpu);
    glm_model_init(&mg, &c, gpu);
    float *w = random_weights(&mc.tab, 7, dt, medium ? 0.05f : 0.3f);
    glm_model_set_params(&mc, w);
    glm_model_set_params(&mg, w);
    glm_rng rng;
    glm_rng_seed(&rng, 11 + medium);
    glm_batch b;
    make_batch(&b, &c, &rng, B, T);
    double lc, lg, lg2, lg3;
    float *gc = grads_of(&mc, &b, &lc), *gg = grads_of(&mg, &b, &lg);
    double tl = dt == GLM_F32 ? 1e-5 : 2e-2, tg = dt == GLM_F32 ? 1e-4 : 5e-2;
    double el = fabs(lg - lc) / fabs(lc);
    snprintf(name, sizeof name, "model_%s_%s_loss", cfg, dt_name(dt));
    TEST_CHECK(tc, name, el <= tl, "cuda %.7f cpu %.7f rel %.3g > %.3g", lg, lc, el, tl);
    printf("  %s: cuda %.7f cpu %.7f rel err %.3g\n", name, lg, lc, el);
    double worst = 0;
    const char *wname = "";
    for (int i = 0; i < mc.tab.n; i++) {
        const glm_tensor *t = &mc.tab.t[i];
        double e = norm_rel_err(gg + t->offset, gc + t->offset, t->numel);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; wname = t->name; }
    }
    snprintf(name, sizeof name, "model_%s_%s_grads", cfg, dt_name(dt));
    TEST_CHECK(tc, name, worst <= tg, "worst tensor %s: ||cuda-cpu||/||cpu|| = %.3g > %.3g", wname, worst, tg);
    printf("  %s: worst tensor %s, norm rel err %.3g (tol %.3g)\n", name, wname, worst, tg);
    /* the GPU repeats itself, and checkpointing recomputes the same numbers */
    float *g2 = grads_of(&mg, &b, &lg2);
    snprintf(name, sizeof name, "model_%s_%s_deterministic", cfg, dt_name(dt));
    TEST_CHECK(tc, name, memcmp(g2, gg, sizeof(float) * mg.tab.total) == 0 && lg2 == lg, "two runs differ");
    glm_model_set_checkpointing(&mg, GLM_CKPT_FULL);
    float *g3 = grads_of(&mg, &b, &lg3);
    snprintf(name, sizeof name, "model_%s_%s_checkpointing_bit_identical", cfg, dt_name(dt));
    TEST_CHECK(tc, name, memcmp(g3, gg, sizeof(float) * mg.tab.total) == 0 && lg3 == lg, "gradients differ");
    float *g4, *g5;
    double lg5;
    selective_and_none(&mg, &b, &g4, &lg3, &g5, &lg5);
    snprintf(name, sizeof name, "model_%s_%s_selective_checkpointing_bit_identical", cfg, dt_name(dt));
    TEST_CHECK(tc, name, memcmp(g4, g5, sizeof(float) * mg.tab.total) == 0 && lg3 == lg5, "gradients differ");
    free(w); free(gc); free(gg); free(g2); free(g3); free(g4); free(g5);
    glm_batch_free(&b);
    glm_model_free(&mc);
    glm_model_free(&mg);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
}

/* ---------------------------------------------------------------- training curve */

/* steps AdamW steps of model m over the batches in turn (a dropout seed per step: the same
 * masks on every backend), losses[s] before step s; frees m. */
static void adamw_curve(glm_model *m, glm_batch *batches, int nb, int steps, double *losses) {
    glm_adamw o;
    glm_adamw_init(&o, m, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.01f);
    /* fp16 storage trains as it is trained (--fp16): a loss scale keeps the small gradients
     * from flushing to zero; bf16 and fp32 need none (a power of two: exact elsewhere) */
    const float S = m->be->dtype == GLM_F16 ? 1024.0f : 1.0f;
    for (int s = 0; s < steps; s++) {
        glm_batch *b = &batches[s % nb];
        glm_model_set_dropout_seed(m, 1000 + s);
        glm_zero_grads(m);
        losses[s] = glm_forward_backward(m, b, S / b->n_targets) / b->n_targets;
        double norm = glm_grad_norm(m, 1.0f / S);
        glm_adamw_step(&o, m, 2e-3f, glm_clip_coef(norm, 1.0f) / S);
    }
    glm_adamw_free(&o, m);
    glm_model_free(m);
}

static void train_curve(glm_backend *be, const glm_config *c, const float *w, glm_batch *batches, int nb, int steps,
                        double *losses) {
    glm_model m;
    glm_model_init(&m, c, be);
    glm_model_set_params(&m, w);
    adamw_curve(&m, batches, nb, steps, losses);
}

static void test_training(test_counts *tc, glm_dtype h16) {
    enum { STEPS = 50, NB = 4 };
    char err[256], name[96];
    const char *hn = dt_name(h16);
    glm_config c = config(1);
    glm_table tab;
    glm_table_build(&tab, &c);
    float *w = random_weights(&tab, 21, h16, 0.02f); /* representable in h16: same start everywhere */
    glm_table_free(&tab);
    glm_rng rng;
    glm_rng_seed(&rng, 5);
    glm_batch bs[NB];
    for (int i = 0; i < NB; i++) make_batch(&bs[i], &c, &rng, 4, 96);
    double cpu[STEPS], f32[STEPS], b16[STEPS];
    glm_backend *be = glm_backend_cpu();
    train_curve(be, &c, w, bs, NB, STEPS, cpu);
    be->destroy(be);
    be = glm_backend_cuda(0, GLM_F32, err, sizeof err);
    train_curve(be, &c, w, bs, NB, STEPS, f32);
    be->destroy(be);
    be = glm_backend_cuda(0, h16, err, sizeof err);
    train_curve(be, &c, w, bs, NB, STEPS, b16);
    be->destroy(be);
    double m32 = 0, m16 = 0, mean16 = 0;
    printf("  step   cpu_f32    cuda_f32   cuda_%s\n", hn);
    for (int s = 0; s < STEPS; s++) {
        double e32 = fabs(f32[s] - cpu[s]) / cpu[s], e16 = fabs(b16[s] - cpu[s]) / cpu[s];
        if (e32 > m32 || e32 != e32) m32 = e32 != e32 ? INFINITY : e32;
        if (e16 > m16 || e16 != e16) m16 = e16 != e16 ? INFINITY : e16;
        mean16 += e16 / STEPS;
        if (s % 5 == 0 || s == STEPS - 1) printf("  %4d  %9.5f  %9.5f  %9.5f\n", s, cpu[s], f32[s], b16[s]);
    }
    TEST_CHECK(tc, "train50_cuda_f32_follows_cpu", m32 <= 1e-3, "max rel deviation %.3g", m32);
    snprintf(name, sizeof name, "train50_cuda_%s_follows_cpu", hn);
    TEST_CHECK(tc, name, m16 <= 5e-2 && mean16 <= 2e-2, "max rel deviation %.3g, mean %.3g", m16, mean16);
    TEST_CHECK(tc, "train50_loss_decreases", cpu[STEPS - 1] < 0.7 * cpu[0] && b16[STEPS - 1] < 0.7 * b16[0],
               "cpu %.4f -> %.4f, %s %.4f -> %.4f", cpu[0], cpu[STEPS - 1], hn, b16[0], b16[STEPS - 1]);
    printf("  train50: max rel deviation from cpu: f32 %.3g, %s %.3g (mean %.3g)\n", m32, hn, m16, mean16);
    for (int i = 0; i < NB; i++) glm_batch_free(&bs[i]);
    free(w);
}

/* ---------------------------------------------------------------- LoRA (frozen base + adapters) */

/* The medium model under c.peft on be: a random base, then random trainable rows (std
 * trainable_std), all representable in dt so both backends start from the same numbers. */
static void peft_model_cfg(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed, glm_config c, glm_peft peft,
                           float trainable_std, int quant) {
    c.peft = peft;
    c.quant = quant; /* the frozen linear weights quantized as they upload (the same bytes on both backends) */
    glm_model_init(m, &c, be);
    glm_table base;
    glm_table_build(&base, &c);
    float *w = random_weights(&base, seed, dt, 0.05f);
    for (int i = 0; i < base.n; i++) {
        void *p;
        const glm_tensor *t = glm_model_find(m, base.t[i].name, &p);
        GLM_ASSERT(t);
        glm_model_row_upload(m, t, p, w + base.t[i].offset);
    }
    free(w);
    glm_table_free(&base);
    float *a = random_weights(&m->tab, seed + 1, dt, trainable_std);
    for (int i = 0; i < m->tab.n; i++) { /* DoRA's magnitudes: positive, near the base's row norms */
        const glm_tensor *t = &m->tab.t[i];
        if (!glm_is_dora(t->kind)) continue;
        int in = glm_table_get(&m->tab, t->layer, glm_lora_kind(glm_lora_module(t->kind), 0))->shape[1];
        for (size_t j = 0; j < t->numel; j++)
            a[t->offset + j] = round_one(dt, 0.05f * sqrtf((float)in) * (1.0f + 0.2f * a[t->offset + j] / 0.05f));
    }
    glm_model_set_params(m, a);
    free(a);
}
static void peft_model_fam(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed, glm_peft peft, float trainable_std,
                           int quant, int glm2) {
    peft_model_cfg(m, be, dt, seed, glm2 ? config_glm2(1) : config(1), peft, trainable_std, quant);
}

static void peft_model_q(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed, glm_peft peft, float trainable_std,
                         int quant) {
    peft_model_fam(m, be, dt, seed, peft, trainable_std, quant, 0);
}

static void peft_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed, glm_peft peft, float trainable_std) {
    peft_model_q(m, be, dt, seed, peft, trainable_std, GLM_Q_NONE);
}

/* LoRA on every linear module with dropout 0.1 (the mask is the same on both backends), B non-zero. */
static void lora_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model(m, be, dt, seed,
               (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
               0.05f);
}

/* --stage rm's model: lora_model's adapters and the value head, its input's dropout 0.1. */
static void lora_rm_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    glm_config c = config(1);
    c.value_head = 1;
    c.value_head_dropout = 0.1f;
    peft_model_cfg(m, be, dt, seed, c,
                   (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                   0.05f, GLM_Q_NONE);
}

/* PiSSA's start (model/pissa.h) on every module: the randomized SVD runs on the GPU's float
 * product there and on the host's for the CPU; the start, the residual base, then the loss and
 * gradients must agree as any LoRA model's. */
static void pissa_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model(m, be, dt, seed,
               (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f,
                          .lora_targets = GLM_LORA_ALL, .pissa = 1, .pissa_niter = 4},
               0.05f);
    glm_err err;
    GLM_ASSERT(glm_pissa_init(m, seed, &err) == 0);
}

/* The same with NEFTune's noise on the embeddings (alpha 5): the same draws on both backends. */
static void lora_neftune_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    lora_model(m, be, dt, seed);
    m->cfg.neftune_alpha = 5.0f;
}

/* DoRA on every linear module (without dropout, its default, and with), B non-zero: the row norms, the
 * row scale and the magnitude's gradient on both backends; on an INT4 base and in the ChatGLM2
 * block too. */
static const glm_peft dora_all = {.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_targets = GLM_LORA_ALL,
                                  .use_dora = 1};
static void dora_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) { peft_model(m, be, dt, seed, dora_all, 0.05f); }
static void dora_dropout_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    glm_peft p = dora_all;
    p.lora_dropout = 0.1f; /* peft's second base product on the dropped-out input; the same masks on both backends */
    peft_model(m, be, dt, seed, p, 0.05f);
}
static void dora_int4_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed, dora_all, 0.05f, GLM_Q_INT4);
}
/* transformers' layout: q, k and v with adapters, magnitudes and row norms of their own */
static void dora_glm2_hf_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed, float dropout) {
    glm_config c = config_glm2(1);
    c.hf_layout = 1;
    glm_peft p = dora_all;
    p.lora_dropout = dropout;
    peft_model_cfg(m, be, dt, seed, c, p, 0.05f, GLM_Q_NONE);
}
static void dora_glm2_hf_nodrop_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    dora_glm2_hf_model(m, be, dt, seed, 0.0f);
}
static void dora_glm2_hf_dropout_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    dora_glm2_hf_model(m, be, dt, seed, 0.1f);
}
static void dora_glm2_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_fam(m, be, dt, seed, dora_all, 0.05f, GLM_Q_NONE, 1);
}

/* Freeze with LLaMA-Factory's module flags (n > 0 the last layers, n < 0 the first): v1's first
 * two layers' MLPs (both of the model's: selective_and_none's GELU switch is the backend's, for
 * every layer at once) with the embedding and the final norm on an INT4 base (layers holding
 * quantized attention beside a float MLP that trains); ChatGLM2's last layer's attention with its
 * untied output_layer. */
static glm_peft freeze_peft(int glm2, int n, const char *modules, const char *extra) {
    glm_config c = glm2 ? config_glm2(1) : config(1);
    glm_peft p = {.kind = GLM_FT_FREEZE, .num_layer_trainable = n};
    glm_err e;
    GLM_ASSERT(glm_modules_parse(&c, "modules", modules, 0, &p.freeze_modules, &e) == 0 &&
               glm_modules_parse(&c, "extra", extra, 1, &p.extra_modules, &e) == 0);
    return p;
}
static void freeze_int4_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed, freeze_peft(0, -2, "mlp", "word_embeddings,final_layernorm"), 0.05f, GLM_Q_INT4);
}
static void freeze_glm2_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_fam(m, be, dt, seed, freeze_peft(1, 1, "self_attention", "output_layer"), 0.05f, GLM_Q_NONE, 1);
}

/* LoRA on query_key_value with peft's modules_to_save of the untied head and the final norm, on
 * an INT8 base: the adapters' gradients and the whole rows' on both backends. */
static void lora_whole_int8_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed,
                 (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f,
                            .lora_targets = GLM_LORA_QKV, .extra_modules = GLM_EXTRA_HEAD | GLM_EXTRA_LNF},
                 0.05f, GLM_Q_INT8);
}

/* P-Tuning v2 with the projection and the prefix dropout 0.1. */
static void ptuning_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model(m, be, dt, seed, (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = 8, .prefix_projection = 1, .prefix_dropout = 0.1f},
               0.3f);
}

/* The ChatGLM2 block: LoRA on every module, P-Tuning v2 with ChatGLM2's projection (the
 * prefix in 2 key/value groups per layer), and LoRA on an INT4 base. */
static void lora_glm2_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_fam(m, be, dt, seed,
                   (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                   0.05f, GLM_Q_NONE, 1);
}
/* transformers' GLM layout: q, k and v three adapters on their row blocks (config.h glm_lora_split) */
static void lora_glm2_hf_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    glm_config c = config_glm2(1);
    c.hf_layout = 1;
    peft_model_cfg(m, be, dt, seed, c,
                   (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                   0.05f, GLM_Q_NONE);
}
/* the same without dropout: the three adapters' products with the input run as one */
static void lora_glm2_hf_nodrop_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    glm_config c = config_glm2(1);
    c.hf_layout = 1;
    peft_model_cfg(m, be, dt, seed, c,
                   (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_targets = GLM_LORA_ALL}, 0.05f,
                   GLM_Q_NONE);
}
static void ptuning_glm2_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_fam(m, be, dt, seed, (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = 8, .prefix_projection = 1, .prefix_dropout = 0.1f},
                   0.3f, GLM_Q_NONE, 1);
}
static void lora_int4_glm2_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_fam(m, be, dt, seed,
                   (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                   0.05f, GLM_Q_INT4, 1);
}

/* The same on quantized bases: INT4 and INT8 (THUDM's), NF4 (bitsandbytes'). */
static void lora_int4_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed,
                 (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                 0.05f, GLM_Q_INT4);
}
static void lora_int8_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed,
                 (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_dropout = 0.1f, .lora_targets = GLM_LORA_ALL},
                 0.05f, GLM_Q_INT8);
}
static void ptuning_nf4_model(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed) {
    peft_model_q(m, be, dt, seed, (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = 8, .prefix_projection = 1, .prefix_dropout = 0.1f},
                 0.3f, GLM_Q_NF4);
}

/* The same model (trainable rows: LoRA adapters or the prefix encoder) on the CPU and on CUDA
 * with the same dropout masks: loss and every trainable gradient, the row count, and gradient
 * checkpointing bit-identical on CUDA. */
typedef void (*peft_maker)(glm_model *m, glm_backend *be, glm_dtype dt, uint64_t seed);

static void check_peft_batch(test_counts *tc, const char *kind, peft_maker make, uint64_t seed, int rows, glm_dtype dt,
                             int B, int T) {
    char name[160], err[256];
    glm_backend *cpu = glm_backend_cpu(), *gpu = glm_backend_cuda(0, dt, err, sizeof err);
    glm_model mc, mg;
    make(&mc, cpu, dt, seed);
    make(&mg, gpu, dt, seed);
    glm_model_set_dropout_seed(&mc, seed * 3);
    glm_model_set_dropout_seed(&mg, seed * 3);
    glm_rng rng;
    glm_rng_seed(&rng, seed + 7);
    glm_batch b;
    make_batch(&b, &mc.cfg, &rng, B, T);
    double lc, lg, lg3;
    float *gc = grads_of(&mc, &b, &lc), *gg = grads_of(&mg, &b, &lg);
    double tl = dt == GLM_F32 ? 1e-5 : 2e-2, tg = dt == GLM_F32 ? 1e-4 : 5e-2, el = fabs(lg - lc) / fabs(lc), worst = 0;
    const char *wname = "";
    for (int i = 0; i < mc.tab.n; i++) {
        const glm_tensor *t = &mc.tab.t[i];
        double e = norm_rel_err(gg + t->offset, gc + t->offset, t->numel);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; wname = t->name; }
    }
    snprintf(name, sizeof name, "%s_%s_loss", kind, dt_name(dt));
    TEST_CHECK(tc, name, el <= tl, "cuda %.7f cpu %.7f rel %.3g > %.3g", lg, lc, el, tl);
    snprintf(name, sizeof name, "%s_%s_trainable_grads", kind, dt_name(dt));
    TEST_CHECK(tc, name, worst <= tg && mc.tab.n == rows, "worst tensor %s: %.3g > %.3g (%d rows, %d expected)", wname, worst,
               tg, mc.tab.n, rows);
    printf("  %s %s: loss rel err %.3g, worst trainable gradient %s %.3g\n", kind, dt_name(dt), el, wname, worst);
    glm_model_set_checkpointing(&mg, GLM_CKPT_FULL); /* the recompute draws the same dropout masks */
    float *g3 = grads_of(&mg, &b, &lg3);
    snprintf(name, sizeof name, "%s_%s_checkpointing_bit_identical", kind, dt_name(dt));
    TEST_CHECK(tc, name, memcmp(g3, gg, sizeof(float) * mg.tab.total) == 0 && lg3 == lg, "gradients differ");
    float *g4, *g5;
    double lg5;
    selective_and_none(&mg, &b, &g4, &lg3, &g5, &lg5);
    snprintf(name, sizeof name, "%s_%s_selective_checkpointing_bit_identical", kind, dt_name(dt));
    TEST_CHECK(tc, name, memcmp(g4, g5, sizeof(float) * mg.tab.total) == 0 && lg3 == lg5, "gradients differ");
    free(gc); free(gg); free(g3); free(g4); free(g5);
    glm_batch_free(&b);
    glm_model_free(&mc);
    glm_model_free(&mg);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
}

/* --stage dpo's weighed loss (train/pref.h) on a LoRA model, CUDA against the CPU: rows 0..1 chosen, 2..3
 * rejected (random rows: the sums do not care whether the prompts match), sigmoid with reference
 * values off the policy's, orpo without, rm's pairwise loss over the value head's scores, and kto
 * (rows 2, 3 the KL rows of rows 0, 1); the loss and every trainable gradient. */
static void check_pref(test_counts *tc, glm_pref_loss kind, glm_dtype dt) {
    char name[160], err[256];
    glm_backend *cpu = glm_backend_cpu(), *gpu = glm_backend_cuda(0, dt, err, sizeof err);
    glm_model mc, mg;
    peft_maker make = kind == GLM_PREF_RM ? lora_rm_model : lora_model; /* rm: the value head's scores */
    make(&mc, cpu, dt, 41);
    make(&mg, gpu, dt, 41);
    glm_model_set_dropout_seed(&mc, 5);
    glm_model_set_dropout_seed(&mg, 5);
    glm_rng rng;
    glm_rng_seed(&rng, 43);
    glm_batch b;
    make_batch(&b, &mc.cfg, &rng, 4, 96);
    glm_pref_cfg cfg = {.loss = kind, .beta = 0.5, .ftx = 0.3, .simpo_gamma = 0.5, .kto_desirable = 1.0, .kto_undesirable = 1.5};
    double ref[4] = {-180.0, -175.0, -181.0, -177.5}; /* chosen, rejected of each pair */
    double l[2];
    float *g[2];
    glm_model *ms[2] = {&mc, &mg};
    for (int i = 0; i < 2; i++) {
        uint8_t tags[2] = {1, 0}; /* KTO: the first example desirable, the second not (rows 2, 3 their KL rows) */
        glm_pref_batch pb = {.cfg = &cfg, .ref = glm_pref_uses_ref(kind) ? ref : NULL, .tags = tags};
        glm_zero_grads(ms[i]);
        l[i] = glm_forward_backward_weighted(ms[i], &b, 0.5f, glm_pref_weigh, &pb) / 2;
        g[i] = malloc(sizeof(float) * ms[i]->tab.total);
        ms[i]->be->download_f32(ms[i]->be, g[i], ms[i]->grads, ms[i]->tab.total);
    }
    double tl = dt == GLM_F32 ? 1e-5 : 2e-2, tg = dt == GLM_F32 ? 1e-4 : 5e-2, el = fabs(l[1] - l[0]) / fabs(l[0]), worst = 0;
    const char *wname = "";
    for (int i = 0; i < mc.tab.n; i++) {
        const glm_tensor *t = &mc.tab.t[i];
        double e = norm_rel_err(g[1] + t->offset, g[0] + t->offset, t->numel);
        if (e > worst || e != e) { worst = e != e ? INFINITY : e; wname = t->name; }
    }
    const char *kn = kind == GLM_PREF_ORPO ? "orpo" : kind == GLM_PREF_RM ? "rm" : kind == GLM_PREF_KTO ? "kto" : "sigmoid";
    snprintf(name, sizeof name, "pref_%s_lora_%s_loss", kn, dt_name(dt));
    TEST_CHECK(tc, name, el <= tl && isfinite(l[0]), "cuda %.7f cpu %.7f rel %.3g > %.3g", l[1], l[0], el, tl);
    snprintf(name, sizeof name, "pref_%s_lora_%s_trainable_grads", kn, dt_name(dt));
    TEST_CHECK(tc, name, worst <= tg, "worst tensor %s: %.3g > %.3g", wname, worst, tg);
    printf("  pref %s %s: loss %.6f rel err %.3g, worst trainable gradient %s %.3g\n", kn, dt_name(dt), l[0], el, wname, worst);
    free(g[0]); free(g[1]);
    glm_batch_free(&b);
    glm_model_free(&mc);
    glm_model_free(&mg);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
}

static void check_peft(test_counts *tc, const char *kind, peft_maker make, uint64_t seed, int rows, glm_dtype dt) {
    check_peft_batch(tc, kind, make, seed, rows, dt, 3, 150);
}

static void test_ptuning_oracle(test_counts *tc) {
    char err[256];
    glm_backend *be = glm_backend_cuda(0, GLM_F32, err, sizeof err);
    double e[3];
    int rc = oracle_glm_ptuning(be, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, "cuda_oracle_ptuning", "glm_ptuning_v2_model.data not found"); return; }
    TEST_CHECK(tc, "cuda_oracle_ptuning", rc == 0 && e[0] < 1e-5 && e[1] < 1e-5 && e[2] < 1e-5,
               "max abs errors %.3g %.3g %.3g (limit 1e-5)", e[0], e[1], e[2]);
    printf("  cuda fp32 ptuning oracle max abs errors: prompt %.3g, step1 %.3g, step2 %.3g\n", e[0], e[1], e[2]);
}


/* 50 AdamW steps on the adapters: CUDA bf16 (fp16 on Turing) follows the CPU's fp32 curve. */
static void lora_curve(glm_backend *be, glm_dtype h16, glm_batch *bs, int nb, int steps, double *losses) {
    glm_model m;
    lora_model(&m, be, h16, 41);
    adamw_curve(&m, bs, nb, steps, losses);
}

static void test_lora_training(test_counts *tc, glm_dtype h16) {
    enum { STEPS = 50, NB = 4 };
    char err[256], name[96];
    const char *hn = dt_name(h16);
    glm_rng rng;
    glm_rng_seed(&rng, 6);
    glm_config c = config(1);
    glm_batch bs[NB];
    for (int i = 0; i < NB; i++) make_batch(&bs[i], &c, &rng, 4, 96);
    double cpu[STEPS], b16[STEPS], m16 = 0, mean16 = 0;
    glm_backend *be = glm_backend_cpu();
    lora_curve(be, h16, bs, NB, STEPS, cpu);
    be->destroy(be);
    be = glm_backend_cuda(0, h16, err, sizeof err);
    lora_curve(be, h16, bs, NB, STEPS, b16);
    be->destroy(be);
    for (int s = 0; s < STEPS; s++) {
        double e = fabs(b16[s] - cpu[s]) / cpu[s];
        if (e > m16 || e != e) m16 = e != e ? INFINITY : e;
        mean16 += e / STEPS;
    }
    snprintf(name, sizeof name, "lora_train50_cuda_%s_follows_cpu", hn);
    TEST_CHECK(tc, name, m16 <= 5e-2 && mean16 <= 2e-2, "max rel deviation %.3g, mean %.3g", m16, mean16);
    TEST_CHECK(tc, "lora_train50_loss_decreases", cpu[STEPS - 1] < 0.9 * cpu[0] && b16[STEPS - 1] < 0.9 * b16[0],
               "cpu %.4f -> %.4f, %s %.4f -> %.4f", cpu[0], cpu[STEPS - 1], hn, b16[0], b16[STEPS - 1]);
    printf("  lora train50: cpu %.4f -> %.4f, %s %.4f -> %.4f, max rel deviation %.3g (mean %.3g)\n", cpu[0], cpu[STEPS - 1],
           hn, b16[0], b16[STEPS - 1], m16, mean16);
    for (int i = 0; i < NB; i++) glm_batch_free(&bs[i]);
}

int main(void) {
    test_counts tc = {0};
    char err[256];
    glm_backend *probe = glm_backend_cuda(0, GLM_F32, err, sizeof err);
    if (!probe) { TEST_SKIP(&tc, "cuda_model", "%s", err); TEST_EXIT(&tc); }
    probe->destroy(probe);
    /* the 16-bit runs: bf16, or fp16 where the GPU has no bf16 (Turing, or GLM_CUDA_TURING=1) */
    glm_dtype h16 = GLM_BF16;
    if (!(probe = glm_backend_cuda(0, GLM_BF16, err, sizeof err))) {
        TEST_SKIP(&tc, "cuda_model_bf16", "%s: the bf16 cases run in fp16", err);
        h16 = GLM_F16;
    } else
        probe->destroy(probe);
    test_oracle(&tc);
    test_oracle_glm2(&tc);
    for (int glm2 = 0; glm2 < 3; glm2++)
        for (int medium = 0; medium < 2; medium++) {
            test_fwd_bwd(&tc, medium, GLM_F32, glm2);
            if (h16 == GLM_BF16) test_fwd_bwd(&tc, medium, GLM_BF16, glm2);
            test_fwd_bwd(&tc, medium, GLM_F16, glm2);
        }
    test_training(&tc, h16);
    check_peft(&tc, "lora", lora_model, 31, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "lora", lora_model, 31, 2 * 4 * 2, h16);
    check_peft(&tc, "pissa", pissa_model, 37, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "pissa", pissa_model, 37, 2 * 4 * 2, h16);
    test_lora_training(&tc, h16);
    const glm_pref_loss prefs[] = {GLM_PREF_SIGMOID, GLM_PREF_ORPO, GLM_PREF_RM, GLM_PREF_KTO};
    for (int k = 0; k < 4; k++) {
        check_pref(&tc, prefs[k], GLM_F32);
        check_pref(&tc, prefs[k], h16);
    }
    check_peft(&tc, "lora_neftune", lora_neftune_model, 33, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "lora_neftune", lora_neftune_model, 33, 2 * 4 * 2, h16);
    check_peft(&tc, "ptuning", ptuning_model, 51, 5, GLM_F32);
    check_peft(&tc, "ptuning", ptuning_model, 51, 5, h16);
    test_ptuning_oracle(&tc);
    /* quantized bases: 450 tokens dequantize each weight for the GEMMs; 8 tokens take the
     * direct quantized product (qmatmul_fwd) in forward */
    check_peft(&tc, "lora_int4", lora_int4_model, 61, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "lora_int4", lora_int4_model, 61, 2 * 4 * 2, h16);
    check_peft_batch(&tc, "lora_int4_8tok", lora_int4_model, 62, 2 * 4 * 2, h16, 1, 8);
    check_peft(&tc, "lora_int8", lora_int8_model, 63, 2 * 4 * 2, h16);
    check_peft_batch(&tc, "lora_int8_8tok", lora_int8_model, 64, 2 * 4 * 2, GLM_F32, 1, 8);
    check_peft(&tc, "ptuning_nf4", ptuning_nf4_model, 65, 5, h16);
    check_peft_batch(&tc, "ptuning_nf4_8tok", ptuning_nf4_model, 66, 5, GLM_F32, 1, 8);
    /* the ChatGLM2 block (2 layers: 8 adapter rows each; the prefix encoder's 5 rows) */
    check_peft(&tc, "glm2_lora", lora_glm2_model, 71, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "glm2_lora", lora_glm2_model, 71, 2 * 4 * 2, h16);
    check_peft(&tc, "glm2_lora_hf_split", lora_glm2_hf_model, 79, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "glm2_lora_hf_split", lora_glm2_hf_model, 79, 2 * 4 * 2, h16);
    check_peft(&tc, "glm2_lora_hf_split_nodrop", lora_glm2_hf_nodrop_model, 83, 2 * 4 * 2, GLM_F32);
    check_peft(&tc, "glm2_lora_hf_split_nodrop", lora_glm2_hf_nodrop_model, 83, 2 * 4 * 2, h16);
    check_peft(&tc, "glm2_ptuning", ptuning_glm2_model, 73, 5, GLM_F32);
    check_peft(&tc, "glm2_ptuning", ptuning_glm2_model, 73, 5, h16);
    check_peft(&tc, "glm2_lora_int4", lora_int4_glm2_model, 75, 2 * 4 * 2, h16);
    check_peft_batch(&tc, "glm2_lora_int4_8tok", lora_int4_glm2_model, 76, 2 * 4 * 2, h16, 1, 8);
    /* DoRA: 2 layers x 4 modules x (A, B, magnitude) */
    check_peft(&tc, "dora", dora_model, 81, 2 * 4 * 3, GLM_F32);
    check_peft(&tc, "dora", dora_model, 81, 2 * 4 * 3, h16);
    check_peft(&tc, "dora_dropout", dora_dropout_model, 82, 2 * 4 * 3, GLM_F32);
    check_peft(&tc, "dora_dropout", dora_dropout_model, 82, 2 * 4 * 3, h16);
    check_peft(&tc, "dora_int4", dora_int4_model, 83, 2 * 4 * 3, h16);
    check_peft_batch(&tc, "dora_int4_8tok", dora_int4_model, 84, 2 * 4 * 3, GLM_F32, 1, 8);
    check_peft(&tc, "glm2_dora", dora_glm2_model, 85, 2 * 4 * 3, h16);
    check_peft(&tc, "glm2_dora_hf_split", dora_glm2_hf_nodrop_model, 86, 2 * 4 * 3, GLM_F32);
    check_peft(&tc, "glm2_dora_hf_split", dora_glm2_hf_nodrop_model, 86, 2 * 4 * 3, h16);
    check_peft(&tc, "glm2_dora_hf_split_dropout", dora_glm2_hf_dropout_model, 87, 2 * 4 * 3, GLM_F32);
    check_peft(&tc, "glm2_dora_hf_split_dropout", dora_glm2_hf_dropout_model, 87, 2 * 4 * 3, h16);
    /* freeze's modules: 2 layers' fc1 and fc2 (weights, biases), the embedding, the final norm's 2 rows;
     * ChatGLM2's query_key_value (weight, bias), dense, output_layer */
    check_peft(&tc, "freeze_modules_int4", freeze_int4_model, 87, 2 * 4 + 3, GLM_F32);
    check_peft(&tc, "freeze_modules_int4", freeze_int4_model, 87, 2 * 4 + 3, h16);
    check_peft(&tc, "glm2_freeze_modules", freeze_glm2_model, 88, 4, h16);
    /* 2 layers' qkv A and B, lm_head, the final norm's weight and bias */
    check_peft(&tc, "lora_modules_to_save_int8", lora_whole_int8_model, 89, 2 * 2 + 3, GLM_F32);
    check_peft(&tc, "lora_modules_to_save_int8", lora_whole_int8_model, 89, 2 * 2 + 3, h16);
    printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
    TEST_EXIT(&tc);
}
