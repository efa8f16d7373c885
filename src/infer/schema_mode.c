/* Structured outputs' schema compiler, recognizer and token masks (infer/schema_mode.h). */
#include "infer/schema_mode.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "infer/json_mode.h"

/* ---------------------------------------------------------------- compiling */

static const char *const TYPES[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
static const char *const KNOWN[] = {"type", "properties", "required", "items", "minItems", "maxItems", "enum", "const",
                                    "title", "description", "default", "examples", "$schema", "additionalProperties",
                                    "$comment"};

static int fail(char *why, size_t cap, const char *path, const char *msg) {
    snprintf(why, cap, "%s: %s", path, msg);
    return -1;
}

static char *json_text(const cJSON *v) { return cJSON_PrintUnformatted(v); }

static glm_json_schema_node *new_node(glm_json_schema *S) {
    glm_json_schema_node *n = glm_calloc(1, sizeof *n);
    n->max_items = -1;
    S->all = glm_realloc(S->all, sizeof *S->all * (size_t)(S->n_all + 1));
    S->all[S->n_all++] = n;
    return n;
}

static int parse_types(const cJSON *t, unsigned *out, const char *path, char *why, size_t cap) {
    const cJSON *one = t;
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : 1;
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (cJSON_IsArray(t)) one = cJSON_GetArrayItem(t, i);
        int k = -1;
        for (int j = 0; j < 7 && cJSON_IsString(one); j++) if (!strcmp(one->valuestring, TYPES[j])) k = j;
        if (k < 0) return fail(why, cap, path, "\"type\" must name object, array, string, number, integer, boolean or null");
        *out |= 1u << k;
    }
    if ((*out & GLM_ST_NUMBER) && (*out & GLM_ST_INTEGER))
        return fail(why, cap, path, "\"type\" lists number and integer together (say number)");
    return 0;
}

static glm_json_schema_node *compile(glm_json_schema *S, const cJSON *s, const char *path, int depth, char *why, size_t cap) {
    char sub[512];
    if (!cJSON_IsObject(s)) return fail(why, cap, path, "a schema must be an object"), NULL;
    if (depth >= GLM_SCHEMA_MAX_DEPTH) return fail(why, cap, path, "nested deeper than 16 values"), NULL;
    for (const cJSON *k = s->child; k; k = k->next) {
        int known = 0;
        for (size_t j = 0; j < sizeof KNOWN / sizeof KNOWN[0]; j++) known |= !strcmp(k->string, KNOWN[j]);
        if (!known) {
            snprintf(sub, sizeof sub, "\"%.60s\" is not supported (a schema may use type, properties, required, items, "
                     "minItems, maxItems, enum and const)", k->string);
            return fail(why, cap, path, sub), NULL;
        }
    }
    glm_json_schema_node *n = new_node(S);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum"),
                *co = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (t && parse_types(t, &n->types, path, why, cap)) return NULL;
    if (en || co) { /* the values themselves: nothing else is written here */
        int m = en ? (cJSON_IsArray(en) ? cJSON_GetArraySize(en) : -1) : 1;
        if (m < 1 || m > GLM_SCHEMA_MAX_LITS) return fail(why, cap, path, "\"enum\" must list 1 to 64 values"), NULL;
        n->lits = glm_calloc((size_t)m, sizeof(char *));
        for (int i = 0; i < m; i++) n->lits[n->n_lits++] = json_text(en ? cJSON_GetArrayItem(en, i) : co);
        n->types = 0;
        return n;
    }
    if (!n->types) return fail(why, cap, path, "a \"type\" (or \"enum\" / \"const\") is needed"), NULL;
    if (n->types & GLM_ST_OBJECT) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(s, "properties"), *r = cJSON_GetObjectItemCaseSensitive(s, "required");
        if (!cJSON_IsObject(p) || !p->child)
            return fail(why, cap, path, "an object needs its \"properties\" (response_format json_object allows any object)"), NULL;
        int m = cJSON_GetArraySize(p);
        if (m > GLM_SCHEMA_MAX_LITS) return fail(why, cap, path, "more than 64 properties"), NULL;
        n->keys = glm_calloc((size_t)m, sizeof(char *));
        n->props = glm_calloc((size_t)m, sizeof *n->props);
        n->required = glm_calloc((size_t)m, 1);
        for (const cJSON *k = p->child; k; k = k->next) {
            cJSON *key = cJSON_CreateString(k->string);
            n->keys[n->n_props] = json_text(key);
            cJSON_Delete(key);
            snprintf(sub, sizeof sub, "%.400s.properties.%.60s", path, k->string);
            if (!(n->props[n->n_props++] = compile(S, k, sub, depth + 1, why, cap))) return NULL;
        }
        if (r && !cJSON_IsArray(r)) return fail(why, cap, path, "\"required\" must be a list of property names"), NULL;
        const cJSON *it;
        cJSON_ArrayForEach(it, r) {
            int hit = 0;
            for (int i = 0; i < n->n_props && cJSON_IsString(it); i++)
                if (!strcmp(p->child ? cJSON_GetArrayItem(p, i)->string : "", it->valuestring)) n->required[i] = 1, hit = 1;
            if (!hit) return fail(why, cap, path, "\"required\" names a property that \"properties\" does not have"), NULL;
        }
    }
    if (n->types & GLM_ST_ARRAY) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items"), *lo = cJSON_GetObjectItemCaseSensitive(s, "minItems"),
                    *hi = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        snprintf(sub, sizeof sub, "%.400s.items", path);
        if (!it) return fail(why, cap, path, "an array needs its \"items\" schema"), NULL;
        if (!(n->items = compile(S, it, sub, depth + 1, why, cap))) return NULL;
        if (lo && (!cJSON_IsNumber(lo) || lo->valuedouble < 0 || lo->valuedouble > 10000))
            return fail(why, cap, path, "\"minItems\" must be a count"), NULL;
        if (hi && (!cJSON_IsNumber(hi) || hi->valuedouble < 0 || hi->valuedouble > 10000))
            return fail(why, cap, path, "\"maxItems\" must be a count"), NULL;
        n->min_items = lo ? (int)lo->valuedouble : 0;
        n->max_items = hi ? (int)hi->valuedouble : -1;
        if (n->max_items >= 0 && n->max_items < n->min_items) return fail(why, cap, path, "\"maxItems\" is below \"minItems\""), NULL;
    }
    return n;
}

