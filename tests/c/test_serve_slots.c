/* The KV-cache slot pool of `glmtrain serve` (glm_forward_cached_slots, model/kvcache.c): rows
 * of different lengths join and leave a shared decode batch (a prefill per joining row, one
 * decode call over a slot range with idle rows in between, a freed slot reused with stale keys
 * past its new length), and every row's logits at every step are bit for bit those of the same
 * prompt run alone through glm_forward_cached (B = 1), on GLM v1 and the ChatGLM2 block, each
 * also behind a P-Tuning v2 prefix (every slot's first rows, filled once for the pool). Prompts of
 * different lengths prefilled by one call (padded: n_new) compute as alone too, and every prompt
 * row's logits come back (glm_cached_rows_logits: serve's echo), and its log-probabilities without
 * them (glm_cached_rows_logprobs) equal a log-softmax of those logits. A slot whose rows are a
 * copy of another's prefill (glm_kvcache_copy_slot) decodes as the prompt alone; on the causal
 * ChatGLM2 block, a slot that kept a prompt's first tokens (prefix caching) and is then given the
 * rest of it does too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"
#include "model/glm.h"
#include "micro_configs.h"
#include "test.h"

enum { V = 40, STEPS = 5, TMAX = 16, SLOTS = 4, NP = 3 };

static glm_config config(int glm2) {
    glm_config c = micro_cache_config(glm2);
    return c;
}

/* Each tensor from its own stream, seeded by its name: a model with a prefix encoder gets the
 * same base weights as one without. */
static void random_model(glm_model *m, uint64_t seed) {
    glm_rng r;
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        uint64_t hsh = seed;
        for (const char *q = t->name; *q; q++) hsh = hsh * 1099511628211ULL ^ (unsigned char)*q;
        glm_rng_seed(&r, hsh);
        float *h = malloc(sizeof(float) * t->numel);
        float sd = t->ndim == 2 ? 0.3f : 0.1f;
        for (size_t j = 0; j < t->numel; j++) h[j] = (t->ndim == 1 && t->kind != T_QKV_B ? 1.0f : 0.0f) + sd * glm_rng_normal(&r);
        glm_model_row_upload(m, t, p, h);
        free(h);
    }
}

static const int32_t prompt_v1[NP][6] = {{5, 6, 1, 2}, {7, 8, 9, 10, 1, 2}, {11, 1, 2}};
static const int32_t prompt_v2[NP][6] = {{1, 2, 5, 6}, {1, 2, 7, 8, 9, 10}, {1, 2, 11}};
static const int plen[NP] = {4, 6, 3};
static int32_t fed(int p, int s) { return (int32_t)(5 + 7 * p + 3 * s) % V; } /* the token row p feeds at decode step s */

/* Prompt p alone: prefill, then STEPS fed tokens; logits [STEPS + 1][V]. */
static int alone(glm_model *m, const int32_t *pr, int n, int p, float *logits, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    int32_t pos[16], bpos[16], lo[16], hi[16], rh[16];
    int st[2];
    if (f->prompt_positions(&m->cfg, pr, n, pos, bpos, rh, st)) return -1;
    for (int i = 0; i < n; i++) { lo[i] = 0; hi[i] = rh[i]; }
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, 1, TMAX);
    int rc = glm_forward_cached(m, &kv, n, pr, pos, bpos, lo, hi, NULL, logits, err);
    for (int s = 0; s < STEPS && rc == 0; s++) {
        int32_t id = fed(p, s), ps, bs, l = 0, h = kv.len + 1;
        f->next_position(st, n + s, &ps, &bs);
        rc = glm_forward_cached(m, &kv, 1, &id, &ps, &bs, &l, &h, NULL, logits + (size_t)(s + 1) * V, err);
    }
    glm_kvcache_free(m, &kv);
    return rc;
}

