/* The continuous-batching decode engine (serve/engine.h). */
#include "serve/engine.h"
#include "serve/engine_steps.h"
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
void srv_set_adapter(srv_engine *e, int k) {
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

/* ---------------------------------------------------------------- steps */

/* One forward of rows [slot0, slot0 + nrows) of the pool, on the whole model or stage by stage
 * (n_new: each row's real new tokens, NULL all Tq).
 * greedy: every row decodes greedily without a repetition penalty, so the device picks the
 * tokens (e->greedy) and the logits stay there; otherwise they come to e->logits. */
int srv_forward_slots(srv_engine *e, int slot0, int nrows, int Tq, const int *len, const int *n_new, const int32_t *ids,
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

int32_t srv_pad_id(const srv_engine *e) {
    const glm_config *c = &e->m->cfg;
    return c->pad_token_id >= 0 && c->pad_token_id < c->vocab_size ? c->pad_token_id : 0;
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
        e->lens[b] = r ? e->slot_len[s] : srv_prefix_kept(&e->pfx, s); /* an idle row writes past what its slot holds */
        if (r && r->adapter == k && r->out.n > 0) {
            mem[b] = r;
            int t = r->prompt.n + r->out.n - 1; /* the fed token's index in the row */
            e->ids[b] = r->out.data[r->out.n - 1];
            e->m->fam->next_position(r->state, t, &e->pos[b], &e->bpos[b]);
            e->lo[b] = 0;
            e->hi[b] = e->slot_len[s] + 1;
        } else { /* a free slot or another adapter's row: idle, its result dropped */
            e->ids[b] = srv_pad_id(e);
            e->pos[b] = e->bpos[b] = 0;
            e->lo[b] = 0;
            e->hi[b] = 1;
        }
    }
    srv_set_adapter(e, k);
    if (e->lookup_k > 0 && srv_decode_drafted(e, lo_s, nr, mem)) { free(mem); return; }
    glm_err err = {0};
    int greedy = 1;
    for (int b = 0; b < nr; b++) if (mem[b] && !srv_is_greedy(mem[b])) greedy = 0;
    if (srv_forward_slots(e, lo_s, nr, 1, e->lens, NULL, e->ids, greedy, &err)) {
        glm_warn("serve: decode step failed: %s", err.msg);
        for (int b = 0; b < nr; b++) if (mem[b]) srv_finish(e, mem[b], "error", -1, err.msg);
        free(mem);
        return;
    }
    int32_t *next = glm_malloc(sizeof(int32_t) * (size_t)nr);
    srv_logprob *lps = glm_malloc(sizeof *lps * (size_t)nr);
    /* each row samples from its own stream: the rows are independent, in any order (greedy rows
     * only take the device's picks: no team to start for that) */
#pragma omp parallel for schedule(dynamic) if (!greedy && nr > 1)
    for (int b = 0; b < nr; b++)
        if (mem[b]) next[b] = greedy ? e->greedy[b] : srv_pick(e, mem[b], e->logits + (size_t)b * V, &lps[b]);
    double t0 = glm_now();
    int *what = glm_calloc((size_t)nr, sizeof *what);
    long *cut = glm_calloc((size_t)nr, sizeof *cut);
    /* the rows' text in parallel (re-decoding a response grows with its length); a few rows are
     * quicker on this thread than the team's start */
#pragma omp parallel for schedule(dynamic) if (nr >= 8)
    for (int b = 0; b < nr; b++)
        if (mem[b]) what[b] = srv_row_text(e, mem[b], next[b], &lps[b], &cut[b]);
    for (int b = 0; b < nr; b++) {
        if (!mem[b]) continue;
        e->slot_len[lo_s + b]++;
        srv_row_apply(e, mem[b], what[b], cut[b]);
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
    if (r->con.c && !e->jv.V) glm_text_vocab_build(&e->jv, e->tok, e->m->cfg.vocab_size); /* the first such request */
    e->slot[s] = r;
    e->slot_len[s] = cached;
    r->slot = s;
    r->cached = cached;
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
                srv_finish(e, r, "cancelled", -1, NULL);
            }
        int kept = 0;
        for (int i = 0; i < nadm; i++)
            if (e->slot[adm_slot[i]] == adm[i]) { adm[kept] = adm[i]; adm_slot[kept++] = adm_slot[i]; }
        nadm = kept;
        int ncont = 0; /* prompts prefilling in parts since an earlier step */
        for (int s = 0; s < e->nslots; s++) {
            srv_req *r = e->slot[s];
            if (r && r->admitted && !r->n_texts && r->out.n == 0 && srv_held(e, r) < r->prompt.n) cont[ncont++] = r;
        }
        double t_step = glm_now();
        srv_prefill_all(e, adm, nadm, cont, ncont);
        for (int s = 0; s < e->nslots; s++) /* score requests: their next texts each step */
            if (e->slot[s] && e->slot[s]->n_texts) srv_score_next(e, e->slot[s]);
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
            srv_finish(e, r, "cancelled", -1, "the server is shutting down");
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
        srv_finish(e, q, "cancelled", -1, "the server is shutting down");
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

/* max(Tmax, nslots) for GLM v1, whose prompts cannot be split; for the causal families
 * max(min(Tmax, 8192), nslots). */
static int default_batch_tokens(const glm_config *c, int nslots, int Tmax) {
    int t = glm_family_of(c)->causal && Tmax > 8192 ? 8192 : Tmax;
    return t > nslots ? t : nslots;
}

int srv_engine_init(srv_engine *e, glm_lm lm, const glm_tokenizer *tok, pthread_mutex_t *tok_mu, int nslots,
                    int Tmax, int batch_tokens, int max_queue, srv_adapter *ad, int n_ad, glm_err *err) {
    memset(e, 0, sizeof *e);
    glm_model *m = lm.pipe ? &lm.pipe->st[0] : lm.m;
    if (batch_tokens <= 0) batch_tokens = default_batch_tokens(&m->cfg, nslots, Tmax);
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
    return 0; /* prefix caching off until srv_engine_prefix_caching */
}

int srv_engine_prefix_caching(srv_engine *e, int on) {
    srv_prefix_free(&e->pfx);
    srv_prefix_init(&e->pfx, e->nslots, e->Tmax, on && e->m->fam->causal);
    return e->pfx.on;
}

void srv_engine_prompt_lookup(srv_engine *e, int k, int ngram) {
    e->lookup_k = k > 0 ? (k < GLM_LOOKUP_MAX ? k : GLM_LOOKUP_MAX) : 0;
    e->lookup_ngram = ngram > 0 ? ngram : 2;
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
    srv_set_adapter(e, -1);
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
    glm_text_vocab_free(&e->jv);
    free(e->ids);
    free(e->lens);
    free(e->slot);
    free(e->slot_len);
    srv_prefix_free(&e->pfx);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    e->logits = NULL;
}
