/* backend/svd.c, the subspace iteration behind PiSSA's start and GaLore's projections, on
 * matrices whose SVD is known by construction (W = U diag(s) V^T with U, V orthonormal in double):
 * the top singular values and vectors; GaLore's stop at the floor of float products (singular
 * values close together) and its bound; a start from the answer; a rank below the columns asked
 * for (the orthonormalization's fallback for dependent columns); the sign rule; and the products
 * through a backend (the CPU one) equal to those on the host. */
#include <math.h>
#include <stdlib.h>
#include "backend/backend.h"
#include "backend/svd.h"
#include "core/rng.h"
#include "test.h"

/* Orthonormal columns [n, k] in double (Gram-Schmidt twice over on Gaussian columns). */
static double *orthonormal(int n, int k, glm_rng *g) {
    double *x = malloc(sizeof(double) * (size_t)n * k);
    for (int i = 0; i < n * k; i++) x[i] = glm_rng_normal(g);
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < k; j++) {
            for (int c = 0; c < j; c++) {
                double d = 0;
                for (int i = 0; i < n; i++) d += x[i * k + j] * x[i * k + c];
                for (int i = 0; i < n; i++) x[i * k + j] -= d * x[i * k + c];
            }
            double s = 0;
            for (int i = 0; i < n; i++) s += x[i * k + j] * x[i * k + j];
            for (int i = 0; i < n; i++) x[i * k + j] /= sqrt(s);
        }
    return x;
}

typedef struct { int OC, C, k; double *U, *V, *s; float *w; } known;

/* W [OC, C] = U diag(s) V^T of rank k with the given singular values. */
static known make(int OC, int C, int k, const double *s, uint64_t seed) {
    glm_rng g;
    glm_rng_seed(&g, seed);
    known m = {OC, C, k, orthonormal(OC, k, &g), orthonormal(C, k, &g), malloc(sizeof(double) * k), malloc(sizeof(float) * (size_t)OC * C)};
    for (int j = 0; j < k; j++) m.s[j] = s[j];
    for (int i = 0; i < OC; i++)
        for (int c = 0; c < C; c++) {
            double d = 0;
            for (int j = 0; j < k; j++) d += m.U[i * k + j] * m.s[j] * m.V[c * k + j];
            m.w[(size_t)i * C + c] = (float)d;
        }
    return m;
}

static void drop(known *m) { free(m->U); free(m->V); free(m->s); free(m->w); }

/* The worst 1 - |cos| between column j of v [C, q] and the known V's column j, over j < n (the
 * float vector's own norm, ~1e-8 off 1, divided out); and the worst relative error of the
 * singular values. */
static double worst_angle(const known *m, const float *v, int q, int n) {
    double worst = 0;
    for (int j = 0; j < n; j++) {
        double d = 0, len = 0;
        for (int c = 0; c < m->C; c++) d += v[c * q + j] * m->V[c * m->k + j], len += (double)v[c * q + j] * v[c * q + j];
        worst = fmax(worst, 1 - fabs(d) / sqrt(len));
    }
    return worst;
}
static double worst_s(const known *m, const float *s, int q) {
    double worst = 0;
    for (int j = 0; j < q; j++) worst = fmax(worst, fabs(s[j] - m->s[j]) / m->s[0]);
    return worst;
}

