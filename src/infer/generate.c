/* Batched generation with the KV cache and HF-order sampling (infer/generate.h). */
#include "infer/generate.h"
#include "parallel/pipe/pipe_infer.h"
#include "infer/constrain.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- sampling */

/* k-th largest of a[0..n) (1-based k), by quickselect on a scratch copy. */
static float kth_largest(float *a, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) { float t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return a[want];
}

typedef struct { float logit; int32_t id; } cand;
static int by_logit_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x < y ? 1 : x > y ? -1 : ((const cand *)a)->id - ((const cand *)b)->id;
}

void glm_warp_logits(float *logits, int V, const glm_gen_cfg *g) {
    if (g->temperature > 0 && g->temperature != 1.0f)
        for (int j = 0; j < V; j++) logits[j] /= g->temperature;
    if (g->top_k > 0 && g->top_k < V) {
        float *tmp = glm_malloc(sizeof(float) * V);
        memcpy(tmp, logits, sizeof(float) * V);
        float kth = kth_largest(tmp, V, g->top_k);
        free(tmp);
        for (int j = 0; j < V; j++) if (logits[j] < kth) logits[j] = -INFINITY;
    }
    if (g->top_p < 1.0f) {
        cand *c = glm_malloc(sizeof(cand) * V);
        int n = 0;
        for (int j = 0; j < V; j++) if (logits[j] > -INFINITY) c[n++] = (cand){logits[j], j};
        qsort(c, (size_t)n, sizeof(cand), by_logit_desc);
        double mx = c[0].logit, sum = 0;
        for (int i = 0; i < n; i++) sum += exp(c[i].logit - mx);
        /* HF removes the tokens whose ascending cumulative probability is <= 1 - top_p: token i
         * (descending) stays iff the mass strictly before it is < top_p */
        double acc = 0;
        for (int i = 0; i < n; i++) {
            if (i > 0 && acc >= g->top_p) logits[c[i].id] = -INFINITY;
            acc += exp(c[i].logit - mx) / sum;
        }
        free(c);
    }
}

int32_t glm_sample_next(float *logits, int V, const glm_gen_cfg *g, const uint8_t *seen, glm_rng *rng) {
    /* HF applies the repetition penalty (a default processor) before the custom ones */
    if (seen && g->repetition_penalty != 1.0f)
        for (int j = 0; j < V; j++)
            if (seen[j]) logits[j] = logits[j] < 0 ? logits[j] * g->repetition_penalty : logits[j] / g->repetition_penalty;
    /* the original's InvalidScoreLogitsProcessor: any NaN/Inf -> all zero, logit[5] = 5e4 */
    for (int j = 0; j < V; j++)
        if (!isfinite(logits[j])) {
            memset(logits, 0, sizeof(float) * V);
            if (V > 5) logits[5] = 5e4f;
            break;
        }
    if (!g->do_sample) { /* torch.argmax: the first maximum */
        int best = 0;
        for (int j = 1; j < V; j++) if (logits[j] > logits[best]) best = j;
        return best;
    }
    glm_warp_logits(logits, V, g);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) if (logits[j] > mx) mx = logits[j];
    for (int j = 0; j < V; j++) if (logits[j] > -INFINITY) sum += exp(logits[j] - mx);
    double r = glm_rng_uniform(rng) * sum, acc = 0;
    int32_t last = 0;
    for (int j = 0; j < V; j++) {
        if (!(logits[j] > -INFINITY)) continue;
        last = j;
        acc += exp(logits[j] - mx);
        if (r < acc) return j;
    }
    return last;
}

/* ---------------------------------------------------------------- prompt lookup */

/* Token i of the text a then b. */
static inline int32_t text_at(const int32_t *a, int na, const int32_t *b, int i) { return i < na ? a[i] : b[i - na]; }

