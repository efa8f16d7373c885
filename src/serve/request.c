/* A request's body -> the engine's request (serve/api.h): OpenAI's parameters checked and the
 * prompt built; errors in OpenAI's shape. No HTTP here and no model: tests/fuzz/fuzz_serve_request.c
 * runs this file on its own. */
#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/log.h"
#include "core/strbuf.h"
#include "data/reader.h"
#include "infer/chat.h"
#include "serve/api.h"

/* ---------------------------------------------------------------- the request object */

srv_req *srv_req_new(void) {
    srv_req *r = glm_calloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->waker = srv_waker_new();
    r->refs = 1;
    r->adapter = -1;
    r->slot = -1;
    atomic_init(&r->cancel, 0);
    return r;
}

void srv_req_put(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    glm_ids_free(&r->prompt);
    glm_ids_free(&r->out);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    if (r->admitted) glm_streamer_free(&r->st);
    free(r->seen);
    free(r->text.s);
    free(r->final);
    free(r->lps);
    free(r->plps);
    free(r->plps_part);
    free(r->echo);
    for (int i = 0; i < r->n_texts; i++) glm_ids_free(&r->texts[i]);
    free(r->texts);
    free(r->scores);
    free(r->bias_id);
    free(r->bias);
    glm_constrained_end(&r->con);
    srv_waker_put(r->waker);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

srv_waker *srv_waker_new(void) {
    srv_waker *w = glm_calloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->refs = 1;
    return w;
}

void srv_waker_put(srv_waker *w) {
    pthread_mutex_lock(&w->mu);
    int left = --w->refs;
    pthread_mutex_unlock(&w->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

void srv_waker_ring(srv_waker *w) {
    pthread_mutex_lock(&w->mu);
    w->rings++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

unsigned long srv_waker_rings(srv_waker *w) {
    pthread_mutex_lock(&w->mu);
    unsigned long n = w->rings;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void srv_waker_wait(srv_waker *w, unsigned long seen, const struct timespec *until) {
    pthread_mutex_lock(&w->mu);
    if (w->rings == seen) pthread_cond_timedwait(&w->cv, &w->mu, until);
    pthread_mutex_unlock(&w->mu);
}

/* ---------------------------------------------------------------- errors */

int srv_bad(api_err *e, unsigned status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    glm_utf8_scrub(e->msg); /* it quotes the request (cut at a length) and goes back as JSON */
    e->status = status;
    e->param = param;
    e->code = code;
    e->type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
    return -1;
}

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}}. */
cJSON *srv_error_body(const char *msg, const char *type, const char *param, const char *code) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return o;
}

/* ---------------------------------------------------------------- parameters */

int srv_positions_ok(srv_server *S, const glm_ids *ids) {
    int32_t *rule = glm_malloc(sizeof(int32_t) * 3 * (size_t)ids->n);
    int state[2], bad = S->e->m->fam->prompt_positions(S->cfg, ids->data, ids->n, rule, rule + ids->n, rule + 2 * ids->n,
                                                       state);
    free(rule);
    return !bad;
}

/* One prompt of a completion request: a string (the model's special tokens added, as generate's
 * --prompt) or a list of token ids (the model's inputs as they are). *echo: its text for echo (the
 * string as sent, the ids decoded). param names it in errors ("prompt", "prompt[i]"). */
static int one_prompt(srv_server *S, const cJSON *p, const char *param, glm_ids *ids, char **echo, api_err *e) {
    glm_err err = {0};
    if (cJSON_IsString(p)) {
        pthread_mutex_lock(S->tok_mu);
        int k = glm_prompt_inputs(S->tok, S->cfg, p->valuestring, 0, ids, &err);
        pthread_mutex_unlock(S->tok_mu);
        if (k) return srv_bad(e, 400, "prompt", "invalid_value", "%s: %s", param, err.msg);
        *echo = glm_strdup(p->valuestring);
        glm_utf8_scrub(*echo); /* it goes back inside JSON text */
        return 0;
    }
    const cJSON *it;
    int V = S->cfg->vocab_size, i = 0;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || !(it->valuedouble >= 0 && it->valuedouble < V))
            return srv_bad(e, 400, "prompt", "invalid_value", "%s[%d] must be a token id, an integer in [0, %d)", param, i, V);
        glm_ids_push(ids, (int32_t)it->valuedouble);
        i++;
    }
    if (ids->n > 0 && !srv_positions_ok(S, ids)) /* ChatGLM-6B's need [gMASK] (or [MASK]) and <sop> */
        return srv_bad(e, 400, "prompt", "invalid_value", "%s: the token ids have no [gMASK] (or [MASK]) and <sop>, "
                       "which ChatGLM-6B's positions need (a text prompt has them added)", param);
    pthread_mutex_lock(S->tok_mu);
    *echo = glm_tokenizer_decode(S->tok, ids->data, ids->n);
    pthread_mutex_unlock(S->tok_mu);
    glm_utf8_scrub(*echo); /* ids may end inside a character */
    return 0;
}

