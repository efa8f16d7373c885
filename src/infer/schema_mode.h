/* Structured outputs: the answer is a JSON object that a JSON Schema describes (OpenAI's
 * response_format {"type": "json_schema", "json_schema": {"schema": ...}}, vLLM's guided_json).
 *
 * The schema is compiled into nodes (glm_json_schema_compile); a byte-level recognizer (glm_json_schema_state,
 * a stack of frames, one per value being written) follows the answer, and before each choice the
 * tokens whose bytes it would refuse get a logit far below the rest, as JSON mode does
 * (infer/json_mode.h), the end tokens until the root object is closed and everything else after.
 *
 * What a schema may say (anything else is refused by name, with its path):
 *   - "type" (a name or a list of names; not number with integer), "enum", "const";
 *   - objects: "properties" (written in the schema's order, each required one present, the others
 *     optional; only listed properties are written), "required"; an object without properties is a
 *     map: any keys, each value as "additionalProperties" says (a schema, true or absent: any value,
 *     false: only {});
 *   - arrays: "items" (a schema, true, or false: nothing after the prefix), "prefixItems",
 *     "minItems", "maxItems", "uniqueItems" (items that are an enum or const);
 *   - maps: "minProperties", "maxProperties"; "nullable" (OpenAPI's: null besides the type);
 *   - strings: "minLength", "maxLength" (characters, as Python's len counts them), "pattern"
 *     (infer/regex.h's syntax, matched whole: a subset of jsonschema's search) or "format" (date-time,
 *     date, time, uuid, email, ipv4, as patterns: docs/SERVE.md); every string is well-formed UTF-8;
 *   - numbers and integers: "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" (a bounded
 *     number is written without an exponent, with at most 18 digits);
 *   - "$ref" to a place in the same schema ("#/$defs/Name", "#/definitions/Name", "#"), recursion
 *     included; "allOf" of one schema; "anyOf" / "oneOf" whose alternatives are values of different
 *     JSON types (an alternative is picked by the value's first byte: Optional[X] is anyOf X, null),
 *     or objects told apart by their first property, required and a const or enum of values no
 *     other has (a discriminated union: pydantic's Union of models with a Literal tag first);
 *   - true and {} (any value), and the annotations (title, description, default, examples,
 *     $schema, $comment, $defs, definitions, deprecated, readOnly, writeOnly, and
 *     additionalProperties beside properties).
 * The root is an object. */
#ifndef GLM_INFER_SCHEMA_MODE_H
#define GLM_INFER_SCHEMA_MODE_H
#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include "infer/regex.h"
#include "infer/text_vocab.h"

#define GLM_SCHEMA_MAX_DEPTH 16 /* values nested in one another */
#define GLM_SCHEMA_MAX_LITS 64  /* properties of an object, values of an enum */
#define GLM_SCHEMA_REGEX_STATES 256 /* a string's pattern or format (its states live in the state) */

enum { GLM_ST_OBJECT = 1, GLM_ST_ARRAY = 2, GLM_ST_STRING = 4, GLM_ST_NUMBER = 8, GLM_ST_INTEGER = 16,
       GLM_ST_BOOLEAN = 32, GLM_ST_NULL = 64 };

typedef struct glm_json_schema_node {
    unsigned types;                 /* GLM_ST_* a value may be (0: one of lits or of alts) */
    unsigned classes;               /* the JSON types its values can have (GLM_ST_*, integer as number):
                                     * how anyOf picks an alternative */
    int n_props;                    /* an object's properties, in order: */
    char **keys;                    /*   each key as JSON text with its quotes ("\"name\"") */
    struct glm_json_schema_node **props; /*   and its value's node */
    uint8_t *required;
    struct glm_json_schema_node *extra;  /* an object without properties (a map): each value's node;
                                          * NULL: only {} */
    int n_prefix;                   /* an array's first items' nodes (prefixItems) */
    struct glm_json_schema_node **prefix;
    struct glm_json_schema_node *items;  /* the items after them (NULL: none) */
    int min_items, max_items;       /* max_items -1: no limit */
    uint8_t unique;                 /* uniqueItems: the items (an enum or const) all differ */
    int min_props, max_props;       /* a map's keys (minProperties, maxProperties; -1: no limit) */
    int min_len, max_len;           /* a string's characters; max_len -1: no limit */
    glm_regex *re;                  /* a string's pattern or format, matched whole; NULL: none */
    uint8_t has_lo, lo_excl, has_hi, hi_excl; /* a number's bounds */
    double lo, hi;
    int n_alts;                     /* anyOf / oneOf: values of distinct JSON types */
    struct glm_json_schema_node **alts;
    /* objects of one anyOf told apart by their first property (a required const or enum, a
     * discriminator): this node takes that property (props[0], all their values), then becomes
     * tagged[tag_of[i]] after value i */
    struct glm_json_schema_node **tagged;
    uint8_t *tag_of;
    uint8_t ready;                  /* compiled whole (a $ref's node may still be being built) */
    uint8_t min_depth;              /* the fewest frames a value of it takes, its required values
                                     * inside it included (255: it can never end) */
    int n_lits;                     /* enum / const: the values as JSON text */
    char **lits;
} glm_json_schema_node;

typedef struct glm_json_schema {
    glm_json_schema_node *root;
    glm_json_schema_node **all; /* every node, to free */
    int n_all;
} glm_json_schema;

/* The frames a value of node n takes at least when it starts with an object ('{') or an array ('[');
 * 1 for anything else (its required properties and first items inside it). */
int glm_json_schema_need(const glm_json_schema_node *n, unsigned c);

/* Compiles schema s; -1 with why[] naming the keyword and where it is when it is not supported. */
int glm_json_schema_compile(glm_json_schema *out, const cJSON *s, char *why, size_t cap);
void glm_json_schema_free(glm_json_schema *s);

typedef struct glm_json_schema_frame {
    const glm_json_schema_node *node;
    uint64_t cand;  /* the keys or enum values still matching what was written; a bounded number's
                     * digits; a string's last \u escape was a high surrogate */
    int16_t next;   /* an object's first property not written yet; an array's items so far; a
                     * string's characters so far */
    uint16_t pos;   /* bytes of a key or enum value written; a \u escape's value; a number's sign */
    uint8_t phase;  /* where in its value the frame is (schema_mode.c) */
    uint8_t sub;    /* a number's step, a literal word's index, \u digits to come */
    uint8_t prop;   /* an object's property whose value is being written; a number's fraction digits */
} glm_json_schema_frame;

typedef struct glm_json_schema_state {
    uint8_t depth, space, done;
    glm_json_schema_frame f[GLM_SCHEMA_MAX_DEPTH];
    /* the open string's pattern (a string is always the top frame, so one is enough): its live
     * states and the character being read */
    uint64_t re[GLM_SCHEMA_REGEX_STATES / 64];
    glm_regex_text re_text;
} glm_json_schema_state;

void glm_json_schema_start(glm_json_schema_state *st, const glm_json_schema *s);
/* Feeds bytes b[0..n): 0 and st moved on, or -1 (st unchanged) where a byte cannot come next. */
int glm_json_schema_feed(glm_json_schema_state *st, const unsigned char *b, size_t n);
/* Before a choice (as glm_json_mask) and after it (as glm_json_advance). */
void glm_json_schema_mask(const glm_text_vocab *v, const glm_json_schema_state *st, const int32_t *ends, int n_ends, float *logits);
void glm_json_schema_advance(const glm_text_vocab *v, glm_json_schema_state *st, int32_t id);

#endif
