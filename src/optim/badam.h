/* BAdam's block schedule (Luo et al., 2024; the badam package's BlockOptimizer in layer mode, as
 * LLaMA-Factory's use_badam runs it): full fine-tuning by block coordinate descent. Each
 * optimizer step updates one block, a whole transformer layer, with AdamW; every `interval`
 * steps the next block takes over and the optimizer state starts afresh (BAdam clears it at each
 * switch, also when the block stays the same). The embedding, the final norm and the head never
 * train (BAdam's include_embedding / include_lm_head are off in LLaMA-Factory).
 *
 * Only the active layer holds fp32 master weights, gradients and moments; the rest is the model
 * in bf16/fp16, which is what lets a 6B model fine-tune every weight on a 24 GB card. The model
 * side (which layer's rows train) is glm_model_train_layer; this file only says which block
 * trains at which step, as a pure function of the step, so a resumed run finds it again.
 *
 * When BAdam switches: after optimizer step s when (s + 1) % interval == 0 (its counter counts
 * the steps taken), so the first block trains interval - 1 steps and every later one interval
 * (interval 1: one step each). */
#ifndef GLM_BADAM_H
#define GLM_BADAM_H
#include <stdint.h>

typedef enum glm_badam_order {
    GLM_BADAM_ASCENDING,  /* 0, 1, ..., L-1, 0, ... (LLaMA-Factory's default; the first block 0) */
    GLM_BADAM_DESCENDING, /* L-1, L-2, ..., 0, L-1, ... */
    GLM_BADAM_RANDOM,     /* each round of L switches a fresh permutation of the layers */
    GLM_BADAM_FIXED       /* the start block alone (its state still starts afresh at each switch) */
} glm_badam_order;

typedef struct glm_badam {
    int order;      /* glm_badam_order */
    int start;      /* the first block; -1: the order's own (0 ascending, L-1 descending) */
    int interval;   /* BAdam's switch_block_every (LLaMA-Factory's badam_switch_interval) */
    int blocks;     /* the model's layers */
    uint64_t seed;  /* the random order's permutations (--seed) */
} glm_badam;

/* --badam_switch_mode's words, -1 for any other */
int glm_badam_parse_order(const char *s);
/* How many switches came before optimizer step `step` (1-based): the ordinal of its block. */
long glm_badam_round(const glm_badam *b, long step);
/* The layer that optimizer step `step` (1-based) updates. */
int glm_badam_block(const glm_badam *b, long step);
/* The lowest layer any step of a run can update (what the memory plan assumes: the backward
 * reaches down to it). */
int glm_badam_lowest(const glm_badam *b);

#endif
