/* New prompts into their slots, whole, in parts or as a copy of another's rows, and score
 * requests' texts (serve/engine_steps.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/pipe/pipe_infer.h"
#include "serve/engine_steps.h"

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
        if (!rc) srv_logprob_of(buf + (size_t)i * V, V, next[i], top, &lps[i0 + i + 1]);
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
    if (r->no_generate && !r->prompt_logprobs) { srv_finish(e, r, "length", -1, NULL); return 0; } /* echo alone */
    if (r->g.repetition_penalty != 1.0f) {
        r->seen = glm_calloc((size_t)V, 1);
        for (int i = 0; i < n; i++) r->seen[r->prompt.data[i]] = 1;
    }
    r->limit = r->no_generate ? 0 : glm_gen_limit(&r->g, n);
    if (n > e->Tmax || (!r->no_generate && (r->limit <= 0 || n + r->limit > e->Tmax))) {
        srv_finish(e, r, "error", -1, "the prompt leaves no room for a response");
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
        e->ids[at + i] = srv_pad_id(e);
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
        if (r->no_generate) { srv_finish(e, r, "length", -1, NULL); continue; }
        srv_logprob lp;
        if (row) memcpy(row, e->logits + (size_t)b * V, sizeof(float) * (size_t)V);
        srv_row_token(e, r, row ? srv_pick(e, r, row, &lp) : e->greedy[b], &lp);
    }
    free(row);
    if (e->debug && shared) glm_info("serve: a prompt of %d tokens prefilled once for %d requests", n, shared + 1);
}

/* The requests of cp[0..ncp) that share src's prompt end as src did not start: with msg. */
static void fail_shares(srv_engine *e, const srv_req *src, srv_req **cp, int ncp, const char *msg) {
    for (int i = 0; i < ncp; i++)
        if (cp[i]->share_src == src) srv_finish(e, cp[i], "error", -1, msg);
}

/* New requests g[0..n) in consecutive slots, of one adapter, prefilled by one forward: row b holds
 * g[b]'s prompt after the tokens its slot already holds (cached), padded to the longest
 * (glm_stage_forward_cached_slots' n_new), so each row computes as alone. Then each one's prompt log-probabilities (echo) and first token. cp[0..ncp): this
 * step's requests that share a prompt (share_src) prefilled elsewhere, some maybe here. */
static void prefill_group(srv_engine *e, srv_req **g, int n, srv_req **cp, int ncp) {
    const glm_config *c = &e->m->cfg;
    int Tq = 0, V = c->vocab_size, greedy = 1;
    for (int b = 0; b < n; b++) {
        if (g[b]->prompt.n - srv_held(e, g[b]) > Tq) Tq = g[b]->prompt.n - srv_held(e, g[b]);
        greedy &= srv_is_greedy(g[b]);
        for (int i = 0; i < ncp; i++)
            if (cp[i]->share_src == g[b]) greedy &= srv_is_greedy(cp[i]);
    }
    int *n_new = glm_malloc(sizeof(int) * (size_t)n);
    const char *bad = "the prompt has no [gMASK] (or [MASK]) and <sop>";
    for (int b = 0; b < n; b++)
        if (fill_row(e, b, Tq, &g[b]->prompt, srv_held(e, g[b]), g[b]->prompt.n, g[b]->state, &n_new[b])) {
            fail_shares(e, g[b], cp, ncp, bad);
            srv_finish(e, g[b], "error", -1, bad); /* its row runs as padding */
            g[b] = NULL;
        }
    int b0 = 0, rc = 0;
    while (b0 < n && !g[b0]) b0++;
    glm_err err = {0};
    if (b0 < n) { /* rows run in slots g[b0]->slot - b0 onwards (a failed one's freed slot as padding) */
        srv_set_adapter(e, g[b0]->adapter);
        rc = srv_forward_slots(e, g[b0]->slot - b0, n, Tq, e->lens, n_new, e->ids, greedy, &err);
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
            if (r->prompt_logprobs && prompt_logprobs(e, r, b * Tq, srv_held(e, r), r->prompt.n, &rerr)) {
                glm_warn("serve: the prompt's log-probabilities failed: %s", rerr.msg);
                fail = rerr.msg;
            }
        }
        if (fail) {
            fail_shares(e, r, cp, ncp, fail);
            srv_finish(e, r, "error", -1, fail);
            continue;
        }
        e->slot_len[r->slot] = r->prompt.n;
        share_prefill(e, r, b, greedy, cp, ncp);
        if (r->no_generate) { srv_finish(e, r, "length", -1, NULL); continue; }
        srv_logprob lp;
        srv_row_token(e, r, greedy ? e->greedy[b] : srv_pick(e, r, e->logits + (size_t)b * V, &lp), &lp);
    }
}

