/* What an answer must be, whichever the kind (JSON mode: infer/json_mode.h; a JSON Schema:
 * infer/schema_mode.h; one of some strings: infer/choice_mode.h; a regular expression's match:
 * infer/regex.h), made once and shared by the rows
 * that keep to it (a request's n choices), and each row's place in it. The masks and the token
 * bytes are the kinds' own; this is the one switch over the kinds. */
#ifndef GLM_INFER_CONSTRAIN_H
#define GLM_INFER_CONSTRAIN_H
#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include "core/strbuf.h"
#include "infer/json_mode.h"
#include "infer/regex.h"
#include "infer/schema_mode.h"
#include "infer/text_vocab.h"

typedef struct glm_constraint glm_constraint; /* immutable once made; counted references */

glm_constraint *glm_constraint_json(void);
/* NULL with why[] (the keyword and where it is) for a schema that is not supported. */
glm_constraint *glm_constraint_schema(const cJSON *schema, char *why, size_t cap);
/* NULL with why[] for a pattern that is not supported (infer/regex.h). */
glm_constraint *glm_constraint_regex(const char *pattern, char *why, size_t cap);
/* choices[n] (n >= 1, each non-empty), copied. */
glm_constraint *glm_constraint_choices(const char *const *choices, int n);

/* A tool call in GLM-4's form: one of the lines names[n] ("NAME\n"), then what args[k] allows for
 * the line picked (each a JSON object's constraint; references taken). The line is closed by a
 * token of its own (a token that would run on into the arguments is not offered). */
glm_constraint *glm_constraint_call(const char *const *lines, glm_constraint *const *args, int n);

/* Drops the maker's reference (the rows that began on c keep theirs). */
void glm_constraint_unref(glm_constraint *c);

/* A row's place in a constraint (c NULL: none). */
typedef struct glm_constrained {
    glm_constraint *c;
    glm_json_state js;          /* JSON mode */
    glm_json_schema_state ss;   /* a schema */
    glm_strbuf text;            /* choices: the answer's bytes so far */
    uint64_t *re_set;           /* a regex: its live states, */
    glm_regex_text re_text;     /*   the character being read */
    size_t re_bytes;            /*   and the answer's bytes so far, */
    glm_regex_dfa *re_dfa;      /*   its masks' cache */
    int call_tool;              /* a call: the line picked (-1: text holds the line so far) */
    struct glm_constrained *call_args; /*   and the row's place in its arguments */
} glm_constrained;
/* Starts a row on c (taking a reference; c may be NULL), and ends it (dropping it). */
void glm_constrained_begin(glm_constrained *r, glm_constraint *c);
void glm_constrained_end(glm_constrained *r);
/* Before a choice: logits[V] of the tokens that cannot come next, and of the ends[n_ends] until
 * the answer is complete, far below the rest. After it: the chosen token taken. */
void glm_constrained_mask(const glm_text_vocab *v, const glm_constrained *r, const int32_t *ends, int n_ends, float *logits);
void glm_constrained_advance(const glm_text_vocab *v, glm_constrained *r, int32_t id);

#endif
