/* `glmtrain generate`: one response to --prompt, or batch generation over a data file
 * (--input_file, the training data schemas) to JSONL, for evaluating a fine-tune on held-out
 * data: prompts are built as ptuning's evaluation builds them (source_prefix, "[Round i]"
 * only with a non-empty history, or the training templates), rows are generated
 * --per_device_eval_batch_size at a time in one KV cache, and when the records carry answers
 * BLEU-4 and ROUGE-1/2/L are reported as ptuning's compute_metrics does (infer/metrics.h). */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli/commands.h"
#include "cli/gen_common.h"
#include "core/json_text.h"
#include "infer/chat.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "data/examples.h"
#include "data/reader.h"
#include "infer/metrics.h"

static const glm_flag gen_flags[] = {
    GEN_COMMON_FLAGS,
    GEN_LOOKUP_FLAGS,
    GEN_GUIDED_FLAGS,
    GEN_F(prompt, ARG_STR, NULL, "the query: print one response"),
    GEN_F(input_file, ARG_STR, NULL, "JSON/JSONL records (training data schemas, or prompts only) to answer"),
    GEN_F(output_file, ARG_STR, NULL, "JSONL of {index, prompt, predict, labels} (default: stdout)"),
    GEN_F(metrics_file, ARG_STR, NULL, "write BLEU-4 / ROUGE of predict vs labels here as JSON"),
    {"data_format", ARG_STR, offsetof(gen_args, data_format), "auto", "record schema", "auto|alpaca|columns|chatglm|sharegpt", NULL},
    GEN_F(prompt_column, ARG_STR, NULL, "ptuning-style prompt column (e.g. content)"),
    GEN_F(response_column, ARG_STR, NULL, "ptuning-style response column (e.g. summary)"),
    GEN_F(history_column, ARG_STR, NULL, "ptuning-style history column"),
    GEN_F(prompt_template, ARG_STR, NULL, "prompt body template (as in train)"),
    GEN_F(history_template, ARG_STR, NULL, "one history round (as in train)"),
    GEN_F(source_prefix, ARG_STR, NULL, "text prepended to every prompt"),
    GEN_F(max_source_length, ARG_INT, "0", "keep the first N-2 prompt tokens, as ptuning's evaluation (0 = all)"),
    GEN_F(per_device_eval_batch_size, ARG_INT, "8", "prompts generated together"),
    GEN_F(max_predict_samples, ARG_INT, "0", "answer only the first N prompts: records, or a conversation's assistant turns (0 = all)"),
    GEN_F(skip_bad_samples, ARG_BOOL, "false", "skip malformed records instead of stopping"),
    GEN_F(postprocess, ARG_BOOL, "true", "model.chat's response post-processing (false: strip only, as ptuning's predictions)"),
};
static const int n_gen_flags = sizeof gen_flags / sizeof gen_flags[0];

static void debug_ids(const char *what, int row, const glm_ids *v) {
    fprintf(stderr, "[debug] %s ids (row %d):", what, row);
    for (int i = 0; i < v->n; i++) fprintf(stderr, " %d", v->data[i]);
    fprintf(stderr, "\n");
}

/* A prompt's model inputs, cut as ptuning's evaluation cuts them (--max_source_length N keeps
 * the first N-2 text tokens); *dropped counts the text tokens cut. */
static int prompt_ids(gen_session *s, const gen_args *a, const char *text, glm_ids *in, int *dropped, glm_err *err) {
    int max_text = a->max_source_length > 0 ? a->max_source_length - 2 : 0;
    return glm_prompt_inputs_cut(s->tok, gen_config(s), text, max_text, in, dropped, err);
}

/* A prompt of n tokens that leaves no room for the response: says which limit and which flag
 * (with a value that fits) truncates it; `also` adds another way out. */
