/* Prompts (each model's model.chat format: ChatGLM-6B, ChatGLM2-6B, ChatGLM3-6B), stop ids,
 * response text and the streamer (infer/generate.h, infer/chat.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/chat.h"
#include "data/thought.h"
#include "infer/generate.h"

/* The prefix kinds ([gMASK] sop first): ChatGLM2/3 and those after them; the others put
 * [gMASK] <sop> after the text. */
static int prefix_kind(const glm_tokenizer *tok) {
    glm_tok_kind k = glm_tokenizer_kind(tok);
    return k != GLM_TOK_CHATGLM1 && k != GLM_TOK_SPM;
}

int glm_prompt_inputs(const glm_tokenizer *tok, const glm_config *c, const char *text, int max_text, glm_ids *out,
                      glm_err *err) {
    int dropped;
    return glm_prompt_inputs_cut(tok, c, text, max_text, out, &dropped, err);
}

int glm_prompt_inputs_cut(const glm_tokenizer *tok, const glm_config *c, const char *text, int max_text, glm_ids *out,
                          int *dropped, glm_err *err) {
    glm_ids a = {0};
    *dropped = 0;
    if (glm_tokenizer_encode(tok, text, strlen(text), &a, err)) { glm_ids_free(&a); return -1; }
    if (max_text > 0 && a.n > max_text) { *dropped = a.n - max_text; a.n = max_text; } /* HF truncation keeps the start */
    int n0 = out->n;
    /* a ChatGLM2-family config.json names no [gMASK] / <sop> (its tokenizer has them): nothing to check */
    int named = c->gmask_token_id >= 0 && c->bos_token_id >= 0;
    if (glm_tokenizer_kind(tok) != GLM_TOK_SPM) {
        glm_tokenizer_build_inputs(tok, a.data, a.n, NULL, 0, out); /* [gMASK] <sop> after (ChatGLM-6B) or before */
    } else { /* a plain SentencePiece model adds no special tokens: the model's ids do */
        glm_ids_append(out, a.data, a.n);
        if (named) { glm_ids_push(out, c->gmask_token_id); glm_ids_push(out, c->bos_token_id); }
    }
    glm_ids_free(&a);
    const int32_t *sp = out->n < n0 + 2 ? NULL : out->data + (prefix_kind(tok) ? n0 : out->n - 2); /* [gMASK] <sop> */
    if (named && (!sp || sp[0] != c->gmask_token_id || sp[1] != c->bos_token_id)) {
        glm_fail(err, "the tokenizer's [gMASK] <sop> ids differ from config.json's (%d, %d)", c->gmask_token_id,
                 c->bos_token_id);
        return glm_hint(err, "use the tokenizer that belongs to the model (--tokenizer_name)");
    }
    return 0;
}

char *glm_chat_prompt(const char *query, const char *const *hist, int n_hist) {
    if (n_hist == 0) return glm_strdup(query);
    size_t cap = strlen(query) + 64;
    for (int i = 0; i < 2 * n_hist; i++) cap += strlen(hist[i]) + 32;
    char *s = glm_malloc(cap), *p = s;
    for (int i = 0; i < n_hist; i++) p += sprintf(p, "[Round %d]\n问：%s\n答：%s\n", i, hist[2 * i], hist[2 * i + 1]);
    sprintf(p, "[Round %d]\n问：%s\n答：", n_hist, query);
    return s;
}

char *glm_chat_prompt_for(const glm_tokenizer *tok, const char *query, const char *const *hist, int n_hist) {
    glm_tok_kind k = glm_tokenizer_kind(tok);
    if (k == GLM_TOK_CHATGLM1 || k == GLM_TOK_SPM) return glm_chat_prompt(query, hist, n_hist);
    if (glm_tokenizer_roles(tok).user >= 0) return NULL; /* ChatGLM3: role tokens, not text */
    size_t cap = strlen(query) + 64; /* ChatGLM2's build_prompt: rounds from 1, even the first */
    for (int i = 0; i < 2 * n_hist; i++) cap += strlen(hist[i]) + 32;
    char *s = glm_malloc(cap), *p = s;
    for (int i = 0; i < n_hist; i++)
        p += sprintf(p, "[Round %d]\n\n问：%s\n\n答：%s\n\n", i + 1, hist[2 * i], hist[2 * i + 1]);
    sprintf(p, "[Round %d]\n\n问：%s\n\n答：", n_hist + 1, query);
    return s;
}

