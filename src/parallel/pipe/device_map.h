/* Which layers each pipeline stage (one GPU, one process) holds: `--device_map` and
 * `--pipeline_parallel_size P`.
 *
 *   auto   contiguous layer ranges that minimise the largest stage's memory (the per-stage
 *          memory plan below: weights, gradients, optimizer state, activations and the
 *          pipeline's stashed inputs when training; weights when generating);
 *   thudm  the layer ranges of THUDM's utils.py auto_configure_device_map(P) (spec section 9:
 *          30 units for 28 layers, 2 of them taken on GPU 0 by the embedding and the head);
 *   FILE   a JSON object in accelerate's device_map form, module name -> stage (an integer
 *          or "cuda:N"): "transformer.word_embeddings", "transformer.layers.N",
 *          "transformer.final_layernorm", "lm_head" (optional; it follows the final norm).
 *
 * Stages run in order: the embedding is on stage 0, stages increase along the layers, and the
 * final LayerNorm and the head are on the last stage. THUDM puts final_layernorm and lm_head on
 * GPU 0 (with the embedding, where accelerate brings the output back); a pipeline needs them
 * after the last layer, so `thudm` — and a FILE with THUDM's placement — keeps THUDM's layer
 * ranges and runs the final norm and head on the last stage (head_moved says so). Everything
 * else out of order is rejected. A tied head on a later stage than the embedding means that
 * stage holds a copy of word_embeddings (see parallel/pipe/pipeline.h). */
#ifndef GLM_PARALLEL_DEVICE_MAP_H
#define GLM_PARALLEL_DEVICE_MAP_H
#include <stdio.h>
#include "backend/backend.h"
#include "core/err.h"
#include "model/config.h"
#include "model/glm.h"

#define GLM_MAX_STAGES 64

typedef struct glm_stage {
    int l0, l1;   /* layers [l0, l1) */
    int embed;    /* holds transformer.word_embeddings (stage 0) */
    int head;     /* holds final_layernorm and lm_head (the last stage) */
} glm_stage;

typedef struct glm_device_map {
    int n;                       /* stages */
    glm_stage s[GLM_MAX_STAGES];
    int head_moved;              /* the source placed final_layernorm / lm_head on stage 0 */
    char source[96];             /* "auto", "thudm", or the file name */
} glm_device_map;

/* What the plan is for: the memory of one stage depends on it. */
typedef struct glm_stage_shape {
    glm_dtype dtype;
    int B, T;               /* micro-batch rows x tokens */
    int gradient_checkpointing;
    int n_micro;            /* micro-batches per step: how many inputs a stage stashes (1F1B) */
    int training;           /* 0: weights only (generation) */
    int dp;                 /* data-parallel replicas sharing the optimizer state (ZeRO >= 1), 1 = none */
    int zero2;              /* ZeRO-2 (one stage only): gradients = shard + staging (parallel/dp/dp_zero2.c) */
    int peer_ranks;         /* GPU ranks exchanging gradients by copies (parallel/dp/dp_peer.c, one stage, ZeRO 0/1):
                             * gradients + a landing buffer of (peer_ranks - 1) shards; 0 = none */
    int head_chunk;         /* rows of logits at once (256) */
    int optim;              /* glm_optim_kind: fp32 or 8-bit moments */
    int offload;            /* the optimizer state and master weights in host memory */
    int in_backward;        /* one process, each unit updated in backward: gradients = staging slots */
    int zero3;              /* ZeRO-3 (one stage): weights = the shard + the units gathered at once */
} glm_stage_shape;
void glm_stage_shape_init(glm_stage_shape *sh); /* fp32, 1 x 512, training, 1 micro-batch, no ZeRO */

/* spec "auto", "thudm" or a JSON file; P = 0 takes the count from the file (auto/thudm need
 * P >= 1). Fails naming the offending module, stage or flag. */
int glm_device_map_make(glm_device_map *map, const char *spec, int P, const glm_config *c, const glm_stage_shape *sh,
                        glm_err *err);
int glm_device_map_parse(glm_device_map *map, const char *json_text, const char *where, int P, const glm_config *c,
                         glm_err *err);
int glm_device_map_thudm(glm_device_map *map, int P, const glm_config *c, glm_err *err);
int glm_device_map_auto(glm_device_map *map, int P, const glm_config *c, const glm_stage_shape *sh, glm_err *err);
/* One line per stage: "stage 1: layers 13-27 + final_layernorm + lm_head". */
void glm_device_map_print(FILE *f, const glm_device_map *map);
/* The map as accelerate's JSON (module -> stage), for saving next to a run (caller frees). */
char *glm_device_map_to_json(const glm_device_map *map, const glm_config *c);

/* The memory one stage allocates, from the tensor table as glm_memory_plan computes it for the
 * whole model (P = 1 gives the same numbers), plus the pipeline's stashed stage inputs and
 * send/receive buffers on the activation line. moments and master are divided by sh->dp
 * (ZeRO inside the stage's data-parallel group). */
glm_mem_plan glm_stage_memory_plan(const glm_config *c, const glm_device_map *map, int stage, const glm_stage_shape *sh);

#endif
