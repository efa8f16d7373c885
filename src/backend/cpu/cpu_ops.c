#include "backend/cpu/cpu_ops.h"
#include "backend/quant.h"
#include "core/err.h"
#include "backend/mask_hash.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "core/err.h"
#include "core/half.h"

void cpu_embedding_fwd(float *out, const int32_t *ids, const float *wte, int N, int H) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * H, wte + (size_t)ids[n] * H, sizeof(float) * H);
}

/* Threads split the columns, every thread walks the tokens in order: deterministic sums. */
void cpu_embedding_bwd(float *dwte, const float *dout, const int32_t *ids, int N, int H, int V) {
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int c0 = (int)((long)H * t / nt), c1 = (int)((long)H * (t + 1) / nt);
        for (int n = 0; n < N; n++) {
            float *d = dwte + (size_t)ids[n] * H;
            const float *g = dout + (size_t)n * H;
            for (int c = c0; c < c1; c++) d[c] += g[c];
        }
    }
}

void cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double s = 0, ss = 0;
        for (int c = 0; c < C; c++) s += xr[c];
        float m = (float)(s / C);
        for (int c = 0; c < C; c++) { float d = xr[c] - m; ss += (double)d * d; }
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * r * w[c] + b[c];
        mean[n] = m;
        rstd[n] = r;
    }
}

void cpu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double sg = 0, sgx = 0;  /* sums of dxhat and dxhat*xhat */
        for (int c = 0; c < C; c++) {
            float xh = (xr[c] - m) * r, dxh = g[c] * w[c];
            sg += dxh;
            sgx += (double)dxh * xh;
        }
        float a = (float)(sg / C), bb = (float)(sgx / C);
        float *d = dx + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float xh = (xr[c] - m) * r;
            d[c] = r * (g[c] * w[c] - a - xh * bb);
        }
    }
    if (!dw) return; /* a frozen LayerNorm */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float sw = 0, sb = 0;
        for (int n = 0; n < N; n++) {
            float g = dout[(size_t)n * C + c];
            sw += g * (x[(size_t)n * C + c] - mean[n]) * rstd[n];
            sb += g;
        }
        dw[c] += sw;
        db[c] += sb;
    }
}

void cpu_matmul_fwd(float *out, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    cpu_sgemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
    }
}

void cpu_matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                    int N, int C, int OC, int accumulate_dinp) {
    if (dinp) cpu_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
    if (dw) cpu_sgemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            float s = 0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            dbias[o] += s;
        }
    }
}

float cpu_rope_inv_freq(int j, int R) {
    /* inv_freq = 1 / 10000^(2j/R) in fp32, then .half() as the original RotaryEmbedding does */
    float f = 1.0f / powf(10000.0f, (float)(2 * j) / (float)R);
    return glm_f16_to_f32(glm_f32_to_f16(f));
}

/* Rotates one half (R dims) of a head vector: pairs (j, j + R/2), angle p * w_j. */
static void rotate_half(float *x, int R, int p, const float *inv_freq, int inverse) {
    int h = R / 2;
    for (int j = 0; j < h; j++) {
        float th = (float)p * inv_freq[j];
        float c = cosf(th), s = inverse ? -sinf(th) : sinf(th);
        float a = x[j], b = x[j + h];
        x[j] = a * c - b * s;
        x[j + h] = b * c + a * s;
    }
}

void cpu_rope(float *qkv, const int32_t *pos, const int32_t *block_pos, int N, int NH, int HD, int inverse) {
    int R = HD / 2;
    float inv_freq[1024];
    GLM_ASSERT(R / 2 <= 1024);
    for (int j = 0; j < R / 2; j++) inv_freq[j] = cpu_rope_inv_freq(j, R);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NH; h++)
            for (int part = 0; part < 2; part++) { /* q then k; v is not rotated */
                float *x = qkv + (size_t)n * NH * 3 * HD + (size_t)h * 3 * HD + part * HD;
                rotate_half(x, R, pos[n], inv_freq, inverse);
                rotate_half(x + R, R, block_pos[n], inv_freq, inverse);
            }
}

static inline float *view_at(glm_qkv_view v, int b, int t, int h) {
    return (float *)v.base + b * v.batch_stride + t * v.tok_stride + (h / glm_view_group(v)) * v.head_stride;
}

