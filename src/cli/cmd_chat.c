/* `glmtrain chat`: an interactive conversation in the terminal, as THUDM's cli_demo.py: the
 * history goes into model.chat's "[Round i]" prompt, tokens are printed as they come, 'clear'
 * forgets the history, 'exit' / 'quit' / 'stop' (or end of input) leave. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "cli/gen_common.h"
#include "core/log.h"
#include "infer/chat.h"

static const glm_flag chat_flags[] = {
    GEN_COMMON_FLAGS,
    GEN_LOOKUP_FLAGS,
    GEN_GUIDED_FLAGS,
    GEN_F(reuse_kv_cache, ARG_BOOL, "true", "keep the conversation's KV cache between turns, so a turn computes only its new tokens (ChatGLM2/3, GLM-4, as THUDM's cli_demo keeps past_key_values; ChatGLM-6B's prompts see themselves whole and start afresh)"),
};
static const int n_chat_flags = sizeof chat_flags / sizeof chat_flags[0];

/* Reads one line of any length (without the newline; its length in *len); NULL at end of input. */
static char *read_line(FILE *f, size_t *len) {
    size_t cap = 256, n = 0;
    char *s = glm_malloc(cap);
    int c;
    while ((c = fgetc(f)) != EOF && c != '\n') {
        if (n + 2 > cap) s = glm_realloc(s, cap *= 2);
        s[n++] = (char)c;
    }
    if (c == EOF && n == 0) { free(s); return NULL; }
    if (n > 0 && s[n - 1] == '\r') n--;
    s[n] = 0;
    *len = n;
    return s;
}

static void free_hist(char **hist, int n_hist) {
    for (int i = 0; i < 2 * n_hist; i++) free(hist[i]);
}

/* One turn: prompt, generate with streaming, history. Returns 0, or -1 (err) on failure. */
static int turn(gen_session *s, glm_gen_session *cache, const gen_args *a, glm_rng *rng, const char *line, char ***hist,
                int *n_hist, glm_err *err) {
    glm_ids in = {0}, out = {0};
    int dropped = 0;
    char *prompt = NULL;
    /* room for the response under whichever limit is set: --max_new_tokens within the model's
     * max_sequence_length, or max_length (capped at it) less one token */
    int max_prompt = glm_gen_max_prompt(&s->g);
    if (gen_chat_inputs(s, a->system, line, (const char *const *)*hist, *n_hist, max_prompt, &in, &dropped, &prompt, err)) {
        glm_ids_free(&in); /* a message too long still left its tokens here */
        return -1;
    }
    if (dropped) {
        char lim[160];
        glm_gen_limit_text(&s->g, lim, sizeof lim);
        fprintf(stderr, "(the %d oldest round%s no longer fit and were left out: at most %d prompt tokens fit, %s)\n",
                dropped, dropped > 1 ? "s" : "", max_prompt, lim);
        free_hist(*hist, dropped);
        memmove(*hist, *hist + 2 * dropped, sizeof(char *) * 2 * (size_t)(*n_hist - dropped));
        *n_hist -= dropped;
    }
    if (a->debug) {
        char *e = gen_escape(prompt);
        fprintf(stderr, "[debug] prompt (%d tokens): %s\n", in.n, e);
        free(e);
    }
    free(prompt);
    gen_stream t = {.show = 1, .debug = a->debug};
    glm_streamer_init(&t.st, s->tok, gen_postprocess(s, 1));
    printf("\nChatGLM: ");
    fflush(stdout);
    int rc = glm_generate_session(cache, &in, &s->g, rng, &out, gen_stream_token, &t, err);
    if (rc == 0) {
        char *tail, *res = glm_streamer_finish(&t.st, &tail);
        fputs(tail, stdout);
        free(tail);
        *hist = glm_realloc(*hist, sizeof(char *) * 2 * (size_t)(*n_hist + 1));
        (*hist)[2 * *n_hist] = glm_strdup(line);
        (*hist)[2 * *n_hist + 1] = res;
        (*n_hist)++;
    }
    printf("\n");
    fflush(stdout);
    if (a->debug && cache->reuse) fprintf(stderr, "[debug] %d of the prompt's %d tokens from the cache\n", cache->reused, in.n);
    glm_streamer_free(&t.st);
    glm_ids_free(&in);
    glm_ids_free(&out);
    return rc;
}

int glm_cmd_chat(int argc, char **argv) {
    gen_args a;
    glm_err err = {0};
    gen_session s = {0};
    int rc = gen_parse(chat_flags, n_chat_flags, &a, argc, argv, "chat", &err);
    if (rc == 1) { gen_args_free(chat_flags, n_chat_flags, &a); return 0; }
    if (!rc) rc = gen_open(&s, &a, &err);
    if (rc) { glm_err_print(&err); gen_close(&s); gen_args_free(chat_flags, n_chat_flags, &a); return 1; }
    glm_rng rng;
    glm_rng_seed(&rng, (uint64_t)a.seed);
    printf("欢迎使用 ChatGLM-6B 模型 (glmtrain): type a message; 'clear' forgets the history, 'exit' quits.\n");
    char **hist = NULL;
    int n_hist = 0;
    glm_gen_session cache;
    glm_gen_session_init(&cache, gen_lm(&s), a.reuse_kv_cache);
    for (;;) {
        printf("\n用户: ");
        fflush(stdout);
        size_t len;
        char *line = read_line(stdin, &len);
        if (!line) { printf("\n"); break; }
        if (strlen(line) != len) { /* C strings end at a NUL: the rest would vanish unseen */
            fprintf(stderr, "error: the message holds a NUL byte (at byte %zu); it was not sent. Type it again without it.\n",
                    strlen(line) + 1);
            free(line);
            continue;
        }
        if (!strcmp(line, "exit") || !strcmp(line, "quit") || !strcmp(line, "stop")) { free(line); break; }
        if (!strcmp(line, "clear")) {
            free_hist(hist, n_hist);
            n_hist = 0;
            glm_gen_session_forget(&cache);
            printf("(history cleared)\n");
        } else if (line[0] && turn(&s, &cache, &a, &rng, line, &hist, &n_hist, &err)) {
            glm_err_print(&err); /* a failed turn (e.g. too long) does not end the session */
        }
        free(line);
    }
    free_hist(hist, n_hist);
    free(hist);
    glm_gen_session_free(&cache);
    gen_report_lookup(&s);
    gen_close(&s);
    gen_args_free(chat_flags, n_chat_flags, &a);
    return 0;
}
