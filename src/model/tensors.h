/* The tensor table: one row per parameter tensor, in Hugging Face naming (spec 2.1). It is the
 * single source of truth for allocation (offsets into one flat parameter buffer), checkpoint
 * I/O (names and shapes), weight decay, and later ZeRO shards, gradient buckets and pipeline
 * stages. Nothing else in the code hard-codes a tensor index: code asks the table by kind. */
#ifndef GLM_TENSORS_H
#define GLM_TENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "model/config.h"

typedef enum glm_tkind {
    T_WORD_EMB,      /* transformer.word_embeddings.weight        [V, H] */
    T_LN1_W, T_LN1_B,/* transformer.layers.{l}.input_layernorm    [H] */
    T_QKV_W, T_QKV_B,/* .attention.query_key_value                [3H, H] / [3H], per-head interleaved q|k|v */
    T_DENSE_W, T_DENSE_B, /* .attention.dense                     [H, H] / [H] */
    T_LN2_W, T_LN2_B,/* .post_attention_layernorm                 [H] */
    T_FC1_W, T_FC1_B,/* .mlp.dense_h_to_4h                        [F, H] / [F] */
    T_FC2_W, T_FC2_B,/* .mlp.dense_4h_to_h                        [H, F] / [H] */
    T_LNF_W, T_LNF_B,/* transformer.final_layernorm               [H] */
    T_LM_HEAD,       /* lm_head.weight                            [V, H] (untied models only) */
    /* LoRA adapters of a layer's linear modules (config.h glm_peft), peft's names with the
     * .lora_A/.lora_B infix: A [r, in], B [out, r] */
    T_QKV_LA, T_QKV_LB, T_DENSE_LA, T_DENSE_LB, T_FC1_LA, T_FC1_LB, T_FC2_LA, T_FC2_LB,
    /* DoRA's magnitude vectors of the four modules (.lora_magnitude_vector, peft's name) [out] */
    T_QKV_LM, T_DENSE_LM, T_FC1_LM, T_FC2_LM,
    /* P-Tuning v2's prefix encoder (transformer.prefix_encoder.*): embedding [P, 2LH], or
     * [P, H] then trans.0 [H, H] + bias, tanh, trans.2 [2LH, H] + bias with prefix_projection */
    T_PREFIX_EMB, T_PREFIX_W1, T_PREFIX_B1, T_PREFIX_W2, T_PREFIX_B2,
    /* GLM-4-0414's two more norms of a layer (config.h sandwich_norms): after attention's dense
     * and after the MLP, before each residual sum                [H] */
    T_LN3_W, T_LN4_W,
    /* --stage rm's value head (TRL's ValueHead: v_head.summary, a Linear(H, 1)), after the final
     * norm: weight [1, H], bias [1]; trainable, in the head's unit, in no base checkpoint */
    T_VHEAD_W, T_VHEAD_B,
    T_NKINDS
} glm_tkind;
/* The kinds of a layer's own rows, in the order a layer lists them: T_LN1_W .. T_FC2_B, then
 * T_LN3_W, T_LN4_W (a family's layer_row is indexed by the place in this list). */
enum { GLM_LAYER_KINDS = 14 };
static inline glm_tkind glm_layer_kind(int k) { return k < 12 ? (glm_tkind)(T_LN1_W + k) : (glm_tkind)(T_LN3_W + k - 12); }
static inline int glm_layer_place(glm_tkind kind) { return kind >= T_LN3_W ? 12 + (kind - T_LN3_W) : kind - T_LN1_W; }
/* The kinds the random streams of adapters are numbered by (weights.c, pissa.c): the count before
 * GLM-4-0414's norms were added, so every adapter starts from the values it started from before. */
enum { GLM_SEED_KINDS = 33 };

typedef struct glm_tensor {
    char name[128];   /* HF name */
    glm_tkind kind;
    int layer;        /* 0-based layer, -1 for embedding / final norm / head */
    int ndim;
    int64_t shape[2];
    size_t numel;
    size_t offset;    /* element offset in the flat parameter buffer (aligned to 64 elements) */
    int decay;        /* AdamW weight decay applies (matrices yes; biases and LayerNorm no) */
    float lr_scale;   /* the learning rate's factor: LoRA+'s ratio on lora_B rows, else 1 */
    int opens_unit;   /* the first row of its unit (the embedding, a layer, the final norm and head) */
    int qtype;        /* glm_qtype of a quantized row (GLM_PART_QUANT), else GLM_Q_NONE */
    int galore;       /* a trainable row whose AdamW state GaLore projects (config.h galore_*) */
} glm_tensor;

typedef struct glm_table {
    glm_tensor *t;
    int n;
    size_t total;     /* elements in the flat buffer, padding included (bytes for GLM_PART_QUANT) */
    size_t n_params;  /* real parameters (no padding) */
    int *index;       /* [(L+1) * T_NKINDS]: row of (layer, kind), -1 if absent; globals at layer L */
    int num_layers;
} glm_table;

