/* config.json parsing: the ChatGLM-6B fields, defaults, and clear errors naming the field. */
#include <stdlib.h>
#include <string.h>
#include "model/config.h"
#include "model/tensors.h"
#include "test.h"

static const char *GOOD =
    "{\"architectures\": [\"ChatGLMModel\"], \"model_type\": \"chatglm\", \"vocab_size\": 130528,"
    " \"hidden_size\": 4096, \"num_layers\": 28, \"num_attention_heads\": 32, \"inner_hidden_size\": 16384,"
    " \"max_sequence_length\": 2048, \"layernorm_epsilon\": 1e-05, \"position_encoding_2d\": true,"
    " \"bos_token_id\": 130004, \"eos_token_id\": 130005, \"mask_token_id\": 130000, \"gmask_token_id\": 130001,"
    " \"pad_token_id\": 3, \"torch_dtype\": \"float16\", \"use_cache\": true, \"transformers_version\": \"4.23.1\","
    " \"auto_map\": {\"AutoConfig\": \"configuration_chatglm.ChatGLMConfig\"}}";

/* Parses GOOD with one key's value replaced (or the key removed when value is NULL). */
static glm_config g_parsed; /* what the last parse_with read */

static int parse_with(const char *key, const char *value, glm_err *err) {
    char buf[4096], pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(GOOD, pat);
    if (!at) return -2;
    const char *v = at + strlen(pat), *end = v;
    while (*end && *end != ',' && *end != '}') end++;
    if (value) snprintf(buf, sizeof buf, "%.*s%s%s", (int)(v - GOOD), GOOD, value, end);
    else snprintf(buf, sizeof buf, "%.*s%s", (int)(at - GOOD), GOOD, *end == ',' ? end + 1 : end);
    return glm_config_parse(&g_parsed, buf, "config.json", err);
}

