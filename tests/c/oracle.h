/* The THUDM oracle (../shared/oracles/chatglm-cpp/glm_model.data, or $GLM_SHARED/oracles/...)
 * run through any backend: a 1-layer model, a 3-token prompt, then two KV-cache decode steps.
 * Shared by the CPU test (tests/c/test_model_oracle.c) and the CUDA one (tests/cuda/). */
#ifndef GLM_TEST_ORACLE_H
#define GLM_TEST_ORACLE_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/half.h"
#include "model/glm.h"
#include "test.h"

static inline const char *oracle_dir(void) {
    const char *s = getenv("GLM_SHARED");
    return s ? s : "../shared";
}

/* Reads an oracle file (raw little-endian floats) by name in the oracle folder, or by path
 * when `name` holds a '/'; NULL when it is missing. */
static inline float *oracle_load(const char *name, size_t *n_floats) {
    char path[1024];
    if (strchr(name, '/')) snprintf(path, sizeof path, "%s", name);
    else snprintf(path, sizeof path, "%s/oracles/chatglm-cpp/%s", oracle_dir(), name);
    glm_err err;
    size_t len;
    char *buf = glm_read_file(path, &len, &err);
    if (!buf) return NULL;
    *n_floats = len / 4;
    return (float *)buf;
}

/* Runs a GLM v1 oracle file (glm_model.data's layout, `file` a name in the oracle folder or a
 * path) behind a P-Tuning prefix of P tokens (0: none) on `be`: 1 when the file is missing, -1
 * on a failure (a file of another size included), else 0 with the max-abs errors of the prompt
 * and the two decode steps in e[0..2]. */
static inline int oracle_glm_run(glm_backend *be, const char *file, int P, double e[3]);
static inline int oracle_glm_model(glm_backend *be, double e[3]) { return oracle_glm_run(be, "glm_model.data", 0, e); }
/* glm_ptuning_v2_model.data: the same model behind a P-Tuning v2 prefix of 5 tokens, whose
 * keys/values (fp16 [2L, NH, P, HD]) open the file; they become the prefix embedding. */
static inline int oracle_glm_ptuning(glm_backend *be, double e[3]) { return oracle_glm_run(be, "glm_ptuning_v2_model.data", 5, e); }

/* The prompt and the two decode steps of an oracle file: each step's positions, block positions
 * and key-range ends (every range starts at 0: one row, no padding). */
typedef struct oracle_steps { int32_t pos[3][3], bpos[3][3], hi[3][3]; } oracle_steps;

/* Runs an oracle file in chatglm.cpp's layout for config c: the optional P-Tuning prefix cache
 * (fp16 [2L, heads, P, HD], heads = c's key/value heads) first, then the base tensors in table
 * order (no output layer), then x1 [3] y1 [3, H] x2 y2 x3 y3. */
static inline int oracle_run(glm_backend *be, glm_config c, const char *file, int P, const oracle_steps *st, double e[3]) {
    size_t n;
    float *d = oracle_load(file, &n);
    if (!d) return 1;
    if (P) c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = P};
    glm_model m;
    glm_model_init(&m, &c, be);
    int G = glm_kv_heads(&c), HD = glm_head_dim(&c), KV = glm_prefix_width(&c), H = c.hidden_size;
    const float *p = d;
    if (P) { /* [2L, G, P, HD] fp16 -> the embedding [P, 2L, G, HD] */
        const uint16_t *h16 = (const uint16_t *)d;
        float *emb = malloc(sizeof(float) * P * KV);
        for (int s = 0; s < 2 * c.num_layers; s++)
            for (int h = 0; h < G; h++)
                for (int j = 0; j < P; j++)
                    for (int k = 0; k < HD; k++)
                        emb[(size_t)j * KV + ((size_t)s * G + h) * HD + k] = glm_f16_to_f32(h16[((s * G + h) * P + j) * HD + k]);
        be->upload_f32(be, m.w.prefix_emb, emb, (size_t)P * KV);
        free(emb);
        p = (const float *)(h16 + (size_t)P * KV);
    }
    glm_table base;
    glm_table_build(&base, &c);
    for (int i = 0; i < base.n; i++) {
        if (base.t[i].kind == T_LM_HEAD) continue; /* the files stop at the final norm */
        void *dst;
        glm_model_find(&m, base.t[i].name, &dst);
        be->upload_f32(be, dst, p, base.t[i].numel);
        p += base.t[i].numel;
    }
    glm_table_free(&base);
    const int32_t *x[3];
    const float *y[3];
    int nt[3] = {3, 1, 1};
    for (int k = 0; k < 3; k++) {
        x[k] = (const int32_t *)p; p += nt[k];
        y[k] = p; p += (size_t)nt[k] * H;
    }
    int rc = (size_t)(p - d) == n ? 0 : -1;
    glm_kvcache kv;
    glm_kvcache_init(&m, &kv, 1, 8);
    glm_err err;
    float out[3 * 64];
    int32_t zero[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        if (!rc) rc = glm_forward_cached(&m, &kv, nt[k], x[k], st->pos[k], st->bpos[k], zero, st->hi[k], out, NULL, &err);
        e[k] = rc ? 1e9 : test_max_abs(out, y[k], (size_t)nt[k] * H);
    }
    glm_kvcache_free(&m, &kv);
    glm_model_free(&m);
    free(d);
    return rc ? -1 : 0;
}

static inline int oracle_glm_run(glm_backend *be, const char *file, int P, double e[3]) {
    glm_config c = {.vocab_size = 5, .hidden_size = 32, .num_layers = 1, .num_attention_heads = 8,
                    .inner_hidden_size = 128, .max_sequence_length = 16, .layernorm_epsilon = 1e-5f,
                    .position_encoding_2d = 1, .tie_word_embeddings = 1, .bos_token_id = 4, .eos_token_id = 4,
                    .mask_token_id = 0, .gmask_token_id = 0, .pad_token_id = 0, .alpha = 7.483314773547883f};
    /* positions and the prefix mask as the oracle's README gives them */
    static const oracle_steps st = {.pos = {{0, 1, 1}, {1}, {1}}, .bpos = {{0, 0, 1}, {2}, {3}}, .hi = {{2, 2, 3}, {4}, {5}}};
    return oracle_run(be, c, file, P, &st, e);
}

/* The ChatGLM2/3 oracle (glm2_model.data: the README's layout): one layer of THUDM's ChatGLM2
 * code, a causal prompt of 3 tokens at positions 0..2, then two decode steps at 3 and 4, with or
 * without a P-Tuning prefix in front. */
static inline int oracle_glm2_run(glm_backend *be, const char *file, int P, double e[3]) {
    glm_config c = glm_config_chatglm2_6b();
    c.vocab_size = 5; c.hidden_size = 32; c.num_layers = 1; c.num_attention_heads = 8; c.head_dim = 4;
    c.num_kv_heads = 2; c.inner_hidden_size = 48; c.max_sequence_length = 16; c.pad_token_id = 0; c.eos_token_id = 4;
    static const oracle_steps st = {.pos = {{0, 1, 2}, {3}, {4}}, .bpos = {{0}}, .hi = {{1, 2, 3}, {4}, {5}}};
    return oracle_run(be, c, file, P, &st, e);
}

#endif
