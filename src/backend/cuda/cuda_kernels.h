/* Launchers of the CUDA kernels (extern "C", defined in the .cu files of this folder), called
 * by the C host code in cuda_backend.c. Each one enqueues work on `st` and returns at once;
 * shapes and meaning are those of the op of the same name in backend/backend.h. `dt` is the
 * storage dtype S of every S pointer. Scratch buffers are device memory owned by the caller. */
#ifndef GLM_CUDA_KERNELS_H
#define GLM_CUDA_KERNELS_H
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checked CUDA call failure: prints file:line, the call, the CUDA message and a HINT; exits. */
void glm_cuda_check_at(cudaError_t e, const char *what, const char *file, int line);

/* ---- elementwise / copies (k_elementwise.cu) ---- */
/* 1 when the build has code this device runs (its machine code, or PTX the driver compiles);
 * 0 with the CUDA message in why otherwise */
int glmk_image_ok(char *why, size_t whylen);
/* dst[i] = (dst_dt) src[i] */
void glmk_convert(void *dst, glm_dtype dst_dt, const void *src, glm_dtype src_dt, size_t n, cudaStream_t st);
/* dst[i] = std * N(0,1) from a counter-based generator (seed, i): for benchmarks and tests */
void glmk_fill_normal(glm_dtype dt, void *dst, size_t n, uint64_t seed, float std, cudaStream_t st);
void glmk_fill(glm_dtype dt, void *dst, size_t n, float value, cudaStream_t st);
void glmk_embedding_fwd(glm_dtype dt, void *out, const int32_t *ids, const void *wte, int N, int H, cudaStream_t st);
void glmk_embedding_bwd(glm_dtype dt, void *dwte, const void *dout, const int32_t *ids, int N, int H, cudaStream_t st);
void glmk_gelu_fwd(glm_dtype dt, void *out, const void *x, size_t n, cudaStream_t st);
void glmk_gelu_bwd(glm_dtype dt, void *dx, const void *x, const void *dout, size_t n, cudaStream_t st);
void glmk_scale_add(glm_dtype dt, void *out, float alpha, const void *x, const void *y, size_t n, cudaStream_t st);
void glmk_scale_rows(glm_dtype dt, void *x, const float *s, int R, int C, cudaStream_t st);
void glmk_mask_scale(glm_dtype dt, void *out, const void *x, size_t n, float scale, float p, uint64_t seed,
                     cudaStream_t st);
void glmk_noise_add(glm_dtype dt, void *x, size_t n, float mag, uint64_t seed, cudaStream_t st);
/* ---- DoRA's row norms, row scale and its backward (k_dora.cu) ---- */
/* n[j] = sqrt(||W_j||^2 + 2 s B_j . G_j + s^2 B_j M B_j^T) with G = W A^T [OC, r] and M = A A^T
 * [r, r] in float (cuda_backend.c makes them on cuBLAS) */
void glmk_dora_norm(glm_dtype dt, float *n, const void *w, const void *b, const float *g, const float *aat, float scale,
                    int OC, int C, int r, cudaStream_t st);
void glmk_dora_scale(glm_dtype dt, void *out, const void *z, const void *mag, const float *n, float shift, const void *bias,
                     const void *res, float res_scale, int N, int OC, cudaStream_t st);
void glmk_dora_bwd(glm_dtype dt, void *dz, void *dmag, const void *dout, const void *z, const void *mag, const float *n,
                   float shift, int N, int OC, float *scratch, cudaStream_t st);
/* floats of glmk_dora_bwd's scratch: the row chunks' partial sums per column */
size_t glmk_dora_bwd_scratch(int N, int OC);

/* ---- LoRA's down-projection with its dropout (k_lora.cu): 1 when done, 0 for shapes they do not
 * take (rank above 16, rows not in 16-byte packs); scratch: glmk_lora_down_bwd_scratch floats ---- */
int glmk_lora_down(glm_dtype dt, void *t, const void *x, const void *a, int N, int C, int r, float scale, float p,
                   uint64_t seed, cudaStream_t st);
size_t glmk_lora_down_bwd_scratch(glm_dtype dt, int N, int C, int r);
/* out[N,OC] = t[N,K] w[OC,K]^T for K <= 16 (LoRA's B product), 16-bit storage, OC a multiple of 8,
 * out 16-byte aligned; 0 (nothing done) for other shapes */
