/* Structured outputs' schema compiler (infer/schema_mode.h): a JSON Schema made into nodes for the
 * recognizer in schema_mode.c. Every schema object is compiled once (a table keyed by its place in
 * the parsed document), so a "$ref" used twice shares one node and a recursive one points back at
 * the node being built. */
#include "infer/schema_mode.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

static const char *const TYPES[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
/* Keywords that say nothing about which values fit, and the places that only hold schemas for $ref. */
static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$comment",
                                          "$defs", "definitions", "deprecated", "readOnly", "writeOnly"};
static const char *const ASSERTIONS[] = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                                         "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
                                         "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "$ref", "allOf",
                                         "pattern", "format", "nullable", "uniqueItems", "minProperties",
                                         "maxProperties",
                                         "anyOf", "oneOf"};
#define ALL_CLASSES (GLM_ST_OBJECT | GLM_ST_ARRAY | GLM_ST_STRING | GLM_ST_NUMBER | GLM_ST_BOOLEAN | GLM_ST_NULL)
#define MAX_REF_HOPS 32

typedef struct cctx {
    glm_json_schema *S;
    const cJSON *root;
    char *why;
    size_t cap;
    const cJSON **seen;          /* schema objects compiled so far */
    glm_json_schema_node **node; /*   and their nodes */
    int n_seen;
    glm_json_schema_node *any;   /* true / {}: any value */
} cctx;

static int fail(cctx *c, const char *path, const char *msg) {
    snprintf(c->why, c->cap, "%s: %s", path, msg);
    return -1;
}

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t j = 0; j < n; j++) if (!strcmp(k, list[j])) return 1;
    return 0;
}
#define IS_ANNOTATION(k) in_list(k, ANNOTATIONS, sizeof ANNOTATIONS / sizeof ANNOTATIONS[0])
#define IS_ASSERTION(k) in_list(k, ASSERTIONS, sizeof ASSERTIONS / sizeof ASSERTIONS[0])

static const cJSON *get(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

/* Only annotations beside keyword k (a $ref, an allOf, an anyOf stands alone). */
static int alone(const cJSON *s, const char *k) {
    for (const cJSON *e = s->child; e; e = e->next)
        if (strcmp(e->string, k) && !IS_ANNOTATION(e->string)) return 0;
    return 1;
}

static glm_json_schema_node *new_node(glm_json_schema *S) {
    glm_json_schema_node *n = glm_calloc(1, sizeof *n);
    n->max_items = -1;
    n->max_len = -1;
    n->max_props = -1;
    S->all = glm_realloc(S->all, sizeof *S->all * (size_t)(S->n_all + 1));
    S->all[S->n_all++] = n;
    return n;
}

static glm_json_schema_node *any_node(cctx *c) {
    if (!c->any) {
        glm_json_schema_node *n = c->any = new_node(c->S);
        n->types = n->classes = ALL_CLASSES;
        n->extra = n->items = n;
    }
    return c->any;
}

/* "#/a/b~1c" resolved inside the document (JSON Pointer's ~0 and ~1; list items by index). */
static const cJSON *resolve(cctx *c, const char *ref, const char *path) {
    if (ref[0] != '#') return fail(c, path, "\"$ref\" must point inside the schema (\"#/$defs/Name\")"), NULL;
    const cJSON *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) { seg[n++] = p[1] == '0' ? '~' : '/'; p++; }
            else seg[n++] = *p;
        }
        seg[n] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(seg)) : get(at, seg);
    }
    if (*p || !at) {
        char msg[400];
        snprintf(msg, sizeof msg, "\"$ref\" %.200s names no place in the schema", ref);
        return fail(c, path, msg), NULL;
    }
    return at;
}

