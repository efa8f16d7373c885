/* OpenAI-compatible HTTP endpoints over libmicrohttpd (serve/server.h). */
#include "serve/server.h"
#include "serve/api.h"
#include "serve/respond.h"
#include <arpa/inet.h>
#include <dlfcn.h>
#include <cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "core/log.h"

/* libmicrohttpd is opened when serve starts (dlopen), not linked: glmtrain's other commands and
 * the binaries carried to GPU machines need neither it nor the TLS libraries it pulls in. */
static struct {
    void *h;
    __typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
    __typeof__(&MHD_add_response_header) add_response_header;
    __typeof__(&MHD_queue_response) queue_response;
    __typeof__(&MHD_destroy_response) destroy_response;
    __typeof__(&MHD_get_connection_info) get_connection_info;
    __typeof__(&MHD_create_response_from_callback) create_response_from_callback;
    __typeof__(&MHD_lookup_connection_value) lookup_connection_value;
    __typeof__(&MHD_start_daemon) start_daemon;
    __typeof__(&MHD_get_daemon_info) get_daemon_info;
    __typeof__(&MHD_quiesce_daemon) quiesce_daemon;
    __typeof__(&MHD_stop_daemon) stop_daemon;
} mhd;

static int mhd_open(glm_err *err) {
    if (mhd.h) return 0;
    const char *names[] = {"libmicrohttpd.so.12", "libmicrohttpd.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !mhd.h; i++) mhd.h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!mhd.h) {
        glm_fail(err, "serve needs libmicrohttpd: %s", dlerror());
        return glm_hint(err, "install it (Debian: apt-get install libmicrohttpd12, or scripts/install-deps.sh), or put libmicrohttpd.so.12 on LD_LIBRARY_PATH");
    }
#define MHD_SYM(f) \
    if (!(*(void **)&mhd.f = dlsym(mhd.h, "MHD_" #f))) return glm_fail(err, "libmicrohttpd lacks MHD_" #f ": %s", dlerror());
    MHD_SYM(create_response_from_buffer)
    MHD_SYM(add_response_header)
    MHD_SYM(queue_response)
    MHD_SYM(destroy_response)
    MHD_SYM(get_connection_info)
    MHD_SYM(create_response_from_callback)
    MHD_SYM(lookup_connection_value)
    MHD_SYM(start_daemon)
    MHD_SYM(get_daemon_info)
    MHD_SYM(quiesce_daemon)
    MHD_SYM(stop_daemon)
#undef MHD_SYM
    return 0;
}

/* Bodies past max_body are read and dropped up to this much (so the client can read the 413);
 * a Content-Length above it is answered at once and the connection closed. */
#define DISCARD_CAP (64u << 20)

enum { R_NONE, R_HEALTH, R_METRICS, R_PAGE, R_MODELS, R_CHAT, R_COMPLETIONS, R_THUDM, R_SCORE, R_TOKENIZE, R_DETOKENIZE, R_TOKINFO };

typedef struct conn_state {
    int route;
    int early_status;          /* an error known from the headers, answered after the body */
    char early_msg[512];
    const char *early_type, *early_code, *early_param;
    char *body;
    size_t n, cap;
    int too_large;
} conn_state;

/* ---------------------------------------------------------------- small helpers */

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, const char *type, const char *body, size_t n,
                                int auth_header) {
    struct MHD_Response *r = mhd.create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    mhd.add_response_header(r, "Content-Type", type);
    if (auth_header) mhd.add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = mhd.queue_response(c, status, r);
    mhd.destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), 0);
    free(s);
    return rc;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *type,
                                  const char *param, const char *code) {
    char *s;
    cJSON *o = srv_error_body(msg, type, param, code);
    s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    enum MHD_Result rc = send_buf(c, status, "application/json", s, strlen(s), status == 401);
    free(s);
    return rc;
}

/* Constant-time comparison of the Authorization header with "Bearer KEY". */
static int key_ok(const char *hdr, const char *key) {
    if (!hdr || strncmp(hdr, "Bearer ", 7) != 0) return 0;
    hdr += 7;
    size_t a = strlen(hdr), b = strlen(key);
    unsigned char d = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) d |= (unsigned char)(key[i] ^ (i < a ? hdr[i] : 0));
    return d == 0;
}

