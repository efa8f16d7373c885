/* Checkpoints as Hugging Face Trainer lays them out: output_dir/checkpoint-N/ with
 * config.json, model.safetensors, optimizer.safetensors (AdamW moments, fp32 master weights),
 * trainer_state.json (step, epoch, data cursor, loss scaler, log history), the tokenizer files
 * and training_args.json, sealed by checksums.json (every file's size and XXH64). A checkpoint is
 * written under tmp-checkpoint-N, sealed, and renamed when complete, so a crash never leaves a
 * half checkpoint that resume would pick up; a failed save removes its tmp folder. */
#ifndef GLM_CHECKPOINT_H
#define GLM_CHECKPOINT_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

typedef struct glm_train_state {
    long global_step;     /* optimizer steps done */
    long epoch;           /* current epoch (0-based) */
    long cursor;          /* micro-batches of this epoch already consumed */
    double loss_scale;    /* fp16 dynamic loss scale (0 when unused) */
    long good_steps;      /* fp16: clean steps since the last scale change */
    long skipped_steps;   /* fp16: steps skipped for inf/nan */
    long scale_hysteresis; /* fp16 with DeepSpeed's scaler: overflows still tolerated before the scale halves (0: none kept) */
    double tokens_seen;   /* supervised tokens trained on */
    char *log_history;    /* JSON array text of logged records (owned) */
    char run_id[24];      /* random at a fresh start, kept when resuming: whose checkpoints are whose */
    long world_size;      /* data-parallel ranks that wrote it (0: unknown, an earlier glmtrain) */
    long data_rows;       /* rows of the epoch's data order consumed, every rank's together (-1: unknown) */
    uint64_t data_hash;   /* of the tokenized training examples (ids and supervision; 0: unknown) */
    /* --load_best_model_at_end: the best evaluation so far and the checkpoint saved with it
     * (Hugging Face's best_metric / best_model_checkpoint; best_checkpoint "" when none) */
    double best_metric;
    char best_checkpoint[1024];
    /* --early_stopping_patience: evaluations in a row without an improvement, and the settings, as
     * transformers keeps EarlyStoppingCallback's state (stateful_callbacks; patience 0: none) */
    long early_stop_count, early_stop_patience;
    double early_stop_threshold;
    /* --lr_scheduler_type reduce_lr_on_plateau: its state at the save (has_plateau 0: another schedule) */
    int has_plateau;
    glm_lr_plateau plateau;
    /* --save_only_model: the checkpoint being written holds the model as the final save writes
     * it and no optimizer state ("save_only_model": true in trainer_state.json, which
     * glm_checkpoint_is_model_only reads back), so it cannot resume */
    int model_only;
} glm_train_state;

/* Optimizer state in host memory over flat elements of the tensor table's layout: [lo, hi)
 * (the whole model for one process), or when nspan > 0 the pieces span[0..nspan) one after
 * another (a ZeRO shard: one piece of every gradient bucket, parallel/dp/dp.h). The file format
 * is per tensor, so state saved by N ranks loads on M. */
typedef struct glm_opt_state {
    size_t lo, hi;
    const glm_span *span; /* ascending, not overlapping; NULL: the one range [lo, hi) */
    int nspan;
    float *m, *v;        /* [elements held] AdamW moments */
    float *master;       /* [elements held] fp32 master weights; NULL when the run keeps none */
    long step;           /* optimizer steps taken */
    /* 8-bit moments as stored (--optim adamw_8bit), beside their fp32 values: a run of the same
     * layout (q8_n state elements) resumes from these exactly; any other reads the fp32 values.
     * q8_n = 0: none. Written to optimizer_8bit.safetensors. */
    size_t q8_n;
    int q8_ranks;        /* the states of how many ranks' shards follow one another (0 or 1: one process's) */
    uint8_t *qm, *qv;    /* [q8_n] */
    float *am, *av;      /* [ceil(q8_n / GLM_ADAM8_BLOCK)] */
    /* the trainable table the codes follow (glm_table_fingerprint; 0: not known): a checkpoint
     * of another table with as many elements (another pipeline split) is not taken for this one */
    uint64_t q8_table;
    /* GaLore's projected rows (optim/galore.h; NULL: a run without GaLore): their state goes to
     * and comes from optimizer_galore.safetensors, and optimizer.safetensors keeps no moments of
     * theirs. A checkpoint of a run with GaLore does not resume one without it, nor the reverse. */
    struct glm_galore *galore;
} glm_opt_state;

/* Writes output_dir/checkpoint-<step>. tokenizer_path may be NULL; args_json may be NULL. */
int glm_checkpoint_save(const char *output_dir, glm_model *m, const glm_adamw *opt, const glm_train_state *st,
                        const char *tokenizer_path, const char *args_json, glm_err *err);
/* Restores weights, optimizer state and the train state from a checkpoint folder. */
int glm_checkpoint_load(const char *dir, glm_model *m, glm_adamw *opt, glm_train_state *st, glm_err *err);
/* The same with host optimizer state: save needs o over [0, tab.total); load fills o's slice
 * (master from the saved weights when the checkpoint has none) and o->step, and loads every
 * weight into m. */
int glm_checkpoint_save_state(const char *output_dir, glm_model *m, const glm_opt_state *o, const glm_train_state *st,
                              const char *tokenizer_path, const char *args_json, glm_err *err);
int glm_checkpoint_load_state(const char *dir, glm_model *m, glm_opt_state *o, glm_train_state *st, glm_err *err);
/* The 8-bit moments as stored in dir, when they are of o's layout (o->q8_n elements from
 * o->q8_ranks ranks; buffers allocated by the caller): 1 read, 0 none of that layout (the fp32
 * moments then stand), -1 a damaged file. */
