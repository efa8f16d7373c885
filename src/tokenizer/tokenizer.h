/* The ChatGLM tokenizer: a SentencePiece model (unigram or BPE) read from its .model file,
 * plus ChatGLM-6B's pre/post-processing (<n>, <|tab|>, <|blank_N|>) and special tokens.
 * This header is the contract the data pipeline, chat and CLI use. */
#ifndef GLM_TOKENIZER_H
#define GLM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef struct glm_tokenizer glm_tokenizer;

/* Special token ids, resolved from the model's pieces ("[MASK]", "[gMASK]", "<sop>", "<eop>",
 * "<pad>", "<unk>") and tokenizer_config.json when present; -1 when the model lacks one. */
typedef struct glm_special_ids {
    int32_t mask, gmask, sop, eop, pad, unk;
} glm_special_ids;

/* path: a folder holding ice_text.model or tokenizer.model (and optionally
 * tokenizer_config.json), or a .model file itself. */
int glm_tokenizer_load(glm_tokenizer **out, const char *path, glm_err *err);
void glm_tokenizer_free(glm_tokenizer *t);

int glm_tokenizer_vocab_size(const glm_tokenizer *t);    /* number of pieces */
glm_special_ids glm_tokenizer_specials(const glm_tokenizer *t);
const char *glm_tokenizer_piece(const glm_tokenizer *t, int32_t id); /* NULL when out of range */
int32_t glm_tokenizer_piece_id(const glm_tokenizer *t, const char *piece); /* -1 when absent */

/* ChatGLM encode of `text` (len bytes) WITHOUT special tokens (add_special_tokens=False):
 * pre-processing, SentencePiece encode, ids appended to out. Thread-safe (t is read-only). */
int glm_tokenizer_encode(const glm_tokenizer *t, const char *text, size_t len, glm_ids *out, glm_err *err);
/* Decode ids to text (caller frees): drops pad and control pieces, joins byte pieces, "▁" to
 * space, removes the dummy-prefix space, then <n>/<|tab|>/<|blank_N|> back to text. */
char *glm_tokenizer_decode(const glm_tokenizer *t, const int32_t *ids, int n);

/* ChatGLM's model.chat response post-processing (spec 7.1): strip, "[[训练时间]]" -> "2023年",
 * ASCII , ! : ; ? next to a CJK character become full-width. Caller frees. */
char *glm_chat_postprocess(const char *response);

#endif
