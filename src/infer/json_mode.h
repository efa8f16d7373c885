/* JSON mode (OpenAI's response_format {"type": "json_object"}): decoding constrained so that the
 * answer is one JSON object (RFC 8259, as Python's json.loads(strict=True) takes it: no NaN or
 * Infinity, no control characters in strings), and it ends when the object closes.
 *
 * A byte-level pushdown recognizer (glm_json_state) follows the text chosen so far; before each
 * choice every token whose bytes (glm_tokenizer_token_bytes) the recognizer would refuse gets a
 * logit far below the rest (finite: model.chat's guard turns infinite logits into token 5), and
 * so do the end tokens until the object is closed; after it only the end tokens stay. A run of
 * more than GLM_JSON_MAX_SPACE whitespace bytes between tokens is refused, so that a model cannot
 * fill its answer with blank lines; containers nest at most GLM_JSON_MAX_DEPTH deep. */
#ifndef GLM_INFER_JSON_MODE_H
#define GLM_INFER_JSON_MODE_H
#include <stddef.h>
#include <stdint.h>
#include "infer/text_vocab.h"

#define GLM_JSON_MAX_DEPTH 32
#define GLM_JSON_MAX_SPACE 40

typedef struct glm_json_state {
    uint8_t mode, sub;          /* where the recognizer is (json_mode.c), and a number's or literal's step */
    uint8_t depth, key;         /* containers open; the string being read is an object's key */
    uint8_t space;              /* whitespace bytes in a row */
    char stack[GLM_JSON_MAX_DEPTH]; /* '{' or '[' for each open container */
} glm_json_state;

void glm_json_init(glm_json_state *s);
/* Feeds bytes b[0..n): 0 and s moved on, or -1 (s unchanged) where a byte cannot come next. */
int glm_json_feed(glm_json_state *s, const unsigned char *b, size_t n);
/* The object is complete: only the end may follow. */
int glm_json_done(const glm_json_state *s);

/* Before a choice: logits[V] of every token that cannot come next in state s set to far below the
 * rest; ends[n_ends] are the ids that end the answer (allowed exactly when the object is done). */
void glm_json_mask(const glm_text_vocab *v, const glm_json_state *s, const int32_t *ends, int n_ends, float *logits);
/* After a choice: the chosen token's bytes fed (an end token feeds nothing). */
void glm_json_advance(const glm_text_vocab *v, glm_json_state *s, int32_t id);

#endif
