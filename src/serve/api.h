/* What the HTTP side's files share (server.c, messages.c): a request's failure before it reaches
 * the engine (OpenAI's error fields), cJSON lookups, and the tools a chat request offers. */
#ifndef GLM_SERVE_API_H
#define GLM_SERVE_API_H
#include <cJSON.h>
#include "serve/server.h"

typedef struct api_err {
    unsigned status;
    char msg[700];
    const char *type, *param, *code;
} api_err;

/* Fills e (the type from the status) and returns -1. */
int srv_bad(api_err *e, unsigned status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* OpenAI's error body: {"error": {"message", "type", "param", "code"}} (param, code: null when NULL). */
cJSON *srv_error_body(const char *msg, const char *type, const char *param, const char *code);

static inline const cJSON *srv_field(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static inline int srv_present(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* The tools a chat request offers to a ChatGLM3 or GLM-4 model (OpenAI's tools, or the older
 * functions). */
typedef struct srv_tools {
    int on;                    /* tools given and tool_choice not "none": a response may be a call */
    int legacy;                /* given as functions: a call is answered as function_call */
    int glm4;                  /* GLM-4's call format (infer/tools.h), else ChatGLM3's */
    char *forced;              /* "NAME\n" when tool_choice names the tool (names[forced_tool]): the prompt ends with */
                               /* that line of the call, the response is the rest of it */
    char **names;              /* [n_names] the tools' names (a streamed response that may still */
    int n_names;               /* become a call is held back) */
    int forced_tool;
    int required_any;          /* tool_choice "required" with several tools (GLM-4): the response is a
                                * call of one of them */
    const cJSON *list;         /* the tools as the request's body gives them (their parameters), while
                                * the request is read */
} srv_tools;
void srv_tools_free(srv_tools *t);

/* The request's messages (and tools, tool_choice, functions) -> the model's chat prompt (body is
 * the request parsed, text[0..len) as sent): each
 * model's template (infer/chat.h); for ChatGLM3 and GLM-4, tool calls and tool results in the
 * history and the tools' system turn as THUDM's servers build them (infer/tools.h). */
int srv_chat_prompt(srv_server *S, const cJSON *body, const char *text, size_t len, glm_ids *ids, srv_tools *t,
                    api_err *e);

/* A parsed request: the engine's request (prompt, sampling, stops, adapter), ready to submit,
 * and what its response needs. */
typedef struct api_req {
    int chat, stream, include_usage;
    char model[256];
    srv_req *r;                /* batch[0] (a score request: the only one, not in batch) */
    srv_req **batch;           /* [n_batch] a request each choice: prompt i's choice j (of n_choices, */
    int n_batch, n_choices;    /* the request's n) at i * n_choices + j; one reference each, q's */
    srv_tools tools;
} api_req;
/* Drops q's requests (batch) and tools. */
void srv_api_req_free(api_req *q);

/* The most prompts one completion request may list. */
#define SRV_MAX_PROMPTS 256

/* A request body parsed: the JSON object, or NULL with e filled (400: not JSON, with the byte where
 * parsing stopped, or not an object). The caller deletes it. */
cJSON *srv_parse_object(const char *body, size_t n, api_err *e);

/* The body's "model" (absent or null: the served model) -> *adapter (-1: the base) and its API
 * name; or e filled (400, 404) and -1. */
int srv_pick_model(srv_server *S, const cJSON *o, int *adapter, char *name, size_t cap, api_err *e);

/* 1 when ids (ids->n >= 1) follow the served model's position rule (ChatGLM-6B's needs
 * [gMASK] or [MASK] and <sop> among them; the causal families take any ids). */
int srv_positions_ok(srv_server *S, const glm_ids *ids);

/* The body of POST /v1/score/evaluation (serve/score.c) -> q->r, a score request (texts, adapter),
 * or e filled (400, 404 or 413) and -1. */
int srv_parse_score(srv_server *S, const char *body, size_t n, api_req *q, api_err *e);
/* Its answer once the engine is done: {"id", "object": "score.evaluation", "model", "scores"}. */
cJSON *srv_score_answer(const api_req *q);

/* vLLM's tokenizer endpoints (serve/tokenize.c), answers or NULL with e filled (400, 404):
 * POST /tokenize {"prompt", "add_special_tokens"?: true} -> {"count", "max_model_len", "tokens",
 * "token_strs": null}: with special tokens the ids a completion of that text runs, without them
 * the text's own ids (glm_tokenizer_encode; a text that is exactly a special token's, as
 * /tokenizer_info's eos_token, is that token's id, as Hugging Face's tokenizers keep it whole);
 * {"messages", ...} gives a chat completion's prompt ids.
 * POST /detokenize {"tokens"} -> {"prompt"}: the ids decoded. */
cJSON *srv_tokenize(srv_server *S, const char *body, size_t n, api_err *e);
cJSON *srv_detokenize(srv_server *S, const char *body, size_t n, api_err *e);
/* GET /tokenizer_info: {"tokenizer_class", "eos_token", "bos_token", "pad_token", "unk_token",
 * "model_max_length", "vocab_size"} (a token the model lacks: null). */
cJSON *srv_tokenizer_info(srv_server *S);

/* The body of POST /v1/chat/completions (chat) or /v1/completions -> q (q->r: one reference, the
 * caller's), or e filled (400, 404 or 413) and -1. Model names are looked up in S->e->ad. */
int srv_parse_request(srv_server *S, int chat, const char *body, size_t n, api_req *q, api_err *e);

/* The first of the tools' names that text (released so far) could still begin a call of: 1
 * while text is a prefix of "NAME\n" or starts with it, else 0. */
int srv_tools_may_call(const srv_tools *t, const char *text, size_t n);

/* OpenAI's logprobs object for the response tokens lps[0..n) with up to top alternatives each:
 * chat's {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null},
 * completions' {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
 * (*offset: the characters before lps[0], advanced past them); an entry with n_top < 0 (an echoed
 * prompt's first token) has null for its logprob and alternatives. A token whose bytes are not UTF-8
 * on their own (part of a character) is written "bytes:\xNN..."; "bytes" has them as numbers. */
cJSON *srv_logprobs_json(const glm_tokenizer *tok, const srv_logprob *lps, int n, int top, int chat, long *offset);

/* THUDM's api.py (ChatGLM-6B, ChatGLM2-6B): POST / {"prompt", "history": [[q, r], ...],
 * "max_length", "top_p", "temperature"} (a missing, null or zero value: the server's default, as
 * api.py's `x if x else default`; glmtrain's "seed" too) -> the body of the equivalent chat completion (caller frees;
 * NULL with e filled), *history and *prompt kept for the answer (caller frees). */
char *srv_thudm_request(const char *body, size_t n, cJSON **history, char **prompt, api_err *e);
/* api.py's answer: {"response", "history": history + [[prompt, response]], "status": 200, "time"}. */
cJSON *srv_thudm_answer(const cJSON *history, const char *prompt, const char *response);

#endif
