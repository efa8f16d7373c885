/* Data layer, part 1: readers (every format), bad data (each case's outcome and count), and
 * example construction (ptuning/main.py rules, templates, truncation) with a fake encoder.
 * The same rules against the real tokenizer and a Python re-implementation:
 * tests/py/test_data_examples.py. */
#include "test_data_util.h"
#include "data/hash.h"

/* Reads every record of path; returns the reader's rc (0 ok, -1 error) and the records. */
static int read_all(const char *path, const glm_read_cfg *cfg, glm_record *recs, int max, int *n,
                    glm_read_stats *st, glm_err *err) {
    glm_reader *r;
    *n = 0;
    if (glm_reader_open(&r, path, cfg, err)) return -1;
    int rc;
    glm_record rec;
    while ((rc = glm_reader_next(r, &rec, err)) == 1) {
        if (*n < max) recs[(*n)++] = rec; else glm_record_free(&rec);
    }
    if (st) *st = *glm_reader_stats(r);
    glm_reader_close(r);
    return rc;
}
static void free_all(glm_record *recs, int n) { for (int i = 0; i < n; i++) glm_record_free(&recs[i]); }
static int streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static void test_readers(test_counts *tc) {
    glm_read_cfg cfg = {0};
    glm_record r[8];
    int n;
    glm_err err = {0};
    const char *arr = write_file("a.json",
        "[\n  {\"instruction\": \"写诗\", \"input\": \"春天\", \"output\": \"春眠不觉晓\"},\n"
        "  {\"instruction\": \"q2\", \"output\": \"a2\", \"history\": [[\"h1\", \"r1\"], [\"h2\", \"r2\"]],"
        " \"system\": \"你是诗人\"}\n]\n");
    int rc = read_all(arr, &cfg, r, 8, &n, NULL, &err);
    TEST_CHECK(tc, "reader_json_array_alpaca",
               rc == 0 && n == 2 && streq(r[0].query, "写诗") && streq(r[0].input, "春天") && streq(r[0].answer, "春眠不觉晓") &&
               !r[0].has_history && r[1].n_hist == 2 && streq(r[1].hist[2], "h2") && streq(r[1].hist[3], "r2") &&
               r[1].has_history && streq(r[1].system, "你是诗人") && r[1].line == 3 && r[0].line == 2,
               "rc %d n %d (%s)", rc, n, err.msg);
    free_all(r, n);

    const char *jl = write_file("a.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n\n{\"instruction\": \"c\", \"output\": \"d\", \"history\": []}\n");
    rc = read_all(jl, &cfg, r, 8, &n, NULL, &err);
    TEST_CHECK(tc, "reader_jsonl_alpaca", rc == 0 && n == 2 && streq(r[1].answer, "d") && r[1].has_history &&
               r[1].n_hist == 0 && r[1].line == 3, "rc %d n %d (%s)", rc, n, err.msg);
    free_all(r, n);

    /* ptuning columns, configurable names; history column named => present for every record */
    const char *cols = write_file("cols.json", "{\"q\": \"问题\", \"a\": \"回答\", \"h\": [[\"x\", \"y\"]]}\n{\"q\": \"p\", \"a\": \"r\"}\n");
    glm_read_cfg cc = {.columns = {.prompt = "q", .response = "a", .history = "h"}};
    rc = read_all(cols, &cc, r, 8, &n, NULL, &err);
    TEST_CHECK(tc, "reader_columns_configured", rc == 0 && n == 2 && streq(r[0].query, "问题") && r[0].n_hist == 1 &&
               r[1].has_history && r[1].n_hist == 0, "rc %d n %d (%s)", rc, n, err.msg);
    free_all(r, n);

    /* AdvertiseGen: .json holding JSON Lines with content/summary */
    const char *adgen = write_file("train.json", "{\"content\": \"类型#裙\", \"summary\": \"这条裙子\"}\n{\"content\": \"c2\", \"summary\": \"s2\"}\n");
    glm_reader *rd;
    rc = glm_reader_open(&rd, adgen, &cfg, &err);
    glm_record rec = {0};
    int got = rc ? -1 : glm_reader_next(rd, &rec, &err);
    TEST_CHECK(tc, "reader_autodetect_adgen", got == 1 && glm_reader_container(rd) == GLM_CONTAINER_LINES &&
               glm_reader_schema(rd) == GLM_SCHEMA_COLUMNS && streq(rec.query, "类型#裙") && streq(rec.answer, "这条裙子") &&
               !rec.has_history, "got %d (%s)", got, err.msg);
    glm_record_free(&rec);
    if (!rc) glm_reader_close(rd);

    const char *sg = write_file("sg.json",
        "[{\"system\": \"sys\", \"conversations\": [{\"from\": \"human\", \"value\": \"u1\"}, {\"from\": \"gpt\", \"value\": \"a1\"},"
        " {\"from\": \"user\", \"value\": \"u2\"}, {\"from\": \"assistant\", \"value\": \"a2\"}]},"
        " {\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"only\"}, {\"role\": \"assistant\", \"content\": \"one\"}]}]");
    rc = read_all(sg, &cfg, r, 8, &n, NULL, &err);
    TEST_CHECK(tc, "reader_sharegpt_multiturn", rc == 0 && n == 2 && streq(r[0].system, "sys") && r[0].n_hist == 1 &&
               streq(r[0].hist[0], "u1") && streq(r[0].hist[1], "a1") && streq(r[0].query, "u2") && streq(r[0].answer, "a2") &&
               r[0].has_history && streq(r[1].system, "S") && streq(r[1].query, "only") && !r[1].has_history,
               "rc %d n %d (%s)", rc, n, err.msg);
    free_all(r, n);

    /* explicit overrides: a .json of lines read as lines, schema forced */
    glm_read_cfg ov = {.schema = GLM_SCHEMA_ALPACA, .container = GLM_CONTAINER_LINES};
    const char *odd = write_file("odd.txt", "{\"instruction\": \"i\", \"output\": \"o\", \"prompt\": \"x\", \"response\": \"y\"}\n");
    rc = read_all(odd, &ov, r, 8, &n, NULL, &err);
    TEST_CHECK(tc, "reader_explicit_override", rc == 0 && n == 1 && streq(r[0].query, "i"), "rc %d (%s)", rc, err.msg);
    free_all(r, n);
    glm_schema s;
    glm_container ct;
    TEST_CHECK(tc, "reader_format_names", !glm_schema_parse("sharegpt", &s) && s == GLM_SCHEMA_SHAREGPT &&
               !glm_schema_parse("chatglm", &s) && s == GLM_SCHEMA_COLUMNS && glm_schema_parse("csv", &s) == -1 &&
               !glm_container_parse("jsonl", &ct) && ct == GLM_CONTAINER_LINES, "parse");

    /* BOM + CRLF */
    const char *bom = write_file("bom.jsonl", "\xEF\xBB\xBF{\"instruction\": \"a\",\r\n \"output\": \"b\"}\r\n{\"instruction\": \"c\", \"output\": \"d\\r\\n\"}\r\n");
    glm_read_stats st;
    rc = read_all(bom, &cfg, r, 8, &n, &st, &err);
    TEST_CHECK(tc, "reader_bom_crlf_jsonl_multiline_is_bad", rc == -1 && strstr(err.msg, "bom.jsonl:1:"), "rc %d (%s)", rc, err.msg);
    free_all(r, n);
    bom = write_file("bom2.jsonl", "\xEF\xBB\xBF{\"instruction\": \"a\", \"output\": \"b\"}\r\n\r\n{\"instruction\": \"c\", \"output\": \"d\\r\\n\"}\r\n");
    rc = read_all(bom, &cfg, r, 8, &n, &st, &err);
    TEST_CHECK(tc, "reader_bom_crlf", rc == 0 && n == 2 && st.bom && streq(r[0].answer, "b") && streq(r[1].answer, "d\r\n") &&
               r[1].line == 3, "rc %d n %d (%s)", rc, n, err.msg);
    free_all(r, n);
    bom = write_file("bom3.json", "\xEF\xBB\xBF\r\n[{\"instruction\": \"a\",\r\n\"output\": \"b\"}]\r\n");
    rc = read_all(bom, &cfg, r, 8, &n, &st, &err);
    TEST_CHECK(tc, "reader_bom_crlf_array", rc == 0 && n == 1 && st.bom && r[0].line == 2 && r[0].col == 2, "rc %d (%s)", rc, err.msg);
    free_all(r, n);
    bom = write_file("bom4.jsonl", "\xEF\xBB\xBF{\"instruction\": 1, \"output\": \"b\"}\n");
    rc = read_all(bom, &cfg, r, 8, &n, &st, &err);
    TEST_CHECK(tc, "reader_bom_column", rc == -1 && strstr(err.msg, "bom4.jsonl:1:1: field 'instruction'"), "rc %d (%s)", rc, err.msg);
    free_all(r, n);
}

