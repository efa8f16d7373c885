/* Generation across stages (parallel/pipe/pipe_infer.h) on the CPU: a model split into stages by
 * a device map gives exactly the whole model's logits and hidden states through a prefill and
 * several decoding steps, across a cache grow, for tied and untied heads; the stages load
 * their parts of a saved model folder, and of an adapter folder (LoRA pairs, a P-Tuning v2
 * prefix encoder with and without its projection) as generate --adapter --device_map does. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/rng.h"
#include "model/adapter.h"
#include "model/glm.h"
#include "parallel/pipe/pipe_infer.h"
#include "test.h"

static glm_config tiny(int tie) {
    return (glm_config){.vocab_size = 40, .hidden_size = 32, .num_layers = 5, .num_attention_heads = 4,
                        .inner_hidden_size = 64, .max_sequence_length = 64, .layernorm_epsilon = 1e-5f,
                        .position_encoding_2d = 1, .tie_word_embeddings = tie, .bos_token_id = 37,
                        .eos_token_id = 38, .mask_token_id = 35, .gmask_token_id = 36, .pad_token_id = 3,
                        .alpha = 7.483314773547883f};
}

/* Two rows, prefill of 6 tokens then `steps` single tokens; step inputs are arbitrary but the
 * same for both runs. Returns the worst |difference| over every logit and hidden value. */
typedef int (*fwd_fn)(void *ctx, int Tq, const int32_t *ids, const int32_t *pos, const int32_t *bp, const int32_t *lo,
                      const int32_t *hi, float *hidden, float *logits, int len, glm_err *err);

static int run(fwd_fn f, void *ctx, int V, int H, float *out, glm_err *err) {
    int B = 2, P = 6, steps = 5, n = 0;
    int32_t ids[12], pos[12], bp[12], lo[12], hi[12];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < P; j++) {
            int k = b * P + j;
            ids[k] = j == 4 ? 36 : j == 5 ? 37 : 4 + (7 * b + 3 * j) % 30;
            pos[k] = j < 5 ? j : 4;
            bp[k] = j < 5 ? 0 : 1;
            lo[k] = 0;
            hi[k] = j < 5 ? 5 : j + 1;
        }
    if (f(ctx, P, ids, pos, bp, lo, hi, out + n, out + n + (size_t)B * P * H, 0, err)) return -1;
    n += B * P * H + B * V;
    for (int s = 0; s < steps; s++) {
        for (int b = 0; b < B; b++) {
            ids[b] = 4 + (5 * s + b) % 30; pos[b] = 4; bp[b] = 2 + s; lo[b] = 0; hi[b] = P + s + 1;
        }
        if (f(ctx, 1, ids, pos, bp, lo, hi, out + n, out + n + (size_t)B * H, P + s, err)) return -1;
        n += B * H + B * V;
    }
    return n;
}

typedef struct full_ctx { glm_model *m; glm_kvcache kv; } full_ctx;
static int full_fwd(void *p, int Tq, const int32_t *ids, const int32_t *pos, const int32_t *bp, const int32_t *lo,
                    const int32_t *hi, float *hidden, float *logits, int len, glm_err *err) {
    full_ctx *c = p;
    return glm_forward_cached(c->m, &c->kv, Tq, ids, pos, bp, lo, hi, hidden, logits, err);
}

typedef struct pipe_ctx { glm_pipe_lm *lm; glm_pipe_cache c; } pipe_ctx;
static int pipe_fwd(void *p, int Tq, const int32_t *ids, const int32_t *pos, const int32_t *bp, const int32_t *lo,
                    const int32_t *hi, float *hidden, float *logits, int len, glm_err *err) {
    pipe_ctx *c = p;
    if (len + Tq > c->c.Tmax) glm_pipe_cache_grow(c->lm, &c->c, c->c.Tmax * 2); /* exercise the grow */
    return glm_pipe_forward_cached(c->lm, &c->c, Tq, ids, pos, bp, lo, hi, hidden, logits, err);
}

