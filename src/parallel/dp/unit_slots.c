/* Staging slots of the unit-by-unit gradient paths (parallel/dp/unit_slots.h). */
#include "parallel/dp/unit_slots.h"
#include <string.h>

void glm_unit_slots_init(glm_unit_slots *u, glm_model *m) {
    glm_backend *be = m->be;
    memset(u, 0, sizeof *u);
    const glm_tensor *wte = m->cfg.tie_word_embeddings ? glm_table_get(&m->tab, -1, T_WORD_EMB) : NULL;
    u->tied = wte != NULL;
    u->wte_lo = wte ? wte->offset : 0;
    size_t ring, tied;
    glm_table_unit_slots(&m->tab, m->cfg.tie_word_embeddings, &ring, &tied);
    u->elems[0] = u->elems[1] = ring;
    u->elems[2] = tied;
    size_t es = glm_dtype_size(be->dtype);
    for (int s = 0; s < 3; s++) u->slot[s] = u->elems[s] ? be->alloc(be, u->elems[s] * es) : NULL;
}

void glm_unit_slots_free(glm_unit_slots *u, glm_backend *be) {
    for (int s = 0; s < 3; s++)
        if (u->slot[s]) be->free(be, u->slot[s]);
    memset(u, 0, sizeof *u);
}

int glm_unit_slots_pick(glm_unit_slots *u, size_t lo, int *s) {
    int wte = u->tied && lo == u->wte_lo;
    if (wte && u->wte_bound) { *s = 2; return 0; }
    *s = wte ? 2 : u->ring++ % 2;
    return 1;
}

void *glm_unit_slots_bind(glm_unit_slots *u, glm_backend *be, int s, size_t lo, size_t hi) {
    be->zero(be, u->slot[s], (hi - lo) * glm_dtype_size(be->dtype));
    u->lo[s] = lo;
    u->n[s] = hi - lo;
    u->busy[s] = 1;
    if (s == 2) u->wte_bound = 1;
    return u->slot[s];
}

int glm_unit_slots_take(glm_unit_slots *u, size_t first) {
    for (int s = 0; s < 3; s++)
        if (u->busy[s] && u->lo[s] == first) { u->busy[s] = 0; return s; }
    return -1;
}

void glm_unit_slots_micro(glm_unit_slots *u) { u->wte_bound = 0; }
void glm_unit_slots_rewind(glm_unit_slots *u) { u->ring = 0; }

size_t glm_unit_slots_elems(const glm_unit_slots *u) { return u->elems[0] + u->elems[1] + u->elems[2]; }
