/* Model configuration, read from a Hugging Face config.json of chatglm-6b (spec section 1). */
#ifndef GLM_CONFIG_H
#define GLM_CONFIG_H
#include <stdint.h>
#include "backend/quant.h"
#include "core/err.h"

/* Which parameters train (the tensor table splits them into trainable and frozen rows). The
 * zero value is full fine-tuning. */
typedef enum glm_ft_kind { GLM_FT_FULL, GLM_FT_LORA, GLM_FT_PTUNING, GLM_FT_FREEZE } glm_ft_kind;
/* LoRA targets, by Hugging Face module name (peft's target_modules) */
enum { GLM_LORA_QKV = 1, GLM_LORA_DENSE = 2, GLM_LORA_FC1 = 4, GLM_LORA_FC2 = 8, GLM_LORA_ALL = 15 };
/* modules outside the layers (config.h glm_peft extra_modules): the word embedding, the final norm, an untied head */
enum { GLM_EXTRA_EMB = 1, GLM_EXTRA_LNF = 2, GLM_EXTRA_HEAD = 4 };
typedef struct glm_peft {
    glm_ft_kind kind;
    /* LoRA as peft's LoraLayer: y = W x + b + scaling * B A dropout(x), A [r, in], B [out, r] */
    int lora_rank;           /* r */
    float lora_alpha;        /* scaling = alpha / r, or alpha / sqrt(r) with use_rslora */
    float lora_dropout;      /* on the adapter's input, training only */
    int lora_targets;        /* GLM_LORA_* bits */
    int lora_qkv_parts;      /* transformers' GLM layout (glm_lora_split): which of q_proj (1), k_proj (2), v_proj (4)
                              * have adapters (0: all three); the others' rows stay zero, which is no adapter */
    uint64_t lora_layers;    /* the layers the adapters are on, bit l (peft's layers_to_transform; LLaMA Pro's added
                              * blocks); 0: every layer */
    int use_rslora;
    /* DoRA (peft's use_dora): each adapted module's output rows rescaled by a trainable magnitude
     * m over the row norms of W + scaling B A (held constant in the gradient, as peft and the
     * paper do): y = (m / ||W + s B A||_row) (W x + s B A x) + b; with dropout u = dropout(x),
     * peft's y = W x + b + (c - 1) W u + c s B A u, c = m / ||W + s B A||_row. */
    int use_dora;
    /* PiSSA (model/pissa.h): the adapters start from their weights' principal singular triplets
     * (pissa_niter subspace iterations of a randomized SVD) and the base is the residual */
    int pissa, pissa_niter;
    float loraplus_lr_ratio; /* LoRA+ (LLaMA-Factory's loraplus_lr_ratio): lora_B trains at this times the
                              * learning rate, lora_A at the rate (0: off); the table's lr_scale */
    /* freeze (LLaMA-Factory's freeze mode): num_layer_trainable N > 0, the last N layers train; N < 0,
     * the first -N (its freeze_trainable_layers). Of those layers the modules in freeze_modules
     * train (bits by the family's module names, tensors.h glm_modules_parse; 0: all). */
    int num_layer_trainable;
    int freeze_modules;
    /* BAdam (LLaMA-Factory's use_badam, layer mode; optim/badam.h): freeze fine-tuning of one whole
     * layer, badam_layer, which the run moves to another layer every few steps (num_layer_trainable
     * and freeze_modules unused) */
    int badam, badam_layer;
    /* LLaMA Pro (LLaMA-Factory's use_llama_pro; model/expand.h): with freeze, the layers that
     * train are every llama_pro-th one, l % llama_pro == llama_pro - 1, the blocks `glmtrain
     * expand` added (llama_pro = num_layers / num_layer_trainable; 0: off) */
    int llama_pro;
    /* Modules outside the layers that train whole (GLM_EXTRA_EMB/LNF/HEAD): with freeze,
     * LLaMA-Factory's freeze_extra_modules; with LoRA, peft's modules_to_save (LLaMA-Factory's
     * additional_target), beside the adapters. */
    int extra_modules;
    /* GaLore (LLaMA-Factory's use_galore; optim/galore.h): the AdamW state of the trainable linear
     * weights galore_target names lives in a rank-galore_rank projection of their gradients,
     * renewed from the gradient's SVD every galore_gap steps (galore_rank 0: off). galore_target:
     * "all" (every linear module but the output layer) or a comma list of parts of the modules'
     * names, matched as substrings (LLaMA-Factory's rule); galore_proj a glm_galore_proj. */
    int galore_rank, galore_gap, galore_proj;
    float galore_scale;
    char galore_target[160];
    /* P-Tuning v2 as THUDM's modeling_chatglm.py: a trainable prefix encoder gives every layer
     * pre_seq_len keys and values that every query sees (not rotated); prefix_projection puts an
     * MLP (Linear H->H, tanh, Linear H->2LH) after the [P, H] embedding; prefix_dropout (0.1 in
     * the original) on the prefix keys/values while training, per batch row */
    int pre_seq_len, prefix_projection;
    float prefix_dropout;
} glm_peft;

