/* Times the decoding constraints' token masks (infer/json_mode.h, infer/schema_mode.h) over a real
 * vocabulary: `tool_mask_time TOKENIZER [V]` prints, for JSON mode and for a schema at several
 * places in an answer (between values, in a string with and without a length limit, in a bounded
 * and an unbounded number, in a key), the median time of one mask over the V tokens (default: the
 * tokenizer's size) and how many tokens it leaves. What serve and generate pay a row a token.
 *
 * `tool_mask_time --check TOKENIZER [V]` instead holds every mask against the recognizer itself:
 * at each place (more of them: a string at its limit, after a high surrogate at it, in the middle
 * of a character, a bounded number at its edge, a finished answer) a token keeps its logit exactly
 * when its bytes can come next (an end token: exactly when the answer is complete); it prints
 * "mask check: N places, M tokens differ". */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "infer/choice_mode.h"
#include "infer/json_mode.h"
#include "infer/regex.h"
#include "infer/schema_mode.h"
#include "infer/text_vocab.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *SCHEMA = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
    "\"short\": {\"type\": \"string\", \"maxLength\": 40}, \"n\": {\"type\": \"integer\"}, "
    "\"p\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}, \"tags\": {\"type\": \"array\", \"items\": "
    "{\"type\": \"string\"}}, \"code\": {\"type\": \"string\", \"pattern\": \"[A-Z]{2}-[0-9]{3}|中+\"}, "
    "\"when\": {\"type\": \"string\", \"format\": \"date-time\"}}, \"required\": [\"name\", \"short\", \"n\", \"p\", \"tags\"]}";

