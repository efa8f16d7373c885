/* Generation across devices: the model split by a device map (parallel/pipe/device_map.h) into
 * stages held by one process, each on its own backend (GPU k for stage k, or all on the CPU),
 * run one after another for every decoding step — what THUDM's load_model_on_gpus does with
 * accelerate. No pipelining between steps: decoding is sequential, so a stage waits while the
 * others run; the point is to fit a model that one device cannot hold.
 *
 * glm_pipe_forward_cached has exactly glm_forward_cached's contract (model/glm.h), with a
 * per-stage KV cache (each stage caches its own layers on its own device). The hidden states
 * [B*Tq, H] travel between stages through host memory as floats (lossless for bf16/fp16).
 * The final LayerNorm and the head run on the last stage (THUDM's map puts them on GPU 0;
 * `thudm` keeps its layer ranges and moves them, as for training); a tied head means the last
 * stage holds a copy of word_embeddings, read from the same checkpoint tensor. */
#ifndef GLM_PARALLEL_PIPE_INFER_H
#define GLM_PARALLEL_PIPE_INFER_H
#include "model/glm.h"
#include "parallel/pipe/device_map.h"

typedef struct glm_pipe_lm {
    glm_device_map map;
    glm_config cfg;
    int n;                 /* stages */
    glm_backend **be;      /* [n]: stage k's backend (entries may repeat, e.g. one CPU backend) */
    int owns_backends;     /* made by glm_pipe_lm_open: destroyed by glm_pipe_lm_free */
    glm_model *st;         /* [n] stage models */
} glm_pipe_lm;

typedef struct glm_pipe_cache {
    int B, Tmax, len;      /* as glm_kvcache, the same for every stage */
    glm_kvcache *kv;       /* [n] */
    float *h[2];           /* host staging between stages, [cap] floats each */
    size_t cap;
} glm_pipe_cache;

/* Stage models on the given backends (be[k] for stage k), zero weights; load them next. */
void glm_pipe_lm_init(glm_pipe_lm *lm, const glm_config *c, const glm_device_map *map, glm_backend **be);
/* Each stage reads its tensors from a model folder / file (safetensors or torch .bin, single or
 * sharded: glm_model_load). */
int glm_pipe_lm_load(glm_pipe_lm *lm, const char *path, glm_err *err);
/* Each stage reads its rows of an adapter folder (glm_adapter_load: LoRA pairs of its layers, or
 * a P-Tuning v2 prefix encoder, which every stage holding layers keeps a copy of); the stages
 * were made with the adapter's settings in cfg.peft (glm_adapter_read_config). */
int glm_pipe_lm_load_adapter(glm_pipe_lm *lm, const char *dir, glm_err *err);
/* The whole setup for `glmtrain generate/chat --device_map SPEC [--pipeline_parallel_size P]
 * [--adapter DIR]`: the model's config (cfg, e.g. with --quantization_bit's setting, or NULL:
 * config.json of model_path), with the adapter's settings when adapter is not NULL, the map
 * (P <= 0: the number of visible GPUs, or the map file's count), one backend per stage — GPU k
 * (device "cuda" or "auto" with GPUs; dtype as given) or the CPU (fp32) — and the weights (a
 * quantized base quantized as it loads, or read as stored; the LoRA adapters of the comma list
 * `merged`, NULL or "" for none, merged into it), then the adapter's. */
int glm_pipe_lm_open(glm_pipe_lm *lm, const glm_config *cfg, const char *model_path, const char *merged, const char *adapter,
                     const char *device_map, int P, const char *device, glm_dtype dtype, glm_err *err);
void glm_pipe_lm_free(glm_pipe_lm *lm);
/* Makes stage k's device current, for work on its backend outside these calls (allocations,
 * uploads); returns the caller's device, which glm_pipe_restore makes current again (-1:
 * nothing to restore). */
int glm_pipe_enter(const glm_pipe_lm *lm, int k);
void glm_pipe_restore(int prev);

void glm_pipe_cache_init(glm_pipe_lm *lm, glm_pipe_cache *c, int B, int Tmax);
/* Raises the capacity to Tmax tokens per row, keeping what is cached. */
void glm_pipe_cache_grow(glm_pipe_lm *lm, glm_pipe_cache *c, int Tmax);
void glm_pipe_cache_free(glm_pipe_lm *lm, glm_pipe_cache *c);

/* glm_forward_cached through every stage. */
int glm_pipe_forward_cached(glm_pipe_lm *lm, glm_pipe_cache *c, int Tq, const int32_t *ids, const int32_t *pos,
                            const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi, float *hidden_out,
                            float *logits_out, glm_err *err);

/* Continuous batching across the stages (serve): glm_forward_cached_slots's contract
 * (model/glm.h) over a cache made by glm_pipe_cache_init(lm, c, slots, Tmax) used as a pool of
 * slots; each stage keeps its layers' slots on its own device (greedy_out as
 * glm_stage_forward_cached_slots). */
int glm_pipe_forward_cached_slots(glm_pipe_lm *lm, glm_pipe_cache *c, int slot0, int nrows, int Tq, const int *len,
                                  const int *n_new, const int32_t *ids, const int32_t *pos, const int32_t *block_pos,
                                  const int32_t *kv_lo, const int32_t *kv_hi, float *logits_out, int32_t *greedy_out, float *last_hidden_out,
                                  glm_err *err);
/* glm_cached_rows_logits, glm_cached_picked_logits and glm_cached_rows_logprobs on the last stage, after a
 * glm_pipe_forward_cached_slots call. */
int glm_pipe_cached_rows_logits(glm_pipe_lm *lm, glm_pipe_cache *c, int r0, int n, float *logits_out, glm_err *err);
int glm_pipe_cached_picked_logits(glm_pipe_lm *lm, glm_pipe_cache *c, const int32_t *rows, int n, float *logits_out,
                                  glm_err *err);
int glm_pipe_cached_rows_logprobs(glm_pipe_lm *lm, glm_pipe_cache *c, int r0, int n, const int32_t *targets, float *lp,
                                  int32_t *best_id, float *best_lp, glm_err *err);
/* Every stage's work buffers for calls of up to ntokens new tokens (glm_kvcache_reserve). */
void glm_pipe_cache_reserve(glm_pipe_lm *lm, glm_pipe_cache *c, int ntokens);
/* glm_kvcache_copy_slot on every stage's cache. */
void glm_pipe_cache_copy_slot(glm_pipe_lm *lm, glm_pipe_cache *c, int src, int dst, int n);

#endif
