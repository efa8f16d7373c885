/* Model gradients without an external reference: central finite differences on a micro
 * model, the training path against the KV-cache path, gradient checkpointing, and results
 * that do not depend on the number of threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/rng.h"
#include "model/glm.h"
#include "micro_configs.h"
#include "test.h"

static glm_config micro_config(int tie) {
    glm_config c = micro_v1_config();
    c.num_layers = 2;
    c.tie_word_embeddings = tie;
    return c;
}

/* Two rows: prompt + [gMASK] <sop> + answer + <eop>, different lengths, right padding. */
static void make_batch(glm_batch *b, const glm_config *c, glm_rng *rng) {
    int lens_a[2] = {4, 2}, lens_b[2] = {3, 5};
    glm_batch_alloc(b, 2, 12);
    for (int r = 0; r < 2; r++) {
        int32_t ids[16], lab[16], n = 0;
        for (int i = 0; i < lens_a[r]; i++) ids[n++] = 4 + (int)glm_rng_below(rng, 15);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        for (int i = 0; i < lens_b[r]; i++) ids[n++] = 4 + (int)glm_rng_below(rng, 15);
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < n; i++) lab[i] = i < ctx ? -100 : ids[i];
        glm_batch_set_row(b, r, ids, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
}

/* Random weights with non-trivial LayerNorm parameters and biases. */
static void randomize(glm_model *m, uint64_t seed) {
    float *h = calloc(m->tab.total, sizeof(float));
    glm_rng rng;
    glm_rng_seed(&rng, seed);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        int lnw = glm_is_norm_w(t->kind);
        for (size_t j = 0; j < t->numel; j++)
            h[t->offset + j] = lnw ? 1.0f + 0.2f * glm_rng_normal(&rng) : (t->ndim == 2 ? 0.3f : 0.1f) * glm_rng_normal(&rng);
    }
    glm_model_set_params(m, h);
    free(h);
}

static double mean_loss(glm_model *m, const glm_batch *b) { return glm_forward_loss(m, b) / b->n_targets; }

static void test_finite_differences(test_counts *tc, int tie) {
    glm_config c = micro_config(tie);
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    randomize(&m, 7);
    glm_rng rng;
    glm_rng_seed(&rng, 11);
    glm_batch b;
    make_batch(&b, &c, &rng);
    glm_zero_grads(&m);
    glm_forward_backward(&m, &b, 1.0f / b.n_targets);
    float *g = malloc(m.tab.total * sizeof(float)), *p = malloc(m.tab.total * sizeof(float));
    be->download_f32(be, g, m.grads, m.tab.total);
    glm_model_get_params(&m, p);
    int bad = 0, checked = 0;
    double worst = 0;
    char worst_name[256] = "";
    for (int i = 0; i < m.tab.n; i++) {
        const glm_tensor *t = &m.tab.t[i];
        for (int k = 0; k < 4; k++) {
            size_t j = t->offset + glm_rng_below(&rng, t->numel);
            float eps = 1e-2f, orig = p[j];
            p[j] = orig + eps; glm_model_set_params(&m, p);
            double lp = mean_loss(&m, &b);
            p[j] = orig - eps; glm_model_set_params(&m, p);
            double lm = mean_loss(&m, &b);
            p[j] = orig;
            double fd = (lp - lm) / (2 * eps), an = g[j];
            double err = fabs(fd - an) / (1e-3 + 1e-2 * fabs(an)); /* <= 1 passes */
            if (err > worst) { worst = err; snprintf(worst_name, sizeof worst_name, "%s (fd %.6g vs %.6g)", t->name, fd, an); }
            bad += err > 1;
            checked++;
        }
    }
    glm_model_set_params(&m, p);
    char name[64];
    snprintf(name, sizeof name, "finite_differences_%s", tie ? "tied" : "untied");
    TEST_CHECK(tc, name, bad == 0, "%d of %d coordinates off; worst %s", bad, checked, worst_name);
    printf("  %s: %d coordinates, worst normalised error %.3f at %s\n", name, checked, worst, worst_name);
    free(g); free(p);
    glm_batch_free(&b);
    glm_model_free(&m);
    be->destroy(be);
}

