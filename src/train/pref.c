/* Preference losses over pairs of rows (train/pref.h). Everything in double: the per-pair values
 * are few, and the derivatives go back as the token weights of the head's gradient. */
#include "train/pref.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "model/glm.h"

int glm_pref_loss_parse(const char *s, glm_pref_loss *out) {
    static const char *names[] = {"sigmoid", "hinge", "ipo", "orpo", "simpo"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) { *out = (glm_pref_loss)i; return 0; }
    return -1;
}

static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
static double logsigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

double glm_pref_pair(const glm_pref_cfg *cfg, double c, double r, double rc, double rr, double c_avg, double *dc,
                     double *dr, double *dc_avg, glm_pref_sums *s) {
    double beta = cfg->beta, loss = 0, gc = 0, gr = 0, odds = 0;
    int ref = glm_pref_uses_ref(cfg->loss);
    double x = ref ? (c - r) - (rc - rr) : 0;
    switch (cfg->loss) {
    case GLM_PREF_SIGMOID: {
        double ls = cfg->label_smoothing, z = beta * x;
        loss = -(1 - ls) * logsigmoid(z) - ls * logsigmoid(-z);
        double dz = -(1 - ls) * sigmoid(-z) + ls * sigmoid(z);
        gc = beta * dz; gr = -beta * dz;
        break;
    }
    case GLM_PREF_HINGE: {
        double h = 1 - beta * x;
        loss = h > 0 ? h : 0;
        gc = h > 0 ? -beta : 0; gr = -gc;
        break;
    }
    case GLM_PREF_IPO: {
        double d = x - 1 / (2 * beta);
        loss = d * d;
        gc = 2 * d; gr = -2 * d;
        break;
    }
    case GLM_PREF_ORPO: {
        /* log odds (c - r) - (log1p(-e^c) - log1p(-e^r)); d/dc = 1 / (1 - e^c) */
        double lo = (c - r) - (log1p(-exp(c)) - log1p(-exp(r)));
        odds = -logsigmoid(lo);
        loss = -c + beta * odds;
        double dlo = -beta * sigmoid(-lo);
        gc = -1 + dlo / -expm1(c); gr = -dlo / -expm1(r);
        break;
    }
    case GLM_PREF_SIMPO: {
        double z = beta * (c - r) - cfg->simpo_gamma;
        loss = -logsigmoid(z);
        double dz = -sigmoid(-z);
        gc = beta * dz; gr = -beta * dz;
        break;
    }
    case GLM_PREF_KTO: break; /* kto_weigh: a batch's examples together */
    case GLM_PREF_RM: { /* scores, not log-probabilities: the rewards are the scores themselves */
        loss = -logsigmoid(c - r);
        gc = -sigmoid(r - c); gr = -gc;
        beta = 1;
        break;
    }
    }
    *dc = gc;
    *dr = gr;
    *dc_avg = 0;
    if (cfg->ftx > 1e-6) { /* LLaMA-Factory's threshold */
        loss += cfg->ftx * -c_avg;
        *dc_avg = -cfg->ftx;
    }
    if (s) {
        double wc = ref ? beta * (c - rc) : beta * c, wr = ref ? beta * (r - rr) : beta * r;
        s->n += 1;
        s->loss += loss;
        s->reward_c += wc;
        s->reward_r += wr;
        s->correct += wc > wr;
        s->margin += wc - wr;
        s->logp_c += c;
        s->logp_r += r;
        s->sft += -c_avg;
        s->odds += odds;
    }
    return loss;
}

/* Each target token's weight, its row's rw, into w [n] (the batch's flat order). */
static void spread_row_weights(const glm_batch *b, const double *rw, int n, float *w) {
    int k = 0;
    for (int i = 0; i < b->B * b->T; i++)
        if (b->targets[i] != -100) w[k++] = (float)rw[i / b->T];
    GLM_ASSERT(k == n);
}

