/* A growing text buffer that is always a C string (JSON, templates, file headers). */
#ifndef GLM_STRBUF_H
#define GLM_STRBUF_H
#include <stddef.h>
#include <string.h>

typedef struct glm_strbuf {
    char *s;  /* NUL-terminated once anything was put; the owner frees it */
    size_t n; /* length, without the NUL */
    size_t cap;
} glm_strbuf;

/* Appends n bytes (any bytes; a NUL follows them). */
void glm_strbuf_put(glm_strbuf *b, const char *s, size_t n);
/* Appends a C string; NULL appends nothing. */
static inline void glm_strbuf_str(glm_strbuf *b, const char *s) {
    if (s) glm_strbuf_put(b, s, strlen(s));
}
/* Appends code point cp (at most U+10FFFF) as UTF-8. */
void glm_strbuf_utf8(glm_strbuf *b, unsigned cp);
#endif
