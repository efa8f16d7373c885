/* A constraint of any kind and a row's place in it (infer/constrain.h). */
#include "infer/constrain.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "infer/choice_mode.h"

typedef enum { C_JSON, C_SCHEMA, C_CHOICES, C_REGEX, C_CALL } kind;

struct glm_constraint {
    atomic_int refs;
    kind k;
    glm_json_schema schema; /* C_SCHEMA */
    glm_regex re;           /* C_REGEX */
    char **choices;         /* C_CHOICES, C_CALL: n strings of len bytes */
    glm_constraint **args;  /* C_CALL: [n] each line's arguments */
    size_t *len;
    int n;
};

static glm_constraint *made(kind k) {
    glm_constraint *c = glm_calloc(1, sizeof *c);
    atomic_init(&c->refs, 1);
    c->k = k;
    return c;
}

glm_constraint *glm_constraint_json(void) { return made(C_JSON); }

glm_constraint *glm_constraint_schema(const cJSON *schema, char *why, size_t cap) {
    glm_constraint *c = made(C_SCHEMA);
    if (glm_json_schema_compile(&c->schema, schema, why, cap)) { free(c); return NULL; }
    return c;
}

glm_constraint *glm_constraint_regex(const char *pattern, char *why, size_t cap) {
    glm_constraint *c = made(C_REGEX);
    if (glm_regex_compile(&c->re, pattern, GLM_REGEX_MAX_STATES, why, cap)) { free(c); return NULL; }
    return c;
}

static glm_constraint *strings(kind k, const char *const *choices, int n);

glm_constraint *glm_constraint_choices(const char *const *choices, int n) { return strings(C_CHOICES, choices, n); }

glm_constraint *glm_constraint_call(const char *const *lines, glm_constraint *const *args, int n) {
    glm_constraint *c = strings(C_CALL, lines, n);
    c->args = glm_malloc(sizeof *c->args * (size_t)n);
    for (int i = 0; i < n; i++) {
        atomic_fetch_add(&args[i]->refs, 1);
        c->args[i] = args[i];
    }
    return c;
}

static glm_constraint *strings(kind k, const char *const *choices, int n) {
    glm_constraint *c = made(k);
    c->choices = glm_malloc(sizeof(char *) * (size_t)n);
    c->len = glm_malloc(sizeof(size_t) * (size_t)n);
    for (int i = 0; i < n; i++) {
        c->choices[i] = glm_strdup(choices[i]);
        c->len[i] = strlen(choices[i]);
    }
    c->n = n;
    return c;
}

void glm_constraint_unref(glm_constraint *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->k == C_SCHEMA) glm_json_schema_free(&c->schema);
    if (c->k == C_REGEX) glm_regex_free(&c->re);
    for (int i = 0; c->args && i < c->n; i++) glm_constraint_unref(c->args[i]);
    free(c->args);
    for (int i = 0; i < c->n; i++) free(c->choices[i]);
    free(c->choices);
    free(c->len);
    free(c);
}

void glm_constrained_begin(glm_constrained *r, glm_constraint *c) {
    memset(r, 0, sizeof *r);
    r->call_tool = -1;
    if (!c) return;
    atomic_fetch_add(&c->refs, 1);
    r->c = c;
    if (c->k == C_JSON) glm_json_init(&r->js);
    if (c->k == C_SCHEMA) glm_json_schema_start(&r->ss, &c->schema);
    if (c->k == C_REGEX) {
        r->re_set = glm_malloc(sizeof *r->re_set * (size_t)c->re.words);
        glm_regex_start(&c->re, r->re_set);
        r->re_dfa = glm_regex_dfa_new(&c->re);
    }
}

void glm_constrained_end(glm_constrained *r) {
    glm_constraint_unref(r->c);
    free(r->text.s);
    free(r->re_set);
    glm_regex_dfa_free(r->re_dfa);
    if (r->call_args) glm_constrained_end(r->call_args);
    free(r->call_args);
    memset(r, 0, sizeof *r);
}

void glm_constrained_mask(const glm_text_vocab *v, const glm_constrained *r, const int32_t *ends, int n_ends, float *logits) {
    const glm_constraint *c = r->c;
    if (!c) return;
    if (c->k == C_JSON) glm_json_mask(v, &r->js, ends, n_ends, logits);
    else if (c->k == C_SCHEMA) glm_json_schema_mask(v, &r->ss, ends, n_ends, logits);
    else if (c->k == C_CALL && r->call_tool >= 0) glm_constrained_mask(v, r->call_args, ends, n_ends, logits);
    else if (c->k == C_REGEX) glm_regex_mask(v, &c->re, r->re_dfa, r->re_set, &r->re_text, r->re_bytes, ends, n_ends, logits);
    else glm_choice_mask(v, (const char *const *)c->choices, c->len, c->n, r->text.s ? r->text.s : "", r->text.n, ends,
                         n_ends, logits);
}

void glm_constrained_advance(const glm_text_vocab *v, glm_constrained *r, int32_t id) {
    const glm_constraint *c = r->c;
    if (!c) return;
    if (c->k == C_JSON) glm_json_advance(v, &r->js, id);
    else if (c->k == C_SCHEMA) glm_json_schema_advance(v, &r->ss, id);
    else if (c->k == C_REGEX) {
        const char *b;
        size_t n = glm_choice_token_bytes(v, id, r->re_bytes, &b);
        for (size_t i = 0; i < n; i++) glm_regex_byte(&c->re, r->re_set, &r->re_text, (unsigned char)b[i]);
        r->re_bytes += n;
    } else if (c->k == C_CALL && r->call_tool >= 0) {
        glm_constrained_advance(v, r->call_args, id);
    } else {
        const char *b;
        size_t n = glm_choice_token_bytes(v, id, r->text.n, &b);
        glm_strbuf_put(&r->text, b, n);
        for (int k = 0; c->k == C_CALL && k < c->n; k++) /* a call's line whole: its arguments from here */
            if (r->text.n == c->len[k] && !memcmp(r->text.s, c->choices[k], c->len[k])) {
                r->call_tool = k;
                r->call_args = glm_malloc(sizeof *r->call_args);
                glm_constrained_begin(r->call_args, c->args[k]);
            }
    }
}
