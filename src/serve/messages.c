/* A chat request's messages -> the model's prompt (serve/api.h): the template generate and
 * chat use (infer/chat.h) for a plain conversation; with tools, tool calls or tool results, the
 * turns THUDM's servers build: ChatGLM3's openai_api_demo (utils.py process_chatglm_messages),
 * GLM-4's basic_demo/openai_api_server.py (process_messages over the chat template). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/chat.h"
#include "data/glm4_tools.h"
#include "data/thought.h"
#include "data/pyjson.h"
#include "infer/tools.h"
#include "serve/api.h"

/* A message's content: a string, or OpenAI's list of {"type": "text", "text": ...} parts. */
static char *content_text(const cJSON *c, const char *where, api_err *e) {
    if (cJSON_IsString(c)) return glm_strdup(c->valuestring);
    if (cJSON_IsArray(c)) {
        size_t n = 1;
        const cJSON *p;
        cJSON_ArrayForEach(p, c) {
            const cJSON *t = srv_field(p, "text"), *ty = srv_field(p, "type");
            if (!cJSON_IsObject(p) || !cJSON_IsString(t) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "text")))) {
                srv_bad(e, 400, where, "invalid_type", "%s: only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", where);
                return NULL;
            }
            n += strlen(t->valuestring);
        }
        char *s = glm_malloc(n), *w = s; /* appended at w: many parts stay linear */
        cJSON_ArrayForEach(p, c) {
            size_t k = strlen(srv_field(p, "text")->valuestring);
            memcpy(w, srv_field(p, "text")->valuestring, k);
            w += k;
        }
        *w = 0;
        return s;
    }
    srv_bad(e, 400, where, "invalid_type", "%s must be a string", where);
    return NULL;
}

void srv_tools_free(srv_tools *t) {
    for (int i = 0; i < t->n_names; i++) free(t->names[i]);
    free(t->names);
    free(t->forced);
    *t = (srv_tools){0};
}

int srv_tools_may_call(const srv_tools *t, const char *text, size_t n) {
    for (int i = 0; t->on && i < t->n_names; i++) {
        size_t k = strlen(t->names[i]);
        if (n <= k ? !memcmp(text, t->names[i], n) : !memcmp(text, t->names[i], k) && text[k] == '\n') return 1;
    }
    return 0;
}

/* A plain conversation (system, then user and assistant in turn, ending with the user's) ->
 * glm_chat_inputs_sys, the template generate and chat use. */
static int plain_prompt(srv_server *S, const cJSON *msgs, glm_ids *ids, api_err *e) {
    int n = cJSON_GetArraySize(msgs), n_hist = 0, rc = -1;
    char **hist = glm_calloc((size_t)n + 1, sizeof(char *));
    char *system = NULL, *query = NULL, *pend_user = NULL;
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        char w[48];
        snprintf(w, sizeof w, "messages[%d]", i);
        const char *r = srv_field(m, "role")->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")) {
            srv_bad(e, 400, "messages", "invalid_value", "%s.role \"%.40s\": expected system, user or assistant%s", w, r,
                    glm_tokenizer_roles(S->tok).user < 0 ? " (this model has no tool turns; ChatGLM3 has)" : "");
            goto out;
        }
        char wc[64];
        snprintf(wc, sizeof wc, "%s.content", w);
        char *text = content_text(srv_field(m, "content"), wc, e);
        if (!text) { e->param = "messages"; goto out; }
        if (!strcmp(r, "system")) {
            if (n_hist || pend_user) { free(text); srv_bad(e, 400, "messages", "invalid_value", "%s: a system message must come before the conversation", w); goto out; }
            if (system) { /* several system messages: one, joined */
                char *j = glm_malloc(strlen(system) + strlen(text) + 2);
                sprintf(j, "%s\n%s", system, text);
                free(system);
                free(text);
                system = j;
            } else {
                system = text;
            }
        } else if (!strcmp(r, "user")) {
            if (pend_user) { free(text); srv_bad(e, 400, "messages", "invalid_value", "%s: two user messages in a row (user and assistant turns alternate)", w); goto out; }
            pend_user = text;
        } else {
            if (!pend_user) { free(text); srv_bad(e, 400, "messages", "invalid_value", "%s: an assistant message must answer a user message", w); goto out; }
            if (S->o.reasoning) { char *t = glm_thought_remove(text); free(text); text = t; } /* glmz1's history */
            hist[2 * n_hist] = pend_user;
            hist[2 * n_hist + 1] = text;
            n_hist++;
            pend_user = NULL;
        }
    }
    if (!pend_user) { srv_bad(e, 400, "messages", "invalid_value", "the last message must be the user's"); goto out; }
    query = pend_user;
    pend_user = NULL;
    glm_err err = {0};
    pthread_mutex_lock(S->tok_mu);
    int k = glm_chat_inputs_sys(S->tok, S->cfg, system, query, (const char *const *)hist, n_hist, INT_MAX, ids, NULL, NULL, &err);
    pthread_mutex_unlock(S->tok_mu);
    if (k) { srv_bad(e, 400, "messages", "invalid_value", "%s", err.msg); goto out; }
    rc = 0;