int main(void) {
    test_counts tc = {0};
    glm_config c;
    glm_err err;
    int rc = glm_config_parse(&c, GOOD, "config.json", &err);
    TEST_CHECK(&tc, "parse_chatglm6b", rc == 0 && c.vocab_size == 130528 && c.num_layers == 28 &&
               c.gmask_token_id == 130001 && c.tie_word_embeddings == 1 && c.inner_hidden_size == 16384,
               "rc %d: %s", rc, err.msg);
    TEST_CHECK(&tc, "alpha_is_sqrt56_for_any_depth", parse_with("num_layers", "2", &err) == 0, "%s", err.msg);
    glm_config_parse(&c, GOOD, "config.json", &err);
    TEST_CHECK(&tc, "alpha_value", c.alpha == (float)sqrt(56.0), "alpha %.9g", c.alpha);
    /* six-billion parameters as the spec counts them */
    glm_table tab;
    glm_table_build(&tab, &c);
    TEST_CHECK(&tc, "param_count_tied", tab.n_params == 6173286400ULL, "%zu", tab.n_params);
    glm_table_free(&tab);
    struct { const char *key, *value, *must_mention; } bad[] = {
        {"hidden_size", NULL, "hidden_size"},
        {"vocab_size", "\"big\"", "vocab_size"},
        {"num_layers", "2.5", "num_layers"},
        {"num_attention_heads", "33", "num_attention_heads"},
        {"position_encoding_2d", "false", "position_encoding_2d"},
        {"gmask_token_id", "200000", "gmask_token_id"},
        {"model_type", "\"llama\"", "model_type"},
        {"layernorm_epsilon", "\"x\"", "layernorm_epsilon"},
        {"layernorm_epsilon", "1e705", "layernorm_epsilon"},     /* inf: would be written back as bare inf */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "rejects_bad_%s_%zu", bad[i].key, i);
        err.msg[0] = 0;
        rc = parse_with(bad[i].key, bad[i].value, &err);
        TEST_CHECK(&tc, name, rc == -1 && strstr(err.msg, bad[i].must_mention) && strstr(err.msg, "config.json"),
                   "rc %d msg \"%s\"", rc, err.msg);
    }
    /* found by fuzz_config: 4H of a huge hidden_size overflowed int; the quantization_bit message
     * read freed memory (test-asan sees it) */
    rc = glm_config_parse(&c, "{\"vocab_size\": 8, \"hidden_size\": 1073741824, \"num_layers\": 1, \"num_attention_heads\": 1}",
                          "config.json", &err);
    TEST_CHECK(&tc, "rejects_overflowing_inner_hidden_size", rc == -1 && strstr(err.msg, "inner_hidden_size"), "rc %d: %s", rc, err.msg);
    /* a ChatGLM2/3 config is named as such, not reported as a v1 config missing vocab_size */
    /* ChatGLM2-6B's config.json as THUDM ships it (spec 11): the ChatGLM2 family */
    static const char *GLM2 = "{\"model_type\": \"chatglm\", \"add_bias_linear\": false, \"add_qkv_bias\": true, "
        "\"apply_query_key_layer_scaling\": true, \"apply_residual_connection_post_layernorm\": false, "
        "\"attention_dropout\": 0.0, \"attention_softmax_in_fp32\": true, \"bias_dropout_fusion\": true, "
        "\"ffn_hidden_size\": 13696, \"fp32_residual_connection\": false, \"hidden_dropout\": 0.0, \"hidden_size\": 4096, "
        "\"kv_channels\": 128, \"layernorm_epsilon\": 1e-05, \"multi_query_attention\": true, \"multi_query_group_num\": 2, "
        "\"num_attention_heads\": 32, \"num_layers\": 28, \"original_rope\": true, \"padded_vocab_size\": 65024, "
        "\"post_layer_norm\": true, \"rmsnorm\": true, \"seq_length\": 32768, \"use_cache\": true, "
        "\"torch_dtype\": \"float16\", \"transformers_version\": \"4.27.1\", \"tie_word_embeddings\": false, "
        "\"eos_token_id\": 2, \"pad_token_id\": 0}";
    rc = glm_config_parse(&c, GLM2, "config.json", &err);
    TEST_CHECK(&tc, "reads_chatglm2_config", rc == 0 && c.family == GLM_FAMILY_GLM2 && c.vocab_size == 65024 &&
                   c.num_kv_heads == 2 && glm_head_dim(&c) == 128 && c.inner_hidden_size == 13696 && c.qkv_bias &&
                   !c.tie_word_embeddings && c.rope_theta == 10000.0f && c.eos_token_id == 2 && glm_qkv_width(&c) == 4608 &&
                   glm_fc1_width(&c) == 27392, "rc %d: %s", rc, err.msg);
    {
        glm_table t;
        glm_table_build(&t, &c);
        TEST_CHECK(&tc, "chatglm2_table_is_thudms", t.n == 28 * 7 + 3 && t.n_params == 6243584000ULL &&
                       glm_table_find(&t, "transformer.encoder.layers.27.self_attention.query_key_value.bias") &&
                       glm_table_find(&t, "transformer.output_layer.weight") &&
                       glm_table_find(&t, "transformer.embedding.word_embeddings.weight") &&
                       glm_table_find(&t, "transformer.encoder.final_layernorm.weight"),
                   "%d rows, %zu parameters (THUDM's 200 - inv_freq, 6,243,584,000)", t.n, t.n_params);
        glm_table_free(&t);
        char *js2 = glm_config_to_json(&c);
        glm_config c3;
        rc = glm_config_parse(&c3, js2, "written", &err);
        TEST_CHECK(&tc, "chatglm2_round_trip", rc == 0 && memcmp(&c, &c3, sizeof c) == 0, "rc %d: %s", rc, err.msg);
        free(js2);
    }
    /* GLM-4-9B lists its end ids; rope_ratio scales the rotary base */
    static const char *GLM4 = "{\"model_type\": \"chatglm\", \"add_qkv_bias\": true, \"ffn_hidden_size\": 13696, "
        "\"hidden_size\": 4096, \"kv_channels\": 128, \"multi_query_attention\": true, \"multi_query_group_num\": 2, "
        "\"num_attention_heads\": 32, \"num_layers\": 40, \"padded_vocab_size\": 151552, \"rmsnorm\": true, "
        "\"rope_ratio\": 500, \"seq_length\": 131072, \"eos_token_id\": [151329, 151336, 151338], \"pad_token_id\": 151329}";
    rc = glm_config_parse(&c, GLM4, "config.json", &err);
    TEST_CHECK(&tc, "reads_glm4_config", rc == 0 && c.family == GLM_FAMILY_GLM2 && c.num_layers == 40 &&
                   c.vocab_size == 151552 && c.eos_token_id == 151329 && c.rope_theta == 5e6f, "rc %d: %s", rc, err.msg);
    rc = glm_config_parse(&c, "{\"model_type\": \"chatglm\", \"padded_vocab_size\": 64, \"hidden_size\": 32, "
                              "\"num_layers\": 1, \"num_attention_heads\": 8, \"ffn_hidden_size\": 48, \"rmsnorm\": false}",
                          "config.json", &err);
    TEST_CHECK(&tc, "refuses_chatglm2_layernorm", rc == -1 && strstr(err.msg, "rmsnorm false"), "rc %d: %s", rc, err.msg);
    rc = glm_config_parse(&c, "{\"model_type\": \"chatglm\", \"padded_vocab_size\": 64, \"hidden_size\": 32, "
                              "\"num_layers\": 1, \"num_attention_heads\": 8, \"ffn_hidden_size\": 48, "
                              "\"multi_query_attention\": true, \"multi_query_group_num\": 3}", "config.json", &err);
    TEST_CHECK(&tc, "refuses_uneven_groups", rc == -1 && strstr(err.msg, "multi_query_group_num 3"), "rc %d: %s", rc, err.msg);
    /* THUDM's pre-quantized folders say how their linear weights are stored */
    rc = parse_with("torch_dtype", "\"float16\", \"quantization_bit\": 4", &err);
    TEST_CHECK(&tc, "reads_quantization_bit_4", rc == 0 && g_parsed.quant == GLM_Q_INT4, "rc %d: %s", rc, err.msg);
    rc = parse_with("torch_dtype", "\"float16\", \"quantization_bit\": 8", &err);
    TEST_CHECK(&tc, "reads_quantization_bit_8", rc == 0 && g_parsed.quant == GLM_Q_INT8, "rc %d: %s", rc, err.msg);
    rc = parse_with("torch_dtype", "\"float16\", \"quantization_bit\": 0", &err);
    TEST_CHECK(&tc, "reads_quantization_bit_0", rc == 0 && g_parsed.quant == GLM_Q_NONE, "rc %d: %s", rc, err.msg);
    rc = parse_with("torch_dtype", "\"float16\", \"quantization_bit\": 4, \"quantization_embeddings\": true", &err);
    TEST_CHECK(&tc, "rejects_quantized_embeddings", rc == -1 && strstr(err.msg, "quantization_embeddings"), "rc %d: %s", rc, err.msg);
    rc = parse_with("torch_dtype", "\"float16\", \"quantization_bit\": 3", &err);
    TEST_CHECK(&tc, "rejects_quantization_bit_3", rc == -1 && strstr(err.msg, "quantization_bit must be 0, 4 or 8"), "rc %d: %s", rc, err.msg);
    rc = glm_config_parse(&c, "[1, 2]", "x.json", &err);
    TEST_CHECK(&tc, "rejects_non_object", rc == -1 && strstr(err.msg, "x.json"), "%s", err.msg);
    rc = glm_config_parse(&c, GOOD, "config.json", &err);
    char *js = glm_config_to_json(&c);
    glm_config c2;
    rc = glm_config_parse(&c2, js, "written", &err);
    TEST_CHECK(&tc, "round_trip", rc == 0 && memcmp(&c, &c2, sizeof c) == 0, "%s", err.msg);
    free(js);
    TEST_EXIT(&tc);
}
