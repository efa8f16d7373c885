/* What the `serve` targets (fuzz_serve_request.c, fuzz_serve_score.c) share: their tokenizers. */
#ifndef GLM_FUZZ_SERVE_UTIL_H
#define GLM_FUZZ_SERVE_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/config.h"
#include "model/family.h"
#include "tokenizer/tokenizer.h"

/* Loads GLM_FUZZ_SERVE_TOKENIZERS (colon-separated folders or .model files; the test script gives a
 * ChatGLM-6B-style one, a ChatGLM3-style one, a GLM-4 rank file and a plain SentencePiece model), else
 * ChatGLM-6B's ice_text.model from ../shared, up to max of them, each with a model config whose
 * [gMASK] / [MASK] / <sop> are the tokenizer's (ChatGLM-6B's config.json names them). Returns how many
 * loaded; exits when none did. */
static inline int fuzz_serve_tokenizers(const char *who, glm_tokenizer **toks, glm_config *cfgs, int max) {
    const char *env = getenv("GLM_FUZZ_SERVE_TOKENIZERS");
    char *list = strdup(env && *env ? env : "../shared/tokenizers/chatglm-6b/ice_text.model");
    int n = 0;
    for (char *p = strtok(list, ":"); p && n < max; p = strtok(NULL, ":")) {
        glm_err err;
        if (glm_tokenizer_load(&toks[n], p, &err)) { fprintf(stderr, "%s: %s\n", who, err.msg); continue; }
        int v1 = glm_tokenizer_kind(toks[n]) == GLM_TOK_CHATGLM1;
        glm_config c = v1 ? glm_config_chatglm6b() : glm_config_chatglm2_6b();
        glm_special_ids sp = glm_tokenizer_specials(toks[n]);
        if (v1) { c.gmask_token_id = sp.gmask; c.mask_token_id = sp.mask; c.bos_token_id = sp.sop; }
        cfgs[n++] = c;
    }
    free(list);
    if (!n) { fprintf(stderr, "%s: no tokenizer loaded (set GLM_FUZZ_SERVE_TOKENIZERS)\n", who); exit(1); }
    return n;
}

/* ChatGLM-6B's position rule (block_glm.c) as far as acceptance goes: a mask token and <sop>
 * somewhere; the causal families take any ids. */
static inline int fuzz_v1_positions(const glm_config *c, const int32_t *ids, int n, int32_t *pos, int32_t *bpos,
                                    int32_t *hi, int state[2]) {
    int ctx = 0, mask = 0;
    for (int i = 0; i < n; i++) {
        ctx |= ids[i] == c->bos_token_id;
        mask |= ids[i] == c->gmask_token_id || ids[i] == c->mask_token_id;
        pos[i] = bpos[i] = 0;
        hi[i] = i + 1;
    }
    state[0] = state[1] = 0;
    return ctx && mask ? 0 : -1;
}

static inline int fuzz_causal_positions(const glm_config *c, const int32_t *ids, int n, int32_t *pos, int32_t *bpos,
                                        int32_t *hi, int state[2]) {
    (void)c; (void)ids;
    for (int i = 0; i < n; i++) { pos[i] = i; bpos[i] = 0; hi[i] = i + 1; }
    state[0] = state[1] = 0;
    return 0;
}

/* The family whose prompt rule a tokenizer's model follows (only prompt_positions is set). */
static inline const glm_family *fuzz_serve_family(const glm_tokenizer *tok) {
    static const glm_family v1 = {.prompt_positions = fuzz_v1_positions}, causal = {.prompt_positions = fuzz_causal_positions};
    return glm_tokenizer_kind(tok) == GLM_TOK_CHATGLM1 ? &v1 : &causal;
}

#endif
