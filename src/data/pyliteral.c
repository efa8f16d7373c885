/* Python literals to JSON text (pyliteral.h): a small recursive reader of the literal subset of
 * Python's grammar, writing each value as json.dumps(ensure_ascii=False) would. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/strbuf.h"
#include "data/pyjson.h"
#include "data/pyliteral.h"
#include "data/pyreader.h"

static int is_ident(char c, int first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9') ||
           (unsigned char)c >= 0x80;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A str literal ('...' or "...", a u prefix allowed), its text decoded into out. */
static int read_str(py_reader *r, glm_strbuf *out) {
    if (r->s[r->i] == 'u' || r->s[r->i] == 'U') r->i++;
    char q = r->s[r->i++];
    if (r->i + 1 < r->n && r->s[r->i] == q && r->s[r->i + 1] == q) return py_fail(r, "a triple-quoted string");
    while (r->i < r->n && r->s[r->i] != q) {
        char c = r->s[r->i++];
        if (c == '\n') return py_fail(r, "a string broken by a new line");
        if (c != '\\') { glm_strbuf_put(out, &c, 1); continue; }
        if (r->i >= r->n) break;
        char e = r->s[r->i++];
        static const char names[] = "\\'\"abfnrtv\n", map[] = "\\'\"\a\b\f\n\r\t\v";
        const char *simple = e ? strchr(names, e) : NULL;
        if (simple) {
            if (e != '\n') glm_strbuf_put(out, &map[simple - names], 1); /* \<newline>: nothing */
        } else if (e >= '0' && e <= '7') {
            unsigned v = (unsigned)(e - '0');
            for (int k = 0; k < 2 && r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '7'; k++) v = v * 8 + (unsigned)(r->s[r->i++] - '0');
            glm_strbuf_utf8(out, v);
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            unsigned v = 0;
            for (int k = 0; k < digits; k++) {
                int d = r->i < r->n ? hexval(r->s[r->i++]) : -1;
                if (d < 0) return py_fail(r, "a \\%c escape without its %d hex digits", e, digits);
                v = v * 16 + (unsigned)d;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return py_fail(r, "a \\%c escape outside Unicode's text", e);
            glm_strbuf_utf8(out, v);
        } else { /* an unknown escape keeps its backslash, as Python does */
            glm_strbuf_put(out, "\\", 1);
            glm_strbuf_put(out, &e, 1);
        }
    }
    if (r->i >= r->n) return py_fail(r, "a string without its closing quote");
    r->i++;
    return 0;
}

/* A number: int (written back as its digits) or float (as repr(float)); a sign in front. */
static int read_number(py_reader *r, glm_strbuf *b) {
    size_t s = r->i;
    int neg = 0;
    while (r->i < r->n && (r->s[r->i] == '-' || r->s[r->i] == '+')) { neg ^= r->s[r->i] == '-'; r->i++; py_ws(r); }
    size_t d = r->i;
    int is_float = 0, digits = 0;
    /* digits, with single underscores between them (1_000) */
    while (r->i < r->n && ((r->s[r->i] >= '0' && r->s[r->i] <= '9') ||
                           (r->s[r->i] == '_' && digits && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9'))) {
        digits += r->s[r->i] != '_';
        r->i++;
    }
    if (r->i < r->n && r->s[r->i] == '.') {
        is_float = 1;
        r->i++;
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') { r->i++; digits++; }
    }
    if (digits && r->i < r->n && (r->s[r->i] == 'e' || r->s[r->i] == 'E')) {
        is_float = 1;
        r->i++;
        if (r->i < r->n && (r->s[r->i] == '+' || r->s[r->i] == '-')) r->i++;
        if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return py_fail(r, "a bad number");
        while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') r->i++;
    }
    if (!digits) { r->i = s; return py_fail(r, "not a literal at byte %zu", s); }
    glm_strbuf t = {0}; /* the digits without underscores: ints keep every one */
    for (size_t j = d; j < r->i; j++) if (r->s[j] != '_') glm_strbuf_put(&t, r->s + j, 1);
    char *tmp = t.s;
    size_t k = t.n;
    int rc = 0;
    if (is_float) {
        glm_py_float_repr(b, (neg ? -1 : 1) * strtod(tmp, NULL));
    } else {
        if (k > 1 && tmp[0] == '0') { /* Python 3 refuses 007; 0x.. and the like are not handled */
            for (size_t j = 0; j < k && rc == 0; j++) if (tmp[j] != '0') rc = py_fail(r, "an int with leading zeros");
            k = 1;
        }
        if (rc == 0) {
            if (neg && !(k == 1 && tmp[0] == '0')) glm_strbuf_put(b, "-", 1);
            glm_strbuf_put(b, tmp, k);
        }
    }
    free(t.s);
    return rc;
}

static int word(py_reader *r, const char *w) {
    size_t n = strlen(w);
    return r->i + n <= r->n && !memcmp(r->s + r->i, w, n) && (r->i + n == r->n || !is_ident(r->s[r->i + n], 0));
}

static int read_value(py_reader *r, glm_strbuf *b, int depth);

/* [a, b], (a, b) and (a,) as a JSON array; (a) is a itself. */
static int read_seq(py_reader *r, glm_strbuf *b, int depth) {
    char open = r->s[r->i++], close = open == '[' ? ']' : ')';
    glm_strbuf items = {0};
    int k = 0, comma = 0;
    py_ws(r);
    while (r->i < r->n && r->s[r->i] != close) {
        if (k) glm_strbuf_str(&items, ", ");
        if (read_value(r, &items, depth + 1)) { free(items.s); return -1; }
        k++;
        py_ws(r);
        comma = r->i < r->n && r->s[r->i] == ',';
        if (comma) { r->i++; py_ws(r); }
        else if (r->i < r->n && r->s[r->i] != close) { free(items.s); return py_fail(r, "',' or '%c' missing", close); }
    }
    if (r->i >= r->n) { free(items.s); return py_fail(r, "'%c' missing", close); }
    r->i++;
    if (open == '(' && k == 1 && !comma) glm_strbuf_put(b, items.s, items.n); /* a parenthesised value */
    else { glm_strbuf_put(b, "[", 1); if (items.n) glm_strbuf_put(b, items.s, items.n); glm_strbuf_put(b, "]", 1); }
    free(items.s);
    return 0;
}

/* A dict's members as read: each key's identity (s + the text for a str, i + the digits for an
 * int: 1 and '1' are two keys, which json.dumps both writes as "1"), its JSON text and value. */
typedef struct member { glm_strbuf id, key, val; } member;
static void members_free(member *m, int n) {
    for (int k = 0; k < n; k++) { free(m[k].id.s); free(m[k].key.s); free(m[k].val.s); }
    free(m);
}

/* {k: v, ...}: str or int keys (a set is refused), a repeated key merged as a dict merges it
 * (its first place, its last value). */
static int read_members(py_reader *r, member **out, int *nout, int depth) {
    member *m = NULL;
    int nm = 0, rc = 0;
    r->i++;
    py_ws(r);
    while (rc == 0 && r->i < r->n && r->s[r->i] != '}') {
        member x = {0};
        char c = r->s[r->i];
        if (c == '\'' || c == '"' || ((c == 'u' || c == 'U') && r->i + 1 < r->n && (r->s[r->i + 1] == '\'' || r->s[r->i + 1] == '"'))) {
            glm_strbuf t = {0};
            if (read_str(r, &t)) { free(t.s); rc = -1; break; }
            glm_strbuf_put(&x.id, "s", 1);
            if (t.n) glm_strbuf_put(&x.id, t.s, t.n);
            glm_py_json_string(&x.key, t.s ? t.s : "", t.n);
            free(t.s);
        } else {
            glm_strbuf num = {0};
            if (read_number(r, &num) || strchr(num.s, '.') || strchr(num.s, 'e') || strchr(num.s, 'n') || strchr(num.s, 'N')) {
                free(num.s);
                rc = py_fail(r, "a dict key that is not a str or an int");
                break;
            }
            glm_strbuf_put(&x.id, "i", 1);
            glm_strbuf_put(&x.id, num.s, num.n);
            glm_py_json_string(&x.key, num.s, num.n);
            free(num.s);
        }
        py_ws(r);
        if (r->i >= r->n || r->s[r->i] != ':') { free(x.id.s); free(x.key.s); rc = py_fail(r, "':' missing in a dict (a set has no JSON form)"); break; }
        r->i++;
        if (read_value(r, &x.val, depth + 1)) { free(x.id.s); free(x.key.s); free(x.val.s); rc = -1; break; }
        int k = 0;
        while (k < nm && !(m[k].id.n == x.id.n && !memcmp(m[k].id.s, x.id.s, x.id.n))) k++;
        if (k < nm) { free(m[k].val.s); m[k].val = x.val; free(x.id.s); free(x.key.s); }
        else { m = glm_realloc(m, sizeof *m * (size_t)(nm + 1)); m[nm++] = x; }
        py_ws(r);
        if (r->i < r->n && r->s[r->i] == ',') { r->i++; py_ws(r); }
        else if (r->i < r->n && r->s[r->i] != '}') rc = py_fail(r, "',' or '}' missing in a dict");
    }
    if (rc == 0 && r->i >= r->n) rc = py_fail(r, "'}' missing");
    if (rc) { members_free(m, nm); return -1; }
    r->i++;
    *out = m;
    *nout = nm;
    return 0;
}

static void put_members(glm_strbuf *b, const member *m, int nm, int *written) {
    for (int k = 0; k < nm; k++) {
        if ((*written)++) glm_strbuf_str(b, ", ");
        glm_strbuf_put(b, m[k].key.s, m[k].key.n);
        glm_strbuf_str(b, ": ");
        glm_strbuf_put(b, m[k].val.s, m[k].val.n);
    }
}

static int read_dict(py_reader *r, glm_strbuf *b, int depth) {
    member *m;
    int nm, written = 0;
    if (read_members(r, &m, &nm, depth)) return -1;
    glm_strbuf_put(b, "{", 1);
    put_members(b, m, nm, &written);
    glm_strbuf_put(b, "}", 1);
    members_free(m, nm);
    return 0;
}

static int read_value(py_reader *r, glm_strbuf *b, int depth) {
    py_ws(r);
    if (depth > 64) return py_fail(r, "nested too deeply");
    if (r->i >= r->n) return py_fail(r, "a value is missing");
    char c = r->s[r->i];
    if (c == '\'' || c == '"' || ((c == 'u' || c == 'U') && r->i + 1 < r->n && (r->s[r->i + 1] == '\'' || r->s[r->i + 1] == '"'))) {
        glm_strbuf s = {0};
        if (read_str(r, &s)) { free(s.s); return -1; }
        glm_py_json_string(b, s.s ? s.s : "", s.n);
        free(s.s);
        return 0;
    }
    if (c == '[' || c == '(') return read_seq(r, b, depth);
    if (c == '{') return read_dict(r, b, depth);
    const char *w[] = {"True", "False", "None"}, *j[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++)
        if (word(r, w[k])) { r->i += strlen(w[k]); glm_strbuf_str(b, j[k]); return 0; }
    return read_number(r, b);
}

/* The length of the valid UTF-8 sequence of two to four bytes at s (n bytes left), else 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    size_t k = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 && s[0] < 0xE0 ? 2 : 0;
    if (!k || k > n) return 0;
    for (size_t i = 1; i < k; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0) || (s[0] == 0xF0 && s[1] < 0x90) ||
        (s[0] == 0xF4 && s[1] >= 0x90))
        return 0; /* overlong, a surrogate, or past U+10FFFF */
    return k;
}

/* Python's reserved words, which cannot name a keyword argument. */
static int is_keyword(const char *w, size_t n) {
    static const char *const kw[] = {"False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
                                     "continue", "def", "del", "elif", "else", "except", "finally", "for", "from",
                                     "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass",
                                     "raise", "return", "try", "while", "with", "yield"};
    for (size_t k = 0; k < sizeof kw / sizeof kw[0]; k++)
        if (strlen(kw[k]) == n && !memcmp(kw[k], w, n)) return 1;
    return 0;
}

int glm_py_is_identifier(const char *s, size_t n) {
    if (n == 0 || (s[0] >= '0' && s[0] <= '9') || is_keyword(s, n)) return 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            size_t k = utf8_len((const unsigned char *)s + i, n - i);
            if (!k) return 0;
            i += k;
        } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            i++;
        } else {
            return 0;
        }
    }
    return 1;
}

