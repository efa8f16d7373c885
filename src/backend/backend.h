/* The ops interface. The model (src/model/glm.c) orchestrates forward and backward once, in
 * terms of these operations; each backend implements them: cpu/ (fp32, OpenMP; the oracle)
 * and cuda/ (bf16/fp16/fp32 storage, cuBLASLt). Every CUDA op has a CPU twin with the same
 * signature and meaning, and `make test-cuda` compares them.
 *
 * Storage dtype: parameters, gradients and activations ("S" below) are stored in the
 * backend's dtype (be->dtype: fp32 on the CPU; bf16/fp16/fp32 on CUDA). Statistics (LayerNorm
 * mean/rstd, attention log-sum-exp, per-token losses) and optimizer state are always float.
 * Integer inputs (ids, positions, key ranges, targets) are int32 in device memory.
 * All pointers are device pointers of this backend (host pointers on the CPU).
 * Shapes are given as [rows, cols] row-major; N = number of tokens = B*T.
 *
 * "+=" marks outputs that accumulate (gradients of parameters); "=" outputs are overwritten. */
#ifndef GLM_BACKEND_H
#define GLM_BACKEND_H
#include <stddef.h>
#include <stdint.h>

typedef enum glm_dtype { GLM_F32 = 0, GLM_BF16 = 1, GLM_F16 = 2 } glm_dtype;
static inline size_t glm_dtype_size(glm_dtype d) { return d == GLM_F32 ? 4 : 2; }

/* Query/key/value views into a packed buffer (the attention op reads q, k, v in place).
 * Element (b, t, h, d) is at base + b*batch_stride + t*tok_stride + (h / group)*head_stride + d:
 * with grouped-query attention (ChatGLM2's multi-query groups) `group` query heads share one
 * key/value head; 0 or 1 means one each. */
typedef struct glm_qkv_view {
    void *base;
    long batch_stride, tok_stride, head_stride; /* in elements */
    int group;                                  /* query heads per head of this view (0 = 1) */
} glm_qkv_view;
static inline int glm_view_group(glm_qkv_view v) { return v.group > 1 ? v.group : 1; }

/* The block of the 8-bit blockwise AdamW states (op adamw8, backend/quant8.h): one fp32 absmax
 * per GLM_ADAM8_BLOCK elements of each moment (bitsandbytes' blocksize of that era). */
#define GLM_ADAM8_BLOCK 2048

/* A range of elements [lo, lo + n) of some buffer. */
typedef struct glm_span { size_t lo, n; } glm_span;

typedef struct glm_backend glm_backend;
struct glm_backend {
    const char *name;   /* "cpu", "cuda:0" (for messages: `device` says which) */
    int device;         /* the CUDA device it runs on; -1: the CPU */
    int capability;     /* the GPU's compute capability, 10 * major + minor (75 under GLM_CUDA_TURING=1); 0: the CPU */
    glm_dtype dtype;    /* storage dtype S */
    int allow_tf32;     /* S = fp32: products on TF32 tensor cores (--tf32; the CUDA backend reads it) */
    int deterministic;  /* every sum in a fixed order, run to run (--full_determinism; the CPU backend always
                           is; CUDA: the attention backward without atomics) */
    int tune_products;  /* the products' shapes repeat (training steps): CUDA times cuBLAS's candidate
                           kernels at a product's first call and keeps the fastest */
    void *impl;         /* backend-private state (CUDA handles, streams, workspace) */