static int refuse_long(const gen_session *s, const gen_args *a, const char *what, int n, const char *also, glm_err *err) {
    char lim[160];
    int room = glm_gen_max_prompt(&s->g);
    glm_gen_limit_text(&s->g, lim, sizeof lim);
    glm_fail(err, "%s is %d tokens with [gMASK] <sop>; at most %d fit (%s)", what, n, room, lim);
    if (room < 3) return glm_hint(err, "lower --max_new_tokens to leave room for a prompt");
    if (a->max_source_length > 0)
        return glm_hint(err, "lower --max_source_length to %d (it keeps the first N-2 prompt tokens) or --max_new_tokens%s", room,
                        also);
    return glm_hint(err, "pass --max_source_length %d to keep the first %d prompt tokens, or shorten the prompt%s", room,
                    room - 2, also);
}

/* --prompt's inputs, checked against the limits before the weights are read. */
static int prepare_prompt(gen_session *s, const gen_args *a, glm_ids *in, glm_err *err) {
    /* the model's chat prompt of one turn: ChatGLM-6B the query, ChatGLM2 "[Round 1]..." text,
     * ChatGLM3 / GLM-4 role tokens (no text form: built as chat builds them) */
    char *p = glm_chat_prompt_for(s->tok, a->prompt, NULL, 0);
    if (!p) {
        int dropped;
        return gen_chat_inputs(s, a->system, a->prompt, NULL, 0, glm_gen_max_prompt(&s->g), in, &dropped, NULL, err);
    }
    if (a->system && a->system[0]) { /* as the training examples put it */
        char *q = glm_malloc(strlen(a->system) + strlen(p) + 2);
        sprintf(q, "%s\n%s", a->system, p);
        free(p);
        p = q;
    }
    int dropped = 0, rc = prompt_ids(s, a, p, in, &dropped, err);
    free(p);
    if (rc) return -1;
    if (dropped)
        glm_warn("--max_source_length %d: the prompt's %d text tokens were cut to the first %d (%d dropped)",
                 a->max_source_length, a->max_source_length - 2 + dropped, a->max_source_length - 2, dropped);
    if (in->n > glm_gen_max_prompt(&s->g)) return refuse_long(s, a, "--prompt", in->n, "", err);
    return 0;
}

/* One response. On a terminal it is printed as its tokens arrive, as chat does; redirected,
 * only the finished response is written (a file or pipe gets the same text either way). */
static int generate_one(gen_session *s, const gen_args *a, const glm_ids *in, glm_err *err) {
    glm_ids out = {0};
    glm_rng rng;
    glm_rng_seed(&rng, (uint64_t)a->seed);
    if (a->debug) debug_ids("prompt", 0, in);
    gen_stream st = {.show = isatty(fileno(stdout)), .debug = a->debug};
    if (st.show) glm_streamer_init(&st.st, s->tok, gen_postprocess(s, a->postprocess));
    int rc = glm_generate_lm(gen_lm(s), 1, in, &s->g, &rng, &out, st.show || a->debug ? gen_stream_token : NULL, &st, err);
    if (rc == 0 && a->debug) debug_ids("response", 0, &out);
    if (rc == 0 && st.show) {
        char *tail, *res = glm_streamer_finish(&st.st, &tail);
        printf("%s\n", tail);
        free(tail);
        free(res);
    } else if (rc == 0) {
        char *res = glm_response_text(s->tok, out.data, out.n, gen_postprocess(s, a->postprocess));
        printf("%s\n", res);
        free(res);
    } else if (st.show && st.st.n_shown) {
        printf("\n"); /* end the partial line before the error */
    }
    fflush(stdout);
    if (st.show) glm_streamer_free(&st.st);
    glm_ids_free(&out);
    return rc;
}

/* ---- records: the training readers, or a file of bare prompts ---- */

/* A file whose first record has no answer field holds bare prompts: a JSON string per line,
 * or objects with a prompt (and optionally a history) but nothing to compare against. */
