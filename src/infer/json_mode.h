/* JSON mode (OpenAI's response_format {"type": "json_object"}): decoding constrained so that the
 * answer is one JSON object (RFC 8259, as Python's json.loads(strict=True) takes it: no NaN or
 * Infinity, no control characters in strings; strings of well-formed UTF-8, so that the answer's
 * text holds no replacement character), and it ends when the object closes.
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
    uint8_t u8need, u8lo, u8hi; /* in a string: the bytes still to come of a UTF-8 character
                                 * (glm_utf8_step) */
    char stack[GLM_JSON_MAX_DEPTH]; /* '{' or '[' for each open container */
} glm_json_state;

void glm_json_init(glm_json_state *s);
/* Feeds bytes b[0..n): 0 and s moved on, or -1 (s unchanged) where a byte cannot come next. */
int glm_json_feed(glm_json_state *s, const unsigned char *b, size_t n);
/* The object is complete: only the end may follow. */
int glm_json_done(const glm_json_state *s);

/* JSON's number grammar a byte at a time (JSON mode's and a schema's recognizers): *step is where
 * the number is (GLM_NUM_*, from glm_json_number_start); returns 0 when c is taken, 1 when the
 * number ended before c, -1 when c cannot come. real 0: an integer (no fraction, no exponent). */
enum { GLM_NUM_MINUS, GLM_NUM_ZERO, GLM_NUM_INT, GLM_NUM_DOT, GLM_NUM_FRAC, GLM_NUM_E, GLM_NUM_ESIGN, GLM_NUM_EXP };
static inline int glm_json_number_first(unsigned c) { return c == '-' || (c >= '0' && c <= '9'); }
static inline uint8_t glm_json_number_start(unsigned c) { return c == '-' ? GLM_NUM_MINUS : c == '0' ? GLM_NUM_ZERO : GLM_NUM_INT; }
int glm_json_number_byte(uint8_t *step, unsigned c, int real);

/* Before a choice: logits[V] of every token that cannot come next in state s set to far below the
 * rest; ends[n_ends] are the ids that end the answer (allowed exactly when the object is done). */
void glm_json_mask(const glm_text_vocab *v, const glm_json_state *s, const int32_t *ends, int n_ends, float *logits);
/* After a choice: the chosen token's bytes fed (an end token feeds nothing). */
void glm_json_advance(const glm_text_vocab *v, glm_json_state *s, int32_t id);

#endif
