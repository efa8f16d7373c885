/* OpenAI-compatible HTTP endpoints over libmicrohttpd (serve/server.h). */
#include "serve/server.h"
#include "data/thought.h"
#include "serve/api.h"
#include <arpa/inet.h>
#include <dlfcn.h>
#include <cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "core/log.h"
#include "infer/tools.h"

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

enum { R_NONE, R_HEALTH, R_PAGE, R_MODELS, R_CHAT, R_COMPLETIONS, R_THUDM, R_SCORE, R_TOKENIZE, R_DETOKENIZE, R_TOKINFO };

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

/* Whether the peer has closed its side (or the socket broke). */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return 0;
}

/* ---------------------------------------------------------------- requests -> engine */

/* ---------------------------------------------------------------- responses */

/* Waits (r->mu held) for news of r, 50 ms at most, so the waiter can look at its peer between. */
static struct timespec slice_end(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    return ts;
}
static void wait_slice(srv_req *r) {
    struct timespec ts = slice_end();
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* Response bytes formatted, not yet handed to MHD (s[off, n) are left). */
typedef struct out_buf {
    char *s;
    size_t n, off;
} out_buf;

static void out_add(out_buf *b, const char *s, size_t n) {
    b->s = glm_realloc(b->s, b->n + n + 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* Up to max of b's bytes into buf: how many (0: none left). */
static size_t out_take(out_buf *b, char *buf, size_t max) {
    size_t k = b->n - b->off < max ? b->n - b->off : max;
    memcpy(buf, b->s + b->off, k);
    b->off += k;
    if (b->off == b->n) b->off = b->n = 0;
    return k;
}

/* One choice's response: its request, what of it went out, its chunks not yet sent. */
typedef struct stream_ctx {
    srv_server *S;
    srv_req *r;
    int fd;
    int chat, stream, include_usage;
    int index;                 /* the choice's index in its answer */
    int phase;                 /* 0: first chunk not sent, 1: streaming, 2: ended */
    size_t sent;               /* bytes of r->text sent */
    size_t seen;               /* bytes of r->text looked at (sent, or held back) */
    out_buf out;
    char id[64], model[256];
    long created;
    srv_tools tools;           /* a chat request's tools: its answer may be a call */
    int holding;               /* streamed text held back while it may still begin a call */
    int think;                 /* --template glmz1: the response's thought goes out as reasoning_content */
    size_t sent_thought, sent_answer; /* with think: the bytes of each part streamed */
    srv_logprob *lp_pend;      /* with logprobs: the tokens' entries the next chunk carries */
    int n_lp_pend, lp_taken;   /* (copied from r->lps[lp_taken - n_lp_pend, lp_taken)) */
    int echo_sent, plps_taken; /* echo: the prompt's text went out; its tokens' entries were taken */
    long lp_offset;            /* completions' text_offset: characters sent before */
    cJSON *thudm_history;      /* THUDM api.py's request: its history and prompt, for its */
    char *thudm_prompt;        /* answer (srv_thudm_answer); NULL otherwise */
} stream_ctx;

/* lps[0..k) appended to the entries the next chunk carries. */
static void pend_lps(stream_ctx *c, const srv_logprob *lps, int k) {
    c->lp_pend = glm_realloc(c->lp_pend, sizeof *c->lp_pend * (size_t)(c->n_lp_pend + k));
    memcpy(c->lp_pend + c->n_lp_pend, lps, sizeof *c->lp_pend * (size_t)k);
    c->n_lp_pend += k;
}
/* With logprobs, the entries of the tokens up to n_out not yet taken into lp_pend, after an
 * echoed prompt's (r->mu held, or the request done). */
static void take_lps(stream_ctx *c) {
    srv_req *r = c->r;
    if (r->prompt_logprobs && r->n_plps && !c->plps_taken) { /* echo: the prompt's tokens come first */
        pend_lps(c, r->plps, r->n_plps);
        c->plps_taken = 1;
    }
    if (!r->logprobs || r->n_out <= c->lp_taken) return;
    pend_lps(c, r->lps + c->lp_taken, r->n_out - c->lp_taken);
    c->lp_taken = r->n_out;
}

/* The choice's logprobs: the pending entries (then none are), or null without logprobs. */
static void add_logprobs(stream_ctx *c, cJSON *x) {
    if (!c->r->logprobs) { cJSON_AddNullToObject(x, "logprobs"); return; }
    cJSON_AddItemToObject(x, "logprobs", srv_logprobs_json(c->S->tok, c->lp_pend, c->n_lp_pend, c->r->top_logprobs, c->chat,
                                                           &c->lp_offset));
    c->n_lp_pend = 0;
}

static void pend_add(stream_ctx *c, const char *s, size_t n) { out_add(&c->out, s, n); }

static void pend_json(stream_ctx *c, cJSON *o, int sse) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (sse) pend_add(c, "data: ", 6);
    pend_add(c, s, strlen(s));
    if (sse) pend_add(c, "\n\n", 2);
    free(s);
}

static cJSON *usage_of(long prompt, long completion) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    return u;
}
static cJSON *usage(const srv_req *r) { return usage_of(r->prompt.n, r->n_out); }

static cJSON *head(stream_ctx *c, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->model);
    return o;
}