static int is_prompts_file(const char *path, const gen_args *a) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL, *s = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) { /* the first non-blank line */
        s = line + (strncmp(line, "\xef\xbb\xbf", 3) == 0 ? 3 : 0);
        while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
        if (*s) break;
        s = NULL;
    }
    fclose(f);
    cJSON *o = s && *s != '[' ? cJSON_Parse(s) : NULL;
    int bare = cJSON_IsString(o);
    if (cJSON_IsObject(o)) {
        const char *keys[] = {"output", "response", "summary", "conversations", "messages", a->response_column};
        bare = 1;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (keys[i] && cJSON_GetObjectItemCaseSensitive(o, keys[i])) bare = 0;
    }
    cJSON_Delete(o);
    free(line);
    return bare;
}

typedef struct prompt_src {
    glm_reader *rd;           /* training schemas */
    FILE *f;                  /* bare prompts */
    const char *path, *column;
    long line;
} prompt_src;

/* 1: a record; 0: end; -1: error. Bare prompts fill query (+ history) and leave answer "". */
static int next_record(prompt_src *p, glm_record *r, glm_err *err) {
    if (p->rd) return glm_reader_next(p->rd, r, err);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        ssize_t len = getline(&line, &cap, p->f);
        if (len < 0) { free(line); return 0; }
        p->line++;
        char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
        if (*s) break;
    }
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    cJSON *o = glm_json_parse_at(line, n, p->path, (int)p->line, "one JSON record a line", err);
    free(line);
    memset(r, 0, sizeof *r);
    r->line = p->line;
    if (!o) return glm_hint(err, "each line of --input_file is one JSON string or object (JSON Lines)");
    const cJSON *q = cJSON_IsString(o) ? o : NULL;
    const char *keys[] = {p->column, "prompt", "instruction", "query", "content", "input"};
    for (size_t i = 0; !q && cJSON_IsObject(o) && i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i] && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, keys[i])))
            q = cJSON_GetObjectItemCaseSensitive(o, keys[i]);
    if (!q) {
        cJSON_Delete(o);
        glm_fail(err, "%s:%ld: expected a JSON string or an object with a \"prompt\" string", p->path, p->line);
        return glm_hint(err, "name the field with --prompt_column");
    }
    r->query = glm_strdup(q->valuestring);
    r->answer = glm_strdup("");
    /* the training reader's history rules: pairs of UTF-8 strings, never a turn dropped in silence */
    char why[200] = "\"history\" is not a list of [query, response] pairs";
    const cJSON *h = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "history") : NULL;
    int bad = h && !cJSON_IsNull(h) && (!cJSON_IsArray(h) || glm_schema_history(o, "history", r, why, sizeof why));
    cJSON_Delete(o);
    if (bad) {
        glm_record_free(r);
        glm_fail(err, "%s:%ld: %s", p->path, p->line, why);
        return glm_hint(err, "write \"history\": [[\"earlier question\", \"its answer\"], ...]");
    }
    r->has_history = 0; /* set by the reader for any history key; bare prompts wrap rounds only when turns exist */
    return 1;
}

static int open_src(prompt_src *p, const gen_args *a, glm_layout layout, glm_err *err) {
    memset(p, 0, sizeof *p);
    p->path = a->input_file;
    p->column = a->prompt_column;
    if (is_prompts_file(a->input_file, a)) {
        p->f = fopen(a->input_file, "r");
        return p->f ? 0 : glm_fail(err, "%s: cannot open", a->input_file);
    }
    glm_read_cfg rc = {.skip_bad_samples = a->skip_bad_samples};
    if (glm_schema_parse(strcmp(a->data_format, "chatglm") == 0 ? "columns" : a->data_format, &rc.schema))
        return glm_fail(err, "--data_format %s is not known", a->data_format);
    rc.columns.prompt = a->prompt_column;
    rc.columns.response = a->response_column;
    rc.columns.history = a->history_column;
    rc.conversations = glm_layout_turns(layout); /* ChatGLM3 / GLM-4: every assistant turn is evaluated */
    rc.glm4 = layout == GLM_LAYOUT_GLM4;
    return glm_reader_open(&p->rd, a->input_file, &rc, err);
}

