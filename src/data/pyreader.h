/* What the Python-compatible readers share (pyjson.c: JSON as Python's json module reads it;
 * pyliteral.c: Python literals): a cursor over text[0..n) that keeps the first failure's reason. */
#ifndef GLM_DATA_PYREADER_H
#define GLM_DATA_PYREADER_H
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct py_reader {
    const char *s;
    size_t n, i;
    char *why; /* the first failure's reason (may be NULL) */
    size_t why_len;
} py_reader;

/* Keeps the reason (the first only) and returns -1. */
static inline int py_fail(py_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int py_fail(py_reader *r, const char *fmt, ...) {
    if (r->why && !r->why[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->why, r->why_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Skips spaces, tabs and line ends. */
static inline void py_ws(py_reader *r) {
    while (r->i < r->n && (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r')) r->i++;
}

#endif