/* The pool: prompt 0 joins at step 0 in slot 2 and leaves after 3 decode steps; prompt 1 joins at
 * step 1 in slot 0; prompt 2 joins at step 3 in slot 2 (prompt 0's old keys behind it). Slots 1
 * and 3 stay free (idle rows). Each decode call covers slots [0, 3). */
static int pooled(glm_model *m, const int32_t (*pr)[6], float *logits, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, SLOTS, TMAX);
    glm_kvcache_reserve(m, &kv, TMAX);
    int join[NP] = {0, 1, 3}, slot_of[NP] = {2, 0, 2}, steps_of[NP] = {3, STEPS, STEPS};
    int done[NP] = {0}, fed_n[NP] = {0}, st[NP][2], len[SLOTS] = {0}, owner[SLOTS] = {-1, -1, -1, -1}, rc = 0;
    float *lg = malloc(sizeof(float) * SLOTS * V);
    for (int step = 0; step < 12 && rc == 0; step++) {
        for (int p = 0; p < NP && rc == 0; p++) { /* joins: one prefill each */
            if (join[p] != step) continue;
            int s = slot_of[p], n = plen[p], zero = 0;
            int32_t pos[16], bpos[16], lo[16], hi[16], rh[16];
            if (f->prompt_positions(&m->cfg, pr[p], n, pos, bpos, rh, st[p])) return -1;
            for (int i = 0; i < n; i++) { lo[i] = 0; hi[i] = rh[i]; }
            rc = glm_forward_cached_slots(m, &kv, s, 1, n, &zero, pr[p], pos, bpos, lo, hi, lg, err);
            memcpy(logits + (size_t)p * (STEPS + 1) * V, lg, sizeof(float) * V);
            len[s] = n;
            owner[s] = p;
        }
        int32_t ids[SLOTS], pos[SLOTS], bpos[SLOTS], lo[SLOTS], hi[SLOTS];
        int live = 0;
        for (int s = 0; s < 3; s++) {
            int p = owner[s];
            if (p >= 0 && !done[p]) {
                ids[s] = fed(p, fed_n[p]);
                f->next_position(st[p], plen[p] + fed_n[p], &pos[s], &bpos[s]);
                lo[s] = 0; hi[s] = len[s] + 1;
                live = 1;
            } else { /* idle */
                ids[s] = 0; pos[s] = bpos[s] = 0; lo[s] = 0; hi[s] = 1;
            }
        }
        if (!live) continue;
        if (rc == 0) rc = glm_forward_cached_slots(m, &kv, 0, 3, 1, len, ids, pos, bpos, lo, hi, lg, err);
        for (int s = 0; s < 3 && rc == 0; s++) {
            int p = owner[s];
            if (p < 0 || done[p]) continue;
            fed_n[p]++;
            len[s]++;
            memcpy(logits + ((size_t)p * (STEPS + 1) + fed_n[p]) * V, lg + (size_t)s * V, sizeof(float) * V);
            if (fed_n[p] == steps_of[p]) { done[p] = 1; owner[s] = -1; len[s] = 0; } /* leaves: slot free */
        }
    }
    free(lg);
    glm_kvcache_free(m, &kv);
    return rc;
}

/* Prompt 1 prefilled in slot 0 and its cache rows copied into slot 3 (glm_kvcache_copy_slot:
 * serve's other choices of a prompt); then STEPS decode calls over slots [0, 4), slots 0 and 3
 * fed prompt 1's tokens, 1 and 2 idle: slot 3's logits [STEPS][V] (after the prompt), slot 0's
 * into *src. */