/* The training forward and the KV-cache forward (prompt, then token by token) agree. */
static void test_cached_matches_training(test_counts *tc) {
    glm_config c = micro_config(0);
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    randomize(&m, 3);
    glm_rng rng;
    glm_rng_seed(&rng, 5);
    glm_batch b;
    make_batch(&b, &c, &rng);
    m.keep_all_rows = 1; /* the top layer's every row, not only the supervised ones */
    glm_forward_loss(&m, &b); /* fills m.lnf_out for the whole batch */
    int T = b.T, H = c.hidden_size, n = 0;
    while (n < T && b.targets[n] != -100) n++; /* row 0 real length is where padding starts */
    n = 0;
    for (int i = 0; i < T; i++) if (b.kv_lo[i] == 0) n = i + 1;
    float *ref = malloc(sizeof(float) * T * H);
    be->download_f32(be, ref, m.lnf_out, (size_t)T * H);
    int ctx = 0;
    while (b.ids[ctx] != c.bos_token_id) ctx++;
    glm_kvcache kv;
    glm_kvcache_init(&m, &kv, 1, T);
    float *out = malloc(sizeof(float) * T * H);
    glm_err err;
    /* prompt up to and including <sop> in one call, then one token at a time */
    int rc = glm_forward_cached(&m, &kv, ctx + 1, b.ids, b.pos, b.block_pos, b.kv_lo, b.kv_hi, out, NULL, &err);
    for (int i = ctx + 1; i < n && rc == 0; i++)
        rc = glm_forward_cached(&m, &kv, 1, b.ids + i, b.pos + i, b.block_pos + i, b.kv_lo + i, b.kv_hi + i,
                                out + (size_t)i * H, NULL, &err);
    double e = rc ? 1e9 : test_max_abs(out, ref, (size_t)n * H);
    TEST_CHECK(tc, "kv_cache_matches_training_forward", e < 1e-5, "max abs diff %.3g over %d tokens", e, n);
    glm_kvcache_free(&m, &kv);
    free(ref); free(out);
    glm_batch_free(&b);
    glm_model_free(&m);
    be->destroy(be);
}

/* Bytes the backend hands out (the original alloc is kept in a static: tests only). */
static void *(*real_alloc)(glm_backend *, size_t);
static double alloc_bytes;
static void *counting_alloc(glm_backend *be, size_t bytes) {
    alloc_bytes += (double)bytes;
    return real_alloc(be, bytes);
}

/* What the first forward/backward of m on make_batch's rows allocates (the activation sets and
 * the backward's scratch): the whole model's, or a first stage's from a zero output gradient. */
static double first_backward_bytes(glm_model *m, const glm_config *c) {
    glm_backend *be = m->be;
    glm_rng rng;
    glm_rng_seed(&rng, 13);
    glm_batch b;
    make_batch(&b, c, &rng);
    float *dh = m->last ? NULL : calloc((size_t)b.B * b.T * c->hidden_size, sizeof(float));
    real_alloc = be->alloc;
    be->alloc = counting_alloc;
    alloc_bytes = 0;
    if (m->last) glm_forward_backward(m, &b, 1.0f / b.n_targets);
    else glm_stage_backward(m, &b, NULL, dh, NULL, 1.0f / b.n_targets);
    be->alloc = real_alloc;
    free(dh);
    glm_batch_free(&b);
    return alloc_bytes;
}

/* Gradients of one micro-batch at checkpointing level ckpt; *acts_bytes: what the first
 * forward/backward allocated. */
static float *grads_at(int ckpt, int threads, double *acts_bytes) {
    glm_config c = micro_config(0);
    c.num_layers = 3;
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    m.gradient_checkpointing = ckpt;
    randomize(&m, 9);
    omp_set_num_threads(threads);
    glm_zero_grads(&m);
    double bytes = first_backward_bytes(&m, &c);
    if (acts_bytes) *acts_bytes = bytes;
    float *g = malloc(m.tab.total * sizeof(float));
    be->download_f32(be, g, m.grads, m.tab.total);
    glm_model_free(&m);
    be->destroy(be);
    return g;
}

static float *grads_with(int ckpt, int threads) { return grads_at(ckpt, threads, NULL); }

