#include "data/batch.h"
#include <stdlib.h>
#include "core/err.h"

void glm_batch_alloc(glm_batch *b, int B, int T) {
    size_t n = (size_t)B * T;
    b->B = B; b->T = T;
    b->ids = glm_calloc(n, sizeof(int32_t));
    b->pos = glm_calloc(n, sizeof(int32_t));
    b->block_pos = glm_calloc(n, sizeof(int32_t));
    b->kv_lo = glm_calloc(n, sizeof(int32_t));
    b->kv_hi = glm_calloc(n, sizeof(int32_t));
    b->targets = glm_calloc(n, sizeof(int32_t));
    b->n_targets = 0;
    b->cap = n;
}

void glm_batch_free(glm_batch *b) {
    free(b->ids); free(b->pos); free(b->block_pos); free(b->kv_lo); free(b->kv_hi); free(b->targets);
    *b = (glm_batch){0};
}

/* One segment [start, start+n) of row r. */
static void set_segment(glm_batch *b, int r, int start, const int32_t *ids, const int32_t *labels, int n,
                        int32_t gmask_id, int32_t mask_id, int32_t sop_id) {
    int ctx = n, mask_pos = -1, first_mask = -1;
    for (int i = 0; i < n; i++) if (ids[i] == sop_id) { ctx = i; break; }
    /* the model prefers [gMASK], then [MASK] (spec 5.1) */
    for (int i = 0; i < n; i++) {
        if (ids[i] == gmask_id) { mask_pos = i; break; }
        if (ids[i] == mask_id && first_mask < 0) first_mask = i;
    }
    if (mask_pos < 0) mask_pos = first_mask >= 0 ? first_mask : (ctx > 0 ? ctx - 1 : 0);
    int32_t *row = b->ids + (size_t)r * b->T;
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)r * b->T + start + i;
        row[start + i] = ids[i];
        b->pos[k] = i < ctx ? i : mask_pos;
        b->block_pos[k] = i < ctx ? 0 : i - ctx + 1;
        b->kv_lo[k] = start;
        b->kv_hi[k] = start + (ctx > i + 1 ? ctx : i + 1);
        b->targets[k] = (labels && i + 1 < n) ? labels[i + 1] : -100;
    }
}

/* Positions [n, T) of row r: padding, its own causal segment (never seen by real tokens), no loss. */
static void set_padding(glm_batch *b, int r, int n, int32_t pad_id) {
    for (int i = n; i < b->T; i++) {
        size_t k = (size_t)r * b->T + i;
        b->ids[k] = pad_id;
        b->pos[k] = 0;
        b->block_pos[k] = 0;
        b->kv_lo[k] = n;
        b->kv_hi[k] = i + 1;
        b->targets[k] = -100;
    }
}

int glm_batch_set_row(glm_batch *b, int r, const int32_t *ids, const int32_t *labels, int n,
                      int32_t pad_id, int32_t gmask_id, int32_t mask_id, int32_t sop_id) {
    if (n > b->T || r >= b->B) return -1;
    set_segment(b, r, 0, ids, labels, n, gmask_id, mask_id, sop_id);
    set_padding(b, r, n, pad_id);
    return 0;
}

int glm_batch_set_row_packed(glm_batch *b, int r, const int32_t *ids, const int32_t *labels,
                             const int *seg_len, int n_seg, int32_t pad_id, int32_t gmask_id,
                             int32_t mask_id, int32_t sop_id) {
    long total = 0;
    for (int k = 0; k < n_seg; k++) {
        if (seg_len[k] < 0) return -1;
        total += seg_len[k];
    }
    if (total > b->T || r >= b->B) return -1;
    int start = 0;
    for (int k = 0; k < n_seg; k++) {
        set_segment(b, r, start, ids + start, labels ? labels + start : NULL, seg_len[k],
                    gmask_id, mask_id, sop_id);
        start += seg_len[k];
    }
    set_padding(b, r, start, pad_id);
    return 0;
}

void glm_batch_count_targets(glm_batch *b) {
    int c = 0;
    for (size_t i = 0; i < (size_t)b->B * b->T; i++) c += b->targets[i] != -100;
    b->n_targets = c;
}

glm_batch glm_batch_rows(const glm_batch *b, int r0, int n) {
    glm_batch v = *b;
    size_t at = (size_t)r0 * b->T;
    v.B = n;
    v.ids += at; v.pos += at; v.block_pos += at; v.kv_lo += at; v.kv_hi += at; v.targets += at;
    v.cap = (size_t)n * b->T;
    glm_batch_count_targets(&v);
    return v;
}
