/* Schemas: which JSON keys of a record become system/query/input/answer/history. See reader.h. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/reader.h"

void glm_record_free(glm_record *r) {
    free(r->system); free(r->query); free(r->input); free(r->answer); free(r->rejected);
    for (int i = 0; i < 2 * r->n_hist; i++) free(r->hist[i]);
    free(r->hist);
    for (int i = 0; i < r->n_msgs; i++) { free(r->msgs[i].content); free(r->msgs[i].metadata); }
    free(r->msgs);
    *r = (glm_record){0};
}

/* The length of the valid UTF-8 sequence at s[i] (of n bytes), or 0 (no overlongs, surrogates
 * or code points past U+10FFFF). */
static int utf8_seq(const unsigned char *s, size_t i, size_t n) {
    unsigned c = s[i];
    if (c < 0x80) return 1;
    int k; unsigned cp, min;
    if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
    else return 0;
    for (int j = 1; j <= k; j++) {
        if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k + 1;
}

int glm_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        int k = utf8_seq(s, i, n);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

void glm_utf8_scrub(char *str) {
    unsigned char *s = (unsigned char *)str;
    size_t n = strlen(str);
    for (size_t i = 0; i < n;) {
        int k = utf8_seq(s, i, n);
        if (k) i += (size_t)k;
        else s[i++] = '?';
    }
}

const char *glm_json_type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "a list";
    return "an object";
}

/* A string field into *dst. required: a missing key is an error (null reads as "", as
 * datasets gives ptuning a None it then skips); optional: missing or null leaves NULL. */
static int get_str(const cJSON *obj, const char *key, int required, char **dst, char *why, size_t n) {
    const cJSON *v = key ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v) {
        if (required) { snprintf(why, n, "field '%s' is missing", key); return -1; }
        return 0;
    }
    if (cJSON_IsNull(v)) { if (required) *dst = glm_strdup(""); return 0; }
    if (!cJSON_IsString(v)) {
        snprintf(why, n, "field '%s' is %s, not a string", key, glm_json_type_name(v));
        return -1;
    }
    if (!glm_utf8_valid(v->valuestring, strlen(v->valuestring))) {
        snprintf(why, n, "field '%s' is not valid UTF-8", key);
        return -1;
    }
    *dst = glm_strdup(v->valuestring);
    return 0;
}

static void hist_push(glm_record *r, char *q, char *a) {
    r->hist = glm_realloc(r->hist, sizeof(char *) * 2 * (r->n_hist + 1));
    r->hist[2 * r->n_hist] = q;
    r->hist[2 * r->n_hist + 1] = a;
    r->n_hist++;
}

/* history: [[q, a], ...] as ptuning/main.py iterates it. */
static int get_history(const cJSON *obj, const glm_keys *k, glm_record *r, char *why, size_t n) {
    const cJSON *h = k->history ? cJSON_GetObjectItemCaseSensitive(obj, k->history) : NULL;
    r->has_history = h != NULL || (k->history && k->history_always);
    if (!h || cJSON_IsNull(h)) return 0;
    if (!cJSON_IsArray(h)) {
        snprintf(why, n, "field '%s' is %s, not a list of [query, response] pairs", k->history, glm_json_type_name(h));
        return -1;
    }
    int i = 0;
    for (const cJSON *p = h->child; p; p = p->next, i++) {
        if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2 || !cJSON_IsString(p->child) ||
            !cJSON_IsString(p->child->next)) {
            snprintf(why, n, "%s[%d] is not a [query, response] pair of strings", k->history, i);
            return -1;
        }
        const char *q = p->child->valuestring, *a = p->child->next->valuestring;
        if (!glm_utf8_valid(q, strlen(q)) || !glm_utf8_valid(a, strlen(a))) {
            snprintf(why, n, "%s[%d] is not valid UTF-8", k->history, i);
            return -1;
        }
        hist_push(r, glm_strdup(q), glm_strdup(a));
    }
    return 0;
}

int glm_schema_history(const cJSON *obj, const char *key, glm_record *rec, char *why, size_t why_len) {
    glm_keys k = {.history = key};
    return get_history(obj, &k, rec, why, why_len);
}

static int extract_columns(const glm_keys *k, const cJSON *obj, glm_record *r, char *why, size_t n) {
    if (get_str(obj, k->prompt, 1, &r->query, why, n) || get_str(obj, k->response, 1, &r->answer, why, n) ||
        get_str(obj, k->input, 0, &r->input, why, n) || get_str(obj, k->system, 0, &r->system, why, n))
        return -1;
    return get_history(obj, k, r, why, n);
}