/* Follows $ref and allOf-of-one to the schema that says something; path[] then names where it is. */
static const cJSON *unwrap(cctx *c, const cJSON *s, char *path, size_t cap) {
    for (int hop = 0; hop <= MAX_REF_HOPS; hop++) {
        if (!cJSON_IsObject(s)) return s;
        const cJSON *r = get(s, "$ref"), *all = get(s, "allOf");
        if (r) {
            if (!cJSON_IsString(r)) return fail(c, path, "\"$ref\" must be a string"), NULL;
            if (!alone(s, "$ref")) return fail(c, path, "\"$ref\" beside other keywords is not supported (only annotations)"), NULL;
            if (!(s = resolve(c, r->valuestring, path))) return NULL;
            snprintf(path, cap, "%.200s", r->valuestring);
        } else if (all) {
            if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1 || !alone(s, "allOf"))
                return fail(c, path, "\"allOf\" is supported with one schema and nothing beside it but annotations"), NULL;
            s = all->child;
            size_t n = strlen(path);
            snprintf(path + n, cap - n, ".allOf[0]");
        } else {
            return s;
        }
    }
    return fail(c, path, "\"$ref\"s lead round in a circle"), NULL;
}

static int parse_types(cctx *c, const cJSON *t, unsigned *out, const char *path) {
    const cJSON *one = t;
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : 1;
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (cJSON_IsArray(t)) one = cJSON_GetArrayItem(t, i);
        int k = -1;
        for (int j = 0; j < 7 && cJSON_IsString(one); j++) if (!strcmp(one->valuestring, TYPES[j])) k = j;
        if (k < 0) return fail(c, path, "\"type\" must name object, array, string, number, integer, boolean or null");
        *out |= 1u << k;
    }
    if (!*out) return fail(c, path, "\"type\" lists no type");
    if ((*out & GLM_ST_NUMBER) && (*out & GLM_ST_INTEGER))
        return fail(c, path, "\"type\" lists number and integer together (say number)");
    return 0;
}

static int lowest_bit(unsigned m) {
    int i = 0;
    while (m && !(m >> i & 1)) i++;
    return i;
}

static unsigned class_of_types(unsigned t) { return (t & ~(unsigned)GLM_ST_INTEGER) | (t & GLM_ST_INTEGER ? GLM_ST_NUMBER : 0); }

static unsigned class_of_value(const cJSON *v) {
    return cJSON_IsObject(v) ? GLM_ST_OBJECT : cJSON_IsArray(v) ? GLM_ST_ARRAY : cJSON_IsString(v) ? GLM_ST_STRING
         : cJSON_IsNumber(v) ? GLM_ST_NUMBER : cJSON_IsBool(v) ? GLM_ST_BOOLEAN : GLM_ST_NULL;
}

/* A literal fits "type" t (an integer type takes whole numbers only). */
static int literal_fits(const cJSON *v, unsigned t) {
    if (!t) return 1;
    if (cJSON_IsNumber(v) && !(t & GLM_ST_NUMBER)) return (t & GLM_ST_INTEGER) && v->valuedouble == floor(v->valuedouble);
    return (class_of_types(t) & class_of_value(v)) != 0;
}

/* The JSON types a schema's values can have, read from the document (a $ref's target may still be
 * being compiled when an anyOf beside it needs to know). */
static unsigned classes_of(cctx *c, const cJSON *s, int depth) {
    char path[256] = "schema";
    if (depth > MAX_REF_HOPS || !(s = unwrap(c, s, path, sizeof path))) return 0;
    if (cJSON_IsTrue(s)) return ALL_CLASSES;
    if (!cJSON_IsObject(s)) return 0;
    const cJSON *alts = get(s, "anyOf") ? get(s, "anyOf") : get(s, "oneOf"), *t = get(s, "type");
    unsigned types = 0, out = 0;
    if (t && parse_types(c, t, &types, path)) return 0;
    if (cJSON_IsArray(alts)) {
        for (const cJSON *a = alts->child; a; a = a->next) out |= classes_of(c, a, depth + 1);
        return out;
    }
    const cJSON *en = get(s, "enum"), *co = get(s, "const"), *v;
    if (co) return literal_fits(co, types) ? class_of_value(co) : 0;
    if (cJSON_IsArray(en)) {
        cJSON_ArrayForEach(v, en) if (literal_fits(v, types)) out |= class_of_value(v);
        return out;
    }
    return t ? class_of_types(types) | (cJSON_IsTrue(get(s, "nullable")) ? GLM_ST_NULL : 0) : ALL_CLASSES;
}

