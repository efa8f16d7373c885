#include "infer/generate.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void glm_gen_cfg_chat_defaults(glm_gen_cfg *c) {
    *c = (glm_gen_cfg){.do_sample = 1, .max_length = 2048, .max_new_tokens = 0, .temperature = 0.95f,
                       .top_p = 0.7f, .repetition_penalty = 1.0f, .top_k = 50, .seed = 42};
}

typedef struct { float logit; int32_t id; } cand;
static int by_logit_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x < y ? 1 : x > y ? -1 : ((const cand *)a)->id - ((const cand *)b)->id;
}

/* Picks the next token from logits[V] (modified in place). */
static int32_t pick(float *logits, int V, const glm_gen_cfg *g, const glm_ids *seen, glm_rng *rng) {
    /* the original's InvalidScoreLogitsProcessor: any NaN/Inf -> all zero, logit[5] = 5e4 */
    for (int j = 0; j < V; j++)
        if (!isfinite(logits[j])) {
            memset(logits, 0, sizeof(float) * V);
            if (V > 5) logits[5] = 5e4f;
            break;
        }
    if (g->repetition_penalty != 1.0f)
        for (int i = 0; i < seen->n; i++) {
            float *l = &logits[seen->data[i]];
            *l = *l < 0 ? *l * g->repetition_penalty : *l / g->repetition_penalty;
        }
    if (!g->do_sample) {
        int best = 0;
        for (int j = 1; j < V; j++) if (logits[j] > logits[best]) best = j;
        return best;
    }
    float temp = g->temperature > 0 ? g->temperature : 1.0f;
    cand *c = malloc(sizeof(cand) * V);
    for (int j = 0; j < V; j++) c[j] = (cand){logits[j] / temp, j};
    qsort(c, V, sizeof(cand), by_logit_desc);
    int keep = g->top_k > 0 && g->top_k < V ? g->top_k : V;
    double mx = c[0].logit, sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(c[i].logit - mx);
    if (g->top_p < 1.0f) { /* smallest prefix whose probability mass reaches top_p (at least one) */
        double acc = 0;
        int n = 0;
        while (n < keep) {
            acc += exp(c[n].logit - mx) / sum;
            n++;
            if (acc >= g->top_p) break;
        }
        keep = n;
        sum = 0;
        for (int i = 0; i < keep; i++) sum += exp(c[i].logit - mx);
    }
    double r = glm_rng_uniform(rng) * sum, acc = 0;
    int32_t id = c[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        acc += exp(c[i].logit - mx);
        if (r < acc) { id = c[i].id; break; }
    }
    free(c);
    return id;
}

int glm_generate_ids(glm_model *m, const glm_config *c, const int32_t *prompt, int n, const glm_gen_cfg *g,
                     glm_rng *rng, glm_ids *out, const glm_tokenizer *tok, glm_stream_fn stream, void *sctx,
                     glm_err *err) {
    int ctx = -1, mask_pos = -1;
    for (int i = 0; i < n; i++) if (prompt[i] == c->bos_token_id) { ctx = i; break; }
    for (int i = 0; i < n && mask_pos < 0; i++) if (prompt[i] == c->gmask_token_id) mask_pos = i;
    for (int i = 0; i < n && mask_pos < 0; i++) if (prompt[i] == c->mask_token_id) mask_pos = i;
    if (ctx < 0 || mask_pos < 0) return glm_fail(err, "the prompt must contain [gMASK] (or [MASK]) and <sop>");
    int max_len = g->max_new_tokens > 0 ? n + g->max_new_tokens : g->max_length;
    if (max_len <= n) return glm_fail(err, "max_length %d leaves no room after a %d-token prompt", max_len, n);
    int V = c->vocab_size;
    int32_t *pos = malloc(sizeof(int32_t) * n * 4), *bpos = pos + n, *lo = pos + 2 * n, *hi = pos + 3 * n;
    for (int i = 0; i < n; i++) {
        pos[i] = i < ctx ? i : mask_pos;
        bpos[i] = i < ctx ? 0 : i - ctx + 1;
        lo[i] = 0;
        hi[i] = ctx > i + 1 ? ctx : i + 1;
    }
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, 1, max_len);
    float *logits = malloc(sizeof(float) * V);
    glm_ids seen = {0};
    glm_ids_append(&seen, prompt, n);
    int rc = glm_forward_cached(m, &kv, n, prompt, pos, bpos, lo, hi, NULL, logits, err);
    char *prev = glm_strdup("");
    for (int len = n; rc == 0 && len < max_len; len++) {
        int32_t id = pick(logits, V, g, &seen, rng);
        if (id == c->eos_token_id) break;
        glm_ids_push(out, id);
        glm_ids_push(&seen, id);
        if (stream && tok) { /* print what the new token added to the decoded text */
            char *now = glm_tokenizer_decode(tok, out->data, out->n);
            size_t pl = strlen(prev);
            if (strncmp(now, prev, pl) == 0) stream(sctx, now + pl);
            free(prev);
            prev = now;
        }
        if (len + 1 >= max_len) break;
        int32_t p1 = mask_pos, b1 = len - ctx + 1, l1 = 0, h1 = len + 1;
        rc = glm_forward_cached(m, &kv, 1, &id, &p1, &b1, &l1, &h1, NULL, logits, err);
    }
    free(prev);
    glm_ids_free(&seen);
    free(logits);
    free(pos);
    glm_kvcache_free(m, &kv);
    return rc;
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

char *glm_generate_text(glm_model *m, const glm_tokenizer *tok, const char *text, const glm_gen_cfg *g, glm_rng *rng,
                        glm_stream_fn stream, void *sctx, glm_err *err) {
    glm_ids ids = {0}, out = {0};
    if (glm_tokenizer_encode(tok, text, strlen(text), &ids, err)) return NULL;
    glm_ids_push(&ids, m->cfg.gmask_token_id);
    glm_ids_push(&ids, m->cfg.bos_token_id);
    int rc = glm_generate_ids(m, &m->cfg, ids.data, ids.n, g, rng, &out, tok, stream, sctx, err);
    char *res = NULL;
    if (rc == 0) {
        char *raw = glm_tokenizer_decode(tok, out.data, out.n);
        res = glm_chat_postprocess(raw);
        free(raw);
    }
    glm_ids_free(&ids);
    glm_ids_free(&out);
    return res;
}
