/* The ChatGLM2/3 pieces of the tokenizer, data and chat layers as one driver for the Python tests
 * (test_chatglm23_tok.py, test_chatglm23_data.py). Modes (input: one JSON value per stdin line,
 * output: one JSON line per input):
 *   info     --tokenizer P            {"kind", "vocab", "spm", "eos", "roles", "stop", "layout"} (no input)
 *   pair     --tokenizer P            [a, b|null] -> {"ids"}: build_inputs(encode(a), encode(b))
 *   chat     --tokenizer P            {"query", "history": [[q, r]..], "system"?, "max_prompt"?}
 *                                     -> {"ids", "dropped", "prompt"} or {"error"}
 *   response --tokenizer P            [ids] -> {"text"}: glm_response_text with post-processing
 *   pyjson                            any JSON text -> {"dump"} (json.dumps indent 4) or {"error"}
 *   examples --tokenizer P --train_file F [--format F] [--max_source_length N]
 *            [--max_target_length N] [--conversation_labels thudm|eos] [--train_on_prompt]
 *            [--source_prefix S] [--default_system S] [--cutoff_len N] [--mask_history] [--prompt_template T] [--cache_dir D] [--threads N]
 *            [--pairs]  (preference records: each line also has "split", where the rejected example starts)
 *            [--pt_block N [--pt_group G]]  (--stage pt: {"text"} records joined and cut into N-token blocks)
 *            [--kto [--pt_group G]]  (--stage kto: each example then its KL example, "split" and "kto_tag";
 *              G records to a group, each one's KL answer its predecessor's there)
 *            [--template glmz1] [--enable_thinking true|false]
 *                                     {"ids", "labels"} per example, then {"summary"}; errors on
 *                                     stderr, exit 1 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/data.h"
#include "data/pyjson.h"
#include "infer/chat.h"
#include "tokenizer/tokenizer.h"

static cJSON *ids_json(const int32_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static void emit(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

static char *read_line(FILE *f) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 2 > cap) s = realloc(s, cap *= 2);
        s[n++] = (char)c;
    }
    if (c == EOF && n == 0) { free(s); return NULL; }
    s[n] = 0;
    return s;
}

static int encode(const glm_tokenizer *t, const char *s, glm_ids *v) {
    glm_err err = {0};
    if (glm_tokenizer_encode(t, s, strlen(s), v, &err)) { glm_err_print(&err); return -1; }
    return 0;
}

static int mode_info(const glm_tokenizer *t) {
    cJSON *o = cJSON_CreateObject();
    glm_role_ids r = glm_tokenizer_roles(t);
    int32_t roles[4] = {r.system, r.user, r.assistant, r.observation}, stop[4];
    int ns = glm_tokenizer_stop_ids(t, stop);
    cJSON_AddNumberToObject(o, "kind", glm_tokenizer_kind(t));
    cJSON_AddNumberToObject(o, "vocab", glm_tokenizer_vocab_size(t));
    cJSON_AddNumberToObject(o, "spm", glm_tokenizer_spm_size(t));
    cJSON_AddNumberToObject(o, "eos", glm_tokenizer_eos(t));
    cJSON_AddItemToObject(o, "roles", ids_json(roles, 4));
    cJSON_AddItemToObject(o, "stop", ids_json(stop, ns));
    cJSON_AddStringToObject(o, "layout", glm_layout_name(glm_layout_of(t)));
    emit(o);
    return 0;
}

static int mode_pair(const glm_tokenizer *t) {
    for (char *line; (line = read_line(stdin)); free(line)) {
        cJSON *in = cJSON_Parse(line);
        glm_ids a = {0}, b = {0}, out = {0};
        const cJSON *x = cJSON_GetArrayItem(in, 0), *y = cJSON_GetArrayItem(in, 1);
        if (!cJSON_IsString(x) || encode(t, x->valuestring, &a) || (cJSON_IsString(y) && encode(t, y->valuestring, &b))) return 1;
        glm_tokenizer_build_inputs(t, a.data, a.n, cJSON_IsString(y) ? (b.data ? b.data : a.data) : NULL, b.n, &out);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "ids", ids_json(out.data, out.n));
        emit(o);
        glm_ids_free(&a); glm_ids_free(&b); glm_ids_free(&out);
        cJSON_Delete(in);
    }
    return 0;
}

static int mode_chat(const glm_tokenizer *t) {
    glm_config c;
    memset(&c, 0, sizeof c);
    c.gmask_token_id = c.bos_token_id = -1; /* a ChatGLM2-family config names neither */
    for (char *line; (line = read_line(stdin)); free(line)) {
        cJSON *in = cJSON_Parse(line);
        const cJSON *q = cJSON_GetObjectItem(in, "query"), *h = cJSON_GetObjectItem(in, "history"),
                    *sys = cJSON_GetObjectItem(in, "system"), *mp = cJSON_GetObjectItem(in, "max_prompt");
        int nh = cJSON_GetArraySize(h);
        const char **hist = calloc((size_t)(2 * nh + 1), sizeof *hist);
        for (int i = 0; i < nh; i++) {
            hist[2 * i] = cJSON_GetArrayItem(cJSON_GetArrayItem(h, i), 0)->valuestring;
            hist[2 * i + 1] = cJSON_GetArrayItem(cJSON_GetArrayItem(h, i), 1)->valuestring;
        }
        glm_ids out = {0};
        int dropped = 0;
        char *prompt = NULL;
        glm_err err = {0};
        cJSON *o = cJSON_CreateObject();
        if (glm_chat_inputs_sys(t, &c, cJSON_IsString(sys) ? sys->valuestring : NULL, q->valuestring, hist, nh,
                                cJSON_IsNumber(mp) ? mp->valueint : 1 << 30, &out, &dropped, &prompt, &err)) {
            cJSON_AddStringToObject(o, "error", err.msg);
        } else {
            cJSON_AddItemToObject(o, "ids", ids_json(out.data, out.n));
            cJSON_AddNumberToObject(o, "dropped", dropped);
            cJSON_AddStringToObject(o, "prompt", prompt);
        }
        emit(o);
        free(prompt); free(hist); glm_ids_free(&out);
        cJSON_Delete(in);
    }
    return 0;
}

