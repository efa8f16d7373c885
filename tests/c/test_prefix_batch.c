/* P-Tuning v2 decoding of left-padded rows: prompts of different lengths in one KV cache (each
 * row's prefix placed right before its first real token, model/kvcache.c) give the logits each
 * prompt gives alone, for the prompt and three decode steps, on GLM v1 and the ChatGLM2 block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"
#include "model/glm.h"
#include "micro_configs.h"
#include "test.h"

enum { V = 40, STEPS = 3, TMAX = 16 };

static glm_config config(int glm2) {
    glm_config c = micro_cache_config(glm2);
    c.peft = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = 3};
    return c;
}

static void random_model(glm_model *m, uint64_t seed) {
    glm_rng r;
    glm_rng_seed(&r, seed);
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        float *h = malloc(sizeof(float) * t->numel);
        float sd = t->kind == T_PREFIX_EMB ? 1.0f : t->ndim == 2 ? 0.3f : 0.1f;
        for (size_t j = 0; j < t->numel; j++) h[j] = (t->ndim == 1 && t->kind != T_QKV_B ? 1.0f : 0.0f) + sd * glm_rng_normal(&r);
        glm_model_row_upload(m, t, p, h);
        free(h);
    }
}

/* Row prompts (left-padded to n_max) through the cache, then STEPS fed tokens; logits [STEPS+1][B][V]. */
static int run(glm_model *m, int B, const int32_t *const *prompts, const int *n, float *logits, glm_err *err) {
    const glm_family *f = glm_family_of(&m->cfg);
    int P = 0;
    for (int b = 0; b < B; b++) P = n[b] > P ? n[b] : P;
    glm_kvcache kv;
    glm_kvcache_init(m, &kv, B, TMAX);
    int32_t ids[64], pos[64], bpos[64], lo[64], hi[64], rp[16], rb[16], rh[16], st[8][2];
    for (int b = 0; b < B; b++) {
        int pad = P - n[b];
        if (f->prompt_positions(&m->cfg, prompts[b], n[b], rp, rb, rh, st[b])) return -1;
        for (int j = 0; j < P; j++) {
            int k = b * P + j, i = j - pad;
            if (i < 0) { ids[k] = 0; pos[k] = bpos[k] = 0; lo[k] = j; hi[k] = j + 1; continue; }
            ids[k] = prompts[b][i]; pos[k] = rp[i]; bpos[k] = rb[i]; lo[k] = pad; hi[k] = pad + rh[i];
        }
    }
    int rc = glm_forward_cached(m, &kv, P, ids, pos, bpos, lo, hi, NULL, logits, err);
    for (int s = 0; s < STEPS && rc == 0; s++) {
        for (int b = 0; b < B; b++) {
            ids[b] = 5 + (7 * s + prompts[b][n[b] - 1]) % (V - 5); /* from the prompt itself: the same alone and together */
            f->next_position(st[b], n[b] + s, &pos[b], &bpos[b]);
            lo[b] = P - n[b];
            hi[b] = kv.len + 1;
        }
        rc = glm_forward_cached(m, &kv, 1, ids, pos, bpos, lo, hi, NULL, logits + (size_t)(s + 1) * B * V, err);
    }
    glm_kvcache_free(m, &kv);
    return rc;
}

int main(void) {
    test_counts tc = {0};
    glm_backend *be = glm_backend_cpu();
    for (int glm2 = 0; glm2 < 2; glm2++) {
        glm_config c = config(glm2);
        glm_model m;
        glm_model_init_inference(&m, &c, be);
        random_model(&m, 77 + glm2);
        /* v1 prompts end in [gMASK] <sop>; the ChatGLM2 block's start with them */
        static const int32_t a1[] = {7, 9, 11, 13, 1, 2}, b1[] = {20, 1, 2}, a2[] = {1, 2, 7, 9, 11, 13}, b2[] = {1, 2, 20};
        const int32_t *pr[2] = {glm2 ? a2 : a1, glm2 ? b2 : b1};
        int n[2] = {6, 3};
        float one[2][(STEPS + 1) * V], both[(STEPS + 1) * 2 * V];
        glm_err err = {0};
        int rc = 0;
        for (int b = 0; b < 2 && !rc; b++) rc = run(&m, 1, &pr[b], &n[b], one[b], &err);
        if (!rc) rc = run(&m, 2, pr, n, both, &err);
        double worst = 0, spread = 0;
        for (int s = 0; s <= STEPS && !rc; s++)
            for (int b = 0; b < 2; b++)
                for (int v = 0; v < V; v++) {
                    double d = fabs(both[((size_t)s * 2 + b) * V + v] - one[b][(size_t)s * V + v]);
                    worst = d > worst || d != d ? (d != d ? INFINITY : d) : worst;
                    spread += fabs(one[b][(size_t)s * V + v] - one[b][(size_t)s * V]);
                }
        char name[96];
        snprintf(name, sizeof name, "ptuning_left_padded_rows_equal_alone_%s", glm2 ? "chatglm2" : "chatglm");
        TEST_CHECK(&tc, name, rc == 0 && worst < 1e-5 && spread > 1.0, "rc %d (%s), worst logit difference %.3g (logit spread %.3g)",
                   rc, err.msg, worst, spread);
        printf("  %s: worst logit difference %.3g over the prompt and %d steps\n", name, worst, STEPS);
        glm_model_free(&m);
    }
    be->destroy(be);
    TEST_EXIT(&tc);
}
