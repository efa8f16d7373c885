/* Conversation mode (reader.h): sharegpt records kept whole, turn by turn, with roles, for
 * ChatGLM3's layout (examples_glm3.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/glm4_tools.h"
#include "data/pyjson.h"
#include "data/reader.h"

/* ChatGLM3's four roles, and sharegpt's names for the first three. */
static int role_of(const char *s) {
    static const struct { const char *name; glm_role role; } t[] = {
        {"system", GLM_ROLE_SYSTEM}, {"user", GLM_ROLE_USER}, {"human", GLM_ROLE_USER},
        {"assistant", GLM_ROLE_ASSISTANT}, {"gpt", GLM_ROLE_ASSISTANT}, {"chatgpt", GLM_ROLE_ASSISTANT},
        {"bing", GLM_ROLE_ASSISTANT}, {"bard", GLM_ROLE_ASSISTANT}, {"model", GLM_ROLE_ASSISTANT},
        {"observation", GLM_ROLE_OBSERVATION}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(s, t[i].name)) return (int)t[i].role;
    return -1;
}

static void push(glm_record *r, glm_role role, char *content, char *metadata, int tools, int src) {
    r->msgs = glm_realloc(r->msgs, sizeof *r->msgs * (size_t)(r->n_msgs + 1));
    r->msgs[r->n_msgs++] = (glm_msg){role, content, metadata, tools, src};
}

/* The string at key `a` or `b` of m into *dst (NULL: neither key); -1 when not a valid string. */
static int get_text(const cJSON *m, const char *a, const char *b, const char **used, char **dst) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, a);
    *used = a;
    if (!v) { v = cJSON_GetObjectItemCaseSensitive(m, b); *used = b; }
    *dst = NULL;
    if (!v) return 0;
    if (!cJSON_IsString(v) || !glm_utf8_valid(v->valuestring, strlen(v->valuestring))) return -1;
    *dst = glm_strdup(v->valuestring);
    return 0;
}

int glm_schema_conversation(const cJSON *obj, glm_record *r, char *why, size_t n) {
    const char *key = "conversations";
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!c) c = cJSON_GetObjectItemCaseSensitive(obj, key = "messages");
    if (!c) { snprintf(why, n, "field 'conversations' is missing"); return -1; }
    if (!cJSON_IsArray(c)) { snprintf(why, n, "field '%s' is %s, not a list", key, glm_json_type_name(c)); return -1; }
    if (cJSON_GetObjectItemCaseSensitive(obj, "tools")) {
        snprintf(why, n, "a top-level 'tools' beside '%s' (ChatGLM3's finetune_hf.py refuses it too): "
                         "put the tools on the system turn", key);
        return -1;
    }
    r->conv_key = key;
    /* the turns are the record; query and answer stay "" (never NULL) for readers of those fields */
    if (!r->query) r->query = glm_strdup("");
    if (!r->answer) r->answer = glm_strdup("");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(obj, "system"); /* sharegpt's record-level system prompt */
    if (sys && !cJSON_IsNull(sys)) {
        if (!cJSON_IsString(sys) || !glm_utf8_valid(sys->valuestring, strlen(sys->valuestring))) {
            snprintf(why, n, "field 'system' is %s, not a UTF-8 string", glm_json_type_name(sys));
            return -1;
        }
        if (sys->valuestring[0]) push(r, GLM_ROLE_SYSTEM, glm_strdup(sys->valuestring), NULL, 0, -1);
    }
    int i = 0;
    for (const cJSON *m = c->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) { snprintf(why, n, "%s[%d] is %s, not an object", key, i, glm_json_type_name(m)); return -1; }
        const char *rk;
        char *role_s, *text;
        if (get_text(m, "role", "from", &rk, &role_s) || !role_s) {
            snprintf(why, n, "%s[%d] has no string 'role'", key, i);
            return -1;
        }
        int role = role_of(role_s);
        if (role < 0) {
            snprintf(why, n, "%s[%d]: unknown role '%.40s' (ChatGLM3's roles: system, user, assistant, observation)", key, i,
                     role_s);
            free(role_s);
            return -1;
        }
        free(role_s);
        const char *ck;
        if (get_text(m, "content", "value", &ck, &text)) {
            snprintf(why, n, "%s[%d]: '%s' is %s, not a UTF-8 string", key, i, ck,
                     glm_json_type_name(cJSON_GetObjectItemCaseSensitive(m, ck)));
            return -1;
        }
        if (!text) { snprintf(why, n, "%s[%d] has no 'content'", key, i); return -1; }
        int tools = cJSON_GetObjectItemCaseSensitive(m, "tools") != NULL;
        if (tools && role != GLM_ROLE_SYSTEM) {
            snprintf(why, n, "%s[%d]: 'tools' on a turn that is not the system's (build_chat_input reads only a system turn's)",
                     key, i);
            free(text);
            return -1;
        }
        char *meta = NULL; /* GLM-4's template writes it after the role token */
        const cJSON *mv = cJSON_GetObjectItemCaseSensitive(m, "metadata");
        if (mv && !cJSON_IsNull(mv)) {
            if (!cJSON_IsString(mv) || !glm_utf8_valid(mv->valuestring, strlen(mv->valuestring))) {
                snprintf(why, n, "%s[%d]: 'metadata' is %s, not a UTF-8 string", key, i, glm_json_type_name(mv));
                free(text);
                return -1;
            }
            meta = glm_strdup(mv->valuestring);
        }
        push(r, (glm_role)role, text, meta, tools ? i + 1 : 0, i);
    }
    return 0;
}

