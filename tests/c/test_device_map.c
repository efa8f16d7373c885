/* --device_map: THUDM's layer ranges (spec section 9), the memory-balanced auto split, JSON
 * maps and every way a map can be wrong (the error names the module or stage), and the
 * per-stage memory plan (one stage = glm_memory_plan). */
#include <stdlib.h>
#include <string.h>
#include "model/glm.h"
#include "parallel/pipe/device_map.h"
#include "parallel/pipe/pipe_train.h"
#include "test.h"

static int ranges_are(const glm_device_map *m, const int *lo, const int *hi, int n) {
    if (m->n != n) return 0;
    for (int k = 0; k < n; k++)
        if (m->s[k].l0 != lo[k] || m->s[k].l1 != hi[k] || m->s[k].embed != (k == 0) || m->s[k].head != (k == n - 1))
            return 0;
    return 1;
}

static void test_thudm(test_counts *tc) {
    glm_config c = glm_config_chatglm6b();
    glm_err err = {0};
    glm_device_map m;
    int lo2[] = {0, 13}, hi2[] = {13, 28};
    int lo3[] = {0, 8, 18}, hi3[] = {8, 18, 28};
    int lo4[] = {0, 6, 14, 22}, hi4[] = {6, 14, 22, 28};
    int lo8[] = {0, 2, 6, 10, 14, 18, 22, 26}, hi8[] = {2, 6, 10, 14, 18, 22, 26, 28};
    int ok = glm_device_map_thudm(&m, 2, &c, &err) == 0 && ranges_are(&m, lo2, hi2, 2) && m.head_moved;
    ok = ok && glm_device_map_thudm(&m, 3, &c, &err) == 0 && ranges_are(&m, lo3, hi3, 3);
    ok = ok && glm_device_map_thudm(&m, 4, &c, &err) == 0 && ranges_are(&m, lo4, hi4, 4);
    ok = ok && glm_device_map_thudm(&m, 8, &c, &err) == 0 && ranges_are(&m, lo8, hi8, 8);
    TEST_CHECK(tc, "device_map_thudm_ranges_match_utils_py", ok, "%s", err.msg);
    int one = glm_device_map_thudm(&m, 1, &c, &err) == 0 && m.n == 1 && m.s[0].l0 == 0 && m.s[0].l1 == 28 && !m.head_moved;
    TEST_CHECK(tc, "device_map_thudm_one_gpu", one, "%s", err.msg);
}

/* auto never has a larger biggest stage than thudm, and splits W1 (untied) evenly. */
static void test_auto(test_counts *tc) {
    glm_config c = glm_config_chatglm6b();
    c.tie_word_embeddings = 0;
    glm_stage_shape sh;
    glm_stage_shape_init(&sh);
    sh.dtype = GLM_BF16; sh.B = 4; sh.T = 512; sh.n_micro = 8; sh.gradient_checkpointing = 1;
    glm_err err = {0};
    glm_device_map a, t;
    int ok = glm_device_map_auto(&a, 2, &c, &sh, &err) == 0;
    TEST_CHECK(tc, "device_map_auto_w1_two_stages_even", ok && a.s[0].l1 == 14 && a.s[1].l0 == 14 && a.s[1].l1 == 28,
               "stage 0 layers [%d, %d), stage 1 [%d, %d) %s", a.s[0].l0, a.s[0].l1, a.s[1].l0, a.s[1].l1, err.msg);
    int better = 1;
    for (int P = 2; P <= 8 && better; P++) {
        if (glm_device_map_auto(&a, P, &c, &sh, &err) || glm_device_map_thudm(&t, P, &c, &err)) { better = 0; break; }
        double ma = 0, mt = 0;
        for (int k = 0; k < P; k++) {
            double x = glm_stage_memory_plan(&c, &a, k, &sh).total, y = glm_stage_memory_plan(&c, &t, k, &sh).total;
            if (x > ma) ma = x;
            if (y > mt) mt = y;
            if (a.s[k].l1 <= a.s[k].l0) better = 0;
        }
        if (ma > mt * (1 + 1e-12)) better = 0;
        if (a.s[0].l0 != 0 || a.s[P - 1].l1 != 28) better = 0;
        for (int k = 1; k < P; k++) if (a.s[k].l0 != a.s[k - 1].l1) better = 0;
    }
    TEST_CHECK(tc, "device_map_auto_no_worse_than_thudm", better, "P up to 8: %s", err.msg);
    int too_many = glm_device_map_auto(&a, 29, &c, &sh, &err) != 0 && strstr(err.msg, "29");
    TEST_CHECK(tc, "device_map_auto_more_stages_than_layers", too_many, "%s", err.msg);
}

