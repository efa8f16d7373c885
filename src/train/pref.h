/* Preference training (LLaMA-Factory's --stage dpo): the losses of its CustomDPOTrainer over
 * pairs of a chosen and a rejected answer, made from the token losses the model computes
 * (model/glm.h glm_forward_backward_weighted).
 *
 * A batch of P pairs has 2P rows, the chosen examples first (data/loader.h pairs). Each row's
 * log-probability is the sum of its answer tokens' log p (pi), or their mean for ipo, orpo and
 * simpo (LLaMA-Factory divides by the valid length there). With c, r the chosen and rejected
 * rows' values, rc, rr the reference model's (the model training starts from, in evaluation mode,
 * computed once before training), x = (c - r) - (rc - rr):
 *   sigmoid  -(1 - ls) logsigmoid(beta x) - ls logsigmoid(-beta x)      (TRL's dpo_loss; ls =
 *            --dpo_label_smoothing)
 *   hinge    relu(1 - beta x)
 *   ipo      (x - 1 / (2 beta))^2
 *   orpo     -c - beta logsigmoid((c - r) - (log(1 - e^c) - log(1 - e^r)))   (no reference)
 *   simpo    -logsigmoid(beta (c - r) - gamma)                            (no reference)
 * plus pref_ftx * (-(mean log p of the chosen answer)) when --pref_ftx > 0; the batch's loss is
 * the mean over its pairs. Rewards (the logged metrics): beta (c - rc) and beta (r - rr), or
 * beta c and beta r without a reference, as LLaMA-Factory logs them. */
#ifndef GLM_TRAIN_PREF_H
#define GLM_TRAIN_PREF_H
#include <stdint.h>
#include "data/batch.h"

/* GLM_PREF_RM: --stage rm's pairwise loss over the value head's scores (LLaMA-Factory's
 * PairwiseTrainer): c, r the chosen and rejected rows' values at their last token (model/glm.h:
 * one value a row in place of the token losses), loss -logsigmoid(c - r); rewards are c and r,
 * accuracies c > r. Not a --pref_loss name. */
/* GLM_PREF_KTO: --stage kto (LLaMA-Factory's CustomKTOTrainer over TRL's kto_loss): rows 0..P-1 are
 * examples whose answer is desirable or not (glm_pref_batch.tags), rows P..2P-1 their KL examples
 * (the prompt with another record's answer); with c, k a target's and its KL example's log p sums
 * and rc, rk the reference's, the micro-batch's kl = max(0, mean over its examples (and the ranks'
 * means) of k - rk), not differentiated; a desirable example's loss is wd (1 - sigmoid(beta (c - rc -
 * kl))), an undesirable one's wu (1 - sigmoid(beta (kl - (c - rc)))); the micro-batch's loss their
 * mean plus pref_ftx * mean(-c_avg over the desirable) / n_desirable * P, as LLaMA-Factory scales it. */
typedef enum { GLM_PREF_SIGMOID = 0, GLM_PREF_HINGE, GLM_PREF_IPO, GLM_PREF_ORPO, GLM_PREF_SIMPO, GLM_PREF_RM,
               GLM_PREF_KTO } glm_pref_loss;
int glm_pref_loss_parse(const char *s, glm_pref_loss *out); /* -1 for an unknown name */
static inline int glm_pref_uses_ref(glm_pref_loss l) {
    return l == GLM_PREF_SIGMOID || l == GLM_PREF_HINGE || l == GLM_PREF_IPO || l == GLM_PREF_KTO;
}
static inline int glm_pref_averages(glm_pref_loss l) { return l == GLM_PREF_IPO || l == GLM_PREF_ORPO || l == GLM_PREF_SIMPO; }

typedef struct glm_pref_cfg {
    glm_pref_loss loss;
    double beta, ftx, simpo_gamma, label_smoothing;
    double kto_desirable, kto_undesirable; /* KTO's weights (--kto_chosen_weight, --kto_rejected_weight) */
} glm_pref_cfg;

/* Sums over the pairs seen since the last reset (the logged means divide by n). */
typedef struct glm_pref_sums {
    double n, loss, reward_c, reward_r, correct, margin, logp_c, logp_r, sft, odds;
    double n_c, n_r, kl, n_kl; /* KTO: desirable and undesirable examples, the kl values and their count */
} glm_pref_sums;
#define GLM_PREF_SUMS 14 /* doubles in glm_pref_sums, for reductions over ranks */

/* One pair's loss and its derivatives by c and r (the rows' values above); rc, rr unused
 * without a reference. c_avg: the chosen answer's mean log p (for pref_ftx). */
double glm_pref_pair(const glm_pref_cfg *cfg, double c, double r, double rc, double rr, double c_avg, double *dc,
                     double *dr, double *dc_avg, glm_pref_sums *sums);

/* The micro-batch's state for glm_pref_weigh: ref [2 * pairs] (chosen, rejected; NULL without a
 * reference), sums accumulated. */
typedef struct glm_pref_batch {
    const glm_pref_cfg *cfg;
    const double *ref;
    glm_pref_sums *sums;
    const uint8_t *tags; /* KTO: [pairs] 1 where the example's answer is desirable */
    /* KTO: the mean over the ranks of each rank's kl (has: whether this rank has one); NULL: this rank's */
    double (*kl_mean)(void *ctx, double kl, int has);
    void *kl_ctx;
    /* KTO: [pairs] the KL examples' log p sums from a forward pass of their own (NAN: none), the
     * batch then holding the examples alone (glm_pref_kl_sums); NULL: the batch's second half */
    const double *kl_sums;
} glm_pref_batch;

/* KTO's KL examples (rows P..2P-1 of b) forward only, their log p sums into out [P] (NAN for a
 * row without targets): the pass TRL makes without gradient, so the backward runs over the
 * examples' rows alone. */
struct glm_model;
void glm_pref_kl_sums(struct glm_model *m, const glm_batch *b, double *out);

/* glm_token_weigh for glm_forward_backward_weighted: ctx is a glm_pref_batch. Returns the sum of
 * the pairs' losses. A pair with a row without targets (an evaluation set's wrap-around padding)
 * counts nothing. */
double glm_pref_weigh(void *ctx, const glm_batch *b, const float *tok_loss, int n, float *w);

/* --stage rm: each row's value from vals [n] (the model's one value a row with targets, in row
 * order): out [b->B], NAN for a row without targets. */
void glm_pref_row_values(const glm_batch *b, const float *vals, int n, double *out);

/* Each row's value (the sum or mean of its targets' log p, by cfg) from the token losses:
 * out [b->B]; a row without targets gets NAN. */
void glm_pref_row_logps(const glm_pref_cfg *cfg, const glm_batch *b, const float *tok_loss, double *out);

#endif
