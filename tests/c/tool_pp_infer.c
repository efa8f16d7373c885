/* Generation across devices against the whole model, on real devices (bench/bench_pp.sh runs it
 * on 2 GPUs; tests/c/test_pipe_infer.c covers the CPU in `make test`):
 *
 *   tool_pp_infer [--pp P] [--device cuda|cpu] [--dtype f32|bf16] [--map auto|thudm|FILE] [--steps N]
 *
 * Builds a small random GLM (8 layers, hidden 512, ChatGLM's vocabulary and ids), saves it, then
 * runs a 2-row prompt and N greedy decoding steps through the whole model on the first device
 * and through glm_pipe_lm split over P devices (one stage per GPU), growing the cache on the way.
 * Prints PASS/FAIL lines: the greedy tokens agree and the logits match (bit for bit in fp32). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/glm.h"
#include "parallel/pipe/pipe_infer.h"

static float max_abs(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) { float d = fabsf(a[i] - b[i]); if (d > m || d != d) m = d; }
    return m;
}

static int argmax(const float *x, int n) {
    int k = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[k]) k = i;
    return k;
}

int main(int argc, char **argv) {
    int P = 2, steps = 24;
    const char *device = "cuda", *map = "auto", *dts = "f32";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--pp")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--map")) map = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype")) dts = argv[i + 1];
    }
    glm_dtype dt = strcmp(dts, "bf16") == 0 ? GLM_BF16 : GLM_F32;
    glm_config c = glm_config_chatglm6b();
    c.num_layers = 8; c.hidden_size = 512; c.num_attention_heads = 8; c.inner_hidden_size = 2048;
    glm_err err = {0};
    glm_backend *be = NULL;
#ifdef GLM_HAVE_CUDA
    char msg[512] = "";
    if (!strcmp(device, "cuda")) be = glm_backend_cuda(0, dt, msg, sizeof msg);
    if (!strcmp(device, "cuda") && !be) { printf("SKIP pipe_infer_gpu: %s\n", msg); return 0; }
#endif
    if (!be) { be = glm_backend_cpu(); dt = GLM_F32; device = "cpu"; }
    glm_model m;
    glm_model_init_inference(&m, &c, be);
    glm_model_init_random(&m, 3, 0.05f);
    char dir[] = "/tmp/glm_pp_infer.XXXXXX";
    if (!mkdtemp(dir) || glm_model_save(&m, dir, 0 /* F32 */, 0, &err)) { glm_err_print(&err); return 1; }
    glm_pipe_lm lm;
    if (glm_pipe_lm_open(&lm, NULL, dir, NULL, NULL, map, P, device, dt, &err)) { glm_err_print(&err); return 1; }
    /* the whole model reads the same file (random init on the CPU and on a GPU differ in dtype) */
    if (glm_model_load(&m, dir, &err)) { glm_err_print(&err); return 1; }

    int B = 2, T0 = 9, V = c.vocab_size, cap = T0 + 4; /* small capacity: decoding must grow it */
    glm_kvcache kv;
    glm_kvcache_init(&m, &kv, B, T0 + steps + 1);
    glm_pipe_cache pc;
    glm_pipe_cache_init(&lm, &pc, B, cap);
    int32_t ids[2 * 9], pos[2 * 9], bp[2 * 9], lo[2 * 9], hi[2 * 9];
    for (int b = 0; b < B; b++)
        for (int j = 0; j < T0; j++) {
            int k = b * T0 + j, ctx = T0 - 1; /* text, [gMASK] at T0-2, <sop> at T0-1 */
            ids[k] = j == T0 - 2 ? c.gmask_token_id : j == T0 - 1 ? c.bos_token_id : 20000 + 977 * b + 131 * j;
            pos[k] = j < ctx ? j : T0 - 2;
            bp[k] = j < ctx ? 0 : 1;
            lo[k] = 0;
            hi[k] = j < ctx ? ctx : j + 1;
        }
    float *la = malloc(sizeof(float) * B * V), *lb = malloc(sizeof(float) * B * V);
    int rc = glm_forward_cached(&m, &kv, T0, ids, pos, bp, lo, hi, NULL, la, &err);
    if (!rc) rc = glm_pipe_forward_cached(&lm, &pc, T0, ids, pos, bp, lo, hi, NULL, lb, &err);
    float worst = rc ? INFINITY : max_abs(la, lb, (size_t)B * V);
    int agree = 1;
    for (int s = 0; s < steps && rc == 0; s++) {
        for (int b = 0; b < B; b++) {
            int ta = argmax(la + (size_t)b * V, V), tb = argmax(lb + (size_t)b * V, V);
            agree &= ta == tb;
            ids[b] = ta; pos[b] = T0 - 2; bp[b] = 2 + s; lo[b] = 0; hi[b] = T0 + s + 1;
        }
        if (kv.len + 1 > pc.Tmax) glm_pipe_cache_grow(&lm, &pc, pc.Tmax * 2);
        rc = glm_forward_cached(&m, &kv, 1, ids, pos, bp, lo, hi, NULL, la, &err);
        if (!rc) rc = glm_pipe_forward_cached(&lm, &pc, 1, ids, pos, bp, lo, hi, NULL, lb, &err);
        if (!rc) { float d = max_abs(la, lb, (size_t)B * V); if (d > worst || d != d) worst = d; }
    }
    if (rc) glm_err_print(&err);
    double tol = dt == GLM_F32 ? 0 : 1e-2;
    printf("%s pipe_infer_%s_%s_p%d_greedy_tokens_agree\n", rc == 0 && agree ? "PASS" : "FAIL", device, dts, P);
    printf("%s pipe_infer_%s_%s_p%d_logits_match: max |diff| %.3g over %d steps (tolerance %.3g)\n",
           rc == 0 && worst <= tol ? "PASS" : "FAIL", device, dts, P, worst, steps + 1, tol);
    glm_pipe_cache_free(&lm, &pc);
    glm_pipe_lm_free(&lm);
    glm_kvcache_free(&m, &kv);
    glm_model_free(&m);
    be->destroy(be);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    free(la); free(lb);
    return rc == 0 && agree && worst <= tol ? 0 : 1;
}
