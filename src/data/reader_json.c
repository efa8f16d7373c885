/* JSON array / JSON Lines reading with file:line:column errors; CSV and TSV rows (their fields
 * from reader_csv.c) become JSON objects and take the same path. See reader.h.
 *
 * A JSON array is not parsed as one document: a small scanner finds each element's extent
 * (strings and nesting tracked) and cJSON parses elements one at a time. That keeps memory at
 * one element's tree, gives every record its own line number, and lets skip_bad_samples step
 * over one malformed element without losing the rest of the file. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "core/fileutil.h"
#include "data/reader.h"

struct glm_reader {
    char *path, *buf;
    size_t len, pos;
    glm_read_cfg cfg;
    glm_schema schema;     /* AUTO until the first object is seen */
    glm_keys keys;
    glm_container container;
    int done, closed;      /* closed: the array's ']' has been consumed */
    int64_t n_elems;       /* array elements scanned */
    size_t loc_off; int64_t loc_line; size_t loc_bol; /* line-counting cursor (see locate) */
    glm_read_stats stats;
    glm_csv_fields header, row; /* CSV/TSV: the column names, and the row being read */
};

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* 1-based line and column (in characters) of byte offset off. Counting resumes from the last
 * query when it moves forward, which it nearly always does. */
static void locate(glm_reader *r, size_t off, int64_t *line, int64_t *col) {
    if (off < r->loc_off) { r->loc_off = 0; r->loc_line = 1; r->loc_bol = 0; }
    for (size_t i = r->loc_off; i < off && i < r->len; i++)
        if (r->buf[i] == '\n') { r->loc_line++; r->loc_bol = i + 1; }
    r->loc_off = off;
    int64_t c = 1;
    for (size_t i = r->loc_bol; i < off && i < r->len; i++) c += ((unsigned char)r->buf[i] & 0xC0) != 0x80;
    *line = r->loc_line;
    *col = c;
}

static int fail_at(glm_reader *r, size_t off, glm_err *err, const char *what) {
    int64_t line, col;
    locate(r, off, &line, &col);
    return glm_fail(err, "%s:%lld:%lld: %s", r->path, (long long)line, (long long)col, what);
}

static const char *ext_of(const char *path) {
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    return dot && (!slash || dot > slash) ? dot + 1 : "";
}

/* The name of a non-UTF-8 encoding the file starts like (BOM, or NUL bytes between the first
 * characters: ASCII text in UTF-16/32), or NULL. */
static const char *other_encoding(const char *buf, size_t len) {
    const unsigned char *u = (const unsigned char *)buf;
    if (len >= 4 && !memcmp(u, "\xFF\xFE\0\0", 4)) return "UTF-32 LE (it starts with the byte order mark FF FE 00 00)";
    if (len >= 4 && !memcmp(u, "\0\0\xFE\xFF", 4)) return "UTF-32 BE (it starts with the byte order mark 00 00 FE FF)";
    if (len >= 2 && u[0] == 0xFF && u[1] == 0xFE) return "UTF-16 LE (it starts with the byte order mark FF FE)";
    if (len >= 2 && u[0] == 0xFE && u[1] == 0xFF) return "UTF-16 BE (it starts with the byte order mark FE FF)";
    size_t n = len < 64 ? len : 64, zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += u[i] == 0;
    if (n >= 4 && zeros * 4 >= n) return "UTF-16 or UTF-32 (it has NUL bytes between its first characters)";
    return NULL;
}

static char csv_delim(const glm_reader *r) { return r->container == GLM_CONTAINER_TSV ? '\t' : ','; }

/* A CSV/TSV file's header: the column names, none empty or repeated; text in another encoding
 * than UTF-8 (Excel's CSV in GBK, say) is named here, before any row. */
static int csv_header(glm_reader *r, glm_err *err) {
    if (!glm_utf8_valid(r->buf + r->pos, r->len - r->pos)) {
        size_t at = r->pos; /* the first byte that begins no valid sequence */
        while (at < r->len) {
            unsigned char c = (unsigned char)r->buf[at];
            size_t k = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
            if (!k || at + k > r->len || !glm_utf8_valid(r->buf + at, k)) break;
            at += k;
        }
        fail_at(r, at, err, "not UTF-8 text");
        return glm_hint(err, "save it as UTF-8 (Excel: \"CSV UTF-8\"), or convert it: iconv -f GBK -t UTF-8 %s > data.csv", r->path);
    }
    size_t at = 0, start = r->pos;
    const char *why = NULL;
    int rc = glm_csv_row(r->buf, r->len, &r->pos, csv_delim(r), &r->header, &at, &why);
    if (rc < 0) return fail_at(r, at, err, why);
    if (rc == 0) { r->done = 1; return 0; } /* an empty file: an empty dataset, judged by the caller */
    for (int i = 0; i < r->header.n; i++) {
        if (!r->header.v[i][0]) return fail_at(r, start, err, "the header row has an empty column name");
        for (int j = 0; j < i; j++)
            if (!strcmp(r->header.v[i], r->header.v[j])) {
                char why2[300];
                snprintf(why2, sizeof why2, "the header row names the column \"%.200s\" twice", r->header.v[i]);
                return fail_at(r, start, err, why2);
            }
    }
    return 0;
}

