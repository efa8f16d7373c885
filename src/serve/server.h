/* The HTTP side of `glmtrain serve` (docs/SERVE.md): libmicrohttpd (one thread per connection),
 * OpenAI's request and response shapes (cJSON), the web chat page, API keys. Requests are
 * checked and their prompts built here (each model's chat template: infer/chat.h), then queued
 * on the engine (serve/engine.h); a response streams the request's text as the engine
 * releases it. */
#ifndef GLM_SERVE_SERVER_H
#define GLM_SERVE_SERVER_H
#include <pthread.h>
#include <stddef.h>
#include "data/examples.h"
#include "serve/engine.h"

typedef struct srv_options {
    const char *host;          /* "127.0.0.1" */
    int port;                  /* 0: any free port (the bound one is in srv_server.port) */
    const char *api_key;       /* NULL or "": no key */
    const char *model_name;    /* the base model's name in the API */
    int model_adapter;         /* k >= 1: the served model itself is the base with adapter k - 1 (LLaMA-Factory's
                                * API: requests naming model_name, or no model, get it); 0: the base alone */
    size_t max_body;           /* request bodies above: 413 */
    int timeout_s;             /* idle connection (slowloris) timeout */
    int max_connections;
    int Tmax;                  /* max_model_len: prompt + response tokens */
    glm_gen_cfg defaults;      /* what a request leaves out (the model's chat defaults and the flags) */
    int debug;                 /* log each request's prompt ids */
    int reasoning;             /* --template glmz1: assistant messages go in without their thoughts */
    int disable_thinking;      /* --enable_thinking false: prompts end in the empty thought (a request's
                                * chat_template_kwargs.enable_thinking decides for itself) */
} srv_options;

typedef struct srv_server {
    srv_options o;
    srv_engine *e;
    const glm_tokenizer *tok;
    const glm_config *cfg;
    pthread_mutex_t *tok_mu;
    glm_encoder enc;           /* the training examples' encoder (score requests' prompt/response pairs) */
    int has_enc;               /* 0: the tokenizer lacks ChatGLM's special tokens */
    struct MHD_Daemon *d;
    int port;
    long created;
    int draining;
} srv_server;

/* Starts listening (the engine must be running). */
int srv_server_start(srv_server *s, const srv_options *o, srv_engine *e, const glm_tokenizer *tok,
                     const glm_config *cfg, pthread_mutex_t *tok_mu, glm_err *err);
/* Stops accepting connections; new requests on open ones get 503. */
void srv_server_quiesce(srv_server *s);
/* Closes every connection (after the engine has ended what ran) and frees the daemon. */
void srv_server_stop(srv_server *s);

/* The web chat page (serve/page.c: chat_page.html embedded at build time). */
extern const char srv_chat_page[];

#endif