/* A completion's "prompt": a string, a list of token ids, or a list of several of either (a batch:
 * a choice each) -> *np prompts' ids and echo texts (arrays the caller frees, also on error). */
static int completion_prompts(srv_server *S, const cJSON *p, glm_ids **ids, char ***echo, int *np, api_err *e) {
    *ids = NULL;
    *echo = NULL;
    *np = 0;
    if (!srv_present(p)) return srv_bad(e, 400, "prompt", "missing_required_parameter", "prompt is required");
    int list = cJSON_IsArray(p), k = list ? cJSON_GetArraySize(p) : 1;
    if (!list && !cJSON_IsString(p))
        return srv_bad(e, 400, "prompt", "invalid_type", "prompt must be a string, a list of token ids, or a list of those");
    if (k == 0) return srv_bad(e, 400, "prompt", "invalid_value", "prompt is an empty list");
    int single = !list || cJSON_IsNumber(cJSON_GetArrayItem(p, 0)); /* a string, or one list of ids */
    if (single) k = 1;
    else if (k > SRV_MAX_PROMPTS)
        return srv_bad(e, 400, "prompt", "invalid_value", "prompt holds %d prompts; at most %d a request", k, SRV_MAX_PROMPTS);
    *ids = glm_calloc((size_t)k, sizeof **ids);
    *echo = glm_calloc((size_t)k, sizeof **echo);
    *np = k;
    for (int i = 0; i < k; i++) {
        const cJSON *x = single ? p : cJSON_GetArrayItem(p, i);
        char param[32];
        snprintf(param, sizeof param, single ? "prompt" : "prompt[%d]", i);
        if (!single && !cJSON_IsString(x) &&
            !(cJSON_IsArray(x) && cJSON_GetArraySize(x) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(x, 0))))
            return srv_bad(e, 400, "prompt", "invalid_type", "%s must be a string or a non-empty list of token ids", param);
        if (one_prompt(S, x, param, &(*ids)[i], &(*echo)[i], e)) return -1;
    }
    return 0;
}

static int number(const cJSON *o, const char *k, double lo, double hi, int lo_open, double *out, api_err *e) {
    const cJSON *v = srv_field(o, k);
    if (!srv_present(v)) return 0;
    if (!cJSON_IsNumber(v)) return srv_bad(e, 400, k, "invalid_type", "%s must be a number", k);
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi) || (lo_open && x == lo))
        return srv_bad(e, 400, k, "invalid_value", "%s must be in %s%g, %g] (got %g)", k, lo_open ? "(" : "[", lo, hi, x);
    *out = x;
    return 1;
}

