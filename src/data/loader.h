/* Micro-batches from a dataset view, with the semantics of HF Trainer's dataloader:
 *
 *  - order: each epoch a permutation seeded by (seed, epoch) — or file order with shuffle 0;
 *    group_by_length reorders it like HF's LengthGroupedSampler (megabatches of
 *    min(n / (4B), 50) * B indices of the permutation, each sorted longest first, the longest
 *    megabatch's head moved to the front);
 *  - rows: one example per row, or with packing several consecutive examples per row while they
 *    fit in max_len (each keeps its own positions and attention, batch.h);
 *  - data parallel: rows are split like torch's DistributedSampler — padded by wrapping around
 *    (or trimmed with drop_last) to a multiple of world, rank r takes rows r, r+world, ...;
 *  - batches: B consecutive rows of the rank's share, padded to the longest row (rounded up to
 *    pad_multiple); the last partial batch is kept (drop_last 0, HF default) or dropped.
 * The position is a cursor (epoch, step) that a checkpoint saves; seeking to it reproduces the
 * exact batches that followed. */
#ifndef GLM_DATA_LOADER_H
#define GLM_DATA_LOADER_H
#include <stdint.h>
#include "core/err.h"
#include "data/batch.h"
#include "data/data.h"

typedef struct glm_loader_cfg {
    int batch_size;      /* B rows per micro-batch (per rank) */
    int max_len;         /* row capacity; 0 = the longest example. Must hold every example. */
    int pad_multiple;    /* round T up to a multiple of this (e.g. 8); 0/1 = exact */
    int shuffle;         /* default 1 */
    int group_by_length;
    int packing;
    int drop_last;
    int no_loss_on_wrap; /* rows repeated to pad the epoch to a multiple of world carry no targets
                          * (evaluation: each example counted once over all ranks) */
    uint64_t seed;       /* default 42 */
    int rank, world;     /* default 0, 1 */
    int pairs;           /* preference pairs (data.h GLM_SUP_PAIR_SPLIT): each example is a pair, and
                          * batch_size counts pairs; a batch of P pairs has 2P rows, the chosen
                          * examples in rows 0..P-1, the rejected ones in rows P..2P-1 (LLaMA-Factory's
                          * PairwiseDataCollator), padded to the longest of them. No packing. */
} glm_loader_cfg;
void glm_loader_cfg_init(glm_loader_cfg *c);

typedef struct glm_data_cursor { int64_t epoch, step; } glm_data_cursor;

typedef struct glm_loader glm_loader;
/* ds must outlive the loader. */
int glm_loader_open(glm_loader **out, const glm_dataset *ds, const glm_loader_cfg *cfg, glm_err *err);
void glm_loader_free(glm_loader *l);

/* Micro-batches per epoch for this rank (the same on every rank). */
int64_t glm_loader_steps_per_epoch(const glm_loader *l);
/* Allocates b with the largest shape the loader produces (B x capacity). */
void glm_loader_batch_alloc(const glm_loader *l, glm_batch *b);
/* Fills b with the batch at the cursor and advances it (rolling into the next epoch after the
 * last step). b->B and b->T are set per batch. Returns 0 or -1. */
int glm_loader_next(glm_loader *l, glm_batch *b, glm_err *err);
glm_data_cursor glm_loader_cursor(const glm_loader *l);
int glm_loader_seek(glm_loader *l, glm_data_cursor c, glm_err *err);
/* The position as rows of the epoch's order (every rank's together) that earlier batches took:
 * what a checkpoint keeps so that a run resumed on another rank count or batch size goes on
 * with exactly the rows not yet trained (the cursor counts this configuration's batches). */
int64_t glm_loader_rows_consumed(const glm_loader *l);
/* Continues epoch `epoch` after its first `rows` rows: that epoch is split over this loader's
 * ranks and batches from there (and is shorter), the next ones are whole. */
int glm_loader_seek_rows(glm_loader *l, int64_t epoch, int64_t rows, glm_err *err);
/* Micro-batches left in the current epoch from the cursor. */
int64_t glm_loader_steps_left(const glm_loader *l);
/* Dataset positions (k < ds->n, not file indices) of the examples in the last batch, in row
 * order, and (row != NULL) the batch row of each; returns how many (at most max are written).
 * For tests and debugging. */
int glm_loader_last_examples(const glm_loader *l, int64_t *out, int *row, int max);
/* Real (non-pad) tokens in the last batch. */
int64_t glm_loader_last_tokens(const glm_loader *l);

#endif
