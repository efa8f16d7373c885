/* The continuous-batching decode engine (serve/engine.h). */
#include "serve/engine.h"
#include "parallel/pipe/pipe_infer.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/log.h"
#include "model/adapter.h"

/* ---------------------------------------------------------------- adapters */

/* Shell k: a model holding only the adapter's rows of layers [l0, l1) (the trainable table
 * under its LoRA config), so the adapter loader fills them exactly as for generate --adapter. */
static int load_shell(srv_adapter *a, int k, glm_backend *be, const glm_config *base, int l0, int l1, glm_err *err) {
    glm_model *s = &a->shell[k];
    s->cfg = *base;
    s->cfg.peft = a->peft;
    s->fam = glm_family_of(&s->cfg);
    s->be = be;
    s->layer_lo = l0;
    s->layer_hi = l1;
    s->first = s->last = 1;
    glm_table_build_range(&s->tab, &s->cfg, l0, l1, 1, 1);
    size_t bytes = (s->tab.total ? s->tab.total : 1) * glm_dtype_size(be->dtype);
    s->params = be->alloc(be, bytes);
    be->zero(be, s->params, bytes);
    if (glm_adapter_load(s, a->dir, err)) return -1;
    for (int i = 0; i < s->tab.n; i++) {
        const glm_tensor *t = &s->tab.t[i];
        if (!glm_is_lora_ab(t->kind) || t->layer < 0) continue;
        int j = t->kind - T_QKV_LA; /* A, B of module 0, then of module 1, ... */
        a->ptr[t->layer][(j % 2) * 4 + j / 2] = glm_at(be, s->params, t->offset);
    }
    return 0;
}

void srv_adapter_free(srv_adapter *a) {
    for (int k = 0; k < a->n; k++) {
        glm_model *s = &a->shell[k];
        if (s->params) s->be->free(s->be, s->params);
        glm_table_free(&s->tab);
    }
    free(a->shell);
    free(a->ptr);
    free(a->vhead);
    memset(a, 0, sizeof *a);
}

int srv_adapter_load(srv_adapter *a, glm_lm lm, const char *name, const char *dir, glm_err *err) {
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    if (glm_adapter_read_config(dir, &a->peft, err)) return glm_wrap(err, "--adapter %s=%s: ", name, dir);
    if (a->peft.kind != GLM_FT_LORA) {
        glm_fail(err, "--adapter %s=%s is a P-Tuning v2 checkpoint: --adapter takes LoRA adapters", name, dir);
        return glm_hint(err, "serve the base with its prefix as the model: --ptuning_checkpoint %s", dir);
    }
    if (a->peft.use_dora) { /* its row scales would have to swap with it, per request */
        glm_fail(err, "--adapter %s=%s is a DoRA adapter (use_dora): serve swaps LoRA adapters per request", name, dir);
        return glm_hint(err, "merge it into its base (glmtrain merge --model_name_or_path BASE --adapter %s --output_dir OUT) "
                             "and serve OUT", dir);
    }
    if (a->peft.pissa) { /* its base is the residual, which would have to swap with it, per request */
        glm_fail(err, "--adapter %s=%s is a PiSSA adapter (init_lora_weights pissa): it was trained on its own residual base, "
                      "and serve swaps only the adapters per request", name, dir);
        return glm_hint(err, "serve its converted form (%s/pissa_converted, written with --pissa_convert), or merge it into "
                             "its base (glmtrain merge --model_name_or_path BASE --adapter %s --output_dir OUT) and serve OUT",
                        dir, dir);
    }
    if (a->peft.extra_modules) { /* whole modules beside it: the model's own rows would swap per request */
        glm_fail(err, "--adapter %s=%s trains whole modules beside LoRA (modules_to_save): serve swaps only the adapters "
                      "per request", name, dir);
        return glm_hint(err, "merge it into its base (glmtrain merge --model_name_or_path BASE --adapter %s --output_dir OUT) "
                             "and serve OUT", dir);
    }
    a->peft.lora_dropout = 0; /* inference: no dropout, and no dropout buffer */
    const glm_config *base = lm.pipe ? &lm.pipe->cfg : &lm.m->cfg;
    a->n = lm.pipe ? lm.pipe->n : 1;
    a->shell = glm_calloc((size_t)a->n, sizeof *a->shell);
    a->ptr = glm_calloc((size_t)base->num_layers, sizeof *a->ptr);
    int rc = 0;
    for (int k = 0; k < a->n && rc == 0; k++) { /* the whole model's layers, or stage k's on its device */
        const glm_model *st = lm.pipe ? &lm.pipe->st[k] : lm.m;
        int prev = lm.pipe ? glm_pipe_enter(lm.pipe, k) : -1;
        rc = load_shell(a, k, st->be, base, st->layer_lo, st->layer_hi, err);
        glm_pipe_restore(prev);
    }
    if (rc == 0 && glm_value_head_read(dir, base->hidden_size, &a->vhead, err) >= 0) return 0;
    srv_adapter_free(a);
    return glm_wrap(err, "--adapter %s=%s: ", name, dir);
}

/* The models the engine runs: the whole one, or each stage of a device map. */
static int stages(const srv_engine *e) { return e->pipe ? e->pipe->n : 1; }
static glm_model *stage(srv_engine *e, int s) { return e->pipe ? &e->pipe->st[s] : e->m; }

/* The model's adapter views and settings for adapter k (-1: the base), in every stage. */
static void set_adapter(srv_engine *e, int k) {
    if (k == e->cur) return;
    for (int s = 0; s < stages(e); s++) {
        glm_model *m = stage(e, s);
        for (int l = m->layer_lo; l < m->layer_hi; l++)
            for (int i = 0; i < 4; i++) {
                m->w.layer[l].lora_a[i] = k >= 0 ? e->ad[k].ptr[l][i] : NULL;
                m->w.layer[l].lora_b[i] = k >= 0 ? e->ad[k].ptr[l][4 + i] : NULL;
            }
        m->cfg.peft = k >= 0 ? e->ad[k].peft : e->base_peft;
    }
    e->cur = k;
}

