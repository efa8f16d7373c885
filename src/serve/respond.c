/* A completion's response as bytes (serve/respond.h): each choice's text, log-probabilities,
 * thought and tool call as OpenAI's chunks or whole answer. */
#include "serve/respond.h"
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include "core/log.h"
#include "data/thought.h"
#include "infer/tools.h"

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

/* 50 ms from now: a waiter wakes at least that often to look at its client. */
static struct timespec slice_end(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    return ts;
}

/* Response bytes formatted, not yet handed over (s[off, n) are left). */
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
typedef struct choice_ctx {
    srv_server *S;
    srv_req *r;
    int chat, stream;
    int index;                 /* the choice's index in its answer */
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
} choice_ctx;

/* lps[0..k) appended to the entries the next chunk carries. */
static void pend_lps(choice_ctx *c, const srv_logprob *lps, int k) {
    c->lp_pend = glm_realloc(c->lp_pend, sizeof *c->lp_pend * (size_t)(c->n_lp_pend + k));
    memcpy(c->lp_pend + c->n_lp_pend, lps, sizeof *c->lp_pend * (size_t)k);
    c->n_lp_pend += k;
}
/* With logprobs, the entries of the tokens up to n_out not yet taken into lp_pend, after an
 * echoed prompt's (r->mu held, or the request done). */
static void take_lps(choice_ctx *c) {
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
static void add_logprobs(choice_ctx *c, cJSON *x) {
    if (!c->r->logprobs) { cJSON_AddNullToObject(x, "logprobs"); return; }
    cJSON_AddItemToObject(x, "logprobs", srv_logprobs_json(c->S->tok, c->lp_pend, c->n_lp_pend, c->r->top_logprobs, c->chat,
                                                           &c->lp_offset));
    c->n_lp_pend = 0;
}

static void pend_add(choice_ctx *c, const char *s, size_t n) { out_add(&c->out, s, n); }

static void pend_json(choice_ctx *c, cJSON *o, int sse) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (sse) pend_add(c, "data: ", 6);
    pend_add(c, s, strlen(s));
    if (sse) pend_add(c, "\n\n", 2);
    free(s);
}

/* OpenAI's usage: cached, the prompt tokens whose cache rows a slot held already (prefix caching) */
static cJSON *usage_of(long prompt, long completion, long cached) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static cJSON *head(choice_ctx *c, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->model);
    return o;
}

/* A completion's text t, after the prompt's text when echo asks for it and it has not gone out
 * (caller frees). */
static char *with_echo(choice_ctx *c, const char *t) {
    const char *p = c->r->echo && !c->echo_sent ? c->r->echo : "";
    c->echo_sent = 1;
    char *o = glm_malloc(strlen(p) + strlen(t) + 1);
    sprintf(o, "%s%s", p, t);
    return o;
}

/* One streamed chunk: a delta of text (delta != NULL) as the delta's `key` (content, or a
 * reasoning model's reasoning_content), or the last one with finish. */