int glm_reader_open(glm_reader **out, const char *path, const glm_read_cfg *cfg, glm_err *err) {
    size_t len;
    char *buf = glm_read_file(path, &len, err);
    if (!buf) return glm_hint(err, "check --train_file / --validation_file");
    const char *x = ext_of(path);
    if ((len >= 4 && !memcmp(buf, "PAR1", 4)) || !strcasecmp(x, "parquet") || !strcasecmp(x, "arrow")) {
        free(buf);
        int arrow = !strcasecmp(x, "arrow");
        glm_fail(err, "%s: a %s file; glmtrain reads JSON, JSON Lines, CSV and TSV", path, arrow ? "Arrow" : "Parquet");
        return glm_hint(err, "convert it: python3 -c \"import pandas as p; p.read_%s('%s').to_json('data.jsonl', orient='records', "
                             "lines=True, force_ascii=False)\"", arrow ? "feather" : "parquet", path);
    }
    const char *enc = other_encoding(buf, len);
    if (enc) {
        free(buf);
        glm_fail(err, "%s: the file is not UTF-8: it looks like %s", path, enc);
        return glm_hint(err, "convert it to UTF-8, e.g. iconv -f UTF-16 -t UTF-8 %s > new.json", path);
    }
    glm_reader *r = glm_calloc(1, sizeof *r);
    r->path = glm_strdup(path);
    r->buf = buf; r->len = len;
    r->cfg = *cfg;
    r->schema = GLM_SCHEMA_AUTO;
    r->loc_line = 1;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) { /* columns count from after the BOM */
        r->pos = r->loc_off = r->loc_bol = 3;
        r->stats.bom = 1;
    }
    size_t p = r->pos;
    while (p < len && is_ws(buf[p])) p++;
    r->container = cfg->container;
    const char *ext = ext_of(path);
    if (r->container == GLM_CONTAINER_AUTO) {
        if (!strcmp(ext, "jsonl")) r->container = GLM_CONTAINER_LINES;
        else if (!strcasecmp(ext, "csv")) r->container = GLM_CONTAINER_CSV;
        else if (!strcasecmp(ext, "tsv")) r->container = GLM_CONTAINER_TSV;
        else r->container = p < len && buf[p] == '[' ? GLM_CONTAINER_ARRAY : GLM_CONTAINER_LINES;
    }
    if ((r->container == GLM_CONTAINER_CSV || r->container == GLM_CONTAINER_TSV) && csv_header(r, err)) {
        glm_reader_close(r);
        return -1;
    }
    if (r->container == GLM_CONTAINER_ARRAY) {
        if (p >= len) r->done = 1; /* an empty file is an empty dataset, judged by the caller */
        else if (buf[p] != '[') {
            fail_at(r, p, err, "expected a JSON array '[' of records");
            glm_hint(err, "the file looks like JSON Lines (one object per line): rename it to .jsonl or set the data format to jsonl");
            glm_reader_close(r);
            return -1;
        } else r->pos = p + 1;
    }
    *out = r;
    return 0;
}

void glm_reader_close(glm_reader *r) {
    if (!r) return;
    glm_csv_fields_free(&r->header);
    glm_csv_fields_free(&r->row);
    free(r->path); free(r->buf); free(r);
}

const glm_read_stats *glm_reader_stats(const glm_reader *r) { return &r->stats; }
glm_schema glm_reader_schema(const glm_reader *r) { return r->schema; }
glm_container glm_reader_container(const glm_reader *r) { return r->container; }

/* A bad record: an error, or with skip_bad_samples a count (and the first message kept). */
static int bad(glm_reader *r, size_t off, int json, const char *why, glm_err *err) {
    int64_t line, col;
    locate(r, off, &line, &col);
    if (!r->cfg.skip_bad_samples) {
        glm_fail(err, "%s:%lld:%lld: %s%s", r->path, (long long)line, (long long)col,
                 json ? "malformed JSON: " : "", why);
        return glm_hint(err, "fix the record, or pass --skip_bad_samples to skip bad records (they are counted)");
    }
    if (json) r->stats.bad_json++; else r->stats.bad_record++;
    if (!r->stats.first_bad[0])
        snprintf(r->stats.first_bad, sizeof r->stats.first_bad, "%s:%lld:%lld: %s%s", r->path,
                 (long long)line, (long long)col, json ? "malformed JSON: " : "", why);
    return 0;
}

