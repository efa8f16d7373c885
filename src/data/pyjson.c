/* Python-compatible json.dumps over raw JSON text (pyjson.h). A small recursive reader that
 * writes each value the way CPython's json module would after json.loads: strings re-escaped
 * (ensure_ascii=False: only " \ and control characters), ints as written ("-0" is 0), floats
 * through repr() (the shortest digits that read back, "1.0", "1e-05", "Infinity"), objects with
 * a repeated key merged as a dict merges them, indent with "," and ": " separators. The same
 * walk writes repr(json.loads(text)) in Python's spelling. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/strbuf.h"
#include "data/pyjson.h"
#include "data/pyreader.h"


static int hex4(py_reader *r, unsigned *v) {
    if (r->i + 4 > r->n) return py_fail(r, "a \\u escape is cut short");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->s[r->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return py_fail(r, "a \\u escape with a non-hex digit");
        *v = *v * 16 + (unsigned)d;
    }
    return 0;
}

/* The string at r->i (on its '"'), decoded to UTF-8 into out (left empty on an error). */
static int read_string(py_reader *r, glm_strbuf *out) {
    int rc = 0;
    r->i++;
    for (;;) {
        if (r->i >= r->n) { rc = py_fail(r, "unterminated string"); break; }
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') { r->i++; break; }
        if (c < 0x20) { rc = py_fail(r, "a raw control character in a string"); break; }
        if (c != '\\') { glm_strbuf_put(out, r->s + r->i++, 1); continue; }
        if (++r->i >= r->n) { rc = py_fail(r, "unterminated string"); break; }
        char e = r->s[r->i++];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) { glm_strbuf_put(out, &"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"], 1); continue; }
        unsigned cp = 0, lo = 0; /* set by hex4 where it succeeds */
        if (e != 'u' || hex4(r, &cp)) { rc = py_fail(r, "a bad escape in a string"); break; }
        if (cp >= 0xD800 && cp <= 0xDBFF && r->i + 6 <= r->n && r->s[r->i] == '\\' && r->s[r->i + 1] == 'u') {
            size_t save = r->i;
            r->i += 2;
            if (hex4(r, &lo)) { rc = -1; break; }
            if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else r->i = save;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) { rc = py_fail(r, "a lone UTF-16 surrogate \\u%04x (no UTF-8 text)", cp); break; }
        glm_strbuf_utf8(out, cp);
    }
    if (rc) { free(out->s); *out = (glm_strbuf){0}; }
    return rc;
}

/* Python's ensure_ascii=False string: only " \ and characters below U+0020 are escaped. */
void glm_py_json_string(glm_strbuf *b, const char *s, size_t n) {
    glm_strbuf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                      : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!e && c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); e = u; }
        if (e) glm_strbuf_str(b, e); else glm_strbuf_put(b, s + i, 1);
    }
    glm_strbuf_put(b, "\"", 1);
}

