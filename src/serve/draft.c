/* Prompt lookup in serve's decode steps (--prompt_lookup_num_tokens, as generate's: infer/generate.h
 * glm_prompt_lookup): each decoding row feeds its last token and a draft copied from where its
 * prompt and answer repeat their last tokens, all rows in one forward (each row's own count of new
 * tokens: glm_stage_forward_cached_slots' n_new); a row's choices are made from its rows in order
 * while they equal its draft, so its tokens, log-probabilities and text are those of one token a
 * step, and its slot keeps the rows up to its last choice's. */
#include <stdlib.h>
#include <string.h>
#include "core/log.h"
#include "parallel/pipe/pipe_infer.h"
#include "serve/engine_steps.h"

/* Row r's draft (at most most tokens) into d; the ids that would end it cut the draft short. */
static int row_draft(const srv_engine *e, const srv_req *r, int most, int32_t *d) {
    int32_t ends[SRV_MAX_ENDS];
    int n_ends = r->ignore_eos ? 0 : srv_row_ends(e, r, ends);
    return glm_prompt_lookup(r->prompt.data, r->prompt.n, r->out.data, r->out.n, e->lookup_ngram, most, ends, n_ends, d);
}

/* The logits of the rows at[0..n) of the last forward (n may exceed what one call brings back). */
static int picked_logits(srv_engine *e, const int32_t *at, int n, float *out, glm_err *err) {
    size_t V = (size_t)e->m->cfg.vocab_size;
    for (int i = 0; i < n; i += GLM_ROWS_LOGITS_MAX) {
        int c = n - i < GLM_ROWS_LOGITS_MAX ? n - i : GLM_ROWS_LOGITS_MAX;
        int rc = e->pipe ? glm_pipe_cached_picked_logits(e->pipe, e->pc, at + i, c, out + i * V, err)
                         : glm_cached_picked_logits(e->m, &e->kv, at + i, c, out + i * V, err);
        if (rc) return -1;
    }
    return 0;
}

/* A row's choices: n_new[b] rows of logits from lg; the counts of tokens taken and the last one's
 * srv_row_text answer (*what, *cut). */
typedef struct row_choices { int taken, what; long cut; } row_choices;

static row_choices choose(srv_engine *e, srv_req *r, float *lg, const int32_t *draft, int k) {
    size_t V = (size_t)e->m->cfg.vocab_size;
    row_choices c = {0, ROW_GOES_ON, -1};
    for (int i = 0; i <= k; i++) {
        srv_logprob lp;
        int32_t id = srv_pick(e, r, lg + i * V, &lp);
        c.what = srv_row_text(e, r, id, &lp, &c.cut);
        c.taken++;
        if (c.what != ROW_GOES_ON || i == k || id != draft[i]) break;
    }
    return c;
}

int srv_decode_drafted(srv_engine *e, int lo_s, int nr, srv_req **mem) {
    int K = e->lookup_k;
    /* every row of the call writes Tq rows past its length: all of them must stay in their slots */
    int Tq = K + 1;
    if (Tq > e->batch_tokens / nr) Tq = e->batch_tokens / nr;
    for (int b = 0; b < nr; b++)
        if (e->Tmax - e->lens[b] < Tq) Tq = e->Tmax - e->lens[b];
    if (Tq < 2) return 0;
    int32_t *draft = glm_malloc(sizeof(int32_t) * (size_t)nr * K);
    int *n_new = glm_malloc(sizeof(int) * (size_t)nr), any = 0;
    /* each row looks through its own text (long prompts: tens of microseconds a row) */
#pragma omp parallel for schedule(dynamic) if (nr >= 8)
    for (int b = 0; b < nr; b++) {
        srv_req *r = mem[b];
        int room = r ? r->limit - r->out.n - 1 : 0; /* a row chooses one token more than its draft */
        int most = Tq - 1 < room ? Tq - 1 : room;
        n_new[b] = 1 + (r ? row_draft(e, r, most, draft + (size_t)b * K) : 0);
    }
    for (int b = 0; b < nr; b++) any |= n_new[b] > 1;
    if (!any) { free(draft); free(n_new); return 0; }
    int nt = 0;
    int32_t *at = glm_malloc(sizeof(int32_t) * (size_t)nr * Tq);
    for (int b = 0; b < nr; b++) { /* row b's tokens at [b Tq, b Tq + Tq): its real ones first, then padding */
        srv_req *r = mem[b];
        for (int i = 0; i < Tq; i++) {
            size_t j = (size_t)b * Tq + i;
            int real = r && i < n_new[b];
            e->ids[j] = !real ? srv_pad_id(e) : i == 0 ? r->out.data[r->out.n - 1] : draft[(size_t)b * K + i - 1];
            if (real) e->m->fam->next_position(r->state, r->prompt.n + r->out.n - 1 + i, &e->pos[j], &e->bpos[j]);
            else e->pos[j] = e->bpos[j] = 0;
            e->lo[j] = real ? 0 : e->lens[b] + i; /* padding sees only itself */
            e->hi[j] = e->lens[b] + i + 1;
            if (real) at[nt++] = (int32_t)j;
        }
    }
    glm_err err = {0};
    double t0 = glm_now();
    int rc = e->pipe ? glm_pipe_forward_cached_slots(e->pipe, e->pc, lo_s, nr, Tq, e->lens, n_new, e->ids, e->pos, e->bpos,
                                                     e->lo, e->hi, NULL, NULL, NULL, &err)
                     : glm_stage_forward_cached_slots(e->m, &e->kv, lo_s, nr, Tq, e->lens, n_new, e->ids, e->pos, e->bpos,
                                                      e->lo, e->hi, NULL, NULL, NULL, NULL, NULL, &err);
    size_t V = (size_t)e->m->cfg.vocab_size;
    float *lg = glm_malloc(sizeof(float) * (size_t)nt * V);
    if (rc == 0) rc = picked_logits(e, at, nt, lg, &err);
    e->t_forward += glm_now() - t0;
    if (rc) {
        glm_warn("serve: decode step failed: %s", err.msg);
        for (int b = 0; b < nr; b++) if (mem[b]) srv_finish(e, mem[b], "error", -1, err.msg);
    } else {
        row_choices *ch = glm_calloc((size_t)nr, sizeof *ch);
        int *first = glm_malloc(sizeof(int) * (size_t)nr);
        for (int b = 0, f = 0; b < nr; b++) { first[b] = f; f += mem[b] ? n_new[b] : 0; }
        t0 = glm_now();
        /* each row's choices in order, the rows side by side (each reads only its own stream) */
#pragma omp parallel for schedule(dynamic) if (nr >= 4)
        for (int b = 0; b < nr; b++)
            if (mem[b]) ch[b] = choose(e, mem[b], lg + (size_t)first[b] * V, draft + (size_t)b * K, n_new[b] - 1);
        for (int b = 0; b < nr; b++) {
            if (!mem[b]) continue;
            e->slot_len[lo_s + b] += ch[b].taken; /* the fed tokens the choices kept */
            for (int i = 1; i < ch[b].taken; i++) srv_row_apply(e, mem[b], ROW_GOES_ON, -1);
            srv_row_apply(e, mem[b], ch[b].what, ch[b].cut);
            pthread_mutex_lock(&e->mu);
            e->metrics.draft_tokens += n_new[b] - 1;
            e->metrics.accepted_tokens += ch[b].taken - 1;
            pthread_mutex_unlock(&e->mu);
        }
        e->t_text += glm_now() - t0;
        free(ch);
        free(first);
    }
    free(lg);
    free(at);
    free(draft);
    free(n_new);
    return 1;
}
