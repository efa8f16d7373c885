/* Generation across stages (parallel/pipe_infer.h) on the CPU: a model split into stages by
 * a device map gives exactly the whole model's logits and hidden states through a prefill and
 * several decoding steps, across a cache grow, for tied and untied heads; the stages load
 * their parts of a saved model folder. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/rng.h"
#include "model/glm.h"
#include "parallel/pipe_infer.h"
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
    if (ok && glm_pipe_lm_open(&lm, dir, spec, P, "cpu", GLM_F32, &err) == 0) {
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

int main(void) {
    test_counts tc = {0};
    test_split(&tc, 1, "thudm", 3);
    test_split(&tc, 0, "auto", 2);
    test_split(&tc, 1, "auto", 5);
    test_split(&tc, 0, "thudm", 1);
    TEST_EXIT(&tc);
}
