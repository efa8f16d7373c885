/* The staging slots of the unit-by-unit gradient paths: ZeRO-2's reduce-scatter
 * (parallel/dp/dp_zero2.c) and the offloaded optimizer's copies to the host and the update inside
 * backward (parallel/dp/dp_offload.c). Backward writes each unit's gradients (the embedding, a
 * layer, the final norm with the head: glm_model_units) into a slot instead of a whole-model
 * buffer, through the model's grads_unit hook. Two slots sized by the largest unit take the
 * units in turn; a tied embedding has a slot of its own, since the head writes its gradient at
 * the start of backward and the embedding adds to it at the end. The sizes come from
 * glm_table_unit_slots (model/tensors.h), which the memory plan uses too.
 *
 * A path's hook: s = pick; if fresh, wait until slot s's previous unit has been handed on (its
 * own fence), then bind. When backward is done with a unit, take finds its slot. */
#ifndef GLM_PARALLEL_UNIT_SLOTS_H
#define GLM_PARALLEL_UNIT_SLOTS_H
#include <stddef.h>
#include "model/glm.h"

typedef struct glm_unit_slots {
    void *slot[3];        /* S: [0], [1] the units in turn, [2] a tied embedding's own */
    size_t elems[3];      /* their sizes (elements) */
    size_t lo[3], n[3];   /* the unit each holds */
    int busy[3];          /* written by backward, not taken yet */
    int ring, tied, wte_bound;
    size_t wte_lo;        /* flat offset of the tied embedding's unit */
} glm_unit_slots;

/* Slots for m's trainable table as laid out now (after any relayout) on m's backend. */
void glm_unit_slots_init(glm_unit_slots *u, glm_model *m);
void glm_unit_slots_free(glm_unit_slots *u, glm_backend *be);
/* The slot backward's unit starting at flat offset lo goes to (*s). Returns 1 when the slot is
 * to be made fresh (wait for its previous unit, then glm_unit_slots_bind), 0 when it is the
 * tied slot the head already wrote this micro-batch (the embedding adds to it). */
int glm_unit_slots_pick(glm_unit_slots *u, size_t lo, int *s);
/* Slot s zeroed for unit [lo, hi) and marked busy; returns its memory. */
void *glm_unit_slots_bind(glm_unit_slots *u, glm_backend *be, int s, size_t lo, size_t hi);
/* The busy slot of the unit that starts at `first`, now no longer busy; -1 when none. */
int glm_unit_slots_take(glm_unit_slots *u, size_t first);
/* A micro-batch's backward begins: the tied slot starts fresh again. */
void glm_unit_slots_micro(glm_unit_slots *u);
/* The units go to slot 0 first again (a step's end). */
void glm_unit_slots_rewind(glm_unit_slots *u);
/* All slots' elements (for the log lines). */
size_t glm_unit_slots_elems(const glm_unit_slots *u);

#endif
