/* core/json_text.h: top-level key edits that keep every other byte of a config.json, and the
 * strict reading of whole documents; core/hub.h's names of cache snapshots; data/reader.h's CSV
 * rows (the Python csv module's reading is checked in tests/py/test_data_csv.py). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include "core/hub.h"
#include "core/json_text.h"
#include "data/reader.h"
#include "test.h"

/* glm_json_parse_doc on text (len: strlen unless given): 1 parsed, 0 refused with msg containing want. */
static void doc(test_counts *tc, const char *name, const char *text, size_t len, int ok, const char *want) {
    glm_err err = {0};
    cJSON *o = glm_json_parse_doc(text, len ? len : strlen(text), "f.json", "x", &err);
    TEST_CHECK(tc, name, ok ? o != NULL : (!o && strstr(err.msg, want) != NULL), "got %s: %s", o ? "a value" : "an error", err.msg);
    cJSON_Delete(o);
}

static void strict_documents(test_counts *tc) {
    doc(tc, "json_doc_object", "{\"a\": 1}\n", 0, 1, NULL);
    doc(tc, "json_doc_trailing_space", " [1, 2] \r\n\t ", 0, 1, NULL);
    doc(tc, "json_doc_two_objects", "{\"a\": 1}\n{\"b\": 2}\n", 0, 0, "f.json:2:1: more after the JSON value ended");
    doc(tc, "json_doc_junk_after", "{\"a\": 1} x", 0, 0, "f.json:1:10: more after");
    doc(tc, "json_doc_nul_byte", "{\"a\": 1}\0{}", 11, 0, "f.json:1:9: a NUL byte");
    doc(tc, "json_doc_cut", "{\"a\": [1,", 0, 0, "ends early");
    glm_err err = {0};
    cJSON *o = glm_json_parse_at("{} {}", 5, "in.jsonl", 7, "x", &err);
    TEST_CHECK(tc, "json_doc_at_line", !o && strstr(err.msg, "in.jsonl:7:4:"), "%s", err.msg);
    cJSON_Delete(o);
}

static void hub_names(test_counts *tc) {
    static const struct { const char *path, *want; } t[] = {
        {"/root/.cache/huggingface/hub/models--THUDM--chatglm-6b/snapshots/abc", "THUDM/chatglm-6b"},
        {"/c/hub/models--gpt2/snapshots/0123/", "gpt2"},
        {"/c/hub/models--ZhipuAI--glm-4-9b-chat/snapshots/x/sub", "ZhipuAI/glm-4-9b-chat"},
        {"/c/models--a--b/refs/main", NULL},            /* not a snapshot */
        {"/c/models--a--b/snapshots/", NULL},           /* no commit */
        {"/data/chatglm-6b", NULL},
        {"/c/mymodels--a/snapshots/x", NULL},           /* not a component that starts so */
        {"/c/models---a/snapshots/x", NULL}};           /* no repository name */
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char out[256] = "", name[64];
        int rc = glm_hub_name_of(t[i].path, out, sizeof out);
        snprintf(name, sizeof name, "hub_name_of_%zu", i);
        TEST_CHECK(tc, name, t[i].want ? rc == 0 && !strcmp(out, t[i].want) : rc == -1, "%s -> rc %d '%s'", t[i].path, rc, out);
    }
}

/* The rows of text as "a|b;c|d;" (fields joined by |, rows ended by ;), or "ERR@offset". */
static void csv_rows(const char *text, char delim, char *out, size_t n) {
    glm_csv_fields f = {0};
    size_t pos = 0, at = 0, len = strlen(text);
    const char *why = NULL;
    out[0] = 0;
    int rc;
    while ((rc = glm_csv_row(text, len, &pos, delim, &f, &at, &why)) == 1) {
        for (int i = 0; i < f.n; i++) {
            size_t u = strlen(out);
            snprintf(out + u, n - u, "%s%s", i ? "|" : "", f.v[i]);
        }
        size_t u = strlen(out);
        snprintf(out + u, n - u, ";");
    }
    if (rc < 0) snprintf(out, n, "ERR@%zu", at);
    glm_csv_fields_free(&f);
}

static void csv(test_counts *tc) {
    static const struct { const char *name, *text, *want; char delim; } t[] = {
        {"csv_plain", "a,b\nc,d\n", "a|b;c|d;", ','},
        {"csv_crlf_no_final_newline", "a,b\r\nc,d", "a|b;c|d;", ','},
        {"csv_quoted_delim_newline_quote", "\"x,y\",\"1\n2\",\"say \"\"hi\"\"\"\n", "x,y|1\n2|say \"hi\";", ','},
        {"csv_crlf_inside_quotes_kept", "\"a\r\nb\",c\r\n", "a\r\nb|c;", ','},
        {"csv_empty_fields", ",,\n\"\",x,\n", "||;|x|;", ','},
        {"csv_blank_lines_skipped", "\n\r\na\n\n\nb\n", "a;b;", ','},
        {"csv_spaces_kept", " a , b \n", " a | b ;", ','},
        {"csv_quote_inside_unquoted", "ab\"c,d\n", "ab\"c|d;", ','},
        {"tsv_tabs", "a\tb,c\n\"t\tu\"\tv\n", "a|b,c;t\tu|v;", '\t'},
        {"csv_open_quote_refused", "a,\"b\nc\n", "ERR@2", ','},
        {"csv_text_after_quote_refused", "\"a\"b,c\n", "ERR@3", ','},
        {"csv_final_cr_only", "a,b\r", "a|b;", ','},
        {"csv_cr_line_ends", "a,b\rc,d\r", "a|b;c|d;", ','}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char got[256];
        csv_rows(t[i].text, t[i].delim, got, sizeof got);
        TEST_CHECK(tc, t[i].name, !strcmp(got, t[i].want), "got [%s], want [%s]", got, t[i].want);
    }
}

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
    strict_documents(&tc);
    hub_names(&tc);
    csv(&tc);
    TEST_EXIT(&tc);
}