out:
    for (int i = 0; i < 2 * n_hist; i++) free(hist[i]);
    free(hist);
    free(system);
    free(query);
    free(pend_user);
    return rc;
}

/* The turns being built: each turn's strings are owned (metadata may be NULL). */
typedef struct turns {
    glm_chat_turn *t;
    int n, cap;
} turns;
static void add(turns *ts, glm_turn_role role, char *metadata, char *content) {
    if (ts->n == ts->cap) { ts->cap = ts->cap ? 2 * ts->cap : 8; ts->t = glm_realloc(ts->t, sizeof *ts->t * (size_t)ts->cap); }
    ts->t[ts->n++] = (glm_chat_turn){role, metadata, content};
}
static void turns_free(turns *ts) {
    for (int i = 0; i < ts->n; i++) { free((char *)ts->t[i].metadata); free((char *)ts->t[i].content); }
    free(ts->t);
}

/* One call {name, arguments} (a tool_calls entry's function, or function_call) as an assistant
 * turn: metadata the name, content the call's text as the model writes it (ChatGLM3:
 * tool_call(...); GLM-4: the arguments' JSON). */
static int call_turn(turns *ts, const cJSON *fn, int glm4, const char *where, api_err *e) {
    const cJSON *name = srv_field(fn, "name"), *args = srv_field(fn, "arguments");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strchr(name->valuestring, '\n'))
        return srv_bad(e, 400, "messages", "invalid_value", "%s: a tool call needs its function's name", where);
    char why[160];
    const char *a = cJSON_IsString(args) ? args->valuestring : "{}";
    char *content = glm4 ? glm4_tool_call_write(a, why, sizeof why) : glm_tool_call_write(a, why, sizeof why);
    if (!content) return srv_bad(e, 400, "messages", "invalid_value", "%s: the call's arguments: %s", where, why);
    add(ts, GLM_TURN_ASSISTANT, glm_strdup(name->valuestring), content);
    return 0;
}

/* An assistant message with tool_calls or function_call: its calls' turns. A function_call
 * message whose content is the model's own text (what ChatGLM3's demo sends back) is split as
 * the demo splits it: each "<|assistant|>" part a turn, its first line the metadata. */
static int assistant_calls(turns *ts, const cJSON *m, const char *text, int glm4, const char *where, api_err *e) {
    const cJSON *tc = srv_field(m, "tool_calls"), *fc = srv_field(m, "function_call"), *it;
    if (srv_present(tc)) {
        if (!cJSON_IsArray(tc)) return srv_bad(e, 400, "messages", "invalid_type", "%s.tool_calls must be an array", where);
        cJSON_ArrayForEach(it, tc) if (call_turn(ts, srv_field(it, "function"), glm4, where, e)) return -1;
        return 0;
    }
    if (text && strchr(text, '\n')) {
        for (const char *p = text;;) {
            const char *a = strstr(p, "<|assistant|>"), *end = a ? a : p + strlen(p), *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) return srv_bad(e, 400, "messages", "invalid_value", "%s: a tool call's text needs its name on the first line", where);
            const char *c0 = nl + 1, *c1 = end;
            while (c0 < c1 && strchr(" \t\r\n", *c0)) c0++; /* sub_content.strip() */
            while (c1 > c0 && strchr(" \t\r\n", c1[-1])) c1--;
            add(ts, GLM_TURN_ASSISTANT, glm_strndup(p, (size_t)(nl - p)), glm_strndup(c0, (size_t)(c1 - c0)));
            if (!a) return 0;
            p = a + strlen("<|assistant|>");
        }
    }
    return call_turn(ts, fc, glm4, where, e);
}

