/* Model families: what differs between GLM v1 (ChatGLM-6B) and the ChatGLM2 block (ChatGLM2-6B,
 * ChatGLM3-6B, GLM-4-9B), in one place per family, as chatglm.cpp composes its models:
 *   - the tensor names (the table builder in tensors.c lays out the rows; the shapes follow from
 *     the config's widths in config.h, the same formulas for both);
 *   - the block's forward in two halves (shared by training and KV-cache decoding) and its
 *     backward, written over the ops interface;
 *   - the q|k|v layout of the query_key_value output (views the attention op reads in place);
 *   - the final norm;
 *   - the positions/mask rule: how the data layer's segments become positions and key ranges.
 * Attention itself is the same op for both (glm_attend in glm.c, over the family's views).
 * glm.c (orchestration), kvcache.c (decoding) and tensors.c ask the family; nothing else branches
 * on it. model/block_glm.c is v1, model/block_glm2.c the ChatGLM2 block. */
#ifndef GLM_MODEL_FAMILY_H
#define GLM_MODEL_FAMILY_H
#include <stdint.h>
#include "backend/backend.h"
#include "data/batch.h"
#include "model/config.h"
#include "model/family_names.h"
#include "model/tensors.h"

struct glm_model;
struct glm_layer_acts;

typedef struct glm_family {
    const char *name;       /* "chatglm" (GLM v1), "chatglm2" (ChatGLM2/3, GLM-4), "glm4" (GLM-4-0414) */
    /* Hugging Face names: the word embedding, the final norm's rows (bias NULL for RMSNorm), the
     * LM head, a layer's prefix (printf with the layer number), the rows inside a layer by kind
     * (NULL: the family has no such row), the linear modules in LoRA target order */
    const char *embed, *final_norm_w, *final_norm_b, *head, *layer_fmt;
    const char *layer_row[GLM_LAYER_KINDS]; /* by glm_layer_place */
    const char *modules[4];
    /* x = norm1(h_in) and the rotated q|k|v rows (a->x, a->qkv) of N tokens */
    void (*block_qkv)(struct glm_model *m, int l, struct glm_layer_acts *a, const void *h_in, int N, const int32_t *pos,
                      const int32_t *block_pos);
    /* the residual branches leave from norm1's output a->x (v1's alpha*x), not the block's input a->in */
    int residual_from_norm;
    /* 1: a token's keys and values depend on the tokens before it alone (causal attention from
     * the first token), so a prompt's first k tokens' cache rows are the same whatever follows
     * (serve's prefix caching); GLM v1's prompt sees itself whole: 0 */
    int causal;
    /* the block after attention (glm_attend's a->ctx), row by row on N rows: dense, residual,
     * norm2, MLP, residual into h_out; reads a->ctx and the residual source (a->x or a->in) */
    void (*block_rows)(struct glm_model *m, int l, struct glm_layer_acts *a, int N, void *h_out);
    /* selective checkpointing: rebuild what the layer did not keep, as block_qkv, glm_attend and
     * block_rows made it: a->x from h_in, a->ctx (and a->lse) by attention over the views, a->y
     * from a->h1, a->act from a->fc1 */
    void (*block_recompute)(struct glm_model *m, int l, struct glm_layer_acts *a, const void *h_in, glm_qkv_view q,
                            glm_qkv_view k, glm_qkv_view v, const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq,
                            int Tk);
    /* the block's backward from the saved activations, in two parts; parameter gradients
     * accumulate. block_rows_bwd: block_rows' backward on N rows, from dh_out into m->d_ctx (the
     * attention output's gradient) and m->d_h1 (the gradient at the attention's residual sum).
     * block_attn_bwd: the rest on the model's batch (m->bd), from m->d_ctx and m->d_h1, into
     * dh_in; dh_in NULL: nothing below wants the input's gradient and the input norm does not
     * train (its products' input gradients are skipped) */
    void (*block_rows_bwd)(struct glm_model *m, int l, struct glm_layer_acts *a, const void *dh_out, int N);
    void (*block_attn_bwd)(struct glm_model *m, int l, struct glm_layer_acts *a, const void *h_in, void *dh_in);
    /* views of q, k, v inside rows of glm_qkv_width elements, row 0 at base, batch rows
     * batch_stride elements apart */
    void (*qkv_views)(const struct glm_model *m, void *base, long batch_stride, glm_qkv_view *q, glm_qkv_view *k,
                      glm_qkv_view *v);
    /* final norm: out = norm(x) (mean only for LayerNorm), and its backward (dw/db of the final
     * norm's gradient views) */
    void (*final_norm)(struct glm_model *m, void *out, float *mean, float *rstd, const void *x, int N);
    void (*final_norm_bwd)(struct glm_model *m, void *dx, const void *dout, const void *x, const float *mean,
                           const float *rstd, int N);
    /* the positions/mask rule for a training batch: pos, block_pos, kv_lo, kv_hi [B*T] from the
     * data layer's batch (which lays out GLM v1's prefix-LM rule; kv_lo is every token's segment
     * start in both) */
    void (*batch_rule)(const glm_batch *b, int32_t *pos, int32_t *block_pos, int32_t *kv_lo, int32_t *kv_hi);
    /* generation's rule: for a prompt of n ids, each token's position, block position and the
     * end of its key range (relative to the row's first token), state[2] keeping what the
     * generated tokens need; -1 when the prompt lacks what the family needs (v1: [gMASK] or
     * [MASK], and <sop>) */
    int (*prompt_positions)(const glm_config *c, const int32_t *ids, int n, int32_t *pos, int32_t *block_pos,
                            int32_t *hi, int state[2]);
    /* the position and block position of the row's token at index t >= n */
    void (*next_position)(const int state[2], int t, int32_t *pos, int32_t *block_pos);
} glm_family;

extern const glm_family glm_family_glm;  /* model/block_glm.c */
extern const glm_family glm_family_glm2; /* model/block_glm2.c */
extern const glm_family glm_family_glm4; /* model/block_glm2.c: the ChatGLM2 block with GLM-4-0414's two more norms */
static inline const glm_family *glm_family_of(const glm_config *c) {
    return c->family != GLM_FAMILY_GLM2 ? &glm_family_glm : c->sandwich_norms ? &glm_family_glm4 : &glm_family_glm2;
}

#endif
