/* Batching: rows, per-epoch order, data-parallel share, dynamic padding. See loader.h.
 *
 * Rows are fixed when the loader opens: one example each, or with packing consecutive examples
 * of a seeded permutation filled greedily up to max_len. Fixing them keeps the number of steps
 * per epoch constant (the LR schedule needs it) while each epoch still shuffles the rows. */
#include "data/loader.h"
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"

struct glm_loader {
    glm_dataset ds;
    glm_loader_cfg cfg;
    int fill_len;           /* most tokens packed into a row (max_len, or the longest example) */
    int cap_len;            /* row capacity: fill_len rounded up to pad_multiple */
    int64_t n_rows;
    int64_t *row_start;     /* [n_rows + 1] into ex_order: row r holds ex_order[row_start[r] .. row_start[r+1]) */
    int64_t *ex_order;      /* dataset positions, grouped by row */
    int32_t *row_len;       /* [n_rows] tokens per row */
    int64_t epoch_planned;  /* epoch whose rank_rows are computed, -1 none */
    int32_t *rank_rows;     /* [per_rank] row ids this rank visits this epoch, in order */
    int64_t per_rank, steps; /* a whole epoch's */
    /* Resumed on another rank count or batch size (glm_loader_seek_rows): epoch skip_epoch starts
     * skip_rows into its order and is that much shorter; every later epoch is whole. */
    int64_t skip_epoch, skip_rows;
    glm_data_cursor cur;
    int32_t *ids, *lab; int *seg;          /* one row's scratch */
    int64_t *last; int *last_row; int n_last; int64_t last_tokens;
};

void glm_loader_cfg_init(glm_loader_cfg *c) {
    *c = (glm_loader_cfg){.batch_size = 1, .shuffle = 1, .seed = 42, .world = 1};
}

static const int32_t *ex_ids(const glm_loader *l, int64_t k) {
    return l->ds.ex->ids + l->ds.ex->off[glm_dataset_index(&l->ds, k)];
}
static int ex_len(const glm_loader *l, int64_t k) { return glm_examples_len(l->ds.ex, glm_dataset_index(&l->ds, k)); }
/* The longer of a pair's two examples (the row length it needs); the example's length otherwise. */
static int row_need(const glm_examples *ex, int pairs, int64_t i) {
    int n = glm_examples_len(ex, i);
    if (!pairs) return n;
    int s = glm_examples_split(ex, i);
    return s > n - s ? s : n - s;
}

/* A seeded generator per (seed, purpose, epoch) so epochs are independent and reproducible. */
static void rng_for(glm_rng *r, uint64_t seed, uint64_t purpose, int64_t epoch) {
    glm_rng_seed(r, seed ^ (purpose * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)epoch * 0xD1B54A32D192ED03ULL));
}

static void make_rows(glm_loader *l) {
    int64_t n = l->ds.n;
    int32_t *perm = glm_malloc((size_t)(n ? n : 1) * sizeof *perm);
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    if (l->cfg.packing && l->cfg.shuffle) {
        glm_rng r;
        rng_for(&r, l->cfg.seed, 1, 0);
        glm_rng_shuffle_i32(&r, perm, (int)n);
    }
    l->ex_order = glm_malloc((size_t)(n ? n : 1) * sizeof *l->ex_order);
    l->row_start = glm_malloc((size_t)(n + 1) * sizeof *l->row_start);
    l->row_len = glm_malloc((size_t)(n ? n : 1) * sizeof *l->row_len);
    int64_t rows = 0;
    int fill = 0;
    for (int64_t i = 0; i < n; i++) {
        int len = row_need(l->ds.ex, l->cfg.pairs, glm_dataset_index(&l->ds, perm[i]));
        l->ex_order[i] = perm[i];
        if (rows == 0 || !l->cfg.packing || fill + len > l->fill_len) {
            l->row_start[rows++] = i;
            fill = 0;
        }
        fill += len;
        l->row_len[rows - 1] = fill;
    }
    l->row_start[rows] = n;
    l->n_rows = rows;
    free(perm);
}

typedef struct { int32_t row, len; int64_t pos; } keyed;
static int by_len_desc(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos; /* stable, like Python's sorted */
}