static int copied(glm_model *m, const int32_t (*pr)[6], float *logits, float *src, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, SLOTS, TMAX);
    glm_kvcache_reserve(m, &kv, TMAX);
    int n = plen[1], zero = 0, st[2], len[SLOTS] = {n, 0, 0, n};
    int32_t pos[16], bpos[16], lo[16], hi[16], rh[16];
    float *lg = malloc(sizeof(float) * SLOTS * V);
    int rc = f->prompt_positions(&m->cfg, pr[1], n, pos, bpos, rh, st);
    for (int i = 0; i < n; i++) { lo[i] = 0; hi[i] = rh[i]; }
    if (rc == 0) rc = glm_forward_cached_slots(m, &kv, 0, 1, n, &zero, pr[1], pos, bpos, lo, hi, lg, err);
    if (rc == 0) glm_kvcache_copy_slot(m, &kv, 0, 3, n);
    for (int s = 0; s < STEPS && rc == 0; s++) {
        int32_t ids[SLOTS] = {fed(1, s), 0, 0, fed(1, s)}, ps[SLOTS] = {0}, bs[SLOTS] = {0}, l[SLOTS] = {0}, h[SLOTS];
        f->next_position(st, n + s, &ps[0], &bs[0]);
        ps[3] = ps[0];
        bs[3] = bs[0];
        for (int b = 0; b < SLOTS; b++) h[b] = len[b] + 1;
        rc = glm_forward_cached_slots(m, &kv, 0, SLOTS, 1, len, ids, ps, bs, l, h, lg, err);
        memcpy(logits + (size_t)s * V, lg + (size_t)3 * V, sizeof(float) * V);
        memcpy(src + (size_t)s * V, lg, sizeof(float) * V);
        len[0]++;
        len[3]++;
    }
    free(lg);
    glm_kvcache_free(m, &kv);
    return rc;
}

/* Prefix caching (serve/prefix_cache.h): the first k tokens of prompt 1 prefilled into slot 2 as
 * an earlier request's, an idle decode row over the free slot writing past them (row k), then
 * the rest of the prompt prefilled behind them (len k) and STEPS decode calls: logits [STEPS + 1][V]
 * as the prompt alone. */
static int resumed(glm_model *m, const int32_t (*pr)[6], int k, float *logits, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, SLOTS, TMAX);
    glm_kvcache_reserve(m, &kv, TMAX);
    int n = plen[1], zero = 0, st[2], len[SLOTS] = {0, 0, k, 0};
    int32_t pos[16], bpos[16], lo[16], hi[16], rh[16];
    float *lg = malloc(sizeof(float) * SLOTS * V);
    int rc = f->prompt_positions(&m->cfg, pr[1], n, pos, bpos, rh, st);
    for (int i = 0; i < n; i++) { lo[i] = 0; hi[i] = rh[i]; }
    if (rc == 0) rc = glm_forward_cached_slots(m, &kv, 2, 1, k, &zero, pr[1], pos, bpos, lo, hi, lg, err);
    if (rc == 0) { /* slot 2 idle in another row's decode: its token goes to row k */
        int32_t ids[SLOTS] = {9, 9, 9, 9}, z[SLOTS] = {0}, one[SLOTS] = {1, 1, 1, 1};
        rc = glm_forward_cached_slots(m, &kv, 0, SLOTS, 1, len, ids, z, z, z, one, lg, err);
    }
    if (rc == 0)
        rc = glm_forward_cached_slots(m, &kv, 2, 1, n - k, &len[2], pr[1] + k, pos + k, bpos + k, lo + k, hi + k, logits, err);
    len[2] = n;
    for (int s = 0; s < STEPS && rc == 0; s++) {
        int32_t id = fed(1, s), ps, bs, l = 0, h = len[2] + 1;
        f->next_position(st, n + s, &ps, &bs);
        rc = glm_forward_cached_slots(m, &kv, 2, 1, 1, &len[2], &id, &ps, &bs, &l, &h, logits + (size_t)(s + 1) * V, err);
        len[2]++;
    }
    free(lg);
    glm_kvcache_free(m, &kv);
    return rc;
}

