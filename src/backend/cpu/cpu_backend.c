/* The CPU backend: fp32 storage, OpenMP threads. It is the oracle every other backend is
 * tested against, so it favours clarity and determinism (no result depends on the number of
 * threads) over the last bit of speed; GEMMs are cache-blocked (cpu_gemm.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/cpu_adam8.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "core/err.h"
#include "core/half.h"

static void *cpu_alloc(glm_backend *be, size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        GLM_FATAL("lower --per_device_train_batch_size or the sequence lengths; `glmtrain info` prints the memory plan",
                  "out of host memory allocating %zu bytes (%.2f GiB)", bytes, bytes / 1073741824.0);
    return p;
}
static void cpu_free(glm_backend *be, void *p) { free(p); }
static void cpu_zero(glm_backend *be, void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(glm_backend *be, void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_up_f32(glm_backend *be, void *dst, const float *src, size_t n) { memmove(dst, src, n * 4); }
static void cpu_up_cast(glm_backend *be, void *dst, const void *src, glm_dtype sdt, size_t n) {
    if (sdt == GLM_F32) { memmove(dst, src, n * 4); return; }
    float *d = dst;
    const uint16_t *h = src;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) d[i] = sdt == GLM_BF16 ? glm_bf16_to_f32(h[i]) : glm_f16_to_f32(h[i]);
}
static void cpu_down_f32(glm_backend *be, float *dst, const void *src, size_t n) { memmove(dst, src, n * 4); }
static void cpu_raw(glm_backend *be, void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_sync(glm_backend *be) {}
static void cpu_destroy(glm_backend *be) { free(be); }

static void mm_fwd(glm_backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC) {
    cpu_matmul_fwd(out, inp, w, bias, N, C, OC);
}
static void mm_bwd(glm_backend *be, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                   const void *w, int N, int C, int OC, int acc) {
    cpu_matmul_bwd(dinp, dw, dbias, dout, inp, w, N, C, OC, acc);
}
static void emb_fwd(glm_backend *be, void *out, const int32_t *ids, const void *wte, int N, int H) { cpu_embedding_fwd(out, ids, wte, N, H); }
static void emb_bwd(glm_backend *be, void *dwte, const void *dout, const int32_t *ids, int N, int H, int V) { cpu_embedding_bwd(dwte, dout, ids, N, H, V); }
static void ln_fwd(glm_backend *be, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b, int N, int C, float eps) {
    cpu_layernorm_fwd(out, mean, rstd, x, w, b, N, C, eps);
}
static void ln_bwd(glm_backend *be, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                   const float *mean, const float *rstd, int N, int C) {
    cpu_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, N, C);
}
static void rope(glm_backend *be, void *qkv, const int32_t *pos, const int32_t *bpos, int N, int NH, int HD, int inv) {
    cpu_rope(qkv, pos, bpos, N, NH, HD, inv);
}
static void attn_fwd(glm_backend *be, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                     const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
    cpu_attention_fwd(out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale);
}
static void attn_bwd(glm_backend *be, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout, const void *out,
                     const float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *lo, const int32_t *hi,
                     int B, int Tq, int Tk, int NH, int HD, float scale) {
    cpu_attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale);
}
static void rms_fwd(glm_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps) {
    cpu_rmsnorm_fwd(out, rstd, x, w, N, C, eps);
}
static void rms_bwd(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w, const float *rstd,
                    int N, int C) {
    cpu_rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C);
}
static void sw_fwd(glm_backend *be, void *out, const void *x, int N, int F) { cpu_swiglu_fwd(out, x, N, F); }
static void sw_bwd(glm_backend *be, void *dx, const void *x, const void *dout, int N, int F) { cpu_swiglu_bwd(dx, x, dout, N, F); }
static void rope2(glm_backend *be, void *x, long rs, int N, int nh, int HD, int rot, const int32_t *pos, float theta, int inv) {
    cpu_rope_pairs(x, rs, N, nh, HD, rot, pos, theta, inv);
}
static void cpu_copy_rows(glm_backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t w, size_t rows) {
    for (size_t r = 0; r < rows; r++) memcpy((float *)dst + r * ds, (const float *)src + r * ss, w * sizeof(float));
}
static void g_fwd(glm_backend *be, void *out, const void *x, size_t n) { cpu_gelu_fwd(out, x, n); }
static void g_bwd(glm_backend *be, void *dx, const void *x, const void *dout, size_t n) { cpu_gelu_bwd(dx, x, dout, n); }
static void amax(glm_backend *be, int32_t *out, const void *x, int R, int V) { cpu_argmax_rows(out, x, R, V); }
static void sc_add(glm_backend *be, void *out, float alpha, const void *x, const void *y, size_t n) { cpu_scale_add(out, alpha, x, y, n); }
static void sc_rows(glm_backend *be, void *x, const float *s, int R, int C) { cpu_scale_rows(x, s, R, C); }
static void msk(glm_backend *be, void *out, const void *x, size_t n, float scale, float p, uint64_t seed) {
    cpu_mask_scale(out, x, n, scale, p, seed);
}
static void noise(glm_backend *be, void *x, size_t n, float mag, uint64_t seed) { cpu_noise_add(x, n, mag, seed); }
static void pkv_fwd(glm_backend *be, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int T, int P,
                    int NH, int HD, float p, uint64_t seed) {
    cpu_prefix_kv(kv, qkv, pkv, layer, L, B, T, P, NH, HD, p, seed);
}
static void pkv_bwd(glm_backend *be, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B, int T, int P,
                    int NH, int HD, float p, uint64_t seed) {
    cpu_prefix_kv_bwd(dqkv, dpkv, dkv, layer, L, B, T, P, NH, HD, p, seed);
}
static void d_norm(glm_backend *be, float *n, const void *w, const void *a, const void *b, float s, int OC, int C, int r) {
    cpu_dora_norm(n, w, a, b, s, OC, C, r);
}
static void d_scale(glm_backend *be, void *out, const void *z, const void *mag, const float *n, float shift, const void *bias,
                    const void *res, float rs, int N, int OC) {
    cpu_dora_scale(out, z, mag, n, shift, bias, res, rs, N, OC);
}
static void d_bwd(glm_backend *be, void *dz, void *dmag, const void *dout, const void *z, const void *mag, const float *n,
                  float shift, int N, int OC) {
    cpu_dora_bwd(dz, dmag, dout, z, mag, n, shift, N, OC);
}
static void th_fwd(glm_backend *be, void *out, const void *x, size_t n) { cpu_tanh_fwd(out, x, n); }
static void th_bwd(glm_backend *be, void *dx, const void *out, const void *dout, size_t n) { cpu_tanh_bwd(dx, out, dout, n); }
static void deq(glm_backend *be, void *w, const void *q, int t, int OC, int C) { cpu_dequantize(w, q, t, OC, C); }
static void qmm(glm_backend *be, void *out, const void *inp, const void *q, int t, const void *bias, int N, int C, int OC) {
    cpu_qmatmul_fwd(out, inp, q, t, bias, N, C, OC);
}
static void ce(glm_backend *be, void *logits, float *losses, const int32_t *t, int R, int V, float dscale,
               const float *row_scale) {
    cpu_cross_entropy(logits, losses, t, R, V, dscale, row_scale);
}
static void gather(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) { cpu_gather_rows(out, x, idx, R, C); }
static void scatter(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) { cpu_scatter_rows(out, x, idx, R, C); }
static double ssq(glm_backend *be, const void *x, size_t n) { return cpu_sumsq(x, n); }
static double ssq_spans(glm_backend *be, const void *x, const glm_span *s, int k) {
    double r = 0;
    for (int i = 0; i < k; i++) r += cpu_sumsq((const float *)x + s[i].lo, s[i].n);
    return r;
}
static double add_ssq_spans(glm_backend *be, void *x, const void *y, const size_t *yoff, const glm_span *s, int k) {
    double r = 0;
    for (int i = 0; i < k; i++) {
        float *p = (float *)x + s[i].lo;
        const float *q = (const float *)y + yoff[i];
        for (size_t j = 0; j < s[i].n; j++) p[j] += q[j];
        r += cpu_sumsq(p, s[i].n);
    }
    return r;
}
static void adamw(glm_backend *be, void *param, float *master, const void *grad, float *m, float *v, size_t n, float lr,
                  float b1, float b2, float eps, float wd, float bc1, float bc2, float gs) {
    cpu_adamw(param, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gs);
}
static void adam_dir(glm_backend *be, float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2,
                     float eps) {
    cpu_adam_dir(dir, g, m, v, n, b1, b2, eps);
}
static void apply_dir(glm_backend *be, void *param, float *master, const float *dir, size_t n, float alpha, float shrink) {
    cpu_apply_dir(master ? master : param, dir, n, alpha, shrink);
    if (master) memcpy(param, master, n * sizeof(float));
}
static void adamw8(glm_backend *be, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv, float *absm,
                   float *absv, size_t n, const uint8_t *bits, size_t flat0, float lr, float b1, float b2, float eps,
                   float wd, float bc1, float bc2, float gs) {
    cpu_adamw8(param, master, grad, qm, qv, absm, absv, n, bits, flat0, lr, b1, b2, eps, wd, bc1, bc2, gs);
}

static void gram_f64(glm_backend *be, double *G, const float *x, const float *y, int n, int q, int k) {
    cpu_gram_f64(G, x, y, n, q, k);
}
static void mul_small_f64(glm_backend *be, float *y, const float *x, const double *M, int n, int q, int k) {
    cpu_mul_small_f64(y, x, M, n, q, k);
}
static int orth_f64(glm_backend *be, float *x, int n, int q) {
    (void)be;
    return cpu_orth_f64(x, n, q);
}
static void sgemm(glm_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
    (void)be;
    cpu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

glm_backend *glm_backend_cpu(void) {
    glm_backend *be = glm_calloc(1, sizeof *be);
    *be = (glm_backend){
        .name = "cpu", .device = -1, .dtype = GLM_F32,
        .alloc = cpu_alloc, .free = cpu_free, .zero = cpu_zero, .copy = cpu_copy, .copy_rows = cpu_copy_rows,
        .upload_f32 = cpu_up_f32, .download_f32 = cpu_down_f32, .upload_cast = cpu_up_cast, .upload = cpu_raw, .download = cpu_raw,
        .sync = cpu_sync,
        .embedding_fwd = emb_fwd, .embedding_bwd = emb_bwd, .layernorm_fwd = ln_fwd, .layernorm_bwd = ln_bwd,
        .matmul_fwd = mm_fwd, .matmul_bwd = mm_bwd, .rope = rope, .attention_fwd = attn_fwd,
        .attention_bwd = attn_bwd, .gelu_fwd = g_fwd, .gelu_bwd = g_bwd, .scale_add = sc_add, .mask_scale = msk, .noise_add = noise,
        .cross_entropy = ce, .argmax_rows = amax, .scale_rows = sc_rows, .gather_rows = gather, .scatter_rows = scatter, .sumsq = ssq, .sumsq_spans = ssq_spans, .add_sumsq_spans = add_ssq_spans, .adamw = adamw, .adamw8 = adamw8, .adam_dir = adam_dir, .apply_dir = apply_dir,
        .prefix_kv = pkv_fwd, .prefix_kv_bwd = pkv_bwd, .tanh_fwd = th_fwd, .tanh_bwd = th_bwd,
        .dora_norm = d_norm, .dora_scale = d_scale, .dora_bwd = d_bwd,
        .dequantize = deq, .qmatmul_fwd = qmm,
        .rmsnorm_fwd = rms_fwd, .rmsnorm_bwd = rms_bwd, .swiglu_fwd = sw_fwd, .swiglu_bwd = sw_bwd, .rope_pairs = rope2,
        .sgemm = sgemm, .gram_f64 = gram_f64, .mul_small_f64 = mul_small_f64, .orth_f64 = orth_f64,
        .destroy = cpu_destroy,
    };
    return be;
}