/* One bad-data case: the error text without skipping, the counts with skip_bad_samples. */
static void bad_case(test_counts *tc, const char *name, const char *file, const char *text, const char *want_err,
                     int want_ok, int64_t want_json, int64_t want_record) {
    const char *p = write_file(file, text);
    glm_read_cfg cfg = {0};
    glm_record r[8];
    int n;
    glm_err err = {0};
    glm_read_stats st;
    int rc = read_all(p, &cfg, r, 8, &n, &st, &err);
    free_all(r, n);
    char tname[128];
    snprintf(tname, sizeof tname, "%s_error", name);
    TEST_CHECK(tc, tname, rc == -1 && strstr(err.msg, want_err), "rc %d, message '%s', wanted '%s'", rc, err.msg, want_err);
    cfg.skip_bad_samples = 1;
    err = (glm_err){0};
    rc = read_all(p, &cfg, r, 8, &n, &st, &err);
    free_all(r, n);
    snprintf(tname, sizeof tname, "%s_skipped", name);
    if (want_ok < 0) /* not skippable */
        TEST_CHECK(tc, tname, rc == -1 && strstr(err.msg, want_err), "rc %d (%s)", rc, err.msg);
    else
        TEST_CHECK(tc, tname, rc == 0 && n == want_ok && st.bad_json == want_json && st.bad_record == want_record &&
                   strstr(st.first_bad, want_err),
                   "rc %d n %d json %lld record %lld first '%s' (%s)", rc, n, (long long)st.bad_json,
                   (long long)st.bad_record, st.first_bad, err.msg);
}