/* HF trainer_pt_utils.get_length_grouped_indices on an already permuted order. */
static void group_by_length(const glm_loader *l, int32_t *order, int64_t n) {
    int64_t B = l->cfg.batch_size, mult = n / (B * 4);
    if (mult > 50) mult = 50;
    if (mult == 0) mult = 1;
    int64_t mb = mult * B;
    keyed *k = glm_malloc((size_t)(n ? n : 1) * sizeof *k);
    for (int64_t i = 0; i < n; i++) k[i] = (keyed){order[i], l->row_len[order[i]], i};
    int64_t best = 0;
    for (int64_t s = 0; s < n; s += mb) {
        int64_t m = n - s < mb ? n - s : mb;
        qsort(k + s, (size_t)m, sizeof *k, by_len_desc);
        if (k[s].len > k[best].len) best = s;
    }
    keyed t = k[0]; k[0] = k[best]; k[best] = t; /* the longest batch first: OOM shows at once */
    for (int64_t i = 0; i < n; i++) order[i] = k[i].row;
    free(k);
}

/* Rows of the epoch's order consumed before its first batch (non-zero only after a re-map). */
static int64_t epoch_offset(const glm_loader *l, int64_t epoch) { return epoch == l->skip_epoch ? l->skip_rows : 0; }

/* This rank's rows and batches in epoch e: the rest of the order after the offset, split as
 * DistributedSampler splits a whole epoch. */
static void epoch_shape(const glm_loader *l, int64_t e, int64_t *per_rank, int64_t *steps) {
    int64_t rest = l->n_rows - epoch_offset(l, e), W = l->cfg.world, B = l->cfg.batch_size;
    if (rest == l->n_rows) { *per_rank = l->per_rank; *steps = l->steps; return; }
    *per_rank = l->cfg.drop_last ? rest / W : (rest + W - 1) / W;
    *steps = l->cfg.drop_last ? *per_rank / B : (*per_rank + B - 1) / B;
    if (*steps < 1) *steps = 1; /* a sliver left over still makes one (short) batch */
    if (*per_rank < 1) *per_rank = 1;
}

static void plan_epoch(glm_loader *l, int64_t epoch) {
    int64_t n = l->n_rows;
    int32_t *order = glm_malloc((size_t)(n ? n : 1) * sizeof *order);
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    if (l->cfg.shuffle) {
        glm_rng r;
        rng_for(&r, l->cfg.seed, 2, epoch);
        glm_rng_shuffle_i32(&r, order, (int)n);
    }
    if (l->cfg.group_by_length) group_by_length(l, order, n);
    /* DistributedSampler: rank r takes r, r+W, ... of the order (after a re-map's offset),
     * padded by wrapping (or trimmed) */
    int64_t off = epoch_offset(l, epoch), per_rank, steps;
    epoch_shape(l, epoch, &per_rank, &steps);
    for (int64_t j = 0; j < per_rank; j++) {
        int64_t k = off + l->cfg.rank + j * l->cfg.world;
        l->rank_rows[j] = order[k % n];
    }
    l->epoch_planned = epoch;
    free(order);
}