int glm_checkpoint_load_8bit(const char *dir, const char *file, glm_opt_state *o, glm_err *err);
/* Host buffers for o's 8-bit moments: `ranks` shards (0 or 1: one process's state) of n elements
 * in all, laid out by table tab (its fingerprint); glm_opt_state_free_q8 frees them. */
void glm_opt_state_alloc_q8(glm_opt_state *o, size_t n, int ranks, const glm_table *tab);
void glm_opt_state_free_q8(glm_opt_state *o);
/* Writes o's 8-bit moments (codes, absmax, layout) to path: optimizer_8bit.safetensors, or a
 * pipeline stage's optimizer_8bit-0000K-of-0000P.safetensors (file NULL above: the former). */
int glm_checkpoint_save_8bit(const char *path, const glm_opt_state *o, glm_err *err);
/* glm_checkpoint_load with the 8-bit moments read from `q8_file` in dir (NULL: the default). */
int glm_checkpoint_load_as(const char *dir, glm_model *m, glm_adamw *opt, const char *q8_file, glm_train_state *st,
                           glm_err *err);
/* The complete checkpoint with the highest step in output_dir; -1 when there is none. */
int glm_checkpoint_latest(const char *output_dir, char *out, size_t n);
/* The steps of output_dir's complete checkpoints, ascending (*steps: caller frees); their count. */
int glm_checkpoint_list(const char *output_dir, long **steps);
/* Deletes the oldest complete checkpoints of run run_id beyond `limit` (0 = keep all); another
 * run's checkpoints (or an earlier glmtrain's, without a run id) are neither counted nor deleted. */
int glm_checkpoint_rotate(const char *output_dir, int limit, const char *run_id, glm_err *err);
/* The same, never deleting step `keep_step` (> 0: the best checkpoint of --load_best_model_at_end),
 * which counts toward the limit as the newest does; with a limit of 1 the newest stays beside it,
 * as Hugging Face's Trainer keeps both. */
int glm_checkpoint_rotate_keep(const char *output_dir, int limit, const char *run_id, long keep_step, glm_err *err);
/* Copies the tokenizer files of tokenizer_path (a .model file, or a folder: ice_text.model /
 * tokenizer.model, tokenizer_config.json, special_tokens_map.json and the code files its
 * auto_map names, as glm_copy_source_files) into dir. */
int glm_copy_tokenizer_files(const char *tokenizer_path, const char *dir, glm_err *err);
/* Removes a folder tree. */
int glm_remove_tree(const char *path);
/* A checkpoint's folder, for every writer: glm_checkpoint_begin makes
 * output_dir/tmp-checkpoint-<step> (its path into tmp, n bytes) after the caller has written
 * nothing yet; glm_checkpoint_complete writes trainer_state.json (its presence marks the
 * checkpoint complete), seals the folder and renames it checkpoint-<step>. On a failure in
 * between, the caller passes tmp to glm_checkpoint_abandon. */
int glm_checkpoint_begin(const char *output_dir, long step, char *tmp, size_t n, glm_err *err);
int glm_checkpoint_complete(const char *output_dir, const char *tmp, const glm_train_state *st, long opt_step, glm_err *err);
/* Whether dir's trainer_state.json says it was saved with --save_only_model (no optimizer state). */
int glm_checkpoint_is_model_only(const char *dir);

/* Integrity and clean-up (seal.c). Every checkpoint writer calls glm_checkpoint_seal on its
 * tmp folder as the last step before the rename, and glm_checkpoint_abandon when a save fails. */
#define GLM_CKPT_MANIFEST "checksums.json"
/* Writes dir/checksums.json: size and XXH64 of every file in dir. */
int glm_checkpoint_seal(const char *dir, glm_err *err);
/* 0: every file of the manifest has its size and hash. 1: no manifest (a checkpoint of an
 * earlier glmtrain; why says it was not verified). -1: damaged; why names the file and how. */
int glm_checkpoint_verify(const char *dir, char *why, size_t n);
/* A fresh random run id (16 hex digits) into out. */
void glm_run_id_new(char *out, size_t n);
/* The run id in dir/trainer_state.json, "" when it has none. */
void glm_checkpoint_run_id(const char *dir, char *out, size_t n);
/* output_dir/run_id.txt: the run that last started or resumed in output_dir ("" when none). */
int glm_output_run_id_write(const char *output_dir, const char *run_id, glm_err *err);
void glm_output_run_id(const char *output_dir, char *out, size_t n);
/* Removes tmp-checkpoint-* folders left by killed or failed saves, logging each. */
int glm_checkpoint_clean_stale(const char *output_dir, glm_err *err);
/* Removes every checkpoint-N folder of output_dir, logging each (--overwrite_output_dir). */
int glm_checkpoint_remove_all(const char *output_dir, glm_err *err);
/* Bytes a checkpoint of a model of config c takes: its trainable rows in fp32, opt_kinds fp32
 * optimizer tensors per row, the tokenizer files and text_bytes of JSON. */
double glm_checkpoint_bytes(const glm_config *c, int opt_kinds, const char *tokenizer_path, size_t text_bytes);
/* Bytes the final save writes (glm_model_save_final): full and freeze, the whole model in
 * dtype_bytes per element with a tied head's copy; LoRA and P-Tuning v2, the trainable rows in
 * fp32 (P-Tuning's twice: THUDM's pytorch_model.bin beside them); and the tokenizer and text. */
double glm_final_model_bytes(const glm_config *c, int dtype_bytes, const char *tokenizer_path, size_t text_bytes);
/* After a failed save: removes tmp (when a folder) and sets a hint with the bytes the checkpoint
 * needs and what the disk holding output_dir has free. Returns -1. */
int glm_checkpoint_abandon(const char *output_dir, const char *tmp, double need, glm_err *err);

#endif
