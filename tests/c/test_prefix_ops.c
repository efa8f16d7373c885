/* The P-Tuning v2 ops of the CPU backend (backend.h prefix_kv, prefix_kv_bwd, tanh_fwd,
 * tanh_bwd) against straightforward double-precision references written here: the prefix rows
 * are layer `layer`'s slices of pkv where kept and exact zeros where dropped (about p of them,
 * each batch row its own mask, the same mask as mask_scale over the kv-shaped tensor), p = 0
 * copies exactly, the sequence rows are qkv's k and v; the backward writes dqkv's k|v slots
 * only, sums the prefix over the batch rows and adds into dpkv's two slots of the layer, does
 * not depend on the thread count, and is the adjoint of the forward (<F x, g> == <x, F^T g>). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/mask_hash.h"
#include "core/rng.h"
#include "test.h"

#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)

typedef struct { int B, T, P, NH, HD, L, layer; } shape;

static float *randn(glm_rng *r, size_t n, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = scale * glm_rng_normal(r);
    return x;
}
static float *fdup(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* flat indices of the layouts, written out once here */
static size_t kv_at(const shape *s, int b, int j, int h, int k, int d) {
    return ((((size_t)b * (s->P + s->T) + j) * s->NH + h) * 2 + k) * s->HD + d;
}
static size_t qkv_at(const shape *s, int b, int t, int h, int part, int d) {
    return ((((size_t)b * s->T + t) * s->NH + h) * 3 + part) * s->HD + d;
}
static size_t pkv_at(const shape *s, int j, int slot, int h, int d) {
    return (((size_t)j * 2 * s->L + slot) * s->NH + h) * s->HD + d;
}

