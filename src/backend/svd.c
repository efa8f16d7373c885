/* Subspace iteration for the top singular triplets (backend/svd.h). */
#include "backend/svd.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "core/err.h"
#include "core/rng.h"

/* Rows per partial sum: the sums over rows go chunk by chunk, each chunk's in order, then the
 * chunks' in order, so the result does not depend on the thread count. */
#define ORTH_CHUNK 512

/* h[0, j) = x[:, 0..j)^T x[:, j] (sq: also h[j] = |x[:, j]|^2), in double. */
static void column_dots(const float *x, int n, int q, int j, double *h, double *part, int sq) {
    int nc = (n + ORTH_CHUNK - 1) / ORTH_CHUNK, w = sq ? j + 1 : j;
#pragma omp parallel for schedule(static) if (nc > 1 && (size_t)n * w > 65536)
    for (int c = 0; c < nc; c++) {
        double *pc = part + (size_t)c * w;
        for (int k = 0; k < w; k++) pc[k] = 0;
        for (int i = c * ORTH_CHUNK; i < n && i < (c + 1) * ORTH_CHUNK; i++) {
            const float *row = x + (size_t)i * q;
            double xj = row[j];
            for (int k = 0; k < w; k++) pc[k] += (double)row[k] * xj;
        }
    }
    for (int k = 0; k < w; k++) h[k] = 0;
    for (int c = 0; c < nc; c++)
        for (int k = 0; k < w; k++) h[k] += part[(size_t)c * w + k];
}

/* Orthonormal columns of x [n, q] (host) in place by classical Gram-Schmidt with a second pass
 * against each column (as accurate as modified Gram-Schmidt twice over), in double: a column the
 * others span becomes zero. Two sweeps over the rows per column; only where Cholesky QR fails. */
static void orthonormalize_cgs2(float *x, int n, int q) {
    int nc = (n + ORTH_CHUNK - 1) / ORTH_CHUNK;
    double *h = glm_malloc(((size_t)q + 1) * sizeof(double)), *part = glm_malloc((size_t)nc * (q + 1) * sizeof(double));
    for (int j = 0; j < q; j++) {
        for (int pass = 0; pass < 2 && j > 0; pass++) {
            column_dots(x, n, q, j, h, part, 0);
#pragma omp parallel for schedule(static) if ((size_t)n * j > 65536)
            for (int i = 0; i < n; i++) {
                float *row = x + (size_t)i * q;
                double d = 0;
                for (int k = 0; k < j; k++) d += h[k] * row[k];
                row[j] -= (float)d;
            }
        }
        column_dots(x, n, q, j, h, part, 1);
        float inv = h[j] > 0 ? (float)(1.0 / sqrt(h[j])) : 0.0f;
        for (int i = 0; i < n; i++) x[(size_t)i * q + j] *= inv;
    }
    free(h);
    free(part);
}

/* Where the iteration's blocks live: on the host (be NULL: w, x and y are host memory), or on a
 * backend with the matrix (its float buffers; the products there, the q x q matrices of each step
 * on the host). One code path for both: the host's ops are the CPU backend's own. */
typedef struct svd_place {
    glm_backend *be; /* NULL: the host */
    const float *w;  /* [OC, C] */
} svd_place;

