/* GaLore (Zhao et al., 2024; galore_torch's GaLoreAdamW as LLaMA-Factory's use_galore builds it):
 * full fine-tuning whose AdamW moments for the big matrices live in a low-rank projection of
 * their gradients. For a projected weight W [rows, cols] with gradient G, every `gap` steps P
 * becomes the top r singular vectors of G (right: Vh[:r] [r, cols]; left: U[:, :r] [rows, r];
 * full: both; model/tensors.h glm_galore_shape says which), and each step
 *   R = G P^T (right), P^T G (left) or U^T G Vh^T (both)     the projected gradient
 *   m, v = AdamW's moments of R; N = m / (sqrt(v) + eps)
 *   W += -(lr sqrt(bc2) / bc1) * scale * (N P, P N or U N Vh);  then W += -lr wd W
 * The moments carry over when P changes, as galore_torch keeps them. Every other trainable row
 * takes the same optimizer without projection: galore_torch's AdamW (the transformers AdamW of
 * old: eps added to sqrt(v) before the bias correction, weight decay after the step), which
 * LLaMA-Factory uses for all parameter groups; optim/adamw.c runs those rows through its
 * ordinary update with the learning rate, decay and eps that give that order.
 *
 * Signs: an SVD leaves each singular vector's sign free (LAPACK's choice, which differs between
 * CPU and GPU); the moments carried across a change of P depend on it. Here each triplet's right
 * vector has its largest entry positive (backend/svd.h glm_svd_fix_signs).
 *
 * The state lives on the model's backend: P and the two moments per projected row, the flat
 * moments of the other rows (their offsets here, sized by model/tensors.h glm_galore_state as the
 * memory plan is), one float buffer of the largest projected row (the gradient as floats, then
 * the full-size update) and one of the largest projection. One process, or ranks that each hold
 * the whole state (ZeRO-0): the SVD of the summed gradient gives every rank the same P. */
#ifndef GLM_GALORE_H
#define GLM_GALORE_H
#include <stddef.h>
#include "core/err.h"
#include "model/glm.h"

/* Subspace iterations one projection may take: torch's full SVD costs the same whatever the
 * spectrum; iterating until the top vectors stop moving does not, when singular values r and
 * r + 1 are close, and a new projection of every weight must not stall a run. */
#define GLM_GALORE_SVD_ITERS 200

typedef struct glm_galore_row {
    int row;          /* index in m->tab */
    int r, side;      /* rank; GLM_GALORE_FROM_LEFT, _RIGHT or _BOTH (model/tensors.h) */
    size_t low, nproj; /* elements of each moment and of P */
    float *proj;      /* right: P [r, cols]; left: P [rows, r]; both: U_r [rows, r] then Vh_r [r, cols]
                       * (backend floats) */
    float *m, *v;     /* right: [rows, r]; left: [r, cols]; both: [r, r] */
    int projected;    /* P holds values (a fresh state computes them at its first step) */
} glm_galore_row;

typedef struct glm_galore {
    int n;
    glm_galore_row *rows;
    const glm_table *tab; /* the model's table (m->tab), which the offsets follow */
    int gap;              /* steps between projections */
    float scale;          /* galore_scale */
    size_t flat;          /* elements of each flat moment array (the rows not projected) */
    size_t *moff;         /* [tab.n] a row's offset in the flat moment arrays, (size_t)-1 when projected */
    float *full;          /* [largest projected row] the gradient as floats (16-bit backends), then the update */
    int updated;            /* projected rows updated so far in this step */
    int refreshing, capped; /* this step's new projections, and those that stopped at GLM_GALORE_SVD_ITERS */
    long iters;             /* their subspace iterations */
    double t0;              /* when the first of them began */
    float *lowbuf;        /* the projected gradient, then its AdamW direction, and (both sides) an
                           * intermediate product: the largest row's need */
} glm_galore;

/* The state for m's projected rows (m->tab's galore flags, m->cfg.peft's settings), zeroed;
 * NULL when no row is projected. */
glm_galore *glm_galore_new(glm_model *m);
void glm_galore_free(glm_galore *g, glm_model *m);
/* As a fresh state: moments zero, P to be computed at the next step. */
void glm_galore_restart(glm_galore *g, glm_model *m);
/* The update of projected row k (g->rows[k]) at optimizer step `step` (1-based, this one
 * included; a new P when (step - 1) % gap == 0 or none exists): param and master at the row's
 * own start (master NULL on an fp32 backend), grad its gradient (S), multiplied by gs. */
void glm_galore_update(glm_galore *g, glm_model *m, int k, void *param, float *master, const void *grad, long step,
                       float lr, float wd, float b1, float b2, float eps, float bc1, float bc2, float gs);
/* The projected rows' state as checkpoints keep it (optimizer_galore.safetensors): per row
 * "proj/NAME" (both sides: U_r, and Vh_r as "proj_right/NAME"), "exp_avg/NAME", "exp_avg_sq/NAME",
 * fp32, in the shapes above. load fails naming
 * the file when a row is missing or of another shape (another rank, projection or target). */
#define GLM_GALORE_FILE "optimizer_galore.safetensors"
int glm_galore_save(const glm_galore *g, glm_model *m, const char *path, glm_err *err);
int glm_galore_load(glm_galore *g, glm_model *m, const char *path, glm_err *err);

#endif
