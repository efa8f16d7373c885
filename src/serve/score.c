/* POST /v1/score/evaluation: LLaMA-Factory's API for a reward model (docs/SERVE.md). The body
 * {"model", "messages": [...], "max_length"?} becomes a score request (serve/engine.h): each
 * message is a text given as it is, tokenized without special tokens added (LLaMA-Factory's
 * tokenizer(text, add_special_tokens=False)), or a {"prompt", "response", "system"?} pair built as
 * --stage rm builds its examples (the model's prompt format, the response and its end token).
 * Each is scored by the model's value head at its last token. No HTTP here. */
#include <cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/log.h"
#include "core/strbuf.h"
#include "model/family.h"
#include "serve/api.h"
#include "tokenizer/tokenizer.h"

/* A pair's prompt and response lengths above any text's: the example is built without a cut, and
 * the server's max_model_len (or the request's max_length) decides what fits. */
#define NO_CUT (1 << 28)

/* A {"prompt", "response", "system"?} message -> the ids of its --stage rm example. */
static int pair_ids(srv_server *S, const cJSON *it, int i, glm_ids *ids, api_err *e) {
    const cJSON *p = srv_field(it, "prompt"), *a = srv_field(it, "response"), *sy = srv_field(it, "system");
    if (!cJSON_IsString(p) || !cJSON_IsString(a) || (srv_present(sy) && !cJSON_IsString(sy)))
        return srv_bad(e, 400, "messages", "invalid_type", "messages[%d] must be a string, or an object with string "
                       "\"prompt\" and \"response\" (and \"system\")", i);
    if (!S->has_enc)
        return srv_bad(e, 400, "messages", "invalid_value", "messages[%d]: this model's tokenizer has no [gMASK] / <sop> / "
                       "<eop> to build a prompt and response with; give the text itself", i);
    glm_example_cfg c;
    glm_example_cfg_init(&c);
    c.max_source_length = c.max_target_length = NO_CUT;
    glm_record rec = {.query = p->valuestring, .answer = a->valuestring, .system = srv_present(sy) ? sy->valuestring : NULL,
                      .kto_tag = -1};
    glm_ids labels = {0};
    glm_example_info info = {0};
    glm_err err = {0};
    pthread_mutex_lock(S->tok_mu);
    int rc = glm_example_build(&c, &S->enc, &rec, ids, &labels, &info, &err);
    pthread_mutex_unlock(S->tok_mu);
    glm_ids_free(&labels);
    if (rc) return srv_bad(e, 400, "messages", "invalid_value", "messages[%d]: %s", i, err.msg);
    if (info.status != GLM_EX_OK)
        return srv_bad(e, 400, "messages", "invalid_value", "messages[%d]: %s", i, info.status == GLM_EX_EMPTY ?
                       "the prompt or the response is empty" : "the response encodes to no tokens");
    return 0;
}

/* Message i -> its ids, cut to max_length (0: no cut), checked against the server's length and
 * the model's position rule. */
static int message_ids(srv_server *S, const cJSON *it, int i, int max_length, glm_ids *ids, api_err *e) {
    if (cJSON_IsString(it)) {
        glm_err err = {0};
        pthread_mutex_lock(S->tok_mu);
        int rc = glm_tokenizer_encode(S->tok, it->valuestring, strlen(it->valuestring), ids, &err);
        pthread_mutex_unlock(S->tok_mu);
        if (rc) return srv_bad(e, 400, "messages", "invalid_value", "messages[%d]: %s", i, err.msg);
    } else if (cJSON_IsObject(it)) {
        if (pair_ids(S, it, i, ids, e)) return -1;
    } else {
        return srv_bad(e, 400, "messages", "invalid_type", "messages[%d] must be a string (or a {\"prompt\", \"response\"} "
                       "object)", i);
    }
    if (max_length > 0 && ids->n > max_length) ids->n = max_length; /* as truncation=True: the start is kept */
    if (ids->n == 0) return srv_bad(e, 400, "messages", "invalid_value", "messages[%d] gives no tokens to score", i);
    if (ids->n > S->o.Tmax)
        return srv_bad(e, 413, "messages", "context_length_exceeded", "messages[%d] is %d tokens; this server's max_model_len "
                       "is %d (or give max_length to cut the texts)", i, ids->n, S->o.Tmax);
    if (ids->n > S->e->batch_tokens) /* a text is scored by one forward */
        return srv_bad(e, 413, "messages", "context_length_exceeded", "messages[%d] is %d tokens; this server scores a text "
                       "in one forward of at most %d tokens (--max_num_batched_tokens; or give max_length to cut the texts)",
                       i, ids->n, S->e->batch_tokens);
    if (!srv_positions_ok(S, ids))
        return srv_bad(e, 400, "messages", "invalid_value", "messages[%d] has no [gMASK] (or [MASK]) and <sop>, which "
                       "ChatGLM-6B's positions need; give {\"prompt\", \"response\"} to have them placed as in training", i);
    return 0;
}

