/* Structured outputs' recognizer and token masks (infer/schema_mode.h; the compiler is schema_compile.c). */
#include "infer/schema_mode.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "infer/json_mode.h"

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
/* A map's keys: any string. */
static const glm_json_schema_node MAP_KEY = {.types = GLM_ST_STRING, .classes = GLM_ST_STRING, .max_len = -1, .max_items = -1};

static int takes_space(int phase) { return phase <= P_ARR_NEXT; }
static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static int hex_value(unsigned c) {
    return is_digit(c) ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10) : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
}

void glm_json_schema_start(glm_json_schema_state *st, const glm_json_schema *s) {
    memset(st, 0, sizeof *st);
    st->depth = 1;
    st->f[0].node = s->root;
    st->f[0].phase = P_START;
}

static int push(glm_json_schema_state *st, const glm_json_schema_node *n) {
    if (!n || st->depth >= GLM_SCHEMA_MAX_DEPTH) return -1;
    glm_json_schema_frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->node = n;
    f->phase = P_START;
    return 0;
}

/* A value of node n can still end when it starts in a frame at index `at` (depth counted below it). */
static int room_for(int at, int need) { return at + need <= GLM_SCHEMA_MAX_DEPTH; }

static void pop(glm_json_schema_state *st) {
    if (--st->depth == 0) st->done = 1;
}

/* The keys that may come next in an object frame (its node n at the top of st): from its next
 * property up to the first required one, an optional one only where its value has room to end. */
static uint64_t key_candidates(const glm_json_schema_state *st, const glm_json_schema_node *n, int next) {
    uint64_t c = 0;
    for (int k = next; k < n->n_props; k++) {
        if (n->required[k] || room_for(st->depth, n->props[k]->min_depth)) c |= 1ull << k;
        if (n->required[k]) break;
    }
    return c;
}

static int required_left(const glm_json_schema_node *n, int next) {
    for (int k = next; k < n->n_props; k++) if (n->required[k]) return 1;
    return 0;
}

/* ---- bounded numbers: written without an exponent, with at most 18 digits; the frame keeps the
 * digits (cand), the fraction's length (prop) and the sign (pos). A byte is taken while some way of
 * going on still ends inside the bounds, and the number ends only inside them; values are compared
 * as Python's jsonschema compares them: an integer exactly, a fraction as the double float() makes
 * of its text. (An integer type's bounds are whole and inclusive: schema_compile.c.) */
#define NUM_DIGITS_MAX 100000000000000000ull /* 10^17: digits before the last one */
#define NUM_FRAC_MAX 60

static int bounded(const glm_json_schema_node *n) { return n->has_lo || n->has_hi; }

/* The double of the text "m / 10^frac" (frac >= 1 digits after the point), as strtod reads it. */
static long double fraction_value(uint64_t m, int frac) {
    static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                                     1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    /* Both exact in a double, so the one correctly rounded division is strtod's answer (Clinger's
     * fast path); otherwise strtod reads the text. */
    if (m < (1ull << 53) && frac <= 22) return (long double)((double)m / POW10[frac]);
    char d[24], t[96];
    int nd = snprintf(d, sizeof d, "%llu", (unsigned long long)m), k = 0;
    if (nd <= frac) {
        t[k++] = '0';
        t[k++] = '.';
        for (int i = nd; i < frac; i++) t[k++] = '0';
        memcpy(t + k, d, (size_t)nd + 1);
    } else {
        memcpy(t, d, (size_t)(nd - frac));
        k = nd - frac;
        t[k++] = '.';
        memcpy(t + k, d + nd - frac, (size_t)frac + 1);
    }
    return (long double)strtod(t, NULL);
}

static int below_hi(const glm_json_schema_node *n, long double v) { return !n->has_hi || v < n->hi || (v == n->hi && !n->hi_excl); }
static int above_lo(const glm_json_schema_node *n, long double v) { return !n->has_lo || v > n->lo || (v == n->lo && !n->lo_excl); }

/* Some value whose magnitude lies in [a, b) (a reached, b approached; b < 0: no end) is inside n's
 * bounds. */
static int span_fits(const glm_json_schema_node *n, int neg, long double a, long double b) {
    if (!neg) return below_hi(n, a) && (!n->has_lo || b < 0 || b > n->lo);
    return above_lo(n, -a) && (!n->has_hi || b < 0 || -b < n->hi); /* values in (-b, -a] */
}