/* A completion's text t, after the prompt's text when echo asks for it and it has not gone out
 * (caller frees). */
static char *with_echo(stream_ctx *c, const char *t) {
    const char *p = c->r->echo && !c->echo_sent ? c->r->echo : "";
    c->echo_sent = 1;
    char *o = glm_malloc(strlen(p) + strlen(t) + 1);
    sprintf(o, "%s%s", p, t);
    return o;
}

/* One streamed chunk: a delta of text (delta != NULL) as the delta's `key` (content, or a
 * reasoning model's reasoning_content), or the last one with finish. */
static void chunk_as(stream_ctx *c, const char *key, const char *delta, size_t n, const char *finish, int role) {
    cJSON *o = head(c, c->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *x = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, x);
    cJSON_AddNumberToObject(x, "index", c->index);
    char *t = glm_malloc(n + 1);
    memcpy(t, delta ? delta : "", n);
    t[n] = 0;
    if (c->chat) {
        cJSON *d = cJSON_AddObjectToObject(x, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (delta) cJSON_AddStringToObject(d, key, t);
        if (c->r->logprobs && !role) add_logprobs(c, x);
    } else { /* echo: the prompt's text before the first text sent */
        char *et = with_echo(c, t);
        cJSON_AddStringToObject(x, "text", et);
        free(et);
        add_logprobs(c, x);
    }
    free(t);
    if (finish) cJSON_AddStringToObject(x, "finish_reason", finish);
    else cJSON_AddNullToObject(x, "finish_reason");
    pend_json(c, o, 1);
}
static void chunk(stream_ctx *c, const char *delta, size_t n, const char *finish, int role) {
    chunk_as(c, "content", delta, n, finish, role);
}

/* With think: what is new in the thought and in the answer of response s[0..n) (data/thought.h),
 * one chunk each. */
static void think_chunks(stream_ctx *c, const char *s, size_t n, int final) {
    glm_thought_parts p;
    glm_thought_split(s, n, final, &p);
    if (p.n_thought > c->sent_thought) {
        chunk_as(c, "reasoning_content", p.thought + c->sent_thought, p.n_thought - c->sent_thought, NULL, 0);
        c->sent_thought = p.n_thought;
    }
    if (p.n_answer > c->sent_answer) {
        chunk_as(c, "content", p.answer + c->sent_answer, p.n_answer - c->sent_answer, NULL, 0);
        c->sent_answer = p.n_answer;
    }
}

/* With think: response s's answer (caller frees), its thought into *thought (NULL: none). */
static char *think_parts(const char *s, char **thought) {
    glm_thought_parts p;
    glm_thought_split(s, strlen(s), 1, &p);
    *thought = p.n_thought ? glm_strndup(p.thought, p.n_thought) : NULL;
    return glm_strndup(p.answer ? p.answer : "", p.n_answer);
}

/* The response's whole text: a forced call's first line (in the prompt) + what was generated. */
static char *answer_text(const stream_ctx *c, const char *text) {
    const char *p = c->tools.on && c->tools.forced ? c->tools.forced : "";
    char *t = glm_malloc(strlen(p) + strlen(text) + 1);
    sprintf(t, "%s%s", p, text);
    return t;
}

/* A chat response that is a call of one of the request's tools (infer/tools.h):
 * OpenAI's tool_calls list of one (stream: with its index), or the older function_call object;
 * *finish becomes "tool_calls" / "function_call". NULL when the text is an answer. */
static cJSON *tool_call(stream_ctx *c, const char *text, const char **finish) {
    char *name, *args, *full = answer_text(c, text);
    int is_call = c->tools.on && (c->tools.glm4 ? glm4_tool_call_read(full, c->tools.names, c->tools.n_names, &name, &args)
                                                : glm_tool_call_read(full, &name, &args));
    free(full);
    if (!is_call) return NULL;
    cJSON *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", args);
    free(name);
    free(args);
    *finish = c->tools.legacy ? "function_call" : "tool_calls";
    if (c->tools.legacy) return fn;
    cJSON *list = cJSON_CreateArray(), *call = cJSON_CreateObject();
    if (c->stream) cJSON_AddNumberToObject(call, "index", 0);
    char id[80];
    snprintf(id, sizeof id, "call_%s", c->id);
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    cJSON_AddItemToObject(call, "function", fn);
    cJSON_AddItemToArray(list, call);
    return list;
}

/* A streamed tool call: one chunk whose delta holds it. */
static void call_chunk(stream_ctx *c, cJSON *call) {
    cJSON *o = head(c, "chat.completion.chunk");
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *x = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, x);
    cJSON_AddNumberToObject(x, "index", c->index);
    cJSON *d = cJSON_AddObjectToObject(x, "delta");
    cJSON_AddItemToObject(d, c->tools.legacy ? "function_call" : "tool_calls", call);
    if (c->r->logprobs) add_logprobs(c, x);
    cJSON_AddNullToObject(x, "finish_reason");
    pend_json(c, o, 1);
}

