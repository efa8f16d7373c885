/* A completion's response as bytes, with no HTTP (serve/respond.c): the answer of a parsed
 * request's choices (api_req) as the engine releases their text, streamed (OpenAI's server-sent
 * chunks, each with its choice's index, then the usage and `data: [DONE]`) or whole (one JSON
 * object once every choice is done, a keep-alive space a second before it). A chat answer may be a
 * tool call (held back while the text may still begin one) or carry a reasoning model's thought;
 * THUDM api.py's request gets api.py's answer. server.c hands the bytes to libmicrohttpd. */
#ifndef GLM_SERVE_RESPOND_H
#define GLM_SERVE_RESPOND_H
#include <cJSON.h>
#include <sys/types.h>
#include "serve/api.h"

typedef struct srv_response srv_response;

/* The response of q's choices, taking q (its requests' references and its tools; q is left
 * empty): each request rings the response's waker, so create it before q->batch is submitted.
 * fd: the client's socket, watched while the response waits (a client gone cancels every
 * choice). thudm_history / thudm_prompt (owned from here, or NULL): THUDM api.py's request, whose
 * whole answer is api.py's. */
srv_response *srv_response_new(srv_server *S, api_req *q, int fd, cJSON *thudm_history, char *thudm_prompt);

/* Queues the response's requests on e at once: 0, or srv_engine_submit_all's 429 / 503. */
int srv_response_submit(srv_response *g, srv_engine *e);

#define SRV_READ_END (-1)  /* the response is complete */
#define SRV_READ_GONE (-2) /* the client went away: the choices are cancelled */
/* Up to max bytes of the response into buf (waiting for the engine, a keep-alive byte or SSE
 * comment at least once a keep-alive interval): how many, or SRV_READ_END / SRV_READ_GONE. */
ssize_t srv_response_read(srv_response *g, char *buf, size_t max);

/* Cancels the choices still running and drops the response's references. */
void srv_response_free(srv_response *g);

/* Waits on the caller's thread until the engine is done with r; a client that goes away (fd)
 * cancels it, which the engine ends at its next step. */
void srv_wait_done(srv_req *r, int fd);

#endif
