/* What the `serve` targets (fuzz_serve_request.c, fuzz_serve_score.c) share: their tokenizers. */
#ifndef GLM_FUZZ_SERVE_UTIL_H
#define GLM_FUZZ_SERVE_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/config.h"
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

#endif