static cJSON *choice(stream_ctx *c, int index);

/* The whole (non-streamed) response. */
static void whole(stream_ctx *c) {
    srv_req *r = c->r;
    if (strcmp(r->finish, "stop") && strcmp(r->finish, "length")) {
        pend_json(c, srv_error_body(r->error[0] ? r->error : "the request was cancelled", "server_error", NULL, r->finish), 0);
        return;
    }
    if (c->thudm_prompt) { /* api.py's answer */
        pend_json(c, srv_thudm_answer(c->thudm_history, c->thudm_prompt, r->final), 0);
        return;
    }
    cJSON *o = head(c, c->chat ? "chat.completion" : "text_completion");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), choice(c, 0));
    cJSON_AddItemToObject(o, "usage", usage(r));
    pend_json(c, o, 0);
}

/* A finished request's choice (not streamed). */
static cJSON *choice(stream_ctx *c, int index) {
    srv_req *r = c->r;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "index", index);
    const char *finish = r->finish;
    if (c->chat) {
        cJSON *m = cJSON_AddObjectToObject(x, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        char *thought = NULL, *answer = c->think ? think_parts(r->final, &thought) : glm_strdup(r->final);
        if (thought) cJSON_AddStringToObject(m, "reasoning_content", thought);
        cJSON *call = tool_call(c, answer, &finish);
        if (call) {
            cJSON_AddNullToObject(m, "content");
            cJSON_AddItemToObject(m, c->tools.legacy ? "function_call" : "tool_calls", call);
        } else { /* a forced call the model did not finish as one: its text as the answer */
            char *t = answer_text(c, answer);
            cJSON_AddStringToObject(m, "content", t);
            free(t);
        }
        free(thought);
        free(answer);
    } else {
        char *et = with_echo(c, r->final);
        cJSON_AddStringToObject(x, "text", et);
        free(et);
    }
    take_lps(c); /* done: every token's entry */
    add_logprobs(c, x);
    cJSON_AddStringToObject(x, "finish_reason", finish);
    return x;
}

/* Streams what is new in c's request: the text released since the last look as chunks with its
 * tokens' log-probabilities (held back whole while it may still begin a tool call). 1 when there
 * was new text. */
static int stream_text(stream_ctx *c) {
    srv_req *r = c->r;
    pthread_mutex_lock(&r->mu);
    size_t n = r->text.n;
    char *text = NULL;
    int news = n > c->seen;
    if (news) {
        /* a response that may still begin a call of one of the tools is held back whole (with
         * a thought before it: any response to a request with tools) */
        c->holding = c->chat && c->sent == 0 &&
                     (c->think ? c->tools.on : (c->tools.on && c->tools.forced) || srv_tools_may_call(&c->tools, r->text.s, n));
        if (!c->holding) { /* with think: all of it, whose parts say what is new in each */
            text = glm_strndup(r->text.s + c->sent, n - c->sent);
            take_lps(c); /* the tokens decoded so far travel with this text */
        }
        c->seen = n;
    }
    pthread_mutex_unlock(&r->mu);
    if (text && c->think) { /* c->sent stays 0: text is the whole response so far */
        think_chunks(c, text, n, 0);
    } else if (text) {
        chunk(c, text, n - c->sent, NULL, 0);
        c->sent = n;
    }
    free(text);
    return news;
}