int glm_prompt_lookup(const int32_t *a, int na, const int32_t *b, int nb, int max_ngram, int max_draft,
                      const int32_t *ends, int n_ends, int32_t *draft) {
    int n = na + nb;
    if (max_draft <= 0) return 0;
    for (int g = max_ngram < n - 1 ? max_ngram : n - 1; g > 0; g--) {
        int32_t first = text_at(a, na, b, n - g);
        for (int i = 0; i + g < n; i++) { /* the tail's own place (i = n - g) leaves nothing after it */
            if (text_at(a, na, b, i) != first) continue;
            int j = 1;
            while (j < g && text_at(a, na, b, i + j) == text_at(a, na, b, n - g + j)) j++;
            if (j < g) continue;
            int k = 0, most = n - (i + g) < max_draft ? n - (i + g) : max_draft;
            for (; k < most; k++) {
                int32_t id = text_at(a, na, b, i + g + k);
                int end = 0;
                for (int e = 0; e < n_ends; e++) end |= id == ends[e];
                if (end) break;
                draft[k] = id;
            }
            return k;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- generation */


/* The KV cache of either kind of model (glm_lm). */
struct gen_cache {
    glm_lm lm;
    int made;               /* kv or pc allocated (the first generation makes them) */
    glm_kvcache kv;
    glm_pipe_cache pc;
};
typedef struct gen_cache gen_cache;

static void cache_init(gen_cache *c, int B, int T) {
    c->made = 1;
    if (c->lm.pipe) glm_pipe_cache_init(c->lm.pipe, &c->pc, B, T);
    else glm_kvcache_init(c->lm.m, &c->kv, B, T);
}
static int cache_len(const gen_cache *c) { return c->lm.pipe ? c->pc.len : c->kv.len; }
static int cache_cap(const gen_cache *c) { return c->lm.pipe ? c->pc.Tmax : c->kv.Tmax; }
static void cache_grow(gen_cache *c, int T) {
    if (c->lm.pipe) glm_pipe_cache_grow(c->lm.pipe, &c->pc, T);
    else glm_kvcache_grow(c->lm.m, &c->kv, T);
}
static int cache_forward(gen_cache *c, int Tq, const int32_t *ids, const int32_t *pos, const int32_t *bpos,
                         const int32_t *lo, const int32_t *hi, float *logits, glm_err *err) {
    if (c->lm.pipe) return glm_pipe_forward_cached(c->lm.pipe, &c->pc, Tq, ids, pos, bpos, lo, hi, NULL, logits, err);
    return glm_forward_cached(c->lm.m, &c->kv, Tq, ids, pos, bpos, lo, hi, NULL, logits, err);
}
/* Keeps the first n cached tokens: the next forward writes from there. */
static void cache_rewind(gen_cache *c, int n) {
    if (!c->lm.pipe) { c->kv.len = n; return; }
    c->pc.len = n;
    for (int s = 0; s < c->lm.pipe->n; s++) c->pc.kv[s].len = n;
}
static void cache_free(gen_cache *c) {
    if (!c->made) return;
    c->made = 0;
    if (c->lm.pipe) glm_pipe_cache_free(c->lm.pipe, &c->pc);
    else glm_kvcache_free(c->lm.m, &c->kv);
}

typedef struct row_state { int n, state[2], pad, limit, done; } row_state;

/* One generation's rows and what their choices read. */
typedef struct gen_rows {
    const glm_config *c;
    const glm_gen_cfg *g;
    int V;
    row_state *rs;
    uint8_t *seen;      /* [B, V] the ids in each row so far (the repetition penalty), or NULL */
    glm_rng *rngs;
    glm_ids *outs;
    glm_token_fn on_token;
    void *cbctx;
    glm_constrained *con; /* [B] each row's place in g->constraint, or NULL */
} gen_rows;

/* The ids that end an answer (config.json's eos, the template's stop ids) into ends; their count. */
#define MAX_ENDS (1 + (int)(sizeof ((glm_gen_cfg *)0)->stop_ids / sizeof(int32_t)))
static int row_ends(const glm_config *c, const glm_gen_cfg *g, int32_t *ends) {
    int n = 0;
    if (c->eos_token_id >= 0) ends[n++] = c->eos_token_id;
    for (int k = 0; k < g->n_stop; k++) ends[n++] = g->stop_ids[k];
    return n;
}

/* Row b's next token from its logits[V] (changed): pushed to its output unless it ends the row;
 * the row is done after an end token or at its limit. Returns the id. */
static int32_t take_token(gen_rows *x, int b, float *logits) {
    row_state *r = &x->rs[b];
    const glm_gen_cfg *g = x->g;
    size_t V = (size_t)x->V;
    int32_t ends[MAX_ENDS];
    int n_ends = row_ends(x->c, g, ends);
    if (x->con) glm_constrained_mask(g->vocab, &x->con[b], ends, n_ends, logits);
    int32_t id = glm_sample_next(logits, x->V, g, x->seen ? x->seen + b * V : NULL, &x->rngs[b]);
    for (int k = 0; k < n_ends; k++)
        if (id == ends[k]) { r->done = 1; return id; }
    if (x->con) glm_constrained_advance(g->vocab, &x->con[b], id);
    glm_ids_push(&x->outs[b], id);
    if (x->seen) x->seen[b * V + id] = 1;
    if (x->on_token) x->on_token(x->cbctx, b, id);
    if (x->outs[b].n >= r->limit) r->done = 1;
    return id;
}

/* Decoding of one row (B = 1) with prompt lookup, from the logits after its prompt: each pass
 * feeds the last token chosen and a draft copied from the text so far, then chooses from the
 * pass's rows in order while the choices equal the draft; the cache keeps the rows up to the
 * last choice's. A choice reads the same logits and draws the same random numbers as one token
 * a pass would, so the tokens are those of the plain loop. */
static int decode_drafted(gen_rows *x, gen_cache *kv, const glm_ids *prompt, float *logits, int full, glm_err *err) {
    const glm_gen_cfg *g = x->g;
    const glm_family *fam = glm_family_of(x->c);
    row_state *r = &x->rs[0];
    glm_ids *out = &x->outs[0];
    int K = g->prompt_lookup_num_tokens, ngram = g->max_matching_ngram_size > 0 ? g->max_matching_ngram_size : 2;
    int32_t *in = glm_malloc(sizeof(int32_t) * 5 * (size_t)(K + 1));
    int32_t *pos = in + (K + 1), *bpos = pos + (K + 1), *lo = bpos + (K + 1), *hi = lo + (K + 1);
    float *rows = glm_malloc(sizeof(float) * (size_t)(K + 1) * x->V);
    int32_t ends[MAX_ENDS];
    int n_ends = row_ends(x->c, g, ends);
    int rc = 0;
    take_token(x, 0, logits);
    while (!r->done && rc == 0) {
        int n = r->n + out->n; /* the prompt and the tokens chosen, the last not fed yet */
        int room = r->limit - out->n - 1; /* a pass chooses one token more than its draft */
        int k = glm_prompt_lookup(prompt->data, r->n, out->data, out->n, ngram, K < room ? K : room, ends, n_ends, in + 1);
        int L = cache_len(kv);
        if (L + k + 1 > cache_cap(kv)) {
            int cap = cache_cap(kv) * 2 > L + k + 1 ? cache_cap(kv) * 2 : L + k + 1;
            cache_grow(kv, cap < full ? cap : full);
        }
        in[0] = out->data[out->n - 1];
        for (int i = 0; i <= k; i++) {
            fam->next_position(r->state, n - 1 + i, &pos[i], &bpos[i]);
            lo[i] = r->pad;
            hi[i] = L + i + 1;
        }
        rc = cache_forward(kv, k + 1, in, pos, bpos, lo, hi, k ? NULL : rows, err);
        if (rc == 0 && k) rc = kv->lm.pipe ? glm_pipe_cached_rows_logits(kv->lm.pipe, &kv->pc, 0, k + 1, rows, err)
                                          : glm_cached_rows_logits(kv->lm.m, &kv->kv, 0, k + 1, rows, err);
        if (rc) break;
        int i = 0;
        for (;; i++) { /* row i's choice; the draft's token i + 1 stands while the choices equal it */
            int32_t id = take_token(x, 0, rows + (size_t)i * x->V);
            if (r->done || i == k || id != in[i + 1]) break;
        }
        cache_rewind(kv, L + i + 1); /* the fed tokens the choices kept */
        if (g->stats) {
            g->stats->forwards++;
            g->stats->drafted += k;
            g->stats->accepted += i;
        }
    }
    free(rows);
    free(in);
    return rc;
}

int glm_generate(glm_model *m, int B, const glm_ids *prompts, const glm_gen_cfg *g, glm_rng *rngs, glm_ids *outs,
                 glm_token_fn on_token, void *cbctx, glm_err *err) {
    return glm_generate_lm((glm_lm){m, NULL}, B, prompts, g, rngs, outs, on_token, cbctx, err);
}

/* Generation over the cache kv (made here on first use, else holding `skip` tokens that row 0's
 * prompt begins with, B = 1). */
static int generate_core(gen_cache *kv, int skip, int B, const glm_ids *prompts, const glm_gen_cfg *g,
                         glm_rng *rngs, glm_ids *outs, glm_token_fn on_token, void *cbctx, glm_err *err) {
    glm_lm lm = kv->lm;
    const glm_config *c = lm.pipe ? &lm.pipe->cfg : &lm.m->cfg;
    const glm_family *fam = glm_family_of(c); /* positions and key ranges follow the model's family */
    int V = c->vocab_size, P = 0, maxlim = 0;
    row_state *rs = glm_calloc((size_t)B, sizeof *rs);
    for (int b = 0; b < B; b++) if (prompts[b].n > P) P = prompts[b].n;
    size_t NP = (size_t)B * P;
    int32_t *in = glm_malloc(sizeof(int32_t) * (NP * 5 + 3 * (size_t)(P > 0 ? P : 1)));
    int32_t *pos = in + NP, *bpos = in + 2 * NP, *lo = in + 3 * NP, *hi = in + 4 * NP;
    int32_t *rp = in + 5 * NP, *rb = rp + P, *rh = rb + P; /* one row's rule */
    int32_t pad_id = c->pad_token_id >= 0 && c->pad_token_id < V ? c->pad_token_id : 0;
    for (int b = 0; b < B; b++) {
        row_state *r = &rs[b];
        r->n = prompts[b].n;
        r->pad = P - r->n;
        r->limit = glm_gen_limit(g, r->n);
        int bad = fam->prompt_positions(c, prompts[b].data, r->n, rp, rb, rh, r->state) ? 1 : r->limit <= 0 ? 2 : 0;
        if (bad) {
            free(rs);
            free(in);
            if (bad == 1) return glm_fail(err, "prompt %d has no [gMASK] (or [MASK]) and <sop>", b);
            char lim[160];
            glm_gen_limit_text(g, lim, sizeof lim);
            glm_fail(err, "prompt %d has %d tokens: no room for a response (at most %d prompt tokens fit: %s)", b,
                     prompts[b].n, glm_gen_max_prompt(g), lim);
            return glm_hint(err, "shorten the prompt (--max_source_length) or lower --max_new_tokens");
        }
        if (r->limit > maxlim) maxlim = r->limit;
        for (int j = 0; j < P; j++) {
            size_t k = (size_t)b * P + j;
            int i = j - r->pad; /* index in the unpadded row */
            if (i < 0) { /* padding: sees only itself, so its softmax stays defined */
                in[k] = pad_id; pos[k] = 0; bpos[k] = 0; lo[k] = j; hi[k] = j + 1;
                continue;
            }
            in[k] = prompts[b].data[i];
            pos[k] = rp[i];
            bpos[k] = rb[i];
            lo[k] = r->pad;
            hi[k] = r->pad + rh[i];
        }
    }
    /* The cache starts small and doubles: max_length 2048 would otherwise reserve 2048 tokens
     * per row up front (2.8 GB per row for ChatGLM-6B in fp32). */
    int full = P + maxlim, cap = P + (maxlim < 128 ? maxlim : 128);
    if (!kv->made) cache_init(kv, B, cap);
    else if (cache_cap(kv) < cap) cache_grow(kv, cap);
    cache_rewind(kv, skip);
    float *logits = glm_malloc(sizeof(float) * (size_t)B * V);
    uint8_t *seen = NULL;
    if (g->repetition_penalty != 1.0f) {
        seen = glm_calloc((size_t)B * V, 1);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < rs[b].n; i++) seen[(size_t)b * V + prompts[b].data[i]] = 1;
    }
    int rc = cache_forward(kv, P - skip, in + skip, pos + skip, bpos + skip, lo + skip, hi + skip, logits, err); /* B = 1 when skip */
    gen_rows x = {c, g, V, rs, seen, rngs, outs, on_token, cbctx, NULL};
    if (g->constraint) {
        x.con = glm_malloc(sizeof *x.con * (size_t)B);
        for (int b = 0; b < B; b++) glm_constrained_begin(&x.con[b], g->constraint);
    }
    if (rc == 0 && B == 1 && g->prompt_lookup_num_tokens > 0) rc = decode_drafted(&x, kv, &prompts[0], logits, full, err);
    else while (rc == 0) {
        int live = 0;
        for (int b = 0; b < B; b++) {
            if (rs[b].done) continue;
            take_token(&x, b, logits + (size_t)b * V);
            live += !rs[b].done;
        }
        if (!live) break;
        if (g->stats) g->stats->forwards++;
        if (cache_len(kv) + 1 > cache_cap(kv)) cache_grow(kv, cache_cap(kv) * 2 < full ? cache_cap(kv) * 2 : full);
        for (int b = 0; b < B; b++) { /* finished rows idle on a pad token */
            const row_state *r = &rs[b];
            int t = r->n + outs[b].n - 1; /* index of the fed token in the unpadded row */
            in[b] = r->done ? pad_id : outs[b].data[outs[b].n - 1];
            if (r->done) pos[b] = bpos[b] = 0;
            else fam->next_position(r->state, t, &pos[b], &bpos[b]);
            lo[b] = r->pad;
            hi[b] = cache_len(kv) + 1;
        }
        rc = cache_forward(kv, 1, in, pos, bpos, lo, hi, logits, err);
    }
    for (int b = 0; x.con && b < B; b++) glm_constrained_end(&x.con[b]);
    free(x.con);
    free(seen);
    free(logits);
    free(in);
    free(rs);
    return rc;
}

int glm_generate_lm(glm_lm lm, int B, const glm_ids *prompts, const glm_gen_cfg *g, glm_rng *rngs, glm_ids *outs,
                    glm_token_fn on_token, void *cbctx, glm_err *err) {
    gen_cache kv = {.lm = lm};
    int rc = generate_core(&kv, 0, B, prompts, g, rngs, outs, on_token, cbctx, err);
    cache_free(&kv);
    return rc;
}

/* ---------------------------------------------------------------- a conversation's cache */

void glm_gen_session_init(glm_gen_session *s, glm_lm lm, int reuse) {
    const glm_config *c = lm.pipe ? &lm.pipe->cfg : &lm.m->cfg;
    *s = (glm_gen_session){.lm = lm, .reuse = reuse && glm_family_of(c)->causal};
}

int glm_generate_session(glm_gen_session *s, const glm_ids *prompt, const glm_gen_cfg *g, glm_rng *rng, glm_ids *out,
                         glm_token_fn on_token, void *cbctx, glm_err *err) {
    if (!s->reuse) return glm_generate_lm(s->lm, 1, prompt, g, rng, out, on_token, cbctx, err);
    int k = 0;
    if (!s->cache) s->cache = glm_calloc(1, sizeof *s->cache), s->cache->lm = s->lm;
    while (k < s->fed.n && k < prompt->n - 1 && s->fed.data[k] == prompt->data[k]) k++;
    s->reused = k;
    s->fed.n = 0; /* until the turn's end says what the cache holds */
    int rc = generate_core(s->cache, k, 1, prompt, g, rng, out, on_token, cbctx, err);
    if (rc) return rc; /* the cache's contents are unknown: the next turn starts afresh */
    int n = cache_len(s->cache); /* the prompt and the answer but the last token sampled */
    for (int i = 0; i < n; i++) glm_ids_push(&s->fed, i < prompt->n ? prompt->data[i] : out->data[i - prompt->n]);
    return 0;
}

void glm_gen_session_forget(glm_gen_session *s) { s->fed.n = 0; }

void glm_gen_session_free(glm_gen_session *s) {
    if (s->cache) {
        cache_free(s->cache);
        free(s->cache);
    }
    glm_ids_free(&s->fed);
    *s = (glm_gen_session){0};
}