enum { ROLE_BAD, ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM };
static int role_of(const char *s) {
    static const char *user[] = {"human", "user"}, *asst[] = {"gpt", "assistant", "chatgpt", "bing", "bard", "model"};
    for (size_t i = 0; i < sizeof user / sizeof *user; i++) if (!strcmp(s, user[i])) return ROLE_USER;
    for (size_t i = 0; i < sizeof asst / sizeof *asst; i++) if (!strcmp(s, asst[i])) return ROLE_ASSISTANT;
    return strcmp(s, "system") ? ROLE_BAD : ROLE_SYSTEM;
}

/* ShareGPT / OpenAI messages: optional leading system turn, then user/assistant alternating,
 * ending with an assistant turn. Earlier pairs become the history. The chat convention (no round
 * wrapper for a single turn, as model.chat) applies: has_history only when there are earlier turns. */
static int extract_sharegpt(const cJSON *obj, glm_record *r, char *why, size_t n) {
    const char *key = "conversations";
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!c) c = cJSON_GetObjectItemCaseSensitive(obj, key = "messages");
    if (!c) { snprintf(why, n, "field 'conversations' is missing"); return -1; }
    if (!cJSON_IsArray(c)) { snprintf(why, n, "field '%s' is %s, not a list", key, glm_json_type_name(c)); return -1; }
    if (get_str(obj, "system", 0, &r->system, why, n)) return -1;
    int i = 0, expect = ROLE_USER;
    char *pending = NULL; /* user text waiting for its answer */
    for (const cJSON *m = c->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) { snprintf(why, n, "%s[%d] is %s, not an object", key, i, glm_json_type_name(m)); goto bad; }
        const cJSON *from = cJSON_GetObjectItemCaseSensitive(m, "from");
        if (!from) from = cJSON_GetObjectItemCaseSensitive(m, "role");
        const char *vkey = cJSON_GetObjectItemCaseSensitive(m, "value") ? "value" : "content";
        if (!cJSON_GetObjectItemCaseSensitive(m, vkey)) { snprintf(why, n, "%s[%d] has no 'value'/'content'", key, i); goto bad; }
        if (!cJSON_IsString(from)) { snprintf(why, n, "%s[%d] has no string 'from'/'role'", key, i); goto bad; }
        int role = role_of(from->valuestring);
        char *text = NULL;
        char sub[128];
        if (get_str(m, vkey, 1, &text, sub, sizeof sub)) {
            snprintf(why, n, "%s[%d]: %s", key, i, sub);
            goto bad;
        }
        if (role == ROLE_SYSTEM && i == 0) {
            if (!r->system) r->system = text; else free(text);
            continue;
        }
        if (role != expect) {
            snprintf(why, n, role == ROLE_BAD ? "%s[%d]: unknown role '%s'"
                                              : "%s[%d]: role '%s' out of turn (turns must alternate user, assistant)",
                     key, i, from->valuestring);
            free(text);
            goto bad;
        }
        if (role == ROLE_USER) { pending = text; expect = ROLE_ASSISTANT; continue; }
        if (r->query) hist_push(r, r->query, r->answer);
        r->query = pending; r->answer = text; pending = NULL;
        expect = ROLE_USER;
    }
    if (pending || !r->query) {
        snprintf(why, n, pending ? "%s does not end with an assistant turn" : "%s has no user/assistant pair", key);
        goto bad;
    }
    r->has_history = r->n_hist > 0;
    return 0;
bad:
    free(pending);
    return -1;
}

/* A preference pair's answer: a string, or an assistant message {"from"/"role", "value"/"content"}
 * (LLaMA-Factory's sharegpt ranking records). */
static int pair_answer(const cJSON *obj, const char *key, char **out, char *why, size_t n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        snprintf(why, n, "field '%s' is missing (a preference pair needs a chosen and a rejected answer)", key);
        return -1;
    }
    if (!cJSON_IsObject(v)) return get_str(obj, key, 1, out, why, n);
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(v, "from");
    if (!from) from = cJSON_GetObjectItemCaseSensitive(v, "role");
    if (from && (!cJSON_IsString(from) || role_of(from->valuestring) != ROLE_ASSISTANT)) {
        snprintf(why, n, "field '%s' is a message whose role is not the assistant's", key);
        return -1;
    }
    char sub[160];
    if (get_str(v, cJSON_GetObjectItemCaseSensitive(v, "value") ? "value" : "content", 1, out, sub, sizeof sub)) {
        snprintf(why, n, "field '%s': %s", key, sub);
        return -1;
    }
    return 0;
}