/* The last chunks of c's finished request, once its text has all been looked at (stream_text
 * after r->done was seen): what was held back (a thought, a tool call or the answer) and the chunk
 * with finish_reason; or, when it failed or was cancelled, an error event, and -1. */
static int stream_end(stream_ctx *c) {
    srv_req *r = c->r;
    if (strcmp(r->finish, "stop") && strcmp(r->finish, "length")) {
        pend_json(c, srv_error_body(r->error[0] ? r->error : "the request was cancelled", "server_error", NULL, r->finish), 1);
        return -1;
    }
    const char *finish = r->finish;
    take_lps(c); /* done: the rest of the entries go with the last chunks */
    char *thought = NULL, *answer = NULL;
    if (c->think && c->holding) { /* its thought first, then the call or the answer */
        answer = think_parts(r->final, &thought);
        if (thought) chunk_as(c, "reasoning_content", thought, strlen(thought), NULL, 0);
    } else if (c->think) { /* what the stream held back while it might be a tag */
        think_chunks(c, r->final, strlen(r->final), 1);
    }
    const char *resp = answer ? answer : r->final;
    cJSON *call = c->holding ? tool_call(c, resp, &finish) : NULL;
    if (call) call_chunk(c, call);
    else if (c->holding) { /* held, not a call after all */
        char *t = answer_text(c, resp);
        if (t[0]) chunk(c, t, strlen(t), NULL, 0);
        free(t);
    }
    free(thought);
    free(answer);
    chunk(c, NULL, 0, finish, 0);
    return 0;
}

/* A stream's usage chunk (stream_options.include_usage): no choices, the usage u. */
static void usage_chunk(stream_ctx *c, cJSON *u) {
    cJSON *o = head(c, c->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", u);
    pend_json(c, o, 1);
}

/* The seconds between keep-alive bytes while a response waits. */
static double keepalive_interval(const srv_server *S) { return S->o.timeout_s > 3 ? 1.0 : S->o.timeout_s / 3.0; }

/* MHD's content reader: waits for the engine's text (a keep-alive byte or SSE comment every
 * interval, so the idle timeout never cuts a waiting response), drops the request when the
 * client has gone. */
static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *c = cls;
    srv_req *r = c->r;
    (void)pos;
    for (;;) {
        if (c->out.n) return (ssize_t)out_take(&c->out, buf, max);
        if (c->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (c->stream && c->phase == 0) { /* the assistant role first, as OpenAI sends it */
            if (c->chat) chunk(c, "", 0, NULL, 1);
            c->phase = 1;
            continue;
        }
        /* wait for news: slices of 50 ms, checking the peer */
        double interval = keepalive_interval(c->S), waited = 0;
        pthread_mutex_lock(&r->mu);
        /* a whole answer waits for the end only: its text is not news (a keep-alive byte a interval) */
        while (!r->done && (!c->stream || r->text.n == c->seen) && waited < interval) {
            pthread_mutex_unlock(&r->mu);
            if (peer_gone(c->fd)) {
                atomic_store(&r->cancel, 1);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            pthread_mutex_lock(&r->mu);
            wait_slice(r);
            waited += 0.05;
        }
        int done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (c->stream && stream_text(c)) continue; /* all the text goes out before the end */
        if (!done) { /* keep-alive */
            if (c->stream) pend_add(c, ": keep-alive\n\n", 14);
            else pend_add(c, " ", 1);
            continue;
        }
        if (!c->stream) {
            whole(c);
        } else {
            if (stream_end(c) == 0 && c->include_usage) usage_chunk(c, usage(r));
            pend_add(c, "data: [DONE]\n\n", 14);
        }
        c->phase = 2;
    }
}

static void free_cb(void *cls) {
    stream_ctx *c = cls;
    pthread_mutex_lock(&c->r->mu);
    int done = c->r->done;
    pthread_mutex_unlock(&c->r->mu);
    if (!done) atomic_store(&c->r->cancel, 1); /* the connection ended first */
    srv_req_put(c->r);
    srv_tools_free(&c->tools);
    free(c->lp_pend);
    cJSON_Delete(c->thudm_history);
    free(c->thudm_prompt);
    free(c->out.s);
    free(c);
}

/* Whether a response's thought goes out as reasoning_content: a reasoning model's chat answer
 * (not THUDM api.py's, nor a forced call's rest). */
static int thinks(const srv_server *S, int chat, const srv_tools *t, int thudm) {
    return chat && S->o.reasoning && !thudm && !(t->on && t->forced);
}

/* srv_engine_submit's refusal st (429 or 503) as OpenAI's error. */
static enum MHD_Result busy(struct MHD_Connection *conn, int st) {
    return st == 429 ? send_error(conn, 429, "the request queue is full: try again later", "rate_limit_error", NULL, "queue_full")
                     : send_error(conn, 503, "the server is shutting down", "server_error", NULL, "shutting_down");
}

/* Waits on this connection's thread until the engine is done with r; a client that goes away
 * (fd) cancels it, which the engine ends at its next step. */
static void wait_done(srv_req *r, int fd) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        pthread_mutex_unlock(&r->mu);
        if (peer_gone(fd)) atomic_store(&r->cancel, 1);
        pthread_mutex_lock(&r->mu);
        if (!r->done) wait_slice(r);
    }
    pthread_mutex_unlock(&r->mu);
}