static int integer(const cJSON *o, const char *k, double lo, double hi, double *out, api_err *e) {
    const cJSON *v = srv_field(o, k);
    if (!srv_present(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return srv_bad(e, 400, k, "invalid_type", "%s must be an integer", k);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return srv_bad(e, 400, k, "invalid_value", "%s must be in [%.0f, %.0f] (got %.0f)", k, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return 1;
}

static uint64_t fresh_seed(void) {
    static atomic_ulong n;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (atomic_fetch_add(&n, 1) * 0x9e3779b97f4a7c15ULL);
    return x;
}

int srv_pick_model(srv_server *S, const cJSON *o, int *adapter, char *name, size_t cap, api_err *e) {
    const cJSON *mv = srv_field(o, "model");
    *adapter = -1;
    if (srv_present(mv) && !cJSON_IsString(mv)) return srv_bad(e, 400, "model", "invalid_type", "model must be a string");
    if (srv_present(mv) && strcmp(mv->valuestring, S->o.model_name) != 0) {
        *adapter = -2;
        for (int k = 0; k < S->e->n_ad; k++)
            if (!strcmp(S->e->ad[k].name, mv->valuestring)) *adapter = k;
        if (*adapter == -2)
            return srv_bad(e, 404, "model", "model_not_found", "The model `%.200s` does not exist (GET /v1/models lists them)",
                           mv->valuestring);
    }
    if (*adapter == -1 && S->o.model_adapter > 0) *adapter = S->o.model_adapter - 1; /* the served model has its adapter */
    snprintf(name, cap, "%s", *adapter >= 0 && *adapter != S->o.model_adapter - 1 ? S->e->ad[*adapter].name : S->o.model_name);
    return 0;
}

cJSON *srv_parse_object(const char *body, size_t n, api_err *e) {
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    if (!o) {
        long at = end ? (long)(end - body) : 0;
        srv_bad(e, 400, NULL, "invalid_json", "the body is not valid JSON (error near byte %ld of %zu)", at, n);
        return NULL;
    }
    if (cJSON_IsObject(o)) return o;
    cJSON_Delete(o);
    srv_bad(e, 400, NULL, "invalid_json", "the body must be a JSON object");
    return NULL;
}

/* A prompt's checks against the server's length and the request's max_tokens (param names the
 * prompt in errors); the engine's settings for it. Logs the ids with --debug. */
static int prompt_fits(srv_server *S, int chat, srv_req *r, const char *param, const char *mk, int max_tokens,
                       api_err *e) {
    if (S->o.debug) {
        glm_strbuf b = {0};
        for (int i = 0; i < r->prompt.n; i++) {
            char t[16];
            snprintf(t, sizeof t, i ? " %d" : "%d", r->prompt.data[i]);
            glm_strbuf_str(&b, t);
        }
        glm_info("serve: prompt ids: %s", b.s ? b.s : "");
        free(b.s);
    }
    int np = r->prompt.n, room = S->o.Tmax - np;
    if (np == 0) /* a plain SentencePiece tokenizer adds no special tokens to an empty text */
        return srv_bad(e, 400, chat ? "messages" : "prompt", "invalid_value", "%s is empty: it gives no tokens to start from",
                       chat ? "the prompt" : param);
    if (r->no_generate) { /* echo alone: the prompt only has to fit */
        if (room >= 0) return 0;
        return srv_bad(e, 413, "prompt", "context_length_exceeded", "%s is %d tokens; this server's max_model_len is %d",
                       param, np, S->o.Tmax);
    }
    if (room < 1)
        return srv_bad(e, 413, chat ? "messages" : "prompt", "context_length_exceeded",
                       "%s is %d tokens; this server's max_model_len is %d (prompt + response), so at most %d prompt tokens fit",
                       chat ? "the prompt" : param, np, S->o.Tmax, S->o.Tmax - 1);
    if (max_tokens > room)
        return srv_bad(e, 400, mk, "context_length_exceeded",
                       "%s %d does not fit: %s is %d tokens and max_model_len is %d, so at most %d new tokens",
                       mk, max_tokens, chat ? "the prompt" : param, np, S->o.Tmax, room);
    r->g.max_new_tokens = max_tokens; /* 0: up to max_length (capped at max_model_len) */
    r->g.model_max_length = S->o.Tmax;
    if (glm_gen_limit(&r->g, np) < 1)
        return srv_bad(e, 413, chat ? "messages" : "prompt", "context_length_exceeded",
                       "%s is %d tokens and leaves no room for a response under max_length %d", chat ? "the prompt" : param,
                       np, r->g.max_length);
    return 0;
}

/* vLLM's stop_token_ids (a list of token ids, at most SRV_MAX_STOP_IDS) and min_tokens (at most
 * max_tokens when that is given). */
static int stop_rules(srv_server *S, const cJSON *o, srv_req *r, int max_tokens, api_err *e) {
    const cJSON *ids = srv_field(o, "stop_token_ids"), *it;
    int V = S->cfg->vocab_size;
    if (srv_present(ids)) {
        if (!cJSON_IsArray(ids)) return srv_bad(e, 400, "stop_token_ids", "invalid_type", "stop_token_ids must be a list of token ids");
        if (cJSON_GetArraySize(ids) > SRV_MAX_STOP_IDS)
            return srv_bad(e, 400, "stop_token_ids", "invalid_value", "at most %d stop_token_ids", SRV_MAX_STOP_IDS);
        cJSON_ArrayForEach(it, ids) {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 || it->valuedouble >= V)
                return srv_bad(e, 400, "stop_token_ids", "invalid_value", "stop_token_ids: each must be a token id of this "
                               "model (0 to %d)", V - 1);
            r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)it->valuedouble;
        }
    }
    double x;
    int k = integer(o, "min_tokens", 0, 1e9, &x, e);
    if (k < 0) return -1;
    if (k) r->min_tokens = (int)x;
    if (max_tokens > 0 && r->min_tokens > max_tokens)
        return srv_bad(e, 400, "min_tokens", "invalid_value", "min_tokens %d is above max_tokens %d", r->min_tokens, max_tokens);
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}, at most 300 entries, ids in the
 * model's vocabulary. */
static int logit_bias(srv_server *S, const cJSON *b, srv_req *r, api_err *e) {
    if (!srv_present(b)) return 0;
    if (!cJSON_IsObject(b)) return srv_bad(e, 400, "logit_bias", "invalid_type", "logit_bias must be an object of token ids to biases");
    int n = cJSON_GetArraySize(b), V = S->cfg->vocab_size, i = 0;
    if (n > 300) return srv_bad(e, 400, "logit_bias", "invalid_value", "logit_bias has %d entries; at most 300", n);
    if (n == 0) return 0;
    r->bias_id = glm_malloc(sizeof(int32_t) * (size_t)n);
    r->bias = glm_malloc(sizeof(float) * (size_t)n);
    for (const cJSON *it = b->child; it; it = it->next, i++) {
        char *end = NULL;
        long id = it->string && *it->string ? strtol(it->string, &end, 10) : -1;
        if (!end || *end || id < 0 || id >= V)
            return srv_bad(e, 400, "logit_bias", "invalid_value", "logit_bias: \"%.40s\" is not a token id of this model "
                           "(0 to %d)", it->string ? it->string : "", V - 1);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return srv_bad(e, 400, "logit_bias", "invalid_value", "logit_bias[\"%ld\"] must be a number from -100 to 100", id);
        r->bias_id[i] = (int32_t)id;
        r->bias[i] = (float)it->valuedouble;
    }
    r->n_bias = n;
    return 0;
}

/* A constraint's refusal beside the settings it cannot keep to (the answer ends where it is done). */
static int ends_itself(const srv_req *r, const char *what, api_err *e) {
    if (r->ignore_eos)
        return srv_bad(e, 400, "ignore_eos", "invalid_value", "ignore_eos with %s: the answer ends where it is complete", what);
    if (r->min_tokens > 0)
        return srv_bad(e, 400, "min_tokens", "invalid_value", "min_tokens with %s: the answer ends where it is complete", what);
    return 0;
}

/* r's answer kept to constraint c (the maker's reference handed over). */
static int constrain_to(srv_req *r, glm_constraint *c) {
    glm_constrained_begin(&r->con, c);
    glm_constraint_unref(c);
    return 0;
}

/* A JSON Schema (an object, or its JSON text as vLLM's guided_json may send it) for r's answer. */
static int take_schema(const cJSON *s, const char *param, srv_req *r, api_err *e) {
    cJSON *parsed = cJSON_IsString(s) ? cJSON_Parse(s->valuestring) : NULL;
    const cJSON *sc = parsed ? parsed : s;
    char why[512];
    glm_constraint *c = cJSON_IsObject(sc) ? glm_constraint_schema(sc, why, sizeof why) : NULL;
    int rc = c ? constrain_to(r, c)
         : !cJSON_IsObject(sc) ? srv_bad(e, 400, param, "invalid_type", "%s: the schema must be a JSON object", param)
                               : srv_bad(e, 400, param, "unsupported_value", "%s: %s", param, why);
    cJSON_Delete(parsed);
    return rc;
}

/* OpenAI's response_format: {"type": "text"} (the default), {"type": "json_object"} (JSON mode:
 * infer/json_mode.h) or {"type": "json_schema", "json_schema": {"schema": {...}}} (structured
 * outputs: infer/schema_mode.h); vLLM's guided_json (a schema) as the last. */
static int response_format(const cJSON *f, const cJSON *guided_json, srv_req *r, api_err *e) {
    if (srv_present(guided_json)) {
        if (srv_present(f)) return srv_bad(e, 400, "guided_json", "invalid_value", "guided_json and response_format: one of them");
        return ends_itself(r, "guided_json", e) ? -1 : take_schema(guided_json, "guided_json", r, e);
    }
    if (!srv_present(f)) return 0;
    const cJSON *t = cJSON_IsObject(f) ? srv_field(f, "type") : NULL;
    if (!cJSON_IsString(t))
        return srv_bad(e, 400, "response_format", "invalid_type", "response_format must be an object with a \"type\"");
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *js = srv_field(f, "json_schema"), *s = cJSON_IsObject(js) ? srv_field(js, "schema") : NULL;
        if (!cJSON_IsObject(s))
            return srv_bad(e, 400, "response_format", "invalid_value", "response_format json_schema needs "
                           "\"json_schema\": {\"name\": ..., \"schema\": {...}}");
        return ends_itself(r, "response_format json_schema", e) ? -1 : take_schema(s, "response_format", r, e);
    }
    if (strcmp(t->valuestring, "json_object"))
        return srv_bad(e, 400, "response_format", "invalid_value", "response_format type \"%.40s\": text, json_object or "
                       "json_schema", t->valuestring);
    return ends_itself(r, "response_format json_object", e) ? -1 : constrain_to(r, glm_constraint_json());
}