static int extract_one(glm_schema schema, const glm_keys *keys, const cJSON *obj, glm_record *rec, char *why,
                       size_t why_len);

/* A preference pair: the record read with the chosen answer as its answer (sharegpt: as its
 * conversation's last turn), the rejected one beside it. */
static int extract_pair(glm_schema schema, const glm_keys *keys, const cJSON *obj, glm_record *rec, char *why,
                        size_t n) {
    char *chosen = NULL, *rejected = NULL;
    glm_keys k = *keys;
    k.rejected = NULL;
    int rc = -1;
    if (pair_answer(obj, keys->response, &chosen, why, n) || pair_answer(obj, keys->rejected, &rejected, why, n)) goto out;
    if (schema == GLM_SCHEMA_SHAREGPT) {
        cJSON *o = cJSON_Duplicate(obj, 1);
        cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "conversations");
        if (!c) c = cJSON_GetObjectItemCaseSensitive(o, "messages");
        if (cJSON_IsArray(c)) { /* the chosen answer as the last turn, in the list's own keys */
            int openai = c->child && cJSON_GetObjectItemCaseSensitive(c->child, "role");
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, openai ? "role" : "from", openai ? "assistant" : "gpt");
            cJSON_AddStringToObject(m, openai ? "content" : "value", chosen);
            cJSON_AddItemToArray(c, m);
        }
        rc = extract_one(schema, &k, o, rec, why, n);
        cJSON_Delete(o);
    } else {
        rc = extract_one(schema, &k, obj, rec, why, n);
    }
    if (rc == 0) { rec->rejected = rejected; rejected = NULL; }
out:
    free(chosen);
    free(rejected);
    return rc;
}

/* A text of --stage pt: the query; the answer "" as for every record (never NULL). */
static int extract_text(const glm_keys *keys, const cJSON *obj, glm_record *rec, char *why, size_t n) {
    if (get_str(obj, keys->prompt, 1, &rec->query, why, n)) return -1;
    rec->answer = glm_strdup("");
    return 0;
}

int glm_schema_extract(glm_schema schema, const glm_keys *keys, const cJSON *obj, glm_record *rec,
                       char *why, size_t why_len) {
    *rec = (glm_record){0};
    if (!cJSON_IsObject(obj)) {
        snprintf(why, why_len, "record is %s, not an object", glm_json_type_name(obj));
        return -1;
    }
    int rc = keys->texts      ? extract_text(keys, obj, rec, why, why_len)
             : keys->rejected ? extract_pair(schema, keys, obj, rec, why, why_len)
                              : extract_one(schema, keys, obj, rec, why, why_len);
    rec->kto_tag = -1;
    if (rc == 0 && keys->kto_tag) { /* LLaMA-Factory's KTO records: a boolean says whether the answer is wanted */
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, keys->kto_tag);
        if (!cJSON_IsBool(t)) {
            snprintf(why, why_len, "field '%s' is %s, not true or false (a KTO record says whether its answer is desirable)",
                     keys->kto_tag, t ? glm_json_type_name(t) : "missing");
            rc = -1;
        } else {
            rec->kto_tag = cJSON_IsTrue(t);
            if (rec->msgs && (rec->n_msgs == 0 || rec->msgs[rec->n_msgs - 1].role != GLM_ROLE_ASSISTANT)) {
                snprintf(why, why_len, "a KTO conversation must end with the assistant's answer");
                rc = -1;
            }
        }
    }
    if (rc) glm_record_free(rec);
    return rc;
}

static int extract_one(glm_schema schema, const glm_keys *keys, const cJSON *obj, glm_record *rec, char *why,
                       size_t why_len) {
    int rc;
    if (schema == GLM_SCHEMA_SHAREGPT)
        rc = keys->conversations ? glm_schema_conversation(obj, rec, why, why_len) : extract_sharegpt(obj, rec, why, why_len);
    else
        rc = extract_columns(keys, obj, rec, why, why_len);
    return rc;
}

static int has(const cJSON *o, const char *k) { return k && cJSON_GetObjectItemCaseSensitive(o, k) != NULL; }

