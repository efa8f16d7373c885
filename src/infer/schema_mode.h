/* Structured outputs: the answer is a JSON object that a JSON Schema describes (OpenAI's
 * response_format {"type": "json_schema", "json_schema": {"schema": ...}}, vLLM's guided_json).
 *
 * The schema is compiled into nodes (glm_json_schema_compile); a byte-level recognizer (glm_json_schema_state,
 * a stack of frames, one per value being written) follows the answer, and before each choice the
 * tokens whose bytes it would refuse get a logit far below the rest, as JSON mode does
 * (infer/json_mode.h), the end tokens until the root object is closed and everything else after.
 *
 * What a schema may say (anything else is refused by name, with its path): "type" (a name or a
 * list of names whose values start differently: not number with integer), "properties",
 * "required", "items", "minItems", "maxItems", "enum", "const", and the annotations (title,
 * description, default, examples, $schema, additionalProperties). An object's properties are
 * written in the schema's order, each required one present, the others optional; only listed
 * properties are written. The root is an object. */
#ifndef GLM_INFER_SCHEMA_MODE_H
#define GLM_INFER_SCHEMA_MODE_H
#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include "infer/text_vocab.h"

#define GLM_SCHEMA_MAX_DEPTH 16 /* values nested in one another */
#define GLM_SCHEMA_MAX_LITS 64  /* properties of an object, values of an enum */

enum { GLM_ST_OBJECT = 1, GLM_ST_ARRAY = 2, GLM_ST_STRING = 4, GLM_ST_NUMBER = 8, GLM_ST_INTEGER = 16,
       GLM_ST_BOOLEAN = 32, GLM_ST_NULL = 64 };

typedef struct glm_json_schema_node {
    unsigned types;                 /* GLM_ST_* a value may be (0: one of lits alone) */
    int n_props;                    /* an object's properties, in order: */
    char **keys;                    /*   each key as JSON text with its quotes ("\"name\"") */
    struct glm_json_schema_node **props; /*   and its value's node */
    uint8_t *required;
    struct glm_json_schema_node *items;  /* an array's items */
    int min_items, max_items;       /* max_items -1: no limit */
    int n_lits;                     /* enum / const: the values as JSON text */
    char **lits;
} glm_json_schema_node;

typedef struct glm_json_schema {
    glm_json_schema_node *root;
    glm_json_schema_node **all; /* every node, to free */
    int n_all;
} glm_json_schema;

/* Compiles schema s; -1 with why[] naming the keyword and where it is when it is not supported. */
int glm_json_schema_compile(glm_json_schema *out, const cJSON *s, char *why, size_t cap);
void glm_json_schema_free(glm_json_schema *s);

typedef struct glm_json_schema_frame {
    const glm_json_schema_node *node;
    uint64_t cand;  /* the keys or enum values still matching what was written */
    int16_t next;   /* an object's first property not written yet; an array's items so far */
    uint16_t pos;   /* bytes of a key or enum value written */
    uint8_t phase;  /* where in its value the frame is (schema_mode.c) */
    uint8_t sub;    /* a number's step, a literal word's index, \u digits to come */
    uint8_t prop;   /* an object's property whose value is being written */
} glm_json_schema_frame;

typedef struct glm_json_schema_state {
    uint8_t depth, space, done;
    glm_json_schema_frame f[GLM_SCHEMA_MAX_DEPTH];
} glm_json_schema_state;

void glm_json_schema_start(glm_json_schema_state *st, const glm_json_schema *s);
/* Feeds bytes b[0..n): 0 and st moved on, or -1 (st unchanged) where a byte cannot come next. */
int glm_json_schema_feed(glm_json_schema_state *st, const unsigned char *b, size_t n);
/* Before a choice (as glm_json_mask) and after it (as glm_json_advance). */
void glm_json_schema_mask(const glm_text_vocab *v, const glm_json_schema_state *st, const int32_t *ends, int n_ends, float *logits);
void glm_json_schema_advance(const glm_text_vocab *v, glm_json_schema_state *st, int32_t id);

#endif
