/* NEFTune (--neftune_noise_alpha): while training, the first stage adds noise uniform in
 * [-mag, mag], mag = alpha / sqrt(T H), to the embeddings; evaluation adds none.
 *  - the draws of backend op noise_add: inside the range, mean 0, variance mag^2 / 3,
 *    uncorrelated neighbours, fixed by the seed;
 *  - the model: a training step with alpha equals, to the last bit, the same layers run as a
 *    pipeline stage fed wte[ids] + noise computed here from the documented formula (the test's
 *    own magnitude, seed and draws), for both families, full fine-tuning and LoRA; evaluation's
 *    loss is the noiseless one; the noise changes the training loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/mask_hash.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/glm.h"
#include "micro_configs.h"
#include "test.h"

static void test_draws(test_counts *tc) {
    const size_t n = 1 << 20;
    const float mag = 0.5f;
    float *x = calloc(n, sizeof(float)), *y = calloc(n, sizeof(float)), *z = calloc(n, sizeof(float));
    cpu_noise_add(x, n, mag, 99);
    cpu_noise_add(y, n, mag, 99);
    cpu_noise_add(z, n, mag, 100);
    double sum = 0, sq = 0, cross = 0, lo = 1, hi = -1;
    int inside = 1, grid = 1;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        sum += v;
        sq += v * v;
        if (i) cross += v * x[i - 1];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        inside &= v >= -mag && v < mag;
        grid &= ldexp(v / mag, 23) == floor(ldexp(v / mag, 23)); /* 24-bit draws, exact in fp32 */
    }
    double mean = sum / n, var = sq / n - mean * mean, want = mag * mag / 3.0, corr = cross / n / var;
    TEST_CHECK(tc, "neftune_draws_in_range", inside && lo < -0.499 && hi > 0.499 && grid,
               "min %.6f max %.6f (range +-%.2f), on the 2^-23 grid: %d", lo, hi, mag, grid);
    /* the mean of 2^20 uniforms: sd mag/sqrt(3n) ~ 2.8e-4; the variance's relative sd ~ 1.2e-3 */
    TEST_CHECK(tc, "neftune_draws_moments", fabs(mean) < 1.5e-3 && fabs(var / want - 1) < 8e-3 && fabs(corr) < 6e-3,
               "mean %.3g, variance %.6f vs %.6f, neighbour correlation %.3g", mean, var, want, corr);
    TEST_CHECK(tc, "neftune_draws_seeded", memcmp(x, y, n * sizeof(float)) == 0 && memcmp(x, z, n * sizeof(float)) != 0,
               "the same seed must give the same draws and another seed others");
    free(x); free(y); free(z);
}

/* Two rows: prompt + [gMASK] <sop> + answer + <eop>, the second padded. */
static void make_batch(glm_batch *b, const glm_config *c) {
    int lens_a[2] = {5, 2}, lens_b[2] = {4, 3};
    glm_rng rng;
    glm_rng_seed(&rng, 5);
    glm_batch_alloc(b, 2, 12);
    for (int r = 0; r < 2; r++) {
        int32_t ids[16], lab[16], n = 0;
        for (int i = 0; i < lens_a[r]; i++) ids[n++] = 4 + (int)glm_rng_below(&rng, 15);
        ids[n++] = c->gmask_token_id;
        int ctx = n;
        ids[n++] = c->bos_token_id;
        for (int i = 0; i < lens_b[r]; i++) ids[n++] = 4 + (int)glm_rng_below(&rng, 15);
        ids[n++] = c->eos_token_id;
        for (int i = 0; i < n; i++) lab[i] = i < ctx ? -100 : ids[(i + 1) % n];
        glm_batch_set_row(b, r, ids, lab, n, c->pad_token_id, c->gmask_token_id, c->mask_token_id, c->bos_token_id);
    }
    glm_batch_count_targets(b);
}

static void randomize(glm_model *m) {
    glm_rng rng;
    glm_rng_seed(&rng, 11);
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        float *h = malloc(t->numel * sizeof(float));
        for (size_t j = 0; j < t->numel; j++) h[j] = (t->ndim == 2 ? 0.3f : 0.1f) * glm_rng_normal(&rng) + (t->ndim == 1);
        m->be->upload_f32(m->be, p, h, t->numel);
        free(h);
    }
}

/* Every row of `from` that `to` holds, by name. */
static void copy_rows(glm_model *to, glm_model *from) {
    for (int i = 0; i < glm_model_nrows(from); i++) {
        void *src, *dst;
        const glm_tensor *t = glm_model_row(from, i, &src);
        if (!glm_model_find(to, t->name, &dst)) continue;
        float *h = malloc(t->numel * sizeof(float));
        from->be->download_f32(from->be, h, src, t->numel);
        to->be->upload_f32(to->be, dst, h, t->numel);
        free(h);
    }
}

static glm_config with_ft(glm_config c, int lora, float alpha) {
    if (lora) c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 2, .lora_alpha = 4, .lora_targets = GLM_LORA_ALL};
    c.neftune_alpha = alpha;
    return c;
}

