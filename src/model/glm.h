/* The ChatGLM model: parameters laid out by the tensor table in one flat buffer, forward +
 * backward orchestrated once against the ops interface (backend/backend.h), the block itself
 * belonging to the model's family (model/family.h: GLM v1 for ChatGLM-6B, the ChatGLM2 block for
 * ChatGLM2/3 and GLM-4):
 *   embedding, the layers' blocks, the final norm, the LM head, and the shifted cross entropy
 *   over supervised tokens. The head and loss run over compacted supervised rows in chunks, so
 *   full logits are never materialised. */
#ifndef GLM_MODEL_H
#define GLM_MODEL_H
#include <math.h>
#include <stdint.h>
#include "backend/backend.h"
#include "core/err.h"
#include "data/batch.h"
#include "model/config.h"
#include "model/family.h"
#include "model/tensors.h"

/* Pointers to one layer's tensors, inside the params (or grads) buffer. */
typedef struct glm_layer_ptrs {
    void *ln1_w, *ln1_b, *qkv_w, *qkv_b, *dense_w, *dense_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    void *ln3_w, *ln4_w; /* GLM-4-0414's norms after the dense and after the MLP (NULL elsewhere) */
    /* LoRA adapters of the four linear modules (query_key_value, dense, dense_h_to_4h,
     * dense_4h_to_h), NULL where there is none: A [r, in], B [out, r] */
    void *lora_a[4], *lora_b[4];
    /* DoRA's magnitudes of the four modules [out], NULL where the adapter has none */
    void *lora_m[4];
    /* The quantized weights of the four modules (backend/quant.h's bytes), NULL where the
     * weight is not quantized; the module's *_w above is NULL where it is. */
    void *qw[4];
} glm_layer_ptrs;

typedef struct glm_weights {
    glm_layer_ptrs *layer; /* [L] */
    void *wte;             /* [V, H] */
    void *lnf_w, *lnf_b;   /* [H] */
    void *head;            /* [V, H]: lm_head, or wte when tied */
    /* P-Tuning v2's prefix encoder (NULL without it): embedding [P, 2LH] or [P, H], and with the
     * projection trans.0 [H, H] + [H], trans.2 [2LH, H] + [2LH] */
    void *prefix_emb, *prefix_w1, *prefix_b1, *prefix_w2, *prefix_b2;
    /* --stage rm's value head (NULL without it): weight [1, H], bias [1] */
    void *vhead_w, *vhead_b;
} glm_weights;

/* Gradient checkpointing levels (--gradient_checkpointing): none keeps every layer's activations;
 * full keeps only the layers' inputs and reruns each layer's forward in backward; selective keeps
 * each layer's qkv, h1 and fc1 (the products' outputs, costly to redo) and rebuilds the rest (the
 * norms' outputs, the attention output, the MLP's activation) in backward. auto is the flag's
 * word for "the least recompute the memory plan fits" (resolved before the model is built). */
typedef enum { GLM_CKPT_NONE, GLM_CKPT_FULL, GLM_CKPT_SELECTIVE, GLM_CKPT_AUTO } glm_ckpt_level;
#define GLM_CKPT_LEVELS "full|selective|auto" /* the flag's words for levels 1, 2, 3 (core/args.h) */
static inline const char *glm_ckpt_level_name(int level) {
    return level == GLM_CKPT_FULL ? "full" : level == GLM_CKPT_SELECTIVE ? "selective" : level == GLM_CKPT_AUTO ? "auto" : "none";
}

/* Activations one layer saves for its backward pass. */
typedef struct glm_layer_acts {
    const void *in;              /* [N, H] the block's input (not owned; the ChatGLM2 residual) */
    void *x;                     /* [N, H] LN1 output */
    float *ln1_mean, *ln1_rstd;  /* [N] */
    void *qkv;                   /* [N, W] after rotary (W = glm_qkv_width: v1 per-head q|k|v, 3H) */
    void *ctx;                   /* [N, NH*HD] attention output */
    float *lse;                  /* [B, NH, T] */
    void *h1;                    /* [N, H] alpha*x + dense(ctx) */
    float *ln2_mean, *ln2_rstd;  /* [N] */
    void *y;                     /* [N, H] LN2 output */
    void *fc1;                   /* [N, F1] before the activation (F1 = glm_fc1_width: F, or 2F gate|up) */
    void *act;                   /* [N, F] gelu(fc1) or swiglu(fc1) */
    void *lora_t[4];             /* [N, r] scaling * A dropout(input) of each adapter (NULL: none) */
    void *dora_z[4];             /* [N, out] a DoRA module's W x + s B A x before its row scale and bias
                                  * (NULL: no DoRA); the magnitude's gradient reads it */
    void *z1, *z2;               /* [N, H] GLM-4-0414: the dense's and the MLP's outputs before their norms */
    float *ln3_rstd, *ln4_rstd;  /* [N] and those norms' statistics (all NULL elsewhere) */
} glm_layer_acts;

