/* A row's tokens, text, sampling and end (serve/engine_steps.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "serve/engine_steps.h"

/* Appends s[0..n) to the released text (r->mu held). */
static void release(srv_req *r, const char *s, size_t n) {
    if (n) glm_strbuf_put(&r->text, s, n);
}

/* The earliest stop string in t[0..n): its offset, or -1. */
static long find_stop(const srv_req *r, const char *t) {
    long best = -1;
    for (int i = 0; i < r->n_stops; i++) {
        const char *p = strstr(t, r->stops[i]);
        if (p && (best < 0 || p - t < best)) best = p - t;
    }
    return best;
}

/* How many trailing bytes of t[0..n) could start a stop string (held back while streaming). */
static size_t stop_hold(const srv_req *r, const char *t, size_t n) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stops; i++) {
        size_t k = strlen(r->stops[i]);
        for (size_t j = k - 1 < n ? k - 1 : n; j > hold; j--)
            if (memcmp(t + n - j, r->stops[i], j) == 0) { hold = j; break; }
    }
    return hold;
}

/* Ends a request: its final text, the rest of the stream, the slot back to the pool. cut >= 0:
 * a stop string was found at that offset of the streamer's text. */
void srv_finish(srv_engine *e, srv_req *r, const char *why, long cut, const char *errmsg) {
    char *full;
    int ok = !strcmp(why, "stop") || !strcmp(why, "length");
    if (cut >= 0) {
        full = glm_malloc((size_t)cut + 1);
        memcpy(full, r->st.shown, (size_t)cut);
        full[cut] = 0;
    } else if (ok) {
        pthread_mutex_lock(e->tok_mu);
        full = glm_response_text(e->tok, r->out.data, r->out.n, r->postprocess);
        pthread_mutex_unlock(e->tok_mu);
        long k = find_stop(r, full);
        if (k >= 0) { full[k] = 0; why = "stop"; }
    } else {
        full = NULL;
    }
    pthread_mutex_lock(&r->mu);
    if (!full) full = glm_strdup(r->text.s ? r->text.s : "");
    size_t nf = strlen(full);
    if (nf >= r->text.n && (r->text.n == 0 || memcmp(full, r->text.s, r->text.n) == 0))
        release(r, full + r->text.n, nf - r->text.n);
    r->final = full;
    r->finish = why;
    r->n_out = r->out.n;
    if (errmsg) snprintf(r->error, sizeof r->error, "%s", errmsg);
    r->done = 1;
    pthread_mutex_unlock(&r->mu);
    srv_waker_ring(r->waker);
    if (e->debug)
        glm_info("serve: request in slot %d done (%s): %d prompt + %d tokens, %.3f s to the first token, %.3f s in all", r->slot,
                 why, r->prompt.n, r->out.n, r->t_first > 0 ? r->t_first - r->t_submit : 0.0, glm_now() - r->t_submit);
    long prompt_tokens = r->prompt.n;
    for (int i = 0; i < r->n_texts; i++) prompt_tokens += r->texts[i].n; /* a score request's */
    pthread_mutex_lock(&e->mu);
    srv_metrics_finished(&e->metrics, why, prompt_tokens, r->out.n, r->t_first > 0 ? r->t_first - r->t_submit : -1.0,
                         glm_now() - r->t_submit, &r->itl);
    if (r->slot >= 0) {
        e->active--;
        e->served++;
    }
    pthread_mutex_unlock(&e->mu);
    if (r->slot >= 0) { /* the rows of the tokens it fed stay for a later prompt that begins with them */
        int s = r->slot, n = e->slot_len[s];
        if (strcmp(why, "error") && !r->n_texts && n <= r->prompt.n + r->out.n)
            srv_prefix_keep(&e->pfx, s, r->adapter, r->prompt.data, r->prompt.n, r->out.data, n);
        else
            srv_prefix_drop(&e->pfx, s);
        e->slot[s] = NULL;
        e->slot_len[s] = 0;
        r->slot = -1;
    }
    srv_req_put(r);
}


/* One sampled token of a row: glm_generate's stop rule, the text it settles (released to the
 * request's stream) and whether a stop string or the limit ends the row (*cut: where the stop
 * string starts). Touches only this request and reads the tokenizer, so rows run in parallel;
 * finishing is left to row_apply. */
int srv_row_ends(const srv_engine *e, const srv_req *r, int32_t *ends) {
    int n = 0;
    if (e->m->cfg.eos_token_id >= 0) ends[n++] = e->m->cfg.eos_token_id;
    for (int k = 0; k < r->g.n_stop; k++) ends[n++] = r->g.stop_ids[k];
    for (int k = 0; k < r->n_stop_token_ids; k++) ends[n++] = r->stop_token_ids[k];
    return n;
}

