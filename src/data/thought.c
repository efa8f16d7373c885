/* A reasoning model's thought in its answers (thought.h). */
#include "data/thought.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/fileutil.h"

int glm_thought_has_words(const char *s) { return strstr(s, GLM_THOUGHT_OPEN) || strstr(s, GLM_THOUGHT_CLOSE); }

char *glm_thought_remove(const char *s) {
    size_t n = strlen(s), w = 0, lo = strlen(GLM_THOUGHT_OPEN), lc = strlen(GLM_THOUGHT_CLOSE);
    char *out = glm_malloc(n + 1);
    for (const char *p = s; *p;) {
        const char *o = strstr(p, GLM_THOUGHT_OPEN), *c = o ? strstr(o + lo, GLM_THOUGHT_CLOSE) : NULL;
        if (!c) { /* no whole thought left: the rest as it is */
            memcpy(out + w, p, strlen(p));
            w += strlen(p);
            break;
        }
        memcpy(out + w, p, (size_t)(o - p));
        w += (size_t)(o - p);
        p = c + lc;
    }
    out[w] = 0;
    size_t lead = strspn(out, "\n");
    memmove(out, out + lead, w - lead + 1);
    return out;
}

/* The length of the longest end of s[0..n) that begins tag without being all of it. */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

void glm_thought_split(const char *s, size_t n, int final, glm_thought_parts *out) {
    *out = (glm_thought_parts){0};
    size_t i = 0, lo = strlen(GLM_THOUGHT_OPEN), lc = strlen(GLM_THOUGHT_CLOSE);
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    if (!final && n - i < lo && memcmp(s + i, GLM_THOUGHT_OPEN, n - i) == 0) return; /* maybe a thought: wait */
    if (n - i < lo || memcmp(s + i, GLM_THOUGHT_OPEN, lo) != 0) { /* no thought: all answer */
        out->answer = n > i ? s + i : NULL;
        out->n_answer = n - i;
        return;
    }
    const char *t = s + i + lo, *end = s + n;
    const char *c = NULL;
    for (const char *p = t; p + lc <= end; p++)
        if (memcmp(p, GLM_THOUGHT_CLOSE, lc) == 0) { c = p; break; }
    if (!c) { /* the thought so far (less what may be the closing tag's start) */
        size_t k = (size_t)(end - t);
        out->thought = t;
        out->n_thought = final ? k : k - partial_tag(t, k, GLM_THOUGHT_CLOSE);
        return;
    }
    out->thought = t;
    out->n_thought = (size_t)(c - t);
    const char *a = c + lc;
    while (a < end && *a == '\n') a++;
    out->answer = a < end ? a : NULL;
    out->n_answer = (size_t)(end - a);
}

int glm_tokenizer_template_thinks(const char *tokenizer_path) {
    if (!tokenizer_path || !glm_is_dir(tokenizer_path)) return 0;
    char path[4096];
    glm_path_join(path, sizeof path, tokenizer_path, "tokenizer_config.json");
    glm_err err = {0};
    char *text = glm_read_file(path, NULL, &err); /* NULL: no such file, nothing to say */
    int thinks = text && strstr(text, "chat_template") && strstr(text, GLM_THOUGHT_CLOSE);
    free(text);
    return thinks;
}