/* Device copy of a batch. */
typedef struct glm_batch_dev {
    int B, T, n_sup;
    int32_t *ids, *pos, *block_pos, *kv_lo, *kv_hi; /* [B*T] */
    int32_t *sup_idx, *sup_tgt;                     /* [n_sup] flat token index and its target */
} glm_batch_dev;

typedef struct glm_model {
    glm_config cfg;
    const glm_family *fam;  /* glm_family_of(&cfg) */
    /* The trainable rows (model/tensors.h): all of them for full fine-tuning; what gradients,
     * the optimizer, data parallelism and checkpoints cover. */
    glm_table tab;
    glm_backend *be;
    void *params, *grads;   /* S [tab.total]; grads zeroed by glm_zero_grads */
    /* The frozen rows (the base under LoRA / freeze), stored once in S, without gradients. */
    glm_table ftab;
    void *fparams;          /* S [ftab.total], NULL when nothing is frozen */
    /* The frozen linear weights stored quantized (cfg.quant): qtab's offsets are bytes */
    glm_table qtab;
    void *qparams;          /* [qtab.total] bytes, NULL without quantization */
    void *qscratch;         /* S [largest quantized matrix]: one weight dequantized for a GEMM */
    const void *qscratch_of;/* which quantized matrix qscratch holds (NULL: none) */
    glm_weights w, g;       /* views into params and fparams / grads (NULL for frozen rows) */
    int training;           /* dropout on (set by the forward/backward entry points) */
    uint64_t dropout_seed;  /* this micro-batch's dropout masks (glm_model_set_dropout_seed) */
    void *lora_tmp;         /* [N, max(3H, F)] an adapter's output or input gradient */
    void *lora_u;           /* [N, F] an adapter's dropped-out input (lora_dropout > 0) */
    int lora_cap;           /* tokens those two hold */
    /* DoRA (cfg.peft.use_dora) */
    float *dora_n;          /* [layers held, 4, glm_linear_out_max] float: each module's row norms ||W + s B A||,
                             * computed in its forward (every training forward: the weights moved) */
    int *dora_fresh;        /* [layers held * 4] host: the norms hold for the current weights (weights_fixed) */
    int weights_fixed;      /* made for inference (glm_model_init_inference): its weights change only by
                             * loads, so DoRA's norms are kept between calls; a training model's are not */
    void *dora_g;           /* [lora_cap, glm_linear_out_max] a DoRA module's output gradient times m / n */
    /* P-Tuning v2 (cfg.peft.pre_seq_len = P > 0) */
    void *pkv;              /* [P, 2LH] the prefix encoder's output: layer l's keys at slot 2l, values 2l+1 */
    void *prefix_h;         /* [P, H] tanh(trans.0(embedding)) with the projection */
    void *dpkv, *dprefix_h; /* their gradients, made at the first backward (without the projection dpkv
                             * is only needed under ZeRO-2: otherwise the embedding's gradient takes them) */
    void *kvbuf, *dkvbuf;   /* [B, P+T, NH, 2, HD] one layer's prefix + sequence keys/values, and their gradient
                             * (ChatGLM2 block: [B, P+T, 2, NKV, HD]) */
    void *prefix_acc;       /* [2, P, 2 NKV HD] the ChatGLM2 block's prefix gradient of one layer, and scratch */
    int32_t *pkv_lo, *pkv_hi; /* [N] the batch's key ranges over prefix + sequence */
    int gradient_checkpointing; /* glm_ckpt_level */
    /* Rows the top layer computes after its attention on this call (0: all): on the last stage of
     * a loss, only the supervised ones, the only rows whose outputs the loss reads (the other
     * rows' keys and values, which the loss does need, come before). keep_all_rows turns it off
     * (tests compare the two). */
    int top_rows, keep_all_rows;
    /* TRL's disable_dropout_in_model (LLaMA-Factory's DPO and KTO trainers): training without the
     * adapters' and the prefix's dropout (a value head's stays) */
    int no_dropout;
    /* glm_model_adapters_off: the layers' adapter pointers while they are off (NULL: on) */
    glm_layer_ptrs *adapters_saved;
    int head_chunk;         /* rows of logits computed at once */
    /* the layers this model holds: all of them, or one pipeline stage's [layer_lo, layer_hi);
     * `first` holds the word embedding, `last` the final norm and the head */
    int layer_lo, layer_hi, first, last;
    /* activation buffers, sized for cap_tokens tokens at cap_T per row */
    int cap_tokens, cap_B, cap_T;
    /* activation sets (glm.c act_sets): one per layer from the backward's floor up, the layers
     * below it (whose backward never runs) sharing one more; [1] with full checkpointing */
    glm_layer_acts *acts;
    int act_floor;          /* the backward's floor the sets were made for (glm.c backward_floor) */
    void **resid;           /* [layer_hi - layer_lo + 1] inputs of layers lo..hi, each [N, H] */
    void *lnf_out;          /* [N, H] */
    float *lnf_mean, *lnf_rstd;
    /* backward scratch */
    void *d_a, *d_b;        /* [N, H] gradient of the residual stream (ping-pong) */
    void *d_x, *d_h1, *d_ctx; /* [N, H] */
    void *d_qkv;            /* [N, W] */
    void *d_ff;             /* [N, F1] */
    void *d_act;            /* [N, F] the SwiGLU output's gradient (ChatGLM2 family; NULL for v1) */
    void *head_in, *logits, *d_head_in; /* [chunk, H], [chunk, V], [chunk, H] */
    float *losses;          /* [chunk] */
    float *tok_w;           /* [N] the supervised tokens' gradient weights (glm_forward_backward_weighted) */
    glm_batch_dev bd;
    /* Data-parallel hook (parallel/dp/dp.c), NULL when unused: glm_forward_backward calls it each
     * time the gradients from flat element `first` to the end of the buffer are final (after
     * the final LayerNorm, after each layer, and with 0 after the embedding, which also holds
     * the tied head), so their reduction can start while backward goes on. */
    void (*grads_ready)(void *ctx, size_t first);
    void *grads_ready_ctx;
    /* ZeRO-2 hook (parallel/dp/dp.c), NULL when unused: called before backward writes the
     * gradients of the unit [lo, hi) (glm_model_units); returns where they go (element lo at
     * the returned address, zeroed by the caller), or NULL for m->grads. A tied embedding's
     * unit is asked for twice per backward (the head writes it first, the embedding last). */
    void *(*grads_unit)(void *ctx, size_t lo, size_t hi);
    void *grads_unit_ctx;
    /* ZeRO-3 hook (parallel/dp/dp_zero3.c), NULL when unused: called before forward or backward
     * reads the weights of the unit [lo, hi), which it gathers and binds (glm_model_bind_unit). */
    void (*params_need)(void *ctx, size_t lo, size_t hi);
    void *params_ctx;
    size_t flat_cap;        /* elements allocated for params/grads (>= tab.total) */
    size_t unit_align;      /* the unit alignment glm_model_relayout laid tab out with (0: none) */
    /* Where the config came from: a model folder or a config.json file ("" for none). Folders
     * the model writes (model/ckpt.h) carry over that config.json as written and the folder's
     * code and tokenizer files, so the original loaders read them. */
    char origin[4096];
    /* LoRA adapters merged into the base rows as glm_model_load reads them: a comma list
     * (model/adapter.h, LLaMA-Factory's adapters before the last), "" for none. */
    char merged[4096];
    /* PiSSA: the trainable rows' first values [tab.total] on the host (NULL without PiSSA), which
     * the adapter folders it writes carry (model/pissa.h) */
    float *pissa_init;
} glm_model;