int glm_loader_open(glm_loader **out, const glm_dataset *ds, const glm_loader_cfg *cfg, glm_err *err) {
    const glm_loader_cfg *c = cfg;
    if (c->batch_size < 1) return glm_fail(err, "batch size %d must be >= 1", c->batch_size);
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return glm_fail(err, "data-parallel rank %d / world %d is out of range", c->rank, c->world);
    if (ds->n < 1) return glm_fail(err, "the dataset is empty");
    if (c->pairs && c->packing) return glm_fail(err, "preference pairs are not packed"); /* the trainer refuses it first */
    int longest = 0;
    for (int64_t k = 0; k < ds->n; k++) {
        int len = row_need(ds->ex, c->pairs, glm_dataset_index(ds, k));
        if (len > longest) longest = len;
    }
    if (c->max_len && c->max_len < longest) {
        glm_fail(err, "the longest example has %d tokens, more than the row length %d", longest, c->max_len);
        return glm_hint(err, "raise the maximum sequence length or lower --max_source_length/--max_target_length");
    }
    glm_loader *l = glm_calloc(1, sizeof *l);
    l->ds = *ds;
    l->cfg = *c;
    int pm = c->pad_multiple > 1 ? c->pad_multiple : 1;
    l->fill_len = c->max_len ? c->max_len : longest;
    l->cap_len = (l->fill_len + pm - 1) / pm * pm;
    make_rows(l);
    int64_t W = c->world, n = l->n_rows;
    l->per_rank = c->drop_last ? n / W : (n + W - 1) / W;
    l->steps = c->drop_last ? l->per_rank / c->batch_size : (l->per_rank + c->batch_size - 1) / c->batch_size;
    if (l->steps == 0) {
        glm_fail(err, "%lld rows make no full batch of %d x %d ranks with drop_last", (long long)n, c->batch_size, c->world);
        glm_loader_free(l);
        return glm_hint(err, "lower the batch size or turn drop_last off");
    }
    l->rank_rows = glm_malloc((size_t)l->per_rank * sizeof *l->rank_rows);
    l->epoch_planned = -1;
    l->skip_epoch = -1;
    l->ids = glm_malloc((size_t)l->cap_len * sizeof *l->ids);
    l->lab = glm_malloc((size_t)l->cap_len * sizeof *l->lab);
    l->seg = glm_malloc((size_t)l->cap_len * sizeof *l->seg);
    l->last = glm_malloc((size_t)c->batch_size * l->cap_len * sizeof *l->last);
    l->last_row = glm_malloc((size_t)c->batch_size * l->cap_len * sizeof *l->last_row);
    if (c->pairs) { /* a pair's two halves are one example: the row buffers hold both */
        l->ids = glm_realloc(l->ids, 2 * (size_t)l->cap_len * sizeof *l->ids);
        l->lab = glm_realloc(l->lab, 2 * (size_t)l->cap_len * sizeof *l->lab);
    }
    *out = l;
    return 0;
}

void glm_loader_free(glm_loader *l) {
    if (!l) return;
    free(l->row_start); free(l->ex_order); free(l->row_len); free(l->rank_rows);
    free(l->ids); free(l->lab); free(l->seg); free(l->last); free(l->last_row);
    free(l);
}

int64_t glm_loader_steps_per_epoch(const glm_loader *l) { return l->steps; }
glm_data_cursor glm_loader_cursor(const glm_loader *l) { return l->cur; }
int64_t glm_loader_last_tokens(const glm_loader *l) { return l->last_tokens; }

void glm_loader_batch_alloc(const glm_loader *l, glm_batch *b) {
    glm_batch_alloc(b, (l->cfg.pairs ? 2 : 1) * l->cfg.batch_size, l->cap_len);
}

/* Pairs: unit u of `units` is one example, its chosen half into row u, its rejected half into row
 * units + u. */
static int next_pairs(glm_loader *l, glm_batch *b, int64_t first, int units, int64_t off, glm_err *err) {
    const glm_examples *ex = l->ds.ex;
    for (int u = 0; u < units; u++) {
        int32_t row = l->rank_rows[first + u];
        int64_t k = l->ex_order[l->row_start[row]], i = glm_dataset_index(&l->ds, k);
        int len = ex_len(l, k), split = glm_examples_split(ex, i);
        memcpy(l->ids, ex_ids(l, k), (size_t)len * sizeof *l->ids);
        glm_examples_labels(ex, i, l->lab);
        int wrapped = off + l->cfg.rank + (first + u) * l->cfg.world >= l->n_rows;
        if (wrapped && l->cfg.no_loss_on_wrap)
            for (int t = 0; t < len; t++) l->lab[t] = -100;
        for (int h = 0; h < 2; h++) {
            int s = h ? split : 0, n = h ? len - split : split;
            if (glm_batch_set_row(b, h * units + u, l->ids + s, l->lab + s, n, ex->pad, ex->gmask, ex->mask, ex->sop))
                return glm_fail(err, "a pair's example of %d tokens does not fit T = %d (a bug)", n, b->T);
        }
        l->last_row[l->n_last] = u;
        l->last[l->n_last++] = k;
        l->last_tokens += len;
    }
    return 0;
}

int glm_loader_seek(glm_loader *l, glm_data_cursor c, glm_err *err) {
    int64_t per_rank, steps;
    epoch_shape(l, c.epoch, &per_rank, &steps);
    if (c.epoch < 0 || c.step < 0 || c.step > steps)
        return glm_fail(err, "data cursor (epoch %lld, step %lld) is outside 0..%lld steps per epoch",
                        (long long)c.epoch, (long long)c.step, (long long)steps);
    if (c.step == steps) { c.epoch++; c.step = 0; }
    l->cur = c;
    return 0;
}

