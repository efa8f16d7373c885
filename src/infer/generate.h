/* Generation with the KV cache: ChatGLM-6B prompts (text + [gMASK] <sop>, 2D positions),
 * sampling with Hugging Face semantics (repetition penalty, temperature, top-k, top-p, in that
 * order, then a multinomial draw; or greedy), the NaN/Inf guard of the original, stop at <eop>. */
#ifndef GLM_GENERATE_H
#define GLM_GENERATE_H
#include <stdint.h>
#include "core/err.h"
#include "core/rng.h"
#include "model/glm.h"
#include "tokenizer/tokenizer.h"

typedef struct glm_gen_cfg {
    int do_sample;           /* 0 = greedy */
    int max_length;          /* prompt + generated tokens (HF max_length), default 2048 */
    int max_new_tokens;      /* overrides max_length when > 0 */
    float temperature, top_p, repetition_penalty;
    int top_k;
    uint64_t seed;
} glm_gen_cfg;

/* The original model.chat defaults: sampling, top_p 0.7, temperature 0.95, top_k 50. */
void glm_gen_cfg_chat_defaults(glm_gen_cfg *c);

/* Called with each new token's text as it is decoded (may be NULL). */
typedef void (*glm_stream_fn)(void *ctx, const char *piece_text);

/* Generates from prompt ids (already including [gMASK] <sop>). Generated ids (without the
 * final <eop>) go to out. Returns 0 or -1. */
int glm_generate_ids(glm_model *m, const glm_config *c, const int32_t *prompt, int n_prompt, const glm_gen_cfg *g,
                     glm_rng *rng, glm_ids *out, const glm_tokenizer *tok, glm_stream_fn stream, void *stream_ctx,
                     glm_err *err);
/* ChatGLM-6B chat prompt: no history -> query; else "[Round i]\n问：q\n答：r\n"... + "[Round n]\n问：query\n答：".
 * hist holds 2*n_hist strings (q0, r0, ...). Caller frees. */
char *glm_chat_prompt(const char *query, const char *const *hist, int n_hist);
/* Encodes text + [gMASK] <sop>, generates, decodes and post-processes the response
 * (caller frees). */
char *glm_generate_text(glm_model *m, const glm_tokenizer *tok, const char *prompt_text, const glm_gen_cfg *g,
                        glm_rng *rng, glm_stream_fn stream, void *stream_ctx, glm_err *err);

#endif