/* tool_choice (for functions, function_call): "auto", "none", "required" (with one tool), or the
 * tool to call by name ({"type": "function", "function": {"name"}}; for functions {"name"}):
 * t->forced becomes "NAME\n", the call's first line. *none set for "none". */
static int read_choice(const cJSON *body, srv_tools *t, int *none, api_err *e) {
    const char *key = t->legacy && srv_present(srv_field(body, "function_call")) ? "function_call" : "tool_choice";
    const cJSON *tc = srv_field(body, key), *name = NULL;
    *none = 0;
    if (!srv_present(tc)) return 0;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "auto")) return 0;
        if (!strcmp(tc->valuestring, "none")) { *none = 1; return 0; }
        if (strcmp(tc->valuestring, "required"))
            return srv_bad(e, 400, key, "invalid_value", "%s: \"auto\", \"none\", \"required\" or the function to call", key);
        if (t->n_names != 1) { /* GLM-4's calls are kept to one of them (srv_chat_prompt checks the model) */
            t->required_any = t->n_names > 1;
            if (t->n_names > 1) return 0;
            return srv_bad(e, 400, key, "invalid_value", "%s \"required\" without tools", key);
        }
        name = cJSON_CreateString(t->names[0]); /* freed below */
    } else {
        const cJSON *f = cJSON_IsObject(srv_field(tc, "function")) ? srv_field(tc, "function") : tc;
        name = srv_field(f, "name");
        if (!cJSON_IsString(name))
            return srv_bad(e, 400, key, "invalid_value", "%s: the function to call is {\"type\": \"function\", \"function\": "
                                                         "{\"name\": ...}}", key);
    }
    int k = 0;
    while (k < t->n_names && strcmp(t->names[k], name->valuestring)) k++;
    if (k < t->n_names) {
        t->forced = glm_malloc(strlen(t->names[k]) + 2);
        sprintf(t->forced, "%s\n", t->names[k]);
        t->forced_tool = k;
    } else {
        srv_bad(e, 400, key, "invalid_value", "%s: \"%.60s\" is not one of the request's %s", key, name->valuestring,
                t->legacy ? "functions" : "tools");
    }
    if (cJSON_IsString(tc)) cJSON_Delete((cJSON *)name);
    return t->forced ? 0 : -1;
}

/* The request's tools: the list (tools, or functions), their names, and tool_choice. */
static int read_tools(const cJSON *body, srv_tools *t, const cJSON **list, api_err *e) {
    const cJSON *tools = srv_field(body, "tools"), *fns = srv_field(body, "functions");
    *list = NULL;
    if (srv_present(tools) && srv_present(fns)) return srv_bad(e, 400, "tools", "invalid_value", "give tools or functions, not both");
    t->legacy = !srv_present(tools) && srv_present(fns);
    const cJSON *l = t->legacy ? fns : tools;
    if (!srv_present(l)) return 0;
    const char *what = t->legacy ? "functions" : "tools";
    if (!cJSON_IsArray(l)) return srv_bad(e, 400, what, "invalid_type", "%s must be an array", what);
    const cJSON *it;
    int i = 0, none;
    cJSON_ArrayForEach(it, l) {
        const cJSON *f = t->legacy ? it : srv_field(it, "function"), *name = srv_field(f, "name"), *ty = srv_field(it, "type");
        if (!t->legacy && cJSON_IsString(ty) && strcmp(ty->valuestring, "function"))
            return srv_bad(e, 400, what, "invalid_value", "tools[%d]: type \"%.40s\": only \"function\" tools are supported%s", i,
                           ty->valuestring, strcmp(ty->valuestring, "python") && strcmp(ty->valuestring, "simple_browser") &&
                                                strcmp(ty->valuestring, "cogview") ? "" : " (not GLM-4's built-in tools)");
        i++;
        if (!cJSON_IsObject(it) || !cJSON_IsString(name) || !name->valuestring[0] || strchr(name->valuestring, '\n'))
            return srv_bad(e, 400, what, "invalid_value", "%s: each entry needs %s", what,
                           t->legacy ? "a name" : "{\"type\": \"function\", \"function\": {\"name\", ...}}");
        t->names = glm_realloc(t->names, sizeof *t->names * (size_t)(t->n_names + 1));
        t->names[t->n_names++] = glm_strdup(name->valuestring);
    }
    t->list = l;
    if (read_choice(body, t, &none, e)) return -1;
    if (t->n_names == 0 || none) return 0;
    t->on = 1;
    *list = l;
    return 0;
}