int glm_schema_detect(const glm_read_cfg *cfg, const cJSON *obj, glm_schema *schema, glm_keys *k,
                      char *why, size_t why_len) {
    const glm_columns *c = &cfg->columns;
    glm_schema s = cfg->schema;
    int explicit_cols = c->prompt || c->response;
    if (cfg->texts) { /* LLaMA-Factory's pre-training records: {"text": ...} (columns.prompt another key) */
        *k = (glm_keys){.prompt = c->prompt ? c->prompt : "text", .texts = 1};
        *schema = GLM_SCHEMA_COLUMNS;
        return 0;
    }
    if (s == GLM_SCHEMA_AUTO) {
        if (explicit_cols) s = GLM_SCHEMA_COLUMNS;
        else if (has(obj, "conversations") || has(obj, "messages")) s = GLM_SCHEMA_SHAREGPT;
        else if (has(obj, "instruction")) s = GLM_SCHEMA_ALPACA;
        else if ((has(obj, "prompt") && has(obj, "response")) || (has(obj, "content") && has(obj, "summary")))
            s = GLM_SCHEMA_COLUMNS;
        else {
            char keys[160] = "";
            size_t used = 0;
            if (cJSON_IsObject(obj))
                for (const cJSON *it = obj->child; it && used + 4 < sizeof keys; it = it->next)
                    used += snprintf(keys + used, sizeof keys - used, "%s'%s'", used ? ", " : "", it->string);
            snprintf(why, why_len, "cannot tell the data format from the first record (keys: %s)",
                     cJSON_IsObject(obj) ? keys : "it is not an object");
            return -1;
        }
    }
    *k = (glm_keys){0};
    if (s == GLM_SCHEMA_ALPACA) {
        *k = (glm_keys){.prompt = c->prompt ? c->prompt : "instruction", .response = c->response ? c->response : "output",
                        .input = c->input ? c->input : "input", .system = c->system ? c->system : "system",
                        .history = c->history ? c->history : "history", .history_always = c->history != NULL};
    } else if (s == GLM_SCHEMA_COLUMNS) {
        int adgen = !explicit_cols && !has(obj, "prompt") && has(obj, "content") && has(obj, "summary");
        k->prompt = c->prompt ? c->prompt : adgen ? "content" : "prompt";
        k->response = c->response ? c->response : adgen ? "summary" : "response";
        k->input = c->input;
        k->system = c->system ? c->system : "system";
        k->history = c->history ? c->history : "history";
        k->history_always = c->history != NULL;
    }
    k->conversations = cfg->conversations;
    if (cfg->pairs) { /* LLaMA-Factory's ranking columns: the chosen answer in the response's place */
        if (!c->response) k->response = "chosen";
        k->rejected = "rejected";
    }
    if (cfg->kto) /* LLaMA-Factory's kto_tag column: "kto_tag", or "label" as its kto_en_demo */
        k->kto_tag = c->kto_tag ? c->kto_tag : has(obj, "kto_tag") || !has(obj, "label") ? "kto_tag" : "label";
    *schema = s;
    return 0;
}

int glm_schema_parse(const char *s, glm_schema *out) {
    static const struct { const char *name; glm_schema v; } t[] = {
        {"auto", GLM_SCHEMA_AUTO}, {"alpaca", GLM_SCHEMA_ALPACA}, {"columns", GLM_SCHEMA_COLUMNS},
        {"chatglm", GLM_SCHEMA_COLUMNS}, {"sharegpt", GLM_SCHEMA_SHAREGPT}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(s, t[i].name)) { *out = t[i].v; return 0; }
    return -1;
}

int glm_container_parse(const char *s, glm_container *out) {
    if (!strcmp(s, "auto")) *out = GLM_CONTAINER_AUTO;
    else if (!strcmp(s, "json")) *out = GLM_CONTAINER_ARRAY;
    else if (!strcmp(s, "jsonl")) *out = GLM_CONTAINER_LINES;
    else if (!strcmp(s, "csv")) *out = GLM_CONTAINER_CSV;
    else if (!strcmp(s, "tsv")) *out = GLM_CONTAINER_TSV;
    else return -1;
    return 0;
}

const char *glm_schema_name(glm_schema s) {
    switch (s) {
    case GLM_SCHEMA_ALPACA: return "alpaca";
    case GLM_SCHEMA_COLUMNS: return "columns";
    case GLM_SCHEMA_SHAREGPT: return "sharegpt";
    default: return "auto";
    }
}
