/* The data layer's entry point for training: read the train/validation files, build the ptuning
 * examples (examples.h), keep them in a tokenized cache, split off a validation set, and hand
 * out views that the loader (loader.h) batches.
 *
 * Tokenized cache: a data file is tokenized once (records encoded in parallel with OpenMP)
 * into <cache_dir>/<file name>-<hash of path+settings>.glmcache, written atomically (a
 * per-process temp file, fsync, rename) and memory-mapped read-only by this and later runs.
 * The header holds a key — XXH64 of the data file's bytes, the tokenizer fingerprint and every
 * setting that changes the examples — and a hash of the payload, so a stale cache (data or
 * settings changed) or a corrupt one (wrong magic/version/sizes/hash) is detected and rebuilt. */
#ifndef GLM_DATA_H
#define GLM_DATA_H
#include <stdint.h>
#include <stdio.h>
#include "core/err.h"
#include "data/examples.h"
#include "data/reader.h"

/* Everything counted while reading and building examples; printed at start-up. */
typedef struct glm_data_summary {
    int64_t records;          /* records in the file, bad ones included */
    int64_t examples;         /* usable examples */
    int64_t bad_json;         /* skipped: malformed JSON (skip_bad_samples) */
    int64_t bad_record;       /* skipped: not an object, missing/non-string field, bad UTF-8 */
    int64_t empty;            /* dropped: empty query or answer (as ptuning) */
    int64_t no_answer_tokens; /* dropped: the answer encodes to no tokens */
    int64_t truncated_prompt, truncated_answer;
    int64_t tokens, supervised; /* tokens in all examples; tokens with a label */
    int64_t longest, shortest;
    int32_t bom, schema;      /* the file had a UTF-8 BOM; glm_schema used */
    char first_bad[256];      /* where and why the first record was skipped as bad */
} glm_data_summary;

/* The tokenized examples of one data file: concatenated ids with offsets, plus a supervision
 * code per token (label = id where sup = 1, eos where sup = 2 (ChatGLM3's EOS label convention),
 * else -100). Read-only; usually memory-mapped. */
typedef struct glm_examples {
    int64_t n, n_tokens;
    const uint64_t *off;  /* [n + 1]: example i is ids[off[i] .. off[i+1]) */
    const int32_t *ids;   /* [n_tokens] */
    const uint8_t *sup;   /* [n_tokens] */
    int32_t pad, gmask, mask, sop, eop;
    int32_t eos;          /* the label of sup code 2 */
    glm_data_summary summary;
    char path[1024];       /* the data file */
    char cache_path[1024]; /* "" when no cache was used */
    char cache_note[256];  /* "hit", "built", "rebuilt: stale (...)", "rebuilt: corrupt (...)" */
    void *map_; size_t map_len_; void *heap_[3];
} glm_examples;

static inline int glm_examples_len(const glm_examples *ex, int64_t i) { return (int)(ex->off[i + 1] - ex->off[i]); }
/* sup's bits: the label code (0, 1, 2 above), and the first token of a preference pair's
 * rejected example (data/examples.h: a pair is one example, the chosen tokens then the rejected) */
#define GLM_SUP_LABEL 3
#define GLM_SUP_PAIR_SPLIT 4
/* on a --stage kto example's first token: its answer is desirable (the example is the target's
 * tokens, then its KL example's from GLM_SUP_PAIR_SPLIT on) */
#define GLM_SUP_KTO_DESIRABLE 8
/* Whether --stage kto's example i is marked desirable. */
static inline int glm_examples_desirable(const glm_examples *ex, int64_t i) {
    return (ex->sup[ex->off[i]] & GLM_SUP_KTO_DESIRABLE) != 0;
}
/* Where example i's rejected half starts (its length when it is not a pair). */
static inline int glm_examples_split(const glm_examples *ex, int64_t i) {
    int n = glm_examples_len(ex, i);
    const uint8_t *s = ex->sup + ex->off[i];
    for (int k = 1; k < n; k++) if (s[k] & GLM_SUP_PAIR_SPLIT) return k;
    return n;
}

