/* The Hugging Face names of each family's rows outside the layers. The families (block_glm.c,
 * block_glm2.c) are built from them, and adapter_config.c, which reads adapter folders without a
 * model, matches peft's whole-module tensors (modules_to_save) against them. */
#ifndef GLM_MODEL_FAMILY_NAMES_H
#define GLM_MODEL_FAMILY_NAMES_H

/* GLM v1 (ChatGLM-6B) */
#define GLM_V1_EMBED "transformer.word_embeddings.weight"
#define GLM_V1_FINAL_NORM_W "transformer.final_layernorm.weight"
#define GLM_V1_FINAL_NORM_B "transformer.final_layernorm.bias"
#define GLM_V1_HEAD "lm_head.weight"
/* the ChatGLM2 block (ChatGLM2/3-6B, GLM-4-9B): RMSNorm has no bias */
/* the module that holds the word embedding alone, which peft's modules_to_save may name too */
#define GLM_V2_EMBED_MODULE "transformer.embedding"
#define GLM_V2_EMBED GLM_V2_EMBED_MODULE ".word_embeddings.weight"
#define GLM_V2_FINAL_NORM_W "transformer.encoder.final_layernorm.weight"
#define GLM_V2_HEAD "transformer.output_layer.weight"
/* TRL's ValueHead (--stage rm), every family: LLaMA-Factory's value_head.safetensors */
#define GLM_VHEAD_W "v_head.summary.weight"
#define GLM_VHEAD_B "v_head.summary.bias"

#endif