/* The three prompts prefilled by one call (slots 0-2, each padded to the longest: n_new), then
 * STEPS decode calls over the three; logits as alone's. *rows_ok: each prompt's every row through
 * glm_cached_rows_logits gives its last row's logits as the call did, and on the causal ChatGLM2
 * block row i those of the prompt's first i + 1 tokens alone. */
static int together(glm_model *m, const int32_t (*pr)[6], float *logits, int *rows_ok, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    enum { TQ = 6 };
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, SLOTS, TMAX);
    int32_t ids[NP * TQ], pos[NP * TQ], bpos[NP * TQ], lo[NP * TQ], hi[NP * TQ], rh[TQ];
    int st[NP][2], len[NP] = {0}, n_new[NP], rc = 0;
    for (int p = 0; p < NP; p++) {
        if (f->prompt_positions(&m->cfg, pr[p], plen[p], pos + p * TQ, bpos + p * TQ, rh, st[p])) return -1;
        for (int i = 0; i < TQ; i++) {
            int real = i < plen[p];
            ids[p * TQ + i] = real ? pr[p][i] : 0;
            if (!real) pos[p * TQ + i] = bpos[p * TQ + i] = 0;
            lo[p * TQ + i] = 0;
            hi[p * TQ + i] = real ? rh[i] : 1;
        }
        n_new[p] = plen[p];
    }
    float *lg = malloc(sizeof(float) * SLOTS * V), *row = malloc(sizeof(float) * V), *ref = malloc(sizeof(float) * 7 * V);
    rc = glm_stage_forward_cached_slots(m, &kv, 0, NP, TQ, len, n_new, ids, pos, bpos, lo, hi, NULL, NULL, lg, NULL, NULL, err);
    *rows_ok = rc == 0;
    for (int p = 0; p < NP && rc == 0; p++) {
        memcpy(logits + (size_t)p * (STEPS + 1) * V, lg + (size_t)p * V, sizeof(float) * V);
        len[p] = plen[p];
        for (int i = 0; i < plen[p] && *rows_ok; i++) {
            *rows_ok &= glm_cached_rows_logits(m, &kv, p * TQ + i, 1, row, err) == 0;
            if (i == plen[p] - 1) *rows_ok &= memcmp(row, lg + (size_t)p * V, sizeof(float) * V) == 0;
            /* the same row's log-probabilities on the backend: the target's and the best token's */
            int32_t tgt = pr[p][(i + 1) % plen[p]], best;
            float lp, best_lp;
            *rows_ok &= glm_cached_rows_logprobs(m, &kv, p * TQ + i, 1, &tgt, &lp, &best, &best_lp, err) == 0;
            double mx = -INFINITY, sum = 0;
            int arg = 0;
            for (int j = 0; j < V; j++) if (row[j] > mx) { mx = row[j]; arg = j; }
            for (int j = 0; j < V; j++) sum += exp(row[j] - mx);
            double lse = mx + log(sum);
            *rows_ok &= fabs(lp - (row[tgt] - lse)) < 1e-5 && best == arg && fabs(best_lp - (mx - lse)) < 1e-5;
            if (m->cfg.family == GLM_FAMILY_GLM2 && m->cfg.peft.pre_seq_len == 0 && *rows_ok) {
                *rows_ok &= alone(m, pr[p], i + 1, p, ref, err) == 0;
                *rows_ok &= test_max_abs(row, ref, V) < 1e-5;
            }
        }
    }
    *rows_ok &= glm_cached_rows_logits(m, &kv, NP * TQ - 1, 2, row, err) != 0; /* past the call's rows */
    for (int s = 0; s < STEPS && rc == 0; s++) {
        int32_t id[NP], ps[NP], bs[NP], l[NP], h[NP];
        for (int p = 0; p < NP; p++) {
            id[p] = fed(p, s);
            f->next_position(st[p], plen[p] + s, &ps[p], &bs[p]);
            l[p] = 0;
            h[p] = len[p] + 1;
        }
        rc = glm_forward_cached_slots(m, &kv, 0, NP, 1, len, id, ps, bs, l, h, lg, err);
        for (int p = 0; p < NP && rc == 0; p++) {
            len[p]++;
            memcpy(logits + ((size_t)p * (STEPS + 1) + s + 1) * V, lg + (size_t)p * V, sizeof(float) * V);
        }
    }
    free(lg);
    free(row);
    free(ref);
    glm_kvcache_free(m, &kv);
    return rc;
}

