/* Top-level key edits of a JSON object's text (json_text.h): a scanner that finds each
 * member's key and value bytes, and splices around them. */
#include "core/json_text.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    return p;
}

/* p at the opening quote; returns the byte after the closing quote, NULL when unterminated. */
static const char *skip_string(const char *p) {
    for (p++; *p; p++) {
        if (*p == '\\') { if (!*++p) return NULL; }
        else if (*p == '"') return p + 1;
    }
    return NULL;
}

/* p at a value's first byte; returns the byte after it, NULL when it does not end. */
static const char *skip_value(const char *p) {
    if (*p == '"') return skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') { if (!(p = skip_string(p))) return NULL; continue; }
            if (*p == '{' || *p == '[') depth++;
            else if (*p == '}' || *p == ']') { if (--depth == 0) return p + 1; }
            p++;
        }
        return NULL;
    }
    const char *s = p;
    while (*p && !strchr(",}] \t\r\n", *p)) p++;
    return p > s ? p : NULL;
}

/* One member of the object: its key's bytes (quotes included) and its value's. */
typedef struct member { const char *ks, *ke, *vs, *ve; } member;

/* Finds `key` among the top-level members; *last gets the last member (ks NULL when the
 * object is empty), *close the object's closing brace, *next the member after the match.
 * Returns 1 when found, 0 when absent, -1 when the text cannot be followed. */
static int find_member(const char *text, const char *key, member *hit, member *last, member *next, const char **close) {
    const char *p = skip_ws(text);
    if (*p != '{') return -1;
    p = skip_ws(p + 1);
    *last = *next = *hit = (member){0};
    int found = 0;
    size_t klen = strlen(key);
    while (*p != '}') {
        member m = {.ks = p};
        if (*p != '"' || !(m.ke = skip_string(p))) return -1;
        p = skip_ws(m.ke);
        if (*p != ':') return -1;
        m.vs = skip_ws(p + 1);
        if (!(m.ve = skip_value(m.vs))) return -1;
        if (found == 1 && !next->ks) *next = m;
        if (!found && (size_t)(m.ke - m.ks) == klen + 2 && strncmp(m.ks + 1, key, klen) == 0) { *hit = m; found = 1; }
        *last = m;
        p = skip_ws(m.ve);
        if (*p == ',') p = skip_ws(p + 1);
        else if (*p != '}') return -1;
    }
    *close = p;
    return found;
}

/* text[0..a) + mid + text[b..] */
static char *splice(const char *text, size_t a, size_t b, const char *mid) {
    size_t n = strlen(text), m = strlen(mid);
    char *out = malloc(n - (b - a) + m + 1);
    if (!out) return NULL;
    memcpy(out, text, a);
    memcpy(out + a, mid, m);
    memcpy(out + a + m, text + b, n - b + 1);
    return out;
}

char *glm_json_set_key(const char *text, const char *key, const char *value) {
    member hit, last, next;
    const char *close;
    int f = find_member(text, key, &hit, &last, &next, &close);
    if (f < 0) return NULL;
    if (f == 1) return splice(text, (size_t)(hit.vs - text), (size_t)(hit.ve - text), value);
    /* appended after the last member, indented as it is */
    char indent[64] = " ";
    if (last.ks) {
        const char *q = last.ks;
        while (q > text && (q[-1] == ' ' || q[-1] == '\t')) q--;
        if (q > text && q[-1] == '\n' && (size_t)(last.ks - q) < sizeof indent - 1)
            snprintf(indent, sizeof indent, "\n%.*s", (int)(last.ks - q), q);
    }
    size_t n = strlen(key) + strlen(value) + sizeof indent + 8;
    char *mid = malloc(n);
    if (!mid) return NULL;
    snprintf(mid, n, "%s%s\"%s\": %s", last.ks ? "," : "", last.ks ? indent : "", key, value);
    size_t at = last.ks ? (size_t)(last.ve - text) : (size_t)(close - text);
    char *out = splice(text, at, at, mid);
    free(mid);
    return out;
}

char *glm_json_remove_key(const char *text, const char *key) {
    member hit, last, next;
    const char *close;
    int f = find_member(text, key, &hit, &last, &next, &close);
    if (f < 0) return NULL;
    if (f == 0) return strdup(text);
    if (next.ks) return splice(text, (size_t)(hit.ks - text), (size_t)(next.ks - text), "");
    /* the last member: drop the comma before it too (back to the previous value's end) */
    const char *a = hit.ks;
    while (a > text && a[-1] != ',' && a[-1] != '{') a--;
    if (a > text && a[-1] == ',') a--;
    return splice(text, (size_t)(a - text), (size_t)(hit.ve - text), "");
}

void glm_json_float(char *buf, size_t n, float v) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (strtof(buf, NULL) == v) return;
    }
}

/* line:col of p in text (columns in characters), text's first line being line0 */
static void line_col(const char *text, const char *p, int line0, int *line, int *col) {
    *line = line0;
    *col = 1;
    for (const char *q = text; q < p && *q; q++) {
        if (*q == '\n') { ++*line; *col = 1; }
        else if (((unsigned char)*q & 0xC0) != 0x80) ++*col;
    }
}

static int fail_at(const char *text, const char *at, const char *src, int line0, const char *expected, glm_err *err) {
    /* A whole JSON document ends with '}' or ']': one that does not was cut off (a partial
     * download or copy), and its end is the place to report, not where cJSON gave up (the
     * start of the cut string, say). */
    const char *end = text + strlen(text);
    while (end > text && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) end--;
    int cut = end == text || (end[-1] != '}' && end[-1] != ']');
    int line, col;
    line_col(text, cut ? end : at, line0, &line, &col);
    if (cut) return glm_fail(err, "%s:%d:%d: the JSON ends early (cut off? %s expected)", src, line, col, expected);
    return glm_fail(err, "%s:%d:%d: malformed JSON (%s expected)", src, line, col, expected);
}

cJSON *glm_json_parse_at(const char *text, size_t len, const char *src, int line0, const char *expected, glm_err *err) {
    const char *nul = memchr(text, 0, len);
    int line, col;
    if (nul) {
        line_col(text, nul, line0, &line, &col);
        glm_fail(err, "%s:%d:%d: a NUL byte (not a JSON text file?)", src, line, col);
        return NULL;
    }
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 0);
    if (!o) { fail_at(text, end ? end : text, src, line0, expected, err); return NULL; }
    const char *p = end;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p) {
        cJSON_Delete(o);
        line_col(text, p, line0, &line, &col);
        glm_fail(err, "%s:%d:%d: more after the JSON value ended (two documents in one place, or a stray '%c'?)", src, line, col,
                 (unsigned char)*p < 0x80 && *p >= 0x20 ? *p : '?');
        return NULL;
    }
    return o;
}

cJSON *glm_json_parse_doc(const char *text, size_t len, const char *src, const char *expected, glm_err *err) {
    return glm_json_parse_at(text, len, src, 1, expected, err);
}