static glm_json_schema_node *compile(cctx *c, const cJSON *s, const char *path_in, int depth);

static int compile_literals(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path) {
    const cJSON *en = get(s, "enum"), *co = get(s, "const");
    int m = en ? (cJSON_IsArray(en) ? cJSON_GetArraySize(en) : -1) : 1;
    if (m < 1 || m > GLM_SCHEMA_MAX_LITS) return fail(c, path, "\"enum\" must list 1 to 64 values");
    n->lits = glm_calloc((size_t)m, sizeof(char *));
    for (int i = 0; i < m; i++) {
        const cJSON *v = en ? cJSON_GetArrayItem(en, i) : co;
        if (literal_fits(v, n->types)) n->lits[n->n_lits++] = cJSON_PrintUnformatted(v);
    }
    if (!n->n_lits) return fail(c, path, "no value of \"enum\" / \"const\" is of the schema's \"type\"");
    n->types = 0;
    return 0;
}

static int count_of(cctx *c, const cJSON *v, int *out, int dflt, const char *path, const char *what) {
    char msg[128];
    if (!v) { *out = dflt; return 0; }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 10000 || v->valuedouble != floor(v->valuedouble)) {
        snprintf(msg, sizeof msg, "\"%s\" must be a count from 0 to 10000", what);
        return fail(c, path, msg);
    }
    *out = (int)v->valuedouble;
    return 0;
}

static int compile_object(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path, int depth) {
    char sub[512];
    const cJSON *p = get(s, "properties"), *r = get(s, "required"), *ap = get(s, "additionalProperties");
    if (p && !cJSON_IsObject(p)) return fail(c, path, "\"properties\" must be an object");
    int m = p ? cJSON_GetArraySize(p) : 0;
    if (m > GLM_SCHEMA_MAX_LITS) return fail(c, path, "more than 64 properties");
    if (m) {
        n->keys = glm_calloc((size_t)m, sizeof(char *));
        n->props = glm_calloc((size_t)m, sizeof *n->props);
        n->required = glm_calloc((size_t)m, 1);
        for (const cJSON *k = p->child; k; k = k->next) {
            cJSON *key = cJSON_CreateString(k->string);
            n->keys[n->n_props] = cJSON_PrintUnformatted(key);
            cJSON_Delete(key);
            snprintf(sub, sizeof sub, "%.400s.properties.%.60s", path, k->string);
            if (!(n->props[n->n_props++] = compile(c, k, sub, depth + 1))) return -1;
        }
    } else if (!ap || cJSON_IsTrue(ap)) { /* a map of any values */
        n->extra = any_node(c);
    } else if (!cJSON_IsFalse(ap)) {
        snprintf(sub, sizeof sub, "%.400s.additionalProperties", path);
        if (!(n->extra = compile(c, ap, sub, depth + 1))) return -1;
    }
    const cJSON *lo = get(s, "minProperties"), *hi = get(s, "maxProperties");
    if ((lo || hi) && m) return fail(c, path, "\"minProperties\" / \"maxProperties\" are supported on maps (an object "
                                     "without \"properties\"); make optional properties required instead");
    if (count_of(c, lo, &n->min_props, 0, path, "minProperties") || count_of(c, hi, &n->max_props, -1, path, "maxProperties"))
        return -1;
    if ((n->max_props >= 0 && n->max_props < n->min_props) || (n->min_props > 0 && !n->extra))
        return fail(c, path, "no map has that many keys (maxProperties below minProperties, or additionalProperties false)");
    if (r && !cJSON_IsArray(r)) return fail(c, path, "\"required\" must be a list of property names");
    const cJSON *it;
    cJSON_ArrayForEach(it, r) {
        int hit = 0;
        for (int i = 0; i < n->n_props && cJSON_IsString(it); i++)
            if (!strcmp(cJSON_GetArrayItem(p, i)->string, it->valuestring)) n->required[i] = 1, hit = 1;
        if (!hit) return fail(c, path, "\"required\" names a property that \"properties\" does not have");
    }
    return 0;
}