static void close_src(prompt_src *p) {
    if (p->rd) glm_reader_close(p->rd);
    if (p->f) fclose(p->f);
}

/* ---- batch generation ---- */

typedef struct item {
    glm_record rec;            /* (a conversation's later turns: only its index and line) */
    char *prompt;
    glm_ids in, out;
    int skip;  /* prompt leaves no room for a response (--skip_bad_samples): empty prediction */
    int turn;                  /* a conversation's assistant turn (its index in the turns), else -1 */
    char *label;               /* that turn's text, the answer scored against (else rec.answer) */
} item;

typedef struct items {
    item *v;
    long n, cap;
} items;

static void items_free(items *L) {
    for (long i = 0; i < L->n; i++) {
        glm_record_free(&L->v[i].rec);
        free(L->v[i].prompt);
        free(L->v[i].label);
        glm_ids_free(&L->v[i].in);
        glm_ids_free(&L->v[i].out);
    }
    free(L->v);
    memset(L, 0, sizeof *L);
}

static item *items_push(items *L) {
    if (L->n == L->cap) L->v = glm_realloc(L->v, sizeof(item) * (size_t)(L->cap = L->cap ? 2 * L->cap : 64));
    memset(&L->v[L->n], 0, sizeof(item));
    L->v[L->n].turn = -1;
    return &L->v[L->n++];
}

static void example_cfg(const gen_session *s, gen_args *a, glm_example_cfg *ex) {
    glm_example_cfg_init(ex);
    ex->source_prefix = a->source_prefix;
    ex->default_system = a->system; /* a record without a system of its own takes --system, as training's --default_system */
    if (a->prompt_template) glm_unescape(a->prompt_template);
    if (a->history_template) glm_unescape(a->history_template);
    ex->prompt_template = a->prompt_template;
    ex->history_template = a->history_template;
    ex->rounds = GLM_ROUNDS_NONEMPTY; /* ptuning's preprocess_function_eval */
    ex->reasoning = s->reasoning; /* --template glmz1 (gen_open_tokenizer) */
    ex->disable_thinking = s->disable_thinking;
}

/* One record's prompt and inputs, checked against the limits (`index`: its number, for messages). */
static int prepare_item(gen_session *s, const gen_args *a, const glm_example_cfg *ex, item *it, long index, long *cut,
                        long *cut_tokens, glm_err *err) {
    int dropped = 0;
    it->prompt = it->turn >= 0 ? glm_tokenizer_decode(s->tok, it->in.data, it->in.n)
                               : glm_example_prompt_as(ex, glm_layout_of(s->tok), &it->rec);
    if (it->turn >= 0) { /* a conversation's turn: its inputs are made (glm_example_eval_turns) */
    } else if (!it->prompt) { /* ChatGLM3: role tokens as chat builds them (the query with its alpaca input) */
        const glm_record *r = &it->rec;
        size_t nq = strlen(r->query) + (r->input ? strlen(r->input) : 0) + 2;
        char *q = glm_malloc(nq);
        snprintf(q, nq, "%s%s%s", r->query, r->input && r->input[0] ? "\n" : "", r->input && r->input[0] ? r->input : "");
        int rc = gen_chat_inputs(s, r->system && r->system[0] ? r->system : a->system, q, (const char *const *)r->hist, r->n_hist,
                                 INT_MAX, &it->in, NULL, &it->prompt, err);
        free(q);
        if (rc) return -1;
    } else if (prompt_ids(s, a, it->prompt, &it->in, &dropped, err)) {
        return -1;
    }
    if (dropped) { (*cut)++; *cut_tokens += dropped; }
    if (it->in.n <= glm_gen_max_prompt(&s->g)) return 0;
    char what[4300];
    snprintf(what, sizeof what, "%s:%lld: record %ld's prompt", a->input_file, (long long)it->rec.line, index);
    if (!a->skip_bad_samples)
        return refuse_long(s, a, what, it->in.n, ", or --skip_bad_samples true to give it an empty prediction", err);
    glm_warn("%s is %d tokens with [gMASK] <sop>, more than the %d that fit: empty prediction (--skip_bad_samples)", what,
             it->in.n, glm_gen_max_prompt(&s->g));
    it->skip = 1;
    return 0;
}