static void test_determinism(test_counts *tc) {
    int maxt = omp_get_max_threads();
    double bytes[3];
    float *a = grads_at(GLM_CKPT_NONE, 1, &bytes[0]), *b = grads_at(GLM_CKPT_FULL, 1, &bytes[1]);
    float *c = grads_with(0, maxt > 1 ? maxt : 2), *s = grads_at(GLM_CKPT_SELECTIVE, 1, &bytes[2]);
    glm_config cfg = micro_config(0);
    cfg.num_layers = 3;
    glm_table tab;
    glm_table_build(&tab, &cfg);
    size_t total = tab.total;
    glm_table_free(&tab);
    TEST_CHECK(tc, "gradient_checkpointing_bit_identical", memcmp(a, b, total * 4) == 0, "gradients differ");
    TEST_CHECK(tc, "selective_checkpointing_bit_identical", memcmp(a, s, total * 4) == 0, "gradients differ");
    /* the plan's activations differ between the levels by what the model allocates */
    glm_mem_plan p[3];
    for (int k = 0; k < 3; k++) p[k] = glm_memory_plan(&cfg, GLM_F32, 2, 12, k == 0 ? GLM_CKPT_NONE : k == 1 ? GLM_CKPT_FULL : GLM_CKPT_SELECTIVE, 256);
    int ok = 1;
    for (int k = 1; k < 3; k++) ok &= fabs((bytes[0] - bytes[k]) - (p[0].activations - p[k].activations)) < 1;
    TEST_CHECK(tc, "checkpointing_levels_plan_what_is_allocated", ok && bytes[1] < bytes[2] && bytes[2] < bytes[0],
               "allocated none %.0f full %.0f selective %.0f; planned activations %.0f %.0f %.0f", bytes[0], bytes[1],
               bytes[2], p[0].activations, p[1].activations, p[2].activations);
    TEST_CHECK(tc, "threads_do_not_change_results", memcmp(a, c, total * 4) == 0, "1 vs %d threads differ", maxt);
    omp_set_num_threads(maxt);
    free(a); free(b); free(c); free(s);
}

/* Copies tensors by name between models with different tables (full model <-> stages). */
static void copy_by_name(glm_model *dst, const float *src_host, const glm_table *src_tab, float *dst_host) {
    for (int i = 0; i < dst->tab.n; i++) {
        const glm_tensor *t = &dst->tab.t[i], *s = glm_table_find(src_tab, t->name);
        memcpy(dst_host + t->offset, src_host + s->offset, t->numel * sizeof(float));
    }
}

/* Three pipeline stages chained by hand give the full model's loss and every gradient. */
static void test_stages_match_full(test_counts *tc, int tie) {
    glm_config c = micro_config(tie);
    c.num_layers = 3;
    glm_backend *be = glm_backend_cpu();
    glm_model full, st[3];
    glm_model_init(&full, &c, be);
    randomize(&full, 21);
    glm_rng rng;
    glm_rng_seed(&rng, 4);
    glm_batch b;
    make_batch(&b, &c, &rng);
    float *fp = malloc(full.tab.total * 4), *fg = malloc(full.tab.total * 4);
    glm_model_get_params(&full, fp);
    glm_zero_grads(&full);
    double loss_full = glm_forward_backward(&full, &b, 1.0f / b.n_targets);
    be->download_f32(be, fg, full.grads, full.tab.total);
    int lo[3] = {0, 1, 2}, hi[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++) {
        glm_model_init_stage(&st[k], &c, be, lo[k], hi[k], k == 0, k == 2);
        float *h = calloc(st[k].tab.total, 4);
        copy_by_name(&st[k], fp, &full.tab, h);
        glm_model_set_params(&st[k], h);
        free(h);
        glm_zero_grads(&st[k]);
    }
    size_t N = (size_t)b.B * b.T, H = c.hidden_size;
    float *h1 = malloc(N * H * 4), *h2 = malloc(N * H * 4), *d2 = malloc(N * H * 4), *d1 = malloc(N * H * 4);
    glm_stage_forward(&st[0], &b, NULL, h1);
    glm_stage_forward(&st[1], &b, h1, h2);
    double loss = glm_stage_backward(&st[2], &b, h2, NULL, d2, 1.0f / b.n_targets);
    glm_stage_backward(&st[1], &b, h1, d2, d1, 1.0f / b.n_targets);
    glm_stage_backward(&st[0], &b, NULL, d1, NULL, 1.0f / b.n_targets);
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        float *g = malloc(st[k].tab.total * 4);
        be->download_f32(be, g, st[k].grads, st[k].tab.total);
        for (int i = 0; i < st[k].tab.n; i++) {
            const glm_tensor *t = &st[k].tab.t[i], *f = glm_table_find(&full.tab, t->name);
            /* a tied embedding's gradient is split between the first and the last stage */
            if (tie && t->kind == T_WORD_EMB) continue;
            double e = test_rel_err(g + t->offset, fg + f->offset, (long)t->numel);
            if (e > worst) worst = e;
        }
        free(g);
    }
    if (tie) { /* first + last stage word-embedding gradients sum to the full model's */
        const glm_tensor *t0 = glm_table_get(&st[0].tab, -1, T_WORD_EMB), *t2 = glm_table_get(&st[2].tab, -1, T_WORD_EMB);
        const glm_tensor *f = glm_table_get(&full.tab, -1, T_WORD_EMB);
        float *g0 = malloc(st[0].tab.total * 4), *g2 = malloc(st[2].tab.total * 4);
        be->download_f32(be, g0, st[0].grads, st[0].tab.total);
        be->download_f32(be, g2, st[2].grads, st[2].tab.total);
        for (size_t j = 0; j < t0->numel; j++) g0[t0->offset + j] += g2[t2->offset + j];
        double e = test_rel_err(g0 + t0->offset, fg + f->offset, (long)t0->numel);
        if (e > worst) worst = e;
        free(g0); free(g2);
    }
    char name[64];
    snprintf(name, sizeof name, "pipeline_stages_match_full_%s", tie ? "tied" : "untied");
    TEST_CHECK(tc, name, fabs(loss - loss_full) <= 1e-6 * fabs(loss_full) && worst < 1e-6,
               "loss %.8g vs %.8g, worst gradient rel err %.3g", loss, loss_full, worst);
    for (int k = 0; k < 3; k++) glm_model_free(&st[k]);
    glm_model_free(&full);
    glm_batch_free(&b);
    free(fp); free(fg); free(h1); free(h2); free(d1); free(d2);
    be->destroy(be);
}