static int compile_array(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path, int depth) {
    char sub[512];
    const cJSON *it = get(s, "items"), *pre = get(s, "prefixItems");
    if (pre && (!cJSON_IsArray(pre) || cJSON_GetArraySize(pre) > GLM_SCHEMA_MAX_LITS))
        return fail(c, path, "\"prefixItems\" must be a list of at most 64 schemas");
    if (cJSON_IsArray(it)) return fail(c, path, "\"items\" as a list (draft 4's tuples) is not supported: say \"prefixItems\"");
    if (pre) {
        n->prefix = glm_calloc((size_t)cJSON_GetArraySize(pre) + 1, sizeof *n->prefix);
        for (const cJSON *e = pre->child; e; e = e->next) {
            snprintf(sub, sizeof sub, "%.400s.prefixItems[%d]", path, n->n_prefix);
            if (!(n->prefix[n->n_prefix++] = compile(c, e, sub, depth + 1))) return -1;
        }
    }
    snprintf(sub, sizeof sub, "%.400s.items", path);
    if (!it || cJSON_IsTrue(it)) n->items = any_node(c);
    else if (!cJSON_IsFalse(it) && !(n->items = compile(c, it, sub, depth + 1))) return -1;
    if (count_of(c, get(s, "minItems"), &n->min_items, 0, path, "minItems") ||
        count_of(c, get(s, "maxItems"), &n->max_items, -1, path, "maxItems"))
        return -1;
    const cJSON *u = get(s, "uniqueItems");
    if (u && !cJSON_IsBool(u)) return fail(c, path, "\"uniqueItems\" must be true or false");
    if (cJSON_IsTrue(u)) {
        if (n->n_prefix || !n->items || !n->items->ready || !n->items->n_lits)
            return fail(c, path, "\"uniqueItems\" is supported where every item is an enum or const (no prefixItems)");
        n->unique = 1;
        if (n->max_items < 0 || n->max_items > n->items->n_lits) n->max_items = n->items->n_lits;
    }
    if (!n->items && (n->max_items < 0 || n->max_items > n->n_prefix)) n->max_items = n->n_prefix;
    if (n->max_items >= 0 && n->max_items < n->min_items)
        return fail(c, path, "\"maxItems\" (or the items that \"items\": false or uniqueItems leave) is below \"minItems\"");
    return 0;
}

static int compile_bounds(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path) {
    static const char *const K[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = get(s, K[i]);
        char msg[200];
        if (!v) continue;
        if (!cJSON_IsNumber(v) || fabs(v->valuedouble) > 9007199254740992.0) {
            snprintf(msg, sizeof msg, "\"%s\" must be a number of at most 2^53 (draft 4's true/false form: give the bound itself)", K[i]);
            return fail(c, path, msg);
        }
        double b = v->valuedouble;
        int excl = i & 1;
        if (i < 2 && (!n->has_lo || b > n->lo || (b == n->lo && excl))) n->has_lo = 1, n->lo = b, n->lo_excl = (uint8_t)excl;
        if (i >= 2 && (!n->has_hi || b < n->hi || (b == n->hi && excl))) n->has_hi = 1, n->hi = b, n->hi_excl = (uint8_t)excl;
    }
    if (!(n->types & GLM_ST_NUMBER)) { /* integers only: whole, inclusive bounds */
        if (n->has_lo) n->lo = n->lo_excl ? floor(n->lo) + 1 : ceil(n->lo), n->lo_excl = 0;
        if (n->has_hi) n->hi = n->hi_excl ? ceil(n->hi) - 1 : floor(n->hi), n->hi_excl = 0;
        if (n->has_lo && n->has_hi && n->lo > n->hi) return fail(c, path, "no integer lies within its minimum and maximum");
    } else if (n->has_lo && n->has_hi && (n->lo > n->hi || (n->lo == n->hi && (n->lo_excl || n->hi_excl)))) {
        return fail(c, path, "no number lies within its minimum and maximum");
    }
    return 0;
}