/* Every record of --input_file, parsed, built into a prompt and checked before anything is
 * generated or written: a cut or malformed file, or a prompt that cannot fit, fails with its
 * file:line instead of after some predictions. Records past --max_predict_samples are parsed
 * (the file is checked whole) but not kept. */
/* A conversation record's items: one per assistant turn (glm_example_eval_turns); the first
 * keeps the record, the others its index and line. */
static int conversation_items(gen_session *s, const gen_args *a, const glm_example_cfg *ex, const glm_encoder *enc,
                              glm_record *r, items *L, long *records, long *cut, long *cut_tokens, glm_err *err) {
    glm_example_cfg c = *ex;
    c.max_source_length = a->max_source_length > 0 ? a->max_source_length : INT_MAX;
    glm_eval_turn *t;
    int n, rc = glm_example_eval_turns(&c, enc, r, &t, &n, err);
    if (rc) { glm_record_free(r); return -1; }
    for (int k = 0; k < n && rc == 0; k++) {
        if (a->max_predict_samples > 0 && L->n >= a->max_predict_samples) break;
        item *it = items_push(L);
        if (k == 0) it->rec = *r;
        else { it->rec.index = r->index; it->rec.line = r->line; }
        it->turn = t[k].turn;
        it->in = t[k].in;
        it->label = t[k].label;
        t[k] = (glm_eval_turn){0};
        rc = prepare_item(s, a, ex, it, L->n - 1, cut, cut_tokens, err);
    }
    if (n == 0) glm_record_free(r);
    glm_eval_turns_free(t, n);
    (*records)++;
    return rc;
}

static int read_items(gen_session *s, gen_args *a, items *L, glm_err *err) {
    glm_example_cfg ex;
    example_cfg(s, a, &ex);
    prompt_src src;
    glm_encoder enc = {0}; /* ChatGLM3 / GLM-4: the training examples' encoder, conversations' turns as they trained */
    glm_layout layout = glm_layout_of(s->tok);
    if ((glm_layout_turns(layout) && glm_encoder_from_tokenizer(&enc, s->tok, NULL, err)) || open_src(&src, a, layout, err))
        return -1;
    long cut = 0, cut_tokens = 0, records = 0;
    int rc = 0;
    for (;;) {
        glm_record r;
        int k = next_record(&src, &r, err);
        if (k <= 0) { rc = k; break; }
        if (a->max_predict_samples > 0 && L->n >= a->max_predict_samples) { glm_record_free(&r); continue; }
        if (r.conv_key) {
            if ((rc = conversation_items(s, a, &ex, &enc, &r, L, &records, &cut, &cut_tokens, err))) break;
            continue;
        }
        item *it = items_push(L);
        it->rec = r;
        if ((rc = prepare_item(s, a, &ex, it, L->n - 1, &cut, &cut_tokens, err))) break;
    }
    if (rc == 0 && records)
        glm_info("%s: %ld conversations give %ld prompts, one per assistant turn (as process_batch_eval)", a->input_file,
                 records, L->n);
    close_src(&src);
    if (rc == 0 && cut)
        glm_warn("--max_source_length %d: %ld of %ld prompts were cut to their first %d tokens (%ld tokens dropped in all)",
                 a->max_source_length, cut, L->n, a->max_source_length - 2, cut_tokens);
    return rc;
}

