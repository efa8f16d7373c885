/* Prompts (model.chat's format), response text and the streamer (infer/generate.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/generate.h"

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
    if (glm_tokenizer_kind(tok) == GLM_TOK_CHATGLM1) {
        glm_tokenizer_build_inputs(tok, a.data, a.n, NULL, 0, out);
    } else { /* a plain SentencePiece model adds no special tokens: the model's ids do */
        glm_ids_append(out, a.data, a.n);
        glm_ids_push(out, c->gmask_token_id);
        glm_ids_push(out, c->bos_token_id);
    }
    glm_ids_free(&a);
    /* a ChatGLM2-family config.json names no [gMASK] / <sop> (its tokenizer has them): nothing to check */
    int named = c->gmask_token_id >= 0 && c->bos_token_id >= 0;
    if (named && (out->n < n0 + 2 || out->data[out->n - 2] != c->gmask_token_id || out->data[out->n - 1] != c->bos_token_id)) {
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

int glm_chat_inputs(const glm_tokenizer *tok, const glm_config *c, const char *query, const char *const *hist,
                    int n_hist, int max_prompt, glm_ids *out, int *dropped, char **prompt_text, glm_err *err) {
    /* Rounds are renumbered from 0 after dropping, as if the conversation started there. */
    for (int skip = 0; skip <= n_hist; skip++) {
        char *p = glm_chat_prompt(query, hist + 2 * skip, n_hist - skip);
        out->n = 0;
        int rc = glm_prompt_inputs(tok, c, p, 0, out, err);
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

char *glm_response_text(const glm_tokenizer *tok, const int32_t *ids, int n, int postprocess) {
    char *raw = glm_tokenizer_decode(tok, ids, n);
    char *res = postprocess ? glm_chat_postprocess(raw) : strip(raw);
    free(raw);
    return res;
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
static size_t settled(const char *t, int postprocess) {
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
    if (n > 0 && strchr(",!:;?", t[n - 1])) n--;
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
    size_t k = settled(t, s->postprocess);
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