/* Builds the table and allocates parameters and gradients (zeroed) on the backend. */
void glm_model_init(glm_model *m, const glm_config *c, glm_backend *be);
/* Weights only, no gradient buffer: for generation and chat (half the memory). */
void glm_model_init_inference(glm_model *m, const glm_config *c, glm_backend *be);
/* The same buffers, for training whose gradients are staged unit by unit (ZeRO-2/3, an offloaded optimizer, the
 * update inside backward: parallel/dp/dp.h glm_dp_whole_grads): no whole-model gradient buffer is
 * ever made, not even for a moment before the data-parallel layer attaches (a 24 GB card could
 * not hold it beside the weights). */
void glm_model_init_staged(glm_model *m, const glm_config *c, glm_backend *be);
/* One pipeline stage: layers [l0, l1), with the embedding when first, the head when last. */
void glm_model_init_stage(glm_model *m, const glm_config *c, glm_backend *be, int l0, int l1, int first, int last);
/* A stage without a gradient buffer: generation across devices (parallel/pipe/pipe_infer.h). */
void glm_model_init_stage_inference(glm_model *m, const glm_config *c, glm_backend *be, int l0, int l1, int first,
                                    int last);
void glm_model_free(glm_model *m);
/* BAdam (optim/badam.h): the one trainable layer (cfg.peft.badam_layer) becomes layer `to`,
 * its current weights back among the frozen rows and `to`'s taken out of them, on the device;
 * the gradients are zero after. The caller restarts the optimizer's state (glm_adamw_reset). */
