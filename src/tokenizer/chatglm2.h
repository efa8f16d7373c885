/* ChatGLM2/3 encoding and decoding (chatglm2.c), called by chatglm.c for GLM_TOK_CHATGLM2.
 * Internal: only src/tokenizer includes it. */
#ifndef GLM_TOKENIZER_CHATGLM2_H
#define GLM_TOKENIZER_CHATGLM2_H
#include "tokenizer/spm.h"

/* glm_tok_encode_sc / glm_tokenizer_encode_pieces / glm_tokenizer_decode_ex for ChatGLM2/3. */
int glm2_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc,
                   glm_ids *out, glm_err *err);
int glm2_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                       glm_err *err);
char *glm2_decode(const glm_tokenizer *t, const int32_t *ids, int n, size_t *len);

#endif