static int conn_fd(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void new_id(char *id, size_t cap, const char *kind, long created) {
    static atomic_ulong seq;
    snprintf(id, cap, "%s-%lx%06lx", kind, (unsigned long)created, (unsigned long)atomic_fetch_add(&seq, 1) & 0xffffff);
}

/* The contexts of q's choices (q->batch), one answer's: its id, choice i at index i. They share
 * q's tools (q frees them) and borrow q's references. */
static stream_ctx *choice_ctxs(srv_server *S, const api_req *q, int fd) {
    stream_ctx *cs = glm_calloc((size_t)q->n_batch, sizeof *cs);
    long created = (long)time(NULL);
    char id[64];
    new_id(id, sizeof id, q->chat ? "chatcmpl" : "cmpl", created);
    for (int i = 0; i < q->n_batch; i++) {
        cs[i] = (stream_ctx){.S = S, .r = q->batch[i], .fd = fd, .created = created, .chat = q->chat, .stream = q->stream,
                             .index = i, .tools = q->tools, .think = thinks(S, q->chat, &q->tools, 0)};
        snprintf(cs[i].id, sizeof cs[i].id, "%s", id);
        snprintf(cs[i].model, sizeof cs[i].model, "%s", q->model);
    }
    return cs;
}

/* The usage of q's finished choices: each prompt counted once for its n choices. */
static cJSON *choices_usage(const api_req *q) {
    long pt = 0, ct = 0;
    for (int i = 0; i < q->n_batch; i++) {
        if (i % q->n_choices == 0) pt += q->batch[i]->prompt.n;
        ct += q->batch[i]->n_out;
    }
    return usage_of(pt, ct);
}

static void free_choice_ctxs(stream_ctx *cs, int k) {
    for (int i = 0; cs && i < k; i++) {
        free(cs[i].lp_pend);
        free(cs[i].out.s);
    }
    free(cs);
}

/* The 400 for more choices than the server ever holds at once (NULL when they fit). */
static const char *too_many_choices(srv_server *S, const api_req *q, char *msg, size_t cap) {
    if (q->n_batch <= srv_engine_capacity(S->e)) return NULL;
    snprintf(msg, cap, "%d choices in one request; this server queues at most %d requests at once "
             "(--max_batch_size + --max_queue): send fewer prompts or a smaller n", q->n_batch, srv_engine_capacity(S->e));
    return msg;
}

/* A completion of several choices (a list of prompts, or n > 1), not streamed: each queued as
 * its own request, all waited for on this connection's thread, answered whole with a choice each
 * (index: its place in q->batch) and their usage summed. One that fails fails the whole answer. */
static enum MHD_Result batch_completion(srv_server *S, struct MHD_Connection *conn, api_req *q) {
    int k = q->n_batch, fd = conn_fd(conn);
    char msg[200];
    if (too_many_choices(S, q, msg, sizeof msg)) {
        srv_api_req_free(q);
        return send_error(conn, 400, msg, "invalid_request_error", "prompt", "too_many_choices");
    }
    int st = srv_engine_submit_all(S->e, q->batch, k);
    if (st) {
        srv_api_req_free(q);
        return busy(conn, st);
    }
    for (int i = 0; i < k; i++) wait_done(q->batch[i], fd);
    stream_ctx *cs = choice_ctxs(S, q, fd);
    const srv_req *failed = NULL;
    for (int i = 0; i < k && !failed; i++)
        if (strcmp(q->batch[i]->finish, "stop") && strcmp(q->batch[i]->finish, "length")) failed = q->batch[i];
    enum MHD_Result rc;
    if (failed) {
        rc = send_error(conn, 500, failed->error[0] ? failed->error : "the request was cancelled", "server_error", NULL,
                        failed->finish);
    } else {
        cJSON *o = head(&cs[0], q->chat ? "chat.completion" : "text_completion"), *ch = cJSON_AddArrayToObject(o, "choices");
        for (int i = 0; i < k; i++) cJSON_AddItemToArray(ch, choice(&cs[i], i));
        cJSON_AddItemToObject(o, "usage", choices_usage(q));
        rc = send_json(conn, 200, o);
    }
    free_choice_ctxs(cs, k);
    srv_api_req_free(q);
    return rc;
}

/* A streamed answer of several choices: each choice its own request and context (its index),
 * their chunks in one stream as they come, each choice ending with its finish_reason chunk, then
 * the usage of all (include_usage) and [DONE]. The requests ring one waker. A choice that fails
 * ends the stream with an error event and cancels the others. */
typedef struct group_ctx {
    srv_server *S;
    api_req q;                 /* the choices' requests (its references) and tools */
    stream_ctx *cs;            /* [q.n_batch] */
    int *ended;                /* [q.n_batch] 1: the choice's last chunk is out */
    srv_waker *w;              /* one reference, the group's */
    int fd, phase;             /* phase: 0 roles not sent, 1 streaming, 2 ended */
    out_buf out;
} group_ctx;

/* Whether a choice still running has news (new text, or its end); the waker's count first, so
 * a ring after this look is not missed. */
static int group_news(group_ctx *g, unsigned long *rings) {
    pthread_mutex_lock(&g->w->mu);
    *rings = g->w->rings;
    pthread_mutex_unlock(&g->w->mu);
    for (int i = 0; i < g->q.n_batch; i++) {
        if (g->ended[i]) continue;
        srv_req *r = g->cs[i].r;
        pthread_mutex_lock(&r->mu);
        int news = r->done || r->text.n > g->cs[i].seen;
        pthread_mutex_unlock(&r->mu);
        if (news) return 1;
    }
    return 0;
}

static void group_cancel(group_ctx *g) {
    for (int i = 0; i < g->q.n_batch; i++) atomic_store(&g->q.batch[i]->cancel, 1);
}

/* The choices' chunks into the group's stream, in the order of their indices. */
static void group_move(group_ctx *g) {
    for (int i = 0; i < g->q.n_batch; i++) {
        out_add(&g->out, g->cs[i].out.s ? g->cs[i].out.s : "", g->cs[i].out.n);
        g->cs[i].out.n = 0;
    }
}

static ssize_t group_read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    group_ctx *g = cls;
    int k = g->q.n_batch;
    (void)pos;
    for (;;) {
        if (g->out.n) return (ssize_t)out_take(&g->out, buf, max);
        if (g->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->phase == 0) { /* each choice's assistant role first, as OpenAI sends them */
            for (int i = 0; g->q.chat && i < k; i++) chunk(&g->cs[i], "", 0, NULL, 1);
            g->phase = 1;
        } else {
            double interval = keepalive_interval(g->S), waited = 0;
            unsigned long rings;
            int news;
            while (!(news = group_news(g, &rings)) && waited < interval) {
                if (peer_gone(g->fd)) {
                    group_cancel(g);
                    return MHD_CONTENT_READER_END_WITH_ERROR;
                }
                struct timespec ts = slice_end();
                pthread_mutex_lock(&g->w->mu);
                if (g->w->rings == rings) pthread_cond_timedwait(&g->w->cv, &g->w->mu, &ts);
                pthread_mutex_unlock(&g->w->mu);
                waited += 0.05;
            }
            if (!news) { /* keep-alive */
                out_add(&g->out, ": keep-alive\n\n", 14);
                continue;
            }
            int left = 0, failed = 0;
            for (int i = 0; i < k && !failed; i++) {
                if (g->ended[i]) continue;
                stream_ctx *c = &g->cs[i];
                pthread_mutex_lock(&c->r->mu);
                int done = c->r->done; /* before the text: all of a done request's text is released */
                pthread_mutex_unlock(&c->r->mu);
                stream_text(c);
                if (done) {
                    failed = stream_end(c) < 0;
                    g->ended[i] = 1;
                } else {
                    left++;
                }
            }
            group_move(g);
            if (failed) group_cancel(g);
            else if (!left && g->cs[0].include_usage) usage_chunk(&g->cs[0], choices_usage(&g->q));
            if (failed || !left) {
                out_add(&g->cs[0].out, "data: [DONE]\n\n", 14);
                g->phase = 2;
            }
        }
        group_move(g);
    }
}