void glm_model_train_layer(glm_model *m, int to);
/* Row i of every weight row (the trainable table's, then the frozen table's, then the quantized
 * one's), i < glm_model_nrows, with its device address. */
int glm_model_nrows(const glm_model *m);
const glm_tensor *glm_model_row(const glm_model *m, int i, void **ptr);
/* A row's values as float, host <-> device: converted to S, or quantized (dequantized) for a
 * quantized row (its qtype). */
void glm_model_row_upload(glm_model *m, const glm_tensor *t, void *dst, const float *host);
void glm_model_row_download(glm_model *m, const glm_tensor *t, float *host, const void *src);
/* The row named `name` in any table (and its address), or NULL. */
const glm_tensor *glm_model_find(const glm_model *m, const char *name, void **ptr);
/* P-Tuning v2: runs the prefix encoder; returns its output [P, 2LH] (layer l's keys at slot 2l,
 * values at 2l + 1), which stays valid until the next call. */
const void *glm_prefix_forward(glm_model *m);
/* LoRA's initial values (peft's LoraLayer): A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform
 * with a = sqrt(5)), B = 0, drawn from seed with one stream per row. */
void glm_model_init_adapters(glm_model *m, uint64_t seed);
/* DoRA: the row norms computed for inference no longer hold (weights were loaded). */
void glm_dora_forget(glm_model *m);
/* DoRA's initial magnitudes (peft's): each module's row norms ||W + s B A|| (B is zero: ||W||),
 * from the loaded base; glm_model_init_adapters calls it. */
void glm_dora_init_magnitudes(glm_model *m);
/* The dropout masks of the next forward/backward (set per micro-batch from the step, so a
 * resumed run draws the same masks). */
static inline void glm_model_set_dropout_seed(glm_model *m, uint64_t seed) { m->dropout_seed = seed; }
/* The masks of micro-batch `micro` of optimizer step `step` (the steps done before it) on data-
 * parallel rank `rank` of a run seeded `run_seed`: the one formula the training loop and the
 * pipeline schedule use, so a resumed run and a pipeline stage draw the same masks. */
static inline uint64_t glm_dropout_seed(uint64_t run_seed, long step, int rank, int micro) {
    return (run_seed << 40) ^ (((uint64_t)step * 1000003ULL + (uint64_t)rank * 4099ULL + (uint64_t)micro) * 0x9e3779b97f4a7c15ULL);
}
/* NEFTune (the Trainer's neftune_noise_alpha): while training, the first stage adds noise
 * uniform in [-mag, mag] to the embeddings, mag = alpha / sqrt(T H) with T the batch's padded
 * length (the Trainer's hook takes the embedding output's sizes), drawn (backend noise_add) from
 * the micro-batch's dropout seed, so a pipeline's recompute and a resumed run add the same. */
static inline float glm_neftune_mag(float alpha, int T, int H) { return (float)(alpha / sqrt((double)T * H)); }
static inline uint64_t glm_neftune_seed(uint64_t dropout_seed) { return dropout_seed ^ 0x4e4546554e45ULL; }
/* Sets the gradient checkpointing level (GLM_CKPT_NONE/FULL/SELECTIVE; frees activation
 * buffers, re-made at the next batch). Set the field directly only before the first batch. */
void glm_model_set_checkpointing(glm_model *m, int level);
void glm_zero_grads(glm_model *m);
/* Grows the params and grads buffers to `elems` elements (values kept, the tail zeroed), e.g. so
 * ZeRO shards of equal size cover them; the weight views are re-bound. */
void glm_model_reserve_flat(glm_model *m, size_t elems);
/* The units of the flat buffer in order (the embedding, each layer, the final norm with the
 * head; at most L + 2): backward finishes them from the last to the first. Returns the count. */
int glm_model_units(const glm_model *m, glm_span *out);
/* Lays the flat buffers out again with every unit starting at a multiple of unit_align
 * elements (glm_table_build_units), values kept. */