static void t_shape(test_counts *tc, shape s, float p, uint64_t seed, glm_rng *rng) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "B%dT%dP%dNH%dHD%d_p%g", s.B, s.T, s.P, s.NH, s.HD, p);
    const int B = s.B, T = s.T, P = s.P, NH = s.NH, HD = s.HD, PT = P + T;
    const size_t H = (size_t)NH * HD, nkv = (size_t)B * PT * 2 * H, nqkv = (size_t)B * T * 3 * H;
    const size_t npkv = (size_t)P * 2 * s.L * H;
    const uint32_t th = glm_mask_threshold(p);
    const double inv = p > 0 ? 1.0 / (1.0 - p) : 1.0;
    float *qkv = randn(rng, nqkv, 1.0f), *pkv = randn(rng, npkv, 0.5f), *kv = malloc(sizeof(float) * nkv);
    for (size_t i = 0; i < nkv; i++) kv[i] = NAN; /* every element must be written */
    cpu_prefix_kv(kv, qkv, pkv, s.layer, s.L, B, T, P, NH, HD, p, seed);

    /* ---- forward against the reference */
    size_t pre = 0, dropped = 0, bad_keep = 0, bad_drop = 0, bad_seq = 0, row_diff = 0;
    double max_rel = 0;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < PT; j++)
            for (int h = 0; h < NH; h++)
                for (int k = 0; k < 2; k++)
                    for (int d = 0; d < HD; d++) {
                        size_t i = kv_at(&s, b, j, h, k, d);
                        if (j < P) {
                            int keep = p == 0 || glm_mask_keep(seed, i, th);
                            double ref = keep ? pkv[pkv_at(&s, j, 2 * s.layer + k, h, d)] * inv : 0.0;
                            pre++;
                            if (!keep) {
                                dropped++;
                                bad_drop += kv[i] != 0.0f;
                            } else {
                                double e = fabs(kv[i] - ref) / (fabs(ref) > 1e-30 ? fabs(ref) : 1e-30);
                                if (!(e <= 2e-7)) bad_keep++;
                                if (e > max_rel) max_rel = e;
                                if (p == 0 && kv[i] != pkv[pkv_at(&s, j, 2 * s.layer + k, h, d)]) bad_keep++;
                            }
                            if (b > 0) { /* the same element of batch row 0: its own mask */
                                int keep0 = p == 0 || glm_mask_keep(seed, kv_at(&s, 0, j, h, k, d), th);
                                row_diff += keep0 != keep;
                            }
                        } else {
                            bad_seq += kv[i] != qkv[qkv_at(&s, b, j - P, h, 1 + k, d)];
                        }
                    }
    TEST_CHECK(tc, NAME("prefix_kv_prefix_kept_%s", tag), bad_keep == 0,
               "%zu of %zu kept prefix elements off (max rel err %.3g)", bad_keep, pre - dropped, max_rel);
    TEST_CHECK(tc, NAME("prefix_kv_prefix_dropped_zero_%s", tag), bad_drop == 0 && (p > 0 || dropped == 0),
               "%zu dropped elements not 0 (%zu dropped)", bad_drop, dropped);
    TEST_CHECK(tc, NAME("prefix_kv_sequence_rows_%s", tag), bad_seq == 0, "%zu sequence elements differ from qkv's k|v", bad_seq);
    if (p > 0 && pre >= 20000) {
        double f = (double)dropped / pre;
        TEST_CHECK(tc, NAME("prefix_kv_drop_fraction_%s", tag), fabs(f - p) < 0.015, "dropped %.4f of %zu, p %g", f, pre, p);
    }
    if (p > 0 && B > 1 && P > 0)
        TEST_CHECK(tc, NAME("prefix_kv_mask_per_batch_row_%s", tag), row_diff > 0, "every batch row has row 0's mask");
    if (p > 0 && P > 0) { /* the mask is mask_scale's over the kv-shaped expanded prefix */
        float *e = malloc(sizeof(float) * nkv), *m = malloc(sizeof(float) * nkv);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < PT; j++)
                for (int h = 0; h < NH; h++)
                    for (int k = 0; k < 2; k++)
                        for (int d = 0; d < HD; d++)
                            e[kv_at(&s, b, j, h, k, d)] = j < P ? pkv[pkv_at(&s, j, 2 * s.layer + k, h, d)] : 0.0f;
        cpu_mask_scale(m, e, nkv, 1.0f, p, seed);
        size_t diff = 0;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < P; j++)
                for (size_t c = 0; c < 2 * H; c++) diff += kv[((size_t)b * PT + j) * 2 * H + c] != m[((size_t)b * PT + j) * 2 * H + c];
        TEST_CHECK(tc, NAME("prefix_kv_equals_mask_scale_%s", tag), diff == 0, "%zu prefix elements differ from mask_scale", diff);
        /* another seed draws another mask */
        float *kv2 = malloc(sizeof(float) * nkv);
        cpu_prefix_kv(kv2, qkv, pkv, s.layer, s.L, B, T, P, NH, HD, p, seed + 1);
        size_t zd = 0;
        for (size_t i = 0; i < nkv; i++) zd += (kv[i] == 0.0f) != (kv2[i] == 0.0f);
        TEST_CHECK(tc, NAME("prefix_kv_seed_changes_mask_%s", tag), zd > 0, "seed+1 gave the same mask");
        free(e); free(m); free(kv2);
    }

    /* ---- backward: dqkv's k|v slots =, q slots untouched; dpkv += sum over b */
    float *dkv = randn(rng, nkv, 1.0f), *dqkv0 = randn(rng, nqkv, 1.0f), *dpkv0 = randn(rng, npkv, 0.1f);
    float *dqkv = fdup(dqkv0, nqkv), *dpkv = fdup(dpkv0, npkv);
    for (int b = 0; b < B; b++) /* poison the slots that must be written */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int k = 1; k < 3; k++)
                    for (int d = 0; d < HD; d++) dqkv[qkv_at(&s, b, t, h, k, d)] = NAN;
    float *dqkv_poisoned = fdup(dqkv, nqkv);
    cpu_prefix_kv_bwd(dqkv, dpkv, dkv, s.layer, s.L, B, T, P, NH, HD, p, seed);
    size_t bad_q = 0, bad_kv = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HD; d++) {
                    size_t iq = qkv_at(&s, b, t, h, 0, d);
                    bad_q += memcmp(&dqkv[iq], &dqkv0[iq], sizeof(float)) != 0;
                    for (int k = 0; k < 2; k++) bad_kv += dqkv[qkv_at(&s, b, t, h, 1 + k, d)] != dkv[kv_at(&s, b, P + t, h, k, d)];
                }
    TEST_CHECK(tc, NAME("prefix_kv_bwd_q_slots_untouched_%s", tag), bad_q == 0, "%zu q elements changed", bad_q);
    TEST_CHECK(tc, NAME("prefix_kv_bwd_sequence_dkv_%s", tag), bad_kv == 0, "%zu k|v elements differ from dkv", bad_kv);
    double *sum = calloc(npkv ? npkv : 1, sizeof(double)); /* reference sum over b, double */
    for (int j = 0; j < P; j++)
        for (int h = 0; h < NH; h++)
            for (int k = 0; k < 2; k++)
                for (int d = 0; d < HD; d++)
                    for (int b = 0; b < B; b++) {
                        size_t i = kv_at(&s, b, j, h, k, d);
                        if (p == 0 || glm_mask_keep(seed, i, th)) sum[pkv_at(&s, j, 2 * s.layer + k, h, d)] += dkv[i] * inv;
                    }
    size_t other = 0;
    double err = 0, mag = 0;
    for (int j = 0; j < P; j++)
        for (int slot = 0; slot < 2 * s.L; slot++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HD; d++) {
                    size_t i = pkv_at(&s, j, slot, h, d);
                    if (slot / 2 != s.layer) { other += memcmp(&dpkv[i], &dpkv0[i], sizeof(float)) != 0; continue; }
                    double ref = dpkv0[i] + sum[i], e = fabs(dpkv[i] - ref);
                    if (!(e <= err)) err = e;
                    if (fabs(ref) > mag) mag = fabs(ref);
                }
    double tol = 4e-7 * (B + 1) * (mag > 1 ? mag : 1);
    TEST_CHECK(tc, NAME("prefix_kv_bwd_dpkv_sum_over_batch_%s", tag), err <= tol, "max abs err %.3g > %.3g", err, tol);
    TEST_CHECK(tc, NAME("prefix_kv_bwd_other_layers_untouched_%s", tag), other == 0, "%zu elements of other layers changed", other);
    /* accumulation: a second call adds the sum again */
    cpu_prefix_kv_bwd(dqkv, dpkv, dkv, s.layer, s.L, B, T, P, NH, HD, p, seed);
    err = 0;
    for (size_t i = 0; i < npkv; i++) {
        double e = fabs(dpkv[i] - (dpkv0[i] + 2 * sum[i]));
        if (!(e <= err)) err = e;
    }
    TEST_CHECK(tc, NAME("prefix_kv_bwd_accumulates_%s", tag), err <= 2 * tol, "max abs err %.3g > %.3g", err, 2 * tol);
    /* thread count independence: 1 thread and 2 threads, bit for bit */
    float *a1 = fdup(dqkv_poisoned, nqkv), *p1 = fdup(dpkv0, npkv), *a2 = fdup(dqkv_poisoned, nqkv), *p2 = fdup(dpkv0, npkv);
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu_prefix_kv_bwd(a1, p1, dkv, s.layer, s.L, B, T, P, NH, HD, p, seed);
    omp_set_num_threads(nt > 1 ? nt : 2);
    cpu_prefix_kv_bwd(a2, p2, dkv, s.layer, s.L, B, T, P, NH, HD, p, seed);
    omp_set_num_threads(nt);
    TEST_CHECK(tc, NAME("prefix_kv_bwd_deterministic_%s", tag),
               memcmp(a1, a2, sizeof(float) * nqkv) == 0 && memcmp(p1, p2, sizeof(float) * npkv) == 0,
               "results depend on the thread count");

    /* ---- adjoint (dot-product) test: <prefix_kv(qkv, pkv), g> == <qkv, dqkv(g)> + <pkv, dpkv(g)> */
    float *zq = calloc(nqkv ? nqkv : 1, sizeof(float)), *zp = calloc(npkv ? npkv : 1, sizeof(float));
    cpu_prefix_kv_bwd(zq, zp, dkv, s.layer, s.L, B, T, P, NH, HD, p, seed);
    double lhs = 0, rhs = 0, scale = 0;
    for (size_t i = 0; i < nkv; i++) { lhs += (double)kv[i] * dkv[i]; scale += fabs((double)kv[i] * dkv[i]); }
    for (size_t i = 0; i < nqkv; i++) rhs += (double)qkv[i] * zq[i];
    for (size_t i = 0; i < npkv; i++) rhs += (double)pkv[i] * zp[i];
    TEST_CHECK(tc, NAME("prefix_kv_adjoint_%s", tag), fabs(lhs - rhs) <= 1e-6 * scale + 1e-12,
               "<Fx,g> %.9g vs <x,F'g> %.9g", lhs, rhs);
    printf("  %s: %zu of %zu prefix elements dropped; adjoint %.9g vs %.9g\n", tag, dropped, pre, lhs, rhs);

    void *hs[] = {qkv, pkv, kv, dkv, dqkv0, dpkv0, dqkv, dpkv, dqkv_poisoned, sum, a1, p1, a2, p2, zq, zp};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