/* The stage plan of the whole model equals glm_memory_plan; stages add up to the model. */
static void test_plan(test_counts *tc) {
    glm_config c = glm_config_chatglm6b();
    glm_stage_shape sh;
    glm_stage_shape_init(&sh);
    sh.dtype = GLM_BF16; sh.B = 4; sh.T = 512;
    glm_err err = {0};
    int ok = 1;
    for (int ck = 0; ck < 2; ck++) {
        sh.gradient_checkpointing = ck;
        glm_device_map one;
        glm_device_map_thudm(&one, 1, &c, &err);
        glm_mem_plan a = glm_stage_memory_plan(&c, &one, 0, &sh), b = glm_memory_plan(&c, GLM_BF16, 4, 512, ck, 256);
        if (a.params != b.params || a.grads != b.grads || a.master != b.master || a.moments != b.moments ||
            a.activations != b.activations || a.scratch != b.scratch || a.total != b.total)
            ok = 0;
    }
    TEST_CHECK(tc, "stage_memory_plan_one_stage_equals_model_plan", ok, "differs");
    /* untied: stage weights add up to the model's; tied: plus one copy of the embedding */
    for (int tie = 0; tie < 2; tie++) {
        c.tie_word_embeddings = tie;
        glm_device_map m;
        glm_device_map_thudm(&m, 4, &c, &err);
        glm_table tab;
        glm_table_build(&tab, &c);
        double sum = 0, want = tab.total * 2.0 + (tie ? (double)c.vocab_size * c.hidden_size * 2 : 0);
        for (int k = 0; k < 4; k++) sum += glm_stage_memory_plan(&c, &m, k, &sh).params;
        glm_table_free(&tab);
        char name[64];
        snprintf(name, sizeof name, "stage_memory_plan_weights_add_up_%s", tie ? "tied" : "untied");
        TEST_CHECK(tc, name, sum == want, "%.0f vs %.0f bytes", sum, want);
    }
    /* a stage's planned weights are exactly what glm_model_init_stage allocates */
    glm_config s = c;
    s.num_layers = 6; s.hidden_size = 64; s.inner_hidden_size = 256; s.vocab_size = 1000; s.num_attention_heads = 4;
    glm_device_map m;
    glm_device_map_thudm(&m, 3, &s, &err);
    glm_backend *be = glm_backend_cpu();
    sh.dtype = GLM_F32;
    int same = 1;
    for (int k = 0; k < 3; k++) {
        glm_model st;
        glm_model_init_stage(&st, &s, be, m.s[k].l0, m.s[k].l1, m.s[k].embed, m.s[k].head);
        if (glm_stage_memory_plan(&s, &m, k, &sh).params != st.tab.total * 4.0) same = 0;
        glm_model_free(&st);
    }
    TEST_CHECK(tc, "stage_memory_plan_matches_stage_model", same, "weights differ from the stage model's buffer");
    /* ZeRO-2 on 2 ranks: the planned gradients are the shard plus the staging slots that
     * parallel/dp/dp_zero2.c sizes from the model's units once laid out for 2 ranks (two for the
     * largest unit, plus the tied embedding's own); within the units' alignment padding */
    for (int tie = 0; tie < 2; tie++) {
        s.tie_word_embeddings = tie;
        glm_device_map one;
        glm_device_map_thudm(&one, 1, &s, &err);
        glm_stage_shape z = sh;
        z.dp = 2;
        z.zero2 = 1;
        glm_model mm;
        glm_model_init(&mm, &s, be);
        glm_model_init_random(&mm, 5 + (uint64_t)tie, 0.02f);
        float *before = malloc(sizeof(float) * mm.tab.total);
        glm_model_get_params(&mm, before);
        glm_table old = mm.tab;
        size_t *old_off = malloc(sizeof(size_t) * (size_t)old.n);
        for (int i = 0; i < old.n; i++) old_off[i] = old.t[i].offset;
        glm_model_relayout(&mm, 64 * 2);
        float *after = malloc(sizeof(float) * mm.tab.total);
        glm_model_get_params(&mm, after);
        glm_span u[16];
        int nu = glm_model_units(&mm, u), kept = 1, aligned = mm.tab.total % 128 == 0;
        for (int i = 0; i < mm.tab.n; i++)
            if (memcmp(before + old_off[i], after + mm.tab.t[i].offset, mm.tab.t[i].numel * sizeof(float)) != 0) kept = 0;
        for (int i = 0; i < nu; i++) if (u[i].lo % 128 || u[i].n % 128) aligned = 0;
        free(before); free(after); free(old_off);
        char rn[64];
        snprintf(rn, sizeof rn, "model_relayout_keeps_values_aligns_units_%s", tie ? "tied" : "untied");
        TEST_CHECK(tc, rn, kept && aligned && nu == s.num_layers + 2, "values kept %d, units aligned %d, %d units", kept, aligned, nu);
        double ring = 0, wte = 0;
        for (int i = 0; i < nu; i++) {
            if (tie && i == 0) wte = (double)u[i].n;
            else if ((double)u[i].n > ring) ring = (double)u[i].n;
        }
        double want = ((double)mm.tab.total / 2 + 2 * ring + wte) * 4, got = glm_stage_memory_plan(&s, &one, 0, &z).grads;
        glm_model_free(&mm);
        char name[64];
        snprintf(name, sizeof name, "stage_memory_plan_zero2_%s", tie ? "tied" : "untied");
        TEST_CHECK(tc, name, fabs(got - want) <= 0.01 * want, "planned %.0f vs allocated %.0f bytes", got, want);
    }
    /* the copy-engine exchange (parallel/dp/dp_peer.c) on N ranks adds a landing buffer of N-1
     * shards to the gradients, at ZeRO 0 and 1 on one stage only */
    {
        glm_device_map one, two;
        glm_device_map_thudm(&one, 1, &s, &err);
        glm_device_map_thudm(&two, 2, &s, &err);
        int ok = 1;
        for (int n = 2; n <= 4; n += 2)
            for (int zs = 0; zs <= 2; zs++) {
                glm_stage_shape a = sh, b;
                a.dp = zs ? n : 1;
                a.zero2 = zs == 2;
                b = a;
                b.peer_ranks = n;
                double g0 = glm_stage_memory_plan(&s, &one, 0, &a).grads, g1 = glm_stage_memory_plan(&s, &one, 0, &b).grads;
                double want = zs == 2 ? g0 : g0 + (double)glm_stage_memory_plan(&s, &one, 0, &a).params * (n - 1) / n;
                if (fabs(g1 - want) > 1e-6 * want) ok = 0;
                if (glm_stage_memory_plan(&s, &two, 0, &b).grads != glm_stage_memory_plan(&s, &two, 0, &a).grads) ok = 0;
            }
        TEST_CHECK(tc, "stage_memory_plan_peer_landing", ok, "the landing buffer is planned wrongly");
    }
    be->destroy(be);
}