/* "format"s as patterns (each stricter than its RFC where a pattern cannot count: a date is never
 * February 29th, a year is 1000-9999), so that what is made also parses in Python. */
#define DATE "[1-9][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
#define TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
static const char *const FORMATS[][2] = {
    {"date-time", DATE "T" TIME}, {"date", DATE}, {"time", TIME},
    {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    {"email", "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)+"},
    {"ipv4", OCTET "(?:\\." OCTET "){3}"},
};

static int compile_pattern(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path) {
    const cJSON *pat = get(s, "pattern"), *fmt = get(s, "format");
    char msg[600], why[320];
    if (!pat && !fmt) return 0;
    if (pat && fmt) return fail(c, path, "\"pattern\" and \"format\" together are not supported (give one)");
    if (n->min_len > 0 || n->max_len >= 0) /* (a length that the pattern's strings may all miss would leave no way on) */
        return fail(c, path, "\"minLength\" / \"maxLength\" beside a pattern or format are not supported (put the "
                    "length in the pattern: [a-z]{1,8})");
    const char *re = NULL;
    if (pat && !cJSON_IsString(pat)) return fail(c, path, "\"pattern\" must be a string");
    if (pat) re = pat->valuestring;
    for (size_t i = 0; fmt && i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, FORMATS[i][0])) re = FORMATS[i][1];
    if (!re) {
        snprintf(msg, sizeof msg, "\"format\" %.60s is not supported (date-time, date, time, uuid, email, ipv4 are)",
                 cJSON_IsString(fmt) ? fmt->valuestring : "?");
        return fail(c, path, msg);
    }
    n->re = glm_calloc(1, sizeof *n->re);
    if (glm_regex_compile(n->re, re, GLM_SCHEMA_REGEX_STATES, why, sizeof why)) {
        free(n->re);
        n->re = NULL;
        snprintf(msg, sizeof msg, "\"%s\": %s", pat ? "pattern" : "format", why);
        return fail(c, path, msg);
    }
    return 0;
}

/* An anyOf's object alternatives (two or more) made into one node that reads their common first
 * property, a discriminator, and then becomes the one its value names (schema_mode.c); n->alts
 * and cls[] keep one entry for them. */