static void test_bad_data(test_counts *tc) {
    const char *ok = "{\"instruction\": \"a\", \"output\": \"b\"}";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s\n%s\n{\"instruction\": \"a\" \"output\": \"b\"}\n%s\n", ok, ok, ok);
    bad_case(tc, "bad_jsonl_syntax", "b1.jsonl", buf, "b1.jsonl:3:", 3, 1, 0);
    snprintf(buf, sizeof buf, "[%s,\n %s,\n  {\"instruction\": \"a\", \"output\": b},\n %s]", ok, ok, ok);
    bad_case(tc, "bad_array_element", "b2.json", buf, "b2.json:3:", 3, 1, 0);
    snprintf(buf, sizeof buf, "[%s,\n %s,\n]", ok, ok);
    bad_case(tc, "bad_array_trailing_comma", "b3.json", buf, "b3.json:3:1: malformed JSON: expected a record", 2, 1, 0);
    snprintf(buf, sizeof buf, "[%s,\n %s\n", ok, ok);
    bad_case(tc, "bad_array_unterminated", "b4.json", buf, "unterminated array", -1, 0, 0);
    snprintf(buf, sizeof buf, "[%s,\n {\"instruction\": \"a\", \"output\": \"b\n", ok);
    bad_case(tc, "bad_array_unterminated_string", "b5.json", buf, "b5.json:2:33: unterminated string", -1, 0, 0);
    snprintf(buf, sizeof buf, "%s\n{\"instruction\": \"x\", \"answer\": \"y\"}\n%s\n", ok, ok);
    bad_case(tc, "bad_missing_field", "b6.jsonl", buf, "b6.jsonl:2:1: field 'output' is missing", 2, 0, 1);
    snprintf(buf, sizeof buf, "%s\n  {\"instruction\": 5, \"output\": \"y\"}\n", ok);
    bad_case(tc, "bad_nonstring_field", "b7.jsonl", buf, "b7.jsonl:2:3: field 'instruction' is a number, not a string", 1, 0, 1);
    snprintf(buf, sizeof buf, "%s\n[1, 2]\n", ok);
    bad_case(tc, "bad_not_object", "b8.jsonl", buf, "b8.jsonl:2:1: record is a list, not an object", 1, 0, 1);
    snprintf(buf, sizeof buf, "%s\n{\"instruction\": \"a\\u00e9\", \"output\": \"\xff\xfe\"}\n", ok);
    bad_case(tc, "bad_utf8", "b9.jsonl", buf, "field 'output' is not valid UTF-8", 1, 0, 1);
    snprintf(buf, sizeof buf, "%s\n{\"instruction\": \"a\", \"output\": \"b\", \"history\": [[\"q\"]]}\n", ok);
    bad_case(tc, "bad_history", "b10.jsonl", buf, "history[0] is not a [query, response] pair", 1, 0, 1);
    snprintf(buf, sizeof buf, "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n"
                              "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}]}\n");
    bad_case(tc, "bad_sharegpt_no_answer", "b11.jsonl", buf, "does not end with an assistant turn", 1, 0, 1);
    snprintf(buf, sizeof buf, "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n"
                              "{\"conversations\": [{\"from\": \"gpt\", \"value\": \"a\"}, {\"from\": \"human\", \"value\": \"b\"}]}\n");
    bad_case(tc, "bad_sharegpt_order", "b12.jsonl", buf, "out of turn", 1, 0, 1);
    snprintf(buf, sizeof buf, "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n"
                              "{\"conversations\": [{\"from\": \"human\", \"text\": \"a\"}, {\"from\": \"tool\", \"value\": \"b\"}]}\n");
    bad_case(tc, "bad_sharegpt_no_value", "b12b.jsonl", buf, "b12b.jsonl:2:1: conversations[0] has no 'value'/'content'", 1, 0, 1);
    snprintf(buf, sizeof buf, "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n"
                              "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"tool\", \"value\": \"b\"}]}\n");
    bad_case(tc, "bad_sharegpt_role", "b12c.jsonl", buf, "conversations[1]: unknown role 'tool'", 1, 0, 1);
    snprintf(buf, sizeof buf, "%s trailing\n", ok);
    bad_case(tc, "bad_jsonl_trailing_data", "b13.jsonl", buf, "b13.jsonl:1:37: malformed JSON: unexpected data after", 0, 1, 0);

    /* unknown keys: cannot detect, always an error naming the keys */
    const char *p = write_file("b14.jsonl", "{\"foo\": 1, \"bar\": 2}\n");
    glm_read_cfg cfg = {.skip_bad_samples = 1};
    glm_record r[2];
    int n;
    glm_err err = {0};
    int rc = read_all(p, &cfg, r, 2, &n, NULL, &err);
    TEST_CHECK(tc, "bad_unknown_format", rc == -1 && strstr(err.msg, "'foo', 'bar'") && strstr(err.hint, "data format"),
               "rc %d (%s | %s)", rc, err.msg, err.hint);
    /* a JSON-lines file with a .json name starting with '{' is fine; one starting with "x" is not JSON */
    p = write_file("b15.json", "hello\n");
    rc = read_all(p, &(glm_read_cfg){0}, r, 2, &n, NULL, &err);
    TEST_CHECK(tc, "bad_not_json", rc == -1 && strstr(err.msg, "b15.json:1:1: malformed JSON"), "rc %d (%s)", rc, err.msg);
    p = write_file("b16.json", "[{\"instruction\": \"a\", \"output\": \"b\"}] extra");
    rc = read_all(p, &(glm_read_cfg){0}, r, 2, &n, NULL, &err);
    free_all(r, n);
    TEST_CHECK(tc, "bad_data_after_array", rc == -1 && strstr(err.msg, "b16.json:1:39: unexpected data after the closing"),
               "rc %d (%s)", rc, err.msg);
}

