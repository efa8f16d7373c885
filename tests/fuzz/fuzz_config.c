/* libFuzzer target: arbitrary bytes as a model config.json (model/config.c). Parsing must fail
 * with a message or give a config; a config that also validates must survive a round trip
 * through glm_config_to_json (our exported folders are read back by us and by HF). */
#include <string.h>
#include "model/config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    glm_config c = glm_config_chatglm6b();
    glm_err err;
    err.msg[0] = 0;
    if (glm_config_parse(&c, text, "config.json", &err) == 0) {
        if (glm_config_validate(&c, "config.json", &err) == 0) {
            char *out = glm_config_to_json(&c);
            FUZZ_CHECK(out, "to_json gave NULL");
            glm_config back = glm_config_chatglm6b();
            FUZZ_CHECK(glm_config_parse(&back, out, "round trip", &err) == 0, "%s\n%s", err.msg, out);
            FUZZ_CHECK(back.vocab_size == c.vocab_size && back.hidden_size == c.hidden_size &&
                       back.num_layers == c.num_layers && back.num_attention_heads == c.num_attention_heads &&
                       back.inner_hidden_size == c.inner_hidden_size &&
                       back.max_sequence_length == c.max_sequence_length &&
                       back.position_encoding_2d == c.position_encoding_2d &&
                       back.tie_word_embeddings == c.tie_word_embeddings && back.bos_token_id == c.bos_token_id &&
                       back.eos_token_id == c.eos_token_id && back.mask_token_id == c.mask_token_id &&
                       back.gmask_token_id == c.gmask_token_id && back.pad_token_id == c.pad_token_id,
                       "round trip changed a field:\n%s", out);
            free(out);
        } else {
            FUZZ_CHECK(err.msg[0], "validate failed without a message");
        }
    } else {
        FUZZ_CHECK(err.msg[0], "parse failed without a message");
    }
    free(text);
    return 0;
}