static void group_free_cb(void *cls) {
    group_ctx *g = cls;
    group_cancel(g); /* those still running: the connection ended first */
    free_choice_ctxs(g->cs, g->q.n_batch);
    free(g->ended);
    srv_waker_put(g->w);
    srv_api_req_free(&g->q);
    free(g->out.s);
    free(g);
}

static enum MHD_Result stream_group(srv_server *S, struct MHD_Connection *conn, api_req *q) {
    char msg[200];
    if (too_many_choices(S, q, msg, sizeof msg)) {
        srv_api_req_free(q);
        return send_error(conn, 400, msg, "invalid_request_error", "prompt", "too_many_choices");
    }
    group_ctx *g = glm_calloc(1, sizeof *g);
    g->S = S;
    g->q = *q;
    g->w = srv_waker_new();
    for (int i = 0; i < q->n_batch; i++) { /* before they reach the engine */
        g->w->refs++;
        q->batch[i]->waker = g->w;
    }
    int st = srv_engine_submit_all(S->e, q->batch, q->n_batch);
    if (st) {
        group_free_cb(g);
        return busy(conn, st);
    }
    g->fd = conn_fd(conn);
    g->cs = choice_ctxs(S, q, g->fd);
    g->cs[0].include_usage = q->include_usage;
    g->ended = glm_calloc((size_t)q->n_batch, sizeof *g->ended);
    struct MHD_Response *resp = mhd.create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, group_read_cb, g, group_free_cb);
    if (!resp) { group_free_cb(g); return MHD_NO; }
    mhd.add_response_header(resp, "Content-Type", "text/event-stream");
    mhd.add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = mhd.queue_response(conn, 200, resp);
    mhd.destroy_response(resp);
    return rc;
}

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
    if (q.n_batch > 1) return q.stream ? stream_group(S, conn, &q) : batch_completion(S, conn, &q);
    int st = srv_engine_submit(S->e, q.r);
    if (st) {
        srv_api_req_free(&q);
        cJSON_Delete(thudm_history);
        free(thudm_prompt);
        return busy(conn, st);
    }
    stream_ctx *c = glm_calloc(1, sizeof *c);
    c->S = S;
    c->r = q.r; /* the context holds q's reference now */
    free(q.batch);
    c->chat = chat;
    c->stream = q.stream;
    c->include_usage = q.include_usage;
    c->tools = q.tools; /* the context owns them now */
    c->thudm_history = thudm_history;
    c->thudm_prompt = thudm_prompt;
    c->think = thinks(S, chat, &c->tools, thudm_prompt != NULL);
    c->created = (long)time(NULL);
    snprintf(c->model, sizeof c->model, "%s", q.model);
    new_id(c->id, sizeof c->id, chat ? "chatcmpl" : "cmpl", c->created);
    c->fd = conn_fd(conn);
    struct MHD_Response *resp = mhd.create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, read_cb, c, free_cb);
    if (!resp) { free_cb(c); return MHD_NO; }
    mhd.add_response_header(resp, "Content-Type", q.stream ? "text/event-stream" : "application/json");
    if (q.stream) mhd.add_response_header(resp, "Cache-Control", "no-cache");
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
    wait_done(r, conn_fd(conn));
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
            {"/health", R_HEALTH, 0}, {"/", R_PAGE, 0}, {"/", R_THUDM, 1}, {"/index.html", R_PAGE, 0},
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
            snprintf(cs->early_msg, sizeof cs->early_msg, "%.100s %.150s: no such endpoint (POST /v1/chat/completions, POST /v1/completions, POST /v1/score/evaluation, GET /v1/models, GET /health, POST /tokenize, POST /detokenize, GET /tokenizer_info, POST / as THUDM's api.py)", method, path);
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