/* ChatGLM3's build_single_message(role, metadata, text): <|role|> + sp(metadata + "\n") +
 * sp(text); GLM-4's chat template: <|role|> + encode(metadata + "\n" + text), one text, and
 * nothing for a turn whose text is empty. */
/* A piece of a turn's text as the model's turns encode it: GLM-4's tokenizer, ChatGLM3's
 * SentencePiece alone. */
static int turn_text(const glm_tokenizer *tok, const char *s, size_t n, glm_ids *out, glm_err *err) {
    return glm_tokenizer_kind(tok) == GLM_TOK_GLM4 ? glm_tokenizer_encode(tok, s, n, out, err)
                                                   : glm_tokenizer_encode_ex(tok, s, n, GLM_TOK_SPM_ONLY, out, err);
}

static int turn_message(const glm_tokenizer *tok, int32_t role, const char *metadata, const char *text, glm_ids *out,
                        glm_err *err) {
    int glm4 = glm_tokenizer_kind(tok) == GLM_TOK_GLM4;
    if (!text[0] && glm4) return 0;
    glm_ids_push(out, role);
    size_t m = metadata ? strlen(metadata) : 0, n = strlen(text);
    char *j = glm_malloc(m + n + 2);
    if (m) memcpy(j, metadata, m);
    j[m] = '\n';
    memcpy(j + m + 1, text, n + 1);
    int rc = glm4 ? turn_text(tok, j, m + n + 1, out, err) /* one text */
                  : turn_text(tok, j, m + 1, out, err) || turn_text(tok, text, n, out, err);
    free(j);
    return rc;
}
static int glm3_message(const glm_tokenizer *tok, int32_t role, const char *text, glm_ids *out, glm_err *err) {
    return turn_message(tok, role, NULL, text, out, err);
}

int glm_chat_inputs_turns(const glm_tokenizer *tok, const glm_chat_turn *t, int n, glm_ids *out, glm_err *err) {
    glm_role_ids r = glm_tokenizer_roles(tok);
    if (r.user < 0) return glm_fail(err, "this model's tokenizer has no role tokens (ChatGLM3 and GLM-4 have them)");
    glm_special_ids s = glm_tokenizer_specials(tok);
    const int32_t ids[] = {r.system, r.user, r.assistant, r.observation};
    glm_ids_push(out, s.gmask);
    glm_ids_push(out, s.sop);
    for (int i = 0; i < n; i++)
        if (turn_message(tok, ids[t[i].role], t[i].metadata, t[i].content, out, err)) return -1;
    glm_ids_push(out, r.assistant);
    return 0;
}

int glm_chat_assistant_metadata(const glm_tokenizer *tok, const char *line, glm_ids *out, glm_err *err) {
    if (glm_tokenizer_roles(tok).user < 0) return glm_fail(err, "this model's tokenizer has no role tokens (ChatGLM3 and GLM-4 have them)");
    return turn_text(tok, line, strlen(line), out, err);
}

/* ChatGLM3's build_chat_input(query, history): [gMASK] sop, the optional system turn, each round's
 * user and assistant turns, the query's user turn, then <|assistant|>. */
static int glm3_inputs(const glm_tokenizer *tok, const char *system, const char *query, const char *const *hist,
                       int n_hist, glm_ids *out, glm_err *err) {
    glm_role_ids r = glm_tokenizer_roles(tok);
    glm_special_ids s = glm_tokenizer_specials(tok);
    glm_ids_push(out, s.gmask);
    glm_ids_push(out, s.sop);
    if (system && glm3_message(tok, r.system, system, out, err)) return -1;
    for (int i = 0; i < n_hist; i++)
        if (glm3_message(tok, r.user, hist[2 * i], out, err) || glm3_message(tok, r.assistant, hist[2 * i + 1], out, err))
            return -1;
    if (glm3_message(tok, r.user, query, out, err)) return -1;
    glm_ids_push(out, r.assistant);
    return 0;
}