/* repr(float): the shortest digits that read back, fixed notation for exponents -4 .. 15. */
void glm_py_float_repr(glm_strbuf *b, double v) {
    if (isnan(v)) { glm_strbuf_str(b, "NaN"); return; }
    if (isinf(v)) { glm_strbuf_str(b, v < 0 ? "-Infinity" : "Infinity"); return; }
    if (v == 0) { glm_strbuf_str(b, signbit(v) ? "-0.0" : "0.0"); return; }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    char digits[24], *m = e + (e[0] == '-');
    size_t nd = 0;
    for (char *q = m; *q && *q != 'e'; q++) if (*q != '.') digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = atoi(strchr(e, 'e') + 1) + 1;
    if (v < 0) glm_strbuf_put(b, "-", 1);
    if (decpt <= -4 || decpt > 16) { /* d.ddde+XX */
        char ex[16];
        glm_strbuf_put(b, digits, 1);
        if (nd > 1) { glm_strbuf_put(b, ".", 1); glm_strbuf_put(b, digits + 1, nd - 1); }
        snprintf(ex, sizeof ex, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        glm_strbuf_str(b, ex);
    } else if (decpt <= 0) { /* 0.000ddd */
        glm_strbuf_str(b, "0.");
        for (int k = 0; k < -decpt; k++) glm_strbuf_put(b, "0", 1);
        glm_strbuf_put(b, digits, nd);
    } else if ((size_t)decpt >= nd) { /* ddd000.0 */
        glm_strbuf_put(b, digits, nd);
        for (size_t k = nd; k < (size_t)decpt; k++) glm_strbuf_put(b, "0", 1);
        glm_strbuf_str(b, ".0");
    } else { /* dd.ddd */
        glm_strbuf_put(b, digits, (size_t)decpt);
        glm_strbuf_put(b, ".", 1);
        glm_strbuf_put(b, digits + decpt, nd - (size_t)decpt);
    }
}

/* A number as JSON writes it (Python's NUMBER_RE): an int keeps its digits, else a float. */
static int dump_number(py_reader *r, glm_strbuf *b) {
    size_t s = r->i, i = s;
    int is_float = 0;
    if (i < r->n && r->s[i] == '-') i++;
    if (i < r->n && r->s[i] == '0') i++;
    else if (i < r->n && r->s[i] >= '1' && r->s[i] <= '9') while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') i++;
    else return py_fail(r, "a bad number");
    if (i < r->n && r->s[i] == '.') {
        is_float = 1;
        if (++i >= r->n || r->s[i] < '0' || r->s[i] > '9') return py_fail(r, "a bad number");
        while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') i++;
    }
    if (i < r->n && (r->s[i] == 'e' || r->s[i] == 'E')) {
        is_float = 1;
        if (++i < r->n && (r->s[i] == '+' || r->s[i] == '-')) i++;
        if (i >= r->n || r->s[i] < '0' || r->s[i] > '9') return py_fail(r, "a bad number");
        while (i < r->n && r->s[i] >= '0' && r->s[i] <= '9') i++;
    }
    r->i = i;
    if (!b) return 0;
    if (is_float) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(i - s < sizeof tmp ? i - s : sizeof tmp - 1), r->s + s);
        glm_py_float_repr(b, strtod(tmp, NULL));
    } else if (i - s == 2 && r->s[s] == '-' && r->s[s + 1] == '0') {
        glm_strbuf_str(b, "0");
    } else {
        glm_strbuf_put(b, r->s + s, i - s);
    }
    return 0;
}

/* Before a member or element: its separator (the opening bracket for the first) and, with an
 * indent, a new line at the level; without one (indent < 0) json.dumps' default ", ". */
static void newline(glm_strbuf *b, int indent, int level) {
    if (indent < 0) return;
    glm_strbuf_put(b, "\n", 1);
    for (int k = 0; k < indent * level; k++) glm_strbuf_put(b, " ", 1);
}
static void item_sep(glm_strbuf *b, int indent, int first, const char *open) {
    if (first) glm_strbuf_str(b, open);
    else glm_strbuf_str(b, indent < 0 ? ", " : ",");
}

/* The format characters and separators of U+2000..U+2FFF and U+FEFF that Python's repr escapes
 * (\u200b..\u200f, \u2028..\u202e, \u2060..\u2064, \ufeff), from their UTF-8 bytes. */
static int unprintable3(unsigned char a, unsigned char b, unsigned char c) {
    if (a == 0xEF) return b == 0xBB && c == 0xBF;
    if (b == 0x80) return (c >= 0x8B && c <= 0x8F) || (c >= 0xA8 && c <= 0xAE);
    return b == 0x81 && c >= 0xA0 && c <= 0xA4;
}

/* Python's repr(str): single quotes unless the text holds ' and no ", backslash escapes for the
 * quote, \\, \t \n \r and other control characters (\xNN), the rest as is (Python keeps printable
 * non-ASCII text; U+0080..U+00A0 and U+00AD, which it does not, become \xNN). */
static void repr_string(glm_strbuf *b, const char *s, size_t n) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    glm_strbuf_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char u[8];
        if (c == '\\' || c == (unsigned char)q) { u[0] = '\\'; u[1] = (char)c; glm_strbuf_put(b, u, 2); }
        else if (c == '\t') glm_strbuf_str(b, "\\t");
        else if (c == '\n') glm_strbuf_str(b, "\\n");
        else if (c == '\r') glm_strbuf_str(b, "\\r");
        else if (c < 0x20 || c == 0x7f) { snprintf(u, sizeof u, "\\x%02x", c); glm_strbuf_str(b, u); }
        else if (c == 0xC2 && i + 1 < n && (((unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0xA0) ||
                                            (unsigned char)s[i + 1] == 0xAD)) {
            snprintf(u, sizeof u, "\\x%02x", (unsigned char)s[++i]);
            glm_strbuf_str(b, u);
        } else if ((c == 0xE2 || c == 0xEF) && i + 2 < n && unprintable3(c, (unsigned char)s[i + 1], (unsigned char)s[i + 2])) {
            unsigned cp = (c & 0x0Fu) << 12 | ((unsigned char)s[i + 1] & 0x3Fu) << 6 | ((unsigned char)s[i + 2] & 0x3Fu);
            snprintf(u, sizeof u, "\\u%04x", cp);
            glm_strbuf_str(b, u);
            i += 2;
        } else glm_strbuf_put(b, s + i, 1);
    }
    glm_strbuf_put(b, &q, 1);
}