static int tag_objects(cctx *c, glm_json_schema_node *n, unsigned *cls, const char *path, const char *kw) {
    int k = 0, lits = 0;
    for (int i = 0; i < n->n_alts; i++) k += (cls[i] & GLM_ST_OBJECT) != 0;
    if (k < 2) return 0;
    char msg[400];
    const glm_json_schema_node *first = NULL;
    for (int i = 0; i < n->n_alts; i++) {
        const glm_json_schema_node *x = n->alts[i];
        if (!(cls[i] & GLM_ST_OBJECT)) continue;
        const char *why = cls[i] != GLM_ST_OBJECT || !x->ready || x->types != GLM_ST_OBJECT || x->n_lits || x->n_alts ||
                          x->tagged ? "is not only an object (or refers back to the anyOf)"
                        : !x->n_props || !x->required[0] ? "has no required first property"
                        : !x->props[0]->n_lits ? "has a first property that is not a const or an enum"
                        : first && strcmp(first->keys[0], x->keys[0]) ? "has another first property than the others" : NULL;
        if (why) {
            snprintf(msg, sizeof msg, "%s: alternatives that are objects are told apart by their first property, which must "
                     "be required and a const or enum of its own values in each; one %s", kw, why);
            return fail(c, path, msg);
        }
        first = first ? first : x;
        lits += x->props[0]->n_lits;
    }
    if (lits > GLM_SCHEMA_MAX_LITS) return fail(c, path, "the objects' first properties have more than 64 values");
    glm_json_schema_node *u = new_node(c->S), *tag = new_node(c->S);
    u->types = u->classes = GLM_ST_OBJECT;
    u->n_props = 1;
    u->keys = glm_calloc(1, sizeof(char *));
    u->keys[0] = glm_strdup(first->keys[0]);
    u->props = glm_calloc(1, sizeof *u->props);
    u->props[0] = tag;
    u->required = glm_calloc(1, 1);
    u->required[0] = 1;
    u->tagged = glm_calloc((size_t)k, sizeof *u->tagged);
    u->tag_of = glm_calloc((size_t)lits, 1);
    tag->lits = glm_calloc((size_t)lits, sizeof(char *));
    int kept = 0, t = 0;
    for (int i = 0; i < n->n_alts; i++) {
        if (!(cls[i] & GLM_ST_OBJECT)) { n->alts[kept] = n->alts[i]; cls[kept++] = cls[i]; continue; }
        const glm_json_schema_node *v = n->alts[i]->props[0];
        for (int j = 0; j < v->n_lits; j++) {
            for (int q = 0; q < tag->n_lits; q++)
                if (!strcmp(tag->lits[q], v->lits[j])) {
                    snprintf(msg, sizeof msg, "%s: two objects' first properties can both be %.100s", kw, v->lits[j]);
                    return fail(c, path, msg);
                }
            u->tag_of[tag->n_lits] = (uint8_t)t;
            tag->lits[tag->n_lits++] = glm_strdup(v->lits[j]);
        }
        tag->classes |= v->classes;
        u->tagged[t++] = n->alts[i];
    }
    n->alts[kept] = u;
    cls[kept++] = GLM_ST_OBJECT;
    n->n_alts = kept;
    tag->ready = u->ready = 1;
    return 0;
}