/* The number written so far (its step, digits m, fraction length frac) can still end inside n's bounds. */
static int num_can_fit(const glm_json_schema_node *n, int neg, uint64_t m, int frac, int step) {
    switch (step) {
    case GLM_NUM_MINUS: return span_fits(n, 1, 0, -1);
    case GLM_NUM_ZERO: return span_fits(n, neg, 0, 1);
    case GLM_NUM_DOT: return span_fits(n, neg, (long double)m, (long double)m + 1);
    case GLM_NUM_FRAC: return span_fits(n, neg, fraction_value(m, frac), fraction_value(m + 1, frac));
    case GLM_NUM_INT: /* more digits, or a fraction: [m 10^k, (m + 1) 10^k) for some k */
        for (long double a = (long double)m, b = a + 1; a < NUM_DIGITS_MAX * 10.0L; a *= 10, b *= 10)
            if (span_fits(n, neg, a, b)) return 1;
        return 0;
    }
    return 0;
}

static int num_ends_inside(const glm_json_schema_frame *f) {
    long double v = f->sub == GLM_NUM_FRAC ? fraction_value(f->cand, f->prop) : (long double)f->cand;
    if (f->pos & 1) v = -v;
    return above_lo(f->node, v) && below_hi(f->node, v);
}

static int num_byte(glm_json_schema_frame *f, unsigned c) {
    const glm_json_schema_node *n = f->node;
    int real = (n->types & GLM_ST_NUMBER) != 0;
    if (!bounded(n)) return glm_json_number_byte(&f->sub, c, real);
    if (c == 'e' || c == 'E') return -1;
    uint8_t step = f->sub;
    int r = glm_json_number_byte(&step, c, real);
    if (r < 0) return -1;
    if (r == 1) return num_ends_inside(f) ? 1 : -1;
    uint64_t m = f->cand;
    int frac = f->prop;
    if (is_digit(c)) {
        if (m >= NUM_DIGITS_MAX) return -1;
        m = m * 10 + (c - '0');
        if (step == GLM_NUM_FRAC && ++frac > NUM_FRAC_MAX) return -1;
    }
    if (!num_can_fit(n, f->pos & 1, m, frac, step)) return -1;
    f->sub = step;
    f->cand = m;
    f->prop = (uint8_t)frac;
    return 0;
}

/* Literal i of frame f's node may be written: unless it is a discriminator (infer/schema_compile.c
 * tag_objects), whose object then takes the frame below f and needs room to end there, or an item
 * of a uniqueItems array that has it already (the array frame's cand). */
static int lit_allowed(const glm_json_schema_state *st, const glm_json_schema_frame *f, int i) {
    const glm_json_schema_frame *up = f > st->f ? f - 1 : NULL;
    if (up && up->node->unique && up->phase == P_ARR_AFTER) return !(up->cand >> i & 1);
    if (!up || !up->node->tagged || up->node->props[0] != f->node) return 1;
    return room_for((int)(up - st->f), up->node->tagged[up->node->tag_of[i]]->min_depth);
}

static int value_start(glm_json_schema_state *st, glm_json_schema_frame *f, unsigned c) {
    const glm_json_schema_node *n = f->node;
    if (n->n_alts) { /* the alternative whose type starts with c */
        unsigned cl = c == '{' ? GLM_ST_OBJECT : c == '[' ? GLM_ST_ARRAY : c == '"' ? GLM_ST_STRING
                    : glm_json_number_first(c) ? GLM_ST_NUMBER : c == 't' || c == 'f' ? GLM_ST_BOOLEAN
                    : c == 'n' ? GLM_ST_NULL : 0;
        for (int i = 0; i < n->n_alts; i++)
            if (n->alts[i]->classes & cl) { /* (its own start checks the room it needs) */
                f->node = n->alts[i];
                return value_start(st, f, c);
            }
        return -1;
    }
    if (n->n_lits) {
        uint64_t cand = 0;
        for (int i = 0; i < n->n_lits; i++) if ((unsigned char)n->lits[i][0] == c && lit_allowed(st, f, i)) cand |= 1ull << i;
        if (!cand) return -1;
        f->cand = cand;
        f->pos = 1;
        f->phase = P_LIT;
        return 0;
    }
    unsigned t = n->types;
    if ((c == '{' || c == '[') && !room_for((int)(f - st->f), glm_json_schema_need(n, c))) return -1;
    if (c == '{' && (t & GLM_ST_OBJECT)) { f->phase = P_OBJ_OPEN; f->next = 0; return 0; }
    if (c == '[' && (t & GLM_ST_ARRAY)) { f->phase = P_ARR_OPEN; f->next = 0; f->cand = 0; return 0; }
    if (c == '"' && (t & GLM_ST_STRING)) {
        f->phase = P_STR; f->next = 0; f->cand = 0; f->sub = 0;
        if (n->re) { glm_regex_start(n->re, st->re); memset(&st->re_text, 0, sizeof st->re_text); }
        return 0;
    }
    if (glm_json_number_first(c) && (t & (GLM_ST_NUMBER | GLM_ST_INTEGER))) {
        f->sub = glm_json_number_start(c);
        f->pos = c == '-';
        f->cand = is_digit(c) ? c - '0' : 0;
        f->prop = 0;
        if (bounded(n) && !num_can_fit(n, f->pos, f->cand, 0, f->sub)) return -1;
        f->phase = P_NUM;
        return 0;
    }
    int w = c == 't' && (t & GLM_ST_BOOLEAN) ? 0 : c == 'f' && (t & GLM_ST_BOOLEAN) ? 1 : c == 'n' && (t & GLM_ST_NULL) ? 2 : -1;
    if (w < 0) return -1;
    f->phase = P_WORD;
    f->sub = (uint8_t)w;
    f->pos = 1;
    return 0;
}

