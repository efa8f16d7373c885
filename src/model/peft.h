/* LoRA and P-Tuning v2 inside the model (model/glm.c calls these; config.h glm_peft says which):
 *  - the four linear modules of a layer (target i: 0 query_key_value, 1 dense, 2 dense_h_to_4h,
 *    3 dense_4h_to_h) as peft's LoraLayer where they have an adapter:
 *    out = inp W^T + b + (s * dropout(inp) A^T) B^T, s = glm_lora_scaling; with DoRA (peft's
 *    use_dora) out = (mag / ||W + s B A||_row) (inp W^T + s inp A^T B^T) + b;
 *  - the prefix encoder's forward (glm_prefix_forward in glm.h) and backward, and each layer's
 *    keys/values with the prefix in front (the original's per-row dropout while training). */
#ifndef GLM_MODEL_PEFT_H
#define GLM_MODEL_PEFT_H
#include "model/glm.h"

/* out = inp W^T + b (+ the adapter's branch); the adapter's middle goes to a->lora_t[i]. */
void glm_linear_fwd(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, const void *w,
                    const void *b, int N, int C, int OC);
/* out = inp W^T + b (+ the adapter's share) + res_scale * res: the block's residual in the
 * product's epilogue where the backend has one (else the same sums as glm_linear_fwd followed by
 * scale_add, in that order). */
void glm_linear_fwd_add(glm_model *m, int l, int i, glm_layer_acts *a, void *out, const void *inp, const void *w,
                        const void *b, int N, int C, int OC, const void *res, float res_scale);
/* dinp = dout W (+ the adapter's share); dW, db += where they train; dA, dB += for the adapter. */
void glm_linear_bwd(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db, const void *dout,
                    const void *inp, const void *w, int N, int C, int OC);
/* glm_linear_bwd, then dinp += res_scale * res (a residual's gradient: in the product's epilogue
 * where the backend has matmul_bwd_add). */
void glm_linear_bwd_add(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OC, const void *res, float res_scale);
/* act = gelu(pre), pre = inp W^T + b (+ the adapter's branch): in the product's epilogue where
 * the backend has one and no adapter comes between the product and the activation (else
 * glm_linear_fwd, then gelu_fwd). */
void glm_linear_fwd_gelu(glm_model *m, int l, int i, glm_layer_acts *a, void *act, void *pre, const void *inp,
                         const void *w, const void *b, int N, int C, int OC);
/* dinp = (dout W + the adapter's share) * gelu'(pre), and the weight, bias and adapter gradients
 * as glm_linear_bwd: the derivative in the input-gradient product's epilogue where it can be. */
void glm_linear_bwd_dgelu(glm_model *m, int l, int i, glm_layer_acts *a, void *dinp, void *dw, void *db, const void *dout,
                          const void *inp, const void *w, const void *pre, int N, int C, int OC);
/* Whether module i's backward reads its input (its weight trains or it has an adapter): what
 * selective checkpointing must rebuild before it. */
int glm_linear_reads_input(const glm_model *m, int l, int i);
/* Layer l's prefix + sequence keys/values into m->kvbuf (from a->qkv and the encoder's output),
 * and the views attention reads them through (Tk = P + T). */
void glm_prefix_kv_views(glm_model *m, int l, glm_layer_acts *a, glm_qkv_view *k, glm_qkv_view *v);
/* Before a backward: clears where the layers' prefix gradients go (m->dpkv; nothing when they
 * go straight into the prefix embedding's gradient: no projection and no ZeRO-2 staging). */
void glm_prefix_backward_begin(glm_model *m);
/* From m->dkvbuf (attention's dk/dv over prefix + sequence): the sequence's into m->d_qkv, the
 * prefix's summed over the batch into m->dpkv (or the embedding's gradient). */
void glm_prefix_kv_grads(glm_model *m, int l);
/* The ChatGLM2 block's KV cache: one row's prefix keys/values of layer l ([P, 2 NKV HD], k heads
 * then v heads, no dropout) at row, from the encoder's output of glm_prefix_forward. */
void glm_prefix_fill_cache(glm_model *m, int l, void *row);
/* dpkv (the layers' sum) into the prefix encoder's gradients. */
void glm_prefix_backward(glm_model *m);

#endif