/* Which rows a table holds. The base rows are the model's own weights (what a chatglm-6b
 * folder holds); the trainable ones are what gets gradients, optimizer state, ZeRO shards and
 * buckets (all base rows for full fine-tuning; the adapters for LoRA; the last layers for
 * freeze); the frozen ones are the base rows that do not train (stored once, no gradient). */
/* With c->quant, the frozen linear weights of the layers (the four modules) are the quantized
 * part instead: each row's offset and size in bytes (backend/quant.h's layout of its type),
 * every row on a 256-byte boundary. */
typedef enum glm_part { GLM_PART_BASE, GLM_PART_TRAINABLE, GLM_PART_FROZEN, GLM_PART_QUANT } glm_part;

/* The base rows of the whole model. */
void glm_table_build(glm_table *tab, const glm_config *c);
/* Any part of layers [l0, l1) (+ the embedding / the head as for glm_table_build_range), units
 * aligned to unit_align. */
void glm_table_build_part(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head,
                          size_t unit_align, glm_part part);
/* Modules as LLaMA-Factory names them for the model's family: a layer's (outside = 0:
 * input_layernorm, attention or self_attention, post_attention_layernorm, mlp, or all;
 * --freeze_trainable_modules) or those outside the layers (outside = 1: word_embeddings,
 * final_layernorm, and lm_head or output_layer where the head is untied; --freeze_extra_modules,
 * --additional_target; GLM_EXTRA_* bits), from a comma list; an unknown name is an error naming
 * flag and listing the model's names. */
int glm_modules_parse(const glm_config *c, const char *flag, const char *list, int outside, int *bits, glm_err *err);
/* bits back as such a list ("all" for every layer module, "none" for no outside module) */
const char *glm_modules_str(const glm_config *c, int bits, int outside, char *buf, size_t n);
/* the outside module of one GLM_EXTRA_* bit by its name ("output_layer"), "" where the model has none */
const char *glm_extra_module_name(const glm_config *c, int bit, char *buf, size_t n);
/* Whether LoRA setting p trains row kind whole beside its adapters (peft's modules_to_save): a
 * row the adapter folder carries under peft's name and merge writes in place of the base's. */
int glm_whole_row(const glm_peft *p, glm_tkind kind);
/* LoRA's modules_to_save on a model whose head is tied to the embedding: peft's copy of either
 * splits the tied pair, which the one tied row cannot; an error naming src (a flag or a file). */
int glm_extra_modules_check(const glm_config *c, const glm_peft *p, const char *src, glm_err *err);
/* (it also refuses DoRA and PiSSA on the three split adapters of q, k, v: config.h glm_lora_split) */
/* What freeze setting p trains on a model of c's family and depth, in words: "layers 26-27 (mlp)
 * and word_embeddings" */
const char *glm_freeze_describe(const glm_config *c, const glm_peft *p, char *buf, size_t n);
/* the bits of every module of a layer */
int glm_modules_all(const glm_config *c);
/* Whether the base or adapter row (layer, kind) trains under c->peft. */
int glm_tensor_trains(const glm_config *c, int layer, glm_tkind kind);
/* Whether a kind is a LoRA adapter, a prefix-encoder row, the value head, or any: the rows no
 * base checkpoint holds (they exist only in the trainable part). */
static inline int glm_is_lora_ab(glm_tkind k) { return k >= T_QKV_LA && k <= T_FC2_LB; }
static inline int glm_is_dora(glm_tkind k) { return k >= T_QKV_LM && k <= T_FC2_LM; }
/* the rows of a LoRA adapter file: A and B, and DoRA's magnitudes */
static inline int glm_is_lora(glm_tkind k) { return glm_is_lora_ab(k) || glm_is_dora(k); }
/* Which of the four modules an adapter row belongs to. */
static inline int glm_lora_module(glm_tkind k) { return glm_is_dora(k) ? k - T_QKV_LM : (k - T_QKV_LA) / 2; }
/* Whether LoRA setting p puts adapters on layer l (peft's layers_to_transform). */
static inline int glm_lora_on_layer(const glm_peft *p, int l) {
    return !p->lora_layers || (l >= 0 && l < 64 && (p->lora_layers >> l & 1));
}
static inline int glm_is_prefix(glm_tkind k) { return k >= T_PREFIX_EMB && k <= T_PREFIX_B2; }
static inline int glm_is_vhead(glm_tkind k) { return k == T_VHEAD_W || k == T_VHEAD_B; }
static inline int glm_is_extra(glm_tkind k) { return glm_is_lora(k) || glm_is_prefix(k) || glm_is_vhead(k); }
/* Which of the four linear modules (0 query_key_value .. 3 dense_4h_to_h, the LoRA target
 * order) a weight row is, -1 for any other row; the rows quantization applies to. */
