/* Checkpoints and final models of a pipeline run: still one Hugging Face folder. Each stage
 * (its replica-0 rank) writes its own tensors as shard s+1 of P:
 *     model-0000{s+1}-of-0000P.safetensors       the stage's weights
 *     optimizer-0000{s+1}-of-0000P.safetensors   its AdamW state (exp_avg/, exp_avg_sq/, master/
 *                                                prefixes, per tensor, fp32; checkpoints only)
 * and rank 0, once every shard is complete, writes model.safetensors.index.json,
 * optimizer.safetensors.index.json, config.json, the tokenizer files, training_args.json and
 * last trainer_state.json (whose presence marks a checkpoint complete), then renames
 * tmp-checkpoint-N to checkpoint-N. Tensors are stored by name, so any reader — one process,
 * another P, Hugging Face — takes what it needs: a stage loads its tensors through the index
 * (glm_checkpoint_load_state), a single process reads them all. A tied embedding is written
 * once, by the first stage. */
#ifndef GLM_PARALLEL_PIPE_CKPT_H
#define GLM_PARALLEL_PIPE_CKPT_H
#include "parallel/pipe/pipeline.h"
#include "ckpt/checkpoint.h"

/* This stage's shard files in dir: weights as file_dtype (st_dtype), and the optimizer state
 * when o is given (host, over [0, tab.total)). */
/* The file of stage k's 8-bit moments in a checkpoint: optimizer_8bit-0000K-of-0000P.safetensors
 * (K from 1). */
void glm_pipe_q8_file(char *out, size_t n, int k, int P);
int glm_pipe_save_stage(glm_pipe *p, const char *dir, int file_dtype, const glm_opt_state *o, glm_err *err);
/* The index files from the map alone, config.json and the origin's code and tokenizer files
 * (model/ckpt.h) from the stage model m; opt_kinds: 0 no optimizer index, 2 moments, 3
 * moments and master weights. */
int glm_pipe_save_index(const glm_device_map *map, const glm_model *m, const char *dir, int file_dtype, int opt_kinds,
                        glm_err *err);

/* output_dir/checkpoint-<step>, every rank calls it; o is the stage's full optimizer state on
 * replica-0 ranks (NULL elsewhere). Returns -1 on every rank when any rank failed. */
int glm_pipe_checkpoint_save(glm_pipe *p, const char *output_dir, const glm_opt_state *o, const glm_train_state *st,
                             const char *tokenizer_path, const char *args_json, glm_err *err);
/* The final model in output_dir (weights as file_dtype, tokenizer files, training_args.json). */
int glm_pipe_save_final(glm_pipe *p, const char *output_dir, int file_dtype, const char *tokenizer_path,
                        const char *args_json, glm_err *err);

#endif
