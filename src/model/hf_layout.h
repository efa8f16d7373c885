/* transformers' own GLM layout (config.h hf_layout: model_type glm, GlmForCausalLM, the
 * glm-4-9b-chat-hf repositories): the ChatGLM2 block's weights under other module names, with
 * query_key_value stored as three tensors. The model keeps THUDM's original names inside (the
 * tensor table, the families); these functions translate at the edges: reading a folder
 * (ckpt.c), writing one (export.c) and adapters (peft's names carry the same module paths).
 *
 *   transformer.embedding.word_embeddings      model.embed_tokens
 *   transformer.encoder.layers.N.              model.layers.N.
 *     input_layernorm                            input_layernorm
 *     self_attention.query_key_value             self_attn.q_proj | k_proj | v_proj (row blocks)
 *     self_attention.dense                       self_attn.o_proj
 *     post_attention_layernorm                   post_attention_layernorm
 *     mlp.dense_h_to_4h                          mlp.gate_up_proj
 *     mlp.dense_4h_to_h                          mlp.down_proj
 *     post_self_attn_layernorm, post_mlp_layernorm (GLM-4-0414's, the same names)
 *   transformer.encoder.final_layernorm        model.norm
 *   transformer.output_layer                   lm_head
 * (transformers' convert_glm_weights_to_hf.py: the same values, no permutation.) */
#ifndef GLM_MODEL_HF_LAYOUT_H
#define GLM_MODEL_HF_LAYOUT_H
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"

enum { GLM_HF_NAME = 256 };
/* The -hf name(s) of a tensor named as THUDM's original, into names[] (GLM_HF_NAME bytes each):
 * 1 for a renamed module, 3 for query_key_value (q, k, v: consecutive row blocks of it, in that
 * order), 0 when the name has no -hf form (then it is the same in both). What follows the
 * module (".weight", ".lora_A.weight") and what precedes "transformer." (peft's
 * "base_model.model.") stay as they are. */
int glm_hf_names(const char *orig, char names[3][GLM_HF_NAME]);
/* The original name of a -hf tensor name; *part: which row block of query_key_value it is
 * (0 q, 1 k, 2 v) or 0 for a renamed one. -1 when the name has no original form. */
int glm_hf_orig_name(const char *hf, char *orig, size_t n, int *part);
/* Rows of query_key_value's row block `part`: q NH * HD, k and v NKV * HD each. */
int64_t glm_hf_part_rows(const glm_config *c, int part);
/* The row blocks of a module's `out` rows that take an adapter each: `split` of them (config.h
 * glm_lora_split: 3, q | k | v, on transformers' layout) or 1, the whole. Their count, and each
 * block's first row and rows. */
int glm_lora_blocks(const glm_config *c, int split, int64_t out, int64_t row0[3], int64_t rows[3]);
/* Table row t (named `name`: its own, or with peft's prefix) as the file of a model in transformers'
 * layout holds it: the entries' names and row blocks [row0[k], row0[k] + rows[k]) of t; one entry
 * for a renamed row (or a row with no -hf form), three for query_key_value's weight and bias
 * (q, k, v) and for its split adapters (A: r rows each; B: q, k, v's rows), less those of q, k,
 * v that have no adapter (c->peft.lora_qkv_parts). Returns the count. */
struct glm_tensor;
int glm_hf_row_parts(const glm_config *c, const struct glm_tensor *t, const char *name, char names[3][GLM_HF_NAME],
                     int64_t row0[3], int64_t rows[3]);
/* A module's short name in -hf terms (hf_module[0..len): the last part of a module's path, q_proj,
 * o_proj, embed_tokens, lm_head..., or the first of a layer's, self_attn, mlp) as the original's
 * same part (query_key_value, dense, word_embeddings, output_layer, self_attention...), into
 * out[n]; 0, or -1 for a name the layout does not have. From the one table of names above. */
int glm_hf_module_orig(const char *hf_module, size_t len, char *out, size_t n);
/* The other way: an original module's part (word_embeddings, final_layernorm) as -hf's. */
int glm_hf_module_name(const char *orig_module, char *out, size_t n);
/* The -hf short names of an original module path ("self_attention.query_key_value" -> q_proj,
 * k_proj, v_proj; "mlp.dense_4h_to_h" -> down_proj) into out: their count, 0 for none. */
int glm_hf_short_names(const char *orig_module, const char *out[3]);

#endif
