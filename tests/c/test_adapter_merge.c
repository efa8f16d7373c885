/* `glmtrain merge` (model/adapter.c glm_adapter_merge) on a ChatGLM2-block model whose
 * dense_h_to_4h is wider than its other modules (2 x ffn_hidden_size = 80 rows, against 48 for
 * query_key_value's and 16 for dense's): every merged weight equals W + s B A computed here, and
 * with DoRA (m / ||W + s B A||_row) (W + s B A). The scratch for B once took the widest of ffn
 * and 3 x hidden, short of the gate|up rows: under `make test-asan` that overflow fails here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cpu/cpu_ops.h"
#include "core/fileutil.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/config.h"
#include "model/glm.h"
#include "test.h"

static glm_config wide_mlp_config(void) {
    glm_config c;
    glm_err err;
    int rc = glm_config_parse(&c, "{\"model_type\": \"chatglm\", \"add_qkv_bias\": true, \"ffn_hidden_size\": 40, "
                                  "\"hidden_size\": 16, \"kv_channels\": 4, \"multi_query_attention\": true, "
                                  "\"multi_query_group_num\": 2, \"num_attention_heads\": 4, \"num_layers\": 2, "
                                  "\"padded_vocab_size\": 24, \"rmsnorm\": true, \"seq_length\": 64, "
                                  "\"eos_token_id\": 22, \"pad_token_id\": 3}",
                              "config.json", &err);
    if (rc) { fprintf(stderr, "%s\n", err.msg); exit(1); }
    return c;
}

/* A row's values as float (any table of m). */
static float *row_values(glm_model *m, const char *name, const glm_tensor **t) {
    void *p;
    *t = glm_model_find(m, name, &p);
    if (!*t) return NULL;
    float *h = malloc((*t)->numel * sizeof(float));
    glm_model_row_download(m, *t, h, p);
    return h;
}

static void merge_case(test_counts *tc, const char *root, int dora) {
    char name[96], base[512], adir[512], out[512];
    glm_err err = {0};
    glm_backend *be = glm_backend_cpu();
    glm_config c = wide_mlp_config();
    /* the base alone, saved as a model folder */
    glm_model mb;
    glm_model_init(&mb, &c, be);
    glm_model_init_random(&mb, 7, 0.05f);
    snprintf(base, sizeof base, "%s/base%d", root, dora);
    int rc = glm_model_save(&mb, base, ST_F32, 0, &err);
    /* the same base with adapters on all four modules, B and the magnitudes moved off their start */
    c.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 4, .lora_alpha = 8, .lora_targets = GLM_LORA_ALL, .use_dora = dora};
    glm_model m;
    glm_model_init(&m, &c, be);
    glm_model_init_random(&m, 7, 0.05f);
    glm_model_init_adapters(&m, 3);
    float *ad = malloc(m.tab.total * sizeof(float));
    be->download_f32(be, ad, m.params, m.tab.total);
    glm_rng rng;
    glm_rng_seed(&rng, 11);
    for (int i = 0; i < m.tab.n; i++) {
        const glm_tensor *t = &m.tab.t[i];
        for (size_t j = 0; j < t->numel; j++) {
            float *v = &ad[t->offset + j];
            if ((t->kind - T_QKV_LA) % 2 == 1 && glm_is_lora_ab(t->kind)) *v = 0.1f * glm_rng_normal(&rng);
            else if (glm_is_dora(t->kind)) *v *= 1.0f + 0.2f * glm_rng_normal(&rng);
        }
    }
    glm_model_set_params(&m, ad);
    snprintf(adir, sizeof adir, "%s/adapter%d", root, dora);
    snprintf(m.origin, sizeof m.origin, "%s", base);
    if (!rc) rc = glm_adapter_save(&m, adir, ST_F32, &err);
    snprintf(out, sizeof out, "%s/merged%d", root, dora);
    glm_export_opts o;
    glm_export_opts_init(&o);
    o.dtype = ST_F32;
    if (!rc) rc = glm_adapter_merge(base, adir, out, &o, &err);
    snprintf(name, sizeof name, "merge_%s_runs", dora ? "dora" : "lora");
    TEST_CHECK(tc, name, rc == 0, "%s", err.msg);
    if (rc) goto done;
    glm_model mm;
    c.peft = (glm_peft){0};
    glm_model_init(&mm, &c, be);
    rc = glm_model_load(&mm, out, &err);
    snprintf(name, sizeof name, "merge_%s_folder_loads", dora ? "dora" : "lora");
    TEST_CHECK(tc, name, rc == 0, "%s", err.msg);
    double worst = 0;
    int modules = 0;
    float s = glm_lora_scaling(&m.cfg.peft);
    for (int i = 0; i < mm.tab.n && !rc; i++) {
        const glm_tensor *t = &mm.tab.t[i], *tw, *ta, *tb, *tm = NULL;
        float *got = row_values(&mm, t->name, &tw), *want = row_values(&mb, t->name, &tw);
        int k = glm_linear_index(t->kind);
        if (k >= 0) { /* W + s B A, DoRA's row scale on top */
            const glm_tensor *la = glm_table_get(&m.tab, t->layer, glm_lora_kind(k, 0));
            float *A = row_values(&m, la->name, &ta);
            float *B = row_values(&m, glm_table_get(&m.tab, t->layer, glm_lora_kind(k, 1))->name, &tb);
            float *M = dora ? row_values(&m, glm_table_get(&m.tab, t->layer, glm_dora_kind(k))->name, &tm) : NULL;
            int OC = (int)t->shape[0], C = (int)t->shape[1], r = (int)ta->shape[0];
            for (int j = 0; j < OC; j++) {
                double ss = 0;
                for (int q = 0; q < C; q++) {
                    float d = 0;
                    for (int u = 0; u < r; u++) d += B[(size_t)j * r + u] * A[(size_t)u * C + q];
                    want[(size_t)j * C + q] += s * d;
                    ss += (double)want[(size_t)j * C + q] * want[(size_t)j * C + q];
                }
                if (M) for (int q = 0; q < C; q++) want[(size_t)j * C + q] *= (float)(M[j] / sqrt(ss));
            }
            modules++;
            free(A); free(B); free(M);
        }
        double e = test_rel_err(got, want, (long)t->numel);
        worst = e > worst ? e : worst;
        free(got); free(want);
    }
    snprintf(name, sizeof name, "merge_%s_weights", dora ? "dora" : "lora");
    TEST_CHECK(tc, name, worst < 1e-5 && modules == 4 * c.num_layers, "worst rel err %.3g over %d modules", worst, modules);
    glm_model_free(&mm);
done:
    free(ad);
    glm_model_free(&m);
    glm_model_free(&mb);
    be->destroy(be);
}

int main(void) {
    test_counts tc = {0};
    char root[] = "/tmp/glm_merge_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
    merge_case(&tc, root, 0);
    merge_case(&tc, root, 1);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) {}
    TEST_EXIT(&tc);
}
