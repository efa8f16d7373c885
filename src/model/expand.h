/* LLaMA Pro's block expansion (Wu et al., 2024; LLaMA-Factory's scripts/llama_pro.py and its
 * use_llama_pro): a model of L layers becomes one of L + N, a copy of layer i inserted after every
 * L / N original layers, its attention output projection and MLP output projection zeroed so that
 * each new block passes its input through unchanged and the model computes what it computed
 * before. Training then updates only the new blocks (freeze fine-tuning with
 * --use_llama_pro: model/tensors.c, every (L+N)/N-th layer).
 *
 * For the ChatGLM2 block (ChatGLM2/3-6B, GLM-4-9B: x + attention(norm(x)), x + mlp(norm(x)))
 * the zeroed projections (self_attention.dense, mlp.dense_4h_to_h, their biases where the
 * model has them) make the copy an identity. GLM v1's block (ChatGLM-6B) adds the normalised
 * input scaled by sqrt(2 L) instead of the input, so no copy of it is an identity, and L itself
 * changes every layer's scale: it is refused. (LLaMA-Factory's script zeroes modules by LLaMA's
 * names, o_proj and down_proj, and reads num_hidden_layers, which ChatGLM's config has not.) */
#ifndef GLM_EXPAND_H
#define GLM_EXPAND_H
#include "core/err.h"
#include "model/ckpt.h"

/* Layer l of a model expanded from L layers by n: the original layer it copies, and whether it
 * is a new (zero-output) block. */
int glm_expand_source(int l, int L, int n, int *added);
/* Writes the expanded model of the folder `from` into dir (safetensors as o says, config.json
 * with num_layers L + n, the tokenizer and code files), a shard of memory at a time. */
int glm_ckpt_expand(const char *from, int n, const char *dir, const glm_export_opts *o, glm_err *err);

#endif