/* A view on examples: idx[k] (or k itself when idx is NULL) for k < n. */
typedef struct glm_dataset {
    const glm_examples *ex;
    const int64_t *idx;
    int64_t n;
} glm_dataset;
static inline int64_t glm_dataset_index(const glm_dataset *d, int64_t k) { return d->idx ? d->idx[k] : k; }

/* One training file with its own reading settings (an entry of LLaMA-Factory's dataset_info.json,
 * data/dataset_info.h). */
typedef struct glm_data_source {
    char name[128];
    char path[4096];
    glm_read_cfg read;        /* its column names point into col: a source is not copied */
    char col[6][128]; /* the columns' names (glm_read_cfg.columns points here); [5] kto_tag */
} glm_data_source;

typedef struct glm_data_cfg {
    const char *train_file, *validation_file;
    const glm_data_source *sources; /* n_sources > 0: the train set is these files' examples, in */
    int n_sources;                  /* order (each its own cache), instead of train_file */
    const glm_data_source *val_sources; /* n_val_sources > 0: the validation set is these files' */
    int n_val_sources;                  /* examples (LLaMA-Factory's eval_dataset), instead of validation_file */
    glm_read_cfg read;        /* schema/container override, column names, skip_bad_samples */
    glm_example_cfg example;  /* lengths, prefix, templates, train_on_prompt */
    double val_size;          /* no validation file: 0 none, < 1 a fraction (rounded up), >= 1 a count */
    int64_t max_train_samples; /* > 0: the train set is made of the first N records (of all sources) */
    int64_t max_samples;       /* > 0: at most the first N records of each source (LLaMA-Factory's) */
    uint64_t seed;            /* for the val_size split */
    const char *cache_dir;    /* NULL: no cache file (examples stay in memory) */
    int overwrite_cache;      /* rebuild even when a valid cache exists */
    int num_threads;          /* tokenizing threads; 0 = all cores (OpenMP default) */
} glm_data_cfg;

void glm_data_cfg_init(glm_data_cfg *c);
/* $GLM_CACHE_DIR, else $XDG_CACHE_HOME/glmtrain, else $HOME/.cache/glmtrain (into buf). */
void glm_data_default_cache_dir(char *buf, size_t n);

/* Tokenized examples of one file, from the cache when it is valid, else built (and cached). */
int glm_examples_load(glm_examples **out, const char *path, const glm_data_cfg *cfg, const glm_encoder *enc,
                      glm_err *err);
void glm_examples_free(glm_examples *ex);
/* One set of the examples of parts[0..n) in order (copied; the parts stay the caller's); path
 * names it in summaries. */
glm_examples *glm_examples_concat(glm_examples *const *parts, int n, const char *path);
/* Labels of example i into labels[0..len) (-100 where not supervised). Returns the length. */
int glm_examples_labels(const glm_examples *ex, int64_t i, int32_t *labels);

typedef struct glm_data {
    glm_examples *train_ex, *val_ex; /* val_ex NULL when the validation set is split off train */
    glm_dataset train, val;          /* val.n == 0: no validation set */
    int64_t *idx_; double val_size; uint64_t seed;
} glm_data;

/* Loads train (and validation) examples and splits as configured. An empty train set (or an
 * empty validation file) is an error that says what was skipped and why. */
int glm_data_load(glm_data *d, const glm_data_cfg *cfg, const glm_encoder *enc, glm_err *err);
void glm_data_free(glm_data *d);
/* The start-up summary: examples read, skipped by reason, truncated, tokens, longest, split. */
void glm_data_print_summary(FILE *f, const glm_data *d, const glm_data_cfg *cfg);
void glm_examples_print_summary(FILE *f, const char *name, const glm_examples *ex, const glm_example_cfg *ec);

#endif
