/* Generation with the KV cache for ChatGLM-6B (spec section 7):
 *  - inputs: text ids + [gMASK] <sop>; 2D positions (i, 0) in the context, (mask_pos, k) for
 *    the k-th token from <sop> on; the context sees itself bidirectionally;
 *  - a batch of prompts runs in one cache, left-padded: each row's keys are one contiguous
 *    range [pad, now), so padding needs no mask beyond the per-query key ranges;
 *  - each step: repetition penalty, the original's NaN/Inf guard, then greedy argmax or
 *    Hugging Face sampling (temperature -> top-k -> top-p -> multinomial);
 *  - a row stops at <eop> (not included in the output) or at its length limit.
 * The ChatGLM2 family (ChatGLM2/3, GLM-4): no [gMASK] <sop> rule, positions 0, 1, ... causal
 * (the model's family decides: model/family.h); stops at eos or one of g->stop_ids.
 * Chat: model.chat's prompt format with history, and a streamer that prints only text that
 * can no longer change (post-processing and multi-byte characters are settled first). */
#ifndef GLM_GENERATE_H
#define GLM_GENERATE_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "core/rng.h"
#include "model/glm.h"
#include "tokenizer/tokenizer.h"

typedef struct glm_gen_cfg {
    int do_sample;            /* 0 = greedy */
    int max_length;           /* prompt + generated tokens per row (HF max_length), default 2048 */
    int max_new_tokens;       /* overrides max_length when > 0 */
    float temperature, top_p, repetition_penalty;
    int top_k;                /* 0 = off */
    int model_max_length;     /* the model's max_sequence_length: prompt + generated tokens never
                               * exceed it (0 = no limit; glm_gen_cfg_fit sets it) */
    int32_t stop_ids[4];      /* further ids that end a row besides config.json's eos, as the
                               * chat templates have them (ChatGLM3: <|user|>, <|observation|>) */
    int n_stop;
    /* Prompt lookup (Hugging Face generate's prompt_lookup_num_tokens): a draft of up to this many
     * tokens copied from where the text so far repeats its last n-gram, checked in one forward
     * pass; 0 = off. One prompt at a time (B = 1). The tokens are the same as without it. */
    int prompt_lookup_num_tokens; /* at most GLM_LOOKUP_MAX */
    int max_matching_ngram_size; /* the longest n-gram matched for a draft (0: 2, HF's default) */
    struct glm_gen_stats *stats; /* may be NULL: what the drafts did, added to */
    /* Decoding kept to a constraint (JSON mode, a JSON Schema, one of some strings:
     * infer/constrain.h) over the tokens' bytes in vocab; NULL = none. Every row's answer keeps
     * to it from its start, and ends only where it is complete. */
    struct glm_constraint *constraint;
    const struct glm_text_vocab *vocab;
} glm_gen_cfg;

#define GLM_LOOKUP_MAX 63 /* a pass's rows come back through glm_cached_rows_logits (GLM_ROWS_LOGITS_MAX) */

/* Counts of prompt lookup's work over generations (glm_gen_cfg.stats). */
typedef struct glm_gen_stats {
    long forwards;  /* decode passes after the prompt's */
    long drafted;   /* draft tokens fed */
    long accepted;  /* of them, the tokens the model chose too */
} glm_gen_stats;

/* HF's PromptLookupCandidateGenerator over the text a[0, na) then b[0, nb) (a prompt and the answer
 * so far, read where they are): for g = min(max_ngram, n - 1) down to 1 (n = na + nb), the first
 * earlier place where the last g ids occur gives the ids after it, at most max_draft, never past
 * the text and cut before the first of ends[n_ends] (an end token would end the answer); written
 * to draft, their count returned (0: no draft). */
int glm_prompt_lookup(const int32_t *a, int na, const int32_t *b, int nb, int max_ngram, int max_draft,
                      const int32_t *ends, int n_ends, int32_t *draft);

/* The original model.chat defaults: sampling, max_length 2048, top_p 0.7, temperature 0.95,
 * and the HF defaults it leaves alone: top_k 50, repetition_penalty 1.0. */
void glm_gen_cfg_chat_defaults(glm_gen_cfg *c);
/* Checks ranges (temperature > 0 when sampling, 0 < top_p <= 1, ...); err names the flag. */
int glm_gen_cfg_check(const glm_gen_cfg *c, glm_err *err);
/* Fits the settings to a model whose config (`source`, for messages) has max_sequence_length
 * model_max: sets model_max_length and refuses a max_new_tokens that no prompt leaves room for
 * (a prompt is at least [gMASK] <sop>), naming the flag, its value and the limit. */
int glm_gen_cfg_fit(glm_gen_cfg *c, int model_max, const char *source, glm_err *err);
/* Tokens a row with an n-token prompt may generate (<= 0: none); never past model_max_length. */
int glm_gen_limit(const glm_gen_cfg *c, int n_prompt);
/* The longest prompt ([gMASK] <sop> included) that still leaves room for the response:
 * model_max_length - max_new_tokens when max_new_tokens is set, else the smaller of max_length
 * and model_max_length, less one token. */
int glm_gen_max_prompt(const glm_gen_cfg *c);
/* Which limit glm_gen_max_prompt comes from, for messages, e.g. "the model's
 * max_sequence_length 64 less --max_new_tokens 8". */
void glm_gen_limit_text(const glm_gen_cfg *c, char *buf, size_t cap);

/* Called once per generated token (not for <eop>). */
typedef void (*glm_token_fn)(void *ctx, int row, int32_t id);