/* The places --check looks at: a prefix of bytes, JSON mode (0) or the schema (1). */
static const struct { const char *text; int schema; } PLACES[] = {
    {"", 0}, {"{", 0}, {"{\"a\": 1, ", 0}, {"{\"a\": \"xy", 0}, {"{\"a\": \"x\xe4\xb8", 0}, {"{\"a\": 12", 0},
    {"{\"a\": [tr", 0}, {"{\"a\": {}}", 0}, {"{\"a\": \"\\u12", 0},
    {"", 1}, {"{\"na", 1}, {"{\"name\": \"abc", 1}, {"{\"name\": \"\xe4", 1}, {"{\"name\": \"x\", ", 1},
    {"{\"name\": \"x\", \"short\": \"abc", 1},
    {"{\"name\": \"x\", \"short\": \"0123456789012345678901234567890123456", 1},
    {"{\"name\": \"x\", \"short\": \"01234567890123456789012345678901234567\\ud83d", 1},
    {"{\"name\": \"x\", \"short\": \"012345678901234567890123456789012345678\xe4\xb8", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 12", 1}, {"{\"name\": \"x\", \"short\": \"y\", \"n\": -", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0.2", 1}, {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 1", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [\"a\"", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": []}", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"code\": \"A", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"code\": \"AB-12", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"code\": \"\\u4e", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"code\": \"\xe4\xb8", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"when\": \"2024-0", 1},
    {"{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"when\": \"2024-02-28T23:59:59", 1},
};

static int check_masks(const glm_text_vocab *v, const glm_json_schema *s, const int32_t *ends, float *logits) {
    long differ = 0;
    int n = (int)(sizeof PLACES / sizeof PLACES[0]);
    for (int c = 0; c < n; c++) {
        glm_json_state js;
        glm_json_schema_state ss;
        glm_json_init(&js);
        glm_json_schema_start(&ss, s);
        const unsigned char *t = (const unsigned char *)PLACES[c].text;
        size_t len = strlen(PLACES[c].text);
        if (PLACES[c].schema ? glm_json_schema_feed(&ss, t, len) : glm_json_feed(&js, t, len)) {
            fprintf(stderr, "place %d: prefix refused\n", c);
            return 1;
        }
        for (int i = 0; i < v->V; i++) logits[i] = 0;
        if (PLACES[c].schema) glm_json_schema_mask(v, &ss, ends, 1, logits);
        else glm_json_mask(v, &js, ends, 1, logits);
        int done = PLACES[c].schema ? ss.done : glm_json_done(&js);
        for (int id = 0; id < v->V; id++) {
            int want;
            if (id == ends[0]) want = done;
            else if (!v->text[id] || done) want = 0;
            else {
                const unsigned char *b = (const unsigned char *)v->blob + v->off[id];
                size_t nb = v->off[id + 1] - v->off[id];
                glm_json_state j2 = js;
                glm_json_schema_state s2 = ss;
                want = PLACES[c].schema ? !glm_json_schema_feed(&s2, b, nb) : !glm_json_feed(&j2, b, nb);
            }
            if (want != (logits[id] > GLM_MASKED)) {
                if (differ < 5) fprintf(stderr, "place %d token %d: mask %d, recognizer %d\n", c, id, logits[id] > GLM_MASKED, want);
                differ++;
            }
        }
    }
    /* guided_regex's masks (through the row's DFA cache) against the NFA, token by token, at the
     * start (an answer's first token without its dropped space) and after some text */
    static const struct { const char *pattern, *text; } RE[] = {
        {"[^\"]{1,200}", ""}, {"[^\"]{1,200}", "abc"}, {"(yes|no|maybe), [a-z ]+\\.", "ma"}, {"[0-9]{3}-[a-c]{2}|[中文]+x?", ""},
        {"[0-9]{3}-[a-c]{2}|[中文]+x?", "\xe4\xb8"}, {".{2,4}", "\xe6"}, {"\\w+@\\w+\\.com", "ab@"}};
    int nre = (int)(sizeof RE / sizeof RE[0]);
    for (int c = 0; c < nre; c++) {
        glm_regex re;
        char why[300];
        if (glm_regex_compile(&re, RE[c].pattern, GLM_REGEX_MAX_STATES, why, sizeof why)) { fprintf(stderr, "%s\n", why); return 1; }
        uint64_t set[GLM_REGEX_MAX_STATES / 64];
        glm_regex_text t = {0};
        glm_regex_start(&re, set);
        size_t so_far = strlen(RE[c].text);
        for (size_t i = 0; i < so_far; i++)
            if (glm_regex_byte(&re, set, &t, (unsigned char)RE[c].text[i])) { fprintf(stderr, "regex place %d refused\n", c); return 1; }
        glm_regex_dfa *dfa = glm_regex_dfa_new(&re);
        for (int pass = 0; pass < 2; pass++) { /* (the second from a filled cache) */
            for (int i = 0; i < v->V; i++) logits[i] = 0;
            glm_regex_mask(v, &re, dfa, set, &t, so_far, ends, 1, logits);
            int whole = !t.need && glm_regex_accepts(&re, set);
            for (int id = 0; id < v->V; id++) {
                const char *b;
                size_t nb = glm_choice_token_bytes(v, id, so_far, &b);
                int want = id == ends[0] ? whole : nb > 0;
                uint64_t s2[GLM_REGEX_MAX_STATES / 64];
                memcpy(s2, set, sizeof s2);
                glm_regex_text t2 = t;
                for (size_t k = 0; id != ends[0] && want && k < nb; k++) want = !glm_regex_byte(&re, s2, &t2, (unsigned char)b[k]);
                if (want != (logits[id] > GLM_MASKED)) {
                    if (differ < 5) fprintf(stderr, "regex place %d token %d: mask %d, NFA %d\n", c, id, logits[id] > GLM_MASKED, want);
                    differ++;
                }
            }
        }
        glm_regex_dfa_free(dfa);
        glm_regex_free(&re);
    }
    printf("mask check: %d places, %ld tokens differ\n", n + nre, differ);
    return differ != 0;
}

int main(int argc, char **argv) {
    int check = argc > 1 && !strcmp(argv[1], "--check");
    argv += check, argc -= check;
    if (argc < 2) { fprintf(stderr, "usage: tool_mask_time [--check] TOKENIZER [V]\n"); return 2; }
    glm_tokenizer *tok;
    glm_err err = {0};
    if (glm_tokenizer_load(&tok, argv[1], &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int V = argc > 2 ? atoi(argv[2]) : glm_tokenizer_vocab_size(tok);
    glm_text_vocab v;
    glm_text_vocab_build(&v, tok, V);
    cJSON *sj = cJSON_Parse(SCHEMA);
    glm_json_schema s;
    char why[256];
    if (glm_json_schema_compile(&s, sj, why, sizeof why)) { fprintf(stderr, "%s\n", why); return 1; }
    static const struct { const char *what, *text; int schema; } CASES[] = {
        {"json mode, between values", "{\"a\": 1, ", 0},
        {"json mode, in a string", "{\"a\": \"xy", 0},
        {"json mode, in a number", "{\"a\": 12", 0},
        {"schema, before a key", "{\"name\": \"x\", ", 1},
        {"schema, in a key", "{\"na", 1},
        {"schema, in a string", "{\"name\": \"abc", 1},
        {"schema, in a string of maxLength 40", "{\"name\": \"x\", \"short\": \"abc", 1},
        {"schema, in an integer", "{\"name\": \"x\", \"short\": \"y\", \"n\": 12", 1},
        {"schema, in a number within [0, 1]", "{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0.2", 1},
        {"schema, in a string of a pattern", "{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"code\": \"A", 1},
        {"schema, in a date-time", "{\"name\": \"x\", \"short\": \"y\", \"n\": 1, \"p\": 0, \"tags\": [], \"when\": \"2024-0", 1},
    };
    int32_t ends[1] = {glm_tokenizer_specials(tok).eop};
    float *logits = malloc(sizeof(float) * (size_t)V);
    int rc = check ? check_masks(&v, &s, ends, logits) : 0;
    for (size_t c = 0; !check && c < sizeof CASES / sizeof CASES[0]; c++) {
        glm_json_state js;
        glm_json_schema_state ss;
        glm_json_init(&js);
        glm_json_schema_start(&ss, &s);
        const unsigned char *t = (const unsigned char *)CASES[c].text;
        if (CASES[c].schema ? glm_json_schema_feed(&ss, t, strlen(CASES[c].text)) : glm_json_feed(&js, t, strlen(CASES[c].text))) {
            fprintf(stderr, "case %zu: prefix refused\n", c);
            return 1;
        }
        double ms[21];
        int left = 0;
        for (int r = 0; r < 21; r++) {
            for (int i = 0; i < V; i++) logits[i] = 0;
            double t0 = now();
            if (CASES[c].schema) glm_json_schema_mask(&v, &ss, ends, 1, logits);
            else glm_json_mask(&v, &js, ends, 1, logits);
            ms[r] = (now() - t0) * 1e3;
            left = 0;
            for (int i = 0; i < V; i++) left += logits[i] > GLM_MASKED;
        }
        qsort(ms, 21, sizeof ms[0], cmp);
        printf("%-40s %7.3f ms a mask, %6d of %d tokens left\n", CASES[c].what, ms[10], left, V);
    }
    /* guided_regex: a pattern most tokens fit, and one few do */
    static const char *const PATTERNS[] = {"[^\"]{1,200}", "(yes|no|maybe), [a-z ]+\\."};
    for (int k = 0; k < 2 && !check; k++) {
        glm_regex re;
        if (glm_regex_compile(&re, PATTERNS[k], GLM_REGEX_MAX_STATES, why, sizeof why)) { fprintf(stderr, "%s\n", why); return 1; }
        uint64_t set[GLM_REGEX_MAX_STATES / 64];
        glm_regex_text t = {0};
        glm_regex_start(&re, set);
        glm_regex_dfa *dfa = glm_regex_dfa_new(&re);
        double ms[21], first_ms = 0;
        int left = 0;
        for (int r = 0; r < 21; r++) {
            for (int i = 0; i < V; i++) logits[i] = 0;
            double t0 = now();
            glm_regex_mask(&v, &re, dfa, set, &t, 0, ends, 1, logits);
            ms[r] = (now() - t0) * 1e3;
            if (!r) first_ms = ms[r];
            left = 0;
            for (int i = 0; i < V; i++) left += logits[i] > GLM_MASKED;
        }
        qsort(ms, 21, sizeof ms[0], cmp);
        printf("regex %-34s %7.3f ms a mask, %6d of %d tokens left (the first, filling the cache: %.3f ms)\n",
               PATTERNS[k], ms[10], left, V, first_ms);
        glm_regex_dfa_free(dfa);
        glm_regex_free(&re);
    }
    free(logits);
    glm_json_schema_free(&s);
    cJSON_Delete(sj);
    glm_text_vocab_free(&v);
    glm_tokenizer_free(tok);
    return rc ? 1 : 0;
}