static void test_model(test_counts *tc, const char *family, glm_config base, int lora) {
    const float alpha = 5.0f;
    const uint64_t seed = 0x1234567ULL;
    glm_backend *be = glm_backend_cpu();
    glm_batch b;
    make_batch(&b, &base);
    const int L = base.num_layers, H = base.hidden_size, N = b.B * b.T;
    /* the whole model, noised in training */
    glm_config c = with_ft(base, lora, alpha);
    glm_model m;
    glm_model_init(&m, &c, be);
    randomize(&m);
    if (lora) glm_model_init_adapters(&m, 3);
    glm_model_set_dropout_seed(&m, seed);
    glm_zero_grads(&m);
    double loss = glm_forward_backward(&m, &b, 1.0f / b.n_targets);
    double eval = glm_forward_loss(&m, &b);
    /* the same layers as a stage without the embedding, fed wte[ids] + the noise made here */
    glm_model st;
    glm_model_init_stage(&st, &c, be, 0, L, 0, 1);
    copy_rows(&st, &m);
    void *wte = NULL;
    if (!glm_model_find(&m, "transformer.word_embeddings.weight", &wte))
        glm_model_find(&m, "transformer.embedding.word_embeddings.weight", &wte);
    float *table = malloc((size_t)c.vocab_size * H * sizeof(float)), *h = malloc((size_t)N * H * sizeof(float));
    be->download_f32(be, table, wte, (size_t)c.vocab_size * H);
    float mag = (float)(alpha / sqrt((double)b.T * H)); /* the Trainer's alpha / sqrt(seq x hidden) */
    uint64_t nseed = seed ^ 0x4e4546554e45ULL;
    double noise_abs = 0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            size_t i = (size_t)n * H + j;
            h[i] = fmaf(mag, glm_uniform_pm1(nseed, i), table[(size_t)b.ids[n] * H + j]);
            noise_abs += fabs(h[i] - table[(size_t)b.ids[n] * H + j]);
        }
    void *h_in = be->alloc(be, (size_t)N * H * sizeof(float)), *dh_in = be->alloc(be, (size_t)N * H * sizeof(float));
    be->upload_f32(be, h_in, h, (size_t)N * H);
    glm_model_set_dropout_seed(&st, seed); /* LoRA's dropout masks as the whole model's */
    glm_zero_grads(&st);
    double loss_ref = glm_stage_backward(&st, &b, h_in, NULL, dh_in, 1.0f / b.n_targets);
    /* every layer's gradient, by name (the embedding's differs: the stage hands it back as dh_in) */
    size_t compared = 0, differing = 0;
    for (int i = 0; i < st.tab.n; i++) {
        const glm_tensor *t = &st.tab.t[i], *u = NULL;
        for (int k = 0; k < m.tab.n && !u; k++) if (!strcmp(m.tab.t[k].name, t->name)) u = &m.tab.t[k];
        if (!u || strstr(t->name, "word_embeddings")) continue;
        float *ga = malloc(t->numel * sizeof(float)), *gb = malloc(t->numel * sizeof(float));
        be->download_f32(be, ga, glm_at(be, m.grads, u->offset), t->numel);
        be->download_f32(be, gb, glm_at(be, st.grads, t->offset), t->numel);
        compared += t->numel;
        differing += memcmp(ga, gb, t->numel * sizeof(float)) != 0;
        free(ga); free(gb);
    }
    char name[96];
    snprintf(name, sizeof name, "neftune_%s_%s_embeddings_plus_noise", family, lora ? "lora" : "full");
    TEST_CHECK(tc, name, loss == loss_ref && compared > 0 && differing == 0,
               "loss %.9g vs %.9g from wte[ids] + noise; %zu gradient elements compared, %zu tensors differ", loss, loss_ref,
               compared, differing);
    /* without the noise: another training loss, the same evaluation */
    glm_config c0 = with_ft(base, lora, 0.0f);
    glm_model m0;
    glm_model_init(&m0, &c0, be);
    copy_rows(&m0, &m);
    glm_model_set_dropout_seed(&m0, seed);
    glm_zero_grads(&m0);
    double loss0 = glm_forward_backward(&m0, &b, 1.0f / b.n_targets), eval0 = glm_forward_loss(&m0, &b);
    snprintf(name, sizeof name, "neftune_%s_%s_training_only", family, lora ? "lora" : "full");
    TEST_CHECK(tc, name, eval == eval0 && loss != loss0 && noise_abs / ((double)N * H) > 0.2 * mag,
               "eval %.9g vs %.9g without noise (must be equal); training %.9g vs %.9g (must differ); mean |noise| %.3g of mag %.3g",
               eval, eval0, loss, loss0, noise_abs / ((double)N * H), mag);
    free(table); free(h);
    be->free(be, h_in); be->free(be, dh_in);
    glm_model_free(&m0);
    glm_model_free(&st);
    glm_model_free(&m);
    glm_batch_free(&b);
    be->destroy(be);
}

int main(void) {
    test_counts tc = {0};
    test_draws(&tc);
    for (int lora = 0; lora < 2; lora++) {
        test_model(&tc, "glm", micro_v1_config(), lora);
        test_model(&tc, "chatglm2", micro_v2_config(), lora);
    }
    TEST_EXIT(&tc);
}