/* vLLM's guided_choice (p names the field): a list of 1 to SRV_MAX_CHOICES different non-empty strings. */
static int guided_choice(const cJSON *c, const char *p, srv_req *r, api_err *e) {
    if (!srv_present(c)) return 0;
    int n = cJSON_IsArray(c) ? cJSON_GetArraySize(c) : 0;
    if (n < 1 || n > SRV_MAX_CHOICES)
        return srv_bad(e, 400, p, "invalid_value", "%s must be a list of 1 to %d strings", p, SRV_MAX_CHOICES);
    if (r->con.c) return srv_bad(e, 400, p, "invalid_value", "%s with a JSON format: one at a time", p);
    if (ends_itself(r, p, e)) return -1;
    const char *s[SRV_MAX_CHOICES];
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, c) {
        if (!cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > 1024)
            return srv_bad(e, 400, p, "invalid_value", "%s: each choice must be a non-empty string of at most 1024 bytes", p);
        s[k++] = it->valuestring;
    }
    return constrain_to(r, glm_constraint_choices(s, k));
}

/* vLLM's guided_regex (p names the field): the answer matches a regular expression whole (infer/regex.h). */
static int guided_regex(const cJSON *g, const char *p, srv_req *r, api_err *e) {
    if (!srv_present(g)) return 0;
    if (!cJSON_IsString(g) || !g->valuestring[0] || strlen(g->valuestring) > 4096)
        return srv_bad(e, 400, p, "invalid_type", "%s must be a pattern of 1 to 4096 bytes", p);
    if (r->con.c) return srv_bad(e, 400, p, "invalid_value", "%s with another constraint: one at a time", p);
    if (ends_itself(r, p, e)) return -1;
    char why[320];
    glm_constraint *c = glm_constraint_regex(g->valuestring, why, sizeof why);
    if (!c) return srv_bad(e, 400, p, "unsupported_value", "%s: %s", p, why);
    return constrain_to(r, c);
}