static glm_record mkrec(const char *q, const char *in, const char *a) {
    glm_record r = {0};
    r.query = q ? glm_strdup(q) : NULL;
    r.input = in ? glm_strdup(in) : NULL;
    r.answer = a ? glm_strdup(a) : NULL;
    return r;
}
static void add_hist(glm_record *r, const char *q, const char *a) {
    r->hist = glm_realloc(r->hist, sizeof(char *) * 2 * (r->n_hist + 1));
    r->hist[2 * r->n_hist] = glm_strdup(q);
    r->hist[2 * r->n_hist + 1] = glm_strdup(a);
    r->n_hist++;
    r->has_history = 1;
}

static void test_prompts(test_counts *tc) {
    glm_example_cfg c;
    glm_example_cfg_init(&c);
    glm_record r = mkrec("写诗", "春天", "x");
    char *p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_plain_with_input", streq(p, "写诗\n春天"), "'%s'", p);
    free(p);
    r.has_history = 1;
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_history_column_empty", streq(p, "[Round 0]\n问：写诗\n春天\n答："), "'%s'", p);
    free(p);
    c.rounds = GLM_ROUNDS_NONEMPTY;
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_chat_rule_no_history", streq(p, "写诗\n春天"), "'%s'", p);
    free(p);
    add_hist(&r, "你好", "你好👋！");
    add_hist(&r, "q1", "a1");
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_history_rounds",
               streq(p, "[Round 0]\n问：你好\n答：你好👋！\n[Round 1]\n问：q1\n答：a1\n[Round 2]\n问：写诗\n春天\n答："), "'%s'", p);
    free(p);
    c.source_prefix = "PRE:";
    r.system = glm_strdup("SYS");
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_prefix_system", !strncmp(p, "PRE:SYS\n[Round 0]\n问：你好", strlen("PRE:SYS\n[Round 0]\n问：你好")), "'%s'", p);
    free(p);
    c.source_prefix = NULL;
    c.prompt_template = "<{system}>{history}[Round {round1}]\n\n问：{instruction}|{input}\n\n答：{{x}}";
    c.history_template = "[Round {i1}]\n\n问：{q}\n\n答：{r}\n\n";
    glm_err err = {0};
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_template", glm_example_cfg_check(&c, &err) == 0 &&
               streq(p, "<SYS>[Round 1]\n\n问：你好\n\n答：你好👋！\n\n[Round 2]\n\n问：q1\n\n答：a1\n\n[Round 3]\n\n问：写诗|春天\n\n答：{x}"),
               "'%s' (%s)", p, err.msg);
    free(p);
    c.prompt_template = "问：{instruction}\n答：";
    p = glm_example_prompt(&c, &r);
    TEST_CHECK(tc, "prompt_template_defaults", streq(p, "SYS\n问：写诗\n春天\n答："), "'%s'", p);
    free(p);
    c.prompt_template = "{instrucion}";
    TEST_CHECK(tc, "prompt_template_unknown", glm_example_cfg_check(&c, &err) == -1 && strstr(err.msg, "{instrucion}"), "%s", err.msg);
    c.prompt_template = NULL;
    c.history_template = "{i}{z}";
    TEST_CHECK(tc, "history_template_unknown", glm_example_cfg_check(&c, &err) == -1 && strstr(err.msg, "{z}"), "%s", err.msg);
    glm_record_free(&r);
    char esc[] = "a\\nb\\tc\\\\n";
    glm_unescape(esc);
    TEST_CHECK(tc, "unescape", streq(esc, "a\nb\tc\\n"), "'%s'", esc);
}