int glmk_small_k_fwd(glm_dtype dt, void *out, const void *t, const void *w, int N, int K, int OC, cudaStream_t st);
/* its backward: dinp[N,K] (= or += with accumulate) dout w, dw[OC,K] += dout^T t, in one read of
 * dout (both outputs wanted, same shapes; scratch: glmk_small_k_bwd_scratch floats) */
size_t glmk_small_k_bwd_scratch(int N, int K, int OC);
int glmk_small_k_bwd(glm_dtype dt, void *dinp, void *dw, const void *dout, const void *t, const void *w, int N, int K, int OC,
                     int accumulate, float *scratch, cudaStream_t st);
int glmk_lora_down_bwd(glm_dtype dt, void *da, void *dx, const void *dtv, const void *x, const void *a, int N, int C,
                       int r, float p, uint64_t seed, float *scratch, cudaStream_t st);
void glmk_gather_rows(glm_dtype dt, void *out, const void *x, const int32_t *idx, int R, int C, cudaStream_t st);
void glmk_scatter_rows(glm_dtype dt, void *out, const void *x, const int32_t *idx, int R, int C, cudaStream_t st);
/* inv_freq: the R/2 (<= 128) fp16-rounded inverse frequencies, computed on the host */
void glmk_rope(glm_dtype dt, void *qkv, const int32_t *pos, const int32_t *bpos, int N, int NH, int HD, int inverse,
               const float *inv_freq, cudaStream_t st);
/* out[N, OC] += bias[OC] (used when the GEMM ran without the bias epilogue) */
void glmk_bias_add(glm_dtype dt, void *out, const void *bias, int N, int OC, cudaStream_t st);

/* ---- the ChatGLM2 family (k_glm2.cu) ---- */
void glmk_rmsnorm_fwd(glm_dtype dt, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps,
                      cudaStream_t st);
/* scratch: glmk_rmsnorm_bwd_scratch(N, C) floats; res (NULL: none) is added to dx */
size_t glmk_rmsnorm_bwd_scratch(int N, int C);
void glmk_rmsnorm_bwd(glm_dtype dt, void *dx, void *dw, const void *dout, const void *x, const void *w, const float *rstd,
                      const void *res, int N, int C, float *scratch, cudaStream_t st);
void glmk_swiglu_fwd(glm_dtype dt, void *out, const void *x, int N, int F, cudaStream_t st);
void glmk_swiglu_bwd(glm_dtype dt, void *dx, const void *x, const void *dout, int N, int F, cudaStream_t st);
/* w: the rot/2 (<= 256) fp32 frequencies, host memory (passed by value to the kernel) */
void glmk_rope_pairs(glm_dtype dt, void *x, long row_stride, int N, int nheads, int HD, int rot, const int32_t *pos,
                     const float *w, int inverse, cudaStream_t st);
/* dst (grouped view, NKV heads) = sum over each group's g heads of src [B, Tk, NKV*g, HD] */
void glmk_group_sum(glm_dtype dt, glm_qkv_view dst, const void *src, int B, int Tk, int NKV, int g, int HD,
                    cudaStream_t st);

/* ---- P-Tuning v2 (k_prefix.cu) ---- */
void glmk_prefix_kv(glm_dtype dt, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int T, int P,
                    int NH, int HD, float p, uint64_t seed, cudaStream_t st);
void glmk_prefix_kv_bwd(glm_dtype dt, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B, int T, int P,
                        int NH, int HD, float p, uint64_t seed, cudaStream_t st);
void glmk_tanh_fwd(glm_dtype dt, void *out, const void *x, size_t n, cudaStream_t st);
void glmk_tanh_bwd(glm_dtype dt, void *dx, const void *out, const void *dout, size_t n, cudaStream_t st);

/* ---- quantized weights (k_quant.cu; byte layouts in backend/quant.h, qtype an int glm_qtype) ---- */
/* w[OC, C] (S) = the dequantized matrix, bit-identical to glm_dequantize rounded to S */
void glmk_dequantize(glm_dtype dt, void *w, const void *q, int qtype, int OC, int C, cudaStream_t st);
/* out[N, OC] = inp[N, C] @ dequantized(q)^T + bias (bias may be NULL), from the packed bytes */
void glmk_qmatmul_fwd(glm_dtype dt, void *out, const void *inp, const void *q, int qtype, const void *bias, int N,
                      int C, int OC, cudaStream_t st);