/* vLLM's structured_outputs (which replaced its guided_* fields): {"json": schema} or {"regex": ...}
 * or {"choice": [...]} or {"json_object": true}, one of them; grammar, structural_tag and
 * whitespace_pattern are refused by name. */
static int structured_outputs(const cJSON *so, srv_req *r, api_err *e) {
    static const char *const KEYS[] = {"json", "regex", "choice", "json_object"};
    if (!srv_present(so)) return 0;
    if (!cJSON_IsObject(so))
        return srv_bad(e, 400, "structured_outputs", "invalid_type", "structured_outputs must be an object");
    if (r->con.c)
        return srv_bad(e, 400, "structured_outputs", "invalid_value", "structured_outputs with response_format or a guided_* "
                       "field: one constraint at a time");
    int n = 0;
    for (const cJSON *k = so->child; k; k = k->next) {
        int known = 0;
        for (int i = 0; i < 4; i++) known |= !strcmp(k->string, KEYS[i]);
        if (!known)
            return srv_bad(e, 400, "structured_outputs", "unsupported_value", "structured_outputs.%.40s is not supported "
                           "(json, regex, choice and json_object are)", k->string);
        n += srv_present(k) && !cJSON_IsFalse(k);
    }
    if (n != 1)
        return srv_bad(e, 400, "structured_outputs", "invalid_value", "structured_outputs needs one of json, regex, choice "
                       "and json_object");
    const cJSON *js = srv_field(so, "json"), *jo = srv_field(so, "json_object");
    if (srv_present(js)) return ends_itself(r, "structured_outputs.json", e) ? -1 : take_schema(js, "structured_outputs", r, e);
    if (cJSON_IsTrue(jo)) return ends_itself(r, "structured_outputs.json_object", e) ? -1 : constrain_to(r, glm_constraint_json());
    if (srv_present(jo))
        return srv_bad(e, 400, "structured_outputs", "invalid_type", "structured_outputs.json_object must be true");
    return srv_present(srv_field(so, "regex")) ? guided_regex(srv_field(so, "regex"), "structured_outputs", r, e)
                                               : guided_choice(srv_field(so, "choice"), "structured_outputs", r, e);
}

