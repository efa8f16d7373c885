/* The 8-bit states' encoder of the CPU op (cpu_q8_encode_n, AVX2 lanes where the build has them)
 * against the scalar text of backend/quant8.h (glm_q8_encode, which tests/py/test_adam8.py
 * checks against bitsandbytes' code), code for code, on the values where a search can go
 * wrong: every map value, the float32 midpoints between neighbours and the floats either side,
 * +-0, values beyond the map's ends, NaN (a block whose absmax is 0), subnormals, random values,
 * the ends, middle and random floats of every range of the threshold tables (all 65536 patterns
 * of the top 16 bits); both maps, and lengths that leave a scalar tail. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_adam8.h"
#include "backend/quant8.h"
#include "core/rng.h"
#include "test.h"

static size_t check(const float *code, int kind, const float *x, float amax, size_t n) {
    uint8_t *got = malloc(n ? n : 1);
    cpu_q8_encode_n(got, code, kind, x, amax, n);
    size_t bad = 0;
    for (size_t j = 0; j < n; j++) bad += got[j] != glm_q8_encode(code, kind, x[j], amax);
    free(got);
    return bad;
}

int main(void) {
    test_counts tc = {0};
    glm_rng rng;
    glm_rng_seed(&rng, 11);
    for (int kind = 0; kind < 2; kind++) {
        const float *code = glm_q8_map(kind);
        const char *kn = kind == GLM_Q8_SIGNED ? "signed" : "unsigned";
        size_t cap = 256 * 8 + 64, n = 0;
        float *x = malloc(sizeof(float) * cap);
        for (int c = 0; c < 256; c++) {
            float a = code[c], b = c < 255 ? code[c + 1] : 1.0f, mid = (a + b) * 0.5f;
            x[n++] = a; x[n++] = -a; x[n++] = mid; x[n++] = -mid;
            x[n++] = nextafterf(mid, INFINITY); x[n++] = nextafterf(mid, -INFINITY);
            x[n++] = nextafterf(a, INFINITY); x[n++] = nextafterf(a, -INFINITY);
        }
        float extra[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.5f, -1.5f, 1e-40f, -1e-40f, 1e-30f, -1e-30f, NAN};
        for (size_t i = 0; i < sizeof extra / sizeof *extra; i++) x[n++] = extra[i];
        char name[96];
        snprintf(name, sizeof name, "q8_encode_lanes_edges_%s", kn);
        size_t bad = check(code, kind, x, 1.0f, n);
        TEST_CHECK(&tc, name, bad == 0, "%zu of %zu codes differ from the scalar encoder", bad, n);
        /* the same values at another absmax (x is divided by it), and lengths 1..17 (tails) */
        for (size_t j = 0; j < n; j++) x[j] *= 0.37f;
        snprintf(name, sizeof name, "q8_encode_lanes_scaled_%s", kn);
        bad = check(code, kind, x, 0.37f, n);
        for (size_t len = 1; len <= 17; len++) bad += check(code, kind, x + 3 * len, 0.37f, len);
        TEST_CHECK(&tc, name, bad == 0, "%zu codes differ", bad);
        /* a fresh block: absmax 0 makes every x = value / 0 (NaN for 0, +-inf otherwise) */
        float z[9] = {0.0f, -0.0f, 1e-3f, -1e-3f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        snprintf(name, sizeof name, "q8_encode_lanes_zero_absmax_%s", kn);
        bad = check(code, kind, z, 0.0f, 9);
        TEST_CHECK(&tc, name, bad == 0, "%zu codes differ", bad);
        free(x);
        /* random moments as the op sees them: normal values and their block's absmax */
        size_t R = 1 << 16;
        float *r = malloc(sizeof(float) * R), amax = 0.0f;
        for (size_t j = 0; j < R; j++) {
            r[j] = glm_rng_normal(&rng) * (kind == GLM_Q8_SIGNED ? 1e-3f : 1e-7f);
            if (kind == GLM_Q8_UNSIGNED) r[j] = r[j] * r[j] * 1e7f;
            if (fabsf(r[j]) > amax) amax = fabsf(r[j]);
        }
        snprintf(name, sizeof name, "q8_encode_lanes_random_%s", kn);
        bad = check(code, kind, r, amax, R);
        TEST_CHECK(&tc, name, bad == 0, "%zu of %zu codes differ", bad, R);
        free(r);
        /* every range of floats sharing their top 16 bits (the tables' ranges): both ends, the
         * middle and random floats inside, NaN and inf patterns included, at absmax 1 */
        size_t S = (size_t)65536 * 8, k = 0;
        float *sw = malloc(sizeof(float) * S);
        for (uint32_t top = 0; top < 65536; top++) {
            uint32_t lows[8] = {0, 1, 0x7fff, 0x8000, 0xfffe, 0xffff, (uint32_t)glm_rng_below(&rng, 65536),
                                (uint32_t)glm_rng_below(&rng, 65536)};
            for (int e = 0; e < 8; e++) {
                uint32_t b = top << 16 | lows[e];
                memcpy(&sw[k++], &b, 4);
            }
        }
        snprintf(name, sizeof name, "q8_encode_every_table_range_%s", kn);
        bad = check(code, kind, sw, 1.0f, S);
        TEST_CHECK(&tc, name, bad == 0, "%zu of %zu codes differ", bad, S);
        free(sw);
    }
#ifdef __AVX2__
    /* the tables must pass their own checks, or the sweep above tested only the search */
    TEST_CHECK(&tc, "q8_encode_tables_in_use", cpu_q8_encode_tables_ok(), "a table check failed: the lanes search instead");
#endif
    TEST_EXIT(&tc);
}