/* The tool-aware path (ChatGLM3, GLM-4): every message a turn, in order. tools: the list's key in
 * the body, whose own text is dumped (cJSON's tree would lose what Python keeps: 7.0 a float). */
static int turns_prompt(srv_server *S, const cJSON *msgs, const char *tools, const char *body, size_t len, int glm4,
                        glm_ids *ids, api_err *e) {
    turns ts = {0};
    int rc = -1, n = cJSON_GetArraySize(msgs), skip_system = 0;
    size_t vs, ve;
    if (tools && glm_json_locate(body, len, tools, -1, &vs, &ve) == 0) {
        /* the demo's system turn with the tools; the request's own system message gives way to it */
        char why[200];
        char *sys = !glm4 ? glm_tools_system_text(body + vs, ve - vs, why, sizeof why)
                          : glm4_tools_text(body + vs, ve - vs, strcmp(tools, "functions") ? 0 : GLM4_TOOLS_FUNCTIONS, why,
                                            sizeof why);
        if (!sys) { srv_bad(e, 400, tools, "invalid_value", "%s: %s", tools, why); goto out; }
        add(&ts, GLM_TURN_SYSTEM, NULL, sys);
        skip_system = 1;
    }
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        char w[48], wc[64];
        snprintf(w, sizeof w, "messages[%d]", i);
        snprintf(wc, sizeof wc, "%s.content", w);
        const char *r = srv_field(m, "role")->valuestring;
        const cJSON *c = srv_field(m, "content");
        int calls = !strcmp(r, "assistant") && (srv_present(srv_field(m, "tool_calls")) || srv_present(srv_field(m, "function_call")));
        char *text = calls && !srv_present(c) ? NULL : content_text(c, wc, e);
        if (!text && !calls) { e->param = "messages"; goto out; }
        if (!strcmp(r, "system")) {
            if (skip_system) { skip_system = 0; free(text); continue; }
            add(&ts, GLM_TURN_SYSTEM, NULL, text);
        } else if (!strcmp(r, "user")) {
            add(&ts, GLM_TURN_USER, NULL, text);
        } else if (!strcmp(r, "assistant")) {
            if (!calls) { /* glmz1's history: without its thoughts */
                if (S->o.reasoning) { char *t = glm_thought_remove(text); free(text); text = t; }
                add(&ts, GLM_TURN_ASSISTANT, NULL, text);
                continue;
            }
            int k = assistant_calls(&ts, m, text, glm4, w, e);
            free(text);
            if (k) goto out;
        } else if (!strcmp(r, "tool") || !strcmp(r, "function") || !strcmp(r, "observation")) {
            add(&ts, GLM_TURN_OBSERVATION, NULL, text); /* the tool's result */
        } else {
            free(text);
            srv_bad(e, 400, "messages", "invalid_value", "%s.role \"%.40s\": expected system, user, assistant or tool", w, r);
            goto out;
        }
    }
    if (ts.n == 0 || (ts.t[ts.n - 1].role != GLM_TURN_USER && ts.t[ts.n - 1].role != GLM_TURN_OBSERVATION)) {
        srv_bad(e, 400, "messages", "invalid_value", "the last message must be the user's or a tool's result");
        goto out;
    }
    glm_err err = {0};
    pthread_mutex_lock(S->tok_mu);
    int k = glm_chat_inputs_turns(S->tok, ts.t, ts.n, ids, &err);
    pthread_mutex_unlock(S->tok_mu);
    if (k) { srv_bad(e, 400, "messages", "invalid_value", "%s", err.msg); goto out; }
    rc = 0;