/* The next cap tokens of r's prompt, which is longer than that after what its slot holds, through
 * its slot alone; no token is sampled (the prompt's last part prefills as any prompt does). */
static void prefill_chunk(srv_engine *e, srv_req *r, int cap) {
    int n_new, from = srv_held(e, r);
    glm_err err = {0};
    if (fill_row(e, 0, cap, &r->prompt, from, from + cap, r->state, &n_new)) { /* a causal family takes any prompt */
        srv_finish(e, r, "error", -1, "the prompt does not fit the model's positions");
        return;
    }
    srv_set_adapter(e, r->adapter);
    int rc = srv_forward_slots(e, r->slot, 1, cap, e->lens, &n_new, e->ids, 1, &err); /* greedy: no logits to the host */
    if (!rc && r->prompt_logprobs) rc = prompt_logprobs(e, r, 0, from, from + cap, &err);
    if (rc) {
        glm_warn("serve: prefill failed: %s", err.msg);
        srv_finish(e, r, "error", -1, err.msg);
        return;
    }
    e->slot_len[r->slot] = from + cap;
    if (e->debug) glm_info("serve: %d of a prompt's %d tokens prefilled (%d a step)", from + cap, r->prompt.n, cap);
}

/* Prefills: the new requests adm[0..n) and those whose prompts prefill in parts, cont[0..ncont).
 * A prompt with more tokens left than the work buffers hold (a causal family's: GLM v1's buffers
 * hold any prompt) runs its next part alone. The rest, in slot order: runs of consecutive slots of
 * one adapter share a forward, up to the work buffers' tokens (rows x the longest part left); a
 * request that shares a prompt prefilled in this step (share_src, admitted into the slots after
 * the others) takes its cache rows instead, unless that prompt prefills in parts: then it
 * prefills its own. */
void srv_prefill_all(srv_engine *e, srv_req **adm, int n, srv_req **cont, int ncont) {
    int cap = e->batch_tokens, k = 0, ns = 0, ncp = 0;
    for (int i = 0; i < n; i++)
        if (adm[i]->slot >= 0 && !adm[i]->n_texts && prefill_begin(e, adm[i])) adm[k++] = adm[i];
    srv_req **src = glm_malloc(sizeof *src * (size_t)(k + ncont + 1)), **cp = glm_malloc(sizeof *cp * (size_t)(k + 1));
    for (int i = 0; i < k; i++) { /* one whose first request is not prefilled whole here prefills itself */
        const srv_req *s = adm[i]->share_src;
        int found = 0;
        for (int j = 0; j < k && s && !found; j++) found = adm[j] == s && s->prompt.n - srv_held(e, s) <= cap;
        if (!found) adm[i]->share_src = NULL;
        if (adm[i]->share_src) cp[ncp++] = adm[i];
        else src[ns++] = adm[i];
    }
    for (int i = 0; i < ncont; i++) src[ns++] = cont[i];
    int nw = 0;
    for (int i = 0; i < ns; i++) { /* the parts first; the whole rest in slot order (insertion) */
        srv_req *r = src[i];
        if (r->prompt.n - srv_held(e, r) > cap) { prefill_chunk(e, r, cap); continue; }
        int j = nw++;
        for (; j > 0 && src[j - 1]->slot > r->slot; j--) src[j] = src[j - 1];
        src[j] = r;
    }
    ns = nw;
    for (int i = 0; i < ns;) { /* rows x the longest part left within the buffers, and every row's
                                * tokens held + the call's within its slot */
        int j = i + 1, longest = src[i]->prompt.n - srv_held(e, src[i]), most_held = srv_held(e, src[i]);
        while (j < ns && src[j]->slot == src[j - 1]->slot + 1 && src[j]->adapter == src[i]->adapter) {
            int l = src[j]->prompt.n - srv_held(e, src[j]), mh = srv_held(e, src[j]);
            if (l < longest) l = longest;
            if (mh < most_held) mh = most_held;
            if ((long)(j - i + 1) * l > cap || mh + l > e->Tmax) break;
            longest = l;
            most_held = mh;
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
void srv_score_next(srv_engine *e, srv_req *r) {
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
        srv_finish(e, r, "error", -1, "a text does not fit the model's positions");
        return;
    }
    srv_set_adapter(e, r->adapter);
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
        srv_finish(e, r, "error", -1, rc ? err.msg : "the model has no value head");
        return;
    }
    if (e->debug && k > 1) glm_info("serve: %d texts scored together (%d tokens a row)", k, Tq);
    for (int b = 0; b < k; b++) {
        const float *h = e->hidden + (size_t)b * H;
        double v = vh[H];
        for (int j = 0; j < H; j++) v += (double)h[j] * vh[j];
        r->scores[r->n_scored++] = v;
    }
    if (r->n_scored == r->n_texts) srv_finish(e, r, "stop", -1, NULL);
}