/* Dot product in a fixed order (8 interleaved partial sums, then pairwise), so the compiler can
 * vectorize it (a plain running sum may not be reordered) and the result is the same on every
 * run and thread count. */
static inline float dot(const float *restrict a, const float *restrict b, int n) {
    float acc[8] = {0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[d + k] * b[d + k];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; d < n; d++) s += a[d] * b[d];
    return s;
}

/* y[d] += a * x[d] */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int d = 0; d < n; d++) y[d] += a * x[d];
}

void cpu_attention_fwd(float *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                       const int32_t *kv_lo, const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
#pragma omp parallel
    {
        float *p = glm_malloc(sizeof(float) * (Tk > 0 ? Tk : 1));
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < Tq; i++) {
                    int lo = kv_lo[b * Tq + i], hi = kv_hi[b * Tq + i];
                    const float *qi = view_at(q, b, i, h);
                    float mx = -INFINITY;
                    for (int j = lo; j < hi; j++) {
                        p[j] = dot(qi, view_at(k, b, j, h), HD) * scale;
                        if (p[j] > mx) mx = p[j];
                    }
                    float sum = 0;
                    for (int j = lo; j < hi; j++) { p[j] = expf(p[j] - mx); sum += p[j]; }
                    float *o = out + ((size_t)b * Tq + i) * NH * HD + (size_t)h * HD;
                    memset(o, 0, sizeof(float) * HD);
                    float inv = sum > 0 ? 1.0f / sum : 0.0f;
                    for (int j = lo; j < hi; j++) axpy(o, p[j] * inv, view_at(v, b, j, h), HD);
                    lse[((size_t)b * NH + h) * Tq + i] = hi > lo ? mx + logf(sum) : -INFINITY;
                }
        free(p);
    }
}

void cpu_attention_bwd(glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const float *dout, const float *out,
                       const float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *kv_lo,
                       const int32_t *kv_hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
    /* One (b, key/value head) per thread: dk/dv sums over the group's query heads and over
     * queries stay in one thread, in head then query order. */
    int g = glm_view_group(k), NKV = NH / g;
    GLM_ASSERT(NKV * g == NH && glm_view_group(v) == g && glm_view_group(dk) == g && glm_view_group(dv) == g);
#pragma omp parallel for schedule(static) collapse(2)
    for (int b = 0; b < B; b++)
        for (int hk = 0; hk < NKV; hk++) {
            for (int j = 0; j < Tk; j++) {
                memset(view_at(dk, b, j, hk * g), 0, sizeof(float) * HD);
                memset(view_at(dv, b, j, hk * g), 0, sizeof(float) * HD);
            }
            for (int h = hk * g; h < hk * g + g; h++) {
                for (int i = 0; i < Tq; i++) memset(view_at(dq, b, i, h), 0, sizeof(float) * HD);
                for (int i = 0; i < Tq; i++) {
                    int lo = kv_lo[b * Tq + i], hi = kv_hi[b * Tq + i];
                    const float *qi = view_at(q, b, i, h);
                    const float *doi = dout + ((size_t)b * Tq + i) * NH * HD + (size_t)h * HD;
                    const float *oi = out + ((size_t)b * Tq + i) * NH * HD + (size_t)h * HD;
                    float *dqi = view_at(dq, b, i, h);
                    float L = lse[((size_t)b * NH + h) * Tq + i], D = dot(doi, oi, HD);
                    for (int j = lo; j < hi; j++) {
                        const float *kj = view_at(k, b, j, h), *vj = view_at(v, b, j, h);
                        float pij = expf(dot(qi, kj, HD) * scale - L);
                        float ds = pij * (dot(doi, vj, HD) - D) * scale;
                        axpy(view_at(dv, b, j, h), pij, doi, HD);
                        axpy(dqi, ds, kj, HD);
                        axpy(view_at(dk, b, j, h), ds, qi, HD);
                    }
                }
            }
        }
}

/* ---- the ChatGLM2 family's ops ---- */

void cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        for (int c = 0; c < C; c++) o[c] = w[c] * (xr[c] * r);
        rstd[n] = r;
    }
}

void cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N,
                     int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
        float r = rstd[n];
        double sgx = 0; /* sum of dxhat * xhat */
        for (int c = 0; c < C; c++) sgx += (double)(g[c] * w[c]) * (xr[c] * r);
        float bb = (float)(sgx / C);
        float *d = dx + (size_t)n * C;
        for (int c = 0; c < C; c++) d[c] = r * (g[c] * w[c] - xr[c] * r * bb);
    }
    if (!dw) return;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float sw = 0;
        for (int n = 0; n < N; n++) sw += dout[(size_t)n * C + c] * (x[(size_t)n * C + c] * rstd[n]);
        dw[c] += sw;
    }
}

void cpu_swiglu_fwd(float *out, const float *x, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            float g = x[(size_t)n * 2 * F + f], u = x[(size_t)n * 2 * F + F + f];
            out[(size_t)n * F + f] = g / (1.0f + expf(-g)) * u;
        }
}

void cpu_swiglu_bwd(float *dx, const float *x, const float *dout, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int f = 0; f < F; f++) {
            float g = x[(size_t)n * 2 * F + f], u = x[(size_t)n * 2 * F + F + f], d = dout[(size_t)n * F + f];
            float s = 1.0f / (1.0f + expf(-g));
            dx[(size_t)n * 2 * F + f] = d * u * s * (1.0f + g * (1.0f - s));
            dx[(size_t)n * 2 * F + F + f] = d * g * s;
        }
}

float cpu_rope_pair_freq(int i, int rot, float theta) {
    /* as ChatGLM2's RotaryEmbedding: 1 / theta ** (arange(0, rot, 2) / rot) in fp32 */
    return 1.0f / powf(theta, (float)(2 * i) / (float)rot);
}

void cpu_rope_pairs(float *x, long row_stride, int N, int nheads, int HD, int rot, const int32_t *pos, float theta,
                    int inverse) {
    float w[512];
    GLM_ASSERT(rot / 2 <= 512 && rot <= HD && rot % 2 == 0);
    for (int i = 0; i < rot / 2; i++) w[i] = cpu_rope_pair_freq(i, rot, theta);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nheads; h++) {
            float *v = x + (size_t)n * row_stride + (size_t)h * HD;
            for (int i = 0; i < rot / 2; i++) {
                float th = (float)pos[n] * w[i];
                float c = cosf(th), s = inverse ? -sinf(th) : sinf(th);
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = b * c + a * s;
            }
        }
}

/* e^x for x in [-87, 88] (clamped): x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts), e^r by
 * its Taylor polynomial to r^7, 2^n from the exponent bits. About 1 ulp. */
static inline float exp_arith(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = ((((((1.98412698e-4f * r + 1.38888889e-3f) * r + 8.33333333e-3f) * r + 4.16666667e-2f) * r +
                 1.66666667e-1f) * r + 0.5f) * r + 1.0f) * r + 1.0f;
    union { int32_t i; float f; } s = {.i = ((int32_t)n + 127) << 23};
    return p * s.f;
}

/* tanh from plain arithmetic, so GELU's loops vectorize (libm's tanhf was 13% of the CPU step):
 * the odd Taylor series below 0.3, 1 - 2/(e^2|x| + 1) above; 2.6e-7 max relative error, and
 * GELU and its derivative as close to double precision as with libm (tests/c/test_model_oracle.c). */
static inline float tanh_arith(float x) {
    float a = fabsf(x), a2 = a * a;
    float small = a * (1.0f + a2 * (-0.333333333f + a2 * (0.133333333f + a2 * (-0.0539682540f + a2 * (0.0218694885f +
                                                                                                      a2 * -0.00886323552f)))));
    float big = 1.0f - 2.0f / (exp_arith(2.0f * (a < 9.5f ? a : 9.5f)) + 1.0f);
    return copysignf(a < 0.3f ? small : big, x);
}

#define GELU_C 0.7978845608028654f
void cpu_gelu_fwd(float *out, const float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = x[i];
        out[i] = 0.5f * a * (1.0f + tanh_arith(GELU_C * a * (1.0f + 0.044715f * a * a)));
    }
}

void cpu_gelu_bwd(float *dx, const float *x, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = x[i];
        float u = GELU_C * a * (1.0f + 0.044715f * a * a);
        float t = tanh_arith(u);
        float du = GELU_C * (1.0f + 3.0f * 0.044715f * a * a);
        float g = 0.5f * (1.0f + t) + 0.5f * a * (1.0f - t * t) * du;
        dx[i] = dout[i] * g;
    }
}

void cpu_scale_add(float *out, float alpha, const float *x, const float *y, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = alpha * x[i] + y[i];
}

