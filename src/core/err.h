/* Errors with hints. Library functions never exit: they fill a glm_err and return -1, so
 * callers (and tests) decide what a failure means. Only the CLI turns an error into exit(1).
 * CUDA/NCCL wrappers that cannot recover use GLM_FATAL with a HINT line, llm.c style. */
#ifndef GLM_ERR_H
#define GLM_ERR_H
#include <stddef.h>
#include <stdint.h>

#define GLM_ERR_LEN 1024

typedef struct glm_err {
    char msg[GLM_ERR_LEN];  /* "what went wrong, naming the file/line/flag" */
    char hint[1024];        /* "what to do about it" (may be empty) */
} glm_err;

/* Sets err->msg (printf style), clears the hint, returns -1 so callers can `return glm_fail(...)`.
 * err may be NULL (the message is dropped). */
int glm_fail(glm_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets err->hint; returns -1. */
int glm_hint(glm_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes err->msg with more context ("loading weights: " + old message); returns -1. */
int glm_wrap(glm_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "error: msg" and "hint: hint" to stderr. */
void glm_err_print(const glm_err *err);

/* Unrecoverable failure (a broken invariant, a failed CUDA call): prints and exits(1). */
_Noreturn void glm_fatal_at(const char *file, int line, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define GLM_FATAL(hint, ...) glm_fatal_at(__FILE__, __LINE__, hint, __VA_ARGS__)
#define GLM_ASSERT(cond) \
    do { if (!(cond)) glm_fatal_at(__FILE__, __LINE__, "this is a bug in glmtrain; please report it", "assertion failed: %s", #cond); } while (0)

/* Allocation that cannot fail silently: on failure prints the size and exits with a hint. */
void *glm_malloc(size_t bytes);
void *glm_calloc(size_t n, size_t size);
void *glm_realloc(void *p, size_t bytes);
char *glm_strdup(const char *s);
char *glm_strndup(const char *s, size_t n); /* s[0..n) and a NUL */

/* A growable array of int32 ids (tokens, labels). */
typedef struct glm_ids {
    int32_t *data;
    int n, cap;
} glm_ids;
void glm_ids_push(glm_ids *v, int32_t x);
void glm_ids_append(glm_ids *v, const int32_t *x, int n);
void glm_ids_free(glm_ids *v);

#endif