/* Fills node n from schema s (s is neither a $ref nor an allOf: unwrap has followed them). */
static int compile_into(cctx *c, glm_json_schema_node *n, const cJSON *s, const char *path, int depth) {
    char sub[512];
    n->classes = classes_of(c, s, 0);
    if (cJSON_IsTrue(s)) { n->types = n->classes = ALL_CLASSES; n->extra = n->items = any_node(c); return 0; }
    if (cJSON_IsFalse(s)) return fail(c, path, "the schema false allows no value here");
    if (!cJSON_IsObject(s)) return fail(c, path, "a schema must be an object");
    if (depth >= GLM_SCHEMA_MAX_DEPTH) return fail(c, path, "nested deeper than 16 values");
    for (const cJSON *k = s->child; k; k = k->next)
        if (!IS_ANNOTATION(k->string) && !IS_ASSERTION(k->string)) {
            snprintf(sub, sizeof sub, "\"%.60s\" is not supported (docs/SERVE.md lists the keywords a schema may use)", k->string);
            return fail(c, path, sub);
        }
    const cJSON *alts = get(s, "anyOf") ? get(s, "anyOf") : get(s, "oneOf");
    if (alts) {
        const char *kw = get(s, "anyOf") ? "anyOf" : "oneOf";
        if (!cJSON_IsArray(alts) || !alts->child || cJSON_GetArraySize(alts) > GLM_SCHEMA_MAX_LITS || !alone(s, kw)) {
            snprintf(sub, sizeof sub, "\"%s\" is supported as a list of 1 to 64 schemas with nothing beside it but annotations", kw);
            return fail(c, path, sub);
        }
        int m = cJSON_GetArraySize(alts);
        n->alts = glm_calloc((size_t)m, sizeof *n->alts);
        unsigned *cls = glm_calloc((size_t)m, sizeof *cls);
        for (const cJSON *a = alts->child; a; a = a->next) {
            snprintf(sub, sizeof sub, "%.400s.%s[%d]", path, kw, n->n_alts);
            cls[n->n_alts] = classes_of(c, a, 0);
            if (!(n->alts[n->n_alts++] = compile(c, a, sub, depth + 1))) return free(cls), -1;
        }
        int rc = tag_objects(c, n, cls, path, kw);
        unsigned seen = 0;
        for (int i = 0; i < n->n_alts && !rc; i++) {
            if (cls[i] & seen) {
                char msg[300];
                snprintf(sub, sizeof sub, "%.400s.%s[%d]", path, kw, i);
                snprintf(msg, sizeof msg, "two alternatives can both be a%s %s: glmtrain picks an alternative by the "
                         "value's first byte, so they must be of different types (merge them into one)",
                         (cls[i] & seen & GLM_ST_ARRAY) ? "n" : "", TYPES[lowest_bit(cls[i] & seen)]);
                rc = fail(c, sub, msg);
            }
            seen |= cls[i];
        }
        free(cls);
        if (rc) return -1;
        n->classes = seen;
        return 0;
    }
    const cJSON *t = get(s, "type"), *nullable = get(s, "nullable");
    if (t && parse_types(c, t, &n->types, path)) return -1;
    if (nullable && !cJSON_IsBool(nullable)) return fail(c, path, "\"nullable\" must be true or false");
    if (t && cJSON_IsTrue(nullable)) n->types |= GLM_ST_NULL;
    if (get(s, "enum") || get(s, "const")) return compile_literals(c, n, s, path);
    if (!t) {
        for (const cJSON *k = s->child; k; k = k->next)
            if (IS_ASSERTION(k->string)) {
                snprintf(sub, sizeof sub, "\"%.60s\" without a \"type\": say which type it is for", k->string);
                return fail(c, path, sub);
            }
        n->types = ALL_CLASSES; /* annotations alone: any value */
        n->extra = n->items = any_node(c);
        return 0;
    }
    if ((n->types & GLM_ST_OBJECT) && compile_object(c, n, s, path, depth)) return -1;
    if ((n->types & GLM_ST_ARRAY) && compile_array(c, n, s, path, depth)) return -1;
    if ((n->types & GLM_ST_STRING) && (count_of(c, get(s, "minLength"), &n->min_len, 0, path, "minLength") ||
                                       count_of(c, get(s, "maxLength"), &n->max_len, -1, path, "maxLength")))
        return -1;
    if (n->max_len >= 0 && n->max_len < n->min_len) return fail(c, path, "\"maxLength\" is below \"minLength\"");
    if ((n->types & GLM_ST_STRING) && compile_pattern(c, n, s, path)) return -1;
    if ((n->types & (GLM_ST_NUMBER | GLM_ST_INTEGER)) && compile_bounds(c, n, s, path)) return -1;
    return 0;
}

static glm_json_schema_node *compile(cctx *c, const cJSON *s, const char *path_in, int depth) {
    char path[512];
    snprintf(path, sizeof path, "%s", path_in);
    if (!(s = unwrap(c, s, path, sizeof path))) return NULL;
    if (cJSON_IsTrue(s)) return any_node(c);
    for (int i = 0; i < c->n_seen; i++) if (c->seen[i] == s) return c->node[i];
    glm_json_schema_node *n = new_node(c->S);
    c->seen = glm_realloc(c->seen, sizeof *c->seen * (size_t)(c->n_seen + 1));
    c->node = glm_realloc(c->node, sizeof *c->node * (size_t)(c->n_seen + 1));
    c->seen[c->n_seen] = s;
    c->node[c->n_seen++] = n;
    if (compile_into(c, n, s, path, depth)) return NULL;
    n->ready = 1;
    return n;
}