/* y = W x (x [C, q], y [OC, q]) or, trans, W^T x (x [OC, q], y [C, q]) */
static void w_times(const svd_place *p, int trans, const float *x, float *y, int OC, int C, int q) {
    int rows = trans ? C : OC, inner = trans ? OC : C;
    if (p->be) p->be->sgemm(p->be, trans, 0, rows, q, inner, 1.0f, p->w, C, x, q, 0.0f, y, q);
    else cpu_sgemm(trans, 0, rows, q, inner, 1.0f, p->w, C, x, q, 0.0f, y, q);
}
/* G [q, k] (host) = x^T y */
static void gram(const svd_place *p, double *G, const float *x, const float *y, int n, int q, int k) {
    if (p->be) p->be->gram_f64(p->be, G, x, y, n, q, k);
    else cpu_gram_f64(G, x, y, n, q, k);
}
/* y [n, k] = x [n, q] M (M [q, k] host) */
static void mul_small(const svd_place *p, float *y, const float *x, const double *M, int n, int q, int k) {
    if (p->be) p->be->mul_small_f64(p->be, y, x, M, n, q, k);
    else cpu_mul_small_f64(y, x, M, n, q, k);
}
/* the block's bytes to or from the host */
static void to_host(const svd_place *p, void *dst, const void *src, size_t bytes) {
    if (p->be) p->be->download(p->be, dst, src, bytes);
    else memcpy(dst, src, bytes);
}
static void from_host(const svd_place *p, void *dst, const void *src, size_t bytes) {
    if (p->be) p->be->upload(p->be, dst, src, bytes);
    else memcpy(dst, src, bytes);
}
static float *block_alloc(const svd_place *p, size_t floats) {
    return p->be ? p->be->alloc(p->be, floats * sizeof(float)) : glm_malloc(floats * sizeof(float));
}
static void block_free(const svd_place *p, float *x) {
    if (p->be) p->be->free(p->be, x);
    else free(x);
}

/* Orthonormal columns of x [n, q] in place: Cholesky QR twice over in double (x = x R^-1 with
 * x^T x = R^T R; the second pass restores orthogonality to float's precision), where x lives
 * (backend orth_f64), else per pass the Gram matrix and the product with R^-1 there and R on the
 * host. Where the columns are (nearly) dependent, classical Gram-Schmidt on the host. torch's QR
 * gives the same span; the signs do not matter to what follows. */
static void orthonormalize(const svd_place *p, float *x, int n, int q) {
    int ok;
    if (!p->be) {
        ok = cpu_orth_f64(x, n, q) == 0;
    } else if (p->be->orth_f64) {
        ok = p->be->orth_f64(p->be, x, n, q) == 0;
    } else {
        double *G = glm_malloc((size_t)q * q * sizeof(double)), *Ri = glm_malloc((size_t)q * q * sizeof(double));
        ok = 1;
        for (int pass = 0; pass < 2 && ok; pass++) {
            gram(p, G, x, x, n, q, q);
            ok = cpu_cholinv_f64(G, Ri, q) == 0;
            if (ok) mul_small(p, x, x, Ri, n, q, q);
        }
        free(G);
        free(Ri);
    }
    if (ok) return;
    if (!p->be) { orthonormalize_cgs2(x, n, q); return; }
    float *h = glm_malloc((size_t)n * q * sizeof(float));
    to_host(p, h, x, (size_t)n * q * sizeof(float));
    orthonormalize_cgs2(h, n, q);
    from_host(p, x, h, (size_t)n * q * sizeof(float));
    free(h);
}

/* Eigenvalues (descending) and vectors (columns of v) of the symmetric q x q matrix a, by
 * cyclic Jacobi rotations in double. */
static void sym_eigen(double *a, double *v, double *ev, int q) {
    for (int i = 0; i < q * q; i++) v[i] = i % (q + 1) == 0;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < q; i++)
            for (int j = 0; j < q; j++) {
                if (i == j) diag += a[i * q + j] * a[i * q + j];
                else off += a[i * q + j] * a[i * q + j];
            }
        if (off <= 1e-30 * diag) break;
        for (int p = 0; p < q; p++)
            for (int r = p + 1; r < q; r++) {
                double apr = a[p * q + r];
                if (fabs(apr) < 1e-300) continue;
                double th = (a[r * q + r] - a[p * q + p]) / (2 * apr);
                double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1)), c = 1 / sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < q; k++) { /* a = J^T a J, v = v J */
                    double akp = a[k * q + p], akr = a[k * q + r];
                    a[k * q + p] = c * akp - s * akr;
                    a[k * q + r] = s * akp + c * akr;
                }
                for (int k = 0; k < q; k++) {
                    double apk = a[p * q + k], ark = a[r * q + k];
                    a[p * q + k] = c * apk - s * ark;
                    a[r * q + k] = s * apk + c * ark;
                }
                for (int k = 0; k < q; k++) {
                    double vkp = v[k * q + p], vkr = v[k * q + r];
                    v[k * q + p] = c * vkp - s * vkr;
                    v[k * q + r] = s * vkp + c * vkr;
                }
            }
    }
    for (int i = 0; i < q; i++) ev[i] = a[i * q + i];
    for (int i = 0; i < q; i++) { /* descending, the vectors with them */
        int best = i;
        for (int j = i + 1; j < q; j++) if (ev[j] > ev[best]) best = j;
        if (best == i) continue;
        double t = ev[i]; ev[i] = ev[best]; ev[best] = t;
        for (int k = 0; k < q; k++) { t = v[k * q + i]; v[k * q + i] = v[k * q + best]; v[k * q + best] = t; }
    }
}

