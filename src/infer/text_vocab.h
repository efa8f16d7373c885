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
                          * backslash or control byte; whole UTF-8 characters) */
    uint8_t *lead;       /* [V] a text token's first byte */
    uint8_t *sig, *nsp;  /* [V] its first byte that is not whitespace (0: none) and the whitespace before
                          * it (at most 255) */
    uint8_t *chars;      /* [V] a plain token's characters (at most 255): what it adds to a string's length */
    int drop_first_space; /* decoding drops a leading space from an answer's first token (SentencePiece's
                           * dummy prefix; not GLM-4's byte-level BPE) */
} glm_text_vocab;
static inline int glm_json_space(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Well-formed UTF-8 a byte at a time (Unicode's table 3-7: no overlong forms, no surrogates, nothing
 * above U+10FFFF): *need continuation bytes still to come, the next within [*lo, *hi]. Returns -1
 * when c cannot come, 0 when it continues a character, 1 when it is ASCII, 2 when it begins a
 * character of several bytes. */
static inline int glm_utf8_step(uint8_t *need, uint8_t *lo, uint8_t *hi, unsigned c) {
    if (*need) {
        if (c < *lo || c > *hi) return -1;
        --*need;
        *lo = 0x80, *hi = 0xBF;
        return 0;
    }
    if (c < 0x80) return 1;
    unsigned n = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (!n) return -1;
    *need = (uint8_t)n;
    *lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    *hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    return 2;
}

/* Far below any logit, but finite (an infinite one trips model.chat's invalid-score guard). */
#define GLM_MASKED (-1e30f)

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
