/* The C model against outputs of the ORIGINAL THUDM modeling_chatglm.py (chatglm.cpp's test
 * data, ../shared/oracles/chatglm-cpp): a 1-layer model, a 3-token prompt, then two decode
 * steps through the KV cache. Also the LayerNorm and Linear vectors. */
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/fileutil.h"
#include "model/glm.h"
#include "oracle.h"
#include "test.h"

static void test_glm_model(test_counts *tc) {
    glm_backend *be = glm_backend_cpu();
    double e[3];
    int rc = oracle_glm_model(be, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, "oracle_glm_model", "%s/oracles/chatglm-cpp/glm_model.data not found", oracle_dir()); return; }
    TEST_CHECK(tc, "oracle_glm_prompt", rc == 0 && e[0] < 1e-5, "max abs err %.3g (limit 1e-5)", e[0]);
    TEST_CHECK(tc, "oracle_glm_decode_step1", rc == 0 && e[1] < 1e-5, "max abs err %.3g (limit 1e-5)", e[1]);
    TEST_CHECK(tc, "oracle_glm_decode_step2", rc == 0 && e[2] < 1e-5, "max abs err %.3g (limit 1e-5)", e[2]);
    printf("  oracle max abs errors: prompt %.3g, step1 %.3g, step2 %.3g\n", e[0], e[1], e[2]);
}

static void test_glm_ptuning(test_counts *tc) {
    glm_backend *be = glm_backend_cpu();
    double e[3];
    int rc = oracle_glm_ptuning(be, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, "oracle_ptuning", "%s/oracles/chatglm-cpp/glm_ptuning_v2_model.data not found", oracle_dir()); return; }
    TEST_CHECK(tc, "oracle_ptuning_prompt", rc == 0 && e[0] < 1e-5, "max abs err %.3g (limit 1e-5)", e[0]);
    TEST_CHECK(tc, "oracle_ptuning_decode_step1", rc == 0 && e[1] < 1e-5, "max abs err %.3g (limit 1e-5)", e[1]);
    TEST_CHECK(tc, "oracle_ptuning_decode_step2", rc == 0 && e[2] < 1e-5, "max abs err %.3g (limit 1e-5)", e[2]);
    printf("  ptuning oracle max abs errors: prompt %.3g, step1 %.3g, step2 %.3g\n", e[0], e[1], e[2]);
}

static void test_layer_norm(test_counts *tc) {
    size_t n;
    float *d = oracle_load("layer_norm.data", &n);
    if (!d) { TEST_SKIP(tc, "oracle_layer_norm", "layer_norm.data not found"); return; }
    const float *w = d, *b = d + 64, *x = d + 128, *ref = d + 128 + 192;
    float out[192], mean[3], rstd[3];
    cpu_layernorm_fwd(out, mean, rstd, x, w, b, 3, 64, 1e-5f);
    double e = test_max_abs(out, ref, 192);
    TEST_CHECK(tc, "oracle_layer_norm", e < 1e-5, "max abs err %.3g", e);
    free(d);
}

static void test_linear(test_counts *tc) {
    size_t n;
    float *d = oracle_load("linear.data", &n);
    if (!d) { TEST_SKIP(tc, "oracle_linear", "linear.data not found"); return; }
    const float *w = d, *b = d + 32 * 64, *x = b + 32, *y = x + 2 * 64, *vx = y + 2 * 32, *vy = vx + 64;
    float out[64];
    cpu_matmul_fwd(out, x, w, b, 2, 64, 32);
    double e = test_max_abs(out, y, 64);
    cpu_matmul_fwd(out, vx, w, b, 1, 64, 32);
    double e2 = test_max_abs(out, vy, 32);
    TEST_CHECK(tc, "oracle_linear", e < 1e-5 && e2 < 1e-5, "max abs err %.3g / %.3g", e, e2);
    free(d);
}

/* GELU (tanh form, as ChatGLM) and its derivative on a dense grid of [-12, 12] against double
 * precision: the CPU computes tanh from plain arithmetic (backend/cpu/cpu_ops.c), not libm. */
static void test_gelu(test_counts *tc) {
    enum { N = 240001 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *dy = malloc(sizeof(float) * N);
    float *one = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) { x[i] = -12.0f + 1e-4f * (float)i; one[i] = 1.0f; }
    cpu_gelu_fwd(y, x, N);
    cpu_gelu_bwd(dy, x, one, N);
    double ef = 0, eb = 0;
    const double c = 0.7978845608028654;
    for (int i = 0; i < N; i++) {
        double a = x[i], u = c * a * (1 + 0.044715 * a * a), t = tanh(u);
        double f = 0.5 * a * (1 + t), g = 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * c * (1 + 3 * 0.044715 * a * a);
        /* relative above 1, absolute below: in the negative tail 1 + tanh cancels, for libm too */
        double e1 = fabs(y[i] - f) / (fabs(f) > 1 ? fabs(f) : 1), e2 = fabs(dy[i] - g) / (fabs(g) > 1 ? fabs(g) : 1);
        if (e1 > ef) ef = e1;
        if (e2 > eb) eb = e2;
    }
    free(x); free(y); free(dy); free(one);
    /* libm's tanhf gives 1.3e-7 and 5.6e-7 here */
    TEST_CHECK(tc, "cpu_gelu_fwd_vs_double", ef < 3e-7, "max err %.3g (limit 3e-7)", ef);
    TEST_CHECK(tc, "cpu_gelu_bwd_vs_double", eb < 1.5e-6, "max err %.3g (limit 1.5e-6)", eb);
    printf("  gelu max rel errors: forward %.3g, backward %.3g\n", ef, eb);
}

int main(void) {
    test_counts tc = {0};
    test_gelu(&tc);
    test_glm_model(&tc);
    test_glm_ptuning(&tc);
    test_layer_norm(&tc);
    test_linear(&tc);
    TEST_EXIT(&tc);
}