static void log_ids(int i, const glm_ids *ids) {
    glm_strbuf b = {0};
    for (int k = 0; k < ids->n; k++) {
        char t[16];
        snprintf(t, sizeof t, k ? " %d" : "%d", ids->data[k]);
        glm_strbuf_str(&b, t);
    }
    glm_info("serve: score ids %d: %s", i, b.s ? b.s : "");
    free(b.s);
}

int srv_parse_score(srv_server *S, const char *body, size_t n, api_req *q, api_err *e) {
    cJSON *o = srv_parse_object(body, n, e);
    if (!o) return -1;
    int rc = -1, adapter;
    srv_req *r = NULL;
    if (srv_pick_model(S, o, &adapter, q->model, sizeof q->model, e)) goto out;
    if (!(adapter >= 0 ? S->e->ad[adapter].vhead : S->e->vhead)) {
        srv_bad(e, 400, "model", "invalid_value", "the model `%.200s` has no value head to score with: serve a reward model "
                "(the output of glmtrain train --stage rm, whose value_head.safetensors lies beside the model or the "
                "adapter)", q->model);
        goto out;
    }
    const cJSON *ml = srv_field(o, "max_length"), *msgs = srv_field(o, "messages"), *it;
    int max_length = 0;
    if (srv_present(ml)) {
        if (!cJSON_IsNumber(ml) || !(ml->valuedouble >= 1 && ml->valuedouble <= INT_MAX) ||
            ml->valuedouble != floor(ml->valuedouble)) {
            srv_bad(e, 400, "max_length", "invalid_value", "max_length must be a positive integer");
            goto out;
        }
        max_length = (int)ml->valuedouble;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        srv_bad(e, 400, "messages", srv_present(msgs) ? "invalid_value" : "missing_required_parameter",
                "messages must be a non-empty list of texts to score");
        goto out;
    }
    r = srv_req_new();
    r->adapter = adapter;
    r->n_texts = cJSON_GetArraySize(msgs);
    r->texts = glm_calloc((size_t)r->n_texts, sizeof *r->texts);
    r->scores = glm_calloc((size_t)r->n_texts, sizeof *r->scores);
    int i = 0;
    cJSON_ArrayForEach(it, msgs) {
        if (message_ids(S, it, i, max_length, &r->texts[i], e)) goto out;
        if (S->o.debug) log_ids(i, &r->texts[i]);
        i++;
    }
    q->r = r;
    r = NULL;
    rc = 0;
out:
    if (r) srv_req_put(r);
    cJSON_Delete(o);
    return rc;
}

cJSON *srv_score_answer(const api_req *q) {
    static atomic_ulong seq;
    char id[64];
    snprintf(id, sizeof id, "scoreval-%lx%06lx", (unsigned long)time(NULL), (unsigned long)atomic_fetch_add(&seq, 1) & 0xffffff);
    cJSON *o = cJSON_CreateObject(), *s;
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "score.evaluation");
    cJSON_AddStringToObject(o, "model", q->model);
    s = cJSON_AddArrayToObject(o, "scores");
    for (int i = 0; i < q->r->n_texts; i++) cJSON_AddItemToArray(s, cJSON_CreateNumber(q->r->scores[i]));
    return o;
}