/* srv_engine_submit's refusal st (429 or 503) as OpenAI's error. */
static enum MHD_Result busy(struct MHD_Connection *conn, int st) {
    return st == 429 ? send_error(conn, 429, "the request queue is full: try again later", "rate_limit_error", NULL, "queue_full")
                     : send_error(conn, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
}

static int conn_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The 400 for more choices than the server ever holds at once (NULL when they fit). */
static const char *too_many_choices(srv_server *S, const api_req *q, char *msg, size_t cap) {
    if (q->n_batch <= srv_engine_capacity(S->e)) return NULL;
    snprintf(msg, cap, "%d choices in one request; this server queues at most %d requests at once "
             "(--max_batch_size + --max_queue): send fewer prompts or a smaller n", q->n_batch, srv_engine_capacity(S->e));
    return msg;
}

/* MHD's content reader over the response (serve/respond.h). */
static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t k = srv_response_read(cls, buf, max);
    return k == SRV_READ_END    ? MHD_CONTENT_READER_END_OF_STREAM
           : k == SRV_READ_GONE ? MHD_CONTENT_READER_END_WITH_ERROR
                                : k;
}
static void free_cb(void *cls) { srv_response_free(cls); }

/* A completion (route R_CHAT or R_COMPLETIONS), or THUDM api.py's request as a chat one. */
static enum MHD_Result completion(srv_server *S, struct MHD_Connection *conn, int route, const char *body, size_t n) {
    api_req q = {0};
    api_err e = {0};
    int chat = route != R_COMPLETIONS;
    cJSON *thudm_history = NULL;
    char *thudm_prompt = NULL, *as_chat = NULL;
    if (route == R_THUDM && !(as_chat = srv_thudm_request(body, n, &thudm_history, &thudm_prompt, &e)))
        return send_error(conn, e.status, e.msg, e.type, e.param, e.code);
    int bad = srv_parse_request(S, chat, as_chat ? as_chat : body, as_chat ? strlen(as_chat) : n, &q, &e);
    free(as_chat);
    if (bad) {
        cJSON_Delete(thudm_history);
        free(thudm_prompt);
        return send_error(conn, e.status, e.msg, e.type, e.param, e.code);
    }
    char msg[200];
    if (too_many_choices(S, &q, msg, sizeof msg)) {
        srv_api_req_free(&q);
        cJSON_Delete(thudm_history);
        free(thudm_prompt);
        return send_error(conn, 400, msg, "invalid_request_error", "prompt", "too_many_choices");
    }
    int stream = q.stream;
    srv_response *g = srv_response_new(S, &q, conn_fd(conn), thudm_history, thudm_prompt); /* takes q */
    int st = srv_response_submit(g, S->e);
    if (st) {
        srv_response_free(g);
        return busy(conn, st);
    }
    struct MHD_Response *resp = mhd.create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_cb, g, free_cb);
    if (!resp) { srv_response_free(g); return MHD_NO; }
    mhd.add_response_header(resp, "Content-Type", stream ? "text/event-stream" : "application/json");
    if (stream) mhd.add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = mhd.queue_response(conn, 200, resp);
    mhd.destroy_response(resp);
    return rc;
}

/* A score request: queued, waited for (this connection's own thread), answered whole. A client
 * that goes away cancels what is left of it. */
static enum MHD_Result score(srv_server *S, struct MHD_Connection *conn, const char *body, size_t n) {
    api_req q = {0};
    api_err e = {0};
    if (srv_parse_score(S, body, n, &q, &e)) return send_error(conn, e.status, e.msg, e.type, e.param, e.code);
    srv_req *r = q.r;
    int st = srv_engine_submit(S->e, r);
    if (st) {
        srv_req_put(r);
        return busy(conn, st);
    }
    srv_wait_done(r, conn_fd(conn));
    pthread_mutex_lock(&r->mu);
    int ok = !strcmp(r->finish, "stop");
    char msg[600];
    snprintf(msg, sizeof msg, "%s", r->error[0] ? r->error : "the request was cancelled");
    const char *why = r->finish;
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result rc = ok ? send_json(conn, 200, srv_score_answer(&q)) : send_error(conn, 500, msg, "server_error", NULL, why);
    srv_req_put(r);
    return rc;
}

static enum MHD_Result models(srv_server *S, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateObject(), *d;
    cJSON_AddStringToObject(o, "object", "list");
    d = cJSON_AddArrayToObject(o, "data");
    for (int k = -1; k < S->e->n_ad; k++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", k < 0 ? S->o.model_name : S->e->ad[k].name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)S->created);
        cJSON_AddStringToObject(m, "owned_by", "glmtrain");
        cJSON_AddStringToObject(m, "root", k < 0 ? S->o.model_name : S->e->ad[k].dir);
        if (k >= 0) cJSON_AddStringToObject(m, "parent", S->o.model_name);
        else cJSON_AddNullToObject(m, "parent");
        cJSON_AddNumberToObject(m, "max_model_len", S->o.Tmax);
        cJSON_AddItemToArray(d, m);
    }
    return send_json(conn, 200, o);
}