int srv_row_text(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp, long *cut) {
    int32_t ends[SRV_MAX_ENDS];
    int stop = 0;
    for (int k = 0, n = r->ignore_eos ? 0 : srv_row_ends(e, r, ends); k < n; k++) stop |= id == ends[k];
    if (stop) return ROW_STOP_ID;
    glm_ids_push(&r->out, id);
    if (r->seen) r->seen[id] = 1;
    glm_streamer_push(&r->st, id); /* decoding only reads the tokenizer */
    const char *t = r->st.shown;
    size_t n = r->st.n_shown;
    *cut = r->n_stops ? find_stop(r, t) : -1;
    pthread_mutex_lock(&r->mu);
    double now = glm_now();
    if (r->out.n == 1) r->t_first = now;
    else srv_metrics_token_gap(&r->itl, now - r->t_last);
    r->t_last = now;
    if (r->logprobs) {
        r->lps = glm_realloc(r->lps, sizeof *r->lps * (size_t)r->out.n);
        r->lps[r->out.n - 1] = *lp;
    }
    r->n_out = r->out.n;
    if (*cut < 0) {
        size_t keep = n - stop_hold(r, t, n);
        if (keep > r->text.n && !r->st.diverged) release(r, t + r->text.n, keep - r->text.n);
    }
    pthread_mutex_unlock(&r->mu);
    if (*cut < 0) srv_waker_ring(r->waker);
    return *cut >= 0 ? ROW_STOP_TEXT : r->out.n >= r->limit ? ROW_LENGTH : ROW_GOES_ON;
}

/* The engine's side of row_text's answer (one row at a time). */
void srv_row_apply(srv_engine *e, srv_req *r, int what, long cut) {
    if (what != ROW_STOP_ID) {
        pthread_mutex_lock(&e->mu);
        e->tokens++;
        pthread_mutex_unlock(&e->mu);
    }
    if (what == ROW_STOP_ID) srv_finish(e, r, "stop", -1, NULL);
    else if (what == ROW_STOP_TEXT) srv_finish(e, r, "stop", cut, NULL);
    else if (what == ROW_LENGTH) srv_finish(e, r, "length", -1, NULL);
}

void srv_row_token(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp) {
    long cut = -1;
    int what = srv_row_text(e, r, id, lp, &cut);
    srv_row_apply(e, r, what, cut);
}

/* o: the log-probability of token id under raw logits[V], and the k most likely tokens. */
void srv_logprob_of(const float *logits, int V, int32_t id, int k, srv_logprob *o) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) if (logits[j] > mx) mx = logits[j];
    for (int j = 0; j < V; j++) sum += exp((double)logits[j] - mx);
    double lse = mx + log(sum);
    o->id = id;
    o->lp = (float)(logits[id] - lse);
    o->n_top = 0;
    for (int j = 0; j < V && k > 0; j++) { /* insertion into the k best: logit, then the lower id */
        float v = logits[j];
        if (o->n_top == k && !(v > o->top_lp[k - 1])) continue;
        int at = o->n_top < k ? o->n_top++ : k - 1;
        while (at > 0 && v > o->top_lp[at - 1]) { o->top_lp[at] = o->top_lp[at - 1]; o->top_id[at] = o->top_id[at - 1]; at--; }
        o->top_lp[at] = v;
        o->top_id[at] = j;
    }
    for (int i = 0; i < o->n_top; i++) o->top_lp[i] = (float)(o->top_lp[i] - lse);
}

static int by_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* logit_bias, then the frequency and presence penalties over the tokens generated so far (each
 * distinct token once: its count from a sorted copy, so no per-vocabulary table per request). */
static void adjust_logits(const srv_engine *e, const srv_req *r, float *logits) {
    for (int i = 0; i < r->n_bias; i++) logits[r->bias_id[i]] += r->bias[i];
    if (r->out.n < r->min_tokens) { /* nothing that would end the row yet: far below the rest, but
                                      * finite (an infinite logit trips the sampler's guard, model.chat's
                                      * InvalidScoreLogitsProcessor) */
        int32_t ends[SRV_MAX_ENDS];
        for (int k = 0, n = srv_row_ends(e, r, ends); k < n; k++) logits[ends[k]] = GLM_MASKED;
    }
    int n = r->out.n;
    if ((r->frequency_penalty == 0.0f && r->presence_penalty == 0.0f) || n == 0) return;
    int32_t *ids = glm_malloc(sizeof(int32_t) * (size_t)n);
    memcpy(ids, r->out.data, sizeof(int32_t) * (size_t)n);
    qsort(ids, (size_t)n, sizeof *ids, by_id);
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && ids[j] == ids[i]) j++;
        logits[ids[i]] -= r->frequency_penalty * (float)(j - i) + r->presence_penalty;
        i = j;
    }
    free(ids);
}

/* The request's next token from its row of logits (changed in place by the sampler), and with
 * logprobs its srv_logprob from the logits as they came. */
int32_t srv_pick(const srv_engine *e, srv_req *r, float *logits, srv_logprob *lp) {
    int V = e->m->cfg.vocab_size;
    float *raw = NULL;
    if (r->logprobs) {
        raw = glm_malloc(sizeof(float) * (size_t)V);
        memcpy(raw, logits, sizeof(float) * (size_t)V);
    }
    adjust_logits(e, r, logits);
    if (r->con.c) { /* the tokens that cannot come next (or end the answer too soon) far below the rest */
        int32_t ends[SRV_MAX_ENDS];
        glm_constrained_mask(&e->jv, &r->con, ends, srv_row_ends(e, r, ends), logits);
    }
    int32_t id = glm_sample_next(logits, V, &r->g, r->seen, &r->rng);
    glm_constrained_advance(&e->jv, &r->con, id);
    if (raw) srv_logprob_of(raw, V, id, r->top_logprobs, lp);
    free(raw);
    return id;
}

/* A request whose next token glm_sample_next would pick as the argmax of its logits as they are. */
int srv_is_greedy(const srv_req *r) {
    return !r->g.do_sample && (!r->seen || r->g.repetition_penalty == 1.0f) && !r->logprobs && !r->n_bias &&
           r->frequency_penalty == 0.0f && r->presence_penalty == 0.0f && r->out.n >= r->min_tokens && !r->con.c;
}