/* A GLM-4 call forced by tool_choice (the prompt ends with its name's line): its arguments kept to
 * the tool's parameters (a JSON Schema; a schema the recognizer cannot keep, or none: any JSON
 * object), unless the request keeps to a constraint of its own or asks to run past the end. */
/* Tool k's arguments: its parameters as the request gives them. */
static glm_constraint *call_arguments(const srv_tools *t, int k) {
    const cJSON *it = cJSON_GetArrayItem(t->list, k), *f = t->legacy ? it : srv_field(it, "function");
    const cJSON *params = srv_field(f, "parameters");
    char why[512];
    glm_constraint *c = cJSON_IsObject(params) ? glm_constraint_schema(params, why, sizeof why) : NULL;
    return c ? c : glm_constraint_json();
}

/* ... and "required" with several tools: one of their names' lines, then that tool's arguments. */
static void forced_call_arguments(const srv_tools *t, srv_req *r) {
    if (!t->on || !t->glm4 || r->con.c || r->ignore_eos || r->min_tokens > 0) return;
    if (t->forced) { constrain_to(r, call_arguments(t, t->forced_tool)); return; }
    if (!t->required_any) return;
    char **lines = glm_malloc(sizeof *lines * (size_t)t->n_names);
    glm_constraint **args = glm_malloc(sizeof *args * (size_t)t->n_names);
    for (int k = 0; k < t->n_names; k++) {
        lines[k] = glm_malloc(strlen(t->names[k]) + 2);
        sprintf(lines[k], "%s\n", t->names[k]);
        args[k] = call_arguments(t, k);
    }
    constrain_to(r, glm_constraint_call((const char *const *)lines, args, t->n_names));
    for (int k = 0; k < t->n_names; k++) { free(lines[k]); glm_constraint_unref(args[k]); }
    free(lines);
    free(args);
}

srv_req *srv_req_clone(const srv_req *r) {
    srv_req *x = srv_req_new();
    x->adapter = r->adapter;
    x->g = r->g;
    x->seed = r->seed;
    x->postprocess = r->postprocess;
    x->ignore_eos = r->ignore_eos;
    x->frequency_penalty = r->frequency_penalty;
    memcpy(x->stop_token_ids, r->stop_token_ids, sizeof r->stop_token_ids);
    x->n_stop_token_ids = r->n_stop_token_ids;
    x->min_tokens = r->min_tokens;
    glm_constrained_begin(&x->con, r->con.c); /* the same constraint, from its start */
    x->presence_penalty = r->presence_penalty;
    if ((x->n_bias = r->n_bias) > 0) {
        x->bias_id = glm_malloc(sizeof(int32_t) * (size_t)r->n_bias);
        x->bias = glm_malloc(sizeof(float) * (size_t)r->n_bias);
        memcpy(x->bias_id, r->bias_id, sizeof(int32_t) * (size_t)r->n_bias);
        memcpy(x->bias, r->bias, sizeof(float) * (size_t)r->n_bias);
    }
    for (int i = 0; i < r->n_stops; i++) x->stops[i] = glm_strdup(r->stops[i]);
    x->n_stops = r->n_stops;
    x->logprobs = r->logprobs;
    x->top_logprobs = r->top_logprobs;
    x->prompt_logprobs = r->prompt_logprobs;
    x->no_generate = r->no_generate;
    return x;
}

void srv_api_req_free(api_req *q) {
    for (int i = 0; i < q->n_batch; i++) srv_req_put(q->batch[i]);
    free(q->batch);
    q->batch = NULL;
    q->n_batch = 0;
    q->r = NULL;
    srv_tools_free(&q->tools);
}

