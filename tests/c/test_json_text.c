/* core/json_text.h: top-level key edits that keep every other byte of a config.json. */
#include <stdlib.h>
#include <string.h>
#include "core/json_text.h"
#include "test.h"

static void expect(test_counts *tc, const char *name, char *got, const char *want) {
    TEST_CHECK(tc, name, got && strcmp(got, want) == 0, "got [%s], want [%s]", got ? got : "(null)", want);
    free(got);
}

int main(void) {
    test_counts tc = {0};
    const char *src = "{\n  \"_name_or_path\": \"THUDM/chatglm-6b\",\n  \"layernorm_epsilon\": 1e-05,\n"
                      "  \"auto_map\": {\"AutoConfig\": \"configuration_chatglm.ChatGLMConfig\", \"x\": [1, {\"}\": \"]\"}]},\n"
                      "  \"torch_dtype\": \"float16\"\n}\n";
    expect(&tc, "json_text_replace_keeps_other_bytes", glm_json_set_key(src, "torch_dtype", "\"float32\""),
           "{\n  \"_name_or_path\": \"THUDM/chatglm-6b\",\n  \"layernorm_epsilon\": 1e-05,\n"
           "  \"auto_map\": {\"AutoConfig\": \"configuration_chatglm.ChatGLMConfig\", \"x\": [1, {\"}\": \"]\"}]},\n"
           "  \"torch_dtype\": \"float32\"\n}\n");
    expect(&tc, "json_text_append_indented", glm_json_set_key("{\n  \"a\": 1e-05\n}", "pre_seq_len", "128"),
           "{\n  \"a\": 1e-05,\n  \"pre_seq_len\": 128\n}");
    expect(&tc, "json_text_append_one_line", glm_json_set_key("{\"a\": 1}", "b", "true"), "{\"a\": 1, \"b\": true}");
    expect(&tc, "json_text_append_empty", glm_json_set_key("{ }", "b", "2"), "{ \"b\": 2}");
    /* a key inside a nested object or a string is not a top-level key */
    expect(&tc, "json_text_nested_key_untouched", glm_json_set_key("{\"m\": {\"b\": 1}, \"s\": \"\\\"b\\\": 3\"}", "b", "9"),
           "{\"m\": {\"b\": 1}, \"s\": \"\\\"b\\\": 3\", \"b\": 9}");
    expect(&tc, "json_text_remove_middle", glm_json_remove_key("{\"a\": 1, \"b\": [2, 3], \"c\": 4}", "b"), "{\"a\": 1, \"c\": 4}");
    expect(&tc, "json_text_remove_last", glm_json_remove_key("{\n  \"a\": 1,\n  \"b\": 2\n}", "b"), "{\n  \"a\": 1\n}");
    expect(&tc, "json_text_remove_only", glm_json_remove_key("{\"b\": 2}", "b"), "{}");
    expect(&tc, "json_text_remove_absent", glm_json_remove_key("{\"a\": 1}", "b"), "{\"a\": 1}");
    char *bad = glm_json_set_key("{\"a\": \"unterminated}", "b", "1");
    TEST_CHECK(&tc, "json_text_unterminated_is_null", bad == NULL, "got [%s]", bad);
    free(bad);
    bad = glm_json_set_key("[1, 2]", "b", "1");
    TEST_CHECK(&tc, "json_text_not_object_is_null", bad == NULL, "got [%s]", bad);
    free(bad);
    TEST_EXIT(&tc);
}