int glm_conversation_tools(glm_record *r, const char *json, size_t len, int glm4, char *why, size_t n) {
    for (int k = 0; k < r->n_msgs; k++) {
        glm_msg *m = &r->msgs[k];
        if (!m->tools) continue;
        size_t cs, ce, ms, me, ts, te;
        if (glm_json_locate(json, len, r->conv_key, 0, &cs, &ce) ||
            glm_json_locate(json + cs, ce - cs, NULL, m->tools - 1, &ms, &me) ||
            glm_json_locate(json + cs + ms, me - ms, "tools", 0, &ts, &te)) {
            snprintf(why, n, "%s[%d]: its 'tools' could not be found again in the record's text", r->conv_key, m->tools - 1);
            return -1;
        }
        char sub[200];
        char *dump = glm4 ? glm4_tools_text(json + cs + ms + ts, te - ts, GLM4_TOOLS_DROP_NULL_PROPS, sub, sizeof sub)
                          : glm_pyjson_dumps(json + cs + ms + ts, te - ts, 4, sub, sizeof sub);
        if (!dump) { snprintf(why, n, "%s[%d]: 'tools': %s", r->conv_key, m->tools - 1, sub); return -1; }
        if (!glm_utf8_valid(dump, strlen(dump))) { /* its strings are raw bytes of the file: one may not be text */
            free(dump);
            snprintf(why, n, "%s[%d]: 'tools' holds a string that is not valid UTF-8", r->conv_key, m->tools - 1);
            return -1;
        }
        m->tools = 0;
        if (glm4) { /* the tools block, a system turn of its own, before this one */
            r->msgs = glm_realloc(r->msgs, sizeof *r->msgs * (size_t)(r->n_msgs + 1));
            memmove(r->msgs + k + 1, r->msgs + k, sizeof *r->msgs * (size_t)(r->n_msgs - k));
            r->msgs[k] = (glm_msg){GLM_ROLE_SYSTEM, dump, NULL, 0, -1};
            r->n_msgs++;
            k++;
            continue;
        }
        size_t a = strlen(m->content), b = strlen(dump);
        m->content = glm_realloc(m->content, a + b + 2);
        m->content[a] = '\n';
        memcpy(m->content + a + 1, dump, b + 1);
        free(dump);
    }
    return 0;
}