/* Row sums of -tok_loss (the log p of each row's targets) and their counts. */
static void row_sums(const glm_batch *b, const float *tok_loss, double *sum, int *cnt) {
    for (int i = 0; i < b->B; i++) { sum[i] = 0; cnt[i] = 0; }
    int k = 0;
    for (int i = 0; i < b->B * b->T; i++)
        if (b->targets[i] != -100) {
            sum[i / b->T] -= tok_loss[k++];
            cnt[i / b->T]++;
        }
}

void glm_pref_row_logps(const glm_pref_cfg *cfg, const glm_batch *b, const float *tok_loss, double *out) {
    int *cnt = glm_malloc(sizeof(int) * (size_t)b->B);
    row_sums(b, tok_loss, out, cnt);
    for (int i = 0; i < b->B; i++)
        out[i] = cnt[i] == 0 ? NAN : glm_pref_averages(cfg->loss) ? out[i] / cnt[i] : out[i];
    free(cnt);
}

void glm_pref_row_values(const glm_batch *b, const float *vals, int n, double *out) {
    int k = 0;
    for (int i = 0; i < b->B; i++) {
        int has = 0;
        for (int j = 0; j < b->T && !has; j++) has = b->targets[(size_t)i * b->T + j] != -100;
        out[i] = has ? vals[k++] : NAN;
    }
    GLM_ASSERT(k == n);
}

/* --stage rm: vals holds one value a row with targets (in row order); w their derivatives. */
static double rm_weigh(const glm_pref_batch *pb, const glm_batch *b, const float *vals, int n, float *w) {
    int B = b->B, P = B / 2;
    double *v = glm_malloc(sizeof(double) * (size_t)B), *dv = glm_calloc((size_t)B, sizeof(double));
    glm_pref_row_values(b, vals, n, v);
    double total = 0;
    for (int p = 0; p < P; p++) {
        if (isnan(v[p]) || isnan(v[P + p])) continue;
        double dca;
        total += glm_pref_pair(pb->cfg, v[p], v[P + p], 0, 0, 0, &dv[p], &dv[P + p], &dca, pb->sums);
    }
    for (int i = 0, k = 0; i < B; i++)
        if (!isnan(v[i])) w[k++] = (float)dv[i];
    free(v); free(dv);
    return total;
}

/* --stage kto: the micro-batch's loss times its examples (so that the step's mean over examples is
 * the mean of the micro-batches' losses, as the Trainer's accumulation makes it), and the targets'
 * token weights; the KL rows' tokens get none (TRL computes them without gradient). */
static double kto_weigh(const glm_pref_batch *pb, const glm_batch *b, const float *tok_loss, int n, float *w) {
    const glm_pref_cfg *cfg = pb->cfg;
    int B = b->B, split = pb->kl_sums != NULL, P = split ? B : B / 2;
    double *sum = glm_malloc(sizeof(double) * (size_t)B), *rw = glm_calloc((size_t)B, sizeof(double));
    double *kls = glm_malloc(sizeof(double) * (size_t)(P ? P : 1));
    int *cnt = glm_malloc(sizeof(int) * (size_t)B);
    row_sums(b, tok_loss, sum, cnt);
    for (int p = 0; p < P; p++) kls[p] = split ? pb->kl_sums[p] : cnt[P + p] ? sum[P + p] : NAN;
    double kl_sum = 0;
    int m = 0, n_c = 0;
    for (int p = 0; p < P; p++)
        if (cnt[p] && !isnan(kls[p])) {
            kl_sum += kls[p] - pb->ref[2 * p + 1];
            m++;
            n_c += pb->tags[p] != 0;
        }
    double kl = m ? kl_sum / m : 0;
    if (pb->kl_mean) kl = pb->kl_mean(pb->kl_ctx, kl, m > 0);
    if (kl < 0) kl = 0; /* clamp(min=0), after the mean over the ranks */
    double total = 0, beta = cfg->beta, sft = 0;
    /* LLaMA-Factory's ftx term, pref_ftx * mean(-c_avg) / n_c * P, times the m examples */
    double ftx = cfg->ftx > 1e-6 && n_c > 0 ? cfg->ftx * m * P / ((double)n_c * n_c) : 0;
    for (int p = 0; p < P; p++) {
        if (!cnt[p] || isnan(kls[p])) continue;
        double lr = sum[p] - pb->ref[2 * p], loss, d; /* d: d loss / d c */
        if (pb->tags[p]) {
            double s = sigmoid(beta * (lr - kl));
            loss = cfg->kto_desirable * (1 - s);
            d = -cfg->kto_desirable * beta * s * (1 - s);
            sft += -sum[p] / cnt[p];
            rw[p] = ftx / cnt[p]; /* -c_avg's token weights */
        } else {
            double s = sigmoid(beta * (kl - lr));
            loss = cfg->kto_undesirable * (1 - s);
            d = cfg->kto_undesirable * beta * s * (1 - s);
        }
        total += loss;
        rw[p] += -d; /* a token's loss is -log p */
        if (pb->sums) {
            glm_pref_sums *st = pb->sums;
            st->n += 1;
            st->loss += loss;
            if (pb->tags[p]) { st->n_c += 1; st->reward_c += beta * lr; st->logp_c += sum[p]; }
            else { st->n_r += 1; st->reward_r += beta * lr; st->logp_r += sum[p]; }
        }
    }
    total += ftx * sft;
    if (pb->sums && m > 0) { pb->sums->kl += kl; pb->sums->n_kl += 1; pb->sums->sft += sft; }
    spread_row_weights(b, rw, n, w);
    free(sum); free(rw); free(cnt); free(kls);
    return total;
}