    /* ---- memory ---- */
    void *(*alloc)(glm_backend *be, size_t bytes);         /* never NULL: fails loudly with the size */
    void (*free)(glm_backend *be, void *p);
    void (*zero)(glm_backend *be, void *p, size_t bytes);
    void (*copy)(glm_backend *be, void *dst, const void *src, size_t bytes); /* device to device */
    /* rows of S elements, device to device: dst[r*dst_stride + j] = src[r*src_stride + j], j < width */
    void (*copy_rows)(glm_backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t width,
                      size_t rows);
    /* float host <-> S device, converting (n elements) */
    void (*upload_f32)(glm_backend *be, void *dst, const float *src, size_t n);
    void (*download_f32)(glm_backend *be, float *dst, const void *src, size_t n);
    /* n host elements stored as src_dtype (a checkpoint's bytes as read) into S device storage:
     * the values upload_f32 gives for their floats, without a float copy on the host */
    void (*upload_cast)(glm_backend *be, void *dst, const void *src, glm_dtype src_dtype, size_t n);
    /* raw bytes host <-> device (int32 inputs, float statistics) */
    void (*upload)(glm_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(glm_backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(glm_backend *be);

    /* ---- forward/backward ops ---- */
    /* out[N,H] = wte[ids[n], :] */
    void (*embedding_fwd)(glm_backend *be, void *out, const int32_t *ids, const void *wte, int N, int H);
    /* dwte[ids[n], :] += dout[n, :] (deterministic: each row of dwte summed in token order) */
    void (*embedding_bwd)(glm_backend *be, void *dwte, const void *dout, const int32_t *ids, int N, int H, int V);

    /* out = (x - mean) * rstd * w + b over rows of C; mean/rstd [N] float saved for backward */
    void (*layernorm_fwd)(glm_backend *be, void *out, float *mean, float *rstd, const void *x,
                          const void *w, const void *b, int N, int C, float eps);
    /* dx = ; dw, db += (both NULL for a frozen LayerNorm: skipped) */
    void (*layernorm_bwd)(glm_backend *be, void *dx, void *dw, void *db, const void *dout, const void *x,
                          const void *w, const float *mean, const float *rstd, int N, int C);

    /* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL) */
    void (*matmul_fwd)(glm_backend *be, void *out, const void *inp, const void *w, const void *bias,
                       int N, int C, int OC);
    /* out[N,OC] = inp @ w^T + bias + res_scale * res[N,OC] (res may be out itself): a block's
     * residual, or an adapter's product added, in the product's epilogue instead of an
     * elementwise pass. Optional: NULL where a backend lacks it (callers do matmul_fwd, then
     * scale_add). */
    void (*matmul_fwd_add)(glm_backend *be, void *out, const void *inp, const void *w, const void *bias,
                           const void *res, float res_scale, int N, int C, int OC);
    /* act[N,OC] = gelu(pre), pre[N,OC] = inp @ w^T + bias (bias may be NULL): the first MLP
     * product and its activation in one pass (GEMM epilogue). Optional: NULL where a backend
     * lacks it (callers do matmul_fwd, then gelu_fwd). */
    void (*matmul_fwd_gelu)(glm_backend *be, void *act, void *pre, const void *inp, const void *w, const void *bias,
                            int N, int C, int OC);
    /* dinp[N,C] = (dout[N,OC] @ w[OC,C]) * gelu'(pre[N,C]): the second MLP product's input
     * gradient through the activation, in one pass (GEMM epilogue). Optional as above (callers
     * do matmul_bwd, then gelu_bwd). */
    void (*matmul_bwd_dgelu)(glm_backend *be, void *dinp, const void *dout, const void *w, const void *pre, int N,
                             int C, int OC);
    /* dinp[N,C] = dout[N,OC] @ w[OC,C] + res_scale * res[N,C] (res may be dinp): the gradient a
     * block's residual carries past the product, added in the product's epilogue. Optional as
     * above (callers do matmul_bwd, then scale_add). */
    void (*matmul_bwd_add)(glm_backend *be, void *dinp, const void *dout, const void *w, const void *res, float res_scale,
                           int N, int C, int OC);
    /* dinp[N,C] (= or += when accumulate_dinp) dout @ w; dw[OC,C] += dout^T @ inp; dbias += colsum(dout).
     * dinp, dw, dbias may each be NULL (skipped). */
    void (*matmul_bwd)(glm_backend *be, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                       const void *w, int N, int C, int OC, int accumulate_dinp);

    /* 2D rotary, in place on the q and k parts of qkv [N, NH, 3, HD] (per-head interleaved q|k|v).
     * First half of each head dim rotated by pos[n], second half by block_pos[n]; within a half of
     * size R = HD/2, dim j pairs with j + R/2 at angle p * w_j, w_j = fp16(10000^(-2j/R)) (the
     * original rounds inverse frequencies to fp16). inverse = 1 applies the transpose rotation
     * (the backward of the forward). */
    void (*rope)(glm_backend *be, void *qkv, const int32_t *pos, const int32_t *block_pos, int N, int NH,
                 int HD, int inverse);

    /* Attention with per-query key ranges: query (b, i) sees keys j with kv_lo[b*Tq+i] <= j < kv_hi[b*Tq+i]
     * (key indices within the row, 0..Tk). out[B, Tq, NH*HD] (=), lse[B, NH, Tq] float (=) is the
     * natural-log log-sum-exp of the scaled scores, saved for backward. scale = 1/sqrt(HD). */
    void (*attention_fwd)(glm_backend *be, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                          const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale);
    /* dq, dk, dv (=, through views of the same layout as q, k, v) from dout [B,Tq,NH*HD], out, lse.
     * With grouped views (dk.group = dv.group = g > 1) each key/value head's gradient is the sum
     * over its g query heads, in head order. */
    void (*attention_bwd)(glm_backend *be, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout,
                          const void *out, const float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                          const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale);

    /* The ChatGLM2 family's ops (ChatGLM2/3, GLM-4). */
    /* RMSNorm: rstd[n] = 1 / sqrt(mean(x[n]^2) + eps) (float, saved for backward); out = x * rstd * w */
    void (*rmsnorm_fwd)(glm_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps);
    /* dx = ; dw += (NULL for a frozen norm: skipped) */
    void (*rmsnorm_bwd)(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                        const float *rstd, int N, int C);
    /* the same with dx = the norm's input gradient + res (a residual branch's gradient; res is
     * neither dx nor dout): one pass instead of rmsnorm_bwd, then scale_add. Optional (NULL:
     * callers run the two). */
    void (*rmsnorm_bwd_add)(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                            const float *rstd, const void *res, int N, int C);
    /* SwiGLU: x [N, 2F] = gate | up; out[N, F] = silu(gate) * up, silu(g) = g / (1 + e^-g) */
    void (*swiglu_fwd)(glm_backend *be, void *out, const void *x, int N, int F);
    /* dx [N, 2F] (=) from dout [N, F] and the forward's x */
    void (*swiglu_bwd)(glm_backend *be, void *dx, const void *x, const void *dout, int N, int F);
    /* Rotary on interleaved pairs, in place: for token n (row x + n*row_stride) and head h < nheads
     * (x + n*row_stride + h*HD), dims [0, rot) rotate in pairs (2i, 2i+1) by angle pos[n] * w_i,
     * w_i = 1 / theta^(2i/rot) (fp32), dims [rot, HD) pass through:
     *   (a, b) -> (a cos - b sin, b cos + a sin). inverse = 1 applies the transpose (backward). */
    void (*rope_pairs)(glm_backend *be, void *x, long row_stride, int N, int nheads, int HD, int rot,
                       const int32_t *pos, float theta, int inverse);

    /* tanh GELU: out = 0.5 x (1 + tanh(0.7978845608028654 x (1 + 0.044715 x^2))) */
    void (*gelu_fwd)(glm_backend *be, void *out, const void *x, size_t n);
    /* dx = dout * gelu'(x); dx may alias dout */
    void (*gelu_bwd)(glm_backend *be, void *dx, const void *x, const void *dout, size_t n);

    /* out = alpha * x + y (out may alias y) */
    void (*scale_add)(glm_backend *be, void *out, float alpha, const void *x, const void *y, size_t n);
    /* out = x * scale * keep(i) / (1 - p): dropout with the counter-based mask of
     * backend/mask_hash.h (the same elements on every backend, redrawn from the seed in
     * backward); p = 0 is a plain scale. out may alias x. */
    void (*mask_scale)(glm_backend *be, void *out, const void *x, size_t n, float scale, float p, uint64_t seed);
    /* x[i] = fma(mag, u(i), x[i]), u(i) uniform in [-1, 1) from the counter hash of
     * backend/mask_hash.h (glm_uniform_pm1: the same draws on every backend), rounded to S:
     * NEFTune's noise on the embeddings while training */
    void (*noise_add)(glm_backend *be, void *x, size_t n, float mag, uint64_t seed);
    /* LoRA's down-projection of its dropped-out input (peft's lora_A(dropout(x))) in one pass:
     * t[N,r] = scale * (mask_scale(x, 1, p, seed) @ a[r,C]^T), the mask over x's N*C elements.
     * Optional (NULL), and returns 0 without doing anything for shapes it does not take: the
     * caller then runs mask_scale and matmul_fwd. */
    int (*lora_down)(glm_backend *be, void *t, const void *x, const void *a, int N, int C, int r, float scale, float p,
                     uint64_t seed);
    /* Its backward, dt[N,r] the gradient of mask_scale(x, 1, p, seed) @ a^T: da[r,C] += dt^T
     * u and dx[N,C] += mask_scale(dt @ a, 1, p, seed) (either may be NULL: skipped), u the
     * dropped-out x as above. Optional and 0 as lora_down. */
    int (*lora_down_bwd)(glm_backend *be, void *da, void *dx, const void *dt, const void *x, const void *a, int N, int C,
                         int r, float p, uint64_t seed);

    /* DoRA (peft's use_dora; model/peft.c). The row norms of a weight with its adapter added,
     * in float: n[j] = sqrt(sum_k (w[j,k] + scale * sum_q b[j,q] a[q,k])^2), w [OC, C], a [r, C],
     * b [OC, r] (S). */
    void (*dora_norm)(glm_backend *be, float *n, const void *w, const void *a, const void *b, float scale, int OC,
                      int C, int r);
    /* out[t,j] = (mag[j] / n[j] - shift) z[t,j] + bias[j] + res_scale res[t,j] over [N, OC] (bias,
     * res may be NULL; out may alias z or res; shift 1: peft's (c - 1) on the dropped-out input) */
    void (*dora_scale)(glm_backend *be, void *out, const void *z, const void *mag, const float *n, float shift,
                       const void *bias, const void *res, float res_scale, int N, int OC);
    /* Its backward with n held constant: dz[t,j] = (mag[j] / n[j] - shift) dout[t,j] (=), dmag[j] +=
     * sum_t dout[t,j] z[t,j] / n[j], summed in a fixed order */
    void (*dora_bwd)(glm_backend *be, void *dz, void *dmag, const void *dout, const void *z, const void *mag,
                     const float *n, float shift, int N, int OC);

    /* Cross entropy over rows of logits[R, V] against targets[R] (all valid, 0 <= t < V):
     * losses[r] = logsumexp(logits[r]) - logits[r, t] (float, =). If dscale != 0, logits are
     * replaced in place by dscale * (softmax(logits[r]) - onehot(t)) — the gradient of
     * dscale * sum(losses) — or with row_scale (float [R], where the op runs; NULL: none) by
     * dscale * row_scale[r] * (...) per row, the gradient of dscale * sum(row_scale[r] losses[r])
     * (preference losses weigh each sequence's tokens). */
    void (*cross_entropy)(glm_backend *be, void *logits, float *losses, const int32_t *targets, int R, int V,
                          float dscale, const float *row_scale);
    /* Greedy decoding of R rows of logits x [R, V] (S) into host ints: out[r] = the first index
     * of row r's maximum, or 5 when the row holds a NaN or infinity (the original's
     * InvalidScoreLogitsProcessor, as glm_sample_next) — so only R ints leave the device.
     * Optional (NULL: download the logits and pick on the host). */
    void (*argmax_rows)(glm_backend *be, int32_t *out, const void *x, int R, int V);
    /* x[r, :] *= s[r] over rows of C (s: float [R], where the op runs): a weighed loss's per-row
     * weights applied to the head's input gradient after its product (model/glm.c, frozen heads) */
    void (*scale_rows)(glm_backend *be, void *x, const float *s, int R, int C);
    /* out[r, :] = x[idx[r], :] for r < R */
    void (*gather_rows)(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C);
    /* out[idx[r], :] = x[r, :] for r < R (other rows untouched) */
    void (*scatter_rows)(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C);

    /* ---- optimizer ---- */
    /* sum of squares of x[n] (S), accumulated in double; result returned to the host */
    double (*sumsq)(glm_backend *be, const void *x, size_t n);
    /* the same over k ranges x[s[i].lo, s[i].lo + s[i].n) with one wait for the host (e.g. a
     * ZeRO shard: one piece of every gradient bucket); summed in the order given */
    double (*sumsq_spans)(glm_backend *be, const void *x, const glm_span *s, int k);
    /* x[s[i].lo + j] += y[yoff[i] + j] (rounded to S) over the k ranges, then sumsq_spans of the
     * sums, in one pass (a ZeRO shard summed from what the peers copied in, parallel/dp/dp_peer.c) */
    double (*add_sumsq_spans)(glm_backend *be, void *x, const void *y, const size_t *yoff, const glm_span *s, int k);
    /* AdamW (PyTorch semantics) on n elements: g = grad * grad_scale; m = b1 m + (1-b1) g;
     * v = b2 v + (1-b2) g^2; p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps)), where p is the
     * fp32 master copy (master != NULL) written back to param in S, or param itself (fp32 backend,
     * master == NULL). bc1 = 1 - b1^t, bc2 = 1 - b2^t. */
    void (*adamw)(glm_backend *be, void *param, float *master, const void *grad, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale);
    /* 8-bit blockwise AdamW: bitsandbytes' AdamW8bit (optimizer_update_8bit_blockwise, its
     * kOptimizerStatic8bit2StateBlockwise with ADAM and decoupled weight decay), block size
     * GLM_ADAM8_BLOCK. Element j of the call is in block b = j / GLM_ADAM8_BLOCK of this call
     * (the caller starts every call on a block boundary of its state arrays); qm, qv [n] are
     * codes into backend/quant8.h's maps (signed for m, unsigned for v), absm, absv [ceil(n /
     * GLM_ADAM8_BLOCK)] the blocks' fp32 absmax. Per element, in this order:
     *   g = grad * grad_scale
     *   m = (signed[qm] * absm[b]) * b1 + (1-b1) * g;  v = (unsigned[qv] * absv[b]) * b2 + ((1-b2) * g) * g
     *   p = p + (-lr * sqrt(bc2) / bc1) * (m / (sqrt(v) + sqrt(bc2) * eps));  then p = p * (1 - lr*wd)
     *       when the element decays: bit k = (flat0 + j) / 64 of decay_bits is set (byte k >> 3,
     *       bit k & 7; flat0 a multiple of 64; decay_bits in this backend's memory), else wd = 0
     * then absm[b] = max |m| and absv[b] = max |v| over the block's elements (the updated,
     * unquantized moments; the parameter update also uses those), and qm, qv = the nearest code
     * of m / absm[b], v / absv[b] (bitsandbytes' quantize_2D search, its sign fix on m): the
     * per-element helpers of backend/quant8.h, which both backends share, so fp32 results are
     * equal bit for bit across backends. p is the fp32 master (master != NULL) written back to
     * param rounded to S, or param itself (master == NULL; read and written in S, fp32 on the
     * CPU backend). bc1 = 1 - b1^t, bc2 = 1 - b2^t. A fresh state is absmax 0 in every block
     * with any codes (absmax 0 decodes every code to +-0): be->zero on all four arrays is one
     * (bitsandbytes' torch.zeros); glm_q8_zero_code names the code of 0.0 of each map.
     * Deterministic. Unlike bitsandbytes, every tensor is quantized (it keeps fp32 states
     * below min_8bit_size = 4096 elements); see backend/quant8.h for the other differences. */
    void (*adamw8)(glm_backend *be, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv,
                   float *absm, float *absv, size_t n, const uint8_t *decay_bits, size_t flat0, float lr, float b1,
                   float b2, float eps, float wd, float bc1, float bc2, float grad_scale);

    /* GaLore's update (optim/galore.h), in two steps around the products that project the
     * gradient and its update, on float buffers of the backend:
     * adam_dir: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; dir = m / (sqrt(v) + eps), over n
     * elements (dir may alias g): the normalized step of galore_torch's AdamW before its bias
     * corrections, which the caller folds into apply_dir's alpha. */
    void (*adam_dir)(glm_backend *be, float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2,
                     float eps);
    /* apply_dir: p = p + alpha * dir, then p = p + shrink * p (galore_torch's weight decay after
     * the step, shrink = -lr * wd), where p is the fp32 master (master != NULL) written back to
     * param rounded to S, or param itself (fp32 backend, master == NULL). */
    void (*apply_dir)(glm_backend *be, void *param, float *master, const float *dir, size_t n, float alpha, float shrink);

    /* ---- P-Tuning v2 (prefix keys/values; THUDM's PrefixEncoder) ---- */
    /* H = NH*HD. pkv [P, 2L*H] is the prefix encoder's output for all L layers, per position laid
     * out [2L, NH, HD]: slot 2l = layer l's keys, 2l+1 its values (not rotated).
     * kv [B, P+T, NH, 2, HD] (=, per head k then v): for batch row b,
     *   kv[b, j, h, s, d] = pkv[j, ((2*layer + s)*NH + h)*HD + d] * keep(i) / (1 - p)   (j < P)
     *   kv[b, P+t, h, s, d] = qkv[b, t, h, 1 + s, d]                                   (t < T)
     * qkv [B, T, NH, 3, HD] as in rope. keep(i) is glm_mask_keep(seed, i, glm_mask_threshold(p))
     * (backend/mask_hash.h, as mask_scale) with i the flat index of the element in kv, so every
     * batch row draws its own mask; a dropped element is 0; p = 0: no dropout (an exact copy).
     * Attention then reads k at kv (batch stride (P+T)*2H, token stride 2H, head stride 2HD) and
     * v at kv + HD with the same strides, Tk = P + T, key ranges shifted by P. */
    void (*prefix_kv)(glm_backend *be, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int T,
                      int P, int NH, int HD, float p, uint64_t seed);
    /* The backward of prefix_kv from dkv [B, P+T, NH, 2, HD]:
     *   dqkv[b, t, h, 1 + s, d] = dkv[b, P+t, h, s, d]       (=; dqkv's q slots are not touched)
     *   dpkv[j, ((2*layer + s)*NH + h)*HD + d] += sum over b = 0..B-1 in order of
     *                                            dkv[b, j, h, s, d] * keep(i) / (1 - p)
     * with the forward's mask (same seed, i = the flat index in dkv); the sum is in fp32, added to
     * dpkv once (other slots of dpkv untouched). Deterministic: bit-identical on every run. */
    void (*prefix_kv_bwd)(glm_backend *be, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B, int T,
                          int P, int NH, int HD, float p, uint64_t seed);
    /* out = tanh(x) */
    void (*tanh_fwd)(glm_backend *be, void *out, const void *x, size_t n);
    /* dx = dout * (1 - out^2) from the forward's output; dx may alias dout */
    void (*tanh_bwd)(glm_backend *be, void *dx, const void *out, const void *dout, size_t n);

    /* ---- quantized weights (backend/quant.h lays out the bytes of one [OC, C] matrix) ---- */
    /* w[OC, C] (S, =) = the dequantized matrix q of type qtype (int glm_qtype): each element's
     * value in fp32 as glm_dequantize computes it, then rounded to S, so every backend holds the
     * same weights */
    void (*dequantize)(glm_backend *be, void *w, const void *q, int qtype, int OC, int C);
    /* out[N, OC] (=) = inp[N, C] @ dequantized(q)^T + bias (bias may be NULL): the product
     * reading the quantized bytes directly, for few rows (decoding), sums in fp32 */
    void (*qmatmul_fwd)(glm_backend *be, void *out, const void *inp, const void *q, int qtype, const void *bias,
                        int N, int C, int OC);

    void (*destroy)(glm_backend *be);

    /* ---- optional (NULL where a backend lacks it; callers fall back) ---- */
    /* dst[n] (float, device) = src[n] (S, device): e.g. the fp32 AdamW master copy made on the
     * device instead of through a host round trip (27 GB each way for ChatGLM-6B). */
    void (*to_f32)(glm_backend *be, float *dst, const void *src, size_t n);
    /* dst[n] (S, device) = src[n] (float, device), rounded to nearest even as upload_f32 rounds */
    void (*from_f32)(glm_backend *be, void *dst, const float *src, size_t n);
    /* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C on float buffers of the backend, row-major
     * as cpu_sgemm: the few float products outside the model's dtype (PiSSA's randomized SVD of a
     * weight where it lives) */
    void (*sgemm)(glm_backend *be, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);
    /* G [q, k] (host, double) = x^T y for x [n, q] and y [n, k], float buffers of the backend (y
     * may be x): products and sums in double, summed in an order that does not depend on the
     * launch. Waits for the result. With mul_small_f64, the SVD's thin blocks (backend/svd.c)
     * stay where the matrix lives; only q x k numbers cross to the host. */
    void (*gram_f64)(glm_backend *be, double *G, const float *x, const float *y, int n, int q, int k);
    /* y [n, k] = x [n, q] M for M [q, k] (host, double), each entry summed in double in a's order
     * and rounded once; y may be x (a row is read whole before it is written) */
    void (*mul_small_f64)(glm_backend *be, float *y, const float *x, const double *M, int n, int q, int k);
    /* x [n, q] (a float buffer of the backend) made orthonormal in place by Cholesky QR twice, in
     * double: per pass G = x^T x (gram_f64's), G = R^T R and R^-1 where x lives, x = x R^-1
     * (mul_small_f64's); only whether it worked comes back (one wait). -1 when a pivot is not
     * clearly positive, x then as that pass found it. Optional: NULL where svd.c is to make R on
     * the host between gram_f64 and mul_small_f64. */
    int (*orth_f64)(glm_backend *be, float *x, int n, int q);

    /* ---- host staging for an offloaded optimizer (optional: NULL where the backend's memory is
     * host memory; callers then copy with memcpy) ---- */
    /* page-locked host memory, which the copy engines move at full speed; never NULL */
    void *(*host_alloc)(glm_backend *be, size_t bytes);
    void (*host_free)(glm_backend *be, void *p);
    /* bytes device -> host (to_host) or host -> device, on a copy stream of that direction, after
     * the work the compute stream has so far; the host goes on. Returns a ticket (> 0). Callable
     * from any thread. */
    long (*copy_async)(glm_backend *be, void *dst, const void *src, size_t bytes, int to_host);
    /* the host waits until copy `ticket` is done */
    void (*copy_wait)(glm_backend *be, long ticket);
    /* compute work issued from now on waits (on the device) until copy `ticket` is done */
    void (*compute_wait)(glm_backend *be, long ticket);
};

glm_backend *glm_backend_cpu(void);
/* Whether the backend computes on a GPU (its memory is the device's). */
static inline int glm_backend_on_gpu(const glm_backend *be) { return be->device >= 0; }
#ifdef GLM_HAVE_CUDA
/* CUDA backend on `device` with storage dtype; NULL and a message when no GPU is usable. */
glm_backend *glm_backend_cuda(int device, glm_dtype dtype, char *errbuf, size_t errlen);
#endif
/* The GPUs this process sees (0 without a driver, or in a build without CUDA): a NULL backend
 * on a machine with GPUs is a configuration to fix, not a reason to fall back to the CPU. */
#ifdef GLM_HAVE_CUDA
int glm_cuda_device_count(void);
#else
static inline int glm_cuda_device_count(void) { return 0; }
#endif

/* The backend a command's --device asks for, the one place that reads it: "cpu" -> the CPU; "cuda"
 * -> GPU gpu with the first of dtypes[n_dtypes] it can store (a GPU without bf16 may take the
 * fp16 that follows), or -1 with err (and a hint) when none can be used, in a build without CUDA
 * too; "auto" -> the same GPU when one can be used, else *out NULL and the reason in why (empty in
 * a build without CUDA): the command decides whether that means the CPU or an error. */
struct glm_err; /* core/err.h (C only: CUDA files include this header too) */
int glm_backend_open(const char *device, int gpu, const glm_dtype *dtypes, int n_dtypes, glm_backend **out, char *why,
                     size_t cap, struct glm_err *err);

/* Element pointer arithmetic on S buffers. */
static inline void *glm_at(const glm_backend *be, const void *p, size_t elems) {
    return (char *)p + elems * glm_dtype_size(be->dtype);
}

#endif