/* Generates for B prompts (full model inputs, see glm_prompt_inputs) at once. rngs[B]: one
 * sampling stream per row (so a row's result does not depend on its batch neighbours).
 * outs[B] receive the generated ids. Every row must leave room (glm_gen_limit > 0). */
/* What generation runs on: one model with its KV cache, or (pipe != NULL) a model split into
 * stages over several devices (parallel/pipe/pipe_infer.h), whose cached forward has the same
 * contract. */
struct glm_pipe_lm;
typedef struct glm_lm {
    glm_model *m;
    struct glm_pipe_lm *pipe;
} glm_lm;
/* glm_generate on either kind of model. */
int glm_generate_lm(glm_lm lm, int B, const glm_ids *prompts, const glm_gen_cfg *g, glm_rng *rngs, glm_ids *outs,
                    glm_token_fn on_token, void *cbctx, glm_err *err);
int glm_generate(glm_model *m, int B, const glm_ids *prompts, const glm_gen_cfg *g, glm_rng *rngs, glm_ids *outs,
                 glm_token_fn on_token, void *ctx, glm_err *err);

/* A conversation's KV cache kept from turn to turn (`glmtrain chat`, as THUDM's ChatGLM2/3
 * cli_demo keeps past_key_values): each turn's prompt repeats the last one and its answer, so the
 * rows of the tokens they share are not computed again. Only where a token's keys and values
 * depend on the tokens before it alone (glm_family.causal: ChatGLM2/3, GLM-4); GLM v1's prompt sees
 * itself whole, so there every turn starts afresh. */
typedef struct glm_gen_session {
    glm_lm lm;
    int reuse;                 /* 1: keep the cache between turns (when the family allows) */
    struct gen_cache *cache;   /* NULL until the first turn */
    glm_ids fed;               /* the tokens whose rows the cache holds, in order */
    int reused;                /* the last turn's prompt tokens taken from the cache */
} glm_gen_session;
void glm_gen_session_init(glm_gen_session *s, glm_lm lm, int reuse);
/* One prompt (B = 1) as glm_generate_lm, starting from the longest run of the cache's tokens the
 * prompt begins with (at most all but its last token). The same tokens as without the cache; on
 * the CPU the same numbers. */
int glm_generate_session(glm_gen_session *s, const glm_ids *prompt, const glm_gen_cfg *g, glm_rng *rng, glm_ids *out,
                         glm_token_fn on_token, void *cbctx, glm_err *err);
/* Forgets what the cache holds (a cleared history); the memory stays for the next turn. */
void glm_gen_session_forget(glm_gen_session *s);
void glm_gen_session_free(glm_gen_session *s);

/* One step's choice from logits[V] (modified in place). seen[V] (may be NULL) flags the ids
 * already in the sequence, for the repetition penalty. */
int32_t glm_sample_next(float *logits, int V, const glm_gen_cfg *g, const uint8_t *seen, glm_rng *rng);
/* The HF warpers in place: temperature, then top-k (ties with the k-th value kept), then top-p
 * (the most likely tokens up to mass top_p, at least one); removed entries become -inf. */
void glm_warp_logits(float *logits, int V, const glm_gen_cfg *g);

/* ---- prompts ---- */
/* text ids (the first max_text of them when max_text > 0) + [gMASK] <sop>, appended to out. */
int glm_prompt_inputs(const glm_tokenizer *tok, const glm_config *c, const char *text, int max_text, glm_ids *out,
                      glm_err *err);
/* glm_prompt_inputs that also tells how many text tokens the truncation dropped (*dropped). */
int glm_prompt_inputs_cut(const glm_tokenizer *tok, const glm_config *c, const char *text, int max_text, glm_ids *out,
                          int *dropped, glm_err *err);
/* model.chat's prompt: no history -> the query; else "[Round i]\n问：q\n答：r\n"... +
 * "[Round n]\n问：query\n答：". hist holds 2*n_hist strings (q0, r0, ...). Caller frees. */
char *glm_chat_prompt(const char *query, const char *const *hist, int n_hist);
/* A chat turn's model inputs (cleared first). When they exceed max_prompt tokens (see
 * glm_gen_max_prompt) the oldest rounds are left out until they fit (*dropped counts them);
 * fails when the query alone does not fit. *prompt_text (may be NULL) receives the prompt used (caller frees). */
int glm_chat_inputs(const glm_tokenizer *tok, const glm_config *c, const char *query, const char *const *hist,
                    int n_hist, int max_prompt, glm_ids *out, int *dropped, char **prompt_text, glm_err *err);

/* ---- streaming ---- */
typedef struct glm_streamer {
    const glm_tokenizer *tok;
    int postprocess;       /* apply glm_chat_postprocess (model.chat) */
    glm_ids ids;
    char *shown;           /* text handed out so far */
    size_t n_shown;
    char *delta;           /* last piece handed out */
    int diverged;          /* the text changed behind what was shown: stop streaming */
} glm_streamer;
void glm_streamer_init(glm_streamer *s, const glm_tokenizer *tok, int postprocess);
/* Adds a token; returns the text that became final ("" when none; valid until the next call). */
const char *glm_streamer_push(glm_streamer *s, int32_t id);
/* The response (caller frees). *tail gets what the screen still needs (caller frees): the rest
 * of the response, or "\n" + the whole response if the streamed text could not stay a prefix. */
char *glm_streamer_finish(glm_streamer *s, char **tail);
void glm_streamer_free(glm_streamer *s);

/* Decoded response text (caller frees): glm_tokenizer_decode, then glm_chat_postprocess when
 * postprocess, else Python's str.strip() only (what ptuning's predictions get). */
char *glm_response_text(const glm_tokenizer *tok, const int32_t *ids, int n, int postprocess);

#endif