/* The block family (model/family.h): GLM v1 (ChatGLM-6B: LayerNorm, 2D rotary, alpha residuals,
 * GELU, prefix-LM mask) or the ChatGLM2 block (ChatGLM2-6B, ChatGLM3-6B, GLM-4-9B: RMSNorm,
 * grouped-query attention with rotary on half of each head, SwiGLU, plain pre-norm residuals,
 * causal mask, untied output_layer). */
typedef enum glm_family_id { GLM_FAMILY_GLM = 0, GLM_FAMILY_GLM2 = 1 } glm_family_id;

typedef struct glm_config {
    int family;              /* glm_family_id */
    int vocab_size;          /* rows of word_embeddings (130528 for ChatGLM-6B) */
    int hidden_size;         /* H */
    int num_layers;          /* L */
    int num_attention_heads; /* NH; head dim = H / NH */
    int inner_hidden_size;   /* MLP width (4H; ChatGLM2's ffn_hidden_size, the first linear then being 2x as wide) */
    int num_kv_heads;        /* key/value heads (multi_query_group_num); 0 = num_attention_heads */
    int head_dim;            /* kv_channels; 0 = hidden_size / num_attention_heads */
    float rope_theta;        /* the ChatGLM2 family's rotary base: 10000 * rope_ratio */
    int qkv_bias;            /* the ChatGLM2 family's add_qkv_bias (v1 has every bias) */
    int max_sequence_length;
    float layernorm_epsilon;
    int position_encoding_2d;/* must be true for GLM v1 */
    int tie_word_embeddings; /* HF default true: lm_head shares word_embeddings */
    int32_t bos_token_id;    /* <sop> */
    int32_t eos_token_id;    /* <eop> */
    int32_t mask_token_id;   /* [MASK] */
    int32_t gmask_token_id;  /* [gMASK] */
    int32_t pad_token_id;    /* <pad> */
    /* Residual scale. The original GLMBlock takes num_layers with a default of 28 that
     * ChatGLMModel never overrides, so alpha = sqrt(2*28) = sqrt(56) for every model size. */
    float alpha;
    glm_peft peft;           /* not from config.json: set by the run (train flags, an adapter) */
    float neftune_alpha;     /* not from config.json: the run's --neftune_noise_alpha (glm.h glm_neftune_mag) */
    /* not from config.json: --stage rm's value head in place of the LM head (tensors.h T_VHEAD_W),
     * and the dropout on its input while training (TRL's summary_dropout_prob) */
    int value_head;
    float value_head_dropout;
    /* glm_qtype of the frozen linear weights (the four modules of every layer): from
     * config.json's quantization_bit (a folder that stores them quantized) or the run's
     * --quantization_bit / --quantization_type (quantized as they load) */
    int quant;
    /* The folder's layout: 0 THUDM's original names (model_type chatglm), 1 transformers' own
     * GlmForCausalLM (model_type glm: glm-4-9b-chat-hf), the same ChatGLM2-block weights under
     * other names with query_key_value stored as q_proj, k_proj and v_proj (model/hf_layout.h).
     * Inside, the model keeps the original names; reading and writing folders translate. */
    int hf_layout;
    /* GLM-4-0414 (model_type glm4, transformers' Glm4ForCausalLM): the ChatGLM2 block with two more
     * RMSNorms a layer, on attention's output and on the MLP's before each residual sum:
     * h1 = h + N3(Dense(attn)), h' = h1 + N4(MLP(N2(h1))) (model/block_glm2.c) */
    int sandwich_norms;
} glm_config;

/* The ChatGLM-6B (v1.1) shapes and ids. */
glm_config glm_config_chatglm6b(void);
/* Parses config.json text. Unknown fields are ignored; a missing or ill-typed required field
 * is an error naming the field and `source` (the file name, for messages). */
int glm_config_parse(glm_config *c, const char *json_text, const char *source, glm_err *err);
int glm_config_load(glm_config *c, const char *path, glm_err *err); /* file or folder */
/* Writes config.json text (caller frees) with the HF keys, so HF tools read our output. */
char *glm_config_to_json(const glm_config *c);
int glm_config_validate(const glm_config *c, const char *source, glm_err *err);
static inline int glm_head_dim(const glm_config *c) {
    return c->head_dim > 0 ? c->head_dim : c->hidden_size / c->num_attention_heads;
}
static inline int glm_kv_heads(const glm_config *c) { return c->num_kv_heads > 0 ? c->num_kv_heads : c->num_attention_heads; }
/* Elements per token of the query_key_value output: q (NH heads) then k and v (v1 interleaves
 * them per head; the ChatGLM2 block has NKV heads each after all the queries) */