void cpu_scale_rows(float *x, const float *s, int R, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++) x[(size_t)r * C + j] *= s[r];
}

void cpu_cross_entropy(float *logits, float *losses, const int32_t *targets, int R, int V, float dscale,
                       const float *row_scale) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        float *l = logits + (size_t)r * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) if (l[j] > mx) mx = l[j];
        double sum = 0;
        for (int j = 0; j < V; j++) sum += exp((double)l[j] - mx);
        float lse = mx + (float)log(sum);
        losses[r] = lse - l[targets[r]];
        if (dscale != 0.0f) {
            float ds = row_scale ? dscale * row_scale[r] : dscale;
            for (int j = 0; j < V; j++) l[j] = ds * expf(l[j] - lse);
            l[targets[r]] -= ds;
        }
    }
}

void cpu_gather_rows(float *out, const float *x, const int32_t *idx, int R, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) memcpy(out + (size_t)r * C, x + (size_t)idx[r] * C, sizeof(float) * C);
}

void cpu_scatter_rows(float *out, const float *x, const int32_t *idx, int R, int C) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) memcpy(out + (size_t)idx[r] * C, x + (size_t)r * C, sizeof(float) * C);
}

/* Fixed chunks summed in order: the result does not depend on the thread count. */
double cpu_sumsq(const float *x, size_t n) {
    enum { CH = 1 << 16 };
    size_t nch = (n + CH - 1) / CH;
    double *part = glm_calloc(nch ? nch : 1, sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nch; c++) {
        double s = 0;
        size_t e = (c + 1) * CH < n ? (c + 1) * CH : n;
        for (size_t i = c * CH; i < e; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double s = 0;
    for (size_t c = 0; c < nch; c++) s += part[c];
    free(part);
    return s;
}

void cpu_adamw(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1, float b2,
               float eps, float wd, float bc1, float bc2, float grad_scale) {
    /* the order of operations follows torch.optim.AdamW (single-tensor path) */
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), decay = 1.0f - lr * wd;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        p[i] *= decay;
        m[i] = m[i] * b1 + (1.0f - b1) * g;  /* lerp form: m + (1-b1)(g-m) differs in the last bit */
        v[i] = v[i] * b2 + (1.0f - b2) * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * m[i] / denom;
    }
}

void cpu_adam_dir(float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2, float eps) {
    /* galore_torch's AdamW: exp_avg.mul_(b1).add_(g, 1-b1); exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2);
     * exp_avg / (exp_avg_sq.sqrt() + eps) */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        m[i] = m[i] * b1 + (1.0f - b1) * gi;
        v[i] = v[i] * b2 + (1.0f - b2) * gi * gi;
        dir[i] = m[i] / (sqrtf(v[i]) + eps);
    }
}

void cpu_apply_dir(float *p, const float *dir, size_t n, float alpha, float shrink) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float w = p[i] + alpha * dir[i];
        p[i] = w + shrink * w;
    }
}

void cpu_mask_scale(float *out, const float *x, size_t n, float scale, float p, uint64_t seed) {
    uint32_t th = glm_mask_threshold(p);
    float keep = p > 0 ? scale / (1.0f - p) : scale;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = p > 0 && !glm_mask_keep(seed, i, th) ? 0.0f : x[i] * keep;
}

void cpu_noise_add(float *x, size_t n, float mag, uint64_t seed) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = fmaf(mag, glm_uniform_pm1(seed, i), x[i]);
}

/* ---- P-Tuning v2: prefix keys/values (backend.h prefix_kv, prefix_kv_bwd) ---- */

/* kv row r = (b, j) of [B, P+T, NH, 2, HD]; element e = (h, s, d) within the row's 2H. */
void cpu_prefix_kv(float *kv, const float *qkv, const float *pkv, int layer, int L, int B, int T, int P, int NH,
                   int HD, float p, uint64_t seed) {
    const size_t H = (size_t)NH * HD, row = 2 * H, pstride = 2 * (size_t)L * H;
    const int PT = P + T;
    const uint32_t th = glm_mask_threshold(p);
    const float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)B * PT; r++) {
        int b = (int)(r / PT), j = (int)(r % PT);
        float *o = kv + (size_t)r * row;
        for (int h = 0; h < NH; h++)
            for (int s = 0; s < 2; s++) {
                float *od = o + ((size_t)h * 2 + s) * HD;
                if (j < P) {
                    const float *src = pkv + (size_t)j * pstride + ((size_t)(2 * layer + s) * NH + h) * HD;
                    size_t i0 = (size_t)r * row + ((size_t)h * 2 + s) * HD;
                    for (int d = 0; d < HD; d++)
                        od[d] = p > 0 && !glm_mask_keep(seed, i0 + d, th) ? 0.0f : src[d] * ks;
                } else {
                    const float *src = qkv + ((size_t)b * T + (j - P)) * 3 * H + ((size_t)h * 3 + 1 + s) * HD;
                    memcpy(od, src, sizeof(float) * HD);
                }
            }
    }
}

