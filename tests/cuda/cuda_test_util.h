/* Helpers shared by the CUDA tests: random host data rounded to the storage dtype (so the CPU
 * twin and the GPU see identical inputs), device copies, NaN poisoning of outputs (an element
 * the kernel never writes shows up as NaN), and the compare-and-report step. */
#ifndef GLM_CUDA_TEST_UTIL_H
#define GLM_CUDA_TEST_UTIL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/half.h"
#include "core/rng.h"
#include "test.h"

static inline const char *dt_name(glm_dtype d) { return d == GLM_F32 ? "f32" : d == GLM_BF16 ? "bf16" : "f16"; }

static inline float round_one(glm_dtype dt, float x) {
    if (dt == GLM_BF16) return glm_bf16_to_f32(glm_f32_to_bf16(x));
    if (dt == GLM_F16) return glm_f16_to_f32(glm_f32_to_f16(x));
    return x;
}
static inline void round_dt(glm_dtype dt, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = round_one(dt, x[i]);
}
/* n normal values times scale, already representable in dt */
static inline float *rnd(glm_rng *r, glm_dtype dt, size_t n, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = round_one(dt, scale * glm_rng_normal(r));
    return x;
}
static inline float *fcopy(const float *x, size_t n) {
    float *y = malloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}
static inline void *up_s(glm_backend *be, const float *h, size_t n) {
    void *d = be->alloc(be, n * glm_dtype_size(be->dtype));
    be->upload_f32(be, d, h, n);
    return d;
}
static inline void *up_raw(glm_backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(be, bytes);
    be->upload(be, d, h, bytes);
    return d;
}
static inline float *down_s(glm_backend *be, const void *d, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    be->download_f32(be, h, d, n);
    return h;
}
static inline float *down_f(glm_backend *be, const void *d, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    be->download(be, h, d, n * sizeof(float));
    return h;
}
/* Fills n S elements (f = 0) or n floats (f = 1) with NaN. */
static inline void poison(glm_backend *be, void *d, size_t n, int f) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    if (f) be->upload(be, d, h, n * sizeof(float));
    else be->upload_f32(be, d, h, n);
    free(h);
}

/* ||a-b|| / ||b|| (NaN -> inf): the per-tensor measure for long chains of bf16 arithmetic */
static inline double norm_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (d != d) return INFINITY;
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Records PASS/FAIL "<what>" for max|a-b|/max|b| <= tol and prints the error for the record. */
static inline double check_close(test_counts *tc, const char *what, const float *got, const float *ref, size_t n, double tol) {
    double e = test_rel_err(got, ref, (long)n);
    TEST_CHECK(tc, what, e <= tol, "max rel err %.3g > tol %.3g (n=%zu)", e, tol, n);
    printf("  err %-48s %.3g (tol %.3g)\n", what, e, tol);
    return e;
}
#endif
