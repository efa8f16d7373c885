/* vLLM's guided_choice: the answer is exactly one of a few given strings (a label, yes or no, an
 * option's letter). Before each choice a token is allowed when the answer's bytes so far followed
 * by its bytes begin one of the strings, and the end tokens when the bytes so far are one of them
 * whole; everything else gets a logit far below the rest (finite, as JSON mode's). An answer's first
 * token counts without the space decoding drops from it (SentencePiece's dummy prefix). */
#ifndef GLM_INFER_CHOICE_MODE_H
#define GLM_INFER_CHOICE_MODE_H
#include <stddef.h>
#include <stdint.h>
#include "infer/text_vocab.h"

/* The bytes token id adds to an answer that holds `so_far` bytes already (*b points into v). */
size_t glm_choice_token_bytes(const glm_text_vocab *v, int32_t id, size_t so_far, const char **b);
/* logits[V] masked for an answer of bytes text[0..n) that must become one of choices[k]
 * (len[k] bytes each); ends[n_ends] end the answer. */
void glm_choice_mask(const glm_text_vocab *v, const char *const *choices, const size_t *len, int n_choices,
                     const char *text, size_t n, const int32_t *ends, int n_ends, float *logits);

#endif