/* Tuning and test hooks, the same ops with the kernel chosen. dequantize variant: 0 default,
 * 1 one 16-byte chunk per thread, 2 eight weights per thread (contiguous stores), 3 scalar.
 * qmatmul path: 0 default, 1 SIMT (kw warps split a row group's columns: 1 or 4, 0 default;
 * rb1 rows per warp group at N = 1: 4 or 8, 0 default), 2 tensor cores (INT4, bf16/fp16,
 * C % 128 == 0; else SIMT; rb1 = 1: 16-row tiles per warp, else 32). Shapes or pointers a
 * kernel cannot take fall back as by default. */
void glmk_dequantize_cfg(glm_dtype dt, void *w, const void *q, int qtype, int OC, int C, int variant, cudaStream_t st);
void glmk_qmatmul_fwd_cfg(glm_dtype dt, void *out, const void *inp, const void *q, int qtype, const void *bias, int N,
                          int C, int OC, int path, int kw, int rb1, cudaStream_t st);

/* ---- reductions (k_reduce.cu) ---- */
/* Column sums of a [N, C] S matrix, deterministic: scratch holds glmk_colsum_scratch(N, C) floats.
 * dst1 += colsum(a);  if b != NULL, dst2 += colsum(a * b ...) -- see k_reduce.cu for the two uses. */
size_t glmk_colsum_scratch(int N, int C);
void glmk_bias_grad(glm_dtype dt, void *dbias, const void *dout, int N, int OC, float *scratch, cudaStream_t st);
void glmk_layernorm_fwd(glm_dtype dt, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b,
                        int N, int C, float eps, cudaStream_t st);
/* scratch: 2 * glmk_colsum_scratch(N, C) floats */
void glmk_layernorm_bwd(glm_dtype dt, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                        const float *mean, const float *rstd, int N, int C, float *scratch, cudaStream_t st);
/* out[r] (device) = first index of row r's maximum of x [R, V], 5 if the row is not finite */
void glmk_argmax_rows(glm_dtype dt, int32_t *out, const void *x, int R, int V, cudaStream_t st);
void glmk_cross_entropy(glm_dtype dt, void *logits, float *losses, const int32_t *targets, int R, int V, float dscale,
                        const float *row_scale, cudaStream_t st);
/* *result (device double) = sum of squares; partial holds GLMK_SUMSQ_BLOCKS doubles */
#define GLMK_SUMSQ_BLOCKS 1024
void glmk_sumsq(glm_dtype dt, const void *x, size_t n, double *partial, double *result, cudaStream_t st);
/* result[i] (device doubles) = sum of squares of x[spans[i].lo, +spans[i].n) for i < k, in two
 * launches whatever k; spans (and yoff) are device memory; partial holds k * GLMK_SUMSQ_SPAN_BLOCKS
 * doubles. y != NULL: first x[spans[i].lo + j] += y[yoff[i] + j], and the squares are of the sums. */
#define GLMK_SUMSQ_SPAN_BLOCKS 64
void glmk_sumsq_spans(glm_dtype dt, void *x, const void *y, const glm_span *spans, const size_t *yoff, int k, int vec,
                      double *partial, double *result, cudaStream_t st);
void glmk_adamw(glm_dtype dt, void *param, float *master, const void *grad, float *m, float *v, size_t n, float lr,
                float b1, float b2, float eps, float wd, float bc1, float bc2, float grad_scale, cudaStream_t st);
/* backend.h adam_dir and apply_dir (GaLore's steps) */
void glmk_adam_dir(float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps, cudaStream_t st);
void glmk_apply_dir(glm_dtype dt, void *param, float *master, const float *dir, size_t n, float alpha, float shrink,
                    cudaStream_t st);
/* backend.h gram_f64 and mul_small_f64 (k_svd.cu): G (device, q x k doubles) from partial sums
 * in part (GLMK_GRAM_BLOCKS x q x k doubles); M device memory */