int main(void) {
    test_counts tc = {0};
    enum { OC = 300, C = 120, R = 6 };
    float u[OC * 2 * R], v[C * 2 * R], s[2 * R];
    double sv[40];

    /* a decaying spectrum with distinct values: the full SVD's top triplets */
    for (int j = 0; j < 40; j++) sv[j] = pow(0.85, j);
    known a = make(OC, C, 40, sv, 1);
    int its = glm_svd_top(NULL, a.w, OC, C, R, 200, 7, NULL, 0, u, s, v);
    double ang = worst_angle(&a, v, R, R), es = worst_s(&a, s, R);
    TEST_CHECK(&tc, "svd_top_distinct_values", its > 0 && ang < 1e-8 && es < 1e-5, "its %d, 1-|cos| %.3g, s %.3g", its, ang, es);
    int lim = glm_svd_lowrank_on(NULL, a.w, OC, C, R, -1, 7, u, s, v);
    TEST_CHECK(&tc, "svd_lowrank_converged_mode", lim > 0 && worst_angle(&a, v, R, R) < 1e-8, "its %d", lim);

    /* started from the answer: correct within the first checks (how many depends on the float
     * rounding of the build: 12 here, 16 under the sanitizers; cold 20 and 12) */
    float *v0 = malloc(sizeof(float) * C * R);
    for (int c = 0; c < C; c++)
        for (int j = 0; j < R; j++) v0[c * R + j] = (float)a.V[c * a.k + j];
    int warm = glm_svd_top(NULL, a.w, OC, C, R, 200, 7, v0, 1, u, s, v);
    TEST_CHECK(&tc, "svd_top_started_from_the_answer", warm > 0 && warm <= 20 && worst_angle(&a, v, R, R) < 1e-8,
               "%d iterations (cold %d), 1-|cos| %.3g", warm, its, worst_angle(&a, v, R, R));
    float *u0 = malloc(sizeof(float) * OC * R);
    for (int i = 0; i < OC; i++)
        for (int j = 0; j < R; j++) u0[i * R + j] = (float)a.U[i * a.k + j];
    int warm_left = glm_svd_top(NULL, a.w, OC, C, R, 200, 7, u0, 0, u, s, v);
    TEST_CHECK(&tc, "svd_top_started_from_left_vectors", warm_left > 0 && warm_left <= 20 && worst_angle(&a, v, R, R) < 1e-8,
               "%d iterations", warm_left);

    /* the same products through a backend (the CPU one: its float buffers are host memory) */
    glm_backend *be = glm_backend_cpu();
    float u2[OC * R], v2[C * R], s2[R];
    int its_be = glm_svd_top(be, a.w, OC, C, R, 200, 7, NULL, 0, u2, s2, v2);
    glm_svd_top(NULL, a.w, OC, C, R, 200, 7, NULL, 0, u, s, v);
    int same = its_be == its;
    for (int j = 0; j < C * R; j++) same &= v2[j] == v[j];
    TEST_CHECK(&tc, "svd_top_through_a_backend_equals_the_host", same, "its %d vs %d", its_be, its);

    /* two singular values 3e-4 apart (0.5 and 0.49985): float products leave their vectors a
     * rounding's jitter (~1e-4 rad), above the strict rule's 1e-10 and below the floor's 1e-6;
     * GaLore's rule stops there, long before the bound, with the others exact */
    for (int j = 0; j < 40; j++) sv[j] = j < 3 ? pow(0.8, j) : j == 3 ? 0.5 : j == 4 ? 0.5 * (1 - 3e-4) : 0.4 * pow(0.6, j - 5);
    known b = make(OC, C, 40, sv, 2);
    int close_its = glm_svd_top(NULL, b.w, OC, C, R, 200, 9, NULL, 0, u, s, v);
    double distinct = worst_angle(&b, v, R, 3); /* the three above the pair */
    TEST_CHECK(&tc, "svd_top_stops_at_the_float_floor", close_its > 0 && close_its < 100 && distinct < 1e-8,
               "its %d, 1-|cos| of the distinct ones %.3g", close_its, distinct);
    int strict = glm_svd_lowrank_on(NULL, b.w, OC, C, R, -1, 9, u, s, v);
    TEST_CHECK(&tc, "svd_strict_rule_runs_longer_there", strict == -1 || strict > close_its, "strict %d, floor %d", strict, close_its);
    int capped = glm_svd_top(NULL, b.w, OC, C, R, 4, 9, NULL, 0, u, s, v);
    int finite = 1;
    for (int j = 0; j < C * R; j++) finite &= isfinite(v[j]);
    TEST_CHECK(&tc, "svd_top_bound_returns_the_subspace_reached", capped == -1 && finite, "returned %d", capped);

    /* rank 3 below the 2R columns the iteration keeps: dependent columns, the fallback; the top 3
     * exact, the rest of the values zero, everything finite */
    double low[3] = {3, 2, 1};
    known c = make(OC, C, 3, low, 3);
    int lr = glm_svd_top(NULL, c.w, OC, C, R, 200, 11, NULL, 0, u, s, v);
    finite = 1;
    for (int j = 0; j < C * R; j++) finite &= isfinite(v[j]);
    for (int j = 0; j < OC * R; j++) finite &= isfinite(u[j]);
    double tail = 0;
    for (int j = 3; j < R; j++) tail = fmax(tail, fabs(s[j]));
    TEST_CHECK(&tc, "svd_top_rank_below_the_columns", lr > 0 && lr < 100 && finite && worst_angle(&c, v, R, 3) < 1e-8 && tail < 1e-5 &&
                    worst_s(&c, s, 3) < 1e-5, "its %d, finite %d, 1-|cos| %.3g, tail %.3g", lr, finite, worst_angle(&c, v, R, 3), tail);
    /* the same through a backend: its fallback takes the block to the host and back */
    float u3[OC * R], v3[C * R], s3[R];
    int lr_be = glm_svd_top(be, c.w, OC, C, R, 200, 11, NULL, 0, u3, s3, v3);
    int same3 = lr_be == lr;
    for (int j = 0; j < C * R; j++) same3 &= v3[j] == v[j];
    for (int j = 0; j < OC * R; j++) same3 &= u3[j] == u[j];
    TEST_CHECK(&tc, "svd_top_rank_below_the_columns_through_a_backend", same3, "its %d vs %d", lr_be, lr);

    /* signs: each triplet's right vector ends with its largest entry positive, u flipped alike */
    glm_svd_top(NULL, a.w, OC, C, R, 200, 7, NULL, 0, u, s, v);
    for (int j = 0; j < R; j++) /* flip every other triplet first */
        if (j % 2) {
            for (int x = 0; x < C; x++) v[x * R + j] = -v[x * R + j];
            for (int x = 0; x < OC; x++) u[x * R + j] = -u[x * R + j];
        }
    glm_svd_fix_signs(u, v, OC, C, R);
    int signs = 1;
    for (int j = 0; j < R; j++) {
        int best = 0;
        for (int x = 1; x < C; x++) if (fabsf(v[x * R + j]) > fabsf(v[best * R + j])) best = x;
        double d = 0; /* u_j . (W v_j) > 0: u still pairs with v */
        for (int i = 0; i < OC; i++) {
            double wv = 0;
            for (int x = 0; x < C; x++) wv += a.w[(size_t)i * C + x] * v[x * R + j];
            d += u[i * R + j] * wv;
        }
        signs &= v[best * R + j] > 0 && d > 0;
    }
    TEST_CHECK(&tc, "svd_fix_signs_largest_entry_positive", signs, "a triplet kept a negative largest entry or lost its pairing");

    be->destroy(be);
    free(v0);
    free(u0);
    drop(&a); drop(&b); drop(&c);
    TEST_EXIT(&tc);
}