/* A JSON map of `n` layers: stage of embedding, of each layer, of final norm, of lm_head (-1 = leave out). */
static char *json_map(int L, int emb, const int *layer, int fin, int head) {
    char *s = malloc(8192);
    int n = sprintf(s, "{");
    if (emb >= 0) n += sprintf(s + n, "\"transformer.word_embeddings\": %d, ", emb);
    for (int l = 0; l < L; l++) if (layer[l] >= 0) n += sprintf(s + n, "\"transformer.layers.%d\": %d, ", l, layer[l]);
    if (fin >= 0) n += sprintf(s + n, "\"transformer.final_layernorm\": %d, ", fin);
    if (head >= 0) n += sprintf(s + n, "\"lm_head\": %d, ", head);
    if (n > 1) n -= 2;
    sprintf(s + n, "}");
    return s;
}

static void expect_reject(test_counts *tc, const char *name, const char *json, int P, const char *needle) {
    glm_config c = glm_config_chatglm6b();
    c.num_layers = 4;
    glm_device_map m;
    glm_err err = {0};
    int rc = glm_device_map_parse(&m, json, "map.json", P, &c, &err);
    TEST_CHECK(tc, name, rc != 0 && strstr(err.msg, needle) != NULL, "rc %d, message '%s' (want '%s')", rc, err.msg, needle);
}