double glm_pref_weigh(void *ctx, const glm_batch *b, const float *tok_loss, int n, float *w) {
    const glm_pref_batch *pb = ctx;
    const glm_pref_cfg *cfg = pb->cfg;
    if (cfg->loss == GLM_PREF_RM) return rm_weigh(pb, b, tok_loss, n, w);
    if (cfg->loss == GLM_PREF_KTO) return kto_weigh(pb, b, tok_loss, n, w);
    int B = b->B, P = B / 2, avg = glm_pref_averages(cfg->loss);
    double *sum = glm_malloc(sizeof(double) * (size_t)B), *rw = glm_malloc(sizeof(double) * (size_t)B);
    int *cnt = glm_malloc(sizeof(int) * (size_t)B);
    row_sums(b, tok_loss, sum, cnt);
    double total = 0;
    for (int p = 0; p < P; p++) {
        int ic = p, ir = P + p;
        rw[ic] = rw[ir] = 0;
        if (!cnt[ic] || !cnt[ir]) continue;
        double c = avg ? sum[ic] / cnt[ic] : sum[ic], r = avg ? sum[ir] / cnt[ir] : sum[ir];
        double rc = pb->ref ? pb->ref[2 * p] : 0, rr = pb->ref ? pb->ref[2 * p + 1] : 0, dc, dr, dca;
        total += glm_pref_pair(cfg, c, r, rc, rr, sum[ic] / cnt[ic], &dc, &dr, &dca, pb->sums);
        /* a token's loss is -log p: its weight is -d loss / d log p, through the sum or the mean */
        rw[ic] = -(avg ? dc / cnt[ic] : dc) - dca / cnt[ic];
        rw[ir] = -(avg ? dr / cnt[ir] : dr);
    }
    spread_row_weights(b, rw, n, w);
    free(sum); free(rw); free(cnt);
    return total;
}

void glm_pref_kl_sums(glm_model *m, const glm_batch *b, double *out) {
    int P = b->B / 2;
    glm_batch kl = glm_batch_rows(b, P, P);
    float *tok = glm_malloc(sizeof(float) * (size_t)(kl.n_targets ? kl.n_targets : 1));
    glm_forward_token_losses(m, &kl, tok);
    double *sum = glm_malloc(sizeof(double) * (size_t)(P ? P : 1));
    int *cnt = glm_malloc(sizeof(int) * (size_t)(P ? P : 1));
    row_sums(&kl, tok, sum, cnt);
    for (int p = 0; p < P; p++) out[p] = cnt[p] ? sum[p] : NAN;
    free(tok); free(sum); free(cnt);
}