void glm_model_relayout(glm_model *m, size_t unit_align);
/* Frees the gradient buffer (ZeRO-2 keeps its own shard; grads_unit then places every unit). */
void glm_model_drop_grads(glm_model *m);
/* Puts p (elements as m->params, flat_cap of them; NULL: none) in place of the parameter buffer
 * and binds the weight views to it; returns the old buffer, which the caller now owns (ZeRO-3). */
void *glm_model_swap_params(glm_model *m, void *p);
/* Binds the weight views of the trainable rows in the unit [lo, hi) to base (element lo there):
 * ZeRO-3's gathered units, each in a slot of its own. */
void glm_model_bind_unit(glm_model *m, size_t lo, size_t hi, void *base);

/* Forward, loss and backward on one micro-batch. Gradients ACCUMULATE (call glm_zero_grads at
 * the start of an optimizer step). dscale multiplies d(sum of token losses): pass
 * 1/(supervised tokens in the whole global batch) for a mean loss (times the fp16 loss scale).
 * Returns the SUM of the token losses of this micro-batch. */
double glm_forward_backward(glm_model *m, const glm_batch *b, float dscale);
/* Forward and loss only (evaluation). Returns the sum of token losses. */
double glm_forward_loss(glm_model *m, const glm_batch *b);
/* A loss made of the token losses by the caller (preference losses, train/pref.h): after the
 * forward pass weigh(ctx, b, tok_loss, n, w) gets the loss of every supervised token (-log p of
 * its target, n = b->n_targets in the batch's flat order), returns the micro-batch's loss and
 * writes d loss / d tok_loss[i] into w[i]; the backward then runs from dscale * w (gradients
 * accumulate, as glm_forward_backward). A head that trains runs twice: once for the losses, once
 * for their gradient; a frozen one once in bf16 and fp32 (its input gradient with unit weights beside
 * the losses, each token's row then scaled by its weight). One process holding every layer (no
 * pipeline stages). */
typedef double (*glm_token_weigh)(void *ctx, const glm_batch *b, const float *tok_loss, int n, float *w);
double glm_forward_backward_weighted(glm_model *m, const glm_batch *b, float dscale, glm_token_weigh weigh, void *ctx);
/* peft's disable_adapter: off = 1 runs the layers without their LoRA/DoRA adapters (the base as it
 * is stored) until off = 0 puts them back. For forward passes only (a preference loss's reference). */
void glm_model_adapters_off(glm_model *m, int off);
/* Forward only: the logits of columns cols[0..ncols) at every supervised token (each position
 * whose next token is a target, in flat order) into out [n_sup * ncols]: a benchmark's choice
 * letters after its prompt (infer/mcq.h). */
void glm_forward_logits_at(glm_model *m, const glm_batch *b, const int32_t *cols, int ncols, float *out);
/* Forward only: every supervised token's loss into tok_loss [b->n_targets] (flat order). */
void glm_forward_token_losses(glm_model *m, const glm_batch *b, float *tok_loss);

/* Pipeline stages. Hidden states between stages are backend buffers [B*T, H] in S.
 * glm_stage_forward: a non-last stage's forward; h_in is NULL on the first stage (ids are
 * embedded); writes h_out. Nothing is kept: glm_stage_backward recomputes the stage's forward
 * from the same h_in (activation recompute), so only stage inputs are stashed per micro-batch.
 * glm_stage_backward: dh_out is NULL on the last stage (the loss is computed there and its
 * sum returned; 0 elsewhere); gradients accumulate; writes dh_in (NULL on the first stage).
 * glm_stage_loss: the last stage's forward and loss without gradients (evaluation). */
void glm_stage_forward(glm_model *m, const glm_batch *b, const void *h_in, void *h_out);
double glm_stage_backward(glm_model *m, const glm_batch *b, const void *h_in, const void *dh_out, void *dh_in,
                          float dscale);
double glm_stage_loss(glm_model *m, const glm_batch *b, const void *h_in);
/* A non-last stage's forward for evaluation (no dropout). */
void glm_stage_forward_eval(glm_model *m, const glm_batch *b, const void *h_in, void *h_out);

/* ---- weights (model/weights.c) ---- */
/* Normal(0, std) matrices, zero biases, LayerNorm weight 1 / bias 0 — HF-style init. */
void glm_model_init_random(glm_model *m, uint64_t seed, float std);
/* Loads every table tensor, converting to S, from safetensors or torch.save .bin (a file, an
 * index json, or a folder; model/ckpt.h). A tied model reads word_embeddings (or lm_head when
 * that is all the file has); an untied one needs lm_head. The adapters of m->merged are merged
 * into the rows they change as those are read. */