static void test_json(test_counts *tc) {
    glm_config c = glm_config_chatglm6b();
    c.num_layers = 4;
    glm_err err = {0};
    glm_device_map m;
    int good[] = {0, 0, 1, 1};
    char *s = json_map(4, 0, good, 1, 1);
    int ok = glm_device_map_parse(&m, s, "map.json", 2, &c, &err) == 0 && m.n == 2 && m.s[0].l0 == 0 && m.s[0].l1 == 2 &&
             m.s[1].l0 == 2 && m.s[1].l1 == 4 && m.s[1].head && m.s[0].embed && !m.head_moved;
    TEST_CHECK(tc, "device_map_json_valid", ok, "%s", err.msg);
    free(s);
    /* the stage count comes from the file when --pipeline_parallel_size is not given */
    s = json_map(4, 0, good, 1, -1);
    ok = glm_device_map_parse(&m, s, "map.json", 0, &c, &err) == 0 && m.n == 2;
    TEST_CHECK(tc, "device_map_json_count_from_file_lm_head_optional", ok, "%s", err.msg);
    free(s);
    /* THUDM's placement (final norm and head with the embedding): kept ranges, head moved */
    s = json_map(4, 0, good, 0, 0);
    ok = glm_device_map_parse(&m, s, "map.json", 2, &c, &err) == 0 && m.head_moved && m.s[1].head && !m.s[0].head;
    TEST_CHECK(tc, "device_map_json_thudm_placement_moves_head", ok, "%s", err.msg);
    free(s);
    /* "cuda:N" values as accelerate writes them */
    ok = glm_device_map_parse(&m, "{\"transformer.word_embeddings\": \"cuda:0\", \"transformer.layers.0\": \"cuda:0\", "
                                  "\"transformer.layers.1\": \"cuda:0\", \"transformer.layers.2\": \"cuda:1\", "
                                  "\"transformer.layers.3\": \"cuda:1\", \"transformer.final_layernorm\": \"cuda:1\"}",
                              "map.json", 2, &c, &err) == 0 && m.n == 2;
    TEST_CHECK(tc, "device_map_json_cuda_names", ok, "%s", err.msg);
    /* a round trip through the JSON writer */
    glm_device_map t;
    glm_device_map_thudm(&t, 2, &c, &err);
    char *w = glm_device_map_to_json(&t, &c);
    ok = glm_device_map_parse(&m, w, "written", 2, &c, &err) == 0 && m.n == 2 && m.s[0].l1 == t.s[0].l1 && !m.head_moved;
    TEST_CHECK(tc, "device_map_json_round_trip", ok, "%s", err.msg);
    free(w);

    int missing[] = {0, -1, 1, 1};
    s = json_map(4, 0, missing, 1, 1);
    expect_reject(tc, "device_map_rejects_missing_layer", s, 2, "transformer.layers.1 is missing");
    free(s);
    s = json_map(4, -1, good, 1, 1);
    expect_reject(tc, "device_map_rejects_missing_embedding", s, 2, "transformer.word_embeddings is missing");
    free(s);
    s = json_map(4, 0, good, -1, 1);
    expect_reject(tc, "device_map_rejects_missing_final_norm", s, 2, "transformer.final_layernorm is missing");
    free(s);
    expect_reject(tc, "device_map_rejects_twice",
                  "{\"transformer.word_embeddings\": 0, \"transformer.layers.0\": 0, \"transformer.layers.1\": 0, "
                  "\"transformer.layers.1\": 1, \"transformer.layers.2\": 1, \"transformer.layers.3\": 1, "
                  "\"transformer.final_layernorm\": 1}", 2, "transformer.layers.1 appears twice");
    int order[] = {0, 1, 0, 1};
    s = json_map(4, 0, order, 1, 1);
    expect_reject(tc, "device_map_rejects_out_of_order", s, 2, "transformer.layers.2 on stage 0 comes after transformer.layers.1");
    free(s);
    int gap[] = {0, 0, 2, 2};
    s = json_map(4, 0, gap, 2, 2);
    expect_reject(tc, "device_map_rejects_empty_stage", s, 3, "stage 1 has nothing");
    free(s);
    s = json_map(4, 0, gap, 2, 2);
    expect_reject(tc, "device_map_rejects_stage_beyond_P", s, 2, "is on stage 2 but --pipeline_parallel_size is 2");
    free(s);
    expect_reject(tc, "device_map_rejects_unknown_module",
                  "{\"transformer.word_embeddings\": 0, \"transformer.layers.0.mlp\": 0}", 2,
                  "unknown module 'transformer.layers.0.mlp'");
    expect_reject(tc, "device_map_rejects_layer_beyond_model",
                  "{\"transformer.layers.4\": 0}", 2, "unknown module 'transformer.layers.4'");
    expect_reject(tc, "device_map_rejects_cpu_offload", "{\"transformer.word_embeddings\": \"cpu\"}", 2,
                  "transformer.word_embeddings -> \"cpu\" is not a stage");
    int late[] = {0, 0, 1, 1};
    s = json_map(4, 1, late, 1, 1);
    expect_reject(tc, "device_map_rejects_embedding_late", s, 2, "transformer.word_embeddings is on stage 1");
    free(s);
    s = json_map(4, 0, good, 1, 0);
    expect_reject(tc, "device_map_rejects_head_apart_from_norm", s, 2, "lm_head on stage 0");
    free(s);
    expect_reject(tc, "device_map_rejects_not_object", "[0, 1]", 2, "not a JSON object");
    /* a file that does not exist, through the flag-level entry */
    glm_stage_shape sh;
    glm_stage_shape_init(&sh);
    ok = glm_device_map_make(&m, "/nonexistent/map.json", 2, &c, &sh, &err) != 0 && strstr(err.msg, "--device_map");
    TEST_CHECK(tc, "device_map_missing_file", ok, "%s", err.msg);
}

