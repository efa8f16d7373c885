/* THUDM's api.py protocol (ChatGLM-6B and ChatGLM2-6B ship it; the guides deploy with it), as a
 * chat completion (serve/api.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "serve/api.h"

/* api.py passes `x if x else default`: a missing, null, zero, false or empty value is the default. */
static int given(const cJSON *v) {
    return v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0) &&
           !(cJSON_IsString(v) && !v->valuestring[0]);
}

char *srv_thudm_request(const char *body, size_t n, cJSON **history, char **prompt, api_err *e) {
    *history = NULL;
    *prompt = NULL;
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, n, &end, 0), *chat = NULL;
    char *out = NULL;
    if (!cJSON_IsObject(o)) {
        srv_bad(e, 400, NULL, "invalid_json", "POST / takes THUDM api.py's JSON object {\"prompt\", \"history\", \"max_length\", "
                                              "\"top_p\", \"temperature\"}");
        goto out;
    }
    const cJSON *p = srv_field(o, "prompt"), *h = srv_field(o, "history");
    if (!cJSON_IsString(p)) { srv_bad(e, 400, "prompt", p ? "invalid_type" : "missing_required_parameter", "prompt must be a string"); goto out; }
    if (srv_present(h) && !cJSON_IsArray(h)) { srv_bad(e, 400, "history", "invalid_type", "history must be a list of [query, response] pairs"); goto out; }
    chat = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages"), *pair, *hl = srv_present(h) ? (cJSON *)h : NULL;
    int i = 0;
    cJSON_ArrayForEach(pair, hl) {
        const cJSON *q = cJSON_GetArrayItem(pair, 0), *r = cJSON_GetArrayItem(pair, 1);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(q) || !cJSON_IsString(r)) {
            srv_bad(e, 400, "history", "invalid_value", "history[%d] must be a [query, response] pair of strings", i);
            goto out;
        }
        cJSON *u = cJSON_CreateObject(), *a = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", q->valuestring);
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", r->valuestring);
        cJSON_AddItemToArray(msgs, u);
        cJSON_AddItemToArray(msgs, a);
        i++;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", p->valuestring);
    cJSON_AddItemToArray(msgs, u);
    const char *keys[] = {"max_length", "top_p", "temperature", "seed"}; /* seed: glmtrain's, as for chat */
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const cJSON *v = srv_field(o, keys[k]);
        if (given(v)) cJSON_AddItemToObject(chat, keys[k], cJSON_Duplicate(v, 1));
    }
    out = cJSON_PrintUnformatted(chat);
    *history = srv_present(h) ? cJSON_Duplicate(h, 1) : cJSON_CreateArray();
    *prompt = glm_strdup(p->valuestring);
out:
    cJSON_Delete(chat);
    cJSON_Delete(o);
    return out;
}

cJSON *srv_thudm_answer(const cJSON *history, const char *prompt, const char *response) {
    cJSON *o = cJSON_CreateObject(), *h = cJSON_Duplicate(history, 1), *pair = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "response", response);
    cJSON_AddItemToArray(pair, cJSON_CreateString(prompt));
    cJSON_AddItemToArray(pair, cJSON_CreateString(response));
    cJSON_AddItemToArray(h, pair);
    cJSON_AddItemToObject(o, "history", h);
    cJSON_AddNumberToObject(o, "status", 200);
    char t[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(t, sizeof t, "%Y-%m-%d %H:%M:%S", &tm);
    cJSON_AddStringToObject(o, "time", t);
    return o;
}
