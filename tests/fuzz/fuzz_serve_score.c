/* libFuzzer target: the bodies of POST /v1/score/evaluation (serve/score.c), parsed, checked and
 * tokenized as the server does, without HTTP or a model. A request must either be refused with
 * OpenAI's error (status 400, 404 or 413, a message in valid UTF-8) or give the engine a score
 * request it can run: one or more texts, each of 1 to max_model_len ids in the vocabulary that the
 * model's position rule takes, for a model that has a value head.
 * The tokenizers: GLM_FUZZ_SERVE_TOKENIZERS as fuzz_serve_request.c takes them. The model is a
 * stand-in: ChatGLM-6B's position rule ([gMASK] or [MASK], and <sop>) for a ChatGLM-6B-style
 * tokenizer, none for the others. Adapter "rm" has a value head, "lora-b" none.
 * Input layout: byte 0 bits 0-1 pick the tokenizer, bits 4-5 max_model_len (16, 64, 512, 4096),
 * bit 6 a served adapter (the model name means base + adapter "rm"), bit 7 a base without a value
 * head; the rest is the body. */
#include <cJSON.h>
#include <pthread.h>
#include <string.h>
#include "model/family.h"
#include "serve/api.h"
#include "fuzz_util.h"
#include "fuzz_serve_util.h"

enum { MAX_TOK = 4, N_AD = 2 };
static glm_tokenizer *toks[MAX_TOK];
static glm_config cfgs[MAX_TOK];
static glm_encoder encs[MAX_TOK];
static int has_enc[MAX_TOK], ntok;
static pthread_mutex_t tok_mu = PTHREAD_MUTEX_INITIALIZER;
static srv_adapter ads[N_AD];
static float vhead[1];


int LLVMFuzzerInitialize(int *argc, char ***argv) {
    ntok = fuzz_serve_tokenizers("fuzz_serve_score", toks, cfgs, MAX_TOK);
    for (int k = 0; k < ntok; k++) {
        glm_err err;
        has_enc[k] = glm_encoder_from_tokenizer(&encs[k], toks[k], NULL, &err) == 0;
    }
    snprintf(ads[0].name, sizeof ads[0].name, "rm");
    ads[0].vhead = vhead;
    snprintf(ads[1].name, sizeof ads[1].name, "lora-b");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int k = (data[0] & 3) % ntok;
    static const int tmax[4] = {16, 64, 512, 4096};
    const glm_tokenizer *tok = toks[k];
    glm_model m = {.fam = fuzz_serve_family(tok)};
    srv_engine eng = {.m = &m, .ad = ads, .n_ad = N_AD, .vhead = (data[0] >> 7) & 1 ? NULL : vhead};
    srv_server S = {.e = &eng, .tok = tok, .cfg = &cfgs[k], .tok_mu = &tok_mu, .enc = encs[k], .has_enc = has_enc[k]};
    S.o.model_name = "chatglm";
    S.o.model_adapter = (data[0] >> 6) & 1; /* 1: the served model is base + adapter "rm" */
    S.o.Tmax = tmax[(data[0] >> 4) & 3];
    api_req q = {0};
    api_err e = {0};
    int rc = srv_parse_score(&S, (const char *)data + 1, size - 1, &q, &e);
    if (rc) {
        FUZZ_CHECK(!q.r, "a refused request left an engine request");
        FUZZ_CHECK(e.status == 400 || e.status == 404 || e.status == 413, "status %u: %s", e.status, e.msg);
        FUZZ_CHECK(e.msg[0] && e.type && glm_utf8_valid(e.msg, strlen(e.msg)), "status %u: a bad message", e.status);
        return 0;
    }
    srv_req *r = q.r;
    int vocab = glm_tokenizer_vocab_size(tok);
    FUZZ_CHECK(r->n_texts >= 1 && r->texts && r->scores, "%d texts", r->n_texts);
    FUZZ_CHECK(r->adapter >= -1 && r->adapter < N_AD, "adapter %d", r->adapter);
    FUZZ_CHECK(r->adapter >= 0 ? ads[r->adapter].vhead != NULL : eng.vhead != NULL, "a model without a value head");
    for (int t = 0; t < r->n_texts; t++) {
        const glm_ids *x = &r->texts[t];
        FUZZ_CHECK(x->n >= 1 && x->n <= S.o.Tmax, "text %d: %d ids under max_model_len %d", t, x->n, S.o.Tmax);
        for (int i = 0; i < x->n; i++) FUZZ_CHECK(x->data[i] >= 0 && x->data[i] < vocab, "id %d of %d", x->data[i], vocab);
        int32_t rule[3 * 4096];
        int state[2];
        FUZZ_CHECK(m.fam->prompt_positions(&cfgs[k], x->data, x->n, rule, rule + x->n, rule + 2 * x->n, state) == 0,
                   "text %d: the position rule refuses it", t);
    }
    cJSON *a = srv_score_answer(&q);
    char *s = cJSON_PrintUnformatted(a);
    FUZZ_CHECK(s && glm_utf8_valid(s, strlen(s)), "the answer does not print as UTF-8");
    free(s);
    cJSON_Delete(a);
    srv_req_put(r);
    return 0;
}
