#include "core/err.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int glm_fail(glm_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->hint[0] = 0;
    return -1;
}

int glm_hint(glm_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->hint, sizeof err->hint, fmt, ap);
    va_end(ap);
    return -1;
}

int glm_wrap(glm_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char old[GLM_ERR_LEN];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, "%.*s", (int)(sizeof err->msg - (size_t)n - 1), old);
    return -1;
}

void glm_err_print(const glm_err *err) {
    fprintf(stderr, "error: %s\n", err->msg);
    if (err->hint[0]) fprintf(stderr, "hint: %s\n", err->hint);
}

void glm_fatal_at(const char *file, int line, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error (%s:%d): ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    if (hint && hint[0]) fprintf(stderr, "HINT: %s\n", hint);
    exit(1);
}

static void oom(size_t bytes) {
    fprintf(stderr, "error: out of host memory allocating %zu bytes (%.2f GiB)\n", bytes,
            bytes / 1073741824.0);
    fprintf(stderr, "HINT: lower --per_device_train_batch_size or --max_source_length/--max_target_length, "
                    "or run `glmtrain info` to see the memory plan\n");
    exit(1);
}

void *glm_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) oom(bytes);
    return p;
}

void *glm_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size);
    return p;
}

void *glm_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) oom(bytes);
    return q;
}

char *glm_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = glm_malloc(n);
    memcpy(d, s, n);
    return d;
}

char *glm_strndup(const char *s, size_t n) {
    char *d = glm_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

void glm_ids_push(glm_ids *v, int32_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 16;
        v->data = glm_realloc(v->data, (size_t)v->cap * sizeof *v->data);
    }
    v->data[v->n++] = x;
}

void glm_ids_append(glm_ids *v, const int32_t *x, int n) {
    for (int i = 0; i < n; i++) glm_ids_push(v, x[i]);
}

void glm_ids_free(glm_ids *v) {
    free(v->data);
    v->data = NULL;
    v->n = v->cap = 0;
}
