/* LLaMA-Factory's dataset_info.json (dataset_info.h). */
#include "data/dataset_info.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/fileutil.h"
#include "core/json_text.h"

/* The string at key k of o, def when absent or null; NULL (with why) when it is not a string. */
static const char *str_or(const cJSON *o, const char *k, const char *def, int *bad) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsString(v)) { *bad = 1; return NULL; }
    return v->valuestring;
}

/* One entry into src (in place: its column names are kept in src->col, the parsed file is freed). */
static int entry(const char *dir, const char *name, const cJSON *e, glm_data_source *src, const char *file, glm_err *err) {
    int bad = 0;
    memset(src, 0, sizeof *src);
    if (strlen(name) >= sizeof src->name)
        return glm_fail(err, "%s: the dataset name \"%.40s...\" is longer than %zu bytes", file, name, sizeof src->name - 1),
               glm_hint(err, "give the entry a shorter name");
    snprintf(src->name, sizeof src->name, "%s", name);
    if (!cJSON_IsObject(e)) return glm_fail(err, "%s: entry \"%s\" is not an object", file, name);
    const char *fn = str_or(e, "file_name", NULL, &bad);
    if (bad) return glm_fail(err, "%s: \"%s\".file_name is not a string", file, name);
    if (!fn) {
        const char *hub = cJSON_GetObjectItemCaseSensitive(e, "hf_hub_url") ? "hf_hub_url"
                        : cJSON_GetObjectItemCaseSensitive(e, "ms_hub_url") ? "ms_hub_url"
                        : cJSON_GetObjectItemCaseSensitive(e, "script_url") ? "script_url" : NULL;
        glm_fail(err, "%s: dataset \"%s\" has no file_name%s%s%s", file, name, hub ? " (it is read from " : "", hub ? hub : "",
                 hub ? ", which glmtrain does not download)" : "");
        return glm_hint(err, "download it, save it as a JSON / JSONL file and give that file's name in file_name (or pass --train_file)");
    }
    /* ranking (preference) data: every record a chosen and a rejected answer (data/reader.h pairs) */
    src->read.pairs = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "ranking"));
    if (strlen(dir) + strlen(fn) + 2 > sizeof src->path)
        return glm_fail(err, "%s: dataset \"%s\": file_name is longer than a path can be here (%zu bytes)", file, name, sizeof src->path - 1);
    if (fn[0] == '/') snprintf(src->path, sizeof src->path, "%s", fn);
    else glm_path_join(src->path, sizeof src->path, dir, fn);
    struct stat st;
    if (stat(src->path, &st) != 0) {
        glm_fail(err, "%s: dataset \"%s\": %s does not exist", file, name, src->path);
        return glm_hint(err, "file_name is relative to --dataset_dir");
    }
    if (S_ISDIR(st.st_mode))
        return glm_fail(err, "%s: dataset \"%s\": %s is a folder; give one JSON / JSONL file as file_name", file, name, src->path);
    const char *fmt = str_or(e, "formatting", "alpaca", &bad);
    if (bad || (strcmp(fmt, "alpaca") && strcmp(fmt, "sharegpt")))
        return glm_fail(err, "%s: dataset \"%s\": formatting %s%s%s (alpaca or sharegpt)", file, name, bad ? "is not a string" : "\"",
                        bad ? "" : fmt, bad ? "" : "\" is not known");
    int sharegpt = !strcmp(fmt, "sharegpt");
    const cJSON *cols = cJSON_GetObjectItemCaseSensitive(e, "columns"), *c;
    if (cols && !cJSON_IsObject(cols)) return glm_fail(err, "%s: \"%s\".columns is not an object", file, name);
    /* LLaMA-Factory's KTO data: columns.kto_tag names the column of true/false tags (data/reader.h kto) */
    const cJSON *kt = cJSON_GetObjectItemCaseSensitive(cols, "kto_tag");
    if (kt && !cJSON_IsNull(kt)) {
        if (!cJSON_IsString(kt) || strlen(kt->valuestring) >= sizeof src->col[5])
            return glm_fail(err, "%s: \"%s\".columns.kto_tag is not a column name", file, name);
        snprintf(src->col[5], sizeof src->col[5], "%s", kt->valuestring);
        src->read.kto = 1;
        src->read.columns.kto_tag = src->col[5];
    }
    cJSON_ArrayForEach(c, cols) {
        static const char *const alpaca_keys[] = {"prompt", "query", "response", "history", "system"};
        static const char *const sharegpt_keys[] = {"messages", "system"};
        if (!strcmp(c->string, "kto_tag")) continue; /* read above */
        int known = 0;
        for (int k = 0; k < (sharegpt ? 2 : 5); k++) known |= !strcmp(c->string, sharegpt ? sharegpt_keys[k] : alpaca_keys[k]);
        if (src->read.pairs && (!strcmp(c->string, "chosen") || !strcmp(c->string, "rejected"))) {
            if (!cJSON_IsString(c) || strcmp(c->valuestring, c->string)) /* the reader takes these keys by name */
                return glm_fail(err, "%s: dataset \"%s\": columns.%s names \"%s\": glmtrain reads the column \"%s\"", file, name,
                                c->string, cJSON_IsString(c) ? c->valuestring : "?", c->string),
                       glm_hint(err, "rename the column in the data file to \"%s\"", c->string);
            continue;
        }
        if (!known && !cJSON_IsNull(c))
            return glm_fail(err, "%s: dataset \"%s\": the column \"%s\" is not supported (%s formatting here reads %s)", file, name,
                            c->string, fmt, sharegpt ? "messages and system" : "prompt, query, response, history and system");
        if (!cJSON_IsNull(c) && !cJSON_IsString(c)) return glm_fail(err, "%s: \"%s\".columns.%s is not a string", file, name, c->string);
        if (cJSON_IsString(c) && strlen(c->valuestring) >= sizeof src->col[0])
            return glm_fail(err, "%s: dataset \"%s\": columns.%s names a column of more than %zu bytes", file, name, c->string,
                            sizeof src->col[0] - 1),
                   glm_hint(err, "rename that column in the data file and here");
    }
    if (sharegpt) {
        src->read.schema = GLM_SCHEMA_SHAREGPT;
        const char *msgs = str_or(cols, "messages", "conversations", &bad), *sys = str_or(cols, "system", NULL, &bad);
        if (strcmp(msgs, "conversations") && strcmp(msgs, "messages"))
            return glm_fail(err, "%s: dataset \"%s\": messages column \"%s\": glmtrain reads \"conversations\" or \"messages\"", file, name, msgs);
        if (sys && strcmp(sys, "system"))
            return glm_fail(err, "%s: dataset \"%s\": system column \"%s\": glmtrain reads \"system\"", file, name, sys);
        const cJSON *tags = cJSON_GetObjectItemCaseSensitive(e, "tags"), *t;
        if (tags && !cJSON_IsObject(tags)) return glm_fail(err, "%s: \"%s\".tags is not an object", file, name);
        static const struct { const char *tag, *ok[2]; } known[] = {
            {"role_tag", {"from", "role"}}, {"content_tag", {"value", "content"}}, {"user_tag", {"human", "user"}},
            {"assistant_tag", {"gpt", "assistant"}}, {"observation_tag", {"observation", "observation"}},
            {"function_tag", {"function_call", "function_call"}}, {"system_tag", {"system", "system"}}};
        cJSON_ArrayForEach(t, tags) {
            size_t k = 0;
            while (k < sizeof known / sizeof *known && strcmp(known[k].tag, t->string)) k++;
            if (k == sizeof known / sizeof *known)
                return glm_fail(err, "%s: dataset \"%s\": tags.%s is not a tag glmtrain knows", file, name, t->string);
            if (!cJSON_IsString(t) || (strcmp(t->valuestring, known[k].ok[0]) && strcmp(t->valuestring, known[k].ok[1])))
                return glm_fail(err, "%s: dataset \"%s\": tags.%s \"%s\": glmtrain reads \"%s\"%s%s%s", file, name, t->string,
                                cJSON_IsString(t) ? t->valuestring : "?", known[k].ok[0], strcmp(known[k].ok[0], known[k].ok[1]) ? " or \"" : "",
                                strcmp(known[k].ok[0], known[k].ok[1]) ? known[k].ok[1] : "", strcmp(known[k].ok[0], known[k].ok[1]) ? "\"" : "");
        }
        return 0;
    }
    const char *v[5] = {str_or(cols, "prompt", "instruction", &bad), str_or(cols, "query", "input", &bad),
                        str_or(cols, "response", "output", &bad), str_or(cols, "history", NULL, &bad),
                        str_or(cols, "system", NULL, &bad)};
    const char *def[5] = {"instruction", "input", "output", "history", "system"};
    int plain = 1;
    for (int k = 0; k < 5; k++) {
        if (v[k]) snprintf(src->col[k], sizeof src->col[k], "%s", v[k]);
        plain &= !v[k] || !strcmp(v[k], def[k]);
    }
    if (plain) { src->read.schema = GLM_SCHEMA_ALPACA; return 0; }
    src->read.schema = GLM_SCHEMA_COLUMNS;
    src->read.columns = (glm_columns){src->col[0], src->col[2], v[3] ? src->col[3] : NULL, src->col[1], v[4] ? src->col[4] : NULL,
                                      src->read.kto ? src->col[5] : NULL};
    return 0;
}