static enum MHD_Result health(srv_server *S, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&S->e->mu);
    int active = S->e->active, queued = S->e->qlen;
    long steps = S->e->steps, tokens = S->e->tokens, served = S->e->served, peak = S->e->peak;
    double busy = S->e->busy_s, fwd = S->e->forward_s, text = S->e->text_s;
    pthread_mutex_unlock(&S->e->mu);
    cJSON_AddStringToObject(o, "status", S->draining ? "draining" : "ok");
    cJSON_AddNumberToObject(o, "running", active);
    cJSON_AddNumberToObject(o, "queued", queued);
    cJSON_AddNumberToObject(o, "slots", S->e->nslots);
    cJSON_AddNumberToObject(o, "steps", (double)steps);
    cJSON_AddNumberToObject(o, "tokens", (double)tokens);
    cJSON_AddNumberToObject(o, "served", (double)served);
    cJSON_AddNumberToObject(o, "peak_running", (double)peak);
    cJSON_AddNumberToObject(o, "step_seconds", busy);    /* the engine's time in steps so far */
    cJSON_AddNumberToObject(o, "forward_seconds", fwd);  /* of which in the model's forwards */
    cJSON_AddNumberToObject(o, "text_seconds", text);    /* and in decoding tokens to text */
    return send_json(conn, S->draining ? 503 : 200, o);
}

/* Prometheus's scrape (serve/metrics.h): the engine's counters and gauges read at once. */
static enum MHD_Result metrics(srv_server *S, struct MHD_Connection *conn) {
    srv_engine *e = S->e;
    pthread_mutex_lock(&e->mu);
    srv_metrics m = e->metrics;
    srv_gauges g = {.running = e->active, .waiting = e->qlen, .slots = e->nslots, .peak = e->peak, .steps = e->steps,
                    .step_s = e->busy_s, .forward_s = e->forward_s};
    pthread_mutex_unlock(&e->mu);
    char *t = srv_metrics_text(&m, &g, S->o.model_name);
    enum MHD_Result rc = send_buf(conn, 200, "text/plain; version=0.0.4; charset=utf-8", t, strlen(t), 0);
    free(t);
    return rc;
}