/* The SVD of B = W Q [OC, q] through the eigenvectors E of B^T B: the top `take` triplets into
 * u [OC, take], s [take], v [C, take] (host; U = B E / S, V = Q E); tmp: a block of
 * max(OC, C) x take floats where B and Q live. */
static void ritz(const svd_place *p, const float *bq, const float *qc, float *tmp, int OC, int C, int q, int take, float *u,
                 float *s, float *v) {
    double *g = glm_malloc((size_t)q * q * sizeof(double)), *ev = glm_malloc((size_t)q * q * sizeof(double)),
           *e = glm_malloc((size_t)q * sizeof(double)), *M = glm_malloc((size_t)q * take * sizeof(double));
    gram(p, g, bq, bq, OC, q, q); /* B^T B */
    sym_eigen(g, ev, e, q);
    for (int j = 0; j < take; j++) s[j] = e[j] > 0 ? (float)sqrt(e[j]) : 0.0f;
    if (u) {
        for (int k = 0; k < q; k++)
            for (int j = 0; j < take; j++) M[(size_t)k * take + j] = s[j] > 0 ? ev[k * q + j] / s[j] : 0.0;
        mul_small(p, tmp, bq, M, OC, q, take);
        to_host(p, u, tmp, (size_t)OC * take * sizeof(float));
    }
    for (int k = 0; k < q; k++)
        for (int j = 0; j < take; j++) M[(size_t)k * take + j] = ev[k * q + j];
    mul_small(p, tmp, qc, M, C, q, take);
    to_host(p, v, tmp, (size_t)C * take * sizeof(float));
    free(g);
    free(ev);
    free(e);
    free(M);
}

/* The largest 1 - |v_j . w_j| over the columns of two [C, r] sets of unit vectors: how far the
 * right singular vectors moved (sign-free); s, the current singular values, leaves out those of a
 * rank the matrix does not have. */
static double moved(const float *v, const float *w, const float *s, int C, int r) {
    double worst = 0;
    for (int j = 0; j < r; j++) {
        if (!(s[j] > 1e-5f * s[0])) continue; /* a null vector (the matrix's rank is below r): any direction will do */
        double d = 0;
        for (int i = 0; i < C; i++) d += (double)v[(size_t)i * r + j] * w[(size_t)i * r + j];
        if (1 - fabs(d) > worst) worst = 1 - fabs(d);
    }
    return worst;
}

/* Subspace iterations until the top r right singular vectors stop moving (peft's "pissa", the
 * full SVD's triplets, where they are distinct), with twice the columns for a faster
 * convergence: 1 - |cos| between checks 4 iterations apart below 1e-10; at most `cap`
 * iterations. With `floor` also when it is below 1e-6 and falls by less than a tenth from one
 * check to the next: the floor float products leave a vector whose singular value is close to a
 * neighbour's (it then moves by rounding alone, and more iterations change nothing). */