static inline int glm_qkv_width(const glm_config *c) { return (c->num_attention_heads + 2 * glm_kv_heads(c)) * glm_head_dim(c); }
/* Width of the attention output (the dense module's input): NH * HD */
static inline int glm_attn_width(const glm_config *c) { return c->num_attention_heads * glm_head_dim(c); }
/* Elements per token of dense_h_to_4h's output: F, or gate | up (2F) for SwiGLU */
static inline int glm_fc1_width(const glm_config *c) { return (c->family == GLM_FAMILY_GLM2 ? 2 : 1) * c->inner_hidden_size; }
/* P-Tuning v2's prefix per position: every layer's keys and values, 2 L NKV HD (v1: 2 L H), laid
 * out [2L, NKV, HD] with slot 2l layer l's keys; and the width of the prefix embedding: that
 * itself, or with v1's prefix_projection H (ChatGLM2's PrefixEncoder keeps the full width and
 * projects kv -> H -> kv). */
static inline int glm_prefix_width(const glm_config *c) {
    return 2 * c->num_layers * glm_kv_heads(c) * glm_head_dim(c);
}
static inline int glm_prefix_emb_width(const glm_config *c) {
    return c->family == GLM_FAMILY_GLM2 || !c->peft.prefix_projection ? glm_prefix_width(c) : c->hidden_size;
}
/* In and out features of linear module i (0 query_key_value, 1 dense, 2 dense_h_to_4h,
 * 3 dense_4h_to_h, the LoRA target order): the weight is [out, in]. */
static inline int glm_linear_in(const glm_config *c, int i) {
    return i == 1 ? glm_attn_width(c) : i == 3 ? c->inner_hidden_size : c->hidden_size;
}
/* Adapters LoRA puts on module i: 1, or on transformers' GLM layout's query_key_value 3, peft's
 * q_proj, k_proj and v_proj, stacked in the rows: A_q; A_k; A_v [3 r, H] and B_q; B_k; B_v
 * [out, r] (model/peft.c runs each on its block of the output). */
static inline int glm_lora_split(const glm_config *c, int i) { return i == 0 && c->hf_layout ? 3 : 1; }
static inline int glm_linear_out(const glm_config *c, int i) {
    return i == 0 ? glm_qkv_width(c) : i == 2 ? glm_fc1_width(c) : c->hidden_size;
}
/* The widest output and the widest input of the four (an adapter's scratch per token, DoRA's row
 * norms and output gradient, merge's scratch). */
static inline int glm_linear_out_max(const glm_config *c) {
    int w = 0;
    for (int i = 0; i < 4; i++) w = glm_linear_out(c, i) > w ? glm_linear_out(c, i) : w;
    return w;
}
static inline int glm_linear_in_max(const glm_config *c) {
    int w = 0;
    for (int i = 0; i < 4; i++) w = glm_linear_in(c, i) > w ? glm_linear_in(c, i) : w;
    return w;
}
/* The ChatGLM2/3 configuration (ChatGLM2-6B's config.json shapes and ids). */
glm_config glm_config_chatglm2_6b(void);
/* --quantization_bit (0: not given, 4, 8) and --quantization_type (NULL, "int", "nf4") into a
 * glm_qtype; -1 with the flag named in err. */
int glm_quant_parse(int bits, const char *type, int *q, glm_err *err);
/* The run's --quantization_bit (0: not given, 4, 8) and --quantization_type (NULL, "int", "nf4")
 * over what config.json said (c->quant): a folder stored as INT4 cannot be read as INT8 or NF4
 * (errors name src). */
int glm_config_set_quant(glm_config *c, int bits, const char *type, const char *src, glm_err *err);
/* LoRA's output scale: alpha / r (peft), alpha / sqrt(r) with rslora. */
float glm_lora_scaling(const glm_peft *p);
/* "query_key_value,dense", "all", ... into GLM_LORA_* bits; -1 with the unknown name in err. */
int glm_lora_targets_parse(const char *list, int *bits, glm_err *err);
/* The same for a model in THUDM's layout (hf_layout 0: transformers' names refused), in
 * transformers' GLM layout (1) or either (-1, an adapter's target_modules). transformers' names
 * (model/hf_layout.h) stand for THUDM's modules; *qkv_parts (NULL: not wanted) gets which of
 * q_proj, k_proj, v_proj are named (glm_peft lora_qkv_parts; 0 when query_key_value is, or none). */
int glm_lora_targets_parse_layout(const char *list, int hf_layout, int *bits, int *qkv_parts, glm_err *err);
/* The Hugging Face module name of one target bit ("query_key_value", ...). */
const char *glm_lora_target_name(int bit);
/* The names of the target bits as a --lora_target list ("query_key_value,dense"), into buf. */
const char *glm_lora_targets_str(int bits, char *buf, size_t n);

#endif
