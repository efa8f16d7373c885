/* The oracle check, data-driven: any oracle file of chatglm.cpp's format (made by THUDM's own
 * code; ../shared/oracles/chatglm-cpp/README.md gives the layouts) run through the CPU model.
 *   test_oracle --family chatglm --pre_seq_len P FILE   one file: the max-abs error of the
 *                                                       prompt and both decode steps, then PASS
 *                                                       or FAIL against 1e-5
 *   test_oracle                                         the files in the shared oracle folder
 * Families: chatglm (GLM v1, with or without a P-Tuning v2 prefix); chatglm2 / chatglm3 (the
 * ChatGLM2 block, glm2_model.data; ChatGLM3 has the same code path); glm4 (the same block:
 * chatglm.cpp's glm4 files have its layout), with or without a P-Tuning v2 prefix (the README's
 * fp16 [2L, G, P, KC] cache in front). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "oracle.h"

static void run_one(test_counts *tc, const char *family, int P, const char *file) {
    char name[512];
    const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(name, sizeof name, "oracle_%s_%s_P%d", family, base, P);
    int v2 = strcmp(family, "chatglm2") == 0 || strcmp(family, "chatglm3") == 0 || strcmp(family, "glm4") == 0;
    if (!v2 && strcmp(family, "chatglm") != 0) {
        TEST_CHECK(tc, name, 0, "unknown family %s (chatglm, chatglm2, chatglm3, glm4)", family);
        return;
    }
    glm_backend *be = glm_backend_cpu();
    double e[3] = {0};
    int rc = v2 ? oracle_glm2_run(be, file, P, e) : oracle_glm_run(be, file, P, e);
    be->destroy(be);
    if (rc == 1) { TEST_SKIP(tc, name, "%s not found", file); return; }
    printf("  %s: max abs error prompt %.3g, decode step 1 %.3g, step 2 %.3g\n", base, e[0], e[1], e[2]);
    TEST_CHECK(tc, name, rc == 0 && e[0] < 1e-5 && e[1] < 1e-5 && e[2] < 1e-5,
               "rc %d (a wrong size or prefix length?), errors %.3g %.3g %.3g (limit 1e-5)", rc, e[0], e[1], e[2]);
}

int main(int argc, char **argv) {
    test_counts tc = {0};
    const char *family = NULL, *file = NULL;
    int P = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--family") && i + 1 < argc) family = argv[++i];
        else if (!strcmp(argv[i], "--pre_seq_len") && i + 1 < argc) P = atoi(argv[++i]);
        else if (argv[i][0] != '-') file = argv[i];
        else { fprintf(stderr, "usage: test_oracle [--family chatglm|chatglm2|chatglm3|glm4 --pre_seq_len P FILE]\n"); return 2; }
    }
    if (file) {
        run_one(&tc, family ? family : "chatglm", P, file);
    } else { /* the shared files, each with its family and prefix (the README's table) */
        run_one(&tc, "chatglm", 0, "glm_model.data");
        run_one(&tc, "chatglm", 5, "glm_ptuning_v2_model.data");
        run_one(&tc, "chatglm2", 0, "glm2_model.data");
    }
    TEST_EXIT(&tc);
}
