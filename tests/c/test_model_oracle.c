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

int main(void) {
    test_counts tc = {0};
    test_glm_model(&tc);
    test_layer_norm(&tc);
    test_linear(&tc);
    TEST_EXIT(&tc);
}