static int at_most(int d) { return d < 255 ? d : 255; }

int glm_json_schema_need(const glm_json_schema_node *n, unsigned c) {
    int d = 1;
    if (c == '{' && (n->types & GLM_ST_OBJECT)) {
        for (int k = 0; k < n->n_props; k++)
            if (n->required[k] && 1 + n->props[k]->min_depth > d) d = 1 + n->props[k]->min_depth;
        if (n->min_props > 0 && 1 + n->extra->min_depth > d) d = 1 + n->extra->min_depth; /* (a key's own frame is popped first) */
    }
    if (c == '[' && (n->types & GLM_ST_ARRAY))
        for (int i = 0; i < n->min_items; i++) {
            const glm_json_schema_node *it = i < n->n_prefix ? n->prefix[i] : n->items;
            if (it && 1 + it->min_depth > d) d = 1 + it->min_depth;
        }
    return at_most(d);
}

/* Every node's min_depth, by going over them until nothing changes (recursion makes the graph
 * cyclic): a choice among values takes its least, a value its required parts' most plus one. */
static void depths(glm_json_schema *S) {
    for (int i = 0; i < S->n_all; i++) S->all[i]->min_depth = 255;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < S->n_all; i++) {
            glm_json_schema_node *n = S->all[i];
            int d = 255;
            if (n->n_lits) d = 1;
            for (int k = 0; k < n->n_alts; k++) if (n->alts[k]->min_depth < d) d = n->alts[k]->min_depth;
            if (n->tagged)
                for (int k = 0; k < n->props[0]->n_lits; k++) {
                    const glm_json_schema_node *x = n->tagged[n->tag_of[k]];
                    if (x->min_depth < d) d = x->min_depth;
                }
            else if (!n->n_lits && !n->n_alts) {
                unsigned t = n->types;
                if (t & ~(unsigned)(GLM_ST_OBJECT | GLM_ST_ARRAY)) d = 1; /* a scalar */
                if ((t & GLM_ST_OBJECT) && glm_json_schema_need(n, '{') < d) d = glm_json_schema_need(n, '{');
                if ((t & GLM_ST_ARRAY) && glm_json_schema_need(n, '[') < d) d = glm_json_schema_need(n, '[');
            }
            if (d != n->min_depth) n->min_depth = (uint8_t)d, changed = 1;
        }
    }
}

int glm_json_schema_compile(glm_json_schema *out, const cJSON *s, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    cctx c = {.S = out, .root = s, .why = why, .cap = cap};
    out->root = compile(&c, s, "schema", 0);
    if (out->root && (out->root->types != GLM_ST_OBJECT || out->root->n_lits || out->root->n_alts))
        out->root = NULL, fail(&c, "schema", "the root must be {\"type\": \"object\", ...}");
    if (out->root) depths(out);
    if (out->root && out->root->min_depth > GLM_SCHEMA_MAX_DEPTH)
        out->root = NULL, fail(&c, "schema", "no value of it ends within 16 levels of nesting (a required property "
                               "that refers back to its own object never ends)");
    free(c.seen);
    free(c.node);
    if (!out->root) { glm_json_schema_free(out); return -1; }
    return 0;
}

void glm_json_schema_free(glm_json_schema *s) {
    for (int i = 0; i < s->n_all; i++) {
        glm_json_schema_node *n = s->all[i];
        for (int k = 0; k < n->n_props; k++) free(n->keys[k]);
        for (int k = 0; k < n->n_lits; k++) free(n->lits[k]);
        if (n->re) glm_regex_free(n->re);
        free(n->re);
        free(n->keys); free(n->props); free(n->required); free(n->lits); free(n->prefix); free(n->alts);
        free(n->tagged); free(n->tag_of);
        free(n);
    }
    free(s->all);
    memset(s, 0, sizeof *s);
}