#define GLMK_GRAM_BLOCKS 128
void glmk_gram_f64(double *part, double *G, const float *x, const float *y, int n, int q, int k, cudaStream_t st);
void glmk_mul_small_f64(float *y, const float *x, const double *M, int n, int q, int k, cudaStream_t st);
/* backend.h orth_f64's device part: two passes of Gram matrix, Cholesky factor and inverse (one
 * block, *fail set where a pivot fails, every later step then skipped) and x = x R^-1; part as
 * glmk_gram_f64's, G and Ri [q, q] device doubles, *fail a device int */
void glmk_orth_f64(double *part, double *G, double *Ri, int *fail, float *x, int n, int q, cudaStream_t st);
/* backend.h adamw8 (k_adam8.cu); s: the step's scalars from glm_adam8_prepare (backend/quant8.h),
 * computed by the caller on the host as the CPU op computes them */
struct glm_adam8_scalars;
void glmk_adamw8(glm_dtype dt, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv, float *absm,
                 float *absv, size_t n, const uint8_t *decay_bits, size_t flat0, const struct glm_adam8_scalars *s,
                 float grad_scale, cudaStream_t st);

/* ---- attention (k_attention.cu: any head size, fp32 math; k_flash.cu: tensor cores) ---- */
/* D[b, h, i] = sum_d dout * out (fp32 [B, NH, Tq]): the softmax-backward row term */
void glmk_attn_rowdot(glm_dtype dt, float *D, const void *dout, const void *out, int B, int Tq, int NH, int HD,
                      cudaStream_t st);
/* Decoding attention (k_decode.cu): a few queries (Tq <= 4) over at least 64 keys, HD <= 128 a
 * multiple of 32; scratch holds glmk_decode_attention_scratch bytes. */
int glmk_decode_attention_supported(int Tq, int Tk, int HD);
size_t glmk_decode_attention_scratch(int B, int Tq, int Tk, int NH, int HD);
void glmk_decode_attention(glm_dtype dt, void *out, float *lse, float *scratch, glm_qkv_view q, glm_qkv_view k,
                           glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD,
                           float scale, cudaStream_t st);
void glmk_attention_fwd_simt(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                             const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                             cudaStream_t st);
/* parts: which gradients the backward kernels write, dq (GLMK_ATTN_DQ), dk and dv (GLMK_ATTN_DKV) */
#define GLMK_ATTN_DQ 1
#define GLMK_ATTN_DKV 2
void glmk_attention_bwd_simt(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout,
                             const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                             const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                             int parts, cudaStream_t st);
/* Tensor-core path: bf16/fp16 storage, HD 64 or 128, 16-byte aligned rows. Returns 0 when the
 * shapes do not qualify (the caller then uses the SIMT kernels). */
int glmk_flash_supported(glm_dtype dt, int HD, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                         const void *o1, const void *o2);
/* smem_max: the shared memory a block may take on the device (cudaDevAttrMaxSharedMemoryPerBlockOptin);
 * each kernel runs double-buffered where that fits, else single-buffered (Turing's 64 KiB), else
 * not: the forward returns 0 and does nothing then, the backward returns the parts it wrote
 * (GLMK_ATTN_DQ | GLMK_ATTN_DKV: at head size 128 on Turing dq does not fit) */
int glmk_flash_fwd(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                   const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                   int smem_max, cudaStream_t st);
int glmk_flash_bwd(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout,
                   const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                   const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                   int smem_max, cudaStream_t st);
/* The same two operations on wgmma and the bulk tensor copy engine (k_flash90.cu, sm_90a) for
 * compute capability 9.0 devices, where glmk_flash_supported holds; glmk_flash90_available says
 * whether the build carries them and the device runs them. They return 0, having done nothing,
 * for views the copy engine cannot describe (the caller then takes glmk_flash_*). */
int glmk_flash90_available(int device);
int glmk_flash90_fwd(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                      const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                      int sms, cudaStream_t st); /* sms: the device's multiprocessors (its grid is one block each) */
/* the backward sums dq in fp32 over key blocks: scratch holds glmk_flash90_bwd_scratch bytes */
size_t glmk_flash90_bwd_scratch(int B, int Tq, int NH, int HD);
int glmk_flash90_bwd(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, float *scratch, const void *dout,
                     const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                     const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                     cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
