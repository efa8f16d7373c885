/* A micro-batch as the model consumes it: host arrays, row-major [B, T], right-padded.
 * Built by the data layer from tokenized examples; every ChatGLM-specific rule about positions
 * and the prefix-LM mask is applied here, so the model and backends only see numbers.
 *
 * Attention rule, one contiguous key range per query: query token i (flat index b*T+i) may
 * attend keys j (same row) with kv_lo[i] <= j < kv_hi[i]. For a ChatGLM example occupying
 * [start, end) of its row with <sop> at ctx (absolute index):
 *   kv_lo = start, kv_hi = max(ctx, i + 1)     (context bidirectional, answer causal)
 * This is exactly the original mask allowed(i,j) = (j < ctx) || (j <= i), restricted to the
 * example's own segment when several examples are packed into one row. Padding tokens after
 * the last example form their own segment (they see only themselves and earlier pads; nothing
 * real sees them) and have target -100.
 *
 * Positions (spec 5.2), relative to the segment start: position_ids = i for i < ctx, else
 * mask_pos (the [gMASK] index); block_position_ids = 0 for i < ctx, else i - ctx + 1.
 * targets[i] = label of token i+1 in the same segment (the shifted label), or -100. */
#ifndef GLM_BATCH_H
#define GLM_BATCH_H
#include <stddef.h>
#include <stdint.h>

typedef struct glm_batch {
    int B, T;            /* rows, padded length */
    int32_t *ids;        /* [B*T] token ids (pad id in padding) */
    int32_t *pos;        /* [B*T] position_ids (2D rotary, first half of each head) */
    int32_t *block_pos;  /* [B*T] block_position_ids (second half) */
    int32_t *kv_lo;      /* [B*T] first key index this query may see (within its row) */
    int32_t *kv_hi;      /* [B*T] one past the last key index this query may see */
    int32_t *targets;    /* [B*T] next-token target, -100 = no loss */
    int n_targets;       /* number of targets != -100 in this batch */
    size_t cap;          /* elements allocated per array (B*T at glm_batch_alloc). The data loader
                          * allocates its largest shape once and lowers B and T per batch (dynamic
                          * padding); the arrays are then [B*T] with the current T as row stride. */
} glm_batch;

void glm_batch_alloc(glm_batch *b, int B, int T);
void glm_batch_free(glm_batch *b);

/* Fills row r of the batch from one example: ids[0..n) with labels[0..n) (labels -100 where no
 * loss, labels[i] = ids[i] where the token is supervised, as ptuning/main.py builds them),
 * padding the rest of the row with pad_id. gmask_id/sop_id locate mask_pos and ctx; an example
 * with no <sop> is treated as all context (ctx = n). Returns 0, or -1 when n > T. */
int glm_batch_set_row(glm_batch *b, int r, const int32_t *ids, const int32_t *labels, int n,
                      int32_t pad_id, int32_t gmask_id, int32_t mask_id, int32_t sop_id);
/* Packing: several examples in one row, back to back. ids/labels hold the n_seg examples
 * concatenated, seg_len[k] the length of example k. Each example gets the same positions, kv range
 * and targets it would get alone in a row (positions restart at 0, attention never crosses into
 * another example, no target crosses a boundary); the tail is padding as above. Returns 0, or -1
 * when the examples do not fit in T. */
int glm_batch_set_row_packed(glm_batch *b, int r, const int32_t *ids, const int32_t *labels,
                             const int *seg_len, int n_seg, int32_t pad_id, int32_t gmask_id,
                             int32_t mask_id, int32_t sop_id);
/* Recounts n_targets. */
void glm_batch_count_targets(glm_batch *b);
/* A view of rows [r0, r0 + n) of b: its arrays, not copied (never freed); n_targets recounted. */
glm_batch glm_batch_rows(const glm_batch *b, int r0, int n);

#endif