/* Without --max_memory_per_gpu a GPU run is checked against the GPU's memory: ChatGLM-6B's full
 * W1 fine-tune (115 GiB planned) on a 24 GiB card is refused before any allocation, naming the
 * card's size and the layouts that fit; LoRA fits; the flag, when given, decides instead. */
static void test_device_check(test_counts *tc) {
    glm_config c = glm_config_chatglm6b();
    c.tie_word_embeddings = 0;
    glm_par_opts a = {.per_device_train_batch_size = 8, .seq_len = 512,
                      .gradient_accumulation_steps = 1, .optim = "adamw_torch", .device_map = "auto",
                      .pipeline_parallel_size = 1};
    size_t card = (size_t)24 << 30;
    glm_err err = {0};
    int rc = glm_pp_check_device_memory(&a, &c, 1, 1, card, &err);
    TEST_CHECK(tc, "device_check_full_w1_refused_on_24gib", rc != 0 && strstr(err.msg, "the GPU holds 24.0 GiB (no --max_memory_per_gpu given)") &&
               strstr(err.msg, "the model plans") && strstr(err.hint, "layouts that fit"), "rc %d: %s | %s", rc, err.msg, err.hint);
    glm_config lora = c;
    lora.peft = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = 8, .lora_alpha = 16, .lora_targets = GLM_LORA_QKV};
    a.per_device_train_batch_size = 4;
    a.gradient_checkpointing = 1;
    err = (glm_err){0};
    rc = glm_pp_check_device_memory(&a, &lora, 1, 1, card, &err);
    TEST_CHECK(tc, "device_check_lora_b4_fits_24gib", rc == 0, "%s", err.msg);
    a.per_device_train_batch_size = 8;
    a.gradient_checkpointing = 0;
    a.max_memory_per_gpu = "200GiB"; /* the flag's own check decides (glm_pp_check_memory) */
    TEST_CHECK(tc, "device_check_defers_to_the_flag", glm_pp_check_device_memory(&a, &c, 1, 1, card, &err) == 0, "refused");
    a.max_memory_per_gpu = NULL;
    TEST_CHECK(tc, "device_check_off_without_a_size", glm_pp_check_device_memory(&a, &c, 1, 1, 0, &err) == 0, "refused");
}

int main(void) {
    test_counts tc = {0};
    test_thudm(&tc);
    test_auto(&tc);
    test_plan(&tc);
    test_json(&tc);
    test_device_check(&tc);
    TEST_EXIT(&tc);
}