static int svd_lowrank(const svd_place *p, int OC, int C, int r, int niter, int cap, int floor, uint64_t seed,
                       const float *start, int start_right, float *u, float *s, float *v) {
    /* torch.svd_lowrank for a weight wider in rank than q: a basis Q [C, q] of W's row space from
     * W^T R (R [OC, q] normal), refined by niter rounds of Q' = orth(W Q), Q = orth(W^T Q'); then
     * the SVD of B = W Q [OC, q] gives U, S and V = Q (B's right vectors). niter < 0: until
     * converged (returns the iterations, or -1 when the cap came first). */
    int full = niter < 0, lim = OC < C ? OC : C, q = full ? (2 * r < lim ? 2 * r : lim) : r, it = 0, done = !full;
    int wide = OC > C ? OC : C;
    float *b = block_alloc(p, (size_t)OC * q), *qc = block_alloc(p, (size_t)C * q), *tmp = block_alloc(p, (size_t)wide * r);
    float *vprev = full ? glm_malloc((size_t)C * r * sizeof(float)) : NULL;
    double last = 1; /* the previous check's movement */
    {   /* the start, made on the host */
        float *h = glm_malloc((size_t)wide * q * sizeof(float));
        glm_rng rng;
        glm_rng_seed(&rng, seed);
        for (size_t i = 0; i < (size_t)OC * q; i++) h[i] = glm_rng_normal(&rng);
        if (start && !start_right) /* the first r columns of R: the left vectors given */
            for (int i = 0; i < OC; i++) memcpy(h + (size_t)i * q, start + (size_t)i * r, (size_t)r * sizeof(float));
        from_host(p, b, h, (size_t)OC * q * sizeof(float));
        w_times(p, 1, b, qc, OC, C, q); /* W^T R */
        if (start && start_right) { /* the first r columns of Q: the right vectors given */
            to_host(p, h, qc, (size_t)C * q * sizeof(float));
            for (int i = 0; i < C; i++) memcpy(h + (size_t)i * q, start + (size_t)i * r, (size_t)r * sizeof(float));
            from_host(p, qc, h, (size_t)C * q * sizeof(float));
        }
        free(h);
    }
    orthonormalize(p, qc, C, q);
    for (it = 0; full ? it < cap : it < niter; it++) {
        w_times(p, 0, qc, b, OC, C, q); /* W Q */
        orthonormalize(p, b, OC, q);
        w_times(p, 1, b, qc, OC, C, q); /* W^T Q' */
        orthonormalize(p, qc, C, q);
        if (full && it % 4 == 3) {
            w_times(p, 0, qc, b, OC, C, q);
            ritz(p, b, qc, tmp, OC, C, q, r, NULL, s, v);
            double mv = it > 3 ? moved(v, vprev, s, C, r) : 1;
            if (mv < 1e-10 || (floor && mv < 1e-6 && last < 1e-6 && mv > 0.9 * last)) { done = 1; it++; break; }
            last = mv;
            memcpy(vprev, v, (size_t)C * r * sizeof(float));
        }
    }
    w_times(p, 0, qc, b, OC, C, q); /* B = W Q [OC, q] */
    ritz(p, b, qc, tmp, OC, C, q, r, u, s, v);
    block_free(p, b);
    block_free(p, qc);
    block_free(p, tmp);
    free(vprev);
    return done ? it : -1;
}

static int svd_on(glm_backend *be, const float *w, int OC, int C, int q, int niter, int cap, int floor, uint64_t seed,
                  const float *start, int start_right, float *u, float *s, float *v) {
    GLM_ASSERT(!be || glm_svd_runs_on(be));
    svd_place p = {.be = be, .w = w};
    return svd_lowrank(&p, OC, C, q, niter, cap, floor, seed, start, start_right, u, s, v);
}

int glm_svd_lowrank_on(glm_backend *be, const float *w, int OC, int C, int q, int niter, uint64_t seed, float *u,
                       float *s, float *v) {
    return svd_on(be, w, OC, C, q, niter, GLM_SVD_MAX_ITERS, 0, seed, NULL, 0, u, s, v);
}

int glm_svd_top(glm_backend *be, const float *w, int OC, int C, int q, int max_iters, uint64_t seed, const float *start,
                int start_right, float *u, float *s, float *v) {
    return svd_on(be, w, OC, C, q, -1, max_iters, 1, seed, start, start_right, u, s, v);
}

void glm_svd_fix_signs(float *u, float *v, int OC, int C, int q) {
    for (int j = 0; j < q; j++) {
        int best = 0;
        for (int k = 1; k < C; k++)
            if (fabsf(v[(size_t)k * q + j]) > fabsf(v[(size_t)best * q + j])) best = k;
        if (!(v[(size_t)best * q + j] < 0)) continue;
        for (int k = 0; k < C; k++) v[(size_t)k * q + j] = -v[(size_t)k * q + j];
        for (int k = 0; u && k < OC; k++) u[(size_t)k * q + j] = -u[(size_t)k * q + j];
    }
}
