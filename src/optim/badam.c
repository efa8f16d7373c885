#include "optim/badam.h"
#include <string.h>
#include "core/rng.h"

int glm_badam_parse_order(const char *s) {
    return !strcmp(s, "ascending") ? GLM_BADAM_ASCENDING : !strcmp(s, "descending") ? GLM_BADAM_DESCENDING
         : !strcmp(s, "random")    ? GLM_BADAM_RANDOM    : !strcmp(s, "fixed")      ? GLM_BADAM_FIXED : -1;
}

long glm_badam_round(const glm_badam *b, long step) {
    if (step < 1) step = 1;
    return b->interval <= 1 ? step - 1 : step / b->interval;
}

/* Round r's layer in random order: round r / L's permutation of the layers, drawn from the seed
 * and that number alone (a resumed run draws the same ones). */
static int random_block(const glm_badam *b, long r) {
    int L = b->blocks;
    int32_t perm[4096];
    if (L > 4096) L = 4096;
    for (int i = 0; i < L; i++) perm[i] = i;
    glm_rng g;
    glm_rng_seed(&g, b->seed * 0x9E3779B97F4A7C15ull + (uint64_t)(r / L) + 1);
    glm_rng_shuffle_i32(&g, perm, L);
    return perm[r % L];
}

int glm_badam_block(const glm_badam *b, long step) {
    int L = b->blocks;
    long r = glm_badam_round(b, step);
    int start = b->start >= 0 ? b->start : b->order == GLM_BADAM_DESCENDING ? L - 1 : 0;
    switch (b->order) {
    case GLM_BADAM_ASCENDING: return (int)((start + r) % L);
    case GLM_BADAM_DESCENDING: return (int)(((start - r) % L + L) % L);
    case GLM_BADAM_RANDOM: return random_block(b, r);
    default: return start;
    }
}

int glm_badam_lowest(const glm_badam *b) {
    if (b->order != GLM_BADAM_FIXED) return 0;
    return b->start >= 0 ? b->start : 0;
}
