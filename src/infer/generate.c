/* Batched generation with the KV cache and HF-order sampling (infer/generate.h). */
#include "infer/generate.h"
#include "parallel/pipe/pipe_infer.h"
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
    while (rc == 0) {
        int live = 0;
        for (int b = 0; b < B; b++) {
            row_state *r = &rs[b];
            if (r->done) continue;
            int32_t id = glm_sample_next(logits + (size_t)b * V, V, g, seen ? seen + (size_t)b * V : NULL, &rngs[b]);
            int stop = id == c->eos_token_id;
            for (int k = 0; k < g->n_stop; k++) stop |= id == g->stop_ids[k];
            if (stop) { r->done = 1; continue; }
            glm_ids_push(&outs[b], id);
            if (seen) seen[(size_t)b * V + id] = 1;
            if (on_token) on_token(cbctx, b, id);
            if (outs[b].n >= r->limit) r->done = 1;
            else live++;
        }
        if (!live) break;
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