static inline int glm_linear_index(glm_tkind k) {
    return k == T_QKV_W ? 0 : k == T_DENSE_W ? 1 : k == T_FC1_W ? 2 : k == T_FC2_W ? 3 : -1;
}
static inline int glm_is_linear_w(glm_tkind k) { return glm_linear_index(k) >= 0; }
/* A norm's scale (the rows that start at 1) */
static inline int glm_is_norm_w(glm_tkind k) {
    return k == T_LN1_W || k == T_LN2_W || k == T_LNF_W || k == T_LN3_W || k == T_LN4_W;
}
/* Whether row (layer, kind) is stored quantized under c->quant: the linear weights that do not
 * train (all of them in a model for generation). */
int glm_tensor_quantized(const glm_config *c, int layer, glm_tkind kind);
/* The LoRA kind of target i (0 query_key_value .. 3 dense_4h_to_h): A (b = 0) or B (b = 1). */
static inline glm_tkind glm_lora_kind(int i, int b) { return (glm_tkind)(T_QKV_LA + 2 * i + b); }
static inline glm_tkind glm_dora_kind(int i) { return (glm_tkind)(T_QKV_LM + i); }
/* The trainable tensors of one pipeline stage: layers [l0, l1), the word embedding when
 * with_embed (or when with_head and the head is tied to it), the final norm and lm_head when
 * with_head. Layer numbers stay global; offsets are those of the stage's own flat buffer. */
void glm_table_build_range(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head);
/* The same with every unit (the embedding, each layer, the final norm with the head) starting
 * at a multiple of unit_align elements and the total padded to one: ZeRO-2 cuts each unit into
 * equal aligned pieces (parallel/dp/dp.c). unit_align is a multiple of 64. */
void glm_table_build_units(glm_table *tab, const glm_config *c, int l0, int l1, int with_embed, int with_head,
                           size_t unit_align);
void glm_table_free(glm_table *tab);
/* Row for (layer, kind), layer = -1 for globals; NULL when the model has no such tensor. */
/* A fingerprint of the table's layout (every row's name, offset and size, in order): what a
 * checkpoint of per-element state laid out by it (8-bit optimizer codes) is matched against. */
uint64_t glm_table_fingerprint(const glm_table *tab);
const glm_tensor *glm_table_get(const glm_table *tab, int layer, glm_tkind kind);
const glm_tensor *glm_table_find(const glm_table *tab, const char *name);

/* The table's units (the embedding, each layer, the final norm with the head: the rows from one
 * opens_unit row to the next, padding included) as flat spans in flat order; returns how many
 * (at most num_layers + 2). */
int glm_table_units(const glm_table *tab, glm_span *out);
/* The staging slots of the unit-by-unit gradient paths for this table (parallel/dp/unit_slots.h):
 * *ring = the largest unit that is not a tied embedding (two slots of it take the units in
 * turn), *tied = the tied embedding's unit (its own slot; 0 when the embedding is untied or
 * does not train). The memory plan and the slots themselves both size from here. */
void glm_table_unit_slots(const glm_table *tab, int tie_word_embeddings, size_t *ring, size_t *tied);

/* GaLore's projections (galore_torch's GaLoreProjector proj_type): std projects a [rows, cols]
 * gradient from the right (P = the top right singular vectors, [r, cols]) when rows >= cols and
 * from the left (P = the top left ones, [rows, r]) otherwise; reverse_std the other way round;
 * right and left always so; full from both sides (U_r [rows, r] and Vh_r [r, cols]: an r x r
 * state). */
typedef enum glm_galore_proj {
    GLM_GALORE_STD = 0, GLM_GALORE_REVERSE_STD, GLM_GALORE_RIGHT, GLM_GALORE_LEFT, GLM_GALORE_FULL
} glm_galore_proj;
/* The side a row is projected from (glm_galore_shape). */
enum { GLM_GALORE_FROM_LEFT = 0, GLM_GALORE_FROM_RIGHT = 1, GLM_GALORE_FROM_BOTH = 2 };
/* The name's projection, -1 for another. */
int glm_galore_proj_parse(const char *name);
/* Whether GaLore projects row t of a model of config c: a weight of a linear module (the
 * output layer included when a target names it) that trains, matched by c->peft.galore_target. */
int glm_galore_applies(const glm_config *c, const glm_tensor *t);
/* GaLore's shapes for row t: the side it is projected from (GLM_GALORE_FROM_*); *r the rank
 * (galore_rank, at most the smaller side); *low the elements of each moment ([rows, r], [r, cols]
 * or [r, r]), *proj those of P (both sides: U_r then Vh_r). */
int glm_galore_shape(const glm_config *c, const glm_tensor *t, int *r, size_t *low, size_t *proj);
/* The optimizer state a table's rows need with GaLore's rows projected: *flat the elements of
 * each moment for the other rows (each row at a 64-element boundary, in table order; offset, when
 * not NULL, [tab->n]: each row's start there, (size_t)-1 for a projected row), *low the projected
 * rows' P and two moments in all, *scratch the largest projected row (one float buffer of it holds
 * the gradient, then the update). The memory plan and optim/galore.c both size from here. */
void glm_galore_state(const glm_config *c, const glm_table *tab, size_t *flat, size_t *low, size_t *scratch, size_t *offset);

#endif
