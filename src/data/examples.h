/* Training examples from records, exactly as THUDM ChatGLM-6B ptuning/main.py
 * preprocess_function_train builds them (spec 5.5):
 *
 *   prompt = source_prefix + [system "\n"] + body, body =
 *              query                                              (no history column)
 *              Σ "[Round {i}]\n问：{q_i}\n答：{r_i}\n" + "[Round {n}]\n问：{query}\n答："  (history)
 *   a = encode(prompt)[: max_source_length - 1]      b = encode(answer)[: max_target_length - 2]
 *   ids = a + [gMASK, sop] + b + [eop]               labels = [-100] * len(a)+1 + ids[len(a)+1:]
 *
 * (query = instruction, plus "\n" + input when an alpaca input is non-empty.) The special tokens
 * are appended after truncation, so they always survive. A record whose query or answer is
 * empty is dropped (ptuning's `if prompt and answer`), counted as "empty". An answer that
 * encodes to no tokens at all (e.g. only spaces, which the normaliser removes) is dropped too,
 * counted as "answer encodes to nothing": such an example would only teach <eop>.
 *
 * Options beyond ptuning: a prompt_template replaces the body (placeholders below), the round
 * rule can follow model.chat (no wrapper for a first turn), train_on_prompt puts labels on the
 * prompt tokens too. Tokenization goes through glm_encoder so tests can use a fake one. */
#ifndef GLM_DATA_EXAMPLES_H
#define GLM_DATA_EXAMPLES_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "data/reader.h"

/* Tokenizer seen by the data layer. encode appends the ids of text (no special tokens) to out
 * and must be thread-safe (examples are encoded in parallel). fingerprint identifies the
 * vocabulary (a hash of the tokenizer files) and goes into the cache key. */
typedef struct glm_encoder {
    int (*encode)(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err);
    void *ctx;
    int32_t gmask, sop, eop, pad, mask;
    uint64_t fingerprint;
} glm_encoder;

/* Adapter for the real tokenizer (data/encoder_tok.c). tokenizer_path (the folder or .model
 * file given to glm_tokenizer_load) is hashed into the fingerprint; NULL leaves it 0. */
struct glm_tokenizer;
int glm_encoder_from_tokenizer(glm_encoder *e, const struct glm_tokenizer *t, const char *tokenizer_path,
                               glm_err *err);
/* Hash of the tokenizer files at path (a .model file, or a folder's ice_text.model /
 * tokenizer.model and tokenizer_config.json). */
int glm_tokenizer_fingerprint(const char *path, uint64_t *out, glm_err *err);

typedef enum {
    GLM_ROUNDS_COLUMN = 0, /* ptuning train: wrap in rounds whenever the record has a history column */
    GLM_ROUNDS_NONEMPTY,   /* model.chat / ptuning eval: wrap only when the history is non-empty */
} glm_rounds_rule;

typedef struct glm_example_cfg {
    int max_source_length;        /* default 1024 (ptuning arguments.py) */
    int max_target_length;        /* default 128 */
    const char *source_prefix;    /* prepended to every prompt; NULL = "" */
    /* NULL = the ptuning body. Otherwise the body, with placeholders:
     *   {instruction} the query (instruction + "\n" + input) — or the bare instruction when the
     *                 template also uses {input};  {query} the same as {instruction}
     *   {input} alpaca input ("" if none)   {system} system prompt ("" if none; when the
     *   template does not use it, "system\n" is prepended as without a template)
     *   {history} every history round rendered with history_template
     *   {round} n = number of history rounds   {round1} n + 1
     *   {{ and }} literal braces.
     * E.g. ChatGLM2: prompt_template "{history}[Round {round1}]\n\n问：{instruction}\n\n答：",
     *                history_template "[Round {i1}]\n\n问：{q}\n\n答：{r}\n\n". */
    const char *prompt_template;
    /* One history round: {i} index from 0, {i1} index from 1, {q}, {r}.
     * NULL = "[Round {i}]\n问：{q}\n答：{r}\n" (ChatGLM-6B; also used without a prompt_template). */
    const char *history_template;
    glm_rounds_rule rounds;       /* used without a prompt_template */
    int train_on_prompt;          /* labels on every token (the prompt too) */
} glm_example_cfg;

void glm_example_cfg_init(glm_example_cfg *c);
/* Checks lengths (max_source_length >= 2, max_target_length >= 3) and template placeholders. */
int glm_example_cfg_check(const glm_example_cfg *c, glm_err *err);

/* Why a record did not become an example. */
typedef enum { GLM_EX_OK = 0, GLM_EX_EMPTY, GLM_EX_NO_ANSWER_TOKENS } glm_ex_status;

typedef struct glm_example_info {
    glm_ex_status status;
    int truncated_prompt, truncated_answer; /* 1 when a / b were cut */
    int prompt_tokens, answer_tokens;       /* before truncation */
} glm_example_info;

/* The prompt text for a record (caller frees). */
char *glm_example_prompt(const glm_example_cfg *c, const glm_record *r);
/* Builds ids and labels (cleared first) for one record. Returns 0 (see info->status: only
 * GLM_EX_OK filled ids/labels) or -1 when the encoder fails. */
int glm_example_build(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r,
                      glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err);

/* Turns the escapes \n \t \\ of a command-line template into characters, in place. */
void glm_unescape(char *s);

#endif
