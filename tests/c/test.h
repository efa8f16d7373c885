/* A tiny test harness. Every test binary prints one line per check:
 *   PASS <name>        FAIL <name>: <why>        SKIP <name>: <why>
 * tests/run.sh counts those lines over all binaries and scripts and prints the closing
 * "N passed, N failed, N skipped". A binary that crashes counts as one failure. */
#ifndef GLM_TEST_H
#define GLM_TEST_H
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct { int pass, fail, skip; } test_counts;

#define TEST_PASS(tc, name) do { printf("PASS %s\n", name); (tc)->pass++; } while (0)
#define TEST_SKIP(tc, name, ...) do { printf("SKIP %s: ", name); printf(__VA_ARGS__); printf("\n"); (tc)->skip++; } while (0)
#define TEST_FAIL(tc, name, ...) do { printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); (tc)->fail++; } while (0)
/* Records PASS or FAIL with the formatted reason. */
#define TEST_CHECK(tc, name, cond, ...) do { if (cond) TEST_PASS(tc, name); else TEST_FAIL(tc, name, __VA_ARGS__); } while (0)
#define TEST_EXIT(tc) do { fflush(stdout); return (tc)->fail ? 1 : 0; } while (0)

/* max |a-b| / max |b| (b is the reference); 0 when both are all zeros. */
static inline double test_rel_err(const float *a, const float *b, long n) {
    double md = 0, mb = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || d != d) md = d != d ? INFINITY : d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}
static inline double test_max_abs(const float *a, const float *b, long n) {
    double md = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || d != d) md = d != d ? INFINITY : d;
    }
    return md;
}
#endif