static void t_tanh(test_counts *tc, glm_rng *rng, size_t n) {
    char name[96];
    float *x = randn(rng, n, 3.0f), *out = malloc(sizeof(float) * n), *g = randn(rng, n, 1.0f), *dx = fdup(g, n);
    x[0] = 0.0f; x[1] = 30.0f; x[2] = -30.0f; x[3] = 1e-20f;
    cpu_tanh_fwd(out, x, n);
    double ef = 0;
    for (size_t i = 0; i < n; i++) {
        double r = tanh((double)x[i]), e = fabs(out[i] - r) / (fabs(r) > 1e-30 ? fabs(r) : 1e-30);
        if (!(e <= ef)) ef = e;
    }
    TEST_CHECK(tc, NAME("tanh_fwd_vs_double_%zu", n), ef <= 2.5e-7, "max rel err %.3g", ef);
    cpu_tanh_bwd(dx, out, dx, n); /* dx aliasing dout */
    double eb = 0, mg = 0;
    for (size_t i = 0; i < n; i++) {
        double r = (double)g[i] * (1.0 - (double)out[i] * out[i]);
        if (!(fabs(dx[i] - r) <= eb)) eb = fabs(dx[i] - r);
        if (fabs(g[i]) > mg) mg = fabs(g[i]);
    }
    TEST_CHECK(tc, NAME("tanh_bwd_vs_double_%zu", n), eb <= 2e-7 * mg, "max abs err %.3g (|dout| up to %.3g)", eb, mg);
    /* tanh_bwd is the derivative of tanh_fwd: central differences in double at a few points */
    double efd = 0;
    for (int i = 4; i < 40 && (size_t)i < n; i++) {
        double h = 1e-3, a = x[i], fd = (tanh(a + h) - tanh(a - h)) / (2 * h);
        float o = out[i], one = 1.0f, d;
        cpu_tanh_bwd(&d, &o, &one, 1);
        if (fabs(d - fd) > efd) efd = fabs(d - fd);
    }
    TEST_CHECK(tc, NAME("tanh_bwd_is_derivative_%zu", n), efd < 1e-6, "max |analytic - central difference| %.3g", efd);
    printf("  tanh max errors: forward rel %.3g, backward abs %.3g\n", ef, eb);
    free(x); free(out); free(g); free(dx);
}