/* One try of glm_chat_inputs_sys with the given rounds; *prompt gets the prompt text. */
static int chat_try(const glm_tokenizer *tok, const glm_config *c, const char *system, const char *query,
                    const char *const *hist, int n_hist, glm_ids *out, char **prompt, glm_err *err) {
    out->n = 0;
    char *p = glm_chat_prompt_for(tok, query, hist, n_hist);
    if (!p) { /* ChatGLM3: the ids are the prompt; its text is their decoding (role tokens by name) */
        if (glm3_inputs(tok, system, query, hist, n_hist, out, err)) return -1;
        *prompt = glm_tokenizer_decode(tok, out->data, out->n);
        return 0;
    }
    if (system && system[0]) { /* as the training examples put a system prompt: "system\n" + prompt */
        char *q = glm_malloc(strlen(system) + strlen(p) + 2);
        sprintf(q, "%s\n%s", system, p);
        free(p);
        p = q;
    }
    *prompt = p;
    return glm_prompt_inputs(tok, c, p, 0, out, err);
}

int glm_chat_inputs(const glm_tokenizer *tok, const glm_config *c, const char *query, const char *const *hist,
                    int n_hist, int max_prompt, glm_ids *out, int *dropped, char **prompt_text, glm_err *err) {
    return glm_chat_inputs_sys(tok, c, NULL, query, hist, n_hist, max_prompt, out, dropped, prompt_text, err);
}

int glm_chat_inputs_sys(const glm_tokenizer *tok, const glm_config *c, const char *system, const char *query,
                        const char *const *hist, int n_hist, int max_prompt, glm_ids *out, int *dropped,
                        char **prompt_text, glm_err *err) {
    /* Rounds are renumbered after dropping, as if the conversation started there; a system
     * prompt stays. */
    for (int skip = 0; skip <= n_hist; skip++) {
        char *p = NULL;
        int rc = chat_try(tok, c, system, query, hist + 2 * skip, n_hist - skip, out, &p, err);
        if (rc == 0 && out->n <= max_prompt) {
            if (dropped) *dropped = skip;
            if (prompt_text) *prompt_text = p;
            else free(p);
            return 0;
        }
        free(p);
        if (rc) return -1;
    }
    glm_fail(err, "the message is %d tokens with the special tokens; at most %d fit with room for the response", out->n,
             max_prompt);
    return glm_hint(err, "send a shorter message, or lower --max_new_tokens (prompt + response must fit the model's max_sequence_length)");
}

/* Python's str.strip() for the whitespace a response can start or end with. */
static char *strip(const char *s) {
    static const char *sp[] = {" ", "\t", "\n", "\r", "\v", "\f", "\xc2\xa0", "\xe3\x80\x80"};
    size_t a = 0, z = strlen(s);
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) {
            size_t k = strlen(sp[i]);
            if (z - a >= k && memcmp(s + a, sp[i], k) == 0) { a += k; again = 1; }
            if (z - a >= k && memcmp(s + z - k, sp[i], k) == 0) { z -= k; again = 1; }
        }
    }
    char *o = glm_malloc(z - a + 1);
    memcpy(o, s + a, z - a);
    o[z - a] = 0;
    return o;
}

void glm_gen_cfg_chat_stops(glm_gen_cfg *g, const glm_tokenizer *tok) { g->n_stop = glm_tokenizer_stop_ids(tok, g->stop_ids); }

void glm_gen_cfg_chat_defaults_for(glm_gen_cfg *g, const glm_tokenizer *tok) {
    glm_gen_cfg_chat_defaults(g);
    if (!prefix_kind(tok)) return;
    g->max_length = 8192; /* ChatGLM2/3's model.chat */
    g->top_p = 0.8f;
    g->temperature = 0.8f;
}

/* "[[训练时间]]" -> "2023年", which every model.chat does. */
static char *train_time(char *s) {
    static const char kTime[] = "[[\xe8\xae\xad\xe7\xbb\x83\xe6\x97\xb6\xe9\x97\xb4]]", kYear[] = "2023\xe5\xb9\xb4";
    char *hit = strstr(s, kTime);
    if (!hit) return s;
    size_t n = 0;
    for (char *p = s; (p = strstr(p, kTime)); p += sizeof kTime - 1) n++;
    char *o = glm_malloc(strlen(s) + n * (sizeof kYear - 1) + 1), *w = o;
    for (char *p = s; *p;) {
        if (!strncmp(p, kTime, sizeof kTime - 1)) { memcpy(w, kYear, sizeof kYear - 1); w += sizeof kYear - 1; p += sizeof kTime - 1; }
        else *w++ = *p++;
    }
    *w = 0;
    free(s);
    return o;
}