/* The offset of the first NUL in [s, e), a raw byte or a \u0000 escape inside a string, or e.
 * Text is C strings from here on: a NUL would cut it silently, so such a record is refused. */
static size_t find_nul(const glm_reader *r, size_t s, size_t e) {
    const char *b = r->buf;
    for (size_t i = s; i < e; i++) {
        if (b[i] == 0) return i;
        if (b[i] != '\\' || i + 1 >= e) continue;
        if (b[i + 1] == 'u' && i + 6 <= e && !memcmp(b + i + 2, "0000", 4)) return i;
        i++; /* the escaped character ("\\\\u0000" is text, not a NUL) */
    }
    return e;
}

/* Whether the value in [s, e) nests arrays/objects deeper than cJSON parses (it then stops
 * with what looks like a syntax error). Only asked after a failed parse. */
static int too_deep(const glm_reader *r, size_t s, size_t e) {
    int depth = 0, in_str = 0;
    for (size_t i = s; i < e; i++) {
        char c = r->buf[i];
        if (in_str) { if (c == '\\') i++; else if (c == '"') in_str = 0; continue; }
        if (c == '"') in_str = 1;
        else if (c == '{' || c == '[') { if (++depth > CJSON_NESTING_LIMIT) return 1; }
        else if (c == '}' || c == ']') depth--;
    }
    return 0;
}

/* Parses one JSON value in [s, e) (offsets into buf) and turns it into a record.
 * 1 = record, 0 = skipped, -1 = error. */
static int value_record(glm_reader *r, cJSON *v, size_t s, size_t e, glm_record *rec, glm_err *err);

static int parse_value(glm_reader *r, size_t s, size_t e, glm_record *rec, glm_err *err) {
    r->stats.records++;
    size_t nul = find_nul(r, s, e);
    if (nul < e)
        return bad(r, nul, 0, r->buf[nul] ? "the record holds a \\u0000 (NUL) character: text with NUL is not supported"
                                          : "the record holds a NUL byte: text with NUL is not supported", err) ? -1 : 0;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(r->buf + s, e - s, &end, 0);
    if (!v) {
        size_t at = end ? (size_t)(end - r->buf) : s;
        char why[96];
        snprintf(why, sizeof why, "nesting deeper than %d levels of arrays/objects (the reader's limit)", CJSON_NESTING_LIMIT);
        if (too_deep(r, s, e)) return bad(r, s, 0, why, err) ? -1 : 0;
        return bad(r, at < e ? at : e, 1, at >= e ? "unexpected end of the record" : "syntax error", err);
    }
    size_t after = (size_t)(end - r->buf);
    while (after < e && is_ws(r->buf[after])) after++;
    if (after < e) { cJSON_Delete(v); return bad(r, after, 1, "unexpected data after the JSON value", err); }
    return value_record(r, v, s, e, rec, err);
}

/* The record of one parsed value v (deleted here) whose text is buf[s, e). */
static int value_record(glm_reader *r, cJSON *v, size_t s, size_t e, glm_record *rec, glm_err *err) {
    char why[200];
    if (r->schema == GLM_SCHEMA_AUTO && cJSON_IsObject(v)) {
        if (glm_schema_detect(&r->cfg, v, &r->schema, &r->keys, why, sizeof why)) {
            cJSON_Delete(v);
            fail_at(r, s, err, why);
            return glm_hint(err, "set the data format (alpaca, columns, sharegpt) or --prompt_column/--response_column");
        }
    }
    int rc = r->schema == GLM_SCHEMA_AUTO ? (snprintf(why, sizeof why, "record is not an object"), -1)
                                          : glm_schema_extract(r->schema, &r->keys, v, rec, why, sizeof why);
    cJSON_Delete(v);
    if (!rc && rec->msgs && (rc = glm_conversation_tools(rec, r->buf + s, e - s, r->cfg.glm4, why, sizeof why))) glm_record_free(rec);
    if (rc) return bad(r, s, 0, why, err) ? -1 : 0;
    rec->index = r->stats.records - 1;
    locate(r, s, &rec->line, &rec->col);
    return 1;
}

/* The end of the array element starting at s: the ',' or ']' that closes it at depth 0.
 * Returns 0, or -1 on a structural error (reported at *at). */