/* ---------------------------------------------------------------- routing */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv_server *S = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (!cs) { /* the headers: route, key, size */
        cs = glm_calloc(1, sizeof *cs);
        *con_cls = cs;
        int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
        const char *path = url;
        struct { const char *p; int route, post; } routes[] = {
            {"/health", R_HEALTH, 0}, {"/metrics", R_METRICS, 0}, {"/", R_PAGE, 0}, {"/", R_THUDM, 1}, {"/index.html", R_PAGE, 0},
            {"/v1/models", R_MODELS, 0}, {"/v1/chat/completions", R_CHAT, 1}, {"/v1/completions", R_COMPLETIONS, 1},
            {"/v1/score/evaluation", R_SCORE, 1}, {"/tokenize", R_TOKENIZE, 1}, {"/detokenize", R_DETOKENIZE, 1},
            {"/tokenizer_info", R_TOKINFO, 0}};
        int found = 0, wrong = -1; /* wrong: a route of the path the method does not fit */
        for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
            if (strcmp(path, routes[i].p)) continue;
            found = 1;
            if (routes[i].post ? post : get) cs->route = routes[i].route;
            else wrong = (int)i;
        }
        if (found && !cs->route) {
            cs->early_status = 405;
            snprintf(cs->early_msg, sizeof cs->early_msg, "%s %s: method not allowed (use %s)", method, path,
                     routes[wrong].post ? "POST" : "GET");
            cs->early_type = "invalid_request_error";
            cs->early_code = "method_not_allowed";
        }
        if (!found) {
            cs->early_status = 404;
            snprintf(cs->early_msg, sizeof cs->early_msg, "%.100s %.150s: no such endpoint (POST /v1/chat/completions, POST /v1/completions, POST /v1/score/evaluation, GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize, GET /tokenizer_info, POST / as THUDM's api.py)", method, path);
            cs->early_type = "invalid_request_error";
            cs->early_code = "not_found";
        }
        /* every endpoint but /health (and the page's static HTML) needs the key */
        if (S->o.api_key && S->o.api_key[0] && cs->route != R_HEALTH && cs->route != R_PAGE) {
            const char *h = mhd.lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
            if (!key_ok(h, S->o.api_key)) {
                cs->early_status = 401;
                snprintf(cs->early_msg, sizeof cs->early_msg, "%s", h ? "Incorrect API key provided" :
                         "You didn't provide an API key: send the header Authorization: Bearer KEY");
                cs->early_type = "invalid_request_error";
                cs->early_code = "invalid_api_key";
            }
        }
        const char *cl = mhd.lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            unsigned long long len = strtoull(cl, NULL, 10);
            if (len > S->o.max_body) cs->too_large = 1;
            if (len > DISCARD_CAP) /* not worth reading: answer now, the connection closes */
                return send_error(conn, 413, "the request body is too large", "invalid_request_error", NULL, "request_too_large");
        }
        return MHD_YES;
    }
    if (*upload_size) { /* the body, piece by piece */
        size_t k = *upload_size;
        *upload_size = 0;
        if (cs->too_large || cs->n + k > S->o.max_body) {
            cs->too_large = 1;
            cs->n += k; /* counted, dropped */
            free(cs->body);
            cs->body = NULL;
            cs->cap = 0;
            if (cs->n > DISCARD_CAP)
                return send_error(conn, 413, "the request body is too large", "invalid_request_error", NULL, "request_too_large");
            return MHD_YES;
        }
        if (cs->n + k + 1 > cs->cap) cs->body = glm_realloc(cs->body, cs->cap = (cs->n + k + 1) * 2);
        memcpy(cs->body + cs->n, upload, k);
        cs->n += k;
        cs->body[cs->n] = 0;
        return MHD_YES;
    }
    if (cs->early_status) return send_error(conn, (unsigned)cs->early_status, cs->early_msg, cs->early_type, cs->early_param, cs->early_code);
    if (cs->too_large) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is %zu bytes; this server takes at most %zu (--max_body_bytes)", cs->n, S->o.max_body);
        return send_error(conn, 413, msg, "invalid_request_error", NULL, "request_too_large");
    }
    switch (cs->route) {
    case R_HEALTH: return health(S, conn);
    case R_METRICS: return metrics(S, conn);
    case R_PAGE: return send_buf(conn, 200, "text/html; charset=utf-8", srv_chat_page, strlen(srv_chat_page), 0);
    case R_MODELS: return models(S, conn);
    case R_CHAT:
    case R_COMPLETIONS:
    case R_THUDM:
        if (S->draining) return send_error(conn, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
        return completion(S, conn, cs->route, cs->body ? cs->body : "", cs->n);
    case R_SCORE:
        if (S->draining) return send_error(conn, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
        return score(S, conn, cs->body ? cs->body : "", cs->n);
    case R_TOKENIZE:
    case R_DETOKENIZE: {
        api_err e = {0};
        cJSON *a = cs->route == R_TOKENIZE ? srv_tokenize(S, cs->body ? cs->body : "", cs->n, &e)
                                           : srv_detokenize(S, cs->body ? cs->body : "", cs->n, &e);
        return a ? send_json(conn, 200, a) : send_error(conn, e.status, e.msg, e.type, e.param, e.code);
    }
    case R_TOKINFO: return send_json(conn, 200, srv_tokenizer_info(S));
    default: return send_error(conn, 404, "not found", "invalid_request_error", NULL, "not_found");
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls; (void)conn; (void)why;
    conn_state *cs = *con_cls;
    if (!cs) return;
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

/* ---------------------------------------------------------------- life */

int srv_server_start(srv_server *s, const srv_options *o, srv_engine *e, const glm_tokenizer *tok,
                     const glm_config *cfg, pthread_mutex_t *tok_mu, glm_err *err) {
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->e = e;
    s->tok = tok;
    s->cfg = cfg;
    s->tok_mu = tok_mu;
    s->created = (long)time(NULL);
    glm_err enc_err = {0}; /* a tokenizer without ChatGLM's specials: score requests take texts only */
    s->has_enc = glm_encoder_from_tokenizer(&s->enc, tok, NULL, &enc_err) == 0;
    if (mhd_open(err)) return -1;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *host = o->host && o->host[0] ? o->host : "127.0.0.1";
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else if (!strcmp(host, "localhost")) {
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a4->sin_port = htons((uint16_t)o->port);
    } else {
        glm_fail(err, "--host %s: not an IPv4 or IPv6 address", host);
        return glm_hint(err, "127.0.0.1 (this machine only, the default), 0.0.0.0 (every interface) or ::1");
    }
    s->d = mhd.start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)o->timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned int)o->max_connections,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d) {
        glm_fail(err, "cannot listen on %s port %d: %s", host, o->port, strerror(errno));
        return glm_hint(err, "is another server on that port? pick another with --port (0: any free port)");
    }
    const union MHD_DaemonInfo *di = mhd.get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    return 0;
}

void srv_server_quiesce(srv_server *s) {
    s->draining = 1;
    if (!s->d) return;
    MHD_socket fd = mhd.quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_server_stop(srv_server *s) {
    if (s->d) mhd.stop_daemon(s->d);
    s->d = NULL;
}
