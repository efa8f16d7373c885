/* libFuzzer target: the bodies `glmtrain serve` takes from the network (serve/request.c,
 * serve/messages.c, serve/thudm_api.c, serve/tokenize.c): POST /v1/chat/completions, /v1/completions
 * (a prompt of text or token ids, a list of prompts, echo), THUDM api.py's POST /, and vLLM's POST
 * /tokenize and /detokenize (the same body), parsed, checked and turned into a prompt as the
 * server does, without HTTP or a model. A request must either be refused with OpenAI's error (status 400, 404 or 413, a message
 * in valid UTF-8, a JSON body that reads back) or give the engine a request it can run: prompt ids
 * in the vocabulary, room for at least one new token under max_model_len, sampling settings that
 * pass glm_gen_cfg_check, an adapter that exists.
 * The tokenizers: GLM_FUZZ_SERVE_TOKENIZERS (colon-separated folders or .model files; the test
 * script gives a ChatGLM-6B-style one, a ChatGLM3-style one and a GLM-4 rank file), else ChatGLM-6B's
 * ice_text.model from ../shared.
 * Input layout: byte 0 bits 0-1 pick the tokenizer, bit 2 chat (else completions), bit 3 THUDM's
 * POST / (a chat request), bits 4-5 max_model_len (16, 64, 512, 4096), bit 6 a served adapter
 * (LLaMA-Factory's API: the model name means base + adapter 1), bit 7 --template glmz1 (with a GLM-4
 * tokenizer, which glmz1 needs; thinking off by default when the input's length is odd); the rest
 * is the body. */
#include <cJSON.h>
#include <pthread.h>
#include <string.h>
#include "data/reader.h"
#include "infer/chat.h"
#include "serve/api.h"
#include "fuzz_util.h"
#include "fuzz_serve_util.h"

enum { MAX_TOK = 4, N_AD = 2 };
static glm_tokenizer *toks[MAX_TOK];
static glm_config cfgs[MAX_TOK];
static int ntok;
static pthread_mutex_t tok_mu = PTHREAD_MUTEX_INITIALIZER;
static srv_adapter ads[N_AD];
static int trace; /* GLM_FUZZ_TRACE=1: each input's outcome on stderr (to see what the seeds reach) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ntok = fuzz_serve_tokenizers("fuzz_serve_request", toks, cfgs, MAX_TOK);
    trace = getenv("GLM_FUZZ_TRACE") != NULL;
    snprintf(ads[0].name, sizeof ads[0].name, "lora-a");
    snprintf(ads[1].name, sizeof ads[1].name, "适配器-b");
    return 0;
}

static void check_utf8(const char *s, const char *what) {
    FUZZ_CHECK(s && glm_utf8_valid(s, strlen(s)), "%s is not valid UTF-8: %s", what, s ? s : "(null)");
}

/* A refusal: what the server sends must be OpenAI's error in valid JSON text. */
static void check_refusal(const api_err *e) {
    FUZZ_CHECK(e->status == 400 || e->status == 404 || e->status == 413, "status %u: %s", e->status, e->msg);
    FUZZ_CHECK(e->msg[0] && e->type, "status %u without a message or type", e->status);
    check_utf8(e->msg, "the error message");
    cJSON *o = srv_error_body(e->msg, e->type, e->param, e->code);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON *back = cJSON_Parse(s);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back, "error"), "message");
    FUZZ_CHECK(cJSON_IsString(m) && !strcmp(m->valuestring, e->msg), "the error body does not read back: %s", s);
    cJSON_Delete(back);
    free(s);
}

/* One engine request of an accepted body: a prompt in the vocabulary, room under max_model_len
 * (echo alone: the prompt fits), settings the engine takes, an adapter that exists. */
