/* vLLM's tokenizer endpoints (docs/SERVE.md), so that clients which tokenize through the server
 * (lm-evaluation-harness's remote tokenizer, which looks for /tokenizer_info and /tokenize) send
 * ids this model reads as the server does:
 *   POST /tokenize {"prompt", "add_special_tokens"?} or {"messages", ...} -> {"count", "max_model_len",
 *        "tokens", "token_strs": null}
 *   POST /detokenize {"tokens"} -> {"prompt"}
 *   GET /tokenizer_info -> {"tokenizer_class", "eos_token", "bos_token", "pad_token", "unk_token",
 *        "model_max_length", "vocab_size"}
 * No HTTP here. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "data/reader.h"
#include "infer/generate.h"
#include "serve/api.h"
#include "tokenizer/tokenizer.h"

/* The id of the special token whose text is exactly t (eos, pad, unk, <sop>, [MASK], [gMASK], the
 * role tokens), or -1. Hugging Face's tokenizers keep such a text whole even without special
 * tokens added, so a client that encodes /tokenizer_info's eos_token (lm-evaluation-harness's
 * end-of-text id) gets the id. */
static int32_t special_text_id(const srv_server *S, const char *t) {
    glm_special_ids sp = glm_tokenizer_specials(S->tok);
    glm_role_ids ro = glm_tokenizer_roles(S->tok);
    int32_t ids[] = {S->cfg->eos_token_id, S->cfg->pad_token_id, sp.unk, sp.sop, sp.eop, sp.mask, sp.gmask,
                     ro.system, ro.user, ro.assistant, ro.observation};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        const char *p = ids[i] >= 0 ? glm_tokenizer_piece(S->tok, ids[i]) : NULL;
        if (p && !strcmp(p, t)) return ids[i];
    }
    return -1;
}

cJSON *srv_tokenize(srv_server *S, const char *body, size_t n, api_err *e) {
    cJSON *o = srv_parse_object(body, n, e);
    if (!o) return NULL;
    glm_ids ids = {0};
    cJSON *answer = NULL;
    char name[256];
    int adapter, rc = 0;
    const cJSON *p = srv_field(o, "prompt"), *m = srv_field(o, "messages"), *sp = srv_field(o, "add_special_tokens");
    if (srv_pick_model(S, o, &adapter, name, sizeof name, e)) goto out;
    if (srv_present(sp) && !cJSON_IsBool(sp)) {
        srv_bad(e, 400, "add_special_tokens", "invalid_type", "add_special_tokens must be a boolean");
        goto out;
    }
    if (srv_present(p) == srv_present(m)) {
        srv_bad(e, 400, "prompt", "missing_required_parameter", "give either prompt (a text) or messages (a chat)");
        goto out;
    }
    if (srv_present(m)) { /* the chat prompt a chat completion with these messages runs */
        srv_tools t = {0};
        rc = srv_chat_prompt(S, o, body, n, &ids, &t, e);
        srv_tools_free(&t);
        if (rc) goto out;
    } else if (!cJSON_IsString(p)) {
        srv_bad(e, 400, "prompt", "invalid_type", "prompt must be a string");
        goto out;
    } else { /* with special tokens (the default): the ids a completion of this text runs */
        glm_err err = {0};
        pthread_mutex_lock(S->tok_mu);
        int32_t whole = cJSON_IsFalse(sp) ? special_text_id(S, p->valuestring) : -1;
        if (whole >= 0) glm_ids_push(&ids, whole);
        else rc = cJSON_IsFalse(sp) ? glm_tokenizer_encode(S->tok, p->valuestring, strlen(p->valuestring), &ids, &err)
                                    : glm_prompt_inputs(S->tok, S->cfg, p->valuestring, 0, &ids, &err);
        pthread_mutex_unlock(S->tok_mu);
        if (rc) {
            srv_bad(e, 400, "prompt", "invalid_value", "%s", err.msg);
            goto out;
        }
    }
    answer = cJSON_CreateObject();
    cJSON_AddNumberToObject(answer, "count", ids.n);
    cJSON_AddNumberToObject(answer, "max_model_len", S->o.Tmax);
    cJSON *t = cJSON_AddArrayToObject(answer, "tokens");
    for (int i = 0; i < ids.n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids.data[i]));
    cJSON_AddNullToObject(answer, "token_strs");
out:
    glm_ids_free(&ids);
    cJSON_Delete(o);
    return answer;
}

cJSON *srv_detokenize(srv_server *S, const char *body, size_t n, api_err *e) {
    cJSON *o = srv_parse_object(body, n, e);
    if (!o) return NULL;
    glm_ids ids = {0};
    cJSON *answer = NULL;
    char name[256];
    int adapter, i = 0;
    const cJSON *t = srv_field(o, "tokens"), *it;
    if (srv_pick_model(S, o, &adapter, name, sizeof name, e)) goto out;
    if (!cJSON_IsArray(t)) {
        srv_bad(e, 400, "tokens", "invalid_type", "tokens must be a list of token ids");
        goto out;
    }
    cJSON_ArrayForEach(it, t) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || !(it->valuedouble >= 0 &&
                                                                                  it->valuedouble < S->cfg->vocab_size)) {
            srv_bad(e, 400, "tokens", "invalid_value", "tokens[%d] must be a token id, an integer in [0, %d)", i,
                    S->cfg->vocab_size);
            goto out;
        }
        glm_ids_push(&ids, (int32_t)it->valuedouble);
        i++;
    }
    pthread_mutex_lock(S->tok_mu);
    char *text = glm_tokenizer_decode(S->tok, ids.data, ids.n);
    pthread_mutex_unlock(S->tok_mu);
    glm_utf8_scrub(text); /* ids may end inside a character; the answer is JSON text */
    answer = cJSON_CreateObject();
    cJSON_AddStringToObject(answer, "prompt", text);
    free(text);
out:
    glm_ids_free(&ids);
    cJSON_Delete(o);
    return answer;
}

/* A special token's text, or JSON null where the model has none. */
static void add_token(const srv_server *S, cJSON *o, const char *key, int32_t id) {
    const char *p = id >= 0 ? glm_tokenizer_piece(S->tok, id) : NULL;
    if (p && glm_utf8_valid(p, strlen(p))) cJSON_AddStringToObject(o, key, p);
    else cJSON_AddNullToObject(o, key);
}

cJSON *srv_tokenizer_info(srv_server *S) {
    static const char *classes[] = {"SentencePiece", "ChatGLMTokenizer", "ChatGLMTokenizer", "ChatGLM4Tokenizer"};
    glm_tok_kind k = glm_tokenizer_kind(S->tok);
    glm_special_ids sp = glm_tokenizer_specials(S->tok);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tokenizer_class", classes[k]);
    add_token(S, o, "eos_token", S->cfg->eos_token_id);
    add_token(S, o, "bos_token", k == GLM_TOK_SPM ? -1 : sp.sop);
    add_token(S, o, "pad_token", S->cfg->pad_token_id);
    add_token(S, o, "unk_token", sp.unk);
    cJSON_AddNumberToObject(o, "model_max_length", S->o.Tmax);
    cJSON_AddNumberToObject(o, "vocab_size", S->cfg->vocab_size);
    return o;
}