int glm_dataset_info_sources(const char *dir, const char *names, glm_data_source **out, int *n, glm_err *err) {
    *out = NULL;
    *n = 0;
    char file[4096];
    glm_path_join(file, sizeof file, dir, "dataset_info.json");
    size_t len;
    char *text = glm_read_file(file, &len, err);
    if (!text) return glm_hint(err, "--dataset names entries of DIR/dataset_info.json (LLaMA-Factory's layout); set --dataset_dir");
    cJSON *info = glm_json_parse_doc(text, len, file, "LLaMA-Factory's dataset_info.json", err);
    free(text);
    if (!info) return -1;
    if (!cJSON_IsObject(info)) { cJSON_Delete(info); return glm_fail(err, "%s: not a JSON object", file); }
    int cap = 1;
    for (const char *p = names; *p; p++) cap += *p == ',';
    glm_data_source *src = glm_calloc((size_t)cap, sizeof *src);
    int rc = 0, k = 0;
    char *list = glm_strdup(names), *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        for (char *e = tok + strlen(tok); e > tok && e[-1] == ' ';) *--e = 0;
        if (!*tok) continue;
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(info, tok);
        if (!e) {
            rc = glm_fail(err, "%s has no dataset \"%s\"", file, tok);
            glm_hint(err, "its entries name the datasets; add one with \"file_name\" (and \"formatting\", \"columns\")");
            break;
        }
        rc = entry(dir, tok, e, &src[k++], file, err);
    }
    free(list);
    cJSON_Delete(info);
    if (rc == 0 && k == 0) rc = glm_fail(err, "--dataset \"%s\" names no dataset", names);
    if (rc) { free(src); return -1; }
    *out = src;
    *n = k;
    return 0;
}

int glm_lf_template_check(const char *name, glm_layout layout, glm_err *err) {
    static const struct { const char *name; glm_layout layout; } t[] = {
        {"chatglm", GLM_LAYOUT_GLM}, {"chatglm2", GLM_LAYOUT_GLM2}, {"chatglm3", GLM_LAYOUT_GLM3}, {"glm4", GLM_LAYOUT_GLM4},
        {"glmz1", GLM_LAYOUT_GLM4}}; /* GLM-Z1: GLM-4's turns with thoughts (examples.h reasoning) */
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        if (strcmp(name, t[i].name)) continue;
        if (t[i].layout == layout) return 0;
        glm_fail(err, "--template %s, but the tokenizer is %s's", name, glm_layout_name(layout));
        return glm_hint(err, "glmtrain builds the examples the tokenizer's model was trained with: drop --template or use that model's tokenizer");
    }
    glm_fail(err, "--template %s: glmtrain builds ChatGLM's own formats (chatglm, chatglm2, chatglm3, glm4, glmz1), picked by the tokenizer", name);
    return glm_hint(err, "drop --template: the tokenizer (%s) decides", glm_layout_name(layout));
}