static void chunk_as(choice_ctx *c, const char *key, const char *delta, size_t n, const char *finish, int role) {
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
static void chunk(choice_ctx *c, const char *delta, size_t n, const char *finish, int role) {
    chunk_as(c, "content", delta, n, finish, role);
}

/* With think: what is new in the thought and in the answer of response s[0..n) (data/thought.h),
 * one chunk each. */
static void think_chunks(choice_ctx *c, const char *s, size_t n, int final) {
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
static char *answer_text(const choice_ctx *c, const char *text) {
    const char *p = c->tools.on && c->tools.forced ? c->tools.forced : "";
    char *t = glm_malloc(strlen(p) + strlen(text) + 1);
    sprintf(t, "%s%s", p, text);
    return t;
}

/* A chat response that is a call of one of the request's tools (infer/tools.h):
 * OpenAI's tool_calls list of one (stream: with its index), or the older function_call object;
 * *finish becomes "tool_calls" / "function_call". NULL when the text is an answer. */
static cJSON *tool_call(choice_ctx *c, const char *text, const char **finish) {
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
static void call_chunk(choice_ctx *c, cJSON *call) {
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

/* A finished request's choice (not streamed). */
static cJSON *choice(choice_ctx *c, int index) {
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
 * tokens' log-probabilities (held back whole while it may still begin a tool call). */
static void stream_text(choice_ctx *c) {
    srv_req *r = c->r;
    pthread_mutex_lock(&r->mu);
    size_t n = r->text.n;
    char *text = NULL;
    if (n > c->seen) {
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
}

/* The last chunks of c's finished request, once its text has all been looked at (stream_text
 * after r->done was seen): what was held back (a thought, a tool call or the answer) and the chunk
 * with finish_reason; or, when it failed or was cancelled, an error event, and -1. */
static int stream_end(choice_ctx *c) {
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
static void usage_chunk(choice_ctx *c, cJSON *u) {
    cJSON *o = head(c, c->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", u);
    pend_json(c, o, 1);
}

/* The seconds between keep-alive bytes while a response waits (a third of the idle timeout). */
static double keepalive_interval(const srv_server *S) { return S->o.timeout_s > 3 ? 1.0 : S->o.timeout_s / 3.0; }

/* Whether a response's thought goes out as reasoning_content: a reasoning model's chat answer
 * (not THUDM api.py's, nor a forced call's rest). */
static int thinks(const srv_server *S, int chat, const srv_tools *t, int thudm) {
    return chat && S->o.reasoning && !thudm && !(t->on && t->forced);
}

void srv_wait_done(srv_req *r, int fd) {
    for (;;) {
        unsigned long rings = srv_waker_rings(r->waker);
        pthread_mutex_lock(&r->mu);
        int done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (done) return;
        if (peer_gone(fd)) atomic_store(&r->cancel, 1);
        struct timespec ts = slice_end();
        srv_waker_wait(r->waker, rings, &ts);
    }
}

static void new_id(char *id, size_t cap, const char *kind, long created) {
    static atomic_ulong seq;
    snprintf(id, cap, "%s-%lx%06lx", kind, (unsigned long)created, (unsigned long)atomic_fetch_add(&seq, 1) & 0xffffff);
}

/* The contexts of q's choices (q->batch), one answer's: its id, choice i at index i. They share
 * q's tools (q frees them) and borrow q's references. */
static choice_ctx *choice_ctxs(srv_server *S, const api_req *q, int thudm) {
    choice_ctx *cs = glm_calloc((size_t)q->n_batch, sizeof *cs);
    long created = (long)time(NULL);
    char id[64];
    new_id(id, sizeof id, q->chat ? "chatcmpl" : "cmpl", created);
    for (int i = 0; i < q->n_batch; i++) {
        cs[i] = (choice_ctx){.S = S, .r = q->batch[i], .created = created, .chat = q->chat, .stream = q->stream,
                             .index = i, .tools = q->tools, .think = thinks(S, q->chat, &q->tools, thudm)};
        snprintf(cs[i].id, sizeof cs[i].id, "%s", id);
        snprintf(cs[i].model, sizeof cs[i].model, "%s", q->model);
    }
    return cs;
}

/* The usage of q's finished choices: each prompt counted once for its n choices. */
static cJSON *choices_usage(const api_req *q) {
    long pt = 0, ct = 0, cached = 0;
    for (int i = 0; i < q->n_batch; i++) {
        if (i % q->n_choices == 0) pt += q->batch[i]->prompt.n;
        cached += q->batch[i]->cached; /* one choice of a prompt prefills it: the others copy its rows */
        ct += q->batch[i]->n_out;
    }
    return usage_of(pt, ct, cached);
}

static void free_choice_ctxs(choice_ctx *cs, int k) {
    for (int i = 0; cs && i < k; i++) {
        free(cs[i].lp_pend);
        free(cs[i].out.s);
    }
    free(cs);
}

/* ---------------------------------------------------------------- the response */

struct srv_response {
    srv_server *S;
    api_req q;                 /* the choices' requests (its references) and tools */
    choice_ctx *cs;            /* [q.n_batch] */
    int *ended;                /* [q.n_batch] 1: the choice's last chunk is out */
    srv_waker *w;              /* rung by every choice's request; one reference, the response's */
    int fd, phase;             /* phase: 0 nothing sent, 1 under way, 2 complete */
    cJSON *thudm_history;      /* THUDM api.py's request: its history and prompt, for its */
    char *thudm_prompt;        /* answer (srv_thudm_answer); NULL otherwise */
    out_buf out;
};

srv_response *srv_response_new(srv_server *S, api_req *q, int fd, cJSON *thudm_history, char *thudm_prompt) {
    srv_response *g = glm_calloc(1, sizeof *g);
    g->S = S;
    g->q = *q;
    *q = (api_req){0};
    g->fd = fd;
    g->thudm_history = thudm_history;
    g->thudm_prompt = thudm_prompt;
    g->w = srv_waker_new();
    for (int i = 0; i < g->q.n_batch; i++) { /* before they reach the engine: one waker for all */
        g->w->refs++;
        srv_waker_put(g->q.batch[i]->waker);
        g->q.batch[i]->waker = g->w;
    }
    g->cs = choice_ctxs(S, &g->q, thudm_prompt != NULL);
    g->ended = glm_calloc((size_t)g->q.n_batch, sizeof *g->ended);
    return g;
}

int srv_response_submit(srv_response *g, srv_engine *e) { return srv_engine_submit_all(e, g->q.batch, g->q.n_batch); }

void srv_response_free(srv_response *g) {
    for (int i = 0; i < g->q.n_batch; i++) atomic_store(&g->q.batch[i]->cancel, 1); /* those still running */
    free_choice_ctxs(g->cs, g->q.n_batch);
    free(g->ended);
    srv_waker_put(g->w);
    srv_api_req_free(&g->q);
    cJSON_Delete(g->thudm_history);
    free(g->thudm_prompt);
    free(g->out.s);
    free(g);
}

/* Whether there is news to answer: streamed, a choice still running has new text or has ended;
 * whole, every choice has ended. The waker's count is read first, so a ring after this look is
 * not missed. */
static int news(srv_response *g, unsigned long *rings) {
    *rings = srv_waker_rings(g->w);
    int all_done = 1;
    for (int i = 0; i < g->q.n_batch; i++) {
        if (g->ended[i]) continue;
        srv_req *r = g->cs[i].r;
        pthread_mutex_lock(&r->mu);
        int done = r->done, grew = r->text.n > g->cs[i].seen;
        pthread_mutex_unlock(&r->mu);
        if (g->q.stream && (done || grew)) return 1;
        all_done &= done;
    }
    return !g->q.stream && all_done;
}

/* Waits for news up to a keep-alive interval, in slices of 50 ms that look at the client: 1 with
 * news, 0 without, -1 when the client has gone. */
static int wait_news(srv_response *g) {
    double interval = keepalive_interval(g->S), waited = 0;
    unsigned long rings;
    while (!news(g, &rings)) {
        if (waited >= interval) return 0;
        if (peer_gone(g->fd)) return -1;
        struct timespec ts = slice_end();
        srv_waker_wait(g->w, rings, &ts);
        waited += 0.05;
    }
    return 1;
}

/* The whole answer once every choice is done: a choice each and their usage, THUDM api.py's
 * answer, or the error of the first choice that failed. */
static void whole(srv_response *g) {
    choice_ctx *c0 = &g->cs[0];
    for (int i = 0; i < g->q.n_batch; i++) {
        const srv_req *r = g->q.batch[i];
        if (strcmp(r->finish, "stop") && strcmp(r->finish, "length")) {
            pend_json(c0, srv_error_body(r->error[0] ? r->error : "the request was cancelled", "server_error", NULL, r->finish), 0);
            return;
        }
    }
    if (g->thudm_prompt) {
        pend_json(c0, srv_thudm_answer(g->thudm_history, g->thudm_prompt, c0->r->final), 0);
        return;
    }
    cJSON *o = head(c0, g->q.chat ? "chat.completion" : "text_completion"), *ch = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < g->q.n_batch; i++) cJSON_AddItemToArray(ch, choice(&g->cs[i], i));
    cJSON_AddItemToObject(o, "usage", choices_usage(&g->q));
    pend_json(c0, o, 0);
}

/* Streams what is new in each choice still running; a choice that ended sends its last chunks.
 * When all have ended (or one failed: the others are cancelled), the usage and [DONE]. */
static void stream_news(srv_response *g) {
    int left = 0, failed = 0;
    for (int i = 0; i < g->q.n_batch && !failed; i++) {
        if (g->ended[i]) continue;
        choice_ctx *c = &g->cs[i];
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
    if (failed)
        for (int i = 0; i < g->q.n_batch; i++) atomic_store(&g->q.batch[i]->cancel, 1);
    else if (!left && g->q.include_usage)
        usage_chunk(&g->cs[g->q.n_batch - 1], choices_usage(&g->q)); /* the last choice's chunks go out last */
    if (failed || !left) {
        out_add(&g->cs[g->q.n_batch - 1].out, "data: [DONE]\n\n", 14);
        g->phase = 2;
    }
}

ssize_t srv_response_read(srv_response *g, char *buf, size_t max) {
    int k = g->q.n_batch;
    for (;;) {
        if (g->out.n) return (ssize_t)out_take(&g->out, buf, max);
        if (g->phase == 2) return SRV_READ_END;
        if (g->phase == 0) { /* streamed chat: each choice's assistant role first, as OpenAI sends them */
            for (int i = 0; g->q.stream && g->q.chat && i < k; i++) chunk(&g->cs[i], "", 0, NULL, 1);
            g->phase = 1;
        } else {
            int w = wait_news(g);
            if (w < 0) {
                for (int i = 0; i < k; i++) atomic_store(&g->q.batch[i]->cancel, 1);
                return SRV_READ_GONE;
            }
            if (!w) { /* a keep-alive, so no idle timeout cuts a waiting response */
                out_add(&g->out, g->q.stream ? ": keep-alive\n\n" : " ", g->q.stream ? 14 : 1);
                continue;
            }
            if (g->q.stream) {
                stream_news(g);
            } else {
                whole(g);
                g->phase = 2;
            }
        }
        for (int i = 0; i < k; i++) { /* the choices' chunks, in the order of their indices */
            out_add(&g->out, g->cs[i].out.s ? g->cs[i].out.s : "", g->cs[i].out.n);
            g->cs[i].out.n = 0;
        }
    }
}