static void test_split(test_counts *tc, int tie, const char *spec, int P) {
    glm_config c = tiny(tie);
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    glm_model_init_random(&m, 9, 0.3f);
    glm_err err = {0};
    size_t cap = 40000;
    float *a = calloc(cap, 4), *b = calloc(cap, 4);
    full_ctx fc = {.m = &m};
    glm_kvcache_init(&m, &fc.kv, 2, 16);
    int na = run(full_fwd, &fc, c.vocab_size, c.hidden_size, a, &err);
    glm_kvcache_free(&m, &fc.kv);
    /* the stages load a saved copy of the model */
    char dir[] = "/tmp/glm_pipe_infer.XXXXXX";
    int ok = mkdtemp(dir) != NULL && glm_model_save(&m, dir, 0 /* ST_F32 */, 0, &err) == 0;
    glm_pipe_lm lm;
    int nb = -1;
    if (ok && glm_pipe_lm_open(&lm, NULL, dir, NULL, NULL, spec, P, "cpu", GLM_F32, &err) == 0) {
        pipe_ctx pc = {.lm = &lm};
        glm_pipe_cache_init(&lm, &pc.c, 2, 7); /* small: the decode steps must grow it */
        nb = run(pipe_fwd, &pc, c.vocab_size, c.hidden_size, b, &err);
        glm_pipe_cache_free(&lm, &pc.c);
        glm_pipe_lm_free(&lm);
    }
    char name[96];
    snprintf(name, sizeof name, "pipe_infer_%s_p%d_%s_equals_whole_model", spec, P, tie ? "tied" : "untied");
    TEST_CHECK(tc, name, na > 0 && na == nb && memcmp(a, b, (size_t)na * 4) == 0, "%d vs %d values, max diff %.3g %s", na,
               nb, na == nb && na > 0 ? test_max_abs(a, b, na) : -1.0, err.msg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    free(a); free(b);
    glm_model_free(&m);
    be->destroy(be);
}

/* An adapter folder for the base at dir: a training model of the adapter's settings with
 * random (non-zero) trainable rows, saved as training saves them. */
static int make_adapter(const glm_config *c, const char *adir, glm_err *err) {
    glm_backend *be = glm_backend_cpu();
    glm_model t;
    glm_model_init(&t, c, be);
    float *host = malloc(t.tab.total * sizeof(float));
    glm_rng rng;
    glm_rng_seed(&rng, 77);
    for (size_t i = 0; i < t.tab.total; i++) host[i] = 0.3f * glm_rng_normal(&rng);
    glm_model_set_params(&t, host);
    int rc = glm_model_save_trainable(&t, adir, err);
    free(host);
    glm_model_free(&t);
    be->destroy(be);
    return rc;
}

/* The whole model with the adapter (as generate --adapter loads it) against the stages with
 * it, bit for bit; and against the base alone, which must differ (the adapter is applied). */
static void test_adapter(test_counts *tc, const char *what, glm_peft peft, const char *spec, int P) {
    glm_config c = tiny(1);
    glm_backend *be = glm_backend_cpu();
    glm_err err = {0};
    char dir[] = "/tmp/glm_pipe_ad.XXXXXX", adir[64];
    int ok = mkdtemp(dir) != NULL;
    snprintf(adir, sizeof adir, "%s/adapter", dir);
    glm_model base;
    glm_model_init_inference(&base, &c, be);
    glm_model_init_random(&base, 9, 0.3f);
    ok = ok && glm_model_save(&base, dir, 0 /* ST_F32 */, 0, &err) == 0;
    glm_config ca = c;
    ca.peft = peft;
    ok = ok && make_adapter(&ca, adir, &err) == 0;
    glm_config cr = c; /* the settings as read back from the folder */
    ok = ok && glm_adapter_read_config(adir, &cr.peft, &err) == 0 && cr.peft.kind == peft.kind;
    size_t cap = 40000;
    float *a = calloc(cap, 4), *b = calloc(cap, 4), *z = calloc(cap, 4);
    int na = -1, nb = -1, nz = -1;
    if (ok) {
        full_ctx fc = {.m = &base};
        glm_kvcache_init(&base, &fc.kv, 2, 16);
        nz = run(full_fwd, &fc, c.vocab_size, c.hidden_size, z, &err);
        glm_kvcache_free(&base, &fc.kv);
        glm_model m;
        glm_model_init_inference(&m, &cr, be);
        if (glm_model_load(&m, dir, &err) == 0 && glm_adapter_load(&m, adir, &err) == 0) {
            full_ctx fa = {.m = &m};
            glm_kvcache_init(&m, &fa.kv, 2, 16);
            na = run(full_fwd, &fa, c.vocab_size, c.hidden_size, a, &err);
            glm_kvcache_free(&m, &fa.kv);
        }
        glm_model_free(&m);
    }
    glm_pipe_lm lm;
    if (na > 0 && glm_pipe_lm_open(&lm, NULL, dir, NULL, adir, spec, P, "cpu", GLM_F32, &err) == 0) {
        pipe_ctx pc = {.lm = &lm};
        glm_pipe_cache_init(&lm, &pc.c, 2, 7);
        nb = run(pipe_fwd, &pc, c.vocab_size, c.hidden_size, b, &err);
        glm_pipe_cache_free(&lm, &pc.c);
        glm_pipe_lm_free(&lm);
    }
    char name[128];
    snprintf(name, sizeof name, "pipe_infer_adapter_%s_%s_p%d_equals_whole_model", what, spec, P);
    TEST_CHECK(tc, name, na > 0 && na == nb && memcmp(a, b, (size_t)na * 4) == 0 && na == nz && test_max_abs(a, z, na) > 1e-3,
               "%d vs %d values, max diff %.3g, adapter's effect %.3g %s", na, nb,
               na == nb && na > 0 ? test_max_abs(a, b, na) : -1.0, na == nz && na > 0 ? test_max_abs(a, z, na) : -1.0,
               err.msg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    free(a); free(b); free(z);
    glm_model_free(&base);
    be->destroy(be);
}

int main(void) {
    test_counts tc = {0};
    test_split(&tc, 1, "thudm", 3);
    test_split(&tc, 0, "auto", 2);
    test_split(&tc, 1, "auto", 5);
    test_split(&tc, 0, "thudm", 1);
    glm_peft lora = {.kind = GLM_FT_LORA, .lora_rank = 4, .lora_alpha = 8, .lora_targets = GLM_LORA_ALL};
    test_adapter(&tc, "lora", lora, "auto", 2);
    lora.lora_targets = GLM_LORA_QKV;
    lora.use_rslora = 1;
    test_adapter(&tc, "lora_qkv_rslora", lora, "thudm", 3);
    glm_peft pt = {.kind = GLM_FT_PTUNING, .pre_seq_len = 3};
    test_adapter(&tc, "ptuning", pt, "auto", 2);
    pt.prefix_projection = 1;
    test_adapter(&tc, "ptuning_projection", pt, "auto", 3);
    TEST_EXIT(&tc);
}