/* The walker below writes json.dumps (indent >= 0, or < 0 for none) or, with indent PY_REPR,
 * repr(json.loads(text)): Python's quotes and words, ", " and ": " as without an indent. */
enum { PY_REPR = -2 };

/* A str as the walker's style writes it. */
static void put_string(glm_strbuf *b, const char *s, size_t n, int indent) {
    if (indent == PY_REPR) repr_string(b, s, n);
    else glm_py_json_string(b, s, n);
}

/* One object member: its key and its value's dump. */
typedef struct member { glm_strbuf key, val; } member;

static int dump_value(py_reader *r, glm_strbuf *b, int indent, int level);

static int dump_object(py_reader *r, glm_strbuf *b, int indent, int level) {
    member *m = NULL;
    int nm = 0, rc = 0;
    r->i++;
    py_ws(r);
    if (r->i < r->n && r->s[r->i] == '}') r->i++;
    else for (;;) {
        py_ws(r);
        if (r->i >= r->n || r->s[r->i] != '"') { rc = py_fail(r, "an object key is not a string"); break; }
        glm_strbuf key = {0}, val = {0};
        if (read_string(r, &key)) { rc = -1; break; }
        py_ws(r);
        if (r->i >= r->n || r->s[r->i] != ':') { free(key.s); rc = py_fail(r, "':' missing after an object key"); break; }
        r->i++;
        if (dump_value(r, &val, indent, level + 1)) { free(key.s); free(val.s); rc = -1; break; }
        int k = 0; /* a repeated key keeps its place, with the last value (a dict) */
        while (k < nm && !(m[k].key.n == key.n && (key.n == 0 || !memcmp(m[k].key.s, key.s, key.n)))) k++;
        if (k < nm) { free(m[k].val.s); m[k].val = val; free(key.s); }
        else { m = glm_realloc(m, sizeof *m * (size_t)(nm + 1)); m[nm++] = (member){key, val}; }
        py_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
        if (r->i < r->n && r->s[r->i] == '}') { r->i++; break; }
        rc = py_fail(r, "',' or '}' missing in an object");
        break;
    }
    if (!rc && nm == 0) glm_strbuf_str(b, "{}");
    for (int k = 0; !rc && k < nm; k++) {
        item_sep(b, indent, k == 0, "{");
        newline(b, indent, level + 1);
        put_string(b, m[k].key.s ? m[k].key.s : "", m[k].key.n, indent);
        glm_strbuf_str(b, ": ");
        glm_strbuf_put(b, m[k].val.s ? m[k].val.s : "", m[k].val.n);
    }
    if (!rc && nm) { newline(b, indent, level); glm_strbuf_put(b, "}", 1); }
    for (int k = 0; k < nm; k++) { free(m[k].key.s); free(m[k].val.s); }
    free(m);
    return rc;
}

static int dump_array(py_reader *r, glm_strbuf *b, int indent, int level) {
    r->i++;
    py_ws(r);
    if (r->i < r->n && r->s[r->i] == ']') { r->i++; glm_strbuf_str(b, "[]"); return 0; }
    for (int k = 0;; k++) {
        item_sep(b, indent, k == 0, "[");
        newline(b, indent, level + 1);
        if (dump_value(r, b, indent, level + 1)) return -1;
        py_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; continue; }
        if (r->i < r->n && r->s[r->i] == ']') { r->i++; break; }
        return py_fail(r, "',' or ']' missing in a list");
    }
    newline(b, indent, level);
    glm_strbuf_put(b, "]", 1);
    return 0;
}

/* JSON's word at r->i, written as itself or as `as` (Python's spelling) when not NULL. */
static int literal(py_reader *r, glm_strbuf *b, const char *word, const char *as) {
    size_t n = strlen(word);
    if (r->i + n > r->n || memcmp(r->s + r->i, word, n)) return py_fail(r, "an unknown word");
    r->i += n;
    if (b) glm_strbuf_str(b, as ? as : word);
    return 0;
}