/* ---------------------------------------------------------------- requests */

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
static void finish(srv_engine *e, srv_req *r, const char *why, long cut, const char *errmsg) {
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

/* What a row's new token asks for once its text is out (row_text). */
enum { ROW_GOES_ON, ROW_STOP_ID, ROW_STOP_TEXT, ROW_LENGTH };

/* One sampled token of a row: glm_generate's stop rule, the text it settles (released to the
 * request's stream) and whether a stop string or the limit ends the row (*cut: where the stop
 * string starts). Touches only this request and reads the tokenizer, so rows run in parallel;
 * finishing is left to row_apply. */
static int row_text(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp, long *cut) {
    const glm_config *c = &e->m->cfg;
    int stop = id == c->eos_token_id;
    for (int k = 0; k < r->g.n_stop; k++) stop |= id == r->g.stop_ids[k];
    if (r->ignore_eos) stop = 0;
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
static void row_apply(srv_engine *e, srv_req *r, int what, long cut) {
    if (what != ROW_STOP_ID) {
        pthread_mutex_lock(&e->mu);
        e->tokens++;
        pthread_mutex_unlock(&e->mu);
    }
    if (what == ROW_STOP_ID) finish(e, r, "stop", -1, NULL);
    else if (what == ROW_STOP_TEXT) finish(e, r, "stop", cut, NULL);
    else if (what == ROW_LENGTH) finish(e, r, "length", -1, NULL);
}

static void row_token(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp) {
    long cut = -1;
    int what = row_text(e, r, id, lp, &cut);
    row_apply(e, r, what, cut);
}

/* o: the log-probability of token id under raw logits[V], and the k most likely tokens. */
static void logprob_of(const float *logits, int V, int32_t id, int k, srv_logprob *o) {
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
static void adjust_logits(const srv_req *r, float *logits) {
    for (int i = 0; i < r->n_bias; i++) logits[r->bias_id[i]] += r->bias[i];
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
static int32_t pick(srv_req *r, float *logits, int V, srv_logprob *lp) {
    if (!r->logprobs) {
        adjust_logits(r, logits);
        return glm_sample_next(logits, V, &r->g, r->seen, &r->rng);
    }
    float *raw = glm_malloc(sizeof(float) * (size_t)V);
    memcpy(raw, logits, sizeof(float) * (size_t)V);
    adjust_logits(r, logits);
    int32_t id = glm_sample_next(logits, V, &r->g, r->seen, &r->rng);
    logprob_of(raw, V, id, r->top_logprobs, lp);
    free(raw);
    return id;
}

/* ---------------------------------------------------------------- steps */

/* One forward of rows [slot0, slot0 + nrows) of the pool, on the whole model or stage by stage
 * (n_new: each row's real new tokens, NULL all Tq).
 * greedy: every row decodes greedily without a repetition penalty, so the device picks the
 * tokens (e->greedy) and the logits stay there; otherwise they come to e->logits. */
static int forward_slots(srv_engine *e, int slot0, int nrows, int Tq, const int *len, const int *n_new, const int32_t *ids,
                         int greedy, glm_err *err) {
    double t0 = glm_now();
    float *lg = greedy ? NULL : e->logits;
    int32_t *gr = greedy ? e->greedy : NULL;
    int rc = e->pipe ? glm_pipe_forward_cached_slots(e->pipe, e->pc, slot0, nrows, Tq, len, n_new, ids, e->pos, e->bpos,
                                                     e->lo, e->hi, lg, gr, NULL, err)
                     : glm_stage_forward_cached_slots(e->m, &e->kv, slot0, nrows, Tq, len, n_new, ids, e->pos, e->bpos,
                                                      e->lo, e->hi, NULL, NULL, lg, gr, NULL, err);
    e->t_forward += glm_now() - t0; /* engine thread only; read under mu by /health after a step */
    return rc;
}

static int32_t pad_id(const srv_engine *e) {
    const glm_config *c = &e->m->cfg;
    return c->pad_token_id >= 0 && c->pad_token_id < c->vocab_size ? c->pad_token_id : 0;
}

/* A request whose next token glm_sample_next would pick as the argmax of its logits as they are. */
static int is_greedy(const srv_req *r) {
    return !r->g.do_sample && (!r->seen || r->g.repetition_penalty == 1.0f) && !r->logprobs && !r->n_bias &&
           r->frequency_penalty == 0.0f && r->presence_penalty == 0.0f;
}

/* Rows [i0, i0 + m) of a prompt's log-probabilities (rows from r0 of the last call; m <=
 * GLM_ROWS_LOGITS_MAX): with at most one alternative on the device (only 3 numbers a row come
 * back), with more from the rows' logits on the host. */
static int prompt_rows(srv_engine *e, srv_req *r, int r0, int i0, int m, float *buf, srv_logprob *lps, glm_err *err) {
    int V = e->m->cfg.vocab_size, top = r->top_logprobs, rc;
    const int32_t *next = r->prompt.data + i0 + 1; /* row i0 + i predicts token i0 + i + 1 */
    if (top <= 1) {
        float lp[GLM_ROWS_LOGITS_MAX], best_lp[GLM_ROWS_LOGITS_MAX];
        int32_t best[GLM_ROWS_LOGITS_MAX];
        rc = e->pipe ? glm_pipe_cached_rows_logprobs(e->pipe, e->pc, r0 + i0, m, next, lp, top ? best : NULL, best_lp, err)
                     : glm_cached_rows_logprobs(e->m, &e->kv, r0 + i0, m, next, lp, top ? best : NULL, best_lp, err);
        for (int i = 0; i < m && !rc; i++)
            lps[i0 + i + 1] = (srv_logprob){.id = next[i], .lp = lp[i], .n_top = top, .top_id = {top ? best[i] : 0},
                                            .top_lp = {top ? best_lp[i] : 0.0f}};
        return rc;
    }
    rc = e->pipe ? glm_pipe_cached_rows_logits(e->pipe, e->pc, r0 + i0, m, buf, err)
                 : glm_cached_rows_logits(e->m, &e->kv, r0 + i0, m, buf, err);
#pragma omp parallel for schedule(static) if (!rc && m > 1)
    for (int i = 0; i < m; i++)
        if (!rc) logprob_of(buf + (size_t)i * V, V, next[i], top, &lps[i0 + i + 1]);
    return rc;
}

/* The prompt's log-probabilities (echo) after the forward of its tokens [from, to) (rows from r0
 * of the call): token i + 1 under the logits of row i, GLM_ROWS_LOGITS_MAX rows at a time; the
 * first token has none. The entries go to r->plps once the prompt's last tokens are in. */
static int prompt_logprobs(srv_engine *e, srv_req *r, int r0, int from, int to, glm_err *err) {
    int n = r->prompt.n, V = e->m->cfg.vocab_size, k = GLM_ROWS_LOGITS_MAX, rc = 0, end = to < n - 1 ? to : n - 1;
    if (!r->plps_part) {
        r->plps_part = glm_calloc((size_t)n, sizeof *r->plps_part);
        r->plps_part[0] = (srv_logprob){.id = r->prompt.data[0], .lp = NAN, .n_top = -1};
    }
    float *buf = r->top_logprobs > 1 ? glm_malloc(sizeof(float) * (size_t)k * V) : NULL;
    double t0 = glm_now();
    for (int i0 = from; i0 < end && !rc; i0 += k) /* row i0 of the prompt is row r0 + i0 - from of the call */
        rc = prompt_rows(e, r, r0 - from, i0, end - i0 < k ? end - i0 : k, buf, r->plps_part, err);
    e->t_forward += glm_now() - t0;
    free(buf);
    if (!rc && to == n) {
        pthread_mutex_lock(&r->mu);
        r->plps = r->plps_part;
        r->n_plps = n;
        pthread_mutex_unlock(&r->mu);
        r->plps_part = NULL;
    }
    return rc;
}

/* A new request's state before its prefill: 1 when it goes on to a forward, 0 when it is already
 * finished (echo alone, or no room). */
static int prefill_begin(srv_engine *e, srv_req *r) {
    int n = r->prompt.n, V = e->m->cfg.vocab_size;
    r->admitted = 1;
    glm_rng_seed(&r->rng, r->seed);
    glm_streamer_init(&r->st, e->tok, r->postprocess);
    if (r->no_generate && !r->prompt_logprobs) { finish(e, r, "length", -1, NULL); return 0; } /* echo alone */
    if (r->g.repetition_penalty != 1.0f) {
        r->seen = glm_calloc((size_t)V, 1);
        for (int i = 0; i < n; i++) r->seen[r->prompt.data[i]] = 1;
    }
    r->limit = r->no_generate ? 0 : glm_gen_limit(&r->g, n);
    if (n > e->Tmax || (!r->no_generate && (r->limit <= 0 || n + r->limit > e->Tmax))) {
        finish(e, r, "error", -1, "the prompt leaves no room for a response");
        return 0;
    }
    return 1;
}

/* Row b of a call of Tq new tokens a row (e->ids, pos, bpos, lo, hi from b * Tq): the ids
 * p[from, end) (end - from <= Tq), the slot holding the rows of the first `from` already, then
 * padding that sees only the slot's first key and whose results are dropped; *n_new: end - from.
 * -1 when p breaks the model's position rule: then the whole row is padding (*n_new 1). */
static int fill_row(srv_engine *e, int b, int Tq, const glm_ids *p, int from, int end, int state[2], int *n_new) {
    int n = p->n, m = end - from, cached = from, at = b * Tq, bad = 0;
    int32_t *pos = glm_malloc(sizeof(int32_t) * 3 * (size_t)n), *bpos = pos + n, *rh = bpos + n;
    e->lens[b] = cached;
    if (e->m->fam->prompt_positions(&e->m->cfg, p->data, n, pos, bpos, rh, state)) {
        bad = -1;
        m = 0;
        e->lens[b] = 0;
    }
    *n_new = m ? m : 1;
    for (int i = 0; i < m; i++) { /* key ranges and positions count from the slot's first token */
        e->ids[at + i] = p->data[cached + i];
        e->pos[at + i] = pos[cached + i];
        e->bpos[at + i] = bpos[cached + i];
        e->lo[at + i] = 0;
        e->hi[at + i] = rh[cached + i];
    }
    free(pos);
    for (int i = m; i < Tq; i++) {
        e->ids[at + i] = pad_id(e);
        e->pos[at + i] = e->bpos[at + i] = 0;
        e->lo[at + i] = 0;
        e->hi[at + i] = 1;
    }
    return bad;
}

/* The requests of cp[0..ncp) that share src's prompt (share_src), src being row b of the call
 * that just prefilled it: src's cache rows copied into their slots, its positions' state and
 * prompt log-probabilities taken, and each one's first token from src's row of logits (sampled
 * from a copy, with its own random stream), or the device's greedy pick. Before src's own token:
 * src may finish with it. */
static void share_prefill(srv_engine *e, const srv_req *src, int b, int greedy, srv_req **cp, int ncp) {
    int V = e->m->cfg.vocab_size, n = src->prompt.n, shared = 0;
    float *row = greedy ? NULL : glm_malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < ncp; i++) {
        srv_req *r = cp[i];
        if (r->share_src != src) continue;
        shared++;
        if (e->pipe) glm_pipe_cache_copy_slot(e->pipe, e->pc, src->slot, r->slot, n);
        else glm_kvcache_copy_slot(e->m, &e->kv, src->slot, r->slot, n);
        e->slot_len[r->slot] = n;
        memcpy(r->state, src->state, sizeof r->state);
        if (src->n_plps) {
            srv_logprob *lps = glm_malloc(sizeof *lps * (size_t)src->n_plps);
            memcpy(lps, src->plps, sizeof *lps * (size_t)src->n_plps);
            pthread_mutex_lock(&r->mu);
            r->plps = lps;
            r->n_plps = src->n_plps;
            pthread_mutex_unlock(&r->mu);
        }
        if (r->no_generate) { finish(e, r, "length", -1, NULL); continue; }
        srv_logprob lp;
        if (row) memcpy(row, e->logits + (size_t)b * V, sizeof(float) * (size_t)V);
        row_token(e, r, row ? pick(r, row, V, &lp) : e->greedy[b], &lp);
    }
    free(row);
    if (e->debug && shared) glm_info("serve: a prompt of %d tokens prefilled once for %d requests", n, shared + 1);
}

/* The requests of cp[0..ncp) that share src's prompt end as src did not start: with msg. */
static void fail_shares(srv_engine *e, const srv_req *src, srv_req **cp, int ncp, const char *msg) {
    for (int i = 0; i < ncp; i++)
        if (cp[i]->share_src == src) finish(e, cp[i], "error", -1, msg);
}

/* New requests g[0..n) in consecutive slots, of one adapter, prefilled by one forward: row b holds
 * g[b]'s prompt after the tokens its slot already holds (cached), padded to the longest
 * (glm_stage_forward_cached_slots' n_new), so each row computes as alone. Then each one's prompt log-probabilities (echo) and first token. cp[0..ncp): this
 * step's requests that share a prompt (share_src) prefilled elsewhere, some maybe here. */
static void prefill_group(srv_engine *e, srv_req **g, int n, srv_req **cp, int ncp) {
    const glm_config *c = &e->m->cfg;
    int Tq = 0, V = c->vocab_size, greedy = 1;
    for (int b = 0; b < n; b++) {
        if (g[b]->prompt.n - g[b]->fed > Tq) Tq = g[b]->prompt.n - g[b]->fed;
        greedy &= is_greedy(g[b]);
        for (int i = 0; i < ncp; i++)
            if (cp[i]->share_src == g[b]) greedy &= is_greedy(cp[i]);
    }
    int *n_new = glm_malloc(sizeof(int) * (size_t)n);
    const char *bad = "the prompt has no [gMASK] (or [MASK]) and <sop>";
    for (int b = 0; b < n; b++)
        if (fill_row(e, b, Tq, &g[b]->prompt, g[b]->fed, g[b]->prompt.n, g[b]->state, &n_new[b])) {
            fail_shares(e, g[b], cp, ncp, bad);
            finish(e, g[b], "error", -1, bad); /* its row runs as padding */
            g[b] = NULL;
        }
    int b0 = 0, rc = 0;
    while (b0 < n && !g[b0]) b0++;
    glm_err err = {0};
    if (b0 < n) { /* rows run in slots g[b0]->slot - b0 onwards (a failed one's freed slot as padding) */
        set_adapter(e, g[b0]->adapter);
        rc = forward_slots(e, g[b0]->slot - b0, n, Tq, e->lens, n_new, e->ids, greedy, &err);
    }
    free(n_new);
    if (rc) glm_warn("serve: prefill failed: %s", err.msg);
    else if (e->debug && n > 1) glm_info("serve: %d prompts prefilled together (%d tokens a row)", n, Tq);
    for (int b = 0; b < n; b++) {
        srv_req *r = g[b];
        if (!r) continue;
        glm_err rerr = {0};
        const char *fail = rc ? err.msg : NULL;
        if (!fail) {
            if (r->prompt_logprobs && prompt_logprobs(e, r, b * Tq, r->fed, r->prompt.n, &rerr)) {
                glm_warn("serve: the prompt's log-probabilities failed: %s", rerr.msg);
                fail = rerr.msg;
            }
        }
        if (fail) {
            fail_shares(e, r, cp, ncp, fail);
            finish(e, r, "error", -1, fail);
            continue;
        }
        e->slot_len[r->slot] = r->fed = r->prompt.n;
        share_prefill(e, r, b, greedy, cp, ncp);
        if (r->no_generate) { finish(e, r, "length", -1, NULL); continue; }
        srv_logprob lp;
        row_token(e, r, greedy ? e->greedy[b] : pick(r, e->logits + (size_t)b * V, V, &lp), &lp);
    }
}

/* The next cap tokens of r's prompt, which is longer than that after what its slot holds, through
 * its slot alone; no token is sampled (the prompt's last part prefills as any prompt does). */
static void prefill_chunk(srv_engine *e, srv_req *r, int cap) {
    int n_new, from = r->fed;
    glm_err err = {0};
    if (fill_row(e, 0, cap, &r->prompt, from, from + cap, r->state, &n_new)) { /* a causal family takes any prompt */
        finish(e, r, "error", -1, "the prompt does not fit the model's positions");
        return;
    }
    set_adapter(e, r->adapter);
    int rc = forward_slots(e, r->slot, 1, cap, e->lens, &n_new, e->ids, 1, &err); /* greedy: no logits to the host */
    if (!rc && r->prompt_logprobs) rc = prompt_logprobs(e, r, 0, from, from + cap, &err);
    if (rc) {
        glm_warn("serve: prefill failed: %s", err.msg);
        finish(e, r, "error", -1, err.msg);
        return;
    }
    e->slot_len[r->slot] = r->fed = from + cap;
    if (e->debug) glm_info("serve: %d of a prompt's %d tokens prefilled (%d a step)", r->fed, r->prompt.n, cap);
}

/* Prefills: the new requests adm[0..n) and those whose prompts prefill in parts, cont[0..ncont).
 * A prompt with more tokens left than the work buffers hold (a causal family's: GLM v1's buffers
 * hold any prompt) runs its next part alone. The rest, in slot order: runs of consecutive slots of
 * one adapter share a forward, up to the work buffers' tokens (rows x the longest part left); a
 * request that shares a prompt prefilled in this step (share_src, admitted into the slots after
 * the others) takes its cache rows instead, unless that prompt prefills in parts: then it
 * prefills its own. */
static void prefill_all(srv_engine *e, srv_req **adm, int n, srv_req **cont, int ncont) {
    int cap = e->batch_tokens, k = 0, ns = 0, ncp = 0;
    for (int i = 0; i < n; i++)
        if (adm[i]->slot >= 0 && !adm[i]->n_texts && prefill_begin(e, adm[i])) adm[k++] = adm[i];
    srv_req **src = glm_malloc(sizeof *src * (size_t)(k + ncont + 1)), **cp = glm_malloc(sizeof *cp * (size_t)(k + 1));
    for (int i = 0; i < k; i++) { /* one whose first request is not prefilled whole here prefills itself */
        const srv_req *s = adm[i]->share_src;
        int found = 0;
        for (int j = 0; j < k && s && !found; j++) found = adm[j] == s && s->prompt.n - s->fed <= cap;
        if (!found) adm[i]->share_src = NULL;
        if (adm[i]->share_src) cp[ncp++] = adm[i];
        else src[ns++] = adm[i];
    }
    for (int i = 0; i < ncont; i++) src[ns++] = cont[i];
    int nw = 0;
    for (int i = 0; i < ns; i++) { /* the parts first; the whole rest in slot order (insertion) */
        srv_req *r = src[i];
        if (r->prompt.n - r->fed > cap) { prefill_chunk(e, r, cap); continue; }
        int j = nw++;
        for (; j > 0 && src[j - 1]->slot > r->slot; j--) src[j] = src[j - 1];
        src[j] = r;
    }
    ns = nw;
    for (int i = 0; i < ns;) { /* rows x the longest part left within the buffers, and every row's
                                * tokens held + the call's within its slot */
        int j = i + 1, longest = src[i]->prompt.n - src[i]->fed, most_fed = src[i]->fed;
        while (j < ns && src[j]->slot == src[j - 1]->slot + 1 && src[j]->adapter == src[i]->adapter) {
            int l = src[j]->prompt.n - src[j]->fed, mf = src[j]->fed;
            if (l < longest) l = longest;
            if (mf < most_fed) mf = most_fed;
            if ((long)(j - i + 1) * l > cap || mf + l > e->Tmax) break;
            longest = l;
            most_fed = mf;
            j++;
        }
        prefill_group(e, src + i, j - i, cp, ncp);
        i = j;
    }
    for (int i = 0; i < ncp; i++) cp[i]->share_src = NULL; /* this step's alone */
    free(src);
    free(cp);
}

/* A score request's next texts (one forward, no logits): through its slot and the free slots
 * right after it (this step's admissions are done, so they stay free), one text a row padded to
 * the longest, up to the work buffers' tokens; each scored by the value head at its last token,
 * as --stage rm scores an example (TRL's ValueHead without dropout: h . w + b). The request ends
 * with its last text. */
static void score_next(srv_engine *e, srv_req *r) {
    const glm_config *c = &e->m->cfg;
    int H = c->hidden_size, cap = e->batch_tokens, k = 0, Tq = 0;
    glm_err err = {0};
    if (!r->admitted) { r->admitted = 1; glm_streamer_init(&r->st, e->tok, 0); }
    while (r->n_scored + k < r->n_texts && (k == 0 || (r->slot + k < e->nslots && !e->slot[r->slot + k]))) {
        int n = r->texts[r->n_scored + k].n, l = n > Tq ? n : Tq;
        if (k > 0 && (long)(k + 1) * l > cap) break;
        Tq = l;
        k++;
    }
    int *n_new = glm_malloc(sizeof(int) * (size_t)k), bad = 0;
    /* the server checked the positions and the length when the request came */
    for (int b = 0; b < k; b++) {
        const glm_ids *t = &r->texts[r->n_scored + b];
        bad |= Tq > e->Tmax || Tq > cap || fill_row(e, b, Tq, t, 0, t->n, r->state, &n_new[b]);
        srv_prefix_drop(&e->pfx, r->slot + b); /* the free slots after it: their rows are overwritten */
    }
    if (bad) {
        free(n_new);
        finish(e, r, "error", -1, "a text does not fit the model's positions");
        return;
    }
    set_adapter(e, r->adapter);
    const float *vh = r->adapter >= 0 ? e->ad[r->adapter].vhead : e->vhead;
    double t0 = glm_now();
    int rc = e->pipe ? glm_pipe_forward_cached_slots(e->pipe, e->pc, r->slot, k, Tq, e->lens, n_new, e->ids, e->pos, e->bpos,
                                                     e->lo, e->hi, NULL, NULL, e->hidden, &err)
                     : glm_stage_forward_cached_slots(e->m, &e->kv, r->slot, k, Tq, e->lens, n_new, e->ids, e->pos, e->bpos,
                                                      e->lo, e->hi, NULL, NULL, NULL, NULL, e->hidden, &err);
    e->t_forward += glm_now() - t0;
    free(n_new);
    if (rc || !vh) {
        if (rc) glm_warn("serve: scoring failed: %s", err.msg);
        finish(e, r, "error", -1, rc ? err.msg : "the model has no value head");
        return;
    }
    if (e->debug && k > 1) glm_info("serve: %d texts scored together (%d tokens a row)", k, Tq);
    for (int b = 0; b < k; b++) {
        const float *h = e->hidden + (size_t)b * H;
        double v = vh[H];
        for (int j = 0; j < H; j++) v += (double)h[j] * vh[j];
        r->scores[r->n_scored++] = v;
    }
    if (r->n_scored == r->n_texts) finish(e, r, "stop", -1, NULL);
}

/* One decode forward for the rows of adapter k (-1: base) over the slot range they span. */
static void decode_group(srv_engine *e, int k) {
    const glm_config *c = &e->m->cfg;
    int lo_s = e->nslots, hi_s = -1, V = c->vocab_size;
    for (int s = 0; s < e->nslots; s++) {
        srv_req *r = e->slot[s];
        if (r && r->adapter == k && r->out.n > 0) { if (s < lo_s) lo_s = s; hi_s = s; }
    }
    if (hi_s < 0) return;
    int nr = hi_s - lo_s + 1;
    srv_req **mem = glm_calloc((size_t)nr, sizeof *mem);
    for (int b = 0; b < nr; b++) {
        int s = lo_s + b;
        srv_req *r = e->slot[s];
        e->lens[b] = r ? e->slot_len[s] : e->pfx.on ? e->pfx.n[s] : 0; /* an idle row writes past what its slot holds */
        if (r && r->adapter == k && r->out.n > 0) {
            mem[b] = r;
            int t = r->prompt.n + r->out.n - 1; /* the fed token's index in the row */
            e->ids[b] = r->out.data[r->out.n - 1];
            e->m->fam->next_position(r->state, t, &e->pos[b], &e->bpos[b]);
            e->lo[b] = 0;
            e->hi[b] = e->slot_len[s] + 1;
        } else { /* a free slot or another adapter's row: idle, its result dropped */
            e->ids[b] = pad_id(e);
            e->pos[b] = e->bpos[b] = 0;
            e->lo[b] = 0;
            e->hi[b] = 1;
        }
    }
    set_adapter(e, k);
    glm_err err = {0};
    int greedy = 1;
    for (int b = 0; b < nr; b++) if (mem[b] && !is_greedy(mem[b])) greedy = 0;
    if (forward_slots(e, lo_s, nr, 1, e->lens, NULL, e->ids, greedy, &err)) {
        glm_warn("serve: decode step failed: %s", err.msg);
        for (int b = 0; b < nr; b++) if (mem[b]) finish(e, mem[b], "error", -1, err.msg);
        free(mem);
        return;
    }
    int32_t *next = glm_malloc(sizeof(int32_t) * (size_t)nr);
    srv_logprob *lps = glm_malloc(sizeof *lps * (size_t)nr);
    /* each row samples from its own stream: the rows are independent, in any order (greedy rows
     * only take the device's picks: no team to start for that) */
#pragma omp parallel for schedule(dynamic) if (!greedy && nr > 1)
    for (int b = 0; b < nr; b++)
        if (mem[b]) next[b] = greedy ? e->greedy[b] : pick(mem[b], e->logits + (size_t)b * V, V, &lps[b]);
    double t0 = glm_now();
    int *what = glm_calloc((size_t)nr, sizeof *what);
    long *cut = glm_calloc((size_t)nr, sizeof *cut);
    /* the rows' text in parallel (re-decoding a response grows with its length); a few rows are
     * quicker on this thread than the team's start */
#pragma omp parallel for schedule(dynamic) if (nr >= 8)
    for (int b = 0; b < nr; b++)
        if (mem[b]) what[b] = row_text(e, mem[b], next[b], &lps[b], &cut[b]);
    for (int b = 0; b < nr; b++) {
        if (!mem[b]) continue;
        e->slot_len[lo_s + b]++;
        row_apply(e, mem[b], what[b], cut[b]);
    }
    free(what);
    free(cut);
    e->t_text += glm_now() - t0;
    free(next);
    free(lps);
    free(mem);
}

/* Whether r, queued right after prev, can take prev's cache rows: the same prompt and adapter
 * (a request's n choices, or the same text sent again), neither scoring texts. */
static int shares_prompt(const srv_req *prev, const srv_req *r) {
    return r->adapter == prev->adapter && !r->n_texts && !prev->n_texts && r->prompt.n == prev->prompt.n &&
           r->prompt.n > 0 && !memcmp(r->prompt.data, prev->prompt.data, sizeof(int32_t) * (size_t)r->prompt.n);
}

/* r into free slot s (under mu), whose rows hold r's first `cached` prompt tokens already. */
static void admit(srv_engine *e, srv_req *r, int s, int cached) {
    e->slot[s] = r;
    e->slot_len[s] = cached;
    r->slot = s;
    r->cached = r->fed = cached;
    srv_prefix_drop(&e->pfx, s); /* now r's rows */
    e->active++;
    if (e->active > e->peak) e->peak = e->active;
    if (e->pfx.on && !r->share_src && !r->n_texts) {
        e->metrics.prefix_queries += r->prompt.n;
        e->metrics.prefix_hits += cached;
    }
    if (e->debug && cached) glm_info("serve: %d of a prompt's %d tokens held by slot %d already", cached, r->prompt.n, s);
}

static void *engine_main(void *arg) {
    srv_engine *e = arg;
    srv_req **adm = glm_calloc((size_t)e->nslots, sizeof *adm), **pop = glm_calloc((size_t)e->nslots, sizeof *pop);
    srv_req **cont = glm_calloc((size_t)e->nslots, sizeof *cont);
    int *adm_slot = glm_calloc((size_t)e->nslots, sizeof *adm_slot), *free_slot = glm_calloc((size_t)e->nslots, sizeof(int));
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && !e->qhead && e->active == 0 && !e->draining) pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop || (e->draining && !e->qhead && e->active == 0)) { pthread_mutex_unlock(&e->mu); break; }
        int nadm = 0, nfree = 0;
        for (int s = 0; s < e->nslots; s++)
            if (!e->slot[s]) free_slot[nfree++] = s;
        for (; nadm < nfree && e->qhead; nadm++) { /* in queue order; a prompt like the one before it shares */
            srv_req *r = e->qhead, *prev = nadm ? pop[nadm - 1] : NULL;
            e->qhead = r->next;
            if (!e->qhead) e->qtail = NULL;
            e->qlen--;
            r->share_src = prev && shares_prompt(prev, r) ? (prev->share_src ? prev->share_src : prev) : NULL;
            pop[nadm] = r;
        }
        /* a prompt that begins with what a free slot still holds takes that slot (the longest
         * match); the other free slots, empty ones first, go first to the requests that prefill
         * (consecutive slots let them prefill together), then to those that take a copy of their
         * rows; the admitted in slot order */
        for (int i = 0; i < nadm; i++) {
            srv_req *r = pop[i];
            if (r->share_src || r->n_texts || r->prompt_logprobs) continue;
            int best = -1, most = 0;
            for (int j = 0; j < nfree; j++) {
                int c = free_slot[j] < 0 ? 0 : srv_prefix_match(&e->pfx, free_slot[j], r->adapter, r->prompt.data, r->prompt.n);
                if (c > most) { most = c; best = j; }
            }
            if (best >= 0) { admit(e, r, free_slot[best], most); free_slot[best] = -1; }
        }
        int left = 0;
        for (int j = 0; j < nfree; j++)
            if (free_slot[j] >= 0) free_slot[left++] = free_slot[j];
        srv_prefix_order(&e->pfx, free_slot, left);
        for (int copies = 0, f = 0; copies < 2; copies++)
            for (int i = 0; i < nadm; i++)
                if (pop[i]->slot < 0 && (pop[i]->share_src != NULL) == copies) admit(e, pop[i], free_slot[f++], 0);
        for (int i = 0; i < nadm; i++) { /* by slot: insertion */
            srv_req *r = pop[i];
            int j = i;
            for (; j > 0 && adm_slot[j - 1] > r->slot; j--) { adm[j] = adm[j - 1]; adm_slot[j] = adm_slot[j - 1]; }
            adm[j] = r;
            adm_slot[j] = r->slot;
        }
        pthread_mutex_unlock(&e->mu);
        /* a client that went away frees its slot now (finish may free the request: one admitted
         * this step leaves adm too, by its slot, without a look at it) */
        for (int s = 0; s < e->nslots; s++)
            if (e->slot[s] && atomic_load(&e->slot[s]->cancel)) {
                srv_req *r = e->slot[s];
                if (!r->admitted) { r->admitted = 1; glm_streamer_init(&r->st, e->tok, r->postprocess); }
                finish(e, r, "cancelled", -1, NULL);
            }
        int kept = 0;
        for (int i = 0; i < nadm; i++)
            if (e->slot[adm_slot[i]] == adm[i]) { adm[kept] = adm[i]; adm_slot[kept++] = adm_slot[i]; }
        nadm = kept;
        int ncont = 0; /* prompts prefilling in parts since an earlier step */
        for (int s = 0; s < e->nslots; s++) {
            srv_req *r = e->slot[s];
            if (r && r->admitted && !r->n_texts && r->out.n == 0 && r->fed < r->prompt.n) cont[ncont++] = r;
        }
        double t_step = glm_now();
        prefill_all(e, adm, nadm, cont, ncont);
        for (int s = 0; s < e->nslots; s++) /* score requests: their next texts each step */
            if (e->slot[s] && e->slot[s]->n_texts) score_next(e, e->slot[s]);
        decode_group(e, -1);
        for (int k = 0; k < e->n_ad; k++) decode_group(e, k);
        pthread_mutex_lock(&e->mu);
        e->steps++;
        e->busy_s += glm_now() - t_step;
        e->forward_s = e->t_forward;
        e->text_s = e->t_text;
        pthread_mutex_unlock(&e->mu);
        if (e->step_delay_ms > 0) {
            struct timespec ts = {e->step_delay_ms / 1000, (long)(e->step_delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    /* stopped: whatever still runs or waits is cancelled */
    for (int s = 0; s < e->nslots; s++)
        if (e->slot[s]) {
            srv_req *r = e->slot[s];
            if (!r->admitted) { r->admitted = 1; glm_streamer_init(&r->st, e->tok, r->postprocess); }
            finish(e, r, "cancelled", -1, "the server is shutting down");
        }
    pthread_mutex_lock(&e->mu);
    srv_req *q = e->qhead;
    e->qhead = e->qtail = NULL;
    e->qlen = 0;
    pthread_mutex_unlock(&e->mu);
    while (q) {
        srv_req *nx = q->next;
        q->admitted = 1;
        glm_streamer_init(&q->st, e->tok, q->postprocess);
        finish(e, q, "cancelled", -1, "the server is shutting down");
        q = nx;
    }
    free(adm);
    free(cont);
    free(pop);
    free(adm_slot);
    free(free_slot);
    return NULL;
}

/* ---------------------------------------------------------------- life */

int srv_engine_default_batch_tokens(const glm_config *c, int nslots, int Tmax) {
    int t = glm_family_of(c)->causal && Tmax > 8192 ? 8192 : Tmax;
    return t > nslots ? t : nslots;
}

int srv_engine_init(srv_engine *e, glm_lm lm, const glm_tokenizer *tok, pthread_mutex_t *tok_mu, int nslots,
                    int Tmax, int batch_tokens, int max_queue, srv_adapter *ad, int n_ad, glm_err *err) {
    memset(e, 0, sizeof *e);
    glm_model *m = lm.pipe ? &lm.pipe->st[0] : lm.m;
    if (batch_tokens <= 0) batch_tokens = srv_engine_default_batch_tokens(&m->cfg, nslots, Tmax);
    if (batch_tokens < nslots)
        return glm_fail(err, "--max_num_batched_tokens %d is below --max_batch_size %d (a decode step carries a token a slot)",
                        batch_tokens, nslots);
    if (batch_tokens < Tmax && !m->fam->causal) {
        glm_fail(err, "--max_num_batched_tokens %d is below --max_model_len %d: a ChatGLM-6B prompt sees itself whole, so it "
                 "prefills in one forward", batch_tokens, Tmax);
        return glm_hint(err, "leave --max_num_batched_tokens out, or lower --max_model_len");
    }
    if (m->cfg.peft.kind == GLM_FT_PTUNING && n_ad) { /* LoRA adapters were trained without the prefix */
        glm_fail(err, "serve: LoRA adapters (--adapter) over a P-Tuning v2 model (--ptuning_checkpoint)");
        return glm_hint(err, "serve the P-Tuning model alone, or the base with its LoRA adapters (two servers)");
    }
    if (m->cfg.peft.kind != GLM_FT_FULL && m->cfg.peft.kind != GLM_FT_PTUNING)
        return glm_fail(err, "serve: the base model must load without a LoRA adapter (adapters are chosen per request)");
    e->m = m;
    e->pipe = lm.pipe;
    e->tok = tok;
    e->tok_mu = tok_mu;
    e->nslots = nslots;
    e->Tmax = Tmax;
    e->max_queue = max_queue;
    e->ad = ad;
    e->n_ad = n_ad;
    e->cur = -1;
    e->base_peft = m->cfg.peft;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->batch_tokens = batch_tokens;
    /* the work buffers once, wide enough for every adapter (the widest rank, every target) */
    glm_peft wide = {.kind = GLM_FT_LORA};
    for (int k = 0; k < n_ad; k++) {
        if (ad[k].peft.lora_rank > wide.lora_rank) wide.lora_rank = ad[k].peft.lora_rank;
        wide.lora_targets |= ad[k].peft.lora_targets;
    }
    for (int s = 0; s < stages(e) && n_ad; s++) stage(e, s)->cfg.peft = wide;
    if (e->pipe) {
        e->pc = glm_calloc(1, sizeof *e->pc);
        glm_pipe_cache_init(e->pipe, e->pc, nslots, Tmax);
        glm_pipe_cache_reserve(e->pipe, e->pc, e->batch_tokens);
    } else {
        glm_kvcache_init(m, &e->kv, nslots, Tmax);
        glm_kvcache_reserve(m, &e->kv, e->batch_tokens);
    }
    for (int s = 0; s < stages(e); s++) stage(e, s)->cfg.peft = e->base_peft;
    int T = e->batch_tokens;
    e->logits = glm_malloc(sizeof(float) * (size_t)nslots * m->cfg.vocab_size);
    e->hidden = glm_malloc(sizeof(float) * (size_t)nslots * m->cfg.hidden_size);
    e->greedy = glm_malloc(sizeof(int32_t) * (size_t)nslots);
    e->ids = glm_malloc(sizeof(int32_t) * (size_t)T * 5);
    e->pos = e->ids + T; e->bpos = e->pos + T; e->lo = e->bpos + T; e->hi = e->lo + T;
    e->lens = glm_calloc((size_t)nslots, sizeof(int));
    e->slot = glm_calloc((size_t)nslots, sizeof *e->slot);
    e->slot_len = glm_calloc((size_t)nslots, sizeof(int));
    srv_prefix_init(&e->pfx, nslots, Tmax, m->fam->causal);
    return 0;
}

int srv_engine_prefix_caching(srv_engine *e, int on) {
    srv_prefix_free(&e->pfx);
    srv_prefix_init(&e->pfx, e->nslots, e->Tmax, on && e->m->fam->causal);
    return e->pfx.on;
}

int srv_engine_start(srv_engine *e) {
    if (pthread_create(&e->th, NULL, engine_main, e)) return -1;
    e->started = 1;
    return 0;
}

int srv_engine_submit_all(srv_engine *e, srv_req **rs, int n) {
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stop) { pthread_mutex_unlock(&e->mu); return 503; }
    /* full when more than max_queue requests would wait after the free slots take theirs */
    if (e->qlen + n > e->max_queue + (e->nslots - e->active)) { pthread_mutex_unlock(&e->mu); return 429; }
    double now = glm_now();
    for (int i = 0; i < n; i++) { /* queued together: the engine admits them in one step */
        srv_req *r = rs[i];
        pthread_mutex_lock(&r->mu);
        r->refs++; /* the engine's */
        pthread_mutex_unlock(&r->mu);
        r->t_submit = now;
        r->next = NULL;
        if (e->qtail) e->qtail->next = r;
        else e->qhead = r;
        e->qtail = r;
        e->qlen++;
    }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int srv_engine_submit(srv_engine *e, srv_req *r) { return srv_engine_submit_all(e, &r, 1); }

void srv_engine_drain(srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int srv_engine_busy(srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->active + e->qlen;
    pthread_mutex_unlock(&e->mu);
    return n;
}

void srv_engine_stop(srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->started) pthread_join(e->th, NULL);
    e->started = 0;
    set_adapter(e, -1);
    if (e->pipe) {
        glm_pipe_cache_free(e->pipe, e->pc);
        free(e->pc);
        e->pc = NULL;
    } else {
        glm_kvcache_free(e->m, &e->kv);
    }
    free(e->logits);
    free(e->hidden);
    free(e->vhead);
    e->hidden = e->vhead = NULL;
    free(e->greedy);
    free(e->ids);
    free(e->lens);
    free(e->slot);
    free(e->slot_len);
    srv_prefix_free(&e->pfx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    e->logits = NULL;
}
