/* Builds the training examples of a data file through the real tokenizer and the whole data
 * path (reader, example rules, parallel encoding, cache), and prints one JSON line per example:
 *   {"ids": [...], "labels": [...]}
 * then a last line {"summary": {...}}. tests/py/test_data_examples.py compares the lines with
 * its Python re-implementation of ptuning/main.py; it is also handy to eyeball a dataset.
 *
 * usage: tool_data_examples --tokenizer PATH --train_file FILE [--format F] [--container C]
 *          [--prompt_column C --response_column C --history_column C] [--source_prefix S]
 *          [--max_source_length N] [--max_target_length N] [--cutoff_len N] [--rounds column|nonempty]
 *          [--prompt_template T] [--history_template T] [--train_on_prompt] [--skip_bad_samples]
 *          [--cache_dir DIR] [--threads N] [--limit N] [--prompts]
 * --prompts prints {"prompt": ..., "answer": ...} per record instead (the rendered prompt text, no
 * tokenizer needed), so prompt rendering is checked apart from tokenization.
 * Exit codes: 0 ok, 1 error, 3 the tokenizer cannot be loaded (reported as SKIP by the test
 * when the message says it is not implemented). */
#include <stdio.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include "data/data.h"
#include "tokenizer/tokenizer.h"

static void print_arr(const int32_t *v, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", v[i]);
    putchar(']');
}

/* One JSON line per record: the prompt as the example rules render it, and the answer. */
static int print_prompts(const glm_data_cfg *cfg, glm_err *err) {
    glm_reader *r;
    if (glm_reader_open(&r, cfg->train_file, &cfg->read, err)) return -1;
    glm_record rec;
    int rc;
    while ((rc = glm_reader_next(r, &rec, err)) == 1) {
        char *p = glm_example_prompt(&cfg->example, &rec);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", p);
        cJSON_AddStringToObject(o, "answer", rec.answer);
        char *line = cJSON_PrintUnformatted(o);
        printf("%s\n", line);
        free(line); free(p);
        cJSON_Delete(o);
        glm_record_free(&rec);
    }
    glm_reader_close(r);
    return rc;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL;
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    long limit = -1;
    int prompts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1;
        if (!strcmp(a, "--train_on_prompt")) { cfg.example.train_on_prompt = 1; used = 0; }
        else if (!strcmp(a, "--skip_bad_samples")) { cfg.read.skip_bad_samples = 1; used = 0; }
        else if (!strcmp(a, "--prompts")) { prompts = 1; used = 0; }
        else if (!v) { fprintf(stderr, "error: %s needs a value\n", a); return 1; }
        else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--train_file")) cfg.train_file = v;
        else if (!strcmp(a, "--format")) { if (glm_schema_parse(v, &cfg.read.schema)) { fprintf(stderr, "error: --format %s\n", v); return 1; } }
        else if (!strcmp(a, "--container")) { if (glm_container_parse(v, &cfg.read.container)) { fprintf(stderr, "error: --container %s\n", v); return 1; } }
        else if (!strcmp(a, "--prompt_column")) cfg.read.columns.prompt = v;
        else if (!strcmp(a, "--response_column")) cfg.read.columns.response = v;
        else if (!strcmp(a, "--history_column")) cfg.read.columns.history = v;
        else if (!strcmp(a, "--source_prefix")) cfg.example.source_prefix = v;
        else if (!strcmp(a, "--max_source_length")) cfg.example.max_source_length = atoi(v);
        else if (!strcmp(a, "--cutoff_len")) cfg.example.cutoff_len = atoi(v);
        else if (!strcmp(a, "--max_target_length")) cfg.example.max_target_length = atoi(v);
        else if (!strcmp(a, "--rounds")) cfg.example.rounds = strcmp(v, "nonempty") ? GLM_ROUNDS_COLUMN : GLM_ROUNDS_NONEMPTY;
        else if (!strcmp(a, "--prompt_template")) { char *t = strdup(v); glm_unescape(t); cfg.example.prompt_template = t; }
        else if (!strcmp(a, "--history_template")) { char *t = strdup(v); glm_unescape(t); cfg.example.history_template = t; }
        else if (!strcmp(a, "--cache_dir")) cfg.cache_dir = v;
        else if (!strcmp(a, "--threads")) cfg.num_threads = atoi(v);
        else if (!strcmp(a, "--limit")) limit = atol(v);
        else { fprintf(stderr, "error: unknown option %s\n", a); return 1; }
        i += used;
    }
    glm_err err = {0};
    if (prompts && cfg.train_file) {
        if (glm_example_cfg_check(&cfg.example, &err) || print_prompts(&cfg, &err)) { glm_err_print(&err); return 1; }
        return 0;
    }
    if (!tok_path || !cfg.train_file) { fprintf(stderr, "usage: %s --tokenizer PATH --train_file FILE [options]\n", argv[0]); return 1; }
    glm_tokenizer *tok;
    if (glm_tokenizer_load(&tok, tok_path, &err)) { glm_err_print(&err); return 3; }
    glm_encoder enc;
    glm_examples *ex;
    if (glm_encoder_from_tokenizer(&enc, tok, tok_path, &err) || glm_examples_load(&ex, cfg.train_file, &cfg, &enc, &err)) {
        glm_err_print(&err);
        glm_tokenizer_free(tok);
        return 1;
    }
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)(ex->summary.longest + 1));
    for (int64_t i = 0; i < ex->n && (limit < 0 || i < limit); i++) {
        int n = glm_examples_labels(ex, i, lab);
        printf("{\"ids\": ");
        print_arr(ex->ids + ex->off[i], n);
        printf(", \"labels\": ");
        print_arr(lab, n);
        printf("}\n");
    }
    const glm_data_summary *s = &ex->summary;
    printf("{\"summary\": {\"records\": %lld, \"examples\": %lld, \"bad_json\": %lld, \"bad_record\": %lld, \"empty\": %lld, "
           "\"no_answer_tokens\": %lld, \"truncated_prompt\": %lld, \"truncated_answer\": %lld, \"tokens\": %lld, "
           "\"longest\": %lld, \"cache\": \"%s\"}}\n",
           (long long)s->records, (long long)s->examples, (long long)s->bad_json, (long long)s->bad_record,
           (long long)s->empty, (long long)s->no_answer_tokens, (long long)s->truncated_prompt,
           (long long)s->truncated_answer, (long long)s->tokens, (long long)s->longest, ex->cache_note);
    glm_examples_print_summary(stderr, "data", ex, &cfg.example);
    free(lab);
    glm_examples_free(ex);
    glm_tokenizer_free(tok);
    return 0;
}
