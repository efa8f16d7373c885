/* OpenAI's logprobs objects for a response's tokens (serve/api.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/reader.h"
#include "serve/api.h"
#include "tokenizer/tokenizer.h"

/* A token's text for the "token" fields: its bytes when they are UTF-8 on their own, else
 * "bytes:\xNN..." (a piece of a character split over tokens); *chars: its length in characters. */
static char *token_text(const glm_tokenizer *tok, int32_t id, cJSON **bytes, long *chars) {
    size_t n;
    char *b = glm_tokenizer_token_bytes(tok, id, &n);
    int valid = 1;
    for (size_t i = 0; i < n && valid; i++) valid = b[i] != 0;
    valid = valid && glm_utf8_valid(b, n);
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)b[i]));
    }
    *chars = 0;
    for (size_t i = 0; i < n; i++) *chars += ((unsigned char)b[i] & 0xC0) != 0x80;
    if (valid) return b;
    char *t = glm_malloc(6 + 4 * n + 1), *p = t + sprintf(t, "bytes:");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "\\x%02x", (unsigned char)b[i]);
    free(b);
    return t;
}

cJSON *srv_logprobs_json(const glm_tokenizer *tok, const srv_logprob *lps, int n, int top, int chat, long *offset) {
    cJSON *o = cJSON_CreateObject();
    long chars;
    if (chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int i = 0; i < n; i++) {
            cJSON *e = cJSON_CreateObject(), *bytes;
            char *t = token_text(tok, lps[i].id, &bytes, &chars);
            cJSON_AddStringToObject(e, "token", t);
            free(t);
            cJSON_AddNumberToObject(e, "logprob", lps[i].lp);
            cJSON_AddItemToObject(e, "bytes", bytes);
            cJSON *alts = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int k = 0; k < lps[i].n_top && k < top; k++) {
                cJSON *a = cJSON_CreateObject(), *ab;
                t = token_text(tok, lps[i].top_id[k], &ab, &chars);
                cJSON_AddStringToObject(a, "token", t);
                free(t);
                cJSON_AddNumberToObject(a, "logprob", lps[i].top_lp[k]);
                cJSON_AddItemToObject(a, "bytes", ab);
                cJSON_AddItemToArray(alts, a);
            }
            cJSON_AddItemToArray(content, e);
        }
        cJSON_AddNullToObject(o, "refusal");
        return o;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lp = cJSON_AddArrayToObject(o, "token_logprobs"),
          *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = 0; i < n; i++) {
        char *t = token_text(tok, lps[i].id, NULL, &chars);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(t));
        free(t);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += chars;
        if (lps[i].n_top < 0) { /* an echoed prompt's first token: nothing before it to predict it */
            cJSON_AddItemToArray(lp, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lp, cJSON_CreateNumber(lps[i].lp));
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; k < lps[i].n_top && k < top; k++) {
            long c2;
            char *a = token_text(tok, lps[i].top_id[k], NULL, &c2);
            if (!cJSON_GetObjectItemCaseSensitive(d, a)) cJSON_AddNumberToObject(d, a, lps[i].top_lp[k]);
            free(a);
        }
        cJSON_AddItemToArray(tops, d);
    }
    return o;
}