char *glm_response_text(const glm_tokenizer *tok, const int32_t *ids, int n, int postprocess) {
    char *raw = glm_tokenizer_decode(tok, ids, n);
    char *res;
    if (postprocess && !prefix_kind(tok)) res = glm_chat_postprocess(raw); /* ChatGLM-6B: also the punctuation */
    else res = strip(raw);
    free(raw);
    /* ChatGLM2/3's process_response: strip and the training-time text (ChatGLM3's tool-call
     * metadata line stays in the text) */
    return postprocess && prefix_kind(tok) ? train_time(res) : res;
}

/* ---- streamer ---- */

void glm_streamer_init(glm_streamer *s, const glm_tokenizer *tok, int postprocess) {
    *s = (glm_streamer){.tok = tok, .postprocess = postprocess};
    s->shown = glm_strdup("");
    s->delta = glm_strdup("");
}

void glm_streamer_free(glm_streamer *s) {
    glm_ids_free(&s->ids);
    free(s->shown);
    free(s->delta);
    *s = (glm_streamer){0};
}

/* Length of the prefix of t that later tokens cannot change: without a trailing incomplete
 * UTF-8 sequence or U+FFFD (a character still arriving byte by byte), a trailing ASCII , ! : ; ?
 * (post-processing widens it if a CJK character follows) and a trailing start of
 * "[[训练时间]]" (post-processing replaces the whole). */
static size_t settled(const char *t, int postprocess, int punctuation) {
    size_t n = strlen(t);
    for (int again = 1; again && n > 0;) {
        again = 0;
        size_t b = n - 1;
        while (b > 0 && n - b < 4 && ((unsigned char)t[b] & 0xC0) == 0x80) b--;
        unsigned char c = (unsigned char)t[b];
        size_t want = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (n - b < want || (n - b == 3 && memcmp(t + b, "\xef\xbf\xbd", 3) == 0)) { n = b; again = 1; }
    }
    if (!postprocess) return n;
    if (punctuation && n > 0 && strchr(",!:;?", t[n - 1])) n--;
    static const char kTime[] = "[[\xe8\xae\xad\xe7\xbb\x83\xe6\x97\xb6\xe9\x97\xb4]]";
    size_t kl = sizeof kTime - 1;
    for (size_t i = n > kl ? n - kl + 1 : 0; i < n; i++)
        if (memcmp(t + i, kTime, n - i) == 0) return i;
    return n;
}

const char *glm_streamer_push(glm_streamer *s, int32_t id) {
    glm_ids_push(&s->ids, id);
    s->delta[0] = 0;
    if (s->diverged) return s->delta;
    char *t = glm_response_text(s->tok, s->ids.data, s->ids.n, s->postprocess);
    size_t k = settled(t, s->postprocess, !prefix_kind(s->tok));
    if (k >= s->n_shown && memcmp(t, s->shown, s->n_shown) == 0) {
        free(s->delta);
        s->delta = glm_malloc(k - s->n_shown + 1);
        memcpy(s->delta, t + s->n_shown, k - s->n_shown);
        s->delta[k - s->n_shown] = 0;
        t[k] = 0;
        free(s->shown);
        s->shown = t;
        s->n_shown = k;
        return s->delta;
    }
    if (k < s->n_shown && memcmp(t, s->shown, k) == 0) { free(t); return s->delta; } /* e.g. a stripped space */
    s->diverged = 1;
    free(t);
    return s->delta;
}

char *glm_streamer_finish(glm_streamer *s, char **tail) {
    char *res = glm_response_text(s->tok, s->ids.data, s->ids.n, s->postprocess);
    size_t n = strlen(res);
    if (!s->diverged && n >= s->n_shown && memcmp(res, s->shown, s->n_shown) == 0) {
        *tail = glm_strdup(res + s->n_shown);
    } else {
        *tail = glm_malloc(n + 2);
        (*tail)[0] = '\n';
        memcpy(*tail + 1, res, n + 1);
    }
    return res;
}

int glm_chat_empty_thought(const glm_tokenizer *tok, glm_ids *out, glm_err *err) {
    return glm_tokenizer_encode_ex(tok, GLM_THOUGHT_EMPTY, strlen(GLM_THOUGHT_EMPTY), GLM_TOK_ENCODE_SPECIAL, out, err);
}
