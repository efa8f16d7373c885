/* CPU fp32 kernels: the reference semantics of every op in backend/backend.h (see there for
 * shapes and meaning). Exposed directly so the CUDA tests can call the CPU twin of each op. */
#ifndef GLM_CPU_OPS_H
#define GLM_CPU_OPS_H
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

void cpu_embedding_fwd(float *out, const int32_t *ids, const float *wte, int N, int H);
void cpu_embedding_bwd(float *dwte, const float *dout, const int32_t *ids, int N, int H, int V);
void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       int N, int C, float eps);
void cpu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int N, int C);
void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC);
void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                    int N, int C, int OC, int accumulate_dinp);
/* fp16-rounded inverse frequency w_j of the 2D rotary (R = rotary dim of one half = HD/2) */
float cpu_rope_inv_freq(int j, int R);
void cpu_rope(float *qkv, const int32_t *pos, const int32_t *block_pos, int N, int NH, int HD, int inverse);
void cpu_attention_fwd(float *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                       const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale);
void cpu_attention_bwd(glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const float *dout, const float *out,
                       const float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *kv_lo,
                       const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale);
/* backend.h rmsnorm_fwd/bwd, swiglu_fwd/bwd, rope_pairs (the ChatGLM2 family) */
void cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N,
                     int C);
void cpu_swiglu_fwd(float *out, const float *x, int N, int F);
void cpu_swiglu_bwd(float *dx, const float *x, const float *dout, int N, int F);
/* w_i of rope_pairs */
float cpu_rope_pair_freq(int i, int rot, float theta);
void cpu_rope_pairs(float *x, long row_stride, int N, int nheads, int HD, int rot, const int32_t *pos, float theta,
                    int inverse);
void cpu_gelu_fwd(float *out, const float *x, size_t n);
void cpu_gelu_bwd(float *dx, const float *x, const float *dout, size_t n);
void cpu_scale_add(float *out, float alpha, const float *x, const float *y, size_t n);
void cpu_scale_rows(float *x, const float *s, int R, int C); /* x[r, :] *= s[r] */
/* backend.h mask_scale */
void cpu_mask_scale(float *out, const float *x, size_t n, float scale, float p, uint64_t seed);
/* backend.h noise_add */
void cpu_noise_add(float *x, size_t n, float mag, uint64_t seed);
/* backend.h prefix_kv, prefix_kv_bwd, tanh_fwd, tanh_bwd (P-Tuning v2) */
void cpu_prefix_kv(float *kv, const float *qkv, const float *pkv, int layer, int L, int B, int T, int P, int NH,
                   int HD, float p, uint64_t seed);
void cpu_prefix_kv_bwd(float *dqkv, float *dpkv, const float *dkv, int layer, int L, int B, int T, int P, int NH,
                       int HD, float p, uint64_t seed);
void cpu_tanh_fwd(float *out, const float *x, size_t n);
void cpu_tanh_bwd(float *dx, const float *out, const float *dout, size_t n);
/* backend.h dequantize and qmatmul_fwd (backend/quant.h's layouts) */
void cpu_dequantize(float *w, const void *q, int qtype, int OC, int C);
void cpu_qmatmul_fwd(float *out, const float *inp, const void *q, int qtype, const float *bias, int N, int C, int OC);
void cpu_cross_entropy(float *logits, float *losses, const int32_t *targets, int R, int V, float dscale,
                       const float *row_scale);
void cpu_gather_rows(float *out, const float *x, const int32_t *idx, int R, int C);
void cpu_scatter_rows(float *out, const float *x, const int32_t *idx, int R, int C);
double cpu_sumsq(const float *x, size_t n);
void cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float b1, float b2,
               float eps, float wd, float bc1, float bc2, float grad_scale);
/* backend.h adam_dir and apply_dir (p: the fp32 weights) */
void cpu_adam_dir(float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps);
void cpu_apply_dir(float *p, const float *dir, size_t n, float alpha, float shrink);
/* backend.h gram_f64 and mul_small_f64 (cpu_small.c) */
void cpu_gram_f64(double *G, const float *x, const float *y, int n, int q, int k);
void cpu_mul_small_f64(float *y, const float *x, const double *M, int n, int q, int k);
/* G [q, q] = R^T R (Cholesky, R upper triangular in G's upper part, in place) and Ri = R^-1; -1
 * when a pivot is not clearly positive (below 1e-13 of G's largest diagonal entry). */
int cpu_cholinv_f64(double *G, double *Ri, int q);
/* backend.h orth_f64 on the host: Cholesky QR twice over x [n, q] in place. */
int cpu_orth_f64(float *x, int n, int q);
/* greedy choice per row (backend.h argmax_rows) */
void cpu_argmax_rows(int32_t *out, const float *x, int R, int V);

/* DoRA's row norms, row scale and its backward (backend.h dora_norm, dora_scale, dora_bwd): cpu_dora.c */
void cpu_dora_norm(float *n, const float *w, const float *a, const float *b, float scale, int OC, int C, int r);
void cpu_dora_scale(float *out, const float *z, const float *mag, const float *n, float shift, const float *bias,
                    const float *res, float res_scale, int N, int OC);
void cpu_dora_bwd(float *dz, float *dmag, const float *dout, const float *z, const float *mag, const float *n, float shift,
                  int N, int OC);

#endif