static int mode_response(const glm_tokenizer *t) {
    for (char *line; (line = read_line(stdin)); free(line)) {
        cJSON *in = cJSON_Parse(line);
        glm_ids v = {0};
        for (const cJSON *x = in ? in->child : NULL; x; x = x->next) glm_ids_push(&v, x->valueint);
        char *s = glm_response_text(t, v.data, v.n, 1);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", s);
        emit(o);
        free(s); glm_ids_free(&v);
        cJSON_Delete(in);
    }
    return 0;
}

static int mode_pyjson(void) {
    for (char *line; (line = read_line(stdin)); free(line)) {
        char why[200];
        char *d = glm_pyjson_dumps(line, strlen(line), 4, why, sizeof why);
        cJSON *o = cJSON_CreateObject();
        if (d) cJSON_AddStringToObject(o, "dump", d); else cJSON_AddStringToObject(o, "error", why);
        emit(o);
        free(d);
    }
    return 0;
}

static int mode_examples(const glm_tokenizer *t, const char *tok_path, glm_data_cfg *cfg) {
    glm_err err = {0};
    glm_encoder enc;
    glm_examples *ex;
    if (glm_encoder_from_tokenizer(&enc, t, tok_path, &err) || glm_examples_load(&ex, cfg->train_file, cfg, &enc, &err)) {
        glm_err_print(&err);
        return 1;
    }
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)(ex->summary.longest + 1));
    for (int64_t i = 0; i < ex->n; i++) {
        int n = glm_examples_labels(ex, i, lab);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "ids", ids_json(ex->ids + ex->off[i], n));
        cJSON_AddItemToObject(o, "labels", ids_json(lab, n));
        if (cfg->read.pairs || cfg->read.kto) cJSON_AddNumberToObject(o, "split", glm_examples_split(ex, i));
        if (cfg->read.kto) cJSON_AddBoolToObject(o, "kto_tag", glm_examples_desirable(ex, i));
        emit(o);
    }
    const glm_data_summary *s = &ex->summary;
    printf("{\"summary\": {\"records\": %lld, \"examples\": %lld, \"bad_record\": %lld, \"empty\": %lld, "
           "\"no_answer_tokens\": %lld, \"truncated_prompt\": %lld, \"truncated_answer\": %lld, \"cache\": \"%s\"}}\n",
           (long long)s->records, (long long)s->examples, (long long)s->bad_record, (long long)s->empty,
           (long long)s->no_answer_tokens, (long long)s->truncated_prompt, (long long)s->truncated_answer, ex->cache_note);
    free(lab);
    glm_examples_free(ex);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s info|pair|chat|response|pyjson|examples [options]\n", argv[0]); return 2; }
    const char *mode = argv[1], *tok_path = NULL;
    glm_data_cfg cfg;
    glm_data_cfg_init(&cfg);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--train_on_prompt")) { cfg.example.train_on_prompt = 1; continue; }
        if (!strcmp(a, "--skip_bad_samples")) { cfg.read.skip_bad_samples = 1; continue; }
        if (!strcmp(a, "--mask_history")) { cfg.example.mask_history = 1; continue; }
        if (!strcmp(a, "--pairs")) { cfg.read.pairs = 1; continue; } /* preference records: "split" per example */
        if (!strcmp(a, "--kto")) { cfg.read.kto = cfg.example.kto = 1; continue; } /* KTO records: "split" and "kto_tag" */
        if (!v) { fprintf(stderr, "error: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--train_file")) cfg.train_file = v;
        else if (!strcmp(a, "--format")) { if (glm_schema_parse(v, &cfg.read.schema)) return 2; }
        else if (!strcmp(a, "--max_source_length")) cfg.example.max_source_length = atoi(v);
        else if (!strcmp(a, "--max_target_length")) cfg.example.max_target_length = atoi(v);
        else if (!strcmp(a, "--conversation_labels")) { if (glm_conv_labels_parse(v, &cfg.example.conv_labels)) return 2; }
        else if (!strcmp(a, "--source_prefix")) cfg.example.source_prefix = v;
        else if (!strcmp(a, "--default_system")) cfg.example.default_system = v;
        else if (!strcmp(a, "--cutoff_len")) cfg.example.cutoff_len = atoi(v);
        else if (!strcmp(a, "--pt_block")) { cfg.example.pt_block = atoi(v); cfg.read.texts = 1; } /* --stage pt's blocks */
        else if (!strcmp(a, "--pt_group")) cfg.example.pt_group = atoi(v);
        else if (!strcmp(a, "--template")) cfg.example.reasoning = !strcmp(v, "glmz1");
        else if (!strcmp(a, "--enable_thinking")) cfg.example.disable_thinking = !strcmp(v, "false");
        else if (!strcmp(a, "--prompt_template")) cfg.example.prompt_template = v;
        else if (!strcmp(a, "--cache_dir")) cfg.cache_dir = v;
        else if (!strcmp(a, "--threads")) cfg.num_threads = atoi(v);
        else { fprintf(stderr, "error: unknown option %s\n", a); return 2; }
    }
    if (!strcmp(mode, "pyjson")) return mode_pyjson();
    glm_tokenizer *t;
    glm_err err = {0};
    if (!tok_path || glm_tokenizer_load(&t, tok_path, &err)) { glm_err_print(&err); return 1; }
    int rc = !strcmp(mode, "info") ? mode_info(t) : !strcmp(mode, "pair") ? mode_pair(t) : !strcmp(mode, "chat") ? mode_chat(t)
           : !strcmp(mode, "response") ? mode_response(t) : !strcmp(mode, "examples") ? mode_examples(t, tok_path, &cfg) : 2;
    glm_tokenizer_free(t);
    return rc;
}