int glm_loader_seek_rows(glm_loader *l, int64_t epoch, int64_t rows, glm_err *err) {
    if (epoch < 0 || rows < 0) return glm_fail(err, "data position (epoch %lld, %lld rows) is negative", (long long)epoch, (long long)rows);
    l->epoch_planned = -1;
    l->skip_epoch = -1;
    if (rows >= l->n_rows) { l->cur = (glm_data_cursor){epoch + 1, 0}; return 0; }
    l->skip_epoch = epoch;
    l->skip_rows = rows;
    l->cur = (glm_data_cursor){epoch, 0};
    return 0;
}

int64_t glm_loader_rows_consumed(const glm_loader *l) {
    int64_t per_rank, steps, e = l->cur.epoch;
    epoch_shape(l, e, &per_rank, &steps);
    int64_t r = epoch_offset(l, e) + l->cur.step * l->cfg.batch_size * l->cfg.world;
    return r < l->n_rows ? r : l->n_rows;
}

int64_t glm_loader_steps_left(const glm_loader *l) {
    int64_t per_rank, steps;
    epoch_shape(l, l->cur.epoch, &per_rank, &steps);
    return steps - l->cur.step;
}

int glm_loader_last_examples(const glm_loader *l, int64_t *out, int *row, int max) {
    for (int i = 0; i < l->n_last && i < max; i++) {
        out[i] = l->last[i];
        if (row) row[i] = l->last_row[i];
    }
    return l->n_last;
}

int glm_loader_next(glm_loader *l, glm_batch *b, glm_err *err) {
    if (l->epoch_planned != l->cur.epoch) plan_epoch(l, l->cur.epoch);
    int64_t first = l->cur.step * l->cfg.batch_size, per_rank, steps, off = epoch_offset(l, l->cur.epoch);
    epoch_shape(l, l->cur.epoch, &per_rank, &steps);
    int rows = (int)(per_rank - first < l->cfg.batch_size ? per_rank - first : l->cfg.batch_size);
    int T = 0, pm = l->cfg.pad_multiple > 1 ? l->cfg.pad_multiple : 1;
    for (int r = 0; r < rows; r++) if (l->row_len[l->rank_rows[first + r]] > T) T = l->row_len[l->rank_rows[first + r]];
    T = (T + pm - 1) / pm * pm;
    int B = (l->cfg.pairs ? 2 : 1) * rows;
    if ((size_t)B * T > b->cap || rows < 1)
        return glm_fail(err, "batch of %d x %d does not fit the %zu allocated (use glm_loader_batch_alloc)", B, T, b->cap);
    b->B = B;
    b->T = T;
    const glm_examples *ex = l->ds.ex;
    l->n_last = 0;
    l->last_tokens = 0;
    if (l->cfg.pairs) {
        if (next_pairs(l, b, first, rows, off, err)) return -1;
        rows = 0; /* the rows are filled */
    }
    for (int r = 0; r < rows; r++) {
        int32_t row = l->rank_rows[first + r];
        int n_seg = 0, fill = 0;
        for (int64_t q = l->row_start[row]; q < l->row_start[row + 1]; q++) {
            int64_t k = l->ex_order[q];
            int len = ex_len(l, k);
            memcpy(l->ids + fill, ex_ids(l, k), (size_t)len * sizeof *l->ids);
            glm_examples_labels(ex, glm_dataset_index(&l->ds, k), l->lab + fill);
            l->seg[n_seg++] = len;
            fill += len;
            l->last_row[l->n_last] = r;
            l->last[l->n_last++] = k;
        }
        l->last_tokens += fill;
        /* position of this row in the wrapped DistributedSampler order: past n it repeats one */
        int wrapped = off + l->cfg.rank + (first + r) * l->cfg.world >= l->n_rows;
        if (wrapped && l->cfg.no_loss_on_wrap)
            for (int i = 0; i < fill; i++) l->lab[i] = -100;
        if (glm_batch_set_row_packed(b, r, l->ids, l->lab, l->seg, n_seg, ex->pad, ex->gmask, ex->mask, ex->sop))
            return glm_fail(err, "row of %d tokens does not fit T = %d (a bug)", fill, T);
    }
    glm_batch_count_targets(b);
    if (++l->cur.step == steps) { l->cur.epoch++; l->cur.step = 0; }
    return 0;
}