static int ids_eq(const glm_ids *v, const int32_t *w, int n) { return v->n == n && !memcmp(v->data, w, sizeof(int32_t) * n); }

static void test_examples(test_counts *tc) {
    glm_example_cfg c;
    glm_example_cfg_init(&c);
    glm_encoder enc = fake_encoder();
    glm_ids ids = {0}, lab = {0};
    glm_example_info info;
    glm_err err = {0};
    glm_record r = mkrec("ab", NULL, "xyz");
    int rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    int32_t a = 'a' + 1000, b = 'b' + 1000, x = 'x' + 1000, y = 'y' + 1000, z = 'z' + 1000;
    int32_t want[] = {a, b, FAKE_GMASK, FAKE_SOP, x, y, z, FAKE_EOP};
    int32_t wlab[] = {-100, -100, -100, FAKE_SOP, x, y, z, FAKE_EOP};
    TEST_CHECK(tc, "example_layout", rc == 0 && info.status == GLM_EX_OK && ids_eq(&ids, want, 8) && ids_eq(&lab, wlab, 8),
               "rc %d n %d", rc, ids.n);
    /* truncation: a to S-1, b to T-2, specials kept */
    c.max_source_length = 2;
    c.max_target_length = 4;
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    int32_t want2[] = {a, FAKE_GMASK, FAKE_SOP, x, y, FAKE_EOP};
    int32_t wlab2[] = {-100, -100, FAKE_SOP, x, y, FAKE_EOP};
    TEST_CHECK(tc, "example_truncation", rc == 0 && ids_eq(&ids, want2, 6) && ids_eq(&lab, wlab2, 6) && info.truncated_prompt &&
               info.truncated_answer && info.prompt_tokens == 2 && info.answer_tokens == 3, "rc %d n %d", rc, ids.n);
    c.max_target_length = 2;
    TEST_CHECK(tc, "example_cfg_lengths", glm_example_cfg_check(&c, &err) == -1 && strstr(err.msg, "max_target_length"), "%s", err.msg);
    glm_example_cfg_init(&c);
    c.train_on_prompt = 1;
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    TEST_CHECK(tc, "example_train_on_prompt", rc == 0 && ids_eq(&lab, want, 8), "rc %d", rc);
    c.train_on_prompt = 0;
    glm_record_free(&r);
    r = mkrec("ab", NULL, "");
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    TEST_CHECK(tc, "example_empty_answer", rc == 0 && info.status == GLM_EX_EMPTY, "rc %d status %d", rc, info.status);
    glm_record_free(&r);
    r = mkrec("", NULL, "x");
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    TEST_CHECK(tc, "example_empty_query", rc == 0 && info.status == GLM_EX_EMPTY, "rc %d status %d", rc, info.status);
    glm_record_free(&r);
    r = mkrec("q", NULL, "   ");
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    TEST_CHECK(tc, "example_answer_encodes_to_nothing", rc == 0 && info.status == GLM_EX_NO_ANSWER_TOKENS, "status %d", info.status);
    glm_record_free(&r);
    r = mkrec("   ", NULL, "x"); /* a prompt of spaces is kept: ids = [gMASK, sop, x, eop], as ptuning */
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    int32_t want3[] = {FAKE_GMASK, FAKE_SOP, x, FAKE_EOP};
    TEST_CHECK(tc, "example_prompt_encodes_to_nothing", rc == 0 && info.status == GLM_EX_OK && ids_eq(&ids, want3, 4), "n %d", ids.n);
    glm_record_free(&r);
    r = mkrec("a\x01", NULL, "x");
    r.index = 7; r.line = 9;
    rc = glm_example_build(&c, &enc, &r, &ids, &lab, &info, &err);
    TEST_CHECK(tc, "example_encoder_error", rc == -1 && strstr(err.msg, "record 7 (line 9)") && strstr(err.msg, "refuses"), "%s", err.msg);
    glm_record_free(&r);
    glm_ids_free(&ids); glm_ids_free(&lab);
}

static void test_hash(test_counts *tc) {
    TEST_CHECK(tc, "xxh64_vectors", glm_xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL &&
               glm_xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL, "%016llx %016llx",
               (unsigned long long)glm_xxh64("", 0, 0), (unsigned long long)glm_xxh64("a", 1, 0));
}

int main(void) {
    test_counts tc = {0};
    test_dir_make();
    test_readers(&tc);
    test_bad_data(&tc);
    test_prompts(&tc);
    test_examples(&tc);
    test_hash(&tc);
    test_dir_remove();
    TEST_EXIT(&tc);
}