static int scan_element(const glm_reader *r, size_t s, size_t *end, size_t *at, const char **why) {
    int depth = 0, in_str = 0;
    size_t str_start = 0;
    for (size_t i = s; i < r->len; i++) {
        char c = r->buf[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') { in_str = 1; str_start = i; }
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') { if (depth == 0) { *end = i; return 0; } depth--; }
        else if (c == ',' && depth == 0) { *end = i; return 0; }
    }
    *at = in_str ? str_start : s;
    *why = in_str ? "unterminated string" : "unterminated array (missing ']' at the end of the file?)";
    return -1;
}

/* After the closing ']' only whitespace may follow. */
static int finish_array(glm_reader *r, glm_err *err) {
    r->done = 1;
    for (size_t q = r->pos; q < r->len; q++)
        if (!is_ws(r->buf[q])) return fail_at(r, q, err, "unexpected data after the closing ']'");
    return 0;
}

static int next_array(glm_reader *r, glm_record *rec, glm_err *err) {
    while (!r->closed) {
        size_t p = r->pos;
        while (p < r->len && is_ws(r->buf[p])) p++;
        if (p >= r->len) return fail_at(r, r->len, err, "unterminated array (missing ']' at the end of the file?)");
        if (r->buf[p] == ']' && r->n_elems == 0) { r->pos = p + 1; break; } /* [] */
        size_t e, at;
        const char *why;
        if (scan_element(r, p, &e, &at, &why)) {
            fail_at(r, at, err, why);
            return glm_hint(err, "the file is not a complete JSON array; --skip_bad_samples cannot skip a broken file structure");
        }
        if (r->buf[e] == '}') return fail_at(r, e, err, "malformed JSON: unexpected '}'");
        r->n_elems++;
        r->closed = r->buf[e] == ']';
        r->pos = e + 1;
        int rc;
        if (p == e) { /* "[,", ",," or a trailing ",]" */
            r->stats.records++;
            rc = bad(r, p, 1, "expected a record", err) ? -1 : 0;
        } else {
            rc = parse_value(r, p, e, rec, err);
        }
        if (rc) return rc;
    }
    return finish_array(r, err);
}

static int next_line(glm_reader *r, glm_record *rec, glm_err *err) {
    while (r->pos < r->len) {
        size_t s = r->pos;
        char *nl = memchr(r->buf + s, '\n', r->len - s);
        size_t e = nl ? (size_t)(nl - r->buf) : r->len;
        r->pos = e + 1;
        size_t a = s, b = e;
        while (a < b && is_ws(r->buf[a])) a++;
        while (b > a && is_ws(r->buf[b - 1])) b--; /* also drops the '\r' of CRLF files */
        if (a == b) continue;                         /* blank lines are not records */
        int rc = parse_value(r, a, b, rec, err);
        if (rc < 0 && r->stats.records == 1 && r->buf[a] == '{' && strstr(err->msg, "malformed JSON"))
            glm_hint(err, "JSON Lines needs one whole record per line; a pretty-printed file must be a JSON array "
                          "[{...}, ...] (or pass --skip_bad_samples)");
        if (rc) return rc;
    }
    r->done = 1;
    return 0;
}

/* A CSV/TSV row as an object of strings under the header's names. */
static int next_csv(glm_reader *r, glm_record *rec, glm_err *err) {
    for (;;) {
        size_t s = r->pos, at = 0;
        while (s < r->len && (r->buf[s] == '\n' || r->buf[s] == '\r')) s++; /* where the row starts */
        const char *why = NULL;
        int rc = glm_csv_row(r->buf, r->len, &r->pos, csv_delim(r), &r->row, &at, &why);
        if (rc == 0) { r->done = 1; return 0; }
        r->stats.records++;
        if (rc < 0) { /* the row's extent is unknown: nothing after it can be read */
            fail_at(r, at, err, why);
            return glm_hint(err, "fix the file (--skip_bad_samples cannot step over a broken quote)");
        }
        const char *z = memchr(r->buf + s, 0, r->pos - s); /* a raw NUL only: "\u0000" is plain text in CSV */
        size_t nul = z ? (size_t)(z - r->buf) : r->pos;
        if (nul < r->pos) {
            if (bad(r, nul, 0, "the row holds a NUL byte: text with NUL is not supported", err)) return -1;
            continue;
        }
        if (r->row.n != r->header.n) {
            char w[160];
            snprintf(w, sizeof w, "the row has %d fields where the header names %d columns", r->row.n, r->header.n);
            if (bad(r, s, 0, w, err)) return -1;
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        for (int i = 0; i < r->row.n; i++) cJSON_AddStringToObject(o, r->header.v[i], r->row.v[i]);
        rc = value_record(r, o, s, r->pos, rec, err);
        if (rc) return rc;
    }
}

int glm_reader_next(glm_reader *r, glm_record *rec, glm_err *err) {
    if (r->done || (r->cfg.max_records > 0 && r->stats.records >= r->cfg.max_records)) return 0;
    if (r->container == GLM_CONTAINER_CSV || r->container == GLM_CONTAINER_TSV) return next_csv(r, rec, err);
    return r->container == GLM_CONTAINER_ARRAY ? next_array(r, rec, err) : next_line(r, rec, err);
}
