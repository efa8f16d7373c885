/* What the model's two halves share and nothing else uses: glm.c sets a model up (tables, units,
 * activation buffers, the batch on the device) and glm_step.c runs its forward and backward.
 * Other layers go through model/glm.h. */
#ifndef GLM_MODEL_GLM_INTERNAL_H
#define GLM_MODEL_GLM_INTERNAL_H
#include <stddef.h>
#include "model/glm.h"

/* Unit u's first flat offset in the trainable table (u = -1 the embedding, 0..L-1 a layer, L the
 * final norm and head), or SIZE_MAX when none of its rows trains. */
size_t glm_unit_lo(const glm_model *m, int u);
/* ZeRO-3: unit u's weights are needed now; nothing for a unit with no trainable row. */
void glm_need(glm_model *m, int u);
/* The unit holding the head's weight: the embedding's when tied. */
int glm_head_unit(const glm_model *m);
/* Before backward writes the gradients of the unit starting at flat offset lo (the grads_unit
 * hook may send them elsewhere); the unit's gradient views follow. */
void glm_begin_unit(glm_model *m, size_t lo);
/* The lowest of the stage's layers whose backward matters. */
int glm_backward_floor(const glm_model *m);
/* The activation sets the model holds for its checkpointing level and floor (m->act_floor). */
int glm_act_sets(const glm_model *m);
/* (Re)allocates activation buffers when a batch needs more room than the last one. */
void glm_ensure_acts(glm_model *m, int B, int T);
/* Uploads the batch; the supervised rows are compacted on the host. */
void glm_upload_batch(glm_model *m, const glm_batch *b);

#endif
