/* The micro models the model-level C tests share. The 3-layer ones: GLM v1 (tied head) and the ChatGLM2
 * block (grouped-query attention, untied head), with a 24-token vocabulary whose specials are
 * the same ids in both (the batches' prompt + [gMASK] <sop> + answer + <eop>). */
#ifndef GLM_TEST_MICRO_CONFIGS_H
#define GLM_TEST_MICRO_CONFIGS_H
#include <stdio.h>
#include <stdlib.h>
#include "model/config.h"

static inline glm_config micro_v1_config(void) {
    return (glm_config){.vocab_size = 24, .hidden_size = 16, .num_layers = 3, .num_attention_heads = 2,
                        .inner_hidden_size = 32, .max_sequence_length = 64, .layernorm_epsilon = 1e-5f,
                        .position_encoding_2d = 1, .tie_word_embeddings = 1, .bos_token_id = 21,
                        .eos_token_id = 22, .mask_token_id = 19, .gmask_token_id = 20, .pad_token_id = 3,
                        .alpha = 7.483314773547883f};
}

static inline glm_config micro_v2_config(void) {
    glm_config c;
    glm_err err;
    int rc = glm_config_parse(&c, "{\"model_type\": \"chatglm\", \"add_qkv_bias\": true, \"ffn_hidden_size\": 24, "
                                  "\"hidden_size\": 16, \"kv_channels\": 4, \"multi_query_attention\": true, "
                                  "\"multi_query_group_num\": 2, \"num_attention_heads\": 4, \"num_layers\": 3, "
                                  "\"padded_vocab_size\": 24, \"rmsnorm\": true, \"seq_length\": 64, "
                                  "\"eos_token_id\": 22, \"pad_token_id\": 3}",
                              "config.json", &err);
    if (rc) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    /* the v1 ids the batches use for their specials (the ChatGLM2 rule ignores them) */
    c.bos_token_id = 21; c.mask_token_id = 19; c.gmask_token_id = 20;
    return c;
}
/* The 2-layer models of the KV-cache tests (test_prefix_batch.c, test_serve_slots.c): a 40-token
 * vocabulary, hidden 32, untied; GLM v1, or with glm2 the ChatGLM2 block (2 key/value groups of
 * head dimension 8). */
static inline glm_config micro_cache_config(int glm2) {
    glm_config c = {.vocab_size = 40, .hidden_size = 32, .num_layers = 2, .num_attention_heads = 4, .inner_hidden_size = 64,
                    .max_sequence_length = 64, .layernorm_epsilon = 1e-5f, .position_encoding_2d = 1,
                    .tie_word_embeddings = 0, .bos_token_id = 2, .eos_token_id = 3, .mask_token_id = 4,
                    .gmask_token_id = 1, .pad_token_id = 0, .alpha = 7.483314773547883f};
    if (glm2) {
        c = glm_config_chatglm2_6b();
        c.vocab_size = 40; c.hidden_size = 32; c.num_layers = 2; c.num_attention_heads = 4; c.head_dim = 8;
        c.num_kv_heads = 2; c.inner_hidden_size = 48; c.max_sequence_length = 64; c.eos_token_id = 3; c.pad_token_id = 0;
    }
    return c;
}
#endif