/* A key after '{' or ',': one of the properties that may come, or a map's any key. */
static int key_start(glm_json_schema_state *st, glm_json_schema_frame *f, unsigned c) {
    const glm_json_schema_node *n = f->node;
    if (c != '"') return -1;
    if (!n->n_props) { /* a map: the key is a string of its own, then the value */
        if (!n->extra || !room_for(st->depth, n->extra->min_depth) || (n->max_props >= 0 && f->next >= n->max_props))
            return -1;
        f->next++; /* (a map's keys so far) */
        f->phase = P_COLON;
        if (push(st, &MAP_KEY)) return -1;
        return value_start(st, &st->f[st->depth - 1], c);
    }
    if (!key_candidates(st, n, f->next)) return -1;
    f->cand = key_candidates(st, n, f->next);
    f->pos = 1;
    f->phase = P_KEY;
    return 0;
}

/* The node of an array's item number i (0-based); NULL where none may come. */
static const glm_json_schema_node *item_node(const glm_json_schema_node *n, int i) {
    if (n->max_items >= 0 && i >= n->max_items) return NULL;
    return i < n->n_prefix ? n->prefix[i] : n->items;
}

/* A backslash may start an escape the pattern takes: some code point \uXXXX can write. */
static int escape_may_come(const glm_regex *re, const uint64_t *set) { return glm_regex_may_take(re, set, 0, 0xFFFF); }

/* Item i of array node n (the top frame of st) may come and has room to end. */
static int item_fits(const glm_json_schema_state *st, const glm_json_schema_node *n, int i) {
    const glm_json_schema_node *it = item_node(n, i);
    return it && (i < n->min_items || room_for(st->depth, it->min_depth)); /* (uniqueItems: max_items is its values' count) */
}

/* A string's byte c: well-formed UTF-8 only (so that the answer's text is what was recognized, with
 * no replacement characters), characters counted as Python's len counts the decoded text (a UTF-8
 * sequence is one, an escape is one, a \u escape of a low surrogate after a high one joins it). */