/* Sequence rows copied back into dqkv's k|v slots; each prefix element of dpkv summed over b in
 * order (one thread owns it): deterministic whatever the thread count. */
void cpu_prefix_kv_bwd(float *dqkv, float *dpkv, const float *dkv, int layer, int L, int B, int T, int P, int NH,
                       int HD, float p, uint64_t seed) {
    const size_t H = (size_t)NH * HD, row = 2 * H, pstride = 2 * (size_t)L * H;
    const int PT = P + T;
    const uint32_t th = glm_mask_threshold(p);
    const float ks = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < (long)B * T; r++) {
        int b = (int)(r / T), t = (int)(r % T);
        const float *g = dkv + ((size_t)b * PT + P + t) * row;
        float *o = dqkv + (size_t)r * 3 * H;
        for (int h = 0; h < NH; h++)
            memcpy(o + ((size_t)h * 3 + 1) * HD, g + (size_t)h * 2 * HD, sizeof(float) * 2 * HD);
    }
#pragma omp parallel for schedule(static)
    for (long je = 0; je < (long)P * (long)row; je++) {
        int j = (int)(je / (long)row);
        size_t e = (size_t)(je % (long)row), h = e / (2 * (size_t)HD), s = (e / HD) & 1, d = e % HD;
        float acc = 0.0f;
        for (int b = 0; b < B; b++) {
            size_t i = ((size_t)b * PT + j) * row + e;
            acc += p > 0 && !glm_mask_keep(seed, i, th) ? 0.0f : dkv[i] * ks;
        }
        dpkv[(size_t)j * pstride + ((size_t)(2 * layer) + s) * H + h * HD + d] += acc;
    }
}

/* libm tanhf (not tanh_arith): NaN propagates, as on CUDA */
void cpu_tanh_fwd(float *out, const float *x, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = tanhf(x[i]);
}

void cpu_tanh_bwd(float *dx, const float *out, const float *dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float o = out[i];
        dx[i] = dout[i] * (1.0f - o * o);
    }
}

/* ---- quantized weights ---- */

void cpu_dequantize(float *w, const void *q, int qtype, int OC, int C) {
    glm_dequantize((glm_qtype)qtype, w, q, (size_t)OC, (size_t)C);
}

/* Rows of the weight are dequantized a slice at a time, so the float copy stays small. */
void cpu_qmatmul_fwd(float *out, const float *inp, const void *q, int qtype, const float *bias, int N, int C, int OC) {
    enum { SLICE = 64 };
    float *w = glm_malloc((size_t)SLICE * (size_t)C * sizeof(float));
    for (int r0 = 0; r0 < OC; r0 += SLICE) {
        int r1 = r0 + SLICE < OC ? r0 + SLICE : OC;
        glm_dequantize_rows((glm_qtype)qtype, w, q, (size_t)OC, (size_t)C, (size_t)r0, (size_t)r1);
#pragma omp parallel for collapse(2) schedule(static)
        for (int n = 0; n < N; n++)
            for (int o = r0; o < r1; o++) {
                const float *x = inp + (size_t)n * C, *wr = w + (size_t)(o - r0) * C;
                float s = 0;
                for (int j = 0; j < C; j++) s += x[j] * wr[j];
                out[(size_t)n * OC + o] = s + (bias ? bias[o] : 0.0f);
            }
    }
    free(w);
}

void cpu_argmax_rows(int32_t *out, const float *x, int R, int V) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * V;
        int best = 0, bad = 0;
        for (int j = 0; j < V; j++) {
            if (!isfinite(row[j])) { bad = 1; break; }
            if (row[j] > row[best]) best = j;
        }
        out[r] = bad ? (V > 5 ? 5 : 0) : best;
    }
}