int srv_parse_request(srv_server *S, int chat, const char *body, size_t n, api_req *q, api_err *e) {
    cJSON *o = srv_parse_object(body, n, e);
    if (!o) return -1;
    int rc = -1, np = 0;
    srv_req *r = NULL;
    glm_ids *pids = NULL; /* a completion's prompts [np] and their echo texts */
    char **ptexts = NULL;
    int adapter;
    if (srv_pick_model(S, o, &adapter, q->model, sizeof q->model, e)) goto out;
    const cJSON *st = srv_field(o, "stream");
    if (srv_present(st) && !cJSON_IsBool(st)) { srv_bad(e, 400, "stream", "invalid_type", "stream must be a boolean"); goto out; }
    q->stream = cJSON_IsTrue(st);
    const cJSON *so = srv_field(o, "stream_options");
    if (srv_present(so) && !cJSON_IsObject(so)) { srv_bad(e, 400, "stream_options", "invalid_type", "stream_options must be an object"); goto out; }
    q->include_usage = so && cJSON_IsTrue(srv_field(so, "include_usage"));
    double x;
    int nc = 1; /* choices a prompt */
    if (integer(o, "n", 1, SRV_MAX_PROMPTS, &x, e) < 0) goto out;
    if (srv_present(srv_field(o, "n"))) nc = (int)x;
    int echo = 0;
    if (!chat) {
        const cJSON *v;
        if (srv_present(v = srv_field(o, "echo")) && !cJSON_IsBool(v)) { srv_bad(e, 400, "echo", "invalid_type", "echo must be a boolean"); goto out; }
        echo = cJSON_IsTrue(v);
        if (srv_present(v = srv_field(o, "suffix"))) { srv_bad(e, 400, "suffix", "unsupported_value", "suffix is not supported"); goto out; }
        if (srv_present(v = srv_field(o, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == 1)) { srv_bad(e, 400, "best_of", "unsupported_value", "best_of must be 1"); goto out; }
    }
    int logprobs = 0, top_logprobs = 0;
    if (chat) { /* logprobs: true, top_logprobs 0..20 */
        const cJSON *lv = srv_field(o, "logprobs");
        if (srv_present(lv) && !cJSON_IsBool(lv)) { srv_bad(e, 400, "logprobs", "invalid_type", "logprobs must be a boolean"); goto out; }
        logprobs = cJSON_IsTrue(lv);
        int k = integer(o, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &x, e);
        if (k < 0) goto out;
        if (k && x > 0 && !logprobs) { srv_bad(e, 400, "top_logprobs", "invalid_value", "top_logprobs needs logprobs: true"); goto out; }
        if (k) top_logprobs = (int)x;
    } else { /* logprobs: the number of alternatives, 0..5 */
        int k = integer(o, "logprobs", 0, 5, &x, e);
        if (k < 0) goto out;
        if (k) { logprobs = 1; top_logprobs = (int)x; }
        if (echo && logprobs && S->cfg->family == GLM_FAMILY_GLM) {
            srv_bad(e, 400, "echo", "unsupported_value", "echo with logprobs: ChatGLM-6B reads its whole prompt both ways "
                    "(a prefix LM), so its prompt tokens have no log-probabilities of their own; ChatGLM2/3 and GLM-4 "
                    "give them (without logprobs the prompt is echoed)");
            goto out;
        }
    }
    r = srv_req_new();
    r->logprobs = logprobs;
    r->top_logprobs = top_logprobs;
    r->prompt_logprobs = echo && logprobs;
    r->adapter = adapter;
    r->g = S->o.defaults;
    r->postprocess = chat;
    int k;
    if ((k = number(o, "temperature", 0, 2, 0, &x, e)) < 0) goto out;
    if (k) { r->g.temperature = (float)x; r->g.do_sample = x > 0; }
    if ((k = number(o, "top_p", 0, 1, 1, &x, e)) < 0) goto out;
    if (k) r->g.top_p = (float)x;
    if ((k = integer(o, "top_k", 0, 1e9, &x, e)) < 0) goto out;
    if (k) r->g.top_k = (int)x;
    if ((k = integer(o, "max_length", 1, 1e9, &x, e)) < 0) goto out; /* HF's: prompt + response */
    if (k) r->g.max_length = (int)x;
    if ((k = number(o, "repetition_penalty", 0, 100, 1, &x, e)) < 0) goto out;
    if (k) r->g.repetition_penalty = (float)x;
    if ((k = number(o, "frequency_penalty", -2, 2, 0, &x, e)) < 0) goto out;
    if (k) r->frequency_penalty = (float)x;
    if ((k = number(o, "presence_penalty", -2, 2, 0, &x, e)) < 0) goto out;
    if (k) r->presence_penalty = (float)x;
    if (logit_bias(S, srv_field(o, "logit_bias"), r, e)) goto out;
    int max_tokens = 0;
    const char *mk = srv_present(srv_field(o, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
    if ((k = integer(o, mk, chat ? 1 : 0, 1e9, &x, e)) < 0) goto out;
    if (k) max_tokens = (int)x;
    if (k && max_tokens == 0 && !echo) {
        srv_bad(e, 400, mk, "invalid_value", "%s 0 asks for no tokens: it goes with echo: true (the prompt alone, with its "
                "log-probabilities under logprobs)", mk);
        goto out;
    }
    r->no_generate = k && max_tokens == 0;
    if ((k = integer(o, "seed", -9.2e18, 1.8e19, &x, e)) < 0) goto out;
    r->seed = k ? (x < 0 ? (uint64_t)(int64_t)x : (uint64_t)x) : fresh_seed();
    const cJSON *sv = srv_field(o, "stop");
    if (cJSON_IsString(sv)) {
        if (!sv->valuestring[0]) { srv_bad(e, 400, "stop", "invalid_value", "stop strings must not be empty"); goto out; }
        r->stops[r->n_stops++] = glm_strdup(sv->valuestring);
    } else if (cJSON_IsArray(sv)) {
        const cJSON *it;
        if (cJSON_GetArraySize(sv) > SRV_MAX_STOPS) { srv_bad(e, 400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOPS); goto out; }
        cJSON_ArrayForEach(it, sv) {
            if (!cJSON_IsString(it) || !it->valuestring[0]) { srv_bad(e, 400, "stop", "invalid_type", "stop must be a string or a list of non-empty strings"); goto out; }
            r->stops[r->n_stops++] = glm_strdup(it->valuestring);
        }
    } else if (srv_present(sv)) {
        srv_bad(e, 400, "stop", "invalid_type", "stop must be a string or a list of strings");
        goto out;
    }
    if (stop_rules(S, o, r, max_tokens, e)) goto out;
    const cJSON *ie = srv_field(o, "ignore_eos");
    if (srv_present(ie) && !cJSON_IsBool(ie)) { srv_bad(e, 400, "ignore_eos", "invalid_type", "ignore_eos must be a boolean"); goto out; }
    r->ignore_eos = cJSON_IsTrue(ie);
    if (response_format(srv_field(o, "response_format"), srv_field(o, "guided_json"), r, e)) goto out;
    if (guided_choice(srv_field(o, "guided_choice"), "guided_choice", r, e)) goto out;
    if (guided_regex(srv_field(o, "guided_regex"), "guided_regex", r, e)) goto out;
    if (structured_outputs(srv_field(o, "structured_outputs"), r, e)) goto out;
    glm_err gerr = {0};
    if (glm_gen_cfg_check(&r->g, &gerr)) { srv_bad(e, 400, NULL, "invalid_value", "%s", gerr.msg); goto out; }
    if (chat) {
        pids = glm_calloc(1, sizeof *pids);
        ptexts = glm_calloc(1, sizeof *ptexts);
        np = 1;
        if (srv_chat_prompt(S, o, body, n, &pids[0], &q->tools, e)) goto out;
        forced_call_arguments(&q->tools, r);
        q->tools.list = NULL; /* (it pointed into the body) */
    } else {
        if (completion_prompts(S, srv_field(o, "prompt"), &pids, &ptexts, &np, e)) goto out;
    }
    if ((long)np * nc > SRV_MAX_PROMPTS) {
        srv_bad(e, 400, "n", "invalid_value", "%d prompts x n %d = %ld choices; at most %d a request", np, nc, (long)np * nc,
                SRV_MAX_PROMPTS);
        goto out;
    }
    /* a request a choice: prompt i's choice j is choices[i * n + j], the first one's copy sampled
     * with seed + j */
    q->batch = glm_calloc((size_t)np * nc, sizeof *q->batch);
    q->n_choices = nc;
    for (int i = 0; i < np; i++) {
        srv_req *x = i ? srv_req_clone(q->batch[0]) : r;
        q->batch[q->n_batch++] = x; /* owned by q from here */
        r = NULL;
        x->prompt = pids[i];
        pids[i] = (glm_ids){0};
        x->echo = echo ? ptexts[i] : NULL;
        if (echo) ptexts[i] = NULL;
        char param[32];
        snprintf(param, sizeof param, chat ? "messages" : np > 1 ? "prompt[%d]" : "prompt", i);
        if (prompt_fits(S, chat, x, param, mk, max_tokens, e)) goto out;
        for (int j = 1; j < nc; j++) {
            srv_req *y = srv_req_clone(x);
            for (int t = 0; t < x->prompt.n; t++) glm_ids_push(&y->prompt, x->prompt.data[t]);
            y->echo = x->echo ? glm_strdup(x->echo) : NULL;
            y->seed = x->seed + (uint64_t)j;
            q->batch[q->n_batch++] = y;
        }
    }
    q->chat = chat;
    q->r = q->batch[0];
    rc = 0;
out:
    if (r) srv_req_put(r);
    for (int i = 0; i < np; i++) { glm_ids_free(&pids[i]); free(ptexts[i]); }
    free(pids);
    free(ptexts);
    if (rc) srv_api_req_free(q);
    cJSON_Delete(o);
    return rc;
}