/* Bytes the first forward/backward allocates when freeze mode trains the last n of 5 layers. */
static double freeze_alloc_bytes(int n, int ckpt) {
    glm_config c = micro_config(0);
    c.num_layers = 5;
    c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = n};
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    m.gradient_checkpointing = ckpt;
    glm_model_init_random(&m, 9, 0.02f);
    glm_zero_grads(&m);
    double bytes = first_backward_bytes(&m, &c);
    glm_model_free(&m);
    be->destroy(be);
    return bytes;
}

/* Below the lowest trainable layer no backward runs, so those layers share one activation
 * set and two layer inputs; the plan counts what the model allocates. */
static void test_freeze_activations(test_counts *tc) {
    const char *names[2] = {"freeze_below_floor_shares_activations", "freeze_below_floor_shares_activations_selective"};
    for (int k = 0; k < 2; k++) {
        int ckpt = k ? GLM_CKPT_SELECTIVE : GLM_CKPT_NONE;
        double b1 = freeze_alloc_bytes(1, ckpt), b3 = freeze_alloc_bytes(5, ckpt);
        glm_config c = micro_config(0);
        c.num_layers = 5;
        c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = 1};
        glm_mem_plan p1 = glm_memory_plan(&c, GLM_F32, 2, 12, ckpt, 256);
        c.peft.num_layer_trainable = 5;
        glm_mem_plan p3 = glm_memory_plan(&c, GLM_F32, 2, 12, ckpt, 256);
        double per_set = p3.activations - p1.activations;
        TEST_CHECK(tc, names[k], b3 > b1 && fabs((b3 - b1) - per_set) < 1 && per_set > 0,
                   "allocated: 5 layers training %.0f, 1 layer %.0f; planned activations %.0f, %.0f", b3, b1,
                   p3.activations, p1.activations);
    }
}

/* Bytes the backward of a pipeline's first stage [0, 2) allocates when freeze mode trains only
 * the last of 3 layers: the stage holds no trainable layer, every layer lies below the floor. */
static double frozen_stage_bytes(int ckpt) {
    glm_config c = micro_config(0);
    c.num_layers = 3;
    c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = 1};
    glm_backend *be = glm_backend_cpu();
    glm_model st;
    glm_model_init_stage(&st, &c, be, 0, 2, 1, 0);
    st.gradient_checkpointing = ckpt;
    glm_model_init_random(&st, 9, 0.02f);
    double bytes = first_backward_bytes(&st, &c);
    glm_model_free(&st);
    be->destroy(be);
    return bytes;
}

static void test_frozen_stage(test_counts *tc) {
    double none = frozen_stage_bytes(GLM_CKPT_NONE), sel = frozen_stage_bytes(GLM_CKPT_SELECTIVE);
    glm_config c = micro_config(0);
    c.num_layers = 3;
    c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = 1};
    double pn = glm_memory_plan_stage(&c, 0, 2, 1, 0, GLM_F32, 2, 12, GLM_CKPT_NONE, 256, NULL).activations;
    double ps = glm_memory_plan_stage(&c, 0, 2, 1, 0, GLM_F32, 2, 12, GLM_CKPT_SELECTIVE, 256, NULL).activations;
    TEST_CHECK(tc, "frozen_first_stage_one_activation_set", none > 0 && none == sel && pn == ps,
               "allocated without checkpointing %.0f, selective %.0f; planned %.0f, %.0f", none, sel, pn, ps);
}

int main(void) {
    test_counts tc = {0};
    test_finite_differences(&tc, 0);
    test_finite_differences(&tc, 1);
    test_cached_matches_training(&tc);
    test_determinism(&tc);
    test_freeze_activations(&tc);
    test_frozen_stage(&tc);
    test_stages_match_full(&tc, 0);
    test_stages_match_full(&tc, 1);
    TEST_EXIT(&tc);
}
