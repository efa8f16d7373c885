/* Every token's bytes as text, for the decoding constraints (infer/json_mode.h, infer/choice_mode.h):
 * which tokens may appear in an answer's text at all (pieces that decode to text of their own: not
 * control or special tokens, not <unk>), and what each one adds. */
#ifndef GLM_INFER_TEXT_VOCAB_H
#define GLM_INFER_TEXT_VOCAB_H
#include <stddef.h>
#include <stdint.h>
#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

typedef struct glm_text_vocab {
    int V;
    char *blob;          /* every token's bytes, one after another */
    size_t *off;         /* [V + 1] token i's bytes are blob[off[i], off[i + 1]) */
    uint8_t *text;       /* [V] 1: the token may be part of an answer's text */
    /* what lets JSON mode refuse most tokens without feeding them (infer/json_mode.c): */
    uint8_t *plain;      /* [V] 1: a text token that can sit inside a JSON string as it is (no quote,
                          * backslash or control byte; whole UTF-8 characters) */
    uint8_t *lead;       /* [V] a text token's first byte */
    uint8_t *sig, *nsp;  /* [V] its first byte that is not whitespace (0: none) and the whitespace before
                          * it (at most 255) */
    uint8_t *chars;      /* [V] a plain token's characters (at most 255): what it adds to a string's length */
    int drop_first_space; /* decoding drops a leading space from an answer's first token (SentencePiece's
                           * dummy prefix; not GLM-4's byte-level BPE) */
} glm_text_vocab;
static inline int glm_json_space(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* (UTF-8 a byte at a time: core/utf8.h glm_utf8_step) */

/* The end ids' logits set aside before a mask writes over every token, and put back after: kept
 * where the answer may end, far below the rest where it may not. */
#define GLM_MAX_ENDS 32
typedef struct glm_end_logits { float v[GLM_MAX_ENDS]; int n; } glm_end_logits;
static inline void glm_ends_save(int V, const int32_t *ends, int n_ends, const float *logits, glm_end_logits *s) {
    s->n = n_ends < GLM_MAX_ENDS ? n_ends : GLM_MAX_ENDS;
    for (int k = 0; k < s->n; k++) s->v[k] = ends[k] >= 0 && ends[k] < V ? logits[ends[k]] : 0;
}
/* Far below any logit, but finite (an infinite one trips model.chat's invalid-score guard). */
#define GLM_MASKED (-1e30f)

static inline void glm_ends_put(int V, const int32_t *ends, const glm_end_logits *s, int may_end, float *logits) {
    for (int k = 0; k < s->n; k++)
        if (ends[k] >= 0 && ends[k] < V) logits[ends[k]] = may_end ? s->v[k] : GLM_MASKED;
}

/* A byte-level recognizer as the masks see it (JSON mode's, a schema's). */
typedef struct glm_recognizer {
    const void *state;
    int (*fits)(const void *state, const unsigned char *b, size_t n); /* 1: these bytes can come next */
    int done;      /* the answer is complete: only the end tokens stay */
    int in_string; /* inside a string, where plain tokens (glm_text_vocab.plain) fit (unless limited) */
    int limited, chars_left; /* in_string with a length limit: a plain token fits when its characters
                              * are at most chars_left, and never else */
    int between;   /* between values, where whitespace leaves the recognizer as it was: a token is
                    * tried only when its first byte after whitespace can come next */
    int room;      /* whitespace bytes that may still come in a row */
} glm_recognizer;

/* logits[V] masked for recognizer r: the tokens whose bytes cannot come next, and the end tokens
 * ends[n_ends] until r is done, far below the rest; once done only the ends keep their logits. */
void glm_text_vocab_mask(const glm_text_vocab *v, const glm_recognizer *r, const int32_t *ends, int n_ends, float *logits);

/* For a model of V ids over tokenizer t (ids beyond the tokenizer's pieces are never text). */
void glm_text_vocab_build(glm_text_vocab *v, const glm_tokenizer *t, int V);
void glm_text_vocab_free(glm_text_vocab *v);

#endif