static int write_batch(FILE *o, gen_session *s, const gen_args *a, item *p, int n, long base, glm_score_sum *sc) {
    for (int i = 0; i < n; i++) {
        char *res = glm_response_text(s->tok, p[i].out.data, p[i].out.n, gen_postprocess(s, a->postprocess));
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "index", (double)(base + i));
        cJSON_AddStringToObject(j, "prompt", p[i].prompt);
        cJSON_AddStringToObject(j, "predict", res);
        if (p[i].turn >= 0) { /* a conversation's turn: the record it comes from, and which turn */
            cJSON_ReplaceItemInObject(j, "index", cJSON_CreateNumber((double)p[i].rec.index));
            cJSON_AddNumberToObject(j, "turn", p[i].turn);
        }
        const char *label = p[i].turn >= 0 ? p[i].label : p[i].rec.answer;
        if (label && label[0]) {
            cJSON_AddStringToObject(j, "labels", label);
            glm_text_scores t = glm_text_score(res, label);
            glm_score_add(sc, &t);
        }
        char *line = cJSON_PrintUnformatted(j);
        fprintf(o, "%s\n", line);
        free(line);
        cJSON_Delete(j);
        free(res);
    }
    fflush(o);
    return ferror(o) ? -1 : 0;
}

static int report_metrics(const gen_args *a, const glm_score_sum *sc, glm_err *err) {
    glm_text_scores m = glm_score_mean(sc);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "predict_bleu-4", m.bleu4);
    cJSON_AddNumberToObject(j, "predict_rouge-1", m.rouge1);
    cJSON_AddNumberToObject(j, "predict_rouge-2", m.rouge2);
    cJSON_AddNumberToObject(j, "predict_rouge-l", m.rougel);
    cJSON_AddNumberToObject(j, "predict_samples", (double)sc->n);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    glm_info("metrics (character-level ROUGE, see docs): %s", text);
    int rc = a->metrics_file ? glm_write_file_atomic(a->metrics_file, text, strlen(text), err) : 0;
    free(text);
    return rc;
}

/* Rows p[0..n) through the model in one batch (skipped rows stay empty). */
static int generate_batch(gen_session *s, const gen_args *a, item *p, int n, long base, glm_err *err) {
    glm_ids *ins = glm_calloc((size_t)n, sizeof *ins), *outs = glm_calloc((size_t)n, sizeof *outs);
    glm_rng *rngs = glm_calloc((size_t)n, sizeof *rngs);
    int *row_of = glm_calloc((size_t)n, sizeof *row_of), m = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].skip) continue;
        ins[m] = p[i].in;
        glm_rng_seed(&rngs[m], (uint64_t)a->seed * 1000003ULL + (uint64_t)(base + i));
        row_of[m++] = i;
    }
    if (s->g.prompt_lookup_num_tokens > 0) /* a draft is checked for one row: the prompts one at a time */
        for (int j = 0; j < m && rc == 0; j++) rc = glm_generate_lm(gen_lm(s), 1, &ins[j], &s->g, &rngs[j], &outs[j], NULL, NULL, err);
    else if (m > 0) rc = glm_generate_lm(gen_lm(s), m, ins, &s->g, rngs, outs, NULL, NULL, err);
    for (int j = 0; j < m; j++) {
        p[row_of[j]].out = outs[j];
        if (rc == 0 && a->debug) {
            debug_ids("prompt", (int)(base + row_of[j]), &ins[j]);
            debug_ids("response", (int)(base + row_of[j]), &outs[j]);
        }
    }
    free(ins); free(outs); free(rngs); free(row_of);
    return rc;
}