static int dump_value(py_reader *r, glm_strbuf *b, int indent, int level) {
    py_ws(r);
    if (r->i >= r->n) return py_fail(r, "a value is missing");
    char c = r->s[r->i];
    if (c == '{') return dump_object(r, b, indent, level);
    if (c == '[') return dump_array(r, b, indent, level);
    if (c == '"') {
        glm_strbuf s = {0};
        if (read_string(r, &s)) return -1;
        put_string(b, s.s ? s.s : "", s.n, indent);
        free(s.s);
        return 0;
    }
    int repr = indent == PY_REPR;
    if (c == 't') return literal(r, b, "true", repr ? "True" : NULL);
    if (c == 'f') return literal(r, b, "false", repr ? "False" : NULL);
    if (c == 'n') return literal(r, b, "null", repr ? "None" : NULL);
    if (!repr) return dump_number(r, b);
    glm_strbuf num = {0}; /* an int as written, a float as repr(float) */
    if (dump_number(r, &num)) { free(num.s); return -1; }
    const char *word = !strcmp(num.s, "Infinity") ? "inf" : !strcmp(num.s, "-Infinity") ? "-inf" : NULL;
    if (word) glm_strbuf_str(b, word); /* an out-of-range literal reads as inf: repr's spelling */
    else glm_strbuf_put(b, num.s, num.n);
    free(num.s);
    return 0;
}

char *glm_pyjson_dumps(const char *text, size_t len, int indent, char *why, size_t why_len) {
    py_reader r = {text, len, 0, why, why_len};
    if (why && why_len) why[0] = 0;
    glm_strbuf b = {0};
    if (dump_value(&r, &b, indent, 0)) { free(b.s); return NULL; }
    py_ws(&r);
    if (r.i < r.n) { py_fail(&r, "data after the value"); free(b.s); return NULL; }
    if (!b.s) glm_strbuf_put(&b, "", 0);
    return b.s;
}

char *glm_pyjson_repr(const char *text, size_t len, char *why, size_t why_len) {
    py_reader r = {text, len, 0, why, why_len};
    if (why && why_len) why[0] = 0;
    glm_strbuf b = {0};
    if (dump_value(&r, &b, PY_REPR, 0)) { free(b.s); return NULL; }
    py_ws(&r);
    if (r.i < r.n) { py_fail(&r, "data after the value"); free(b.s); return NULL; }
    return b.s;
}

/* The value (and, in an object, the key) of member `key` or, with key NULL, of item idx of the
 * object (object 1) or array (0) in text[0..len). */
static int locate(const char *text, size_t len, int object, const char *key, int idx, size_t *ks, size_t *ke, size_t *vs,
                  size_t *ve) {
    py_reader r = {text, len, 0, NULL, 0};
    glm_strbuf skip = {0};
    py_ws(&r);
    char open = object ? '{' : '[', close = object ? '}' : ']';
    if (r.i >= r.n || r.s[r.i] != open) return -1;
    r.i++;
    py_ws(&r);
    int rc = -1;
    for (int k = 0; r.i < r.n && r.s[r.i] != close; k++) {
        int hit = !key && k == idx;
        size_t k0 = r.i;
        if (object) {
            glm_strbuf name = {0};
            if (r.s[r.i] != '"' || read_string(&r, &name)) break;
            if (key) hit = name.n == strlen(key) && !memcmp(name.s, key, name.n);
            free(name.s);
            if (hit) { *ks = k0; *ke = r.i; }
            py_ws(&r);
            if (r.i >= r.n || r.s[r.i] != ':') break;
            r.i++;
        }
        py_ws(&r);
        size_t s = r.i;
        skip.n = 0;
        if (dump_value(&r, &skip, 0, 0)) break;
        if (hit) { *vs = s; *ve = r.i; rc = 0; break; }
        py_ws(&r);
        if (r.i < r.n && r.s[r.i] == ',') { r.i++; py_ws(&r); }
    }
    free(skip.s);
    return rc;
}

int glm_json_locate(const char *text, size_t len, const char *key, int idx, size_t *vs, size_t *ve) {
    size_t ks, ke;
    return locate(text, len, key != NULL, key, idx, &ks, &ke, vs, ve);
}

int glm_json_member(const char *text, size_t len, int idx, size_t *ks, size_t *ke, size_t *vs, size_t *ve) {
    return locate(text, len, 1, NULL, idx, ks, ke, vs, ve);
}
