/* Model configuration, read from a Hugging Face config.json of chatglm-6b (spec section 1). */
#ifndef GLM_CONFIG_H
#define GLM_CONFIG_H
#include <stdint.h>
#include "core/err.h"

typedef struct glm_config {
    int vocab_size;          /* rows of word_embeddings (130528 for ChatGLM-6B) */
    int hidden_size;         /* H */
    int num_layers;          /* L */
    int num_attention_heads; /* NH; head dim = H / NH */
    int inner_hidden_size;   /* MLP width (4H) */
    int max_sequence_length;
    float layernorm_epsilon;
    int position_encoding_2d;/* must be true for GLM v1 */
    int tie_word_embeddings; /* HF default true: lm_head shares word_embeddings */
    int32_t bos_token_id;    /* <sop> */
    int32_t eos_token_id;    /* <eop> */
    int32_t mask_token_id;   /* [MASK] */
    int32_t gmask_token_id;  /* [gMASK] */
    int32_t pad_token_id;    /* <pad> */
    /* Residual scale. The original GLMBlock takes num_layers with a default of 28 that
     * ChatGLMModel never overrides, so alpha = sqrt(2*28) = sqrt(56) for every model size. */
    float alpha;
} glm_config;

/* The ChatGLM-6B (v1.1) shapes and ids. */
glm_config glm_config_chatglm6b(void);
/* Parses config.json text. Unknown fields are ignored; a missing or ill-typed required field
 * is an error naming the field and `source` (the file name, for messages). */
int glm_config_parse(glm_config *c, const char *json_text, const char *source, glm_err *err);
int glm_config_load(glm_config *c, const char *path, glm_err *err); /* file or folder */
/* Writes config.json text (caller frees) with the HF keys, so HF tools read our output. */
char *glm_config_to_json(const glm_config *c);
int glm_config_validate(const glm_config *c, const char *source, glm_err *err);
static inline int glm_head_dim(const glm_config *c) { return c->hidden_size / c->num_attention_heads; }

#endif
