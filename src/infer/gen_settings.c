/* Generation settings (infer/generate.h): model.chat's defaults, their checks and the length
 * limits they set. Apart from the decoding loop so that what only reads settings (the server's
 * request parsing, and its fuzz target) needs no model. */
#include <stdio.h>
#include "infer/generate.h"

void glm_gen_cfg_chat_defaults(glm_gen_cfg *c) {
    *c = (glm_gen_cfg){.do_sample = 1, .max_length = 2048, .max_new_tokens = 0, .temperature = 0.95f,
                       .top_p = 0.7f, .repetition_penalty = 1.0f, .top_k = 50};
}

int glm_gen_cfg_check(const glm_gen_cfg *c, glm_err *err) {
    if (c->max_new_tokens < 0) return glm_fail(err, "--max_new_tokens must be >= 0 (got %d)", c->max_new_tokens);
    if (c->max_new_tokens == 0 && c->max_length < 2) return glm_fail(err, "--max_length must be >= 2 (got %d)", c->max_length);
    if (!(c->repetition_penalty > 0)) return glm_fail(err, "--repetition_penalty must be > 0 (got %g)", c->repetition_penalty);
    if (c->prompt_lookup_num_tokens < 0 || c->prompt_lookup_num_tokens > GLM_LOOKUP_MAX)
        return glm_fail(err, "--prompt_lookup_num_tokens must be in [0, %d] (got %d)", GLM_LOOKUP_MAX,
                        c->prompt_lookup_num_tokens),
               glm_hint(err, "0 turns prompt lookup off; 10 is Hugging Face's example");
    if (c->prompt_lookup_num_tokens > 0 && c->max_matching_ngram_size < 1)
        return glm_fail(err, "--max_matching_ngram_size must be >= 1 (got %d)", c->max_matching_ngram_size);
    if (!c->do_sample) return 0;
    if (!(c->temperature > 0)) {
        glm_fail(err, "--temperature must be > 0 when sampling (got %g)", c->temperature);
        return glm_hint(err, "for deterministic output use --do_sample false (greedy)");
    }
    if (!(c->top_p > 0 && c->top_p <= 1)) return glm_fail(err, "--top_p must be in (0, 1] (got %g)", c->top_p);
    if (c->top_k < 0) return glm_fail(err, "--top_k must be >= 0 (got %d)", c->top_k);
    return 0;
}

/* A prompt is at least [gMASK] <sop>. */
enum { MIN_PROMPT = 2 };

int glm_gen_cfg_fit(glm_gen_cfg *c, int model_max, const char *source, glm_err *err) {
    c->model_max_length = model_max > 0 ? model_max : 0;
    if (c->model_max_length && c->max_new_tokens > c->model_max_length - MIN_PROMPT) {
        glm_fail(err, "--max_new_tokens %d does not fit the model: %s has max_sequence_length %d and a prompt takes at least %d tokens ([gMASK] <sop>), so at most %d new tokens",
                 c->max_new_tokens, source, c->model_max_length, MIN_PROMPT, c->model_max_length - MIN_PROMPT);
        return glm_hint(err, "lower --max_new_tokens (prompt + new tokens must fit in max_sequence_length)");
    }
    return 0;
}

int glm_gen_limit(const glm_gen_cfg *c, int n_prompt) {
    int lim = c->max_new_tokens > 0 ? c->max_new_tokens : c->max_length - n_prompt;
    if (c->model_max_length > 0 && lim > c->model_max_length - n_prompt) lim = c->model_max_length - n_prompt;
    return lim;
}

int glm_gen_max_prompt(const glm_gen_cfg *c) {
    int mm = c->model_max_length > 0 ? c->model_max_length : 1 << 30;
    if (c->max_new_tokens > 0) return mm - c->max_new_tokens;
    return (c->max_length < mm ? c->max_length : mm) - 1;
}

void glm_gen_limit_text(const glm_gen_cfg *c, char *buf, size_t cap) {
    int mm = c->model_max_length;
    if (c->max_new_tokens > 0 && mm > 0)
        snprintf(buf, cap, "the model's max_sequence_length %d less --max_new_tokens %d", mm, c->max_new_tokens);
    else if (c->max_new_tokens > 0)
        snprintf(buf, cap, "--max_new_tokens %d", c->max_new_tokens);
    else if (mm > 0 && mm <= c->max_length)
        snprintf(buf, cap, "the model's max_sequence_length %d less 1 for the response", mm);
    else
        snprintf(buf, cap, "--max_length %d less 1 for the response", c->max_length);
}