int glm_model_load(glm_model *m, const char *path, glm_err *err);
/* What a checkpoint holds of the model: every row for full fine-tuning (glm_model_save/load);
 * the adapters in peft's files for LoRA (model/adapter.h); the rows that train for freeze
 * (model.safetensors of those rows: the rest comes from the base model); every row as stored for
 * BAdam (each layer trains in turn). */
int glm_model_save_trainable(glm_model *m, const char *dir, glm_err *err);
int glm_model_load_trainable(glm_model *m, const char *path, glm_err *err);
/* What a training run leaves in output_dir: the whole model as the original download (full,
 * freeze; safetensors in file_dtype, HF-style shards above shard_bytes, 0 = one file), peft's
 * adapter files (LoRA), or THUDM's ptuning layout (P-Tuning v2), with config.json and the
 * origin's code files where a model is written. */
int glm_model_save_final(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err);
/* --stage rm's value head (config.h value_head) as LLaMA-Factory keeps it: dir/value_head.safetensors
 * (v_head.summary.weight [1, H], v_head.summary.bias [1], fp32), beside the model or adapter
 * files. The save and trainable-state functions above write and read it too. load: 1 when dir
 * holds none and it is not required (value_head.bin is read as well); both 0 without a value head. */
#define GLM_VALUE_HEAD_FILE "value_head.safetensors"
int glm_model_save_value_head(glm_model *m, const char *dir, glm_err *err);
int glm_model_load_value_head(glm_model *m, const char *dir, int required, glm_err *err);
/* dir's value head on the host, for a model of hidden size H: *out = [H + 1] floats (the weight,
 * then the bias; the caller frees it). 0, 1 when dir holds none (*out NULL), -1 on a bad file. */
int glm_value_head_read(const char *dir, int H, float **out, glm_err *err);
/* The trainable rows as a torch.save state dict (pytorch_model.bin): what THUDM's ptuning
 * README loads with torch.load for a P-Tuning v2 checkpoint. */
int glm_model_save_trainable_bin(glm_model *m, const char *path, glm_err *err);
/* The LoRA rows from a tensor file where each is stored as prefix + its name. */
int glm_model_load_adapter_file(glm_model *m, const char *path, const char *prefix, glm_err *err);
/* Copies params (or grads) to a host float array [tab.total] and back. */
void glm_model_get_params(glm_model *m, float *host);
void glm_model_set_params(glm_model *m, const float *host);
/* Writes the parameters as safetensors with HF names (glm_model_export of model/ckpt.h):
 * file_dtype F32/F16/BF16; shard_bytes 0 gives one model.safetensors, else HF-style shards
 * and an index. `dir` receives config.json and the origin's code and tokenizer files too. */
int glm_model_save(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err);

/* ---- incremental decoding (model/kvcache.c) ---- */
typedef struct glm_kvcache {
    int B, Tmax, len;   /* rows, capacity, tokens cached so far */
    void **qkv;         /* [L] each [B, Tmax, 3H]: rotated q|k|v rows (q kept so one copy serves);
                         * NULL for the layers a pipeline stage does not hold. With a P-Tuning
                         * prefix (P = cfg.peft.pre_seq_len > 0) each is [B, P + Tmax, NH, 2, HD]
                         * instead: the prefix keys/values, then the tokens' k|v (as prefix_kv lays them) */
    int prefix_ready;   /* the prefix rows are filled */
    int *prefix_at;     /* [B] where each row's prefix starts in its cache row: its count of left
                         * padding, so the prefix sits right before its first real token and a
                         * real token's keys (prefix + tokens) stay one range [pad, P + now) */
    /* work buffers for the new tokens of one call, kept between calls (a device free per
     * decode step would wait for the GPU each time); sized for cap_tokens tokens */
    int cap_tokens;
    glm_layer_acts a;   /* one block's buffers */
    void *h, *h2, *rows, *logits;  /* S: block input/output (ping-pong), last rows, their logits */
    int32_t *ints;      /* ids, pos, block_pos, kv_lo, kv_hi, last-row index, cache row: [7 * cap_tokens] */
    void *kvrows;       /* S [cap_tokens, KV]: new k|v rows packed for the slot scatter (ChatGLM2, or
                         * behind a P-Tuning prefix) */
    int32_t *hints;     /* host [7 * cap_tokens] (page-locked where the backend has it): ints' upload */
    int last_rows;      /* new tokens of the last slots call (their final-norm rows stay in a.x) */
    void *row_logits;   /* S [GLM_ROWS_LOGITS_MAX, V]: glm_cached_rows_logits' products (made on first use) */
    void *row_ints;     /* int32 [GLM_ROWS_LOGITS_MAX] and float [GLM_ROWS_LOGITS_MAX]: glm_cached_rows_logprobs' */
    void *row_losses;   /* targets and cross entropies, on the device (made on first use) */
    void *row_x;        /* S [GLM_ROWS_LOGITS_MAX, H]: glm_cached_picked_logits' rows (made on first use) */
} glm_kvcache;
void glm_kvcache_init(glm_model *m, glm_kvcache *kv, int B, int Tmax);
/* The bytes glm_kvcache_init allocates for B rows of Tmax tokens over all layers of a model of
 * config c (a P-Tuning prefix included), with elements of es bytes. */