static int string_byte(glm_json_schema_state *st, glm_json_schema_frame *f, unsigned c) {
    const glm_json_schema_node *n = f->node;
    switch (f->phase) {
    case P_STR: {
        uint8_t lo = (uint8_t)(f->pos >> 8), hi = (uint8_t)f->pos;
        int u = glm_utf8_step(&f->sub, &lo, &hi, c); /* (sub, pos: the character's bytes to come) */
        f->pos = (uint16_t)(lo << 8 | hi);
        if (u < 0) return -1;
        if (n->re && (u != 1 || (c != '"' && c != '\\')) && glm_regex_byte(n->re, st->re, &st->re_text, c)) return -1;
        if (u == 0) return 0;
        if (u == 2) { /* a character of several bytes */
            if (n->max_len >= 0 && f->next >= n->max_len) return -1;
            f->next++;
            f->cand = 0;
            return 0;
        }
        if (c == '"') {
            if (f->next < n->min_len || (n->re && !glm_regex_accepts(n->re, st->re))) return -1;
            pop(st);
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\' && n->re && !escape_may_come(n->re, st->re)) return -1;
        /* (at the limit, an escape after a high surrogate may still be the low one that joins it) */
        if (n->max_len >= 0 && f->next >= n->max_len && !(c == '\\' && f->cand)) return -1;
        f->next++;
        if (c == '\\') f->phase = P_ESC;
        else f->cand = 0;
        return 0;
    }
    case P_ESC: {
        int over = n->max_len >= 0 && f->next > n->max_len; /* only the joining low surrogate fits */
        if (c == 'u') { f->phase = P_HEX; f->sub = 4; f->pos = 0; return 0; }
        if (over || c == 0 || !strchr("\"\\/bfnrt", (int)c)) return -1;
        if (n->re && glm_regex_step(n->re, st->re, (uint32_t)(c == 'b' ? 8 : c == 'f' ? 12 : c == 'n' ? 10 : c == 'r' ? 13 : c == 't' ? 9 : c)))
            return -1;
        f->phase = P_STR;
        f->cand = 0;
        return 0;
    }
    default: { /* P_HEX */
        int h = hex_value(c);
        if (h < 0) return -1;
        if (n->max_len >= 0 && f->next > n->max_len && ((f->sub == 4 && h != 0xD) || (f->sub == 3 && h < 0xC)))
            return -1; /* over the limit unless it is DC00-DFFF */
        f->pos = (uint16_t)(f->pos * 16 + h);
        --f->sub;
        if (n->re) { /* a pattern's string: a value it can take (its classes hold no surrogates) */
            uint32_t lo = (uint32_t)f->pos << (4 * f->sub), hi = lo | ((1u << (4 * f->sub)) - 1);
            if (!glm_regex_may_take(n->re, st->re, lo, hi) || (!f->sub && glm_regex_step(n->re, st->re, f->pos))) return -1;
        }
        if (f->sub) return 0;
        f->phase = P_STR;
        int joins = f->cand && f->pos >= 0xDC00 && f->pos <= 0xDFFF;
        if (joins) f->next--;
        f->cand = !joins && f->pos >= 0xD800 && f->pos <= 0xDBFF;
        return 0;
    }
    }
}

static int step(glm_json_schema_state *st, unsigned c) {
    for (;;) { /* a value that ends at the byte after it (a number, an enum value) hands the byte up */
        if (st->depth == 0) return -1;
        glm_json_schema_frame *f = &st->f[st->depth - 1];
        const glm_json_schema_node *n = f->node;
        if (takes_space(f->phase) && glm_json_space(c)) return ++st->space > GLM_JSON_MAX_SPACE ? -1 : 0;
        if (!glm_json_space(c)) st->space = 0;
        switch (f->phase) {
        case P_START: return value_start(st, f, c);
        case P_OBJ_OPEN:
            if (c == '}' && !required_left(n, f->next) && (n->n_props || f->next >= n->min_props)) { pop(st); return 0; }
            return key_start(st, f, c);
        case P_OBJ_KEY: return key_start(st, f, c);
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
            return push(st, n->n_props ? n->props[f->prop] : n->extra);
        case P_OBJ_AFTER:
            if (c == ',' && (n->n_props ? f->next < n->n_props : n->max_props < 0 || f->next < n->max_props)) {
                f->phase = P_OBJ_KEY;
                return 0;
            }
            if (c == '}' && !required_left(n, f->next) && (n->n_props || f->next >= n->min_props)) { pop(st); return 0; }
            return -1;
        case P_ARR_OPEN:
            if (c == ']') { if (n->min_items > 0) return -1; pop(st); return 0; }
            /* fall into an item */
            f->phase = P_ARR_AFTER;
            if (!item_fits(st, n, f->next) || push(st, item_node(n, f->next++))) return -1;
            continue;
        case P_ARR_AFTER:
            if (c == ',' && item_fits(st, n, f->next)) { f->phase = P_ARR_NEXT; return 0; }
            if (c == ']' && f->next >= n->min_items) { pop(st); return 0; }
            return -1;
        case P_ARR_NEXT:
            f->phase = P_ARR_AFTER;
            if (push(st, item_node(n, f->next++))) return -1;
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
            glm_json_schema_frame *up = st->depth ? &st->f[st->depth - 1] : NULL;
            for (int i = 0; up && i < n->n_lits; i++) {
                if (!(f->cand >> i & 1) || n->lits[i][f->pos] != 0) continue; /* (the value written) */
                if (up->node->unique) up->cand |= 1ull << i;                    /* a uniqueItems array has it now */
                else if (up->node->tagged && up->node->props[0] == n) {         /* a discriminator: its object on */
                    up->node = up->node->tagged[up->node->tag_of[i]];
                    up->next = 1;
                }
            }
            continue;
        }
        case P_STR: case P_ESC: case P_HEX: return string_byte(st, f, c);
        case P_NUM: {
            int r = num_byte(f, c);
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
    const glm_json_schema_frame *f = st->done ? NULL : &st->f[st->depth - 1];
    /* (in the middle of a character, a string's tokens go through the recognizer) */
    /* (and a string with a pattern) */
    int in_string = phase == P_STR && !f->sub && !f->node->re, limited = in_string && f->node->max_len >= 0;
    glm_recognizer r = {.state = st, .fits = schema_fits, .done = st->done, .in_string = in_string, .limited = limited,
                        .chars_left = limited ? f->node->max_len - f->next : 0,
                        .between = takes_space(phase), .room = GLM_JSON_MAX_SPACE - st->space};
    glm_text_vocab_mask(v, &r, ends, n_ends, logits);
}

void glm_json_schema_advance(const glm_text_vocab *v, glm_json_schema_state *st, int32_t id) {
    if (id < 0 || id >= v->V || !v->text[id]) return;
    glm_json_schema_feed(st, (const unsigned char *)v->blob + v->off[id], v->off[id + 1] - v->off[id]);
}
