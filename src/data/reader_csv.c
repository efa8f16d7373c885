/* One row of a CSV or TSV file (reader.h glm_csv_row), as Python's csv module reads its "excel"
 * and "excel-tab" dialects with strict=True: fields split at the delimiter, a field in double
 * quotes may hold delimiters, line breaks and "" for a quote; rows end at \n, \r\n or \r. What csv
 * would only read leniently is refused: text after a closing quote, a quote left open. */
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "data/reader.h"

static void add_field(glm_csv_fields *f, const char *s, size_t n) {
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 8;
        f->v = glm_realloc(f->v, sizeof *f->v * (size_t)f->cap);
    }
    char *t = glm_malloc(n + 1);
    memcpy(t, s, n);
    t[n] = 0;
    f->v[f->n++] = t;
}

void glm_csv_fields_clear(glm_csv_fields *f) {
    for (int i = 0; i < f->n; i++) free(f->v[i]);
    f->n = 0;
}

void glm_csv_fields_free(glm_csv_fields *f) {
    glm_csv_fields_clear(f);
    free(f->v);
    *f = (glm_csv_fields){0};
}

int glm_csv_row(const char *buf, size_t len, size_t *pos, char delim, glm_csv_fields *out, size_t *bad_at, const char **why) {
    glm_csv_fields_clear(out);
    size_t p = *pos;
    /* blank lines are no rows (csv.DictReader and pandas skip them) */
    while (p < len && (buf[p] == '\n' || buf[p] == '\r')) p++;
    if (p >= len) { *pos = p; return 0; }
    char *field = NULL;
    size_t n = 0, cap = 0;
    for (;;) { /* one field a turn */
        n = 0;
        if (p < len && buf[p] == '"') {
            size_t open = p++;
            for (;;) {
                if (p >= len) {
                    free(field);
                    *bad_at = open;
                    *why = "a quoted field is not closed (a '\"' missing?)";
                    return -1;
                }
                if (buf[p] == '"') {
                    if (p + 1 < len && buf[p + 1] == '"') { p += 2; if (n + 1 > cap) field = glm_realloc(field, cap = 2 * cap + 64); field[n++] = '"'; continue; }
                    p++;
                    break;
                }
                if (n + 1 > cap) field = glm_realloc(field, cap = 2 * cap + 64);
                field[n++] = buf[p++];
            }
            if (p < len && buf[p] != delim && buf[p] != '\n' && buf[p] != '\r') {
                free(field);
                *bad_at = p;
                *why = "text after a closing quote (a quote inside a quoted field is written \"\")";
                return -1;
            }
        } else {
            while (p < len && buf[p] != delim && buf[p] != '\n' && buf[p] != '\r') { /* csv ends a row at a lone \r too */
                if (n + 1 > cap) field = glm_realloc(field, cap = 2 * cap + 64);
                field[n++] = buf[p++];
            }
        }
        add_field(out, field ? field : "", n);
        if (p < len && buf[p] == delim) { p++; continue; }
        if (p < len && buf[p] == '\r') p++;
        if (p < len && buf[p] == '\n') p++;
        break;
    }
    free(field);
    *pos = p;
    return 1;
}
