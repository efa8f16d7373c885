/* Guided choices' token masks (infer/choice_mode.h). */
#include "infer/choice_mode.h"
#include <string.h>


size_t glm_choice_token_bytes(const glm_text_vocab *v, int32_t id, size_t so_far, const char **b) {
    if (id < 0 || id >= v->V || !v->text[id]) { *b = ""; return 0; }
    const char *p = v->blob + v->off[id];
    size_t len = v->off[id + 1] - v->off[id];
    if (so_far == 0 && v->drop_first_space && len > 0 && p[0] == ' ') { p++; len--; }
    *b = p;
    return len;
}

void glm_choice_mask(const glm_text_vocab *v, const char *const *choices, const size_t *len, int n_choices,
                     const char *text, size_t n, const int32_t *ends, int n_ends, float *logits) {
    uint8_t next[256] = {0}; /* the bytes a live choice has next: most tokens are refused by their first */
    int whole = 0, live = 0;
    for (int k = 0; k < n_choices; k++) {
        if (len[k] < n || memcmp(choices[k], text, n)) continue;
        live = 1;
        if (len[k] == n) whole = 1;
        else next[(unsigned char)choices[k][n]] = 1;
    }
    glm_end_logits kept;
    glm_ends_save(v->V, ends, n_ends, logits, &kept);
    for (int32_t id = 0; id < v->V; id++) {
        const char *b;
        size_t bl = glm_choice_token_bytes(v, id, n, &b);
        int ok = 0;
        if (live && bl > 0 && next[(unsigned char)b[0]])
            for (int k = 0; k < n_choices && !ok; k++)
                ok = len[k] >= n + bl && !memcmp(choices[k], text, n) && !memcmp(choices[k] + n, b, bl);
        if (!ok) logits[id] = GLM_MASKED;
    }
    glm_ends_put(v->V, ends, &kept, whole, logits); /* the end: where the answer is a choice whole */
}