static void check_request(const srv_server *S, const api_req *q, const srv_req *r, const glm_tokenizer *tok) {
    int vocab = glm_tokenizer_vocab_size(tok), np = r->prompt.n;
    if (S->cfg->vocab_size > vocab) vocab = S->cfg->vocab_size; /* token-id prompts: the model's vocabulary */
    FUZZ_CHECK(np >= 1 && np <= S->o.Tmax - !r->no_generate, "a prompt of %d tokens under max_model_len %d", np, S->o.Tmax);
    for (int i = 0; i < np; i++) FUZZ_CHECK(r->prompt.data[i] >= 0 && r->prompt.data[i] < vocab, "id %d of %d", r->prompt.data[i], vocab);
    FUZZ_CHECK(!r->no_generate || (!q->chat && r->echo), "max_tokens 0 without echo");
    FUZZ_CHECK(!r->prompt_logprobs || (r->echo && r->logprobs && S->cfg->family != GLM_FAMILY_GLM), "prompt logprobs");
    if (r->echo) check_utf8(r->echo, "the echoed prompt");
    if (!r->no_generate) {
        FUZZ_CHECK(r->g.max_new_tokens >= 0 && r->g.max_new_tokens <= S->o.Tmax - np, "max_new_tokens %d, prompt %d, max_model_len %d",
                   r->g.max_new_tokens, np, S->o.Tmax);
        FUZZ_CHECK(glm_gen_limit(&r->g, np) >= 1, "no room for a response (prompt %d)", np);
    }
    glm_err gerr;
    FUZZ_CHECK(glm_gen_cfg_check(&r->g, &gerr) == 0, "settings the engine would refuse: %s", gerr.msg);
    FUZZ_CHECK(r->adapter >= -1 && r->adapter < N_AD, "adapter %d", r->adapter);
    FUZZ_CHECK(r->n_stops >= 0 && r->n_stops <= SRV_MAX_STOPS, "%d stop strings", r->n_stops);
    for (int i = 0; i < r->n_stops; i++) FUZZ_CHECK(r->stops[i] && r->stops[i][0], "stop string %d empty", i);
    FUZZ_CHECK(r->top_logprobs >= 0 && r->top_logprobs <= SRV_MAX_TOP_LOGPROBS, "top_logprobs %d", r->top_logprobs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int k = (data[0] & 3) % ntok, chat = (data[0] >> 2) & 1, thudm = (data[0] >> 3) & 1;
    static const int tmax[4] = {16, 64, 512, 4096};
    const glm_tokenizer *tok = toks[k];
    glm_model m = {.fam = fuzz_serve_family(tok)};
    srv_engine eng = {.m = &m, .ad = ads, .n_ad = N_AD};
    srv_server S = {.e = &eng, .tok = tok, .cfg = &cfgs[k], .tok_mu = &tok_mu};
    S.o.model_name = "chatglm";
    S.o.model_adapter = (data[0] >> 6) & 1; /* 1: the served model is base + adapter 0 */
    S.o.Tmax = tmax[(data[0] >> 4) & 3];
    S.o.reasoning = (data[0] >> 7) & 1 && glm_tokenizer_kind(tok) == GLM_TOK_GLM4;
    S.o.disable_thinking = S.o.reasoning && (size & 1);
    glm_gen_cfg_chat_defaults_for(&S.o.defaults, tok);
    S.o.defaults.max_length = 8192;

    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    api_req q = {0};
    api_err e = {0};
    cJSON *history = NULL;
    char *prompt = NULL, *as_chat = NULL;
    if (thudm) {
        chat = 1;
        as_chat = srv_thudm_request(body, n, &history, &prompt, &e);
        if (!as_chat) {
            if (trace) fprintf(stderr, "tokenizer %d thudm: refused: %s\n", k, e.msg);
            check_refusal(&e);
            return 0;
        }
        FUZZ_CHECK(prompt && history && cJSON_IsArray(history), "THUDM's request kept no prompt or history");
        cJSON *a = srv_thudm_answer(history, prompt, "答：好");
        char *s = cJSON_PrintUnformatted(a);
        FUZZ_CHECK(s, "THUDM's answer does not print");
        free(s);
        cJSON_Delete(a);
    }
    int rc = srv_parse_request(&S, chat, as_chat ? as_chat : body, as_chat ? strlen(as_chat) : n, &q, &e);
    if (trace) fprintf(stderr, "tokenizer %d %s: %s%s\n", k, thudm ? "thudm" : chat ? "chat" : "completion",
                       rc ? "refused: " : "ok", rc ? e.msg : q.tools.on ? " (tools)" : "");
    if (rc) {
        FUZZ_CHECK(!q.r && !q.batch && !q.n_batch, "a refused request left an engine request");
        check_refusal(&e);
    } else {
        FUZZ_CHECK(q.n_batch >= 1 && q.n_batch <= SRV_MAX_PROMPTS && q.r == q.batch[0], "%d requests", q.n_batch);
        FUZZ_CHECK(q.n_choices >= 1 && q.n_batch % q.n_choices == 0, "%d requests for n %d", q.n_batch, q.n_choices);
        for (int b = 0; b < q.n_batch; b++) /* each its own until an answer gives them one */
            FUZZ_CHECK(q.batch[b]->waker && q.batch[b]->waker->refs == 1 && (b == 0 || q.batch[b]->waker != q.batch[b - 1]->waker),
                       "choice %d parsed without a waker of its own", b);
        FUZZ_CHECK(!chat || q.n_batch == q.n_choices, "%d choices of a chat with n %d", q.n_batch, q.n_choices);
        for (int b = 0; b < q.n_batch; b++) check_request(&S, &q, q.batch[b], tok);
        check_utf8(q.model, "the response's model name");
        if (q.tools.on) FUZZ_CHECK(q.tools.n_names > 0, "tools on without a tool");
        if (q.tools.forced) {
            size_t f = strlen(q.tools.forced);
            FUZZ_CHECK(f >= 2 && q.tools.forced[f - 1] == '\n', "a forced call's line: %s", q.tools.forced);
            FUZZ_CHECK(srv_tools_may_call(&q.tools, q.tools.forced, f), "the forced call's own line is not a call: %s", q.tools.forced);
        }
        srv_api_req_free(&q);
    }
    if (!thudm) { /* the same body to vLLM's tokenizer endpoints (serve/tokenize.c) */
        for (int t = 0; t < 2; t++) {
            api_err te = {0};
            cJSON *a = t ? srv_detokenize(&S, body, n, &te) : srv_tokenize(&S, body, n, &te);
            if (!a) { check_refusal(&te); continue; }
            char *s = cJSON_PrintUnformatted(a);
            check_utf8(s, t ? "/detokenize's answer" : "/tokenize's answer");
            free(s);
            cJSON_Delete(a);
        }
        cJSON_Delete(srv_tokenizer_info(&S));
    }
    free(as_chat);
    free(prompt);
    cJSON_Delete(history);
    return 0;
}
