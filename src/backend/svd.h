/* The top singular triplets of a float matrix by subspace iteration (torch.svd_lowrank's
 * algorithm), for PiSSA's adapters (model/pissa.h) and GaLore's projections (optim/galore.h).
 * The iteration runs where the matrix lives: on the host, or on a backend's float buffer (its
 * sgemm for the two big products, gram_f64 and mul_small_f64 for the thin blocks'
 * orthonormalization and Ritz vectors in double). Only q x q matrices go to the host, for the
 * steps on them (Cholesky, R's inverse, the Jacobi eigenvalues), and the answer's vectors. */
#ifndef GLM_BACKEND_SVD_H
#define GLM_BACKEND_SVD_H
#include <stdint.h>
#include "backend/backend.h"

/* Whether the iteration can run on be's float buffers: its products (sgemm) and the thin
 * blocks' small-matrix ops (gram_f64, mul_small_f64). */
static inline int glm_svd_runs_on(const glm_backend *be) { return be->sgemm && be->gram_f64 && be->mul_small_f64; }

/* Iterations at most when iterating until the triplets stop moving (niter < 0). */
#define GLM_SVD_MAX_ITERS 4000

/* torch.svd_lowrank(W, q, niter) of w [OC, C] (the Gaussian start drawn from seed): u [OC, q],
 * s [q] (descending), v [C, q] with W ~ u diag(s) v^T (u may be NULL: not computed). niter < 0:
 * the top q triplets of the full SVD, iterating until they stop moving; returns the iterations,
 * -1 when they still moved at GLM_SVD_MAX_ITERS (close singular values). be NULL: w is on the
 * host; else w is a float buffer of be (glm_svd_runs_on). */
int glm_svd_lowrank_on(glm_backend *be, const float *w, int OC, int C, int q, int niter, uint64_t seed, float *u,
                       float *s, float *v);
/* The top q triplets as niter < 0 gives them, for GaLore's repeated projections, where what each
 * costs matters: also done when the vectors' movement has reached the floor float products
 * leave (close singular values), and at most max_iters iterations; the same return value (-1:
 * the cap came first; u, s, v hold the subspace reached). start (host, or NULL): q vectors the
 * iteration starts from beside q random ones (a previous answer, which a slowly changing matrix
 * keeps close): right ones [C, q] when start_right, else left ones [OC, q]. */
int glm_svd_top(glm_backend *be, const float *w, int OC, int C, int q, int max_iters, uint64_t seed, const float *start,
                int start_right, float *u, float *s, float *v);
/* One sign per triplet, where an SVD leaves it free: triplet j is negated (u's and v's column j)
 * when v's column j has its largest |entry| (the first of equal ones) negative. u may be NULL. */
void glm_svd_fix_signs(float *u, float *v, int OC, int C, int q);

#endif
