/* make bench-cpu: forward+backward (+ AdamW) tokens/s of a small GLM on the CPU backend
 * (hidden 256, 4 layers, 8 heads, MLP 1024, vocab 8192, batch 4 x seq 128, half prompt /
 * half answer), so later changes to the CPU kernels can be compared.
 *   tool_bench_cpu [ITERS] [freeze N]   (freeze: the last N layers train, LLaMA-Factory's mode) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/glm.h"
#include "optim/adamw.h"

int main(int argc, char **argv) {
    int B = 4, T = 128, iters = argc > 1 ? atoi(argv[1]) : 10;
    glm_config c = glm_config_chatglm6b();
    c.vocab_size = 8192; c.hidden_size = 256; c.num_layers = 4; c.num_attention_heads = 8; c.inner_hidden_size = 1024;
    c.bos_token_id = 8004; c.eos_token_id = 8005; c.mask_token_id = 8000; c.gmask_token_id = 8001; c.pad_token_id = 3;
    c.tie_word_embeddings = 0;
    if (argc > 3 && strcmp(argv[2], "freeze") == 0) c.peft = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = atoi(argv[3])};
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    glm_model_init_random(&m, 1, 0.02f);
    glm_adamw opt;
    glm_adamw_init(&opt, &m, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f);
    glm_batch b;
    glm_batch_alloc(&b, B, T);
    glm_rng rng;
    glm_rng_seed(&rng, 2);
    int32_t ids[128], lab[128];
    for (int r = 0; r < B; r++) {
        for (int i = 0; i < T; i++) ids[i] = 10 + (int)glm_rng_below(&rng, 7000);
        ids[T / 2 - 2] = c.gmask_token_id; ids[T / 2 - 1] = c.bos_token_id; ids[T - 1] = c.eos_token_id;
        for (int i = 0; i < T; i++) lab[i] = i < T / 2 - 1 ? -100 : ids[i];
        glm_batch_set_row(&b, r, ids, lab, T, c.pad_token_id, c.gmask_token_id, c.mask_token_id, c.bos_token_id);
    }
    glm_batch_count_targets(&b);
    double fb = 0, t_opt = 0;
    for (int it = 0; it <= iters; it++) { /* iteration 0 warms up */
        double t0 = glm_now();
        glm_zero_grads(&m);
        glm_forward_backward(&m, &b, 1.0f / b.n_targets);
        double t1 = glm_now();
        glm_adamw_step(&opt, &m, 1e-4f, 1.0f);
        double t2 = glm_now();
        if (it) { fb += t1 - t0; t_opt += t2 - t1; }
    }
    double tok = (double)B * T * iters;
    double flops = 6.0 * m.tab.n_params + 12.0 * c.num_layers * c.hidden_size * T;
    printf("bench-cpu: hidden %d, %d layers, batch %d x %d, %d threads, %.2fM params\n", c.hidden_size, c.num_layers, B, T,
           omp_get_max_threads(), m.tab.n_params / 1e6);
    printf("  forward+backward: %.0f tokens/s (%.1f ms/step, %.1f GFLOP/s)\n", tok / fb, 1e3 * fb / iters, tok / fb * flops / 1e9);
    printf("  with AdamW:       %.0f tokens/s (optimizer %.1f ms/step)\n", tok / (fb + t_opt), 1e3 * t_opt / iters);
    glm_batch_free(&b);
    glm_adamw_free(&opt, &m);
    glm_model_free(&m);
    be->destroy(be);
    return 0;
}