/* The op table of the CPU backend carries the ops (the model calls them through it). */
static void t_backend_table(test_counts *tc) {
    glm_backend *be = glm_backend_cpu();
    TEST_CHECK(tc, "prefix_ops_in_cpu_backend", be->prefix_kv && be->prefix_kv_bwd && be->tanh_fwd && be->tanh_bwd,
               "an op is NULL");
    shape s = {2, 3, 2, 2, 4, 2, 1};
    size_t H = 8, nkv = 2 * 5 * 2 * H, nqkv = 2 * 3 * 3 * H, npkv = 2 * 4 * H;
    glm_rng r;
    glm_rng_seed(&r, 7);
    float *qkv = randn(&r, nqkv, 1.0f), *pkv = randn(&r, npkv, 1.0f), *a = malloc(sizeof(float) * nkv), *b = malloc(sizeof(float) * nkv);
    cpu_prefix_kv(a, qkv, pkv, s.layer, s.L, s.B, s.T, s.P, s.NH, s.HD, 0.2f, 99);
    be->prefix_kv(be, b, qkv, pkv, s.layer, s.L, s.B, s.T, s.P, s.NH, s.HD, 0.2f, 99);
    TEST_CHECK(tc, "prefix_kv_through_backend", memcmp(a, b, sizeof(float) * nkv) == 0, "differs from cpu_prefix_kv");
    free(qkv); free(pkv); free(a); free(b);
    be->destroy(be);
}

int main(void) {
    test_counts tc = {0};
    glm_rng rng;
    glm_rng_seed(&rng, 20240516);
    shape shapes[] = {
        {2, 7, 3, 2, 8, 3, 1},    /* small; the middle layer of 3 */
        {3, 5, 16, 4, 64, 2, 1},  /* 24576 prefix elements: the drop fraction is measurable */
        {3, 130, 16, 4, 64, 4, 0},
        {2, 4, 0, 2, 6, 2, 1},    /* no prefix: a plain copy */
        {1, 1, 5, 1, 5, 1, 0},    /* B 1, odd head size */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        t_shape(&tc, shapes[i], 0.1f, 0x5eed0000ULL + i, &rng);
        t_shape(&tc, shapes[i], 0.0f, 0x5eed0000ULL + i, &rng);
    }
    t_shape(&tc, shapes[1], 0.5f, 77, &rng);
    t_tanh(&tc, &rng, 10007);
    t_backend_table(&tc);
    printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
    TEST_EXIT(&tc);
}
