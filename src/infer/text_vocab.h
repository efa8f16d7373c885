/* Every token's bytes as text, for the decoding constraints (infer/json_mode.h, infer/choice_mode.h):
 * which tokens may appear in an answer's text at all (pieces that decode to text of their own: not
 * control or special tokens, not <unk>), and what each one adds. */
#ifndef GLM_INFER_TEXT_VOCAB_H
#define GLM_INFER_TEXT_VOCAB_H
#include <stddef.h>
#include <stdint.h>
#include "tokenizer/tokenizer.h"

typedef struct glm_text_vocab {
    int V;
    char *blob;          /* every token's bytes, one after another */
    size_t *off;         /* [V + 1] token i's bytes are blob[off[i], off[i + 1]) */
    uint8_t *text;       /* [V] 1: the token may be part of an answer's text */
    /* what lets JSON mode refuse most tokens without feeding them (infer/json_mode.c): */
    uint8_t *plain;      /* [V] 1: a text token that can sit inside a JSON string as it is (no quote,
                          * backslash or control byte) */
    uint8_t *lead;       /* [V] a text token's first byte */
    uint8_t *sig, *nsp;  /* [V] its first byte that is not whitespace (0: none) and the whitespace before
                          * it (at most 255) */
    int drop_first_space; /* decoding drops a leading space from an answer's first token (SentencePiece's
                           * dummy prefix; not GLM-4's byte-level BPE) */
} glm_text_vocab;
/* For a model of V ids over tokenizer t (ids beyond the tokenizer's pieces are never text). */
void glm_text_vocab_build(glm_text_vocab *v, const glm_tokenizer *t, int V);
void glm_text_vocab_free(glm_text_vocab *v);

#endif
