/* A reasoning model's thought in its answers (thought.h). */
#include "data/thought.h"
#include <string.h>
#include "core/err.h"

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
