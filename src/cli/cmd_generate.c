/* `glmtrain generate` (one response per prompt) and `glmtrain chat` (interactive, with
 * history and streaming). Both load a model folder written by `glmtrain train` or a Hugging
 * Face style chatglm-6b folder. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/args.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "infer/generate.h"

typedef struct gen_args {
    char *model_name_or_path, *tokenizer_name, *prompt, *device;
    int do_sample, max_length, max_new_tokens, top_k, seed;
    double top_p, temperature, repetition_penalty;
} gen_args;

#define F(name, type, def, help) {#name, type, offsetof(gen_args, name), def, help, NULL, NULL}
static const glm_flag gen_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "model folder (config.json + safetensors + tokenizer)"),
    F(tokenizer_name, ARG_STR, NULL, "tokenizer folder or .model (default: the model folder)"),
    F(prompt, ARG_STR, NULL, "the query (generate)"),
    {"device", ARG_STR, offsetof(gen_args, device), "cpu", "where to run", "auto|cpu|cuda", NULL},
    F(do_sample, ARG_BOOL, "true", "sample (false = greedy)"),
    F(max_length, ARG_INT, "2048", "prompt + response tokens"),
    F(max_new_tokens, ARG_INT, "0", "response tokens (overrides max_length when > 0)"),
    F(top_p, ARG_FLOAT, "0.7", "nucleus sampling mass"),
    F(top_k, ARG_INT, "50", "sample among the k most likely tokens"),
    F(temperature, ARG_FLOAT, "0.95", "softmax temperature"),
    F(repetition_penalty, ARG_FLOAT, "1.0", "penalty for tokens already present (1 = none)"),
    F(seed, ARG_INT, "42", "sampling seed"),
};
#undef F
static const int n_gen_flags = sizeof gen_flags / sizeof gen_flags[0];

typedef struct session {
    glm_backend *be;
    glm_model m;
    glm_tokenizer *tok;
    glm_gen_cfg g;
    glm_rng rng;
} session;

static int open_session(session *s, gen_args *a, glm_err *err) {
    if (!a->model_name_or_path) return glm_fail(err, "--model_name_or_path is required");
    glm_config c;
    if (glm_config_load(&c, a->model_name_or_path, err)) return -1;
    s->be = NULL;
#ifdef GLM_HAVE_CUDA
    if (strcmp(a->device, "cpu") != 0) {
        char msg[512];
        s->be = glm_backend_cuda(0, GLM_F32, msg, sizeof msg);
        if (!s->be && strcmp(a->device, "cuda") == 0) return glm_fail(err, "--device cuda: %s", msg);
    }
#endif
    if (!s->be) {
        if (strcmp(a->device, "cuda") == 0) return glm_fail(err, "--device cuda: built without CUDA");
        s->be = glm_backend_cpu();
    }
    glm_model_init(&s->m, &c, s->be);
    if (glm_model_load(&s->m, a->model_name_or_path, err)) return -1;
    if (glm_tokenizer_load(&s->tok, a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path, err)) return -1;
    s->g = (glm_gen_cfg){.do_sample = a->do_sample, .max_length = a->max_length, .max_new_tokens = a->max_new_tokens,
                         .temperature = (float)a->temperature, .top_p = (float)a->top_p, .top_k = a->top_k,
                         .repetition_penalty = (float)a->repetition_penalty, .seed = (uint64_t)a->seed};
    glm_rng_seed(&s->rng, (uint64_t)a->seed);
    return 0;
}

static void close_session(session *s) {
    if (s->tok) glm_tokenizer_free(s->tok);
    if (s->m.params) glm_model_free(&s->m);
    if (s->be) s->be->destroy(s->be);
}

static int parse(gen_args *a, int argc, char **argv, const char *cmd, glm_err *err) {
    glm_args_defaults(gen_flags, n_gen_flags, a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(gen_flags, n_gen_flags, cmd); exit(0); }
    return glm_args_parse(gen_flags, n_gen_flags, a, argc, argv, err);
}

static void free_args(gen_args *a) {
    for (int i = 0; i < n_gen_flags; i++)
        if (gen_flags[i].type == ARG_STR) free(*(char **)((char *)a + gen_flags[i].offset));
}

int glm_cmd_generate(int argc, char **argv) {
    gen_args a;
    glm_err err = {0};
    session s = {0};
    int rc = parse(&a, argc, argv, "generate", &err);
    if (!rc && !a.prompt) rc = glm_fail(&err, "--prompt is required");
    if (!rc) rc = open_session(&s, &a, &err);
    char *res = NULL;
    if (!rc) {
        char *p = glm_chat_prompt(a.prompt, NULL, 0);
        res = glm_generate_text(&s.m, s.tok, p, &s.g, &s.rng, NULL, NULL, &err);
        free(p);
        if (!res) rc = -1;
    }
    if (res) printf("%s\n", res);
    if (rc) glm_err_print(&err);
    free(res);
    close_session(&s);
    free_args(&a);
    return rc ? 1 : 0;
}

static void stream_out(void *ctx, const char *text) {
    fputs(text, stdout);
    fflush(stdout);
}

int glm_cmd_chat(int argc, char **argv) {
    gen_args a;
    glm_err err = {0};
    session s = {0};
    int rc = parse(&a, argc, argv, "chat", &err);
    if (!rc) rc = open_session(&s, &a, &err);
    if (rc) { glm_err_print(&err); close_session(&s); free_args(&a); return 1; }
    printf("glmtrain chat — type a message; 'clear' forgets the history, 'exit' quits.\n");
    char **hist = NULL;
    int n_hist = 0;
    char line[16384];
    while (1) {
        printf("\n用户: ");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!strcmp(line, "exit") || !strcmp(line, "quit")) break;
        if (!strcmp(line, "clear")) {
            for (int i = 0; i < 2 * n_hist; i++) free(hist[i]);
            n_hist = 0;
            printf("(history cleared)\n");
            continue;
        }
        if (!line[0]) continue;
        char *p = glm_chat_prompt(line, (const char *const *)hist, n_hist);
        printf("\nChatGLM: ");
        char *res = glm_generate_text(&s.m, s.tok, p, &s.g, &s.rng, stream_out, NULL, &err);
        free(p);
        printf("\n");
        if (!res) { glm_err_print(&err); continue; }
        hist = glm_realloc(hist, sizeof(char *) * 2 * (n_hist + 1));
        hist[2 * n_hist] = glm_strdup(line);
        hist[2 * n_hist + 1] = res;
        n_hist++;
    }
    for (int i = 0; i < 2 * n_hist; i++) free(hist[i]);
    free(hist);
    close_session(&s);
    free_args(&a);
    return 0;
}