int glm_json_schema_compile(glm_json_schema *out, const cJSON *s, char *why, size_t cap) {
    memset(out, 0, sizeof *out);
    out->root = compile(out, s, "schema", 0, why, cap);
    if (out->root && (out->root->types != GLM_ST_OBJECT || out->root->n_lits))
        out->root = NULL, fail(why, cap, "schema", "the root must be {\"type\": \"object\", ...}");
    if (!out->root) { glm_json_schema_free(out); return -1; }
    return 0;
}

void glm_json_schema_free(glm_json_schema *s) {
    for (int i = 0; i < s->n_all; i++) {
        glm_json_schema_node *n = s->all[i];
        for (int k = 0; k < n->n_props; k++) free(n->keys[k]);
        for (int k = 0; k < n->n_lits; k++) free(n->lits[k]);
        free(n->keys); free(n->props); free(n->required); free(n->lits);
        free(n);
    }
    free(s->all);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- the recognizer */

enum {
    P_START,     /* a value's first byte */
    P_OBJ_OPEN,  /* after '{': a key or '}' */
    P_OBJ_KEY,   /* after ',': a key */
    P_COLON,     /* after a key */
    P_OBJ_AFTER, /* after a member: ',' or '}' */
    P_ARR_OPEN,  /* after '[': an item or ']' */
    P_ARR_AFTER, /* after an item: ',' or ']' */
    P_ARR_NEXT,  /* after ',': an item */
    P_KEY,       /* in a key (matched against the keys that may come) */
    P_LIT,       /* in an enum's value */
    P_STR, P_ESC, P_HEX, P_NUM, P_WORD
};
static const char *const WORDS[3] = {"true", "false", "null"};

static int takes_space(int phase) { return phase <= P_ARR_NEXT; }
static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

void glm_json_schema_start(glm_json_schema_state *st, const glm_json_schema *s) {
    memset(st, 0, sizeof *st);
    st->depth = 1;
    st->f[0].node = s->root;
    st->f[0].phase = P_START;
}

static int push(glm_json_schema_state *st, const glm_json_schema_node *n) {
    if (st->depth >= GLM_SCHEMA_MAX_DEPTH) return -1;
    glm_json_schema_frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->node = n;
    f->phase = P_START;
    return 0;
}

static void pop(glm_json_schema_state *st) {
    if (--st->depth == 0) st->done = 1;
}

/* The keys that may come next in an object frame: from its next property up to the first required one. */
static uint64_t key_candidates(const glm_json_schema_node *n, int next) {
    uint64_t c = 0;
    for (int k = next; k < n->n_props; k++) {
        c |= 1ull << k;
        if (n->required[k]) break;
    }
    return c;
}

static int required_left(const glm_json_schema_node *n, int next) {
    for (int k = next; k < n->n_props; k++) if (n->required[k]) return 1;
    return 0;
}

static int value_start(glm_json_schema_frame *f, unsigned c) {
    const glm_json_schema_node *n = f->node;
    if (n->n_lits) {
        uint64_t cand = 0;
        for (int i = 0; i < n->n_lits; i++) if ((unsigned char)n->lits[i][0] == c) cand |= 1ull << i;
        if (!cand) return -1;
        f->cand = cand;
        f->pos = 1;
        f->phase = P_LIT;
        return 0;
    }
    unsigned t = n->types;
    if (c == '{' && (t & GLM_ST_OBJECT)) { f->phase = P_OBJ_OPEN; f->next = 0; return 0; }
    if (c == '[' && (t & GLM_ST_ARRAY)) { f->phase = P_ARR_OPEN; f->next = 0; return 0; }
    if (c == '"' && (t & GLM_ST_STRING)) { f->phase = P_STR; return 0; }
    if (glm_json_number_first(c) && (t & (GLM_ST_NUMBER | GLM_ST_INTEGER))) {
        f->phase = P_NUM;
        f->sub = glm_json_number_start(c);
        return 0;
    }
    int w = c == 't' && (t & GLM_ST_BOOLEAN) ? 0 : c == 'f' && (t & GLM_ST_BOOLEAN) ? 1 : c == 'n' && (t & GLM_ST_NULL) ? 2 : -1;
    if (w < 0) return -1;
    f->phase = P_WORD;
    f->sub = (uint8_t)w;
    f->pos = 1;
    return 0;
}

static int step(glm_json_schema_state *st, unsigned c) {
    for (;;) { /* a value that ends at the byte after it (a number, an enum value) hands the byte up */
        if (st->depth == 0) return -1;
        glm_json_schema_frame *f = &st->f[st->depth - 1];
        const glm_json_schema_node *n = f->node;
        if (takes_space(f->phase) && glm_json_space(c)) return ++st->space > GLM_JSON_MAX_SPACE ? -1 : 0;
        if (!glm_json_space(c)) st->space = 0;
        switch (f->phase) {
        case P_START: return value_start(f, c);
        case P_OBJ_OPEN:
            if (c == '}' && !required_left(n, f->next)) { pop(st); return 0; }
            /* else a key, as after ',' */
            if (c != '"' || !key_candidates(n, f->next)) return -1;
            f->cand = key_candidates(n, f->next);
            f->pos = 1;
            f->phase = P_KEY;
            return 0;
        case P_OBJ_KEY:
            if (c != '"' || !key_candidates(n, f->next)) return -1;
            f->cand = key_candidates(n, f->next);
            f->pos = 1;
            f->phase = P_KEY;
            return 0;
        case P_KEY: {
            uint64_t cand = 0;
            for (int k = 0; k < n->n_props; k++)
                if ((f->cand >> k & 1) && (unsigned char)n->keys[k][f->pos] == c) cand |= 1ull << k;
            if (!cand) return -1;
            f->cand = cand;
            f->pos++;
            for (int k = 0; k < n->n_props; k++)
                if ((cand >> k & 1) && n->keys[k][f->pos] == 0) { f->prop = (uint8_t)k; f->next = (int16_t)(k + 1); f->phase = P_COLON; }
            return 0;
        }
        case P_COLON:
            if (c != ':') return -1;
            f->phase = P_OBJ_AFTER;
            return push(st, n->props[f->prop]);
        case P_OBJ_AFTER:
            if (c == ',' && f->next < n->n_props) { f->phase = P_OBJ_KEY; return 0; }
            if (c == '}' && !required_left(n, f->next)) { pop(st); return 0; }
            return -1;
        case P_ARR_OPEN:
            if (c == ']') { if (n->min_items > 0) return -1; pop(st); return 0; }
            /* fall into an item */
            if (n->max_items == 0) return -1;
            f->next++;
            f->phase = P_ARR_AFTER;
            if (push(st, n->items)) return -1;
            continue;
        case P_ARR_AFTER:
            if (c == ',' && (n->max_items < 0 || f->next < n->max_items)) { f->phase = P_ARR_NEXT; return 0; }
            if (c == ']' && f->next >= n->min_items) { pop(st); return 0; }
            return -1;
        case P_ARR_NEXT:
            f->next++;
            f->phase = P_ARR_AFTER;
            if (push(st, n->items)) return -1;
            continue;
        case P_LIT: {
            uint64_t cand = 0;
            int whole = 0;
            for (int i = 0; i < n->n_lits; i++) {
                if (!(f->cand >> i & 1)) continue;
                if (n->lits[i][f->pos] == 0) whole = 1;
                else if ((unsigned char)n->lits[i][f->pos] == c) cand |= 1ull << i;
            }
            if (cand) { f->cand = cand; f->pos++; return 0; }
            if (!whole) return -1;
            pop(st);
            continue;
        }
        case P_STR:
            if (c == '"') { pop(st); return 0; }
            if (c == '\\') { f->phase = P_ESC; return 0; }
            return c < 0x20 ? -1 : 0;
        case P_ESC:
            if (c == 'u') { f->phase = P_HEX; f->sub = 4; return 0; }
            if (c == 0 || !strchr("\"\\/bfnrt", (int)c)) return -1;
            f->phase = P_STR;
            return 0;
        case P_HEX:
            if (!is_hex(c)) return -1;
            if (--f->sub == 0) f->phase = P_STR;
            return 0;
        case P_NUM: {
            int r = glm_json_number_byte(&f->sub, c, (n->types & GLM_ST_NUMBER) != 0);
            if (r <= 0) return r;
            pop(st);
            continue;
        }
        case P_WORD: {
            const char *w = WORDS[f->sub];
            if ((unsigned char)w[f->pos] != c) return -1;
            if (w[++f->pos] == 0) pop(st);
            return 0;
        }
        default: return -1;
        }
    }
}

int glm_json_schema_feed(glm_json_schema_state *st, const unsigned char *b, size_t n) {
    glm_json_schema_state t = *st;
    for (size_t i = 0; i < n; i++)
        if (step(&t, b[i])) return -1;
    *st = t;
    return 0;
}

/* ---------------------------------------------------------------- masks */

static int schema_fits(const void *state, const unsigned char *b, size_t n) {
    glm_json_schema_state t = *(const glm_json_schema_state *)state;
    for (size_t i = 0; i < n; i++)
        if (step(&t, b[i])) return 0;
    return 1;
}

void glm_json_schema_mask(const glm_text_vocab *v, const glm_json_schema_state *st, const int32_t *ends, int n_ends,
                          float *logits) {
    int phase = st->done ? P_START : st->f[st->depth - 1].phase;
    glm_recognizer r = {.state = st, .fits = schema_fits, .done = st->done, .in_string = phase == P_STR,
                        .between = takes_space(phase), .room = GLM_JSON_MAX_SPACE - st->space};
    glm_text_vocab_mask(v, &r, ends, n_ends, logits);
}

void glm_json_schema_advance(const glm_text_vocab *v, glm_json_schema_state *st, int32_t id) {
    if (id < 0 || id >= v->V || !v->text[id]) return;
    glm_json_schema_feed(st, (const unsigned char *)v->blob + v->off[id], v->off[id + 1] - v->off[id]);
}