int main(void) {
    test_counts tc = {0};
    glm_backend *be = glm_backend_cpu();
    for (int variant = 0; variant < 5; variant++) {
        int glm2 = variant & 1; /* 0, 1: plain; 2, 3: a prefix of 3; 4: v1's projected prefix of 2 */
        glm_config c = config(glm2);
        if (variant >= 2) c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = variant == 4 ? 2 : 3,
                                              .prefix_projection = variant == 4};
        char nm[96];
        const char *vn[] = {"glm", "glm2", "glm_ptuning", "glm2_ptuning", "glm_ptuning_projected"};
        glm_model m;
        glm_model_init_inference(&m, &c, be);
        random_model(&m, 11 + glm2);
        const int32_t (*pr)[6] = glm2 ? prompt_v2 : prompt_v1;
        float *want = calloc((size_t)NP * (STEPS + 1) * V, sizeof(float)), *got = calloc((size_t)NP * (STEPS + 1) * V, sizeof(float));
        glm_err err = {0};
        int rc = 0;
        for (int p = 0; p < NP && rc == 0; p++) rc = alone(&m, pr[p], plen[p], p, want + (size_t)p * (STEPS + 1) * V, &err);
        if (rc == 0) rc = pooled(&m, pr, got, &err);
        int same = rc == 0, checked = 0, finite = 1;
        for (int p = 0; p < NP; p++) {
            int steps = p == 0 ? 3 : STEPS;
            for (int s = 0; s <= steps; s++) {
                const float *a = want + ((size_t)p * (STEPS + 1) + s) * V, *b = got + ((size_t)p * (STEPS + 1) + s) * V;
                same &= memcmp(a, b, sizeof(float) * V) == 0;
                for (int j = 0; j < V; j++) finite &= isfinite(a[j]);
                checked++;
            }
        }
        snprintf(nm, sizeof nm, "%s_slots_bit_identical_to_alone", vn[variant]);
        TEST_CHECK(&tc, nm, same && finite && checked == 16, "rc %d (%s), %d steps compared, finite %d", rc, err.msg, checked,
                   finite);
        { /* a slot whose rows were copied from another's prefill decodes as the prompt alone */
            float *cp = calloc((size_t)STEPS * V, sizeof(float)), *src = calloc((size_t)STEPS * V, sizeof(float));
            int rcc = copied(&m, pr, cp, src, &err);
            const float *w1 = want + (size_t)(STEPS + 1) * V + V; /* prompt 1's decode steps alone */
            snprintf(nm, sizeof nm, "%s_copied_slot_decodes_as_alone", vn[variant]);
            TEST_CHECK(&tc, nm, rcc == 0 && !memcmp(cp, w1, sizeof(float) * STEPS * V) &&
                                    !memcmp(src, w1, sizeof(float) * STEPS * V),
                       "rc %d (%s), max diff copy %g, source %g", rcc, err.msg, test_max_abs(cp, w1, STEPS * V),
                       test_max_abs(src, w1, STEPS * V));
            free(cp);
            free(src);
        }
        if (glm2) { /* a causal block: a prompt's first tokens' rows, kept, serve the rest of it */
            float *rs = calloc((size_t)(STEPS + 1) * V, sizeof(float));
            int rr = resumed(&m, pr, 3, rs, &err);
            const float *w1 = want + (size_t)(STEPS + 1) * V;
            snprintf(nm, sizeof nm, "%s_kept_prefix_then_the_rest_as_alone", vn[variant]);
            TEST_CHECK(&tc, nm, rr == 0 && !memcmp(rs, w1, sizeof(float) * (STEPS + 1) * V), "rc %d (%s), max diff %g", rr,
                       err.msg, rr == 0 ? test_max_abs(rs, w1, (STEPS + 1) * V) : -1.0);
            free(rs);
        }
        if (variant >= 2) { /* the prefix changes what the rows see: the base model differs */
            glm_config cb = config(glm2);
            glm_model b;
            glm_model_init_inference(&b, &cb, be);
            random_model(&b, 11 + glm2);
            float *base = calloc((size_t)(STEPS + 1) * V, sizeof(float));
            int rb = alone(&b, pr[1], plen[1], 1, base, &err);
            snprintf(nm, sizeof nm, "%s_prefix_changes_logits", vn[variant]);
            TEST_CHECK(&tc, nm, rb == 0 && test_max_abs(base, want + (size_t)(STEPS + 1) * V, (STEPS + 1) * V) > 1e-3,
                       "rc %d, max diff %.3g", rb, rb == 0 ? test_max_abs(base, want + (size_t)(STEPS + 1) * V, (STEPS + 1) * V) : -1.0);
            free(base);
            glm_model_free(&b);
        }
        /* prefilled together, padded to the longest prompt */
        float *tog = calloc((size_t)NP * (STEPS + 1) * V, sizeof(float));
        int rows_ok = 0, rt = together(&m, pr, tog, &rows_ok, &err);
        snprintf(nm, sizeof nm, "%s_prompts_prefilled_together_bit_identical_to_alone", vn[variant]);
        TEST_CHECK(&tc, nm, rt == 0 && memcmp(tog, want, sizeof(float) * NP * (STEPS + 1) * V) == 0, "rc %d (%s), max diff %.3g",
                   rt, err.msg, rt == 0 ? test_max_abs(tog, want, NP * (STEPS + 1) * V) : -1.0);
        snprintf(nm, sizeof nm, "%s_prompt_rows_logits", vn[variant]);
        TEST_CHECK(&tc, nm, rows_ok, "rc %d (%s)", rt, err.msg);
        free(tog);
        /* a key range past the slot's tokens and a slot past the pool are refused */
        glm_kvcache kv;
        glm_kvcache_init(&m, &kv, 2, 8);
        int32_t id = 5, ps = 0, bs = 0, lo = 0, hi = 3, len = 1;
        float *lg = malloc(sizeof(float) * 2 * V);
        int r1 = glm_forward_cached_slots(&m, &kv, 0, 1, 1, &len, &id, &ps, &bs, &lo, &hi, lg, &err);
        int r2 = glm_forward_cached_slots(&m, &kv, 2, 1, 1, &len, &id, &ps, &bs, &lo, &lo, lg, &err);
        len = 8;
        int r3 = glm_forward_cached_slots(&m, &kv, 0, 1, 1, &len, &id, &ps, &bs, &lo, &lo, lg, &err);
        int r4 = 0;
        if (c.peft.pre_seq_len > 0) { /* a key range that skips part of the slot's prefix */
            len = 2;
            int32_t lo1 = 1, hi1 = 3;
            r4 = glm_forward_cached_slots(&m, &kv, 0, 1, 1, &len, &id, &ps, &bs, &lo1, &hi1, lg, &err) &&
                 strstr(err.msg, "prefix") != NULL;
        } else {
            r4 = 1;
        }
        snprintf(nm, sizeof nm, "%s_slots_refuse_bad_ranges", vn[variant]);
        TEST_CHECK(&tc, nm, r1 && r2 && r3 && r4, "%d %d %d %d", r1, r2, r3, r4);
        free(lg);
        glm_kvcache_free(&m, &kv);
        free(want);
        free(got);
        glm_model_free(&m);
    }
    be->destroy(be);
    TEST_EXIT(&tc);
}