char *glm_py_call_kwargs_json(const char *text, size_t len, const char *fn, char *why, size_t why_len) {
    py_reader r = {text, len, 0, why, why_len};
    if (why && why_len) why[0] = 0;
    glm_strbuf b = {0};
    py_ws(&r);
    if (!word(&r, fn)) { py_fail(&r, "not a call of %s", fn); return NULL; }
    r.i += strlen(fn);
    py_ws(&r);
    if (r.i >= r.n || r.s[r.i] != '(') { py_fail(&r, "'(' missing after %s", fn); return NULL; }
    r.i++;
    py_ws(&r);
    glm_strbuf_put(&b, "{", 1);
    char **names = NULL;
    int k = 0, rc = 0;
    int members = 0; /* written into the object so far */
    for (; rc == 0 && r.i < r.n && r.s[r.i] != ')'; k++) {
        if (r.i + 1 < r.n && r.s[r.i] == '*' && r.s[r.i + 1] == '*') { /* **{...}: its items are keyword arguments */
            r.i += 2;
            py_ws(&r);
            member *m = NULL;
            int nm = 0;
            if (r.i >= r.n || r.s[r.i] != '{' || read_members(&r, &m, &nm, 0)) { rc = py_fail(&r, "** takes a dict"); break; }
            for (int j = 0; j < nm && rc == 0; j++) {
                if (m[j].id.s[0] != 's') { rc = py_fail(&r, "keywords must be strings"); break; }
                char *nmj = glm_malloc(m[j].id.n);
                memcpy(nmj, m[j].id.s + 1, m[j].id.n - 1);
                nmj[m[j].id.n - 1] = 0;
                for (int q = 0; q < k && rc == 0; q++)
                    if (!strcmp(names[q], nmj)) rc = py_fail(&r, "keyword argument %s repeated", nmj);
                names = glm_realloc(names, sizeof *names * (size_t)(k + 1));
                names[k++] = nmj;
            }
            if (rc == 0) put_members(&b, m, nm, &members);
            members_free(m, nm);
            if (rc) break;
            py_ws(&r);
            if (r.i < r.n && r.s[r.i] == ',') { r.i++; py_ws(&r); }
            else if (r.i < r.n && r.s[r.i] != ')') rc = py_fail(&r, "',' or ')' missing in the call");
            k--; /* the loop's k++ */
            continue;
        }
        size_t s = r.i;
        while (r.i < r.n && is_ident(r.s[r.i], r.i == s)) r.i++;
        size_t e = r.i;
        py_ws(&r);
        if (e == s || r.i >= r.n || r.s[r.i] != '=' || (r.i + 1 < r.n && r.s[r.i + 1] == '=') || !glm_py_is_identifier(text + s, e - s)) {
            rc = py_fail(&r, "argument %d is not keyword=value", k + 1);
            break;
        }
        r.i++;
        names = glm_realloc(names, sizeof *names * (size_t)(k + 1));
        names[k] = glm_malloc(e - s + 1);
        memcpy(names[k], text + s, e - s);
        names[k][e - s] = 0;
        for (int j = 0; j < k && rc == 0; j++)
            if (!strcmp(names[j], names[k])) rc = py_fail(&r, "keyword argument %s repeated", names[k]);
        if (rc) { k++; break; }
        if (members++) glm_strbuf_str(&b, ", ");
        glm_py_json_string(&b, names[k], strlen(names[k]));
        glm_strbuf_str(&b, ": ");
        if (read_value(&r, &b, 0)) { rc = -1; k++; break; }
        py_ws(&r);
        if (r.i < r.n && r.s[r.i] == ',') { r.i++; py_ws(&r); }
        else if (r.i < r.n && r.s[r.i] != ')') rc = py_fail(&r, "',' or ')' missing in the call");
    }
    for (int j = 0; j < k; j++) free(names[j]);
    free(names);
    if (rc == 0 && r.i >= r.n) rc = py_fail(&r, "')' missing");
    if (rc == 0) {
        r.i++;
        py_ws(&r);
        if (r.i < r.n) rc = py_fail(&r, "text after the call");
    }
    if (rc) { free(b.s); return NULL; }
    glm_strbuf_put(&b, "}", 1);
    return b.s;
}

char *glm_py_literal_json(const char *text, size_t len, char *why, size_t why_len) {
    py_reader r = {text, len, 0, why, why_len};
    if (why && why_len) why[0] = 0;
    glm_strbuf b = {0};
    if (read_value(&r, &b, 0)) { free(b.s); return NULL; }
    py_ws(&r);
    if (r.i < r.n) { py_fail(&r, "text after the value"); free(b.s); return NULL; }
    return b.s;
}
