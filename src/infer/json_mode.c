/* JSON mode's recognizer and token masks (infer/json_mode.h). */
#include "infer/json_mode.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

/* Where the recognizer is. The modes before M_STR take whitespace between tokens. */
enum {
    M_TOP,       /* the start: the object's '{' */
    M_VALUE,     /* a value: after ':' or an array's ',' */
    M_ARR_FIRST, /* after '[': a value or ']' */
    M_OBJ_FIRST, /* after '{': a key or '}' */
    M_KEY,       /* after an object's ',': a key */
    M_COLON,     /* after a key */
    M_AFTER,     /* after a value: ',' or the container's closer */
    M_STR,       /* in a string */
    M_ESC,       /* after a backslash in a string */
    M_HEX,       /* in \uXXXX (sub: hex digits still to come) */
    M_LIT,       /* in true / false / null (sub: which, times 8, plus the letters read) */
    M_NUM,       /* in a number (sub: its step below) */
    M_DONE       /* the object is closed */
};
static const char *const LITERALS[3] = {"true", "false", "null"};

void glm_json_init(glm_json_state *s) { memset(s, 0, sizeof *s); }
int glm_json_done(const glm_json_state *s) { return s->mode == M_DONE; }

static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static int open_container(glm_json_state *s, char c) {
    if (s->depth >= GLM_JSON_MAX_DEPTH) return -1;
    s->stack[s->depth++] = c;
    s->mode = c == '{' ? M_OBJ_FIRST : M_ARR_FIRST;
    return 0;
}

static void value_ended(glm_json_state *s) { s->mode = s->depth == 0 ? M_DONE : M_AFTER; }

static int close_container(glm_json_state *s) {
    s->depth--;
    value_ended(s);
    return 0;
}

static int value_start(glm_json_state *s, unsigned c) {
    switch (c) {
    case '{': case '[': return open_container(s, (char)c);
    case '"': s->mode = M_STR; s->key = 0; return 0;
    case 't': s->mode = M_LIT; s->sub = 0 * 8 + 1; return 0;
    case 'f': s->mode = M_LIT; s->sub = 1 * 8 + 1; return 0;
    case 'n': s->mode = M_LIT; s->sub = 2 * 8 + 1; return 0;
    default:
        if (glm_json_number_first(c)) { s->mode = M_NUM; s->sub = glm_json_number_start(c); return 0; }
        return -1;
    }
}

int glm_json_number_byte(uint8_t *step, unsigned c, int real) {
    int d = c >= '0' && c <= '9', e = real && (c == 'e' || c == 'E'), dot = real && c == '.';
    switch (*step) {
    case GLM_NUM_MINUS: if (d) { *step = c == '0' ? GLM_NUM_ZERO : GLM_NUM_INT; return 0; } return -1;
    case GLM_NUM_ZERO: if (d) return -1; break; /* no leading zeros */
    case GLM_NUM_INT: if (d) return 0; break;
    case GLM_NUM_DOT: if (d) { *step = GLM_NUM_FRAC; return 0; } return -1;
    case GLM_NUM_FRAC: if (d) return 0; if (e) { *step = GLM_NUM_E; return 0; } return 1;
    case GLM_NUM_E: if (c == '+' || c == '-') { *step = GLM_NUM_ESIGN; return 0; } if (d) { *step = GLM_NUM_EXP; return 0; } return -1;
    case GLM_NUM_ESIGN: if (d) { *step = GLM_NUM_EXP; return 0; } return -1;
    case GLM_NUM_EXP: return d ? 0 : 1;
    }
    if (dot) { *step = GLM_NUM_DOT; return 0; } /* after the integer part */
    if (e) { *step = GLM_NUM_E; return 0; }
    return 1;
}

static int step(glm_json_state *s, unsigned c) {
    if (s->mode < M_STR && glm_json_space(c)) return ++s->space > GLM_JSON_MAX_SPACE ? -1 : 0;
    s->space = 0;
    switch (s->mode) {
    case M_TOP: return c == '{' ? open_container(s, '{') : -1;
    case M_VALUE: return value_start(s, c);
    case M_ARR_FIRST: return c == ']' ? close_container(s) : value_start(s, c);
    case M_OBJ_FIRST:
    case M_KEY:
        if (c == '}' && s->mode == M_OBJ_FIRST) return close_container(s);
        if (c != '"') return -1;
        s->mode = M_STR;
        s->key = 1;
        return 0;
    case M_COLON: if (c != ':') return -1; s->mode = M_VALUE; return 0;
    case M_AFTER: {
        char top = s->stack[s->depth - 1];
        if (c == ',') { s->mode = top == '{' ? M_KEY : M_VALUE; return 0; }
        if ((c == '}' && top == '{') || (c == ']' && top == '[')) return close_container(s);
        return -1;
    }
    case M_STR: {
        int u = glm_utf8_step(&s->u8need, &s->u8lo, &s->u8hi, c); /* well-formed UTF-8 only */
        if (u != 1) return u < 0 ? -1 : 0;
        if (c == '"') { if (s->key) s->mode = M_COLON; else value_ended(s); return 0; }
        if (c == '\\') { s->mode = M_ESC; return 0; }
        return c < 0x20 ? -1 : 0;
    }
    case M_ESC:
        if (c == 'u') { s->mode = M_HEX; s->sub = 4; return 0; }
        if (!strchr("\"\\/bfnrt", (int)c) || c == 0) return -1;
        s->mode = M_STR;
        return 0;
    case M_HEX:
        if (!is_hex(c)) return -1;
        if (--s->sub == 0) s->mode = M_STR;
        return 0;
    case M_LIT: {
        const char *w = LITERALS[s->sub / 8];
        int at = s->sub % 8;
        if ((unsigned char)w[at] != c) return -1;
        s->sub++;
        if (w[at + 1] == 0) value_ended(s);
        return 0;
    }
    case M_NUM: {
        int r = glm_json_number_byte(&s->sub, c, 1);
        if (r <= 0) return r;
        value_ended(s); /* inside a container (the text is an object): the byte comes after the number */
        return step(s, c);
    }
    default: return -1; /* M_DONE: nothing after the object but the end */
    }
}

int glm_json_feed(glm_json_state *s, const unsigned char *b, size_t n) {
    glm_json_state t = *s;
    for (size_t i = 0; i < n; i++)
        if (step(&t, b[i])) return -1;
    *s = t;
    return 0;
}

static int json_fits(const void *state, const unsigned char *b, size_t n) {
    glm_json_state t = *(const glm_json_state *)state;
    for (size_t i = 0; i < n; i++)
        if (step(&t, b[i])) return 0;
    return 1;
}

void glm_json_mask(const glm_text_vocab *v, const glm_json_state *s, const int32_t *ends, int n_ends, float *logits) {
    glm_recognizer r = {.state = s, .fits = json_fits, .done = glm_json_done(s), .in_string = s->mode == M_STR && !s->u8need,
                        .between = s->mode < M_STR, .room = GLM_JSON_MAX_SPACE - s->space};
    glm_text_vocab_mask(v, &r, ends, n_ends, logits);
}

void glm_json_advance(const glm_text_vocab *v, glm_json_state *s, int32_t id) {
    if (id < 0 || id >= v->V || !v->text[id]) return;
    glm_json_feed(s, (const unsigned char *)v->blob + v->off[id], v->off[id + 1] - v->off[id]);
}