out:
    turns_free(&ts);
    return rc;
}

/* glmz1 with thinking off: the empty thought ends the prompt (the request's
 * chat_template_kwargs.enable_thinking, as vLLM takes it, else the server's flag). */
static int thought_end(srv_server *S, const cJSON *body, glm_ids *ids, api_err *e) {
    if (!S->o.reasoning) return 0;
    const cJSON *kw = srv_field(body, "chat_template_kwargs"), *on = kw ? srv_field(kw, "enable_thinking") : NULL;
    if (srv_present(on) && !cJSON_IsBool(on))
        return srv_bad(e, 400, "chat_template_kwargs", "invalid_type", "chat_template_kwargs.enable_thinking must be true or false");
    if (srv_present(on) ? cJSON_IsTrue(on) : !S->o.disable_thinking) return 0;
    glm_err err = {0};
    pthread_mutex_lock(S->tok_mu);
    int k = glm_chat_empty_thought(S->tok, ids, &err);
    pthread_mutex_unlock(S->tok_mu);
    return k ? srv_bad(e, 500, NULL, "server_error", "%s", err.msg) : 0;
}

int srv_chat_prompt(srv_server *S, const cJSON *body, const char *text, size_t len, glm_ids *ids, srv_tools *t,
                    api_err *e) {
    const cJSON *msgs = srv_field(body, "messages"), *tools;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return srv_bad(e, 400, "messages", msgs ? "invalid_type" : "missing_required_parameter",
                       msgs ? "messages must be a non-empty array of {\"role\", \"content\"} objects" : "messages is required");
    int tool_turns = 0, i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char w[48];
        snprintf(w, sizeof w, "messages[%d]", i++);
        if (!cJSON_IsObject(m)) return srv_bad(e, 400, "messages", "invalid_type", "%s must be an object", w);
        const cJSON *role = srv_field(m, "role");
        if (!cJSON_IsString(role)) return srv_bad(e, 400, "messages", "invalid_type", "%s.role must be a string", w);
        tool_turns |= !strcmp(role->valuestring, "tool") || !strcmp(role->valuestring, "function") ||
                      !strcmp(role->valuestring, "observation") || srv_present(srv_field(m, "tool_calls")) ||
                      srv_present(srv_field(m, "function_call"));
    }
    if (read_tools(body, t, &tools, e)) return -1;
    int roles = glm_tokenizer_roles(S->tok).user >= 0;
    t->glm4 = glm_tokenizer_kind(S->tok) == GLM_TOK_GLM4;
    if ((t->on || tool_turns) && !roles) {
        const char *p = t->on ? (t->legacy ? "functions" : "tools") : "messages";
        srv_bad(e, 400, p, "unsupported_value", "%s: this model has no tool-calling format (ChatGLM3-6B and GLM-4 have)",
                t->on ? p : "tool calls and tool results");
        srv_tools_free(t);
        return -1;
    }
    const char *key = !tools ? NULL : t->legacy ? "functions" : "tools";
    if (!(t->on || tool_turns)) return plain_prompt(S, msgs, ids, e) ? -1 : thought_end(S, body, ids, e);
    if (t->on && t->required_any && !t->glm4)
        return srv_bad(e, 400, t->legacy ? "function_call" : "tool_choice", "unsupported_value",
                       "\"required\" with %d tools: name the one to call ({\"type\": \"function\", \"function\": "
                       "{\"name\": ...}}); ChatGLM3's calls cannot be kept to one of several here", t->n_names);
    if (turns_prompt(S, msgs, key, text, len, t->glm4, ids, e) || thought_end(S, body, ids, e)) return -1;
    if (t->on && t->forced) { /* the response starts as the call's own text: its name's line */
        glm_err err = {0};
        pthread_mutex_lock(S->tok_mu);
        int k = glm_chat_assistant_metadata(S->tok, t->forced, ids, &err);
        pthread_mutex_unlock(S->tok_mu);
        if (k) return srv_bad(e, 400, "tool_choice", "invalid_value", "%s", err.msg);
    }
    return 0;
}