double glm_kvcache_bytes(const glm_config *c, size_t es, int B, int Tmax);
void glm_kvcache_free(glm_model *m, glm_kvcache *kv);
/* Raises the capacity to Tmax tokens per row, keeping what is cached (the row stride changes). */
void glm_kvcache_grow(glm_model *m, glm_kvcache *kv, int Tmax);
/* Runs Tq new tokens per row through the model with the cache; ids/pos/block_pos are
 * [B*Tq] host arrays; kv_lo/kv_hi [B*Tq] are absolute key ranges in the cache. Writes the
 * final hidden states (after LNf) of all new tokens to hidden_out [B*Tq*H] (host, may be NULL)
 * and the logits of each row's LAST new token to logits_out [B*V] (host, may be NULL). */
int glm_forward_cached(glm_model *m, glm_kvcache *kv, int Tq, const int32_t *ids, const int32_t *pos,
                       const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi,
                       float *hidden_out, float *logits_out, glm_err *err);
/* The same for a pipeline stage (parallel/pipe/pipe_infer.h): layers [layer_lo, layer_hi) only; a
 * stage after the first takes its input from h_in [B*Tq*H] (host floats) instead of the ids,
 * a stage before the last writes its output to h_out and computes no hidden_out / logits.
 * The cache must come from glm_kvcache_init on the same stage model. */
int glm_stage_forward_cached(glm_model *m, glm_kvcache *kv, int Tq, const int32_t *ids, const int32_t *pos,
                             const int32_t *block_pos, const int32_t *kv_lo, const int32_t *kv_hi, const float *h_in,
                             float *h_out, float *hidden_out, float *logits_out, glm_err *err);
/* Continuous batching (serve/engine.c): the cache as a pool of kv->B slots of kv->Tmax tokens,
 * each slot with its own length (kv->len is not used). Row b of the call is slot slot0 + b,
 * holding len[b] tokens before it; its Tq new tokens go to [len[b], len[b] + Tq) and kv_lo/kv_hi
 * [nrows*Tq] are key ranges inside the slot (hi <= len[b] + Tq), so a row's attention reads only
 * its own slot. Rows compute as they would alone (glm_forward_cached with B = 1): on the CPU the
 * results are bit-identical whatever the other rows hold. logits_out [nrows*V]: each row's last
 * new token. Whole models without a P-Tuning prefix. */
int glm_forward_cached_slots(glm_model *m, glm_kvcache *kv, int slot0, int nrows, int Tq, const int *len,
                             const int32_t *ids, const int32_t *pos, const int32_t *block_pos, const int32_t *kv_lo,
                             const int32_t *kv_hi, float *logits_out, glm_err *err);
/* The same for a pipeline stage (as glm_stage_forward_cached): a stage after the first takes
 * h_in [nrows*Tq*H] (host floats), a stage before the last writes h_out and no logits. On the
 * last stage greedy_out [nrows] (may be NULL) gets each row's greedy token as glm_sample_next
 * picks it without sampling (backend argmax_rows: the logits need not leave the device), and
 * last_hidden_out [nrows*H] (may be NULL) each row's last new token's final-norm output (what a
 * value head scores). n_new [nrows] (NULL: Tq each) lets rows of different lengths share a call
 * (prompts prefilled together): row b's real new tokens are its first n_new[b] (1..Tq), the rest
 * padding whose results are dropped, so its "last new token" is token n_new[b] - 1. The padding
 * writes the slot's cache rows [len[b] + n_new[b], len[b] + Tq), past what the slot holds: the
 * slot's next call overwrites them before any key range reaches them (len[b] + Tq <= capacity). */