static int generate_items(gen_session *s, const gen_args *a, items *L, glm_err *err) {
    FILE *o = a->output_file ? fopen(a->output_file, "w") : stdout;
    if (!o) return glm_fail(err, "--output_file %s: cannot create", a->output_file);
    int B = a->per_device_eval_batch_size, rc = 0;
    glm_score_sum sc = {0};
    long tokens = 0, skipped = 0;
    double t0 = glm_now();
    for (long base = 0; rc == 0 && base < L->n; base += B) {
        int n = L->n - base < B ? (int)(L->n - base) : B;
        item *p = L->v + base;
        rc = generate_batch(s, a, p, n, base, err);
        for (int i = 0; i < n; i++) { tokens += p[i].out.n; skipped += p[i].skip; }
        if (rc == 0 && write_batch(o, s, a, p, n, base, &sc))
            rc = glm_fail(err, "%s: write failed", a->output_file ? a->output_file : "stdout");
        for (int i = 0; i < n; i++) { glm_ids_free(&p[i].in); glm_ids_free(&p[i].out); }
        if (rc == 0)
            glm_info("%ld responses, %ld tokens, %.1f tokens/s", base + n, tokens, tokens / (glm_now() - t0 + 1e-9));
    }
    if (rc == 0) gen_report_lookup(s);
    if (rc == 0 && skipped) glm_warn("%ld prompts were too long and got empty predictions (--skip_bad_samples)", skipped);
    if (rc == 0 && sc.n > 0) rc = report_metrics(a, &sc, err);
    if (o != stdout && fclose(o) != 0 && rc == 0) rc = glm_fail(err, "%s: write failed", a->output_file);
    return rc;
}

/* Flag values that need no model, refused before anything is read. */
static int check_flags(const gen_args *a, glm_err *err) {
    if (!a->prompt == !a->input_file) {
        glm_fail(err, a->prompt ? "--prompt and --input_file exclude each other" : "--prompt or --input_file is required");
        return glm_hint(err, "--prompt TEXT prints one response; --input_file FILE answers every record of a data file");
    }
    if (a->per_device_eval_batch_size < 1) return glm_fail(err, "--per_device_eval_batch_size must be >= 1");
    if (a->max_source_length != 0 && a->max_source_length < 3)
        return glm_fail(err, "--max_source_length must be 0 or >= 3 (got %d)", a->max_source_length);
    if (a->output_file && a->prompt) return glm_fail(err, "--output_file goes with --input_file (--prompt prints to stdout)");
    return 0;
}

int glm_cmd_generate(int argc, char **argv) {
    gen_args a;
    glm_err err = {0};
    gen_session s = {0};
    glm_ids in = {0};
    items L = {0};
    int rc = gen_parse(gen_flags, n_gen_flags, &a, argc, argv, "generate", &err);
    if (rc == 1) { gen_args_free(gen_flags, n_gen_flags, &a); return 0; }
    if (!rc) rc = check_flags(&a, &err);
    /* the prompts are checked against the model's limits before its weights are read */
    if (!rc) rc = gen_open_tokenizer(&s, &a, &err);
    if (!rc) rc = a.prompt ? prepare_prompt(&s, &a, &in, &err) : read_items(&s, &a, &L, &err);
    if (!rc) rc = gen_open_model(&s, &a, &err);
    if (!rc && a.input_file && a.prompt_lookup_num_tokens > 0 && a.per_device_eval_batch_size > 1)
        glm_info("--prompt_lookup_num_tokens: the prompts run one at a time (--per_device_eval_batch_size %d is not used)",
                 a.per_device_eval_batch_size);
    if (!rc) rc = a.prompt ? generate_one(&s, &a, &in, &err) : generate_items(&s, &a, &L, &err);
    if (!rc && a.prompt) gen_report_lookup(&s);
    if (rc) glm_err_print(&err);
    glm_ids_free(&in);
    items_free(&L);
    gen_close(&s);
    gen_args_free(gen_flags, n_gen_flags, &a);
    return rc ? 1 : 0;
}