int glm_stage_forward_cached_slots(glm_model *m, glm_kvcache *kv, int slot0, int nrows, int Tq, const int *len,
                                   const int *n_new, const int32_t *ids, const int32_t *pos, const int32_t *block_pos,
                                   const int32_t *kv_lo, const int32_t *kv_hi, const float *h_in, float *h_out, float *logits_out,
                                   int32_t *greedy_out, float *last_hidden_out, glm_err *err);
/* After a glm_stage_forward_cached_slots call on the last stage (or a whole model): the logits of
 * that call's new tokens [r0, r0 + n) (its nrows x Tq tokens in order; n <= GLM_ROWS_LOGITS_MAX)
 * -> logits_out [n*V] (host floats). A prompt's own log-probabilities (serve's echo) come from
 * them: every prompt row through the head, where a forward brings back only each row's last. */
#define GLM_ROWS_LOGITS_MAX 64
int glm_cached_rows_logits(glm_model *m, glm_kvcache *kv, int r0, int n, float *logits_out, glm_err *err);
/* The logits of the last call's new tokens rows[0..n) (indices into its nrows x Tq tokens, in any
 * order; n <= GLM_ROWS_LOGITS_MAX) -> logits_out [n*V]: the rows gathered first, so one product
 * serves rows spread over the call (each decoding row's own run of tokens). */
int glm_cached_picked_logits(glm_model *m, glm_kvcache *kv, const int32_t *rows, int n, float *logits_out, glm_err *err);
/* The same rows' log-probabilities without their logits leaving the device: lp[i] = log_softmax of
 * row r0 + i at targets[i] (host ints), and, where best_id is not NULL, the row's most likely token
 * (the first maximum: backend argmax_rows) and its log-probability in best_id[i], best_lp[i]. */
int glm_cached_rows_logprobs(glm_model *m, glm_kvcache *kv, int r0, int n, const int32_t *targets, float *lp,
                             int32_t *best_id, float *best_lp, glm_err *err);
/* Makes the work buffers for calls of up to ntokens new tokens now (a LoRA adapter's middle
 * buffers follow m->cfg.peft at this moment: set the widest rank and every target first). */
void glm_kvcache_reserve(glm_model *m, glm_kvcache *kv, int ntokens);
/* Slot dst's first n cached tokens (and a P-Tuning prefix's rows before them) made a copy of slot
 * src's, in every layer the model holds: a prompt prefilled once serves several requests. */
void glm_kvcache_copy_slot(glm_model *m, glm_kvcache *kv, int src, int dst, int n);


/* ---- a layer's activation buffers (the family's block fills them) ---- */
void glm_layer_acts_alloc(const glm_model *m, glm_layer_acts *a, size_t tokens);
void glm_layer_acts_free(const glm_model *m, glm_layer_acts *a);
/* Attention of B rows of Tq queries over Tk keys (each query's [kv_lo, kv_hi)) into a->ctx and
 * a->lse: the same op in every family */
void glm_attend(glm_model *m, glm_layer_acts *a, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *kv_lo,
                const int32_t *kv_hi, int B, int Tq, int Tk);
/* glm_attend, then the family's block_rows on all B*Tq rows into h_out */
void glm_block_finish(glm_model *m, int l, glm_layer_acts *a, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                      const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, void *h_out);

/* ---- memory plan (model/glm.c): bytes the model will allocate, from the tensor table ---- */
typedef struct glm_mem_plan {
    double params, grads, master, moments; /* weights, gradients, fp32 master copy, AdamW m+v */
    double activations;                    /* saved for backward (+ recompute scratch) */
    double scratch;                        /* backward buffers, head chunk, batch */
    double total;                          /* on the device: the sum of the above */
    double host;                           /* in host memory: an offloaded optimizer and its staging */
} glm_mem_plan;
glm_mem_plan glm_memory_plan(const glm_config *c, glm_dtype dtype, int B, int T, int gradient_checkpointing,
                             int head_chunk);
/* One pipeline stage's (layers [l0, l1), embedding / head as glm_model_init_stage): the one
 * formula every plan derives from (parallel/pipe/device_map.c adds sharding and pipelining). With
 * unit_slots, the elements of the unit-by-unit gradient paths' slots for its trainable table
 * (glm_table_unit_slots: [0] each of the two ring slots, [1] a tied embedding's own). */
glm_mem_plan glm_memory_plan_stage(const glm_config *c, int l0, int l1, int embed, int head, glm_dtype dtype, int B,
                                   int T, int gradient_checkpointing, int head_chunk, size_t unit_slots[2]);

#endif
