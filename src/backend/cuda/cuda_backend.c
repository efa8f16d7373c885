/* The CUDA backend: storage dtype bf16, fp16 or fp32 (fp32 with TF32 off, so it matches the
 * CPU oracle to ~1e-5). GEMMs go through cuBLASLt (cuda_gemm.c), the rest through the kernels
 * of this folder (launchers in cuda_kernels.h). Every op is enqueued on one stream; only
 * downloads and sumsq wait for it. All state lives in be->impl (cuda_impl.h).
 * Compiled to nothing without GLM_HAVE_CUDA (the Makefile sets it when nvcc exists). */
#ifdef GLM_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_impl.h"
#include "core/err.h"
#include "backend/quant8.h"


/* ---------------------------------------------------------------- memory */

static void note_peak(cuda_impl *im) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > im->peak_used) im->peak_used = tot - fr;
}

void glm_cuda_memory(glm_backend *be, size_t *used_now, size_t *peak_used, size_t *total) {
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    note_peak(IM(be));
    if (used_now) *used_now = tot - fr;
    if (peak_used) *peak_used = IM(be)->peak_used;
    if (total) *total = tot;
}

void glm_cuda_memory_reset_peak(glm_backend *be) {
    IM(be)->peak_used = 0;
    note_peak(IM(be));
}

static void *cu_alloc(glm_backend *be, size_t bytes) {
    void *p = NULL;
    if (bytes < 256) bytes = 256;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky-free allocation error */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        GLM_FATAL("lower --per_device_train_batch_size (or the sequence lengths), add --gradient_checkpointing, "
                  "keep the optimizer state in host memory (--offload_optimizer cpu) or 8-bit (--optim adamw_8bit), "
                  "spread optimizer state and gradients over GPUs with data parallel + ZeRO (--nproc_per_node N "
                  "--zero_stage 1/2), or split the layers with --pipeline_parallel_size; under data parallel on one node "
                  "GLMTRAIN_DP_PEER=0 frees the gradient landing buffer; `glmtrain info` prints the memory plan",
                  "out of GPU memory on %s: asked for %zu bytes (%.2f GiB); %.2f GiB free of %.2f GiB (%s)",
                  be->name, bytes, bytes / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0, cudaGetErrorString(e));
    }
    note_peak(IM(be));
    return p;
}
static void cu_free(glm_backend *be, void *p) { if (p) CUDA_CHECK(cudaFree(p)); }
static void cu_zero(glm_backend *be, void *p, size_t bytes) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "zero");
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, IM(be)->st));
}
static void cu_copy(glm_backend *be, void *dst, const void *src, size_t bytes) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "copy");
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, IM(be)->st));
}
/* Pageable host source: cudaMemcpyAsync returns once the bytes are staged, so `src` may be
 * freed right after (upload_batch does). */
static void cu_upload(glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, IM(be)->st));
}
static void cu_download(glm_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, IM(be)->st));
    CUDA_CHECK(cudaStreamSynchronize(IM(be)->st));
}
static void cu_sync(glm_backend *be) { CUDA_CHECK(cudaStreamSynchronize(IM(be)->st)); }

static float *stage(glm_backend *be) {
    if (!IM(be)->stage) IM(be)->stage = cu_alloc(be, STAGE_ELEMS * sizeof(float));
    return IM(be)->stage;
}
/* The raw elements go up in the staging buffer's bytes and are converted there by the GPU
 * (the same rounding as upload_f32's), so the host does no per-element work. */
static void cu_up_cast(glm_backend *be, void *dst, const void *src, glm_dtype sdt, size_t n) {
    size_t es = glm_dtype_size(sdt);
    if (sdt == be->dtype) { cu_upload(be, dst, src, n * es); glm_cuda_op_done(be, "upload_cast"); return; }
    void *s = stage(be);
    size_t per = STAGE_ELEMS * sizeof(float) / es;
    for (size_t off = 0; off < n; off += per) {
        size_t c = n - off < per ? n - off : per;
        cu_upload(be, s, (const char *)src + off * es, c * es);
        glmk_convert(glm_at(be, dst, off), be->dtype, s, sdt, c, IM(be)->st);
    }
    glm_cuda_op_done(be, "upload_cast");
}
static void cu_up_f32(glm_backend *be, void *dst, const float *src, size_t n) { cu_up_cast(be, dst, src, GLM_F32, n); }
static void cu_down_f32(glm_backend *be, float *dst, const void *src, size_t n) {
    if (be->dtype == GLM_F32) { cu_download(be, dst, src, n * 4); return; }
    float *s = stage(be);
    for (size_t off = 0; off < n; off += STAGE_ELEMS) {
        size_t c = n - off < STAGE_ELEMS ? n - off : STAGE_ELEMS;
        glmk_convert(s, GLM_F32, glm_at(be, src, off), be->dtype, c, IM(be)->st);
        cu_download(be, dst + off, s, c * 4);
    }
}
static void cu_to_f32(glm_backend *be, float *dst, const void *src, size_t n) {
    glmk_convert(dst, GLM_F32, src, be->dtype, n, IM(be)->st);
    glm_cuda_op_done(be, "to_f32");
}

static void cu_from_f32(glm_backend *be, void *dst, const float *src, size_t n) {
    glmk_convert(dst, be->dtype, src, GLM_F32, n, IM(be)->st);
    glm_cuda_op_done(be, "from_f32");
}

/* ---------------------------------------------------------------- other ops */

static void cu_emb_fwd(glm_backend *be, void *out, const int32_t *ids, const void *wte, int N, int H) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "embedding_fwd");
    glmk_embedding_fwd(be->dtype, out, ids, wte, N, H, IM(be)->st);
    glm_cuda_op_done(be, "embedding_fwd");
}
static void cu_emb_bwd(glm_backend *be, void *dwte, const void *dout, const int32_t *ids, int N, int H, int V) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "embedding_bwd");
    glmk_embedding_bwd(be->dtype, dwte, dout, ids, N, H, IM(be)->st);
    glm_cuda_op_done(be, "embedding_bwd");
}
static void cu_ln_fwd(glm_backend *be, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b,
                      int N, int C, float eps) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "layernorm_fwd");
    glmk_layernorm_fwd(be->dtype, out, mean, rstd, x, w, b, N, C, eps, IM(be)->st);
    glm_cuda_op_done(be, "layernorm_fwd");
}
static void cu_ln_bwd(glm_backend *be, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                      const float *mean, const float *rstd, int N, int C) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "layernorm_bwd");
    float *s = glm_cuda_scratch(be, 2 * glmk_colsum_scratch(N, C) * sizeof(float));
    glmk_layernorm_bwd(be->dtype, dx, dw, db, dout, x, w, mean, rstd, N, C, s, IM(be)->st);
    glm_cuda_op_done(be, "layernorm_bwd");
}
static void cu_rope(glm_backend *be, void *qkv, const int32_t *pos, const int32_t *bpos, int N, int NH, int HD, int inv) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "rope");
    int R = HD / 2;
    float f[128];
    GLM_ASSERT(R / 2 <= 128);
    for (int j = 0; j < R / 2; j++) f[j] = cpu_rope_inv_freq(j, R); /* the CPU's fp16-rounded table */
    glmk_rope(be->dtype, qkv, pos, bpos, N, NH, HD, inv, f, IM(be)->st);
    glm_cuda_op_done(be, "rope");
}
static void cu_attn_fwd(glm_backend *be, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                        const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
    glm_cuda_prof(be, GLM_PROF_ATTN, "attention_fwd");
    cuda_impl *im = IM(be);
    int done = 0; /* the decoding kernel (the keys split over many blocks), else tensor cores, else SIMT */
    if (!im->force_simt && glmk_decode_attention_supported(Tq, Tk, HD)) {
        glmk_decode_attention(be->dtype, out, lse, glm_cuda_scratch(be, glmk_decode_attention_scratch(B, Tq, Tk, NH, HD)), q, k,
                              v, lo, hi, B, Tq, Tk, NH, HD, scale, im->st);
        done = 1;
    } else if (!im->force_simt && glmk_flash_supported(be->dtype, HD, q, k, v, out, NULL)) {
        done = im->use_wgmma && glmk_flash90_fwd(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, im->sms, im->st);
        if (!done) done = glmk_flash_fwd(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, im->smem_max, im->st);
    }
    if (!done) glmk_attention_fwd_simt(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, im->st);
    glm_cuda_op_done(be, "attention_fwd");
}
/* The expanded gradient buffer of grouped attention (grows, never shrinks). */
static void *kv_grad(glm_backend *be, size_t bytes) {
    cuda_impl *im = IM(be);
    if (bytes > im->kv_grad_bytes) {
        cu_free(be, im->kv_grad);
        im->kv_grad_bytes = bytes;
        im->kv_grad = cu_alloc(be, bytes);
    }
    return im->kv_grad;
}
static void cu_attn_bwd(glm_backend *be, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, const void *dout,
                        const void *out, const float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                        const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
    /* grouped keys/values: the kernels write one gradient per query head into [B, Tk, NH, HD]
     * buffers, summed over each group afterwards (the kernels never share an output row) */
    int g = glm_view_group(dk);
    glm_qkv_view dk_out = dk, dv_out = dv;
    if (g > 1) {
        size_t n = (size_t)B * Tk * NH * HD, es = glm_dtype_size(be->dtype);
        char *buf = kv_grad(be, 2 * n * es);
        dk = (glm_qkv_view){buf, (long)Tk * NH * HD, (long)NH * HD, HD, 1};
        dv = dk;
        dv.base = buf + n * es;
    }
    /* D, then (wgmma kernels) the fp32 sums of dq */
    size_t dbytes = ((size_t)B * NH * Tq * sizeof(float) + 255) & ~(size_t)255;
    int wgmma = IM(be)->use_wgmma && !be->deterministic; /* its dq sums arrive in any order */
    char *scr = glm_cuda_scratch(be, dbytes + (wgmma ? glmk_flash90_bwd_scratch(B, Tq, NH, HD) : 0));
    float *D = (float *)scr;
    glm_cuda_prof(be, GLM_PROF_ATTN, "attention_bwd_rowdot");
    glmk_attn_rowdot(be->dtype, D, dout, out, B, Tq, NH, HD, IM(be)->st);
    glm_cuda_prof(be, GLM_PROF_ATTN, "attention_bwd");
    int done = 0; /* the gradients written on tensor cores; the SIMT kernels write the rest */
    if (!IM(be)->force_simt && glmk_flash_supported(be->dtype, HD, q, k, v, dout, NULL) &&
        glmk_flash_supported(be->dtype, HD, dq, dk, dv, NULL, NULL)) {
        if (wgmma && glmk_flash90_bwd(be->dtype, dq, dk, dv, (float *)(scr + dbytes), dout, lse, D, q, k, v, lo, hi, B, Tq,
                                      Tk, NH, HD, scale, IM(be)->st))
            done = GLMK_ATTN_DQ | GLMK_ATTN_DKV;
        else
            done = glmk_flash_bwd(be->dtype, dq, dk, dv, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale,
                                  IM(be)->smem_max, IM(be)->st);
    }
    int rest = (GLMK_ATTN_DQ | GLMK_ATTN_DKV) & ~done;
    if (rest)
        glmk_attention_bwd_simt(be->dtype, dq, dk, dv, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, rest,
                                IM(be)->st);
    if (g > 1) {
        glmk_group_sum(be->dtype, dk_out, dk.base, B, Tk, NH / g, g, HD, IM(be)->st);
        glmk_group_sum(be->dtype, dv_out, dv.base, B, Tk, NH / g, g, HD, IM(be)->st);
    }
    glm_cuda_op_done(be, "attention_bwd");
}
static void cu_rms_fwd(glm_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "rmsnorm_fwd");
    glmk_rmsnorm_fwd(be->dtype, out, rstd, x, w, N, C, eps, IM(be)->st);
    glm_cuda_op_done(be, "rmsnorm_fwd");
}
static void cu_rms_bwd_add(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                           const float *rstd, const void *res, int N, int C) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "rmsnorm_bwd");
    float *s = glm_cuda_scratch(be, glmk_rmsnorm_bwd_scratch(N, C) * sizeof(float));
    glmk_rmsnorm_bwd(be->dtype, dx, dw, dout, x, w, rstd, res, N, C, s, IM(be)->st);
    glm_cuda_op_done(be, "rmsnorm_bwd");
}
static void cu_rms_bwd(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                       const float *rstd, int N, int C) {
    cu_rms_bwd_add(be, dx, dw, dout, x, w, rstd, NULL, N, C);
}
static void cu_swiglu_fwd(glm_backend *be, void *out, const void *x, int N, int F) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "swiglu_fwd");
    glmk_swiglu_fwd(be->dtype, out, x, N, F, IM(be)->st);
    glm_cuda_op_done(be, "swiglu_fwd");
}
static void cu_swiglu_bwd(glm_backend *be, void *dx, const void *x, const void *dout, int N, int F) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "swiglu_bwd");
    glmk_swiglu_bwd(be->dtype, dx, x, dout, N, F, IM(be)->st);
    glm_cuda_op_done(be, "swiglu_bwd");
}
static void cu_rope_pairs(glm_backend *be, void *x, long rs, int N, int nh, int HD, int rot, const int32_t *pos,
                          float theta, int inv) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "rope_pairs");
    float w[256];
    GLM_ASSERT(rot / 2 <= 256);
    for (int i = 0; i < rot / 2; i++) w[i] = cpu_rope_pair_freq(i, rot, theta); /* the CPU's table */
    glmk_rope_pairs(be->dtype, x, rs, N, nh, HD, rot, pos, w, inv, IM(be)->st);
    glm_cuda_op_done(be, "rope_pairs");
}
static void cu_copy_rows(glm_backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t width, size_t rows) {
    size_t es = glm_dtype_size(be->dtype);
    if (!rows || !width) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, ds * es, src, ss * es, width * es, rows, cudaMemcpyDeviceToDevice, IM(be)->st));
    glm_cuda_op_done(be, "copy_rows");
}
static void cu_gelu_fwd(glm_backend *be, void *out, const void *x, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "gelu_fwd");
    glmk_gelu_fwd(be->dtype, out, x, n, IM(be)->st);
    glm_cuda_op_done(be, "gelu_fwd");
}
static void cu_gelu_bwd(glm_backend *be, void *dx, const void *x, const void *dout, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "gelu_bwd");
    glmk_gelu_bwd(be->dtype, dx, x, dout, n, IM(be)->st);
    glm_cuda_op_done(be, "gelu_bwd");
}
static void cu_scale_add(glm_backend *be, void *out, float alpha, const void *x, const void *y, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "scale_add");
    glmk_scale_add(be->dtype, out, alpha, x, y, n, IM(be)->st);
    glm_cuda_op_done(be, "scale_add");
}
static void cu_mask_scale(glm_backend *be, void *out, const void *x, size_t n, float scale, float p, uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "mask_scale");
    glmk_mask_scale(be->dtype, out, x, n, scale, p, seed, IM(be)->st);
    glm_cuda_op_done(be, "mask_scale");
}
static void cu_noise_add(glm_backend *be, void *x, size_t n, float mag, uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "noise_add");
    glmk_noise_add(be->dtype, x, n, mag, seed, IM(be)->st);
    glm_cuda_op_done(be, "noise_add");
}
/* ||W_j + s B_j A||^2 = ||W_j||^2 + 2 s B_j . (W A^T)_j + s^2 B_j (A A^T) B_j^T: W A^T [OC, r] and
 * A A^T [r, r] on cuBLAS in float (W read once, on tensor cores), then one pass over W's rows for
 * ||W_j||^2 that adds the rest; W is read twice in all, where a row at a time re-read all of A. */
static void cu_dora_norm(glm_backend *be, float *n, const void *w, const void *a, const void *b, float scale, int OC, int C,
                         int r) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "dora_norm");
    float *g = glm_cuda_scratch(be, ((size_t)OC * r + (size_t)r * r) * sizeof(float)), *aat = g + (size_t)OC * r;
    /* row-major W [OC, C] and A [r, C] are column-major [C, OC] and [C, r]: G^T [r, OC] = A^T W, A A^T = A^T A there */
    glm_cuda_gemm_to_f32(be, 1, 0, r, OC, C, a, C, w, C, g, r);
    glm_cuda_gemm_to_f32(be, 1, 0, r, r, C, a, C, a, C, aat, r);
    glmk_dora_norm(be->dtype, n, w, b, g, aat, scale, OC, C, r, IM(be)->st);
    glm_cuda_op_done(be, "dora_norm");
}
static void cu_dora_scale(glm_backend *be, void *out, const void *z, const void *mag, const float *n, float shift,
                          const void *bias, const void *res, float res_scale, int N, int OC) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "dora_scale");
    glmk_dora_scale(be->dtype, out, z, mag, n, shift, bias, res, res_scale, N, OC, IM(be)->st);
    glm_cuda_op_done(be, "dora_scale");
}
static void cu_dora_bwd(glm_backend *be, void *dz, void *dmag, const void *dout, const void *z, const void *mag,
                        const float *n, float shift, int N, int OC) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "dora_bwd");
    float *s = glm_cuda_scratch(be, glmk_dora_bwd_scratch(N, OC) * sizeof(float));
    glmk_dora_bwd(be->dtype, dz, dmag, dout, z, mag, n, shift, N, OC, s, IM(be)->st);
    glm_cuda_op_done(be, "dora_bwd");
}
static int cu_lora_down(glm_backend *be, void *t, const void *x, const void *a, int N, int C, int r, float scale, float p,
                        uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_GEMM, "lora_down");
    int done = glmk_lora_down(be->dtype, t, x, a, N, C, r, scale, p, seed, IM(be)->st);
    glm_cuda_op_done(be, "lora_down");
    return done;
}
static int cu_lora_down_bwd(glm_backend *be, void *da, void *dx, const void *dt, const void *x, const void *a, int N, int C,
                            int r, float p, uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_GEMM, "lora_down_bwd");
    float *s = da ? glm_cuda_scratch(be, glmk_lora_down_bwd_scratch(be->dtype, N, C, r) * sizeof(float)) : NULL;
    int done = glmk_lora_down_bwd(be->dtype, da, dx, dt, x, a, N, C, r, p, seed, s, IM(be)->st);
    glm_cuda_op_done(be, "lora_down_bwd");
    return done;
}
static void cu_prefix_kv(glm_backend *be, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int T,
                         int P, int NH, int HD, float p, uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "prefix_kv");
    glmk_prefix_kv(be->dtype, kv, qkv, pkv, layer, L, B, T, P, NH, HD, p, seed, IM(be)->st);
    glm_cuda_op_done(be, "prefix_kv");
}
static void cu_prefix_kv_bwd(glm_backend *be, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B, int T,
                             int P, int NH, int HD, float p, uint64_t seed) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "prefix_kv_bwd");
    glmk_prefix_kv_bwd(be->dtype, dqkv, dpkv, dkv, layer, L, B, T, P, NH, HD, p, seed, IM(be)->st);
    glm_cuda_op_done(be, "prefix_kv_bwd");
}
static void cu_tanh_fwd(glm_backend *be, void *out, const void *x, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "tanh_fwd");
    glmk_tanh_fwd(be->dtype, out, x, n, IM(be)->st);
    glm_cuda_op_done(be, "tanh_fwd");
}
static void cu_tanh_bwd(glm_backend *be, void *dx, const void *out, const void *dout, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "tanh_bwd");
    glmk_tanh_bwd(be->dtype, dx, out, dout, n, IM(be)->st);
    glm_cuda_op_done(be, "tanh_bwd");
}
/* Quantized weights: dequantize feeds the GEMMs (a linear layer's weight in S, per use), qmatmul_fwd
 * is the decode GEMV on the packed bytes; both charged to the GEMM category. */
static void cu_dequantize(glm_backend *be, void *w, const void *q, int qtype, int OC, int C) {
    glm_cuda_prof(be, GLM_PROF_GEMM, "dequantize");
    glmk_dequantize(be->dtype, w, q, qtype, OC, C, IM(be)->st);
    glm_cuda_op_done(be, "dequantize");
}
static void cu_qmatmul_fwd(glm_backend *be, void *out, const void *inp, const void *q, int qtype, const void *bias,
                           int N, int C, int OC) {
    glm_cuda_prof(be, GLM_PROF_GEMM, "qmatmul_fwd");
    glmk_qmatmul_fwd(be->dtype, out, inp, q, qtype, bias, N, C, OC, IM(be)->st);
    glm_cuda_op_done(be, "qmatmul_fwd");
}
static void cu_ce(glm_backend *be, void *logits, float *losses, const int32_t *t, int R, int V, float dscale,
                  const float *row_scale) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "cross_entropy");
    glmk_cross_entropy(be->dtype, logits, losses, t, R, V, dscale, row_scale, IM(be)->st);
    glm_cuda_op_done(be, "cross_entropy");
}
static void cu_gather(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "gather_rows");
    glmk_gather_rows(be->dtype, out, x, idx, R, C, IM(be)->st);
    glm_cuda_op_done(be, "gather_rows");
}
static void cu_scale_rows(glm_backend *be, void *x, const float *s, int R, int C) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "scale_rows");
    glmk_scale_rows(be->dtype, x, s, R, C, IM(be)->st);
    glm_cuda_op_done(be, "scale_rows");
}
static void cu_argmax(glm_backend *be, int32_t *out, const void *x, int R, int V) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "argmax_rows");
    int32_t *d = glm_cuda_scratch(be, (size_t)R * sizeof(int32_t));
    glmk_argmax_rows(be->dtype, d, x, R, V, IM(be)->st);
    cu_download(be, out, d, (size_t)R * sizeof(int32_t));
    glm_cuda_op_done(be, "argmax_rows");
}
static void cu_scatter(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "scatter_rows");
    glmk_scatter_rows(be->dtype, out, x, idx, R, C, IM(be)->st);
    glm_cuda_op_done(be, "scatter_rows");
}
/* Each span's partials reduce into its own result slot (fixed order: deterministic) in two
 * launches per SSQ_SPANS spans; the slots come back in one download and are summed here in
 * span order. The span tables go up in the same stream (small, pinned-free copies). */
static double cu_add_sumsq_spans(glm_backend *be, void *x, const void *y, const size_t *yoff, const glm_span *s, int k) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "sumsq");
    cuda_impl *im = IM(be);
    size_t es = glm_dtype_size(be->dtype);
    double r = 0, part[SSQ_SPANS];
    for (int i0 = 0; i0 < k; i0 += SSQ_SPANS) {
        int n = k - i0 < SSQ_SPANS ? k - i0 : SSQ_SPANS, vec = ((uintptr_t)x & 15) == 0 && ((uintptr_t)y & 15) == 0;
        for (int i = 0; i < n; i++) vec &= (s[i0 + i].lo * es) % 16 == 0 && (!y || (yoff[i0 + i] * es) % 16 == 0);
        CUDA_CHECK(cudaMemcpyAsync(im->ssq_spans, s + i0, (size_t)n * sizeof *s, cudaMemcpyHostToDevice, im->st));
        if (y) CUDA_CHECK(cudaMemcpyAsync(im->ssq_yoff, yoff + i0, (size_t)n * sizeof *yoff, cudaMemcpyHostToDevice, im->st));
        glmk_sumsq_spans(be->dtype, x, y, im->ssq_spans, im->ssq_yoff, n, vec, im->ssq, im->ssq + SSQ_PARTIALS, im->st);
        cu_download(be, part, im->ssq + SSQ_PARTIALS, (size_t)n * sizeof(double));
        for (int i = 0; i < n; i++) r += part[i];
    }
    return r;
}
static double cu_sumsq_spans(glm_backend *be, const void *x, const glm_span *s, int k) {
    return cu_add_sumsq_spans(be, (void *)x, NULL, NULL, s, k); /* no y: x is only read */
}
static double cu_sumsq(glm_backend *be, const void *x, size_t n) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "sumsq");
    cuda_impl *im = IM(be);
    glmk_sumsq(be->dtype, x, n, im->ssq, im->ssq + SSQ_PARTIALS, im->st);
    double r = 0;
    cu_download(be, &r, im->ssq + SSQ_PARTIALS, sizeof r);
    return r;
}
static void cu_adamw(glm_backend *be, void *param, float *master, const void *grad, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gs) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "adamw");
    glmk_adamw(be->dtype, param, master, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gs, IM(be)->st);
    glm_cuda_op_done(be, "adamw");
}
static void cu_adam_dir(glm_backend *be, float *dir, const float *g, float *m, float *v, size_t n, float b1, float b2,
                        float eps) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "adam_dir");
    glmk_adam_dir(dir, g, m, v, n, b1, b2, eps, IM(be)->st);
    glm_cuda_op_done(be, "adam_dir");
}
static void cu_apply_dir(glm_backend *be, void *param, float *master, const float *dir, size_t n, float alpha, float shrink) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "apply_dir");
    glmk_apply_dir(be->dtype, param, master, dir, n, alpha, shrink, IM(be)->st);
    glm_cuda_op_done(be, "apply_dir");
}
static void cu_gram_f64(glm_backend *be, double *G, const float *x, const float *y, int n, int q, int k) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "gram_f64");
    size_t qk = (size_t)q * k;
    double *part = glm_cuda_scratch(be, (GLMK_GRAM_BLOCKS + 1) * qk * sizeof(double));
    glmk_gram_f64(part, part + GLMK_GRAM_BLOCKS * qk, x, y, n, q, k, IM(be)->st);
    cu_download(be, G, part + GLMK_GRAM_BLOCKS * qk, qk * sizeof(double));
}
static void cu_mul_small_f64(glm_backend *be, float *y, const float *x, const double *M, int n, int q, int k) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "mul_small_f64");
    double *dm = glm_cuda_scratch(be, (size_t)q * k * sizeof(double));
    cu_upload(be, dm, M, (size_t)q * k * sizeof(double));
    glmk_mul_small_f64(y, x, dm, n, q, k, IM(be)->st);
    glm_cuda_op_done(be, "mul_small_f64");
}
static int cu_orth_f64(glm_backend *be, float *x, int n, int q) {
    glm_cuda_prof(be, GLM_PROF_OTHER, "orth_f64");
    size_t qq = (size_t)q * q;
    double *part = glm_cuda_scratch(be, (GLMK_GRAM_BLOCKS + 2) * qq * sizeof(double) + sizeof(double));
    double *G = part + GLMK_GRAM_BLOCKS * qq, *Ri = G + qq;
    int *fail = (int *)(Ri + qq), h = 0;
    glmk_orth_f64(part, G, Ri, fail, x, n, q, IM(be)->st);
    cu_download(be, &h, fail, sizeof h); /* the one wait: whether it worked */
    return h ? -1 : 0;
}
static void cu_adamw8(glm_backend *be, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv,
                      float *absm, float *absv, size_t n, const uint8_t *bits, size_t flat0, float lr, float b1, float b2,
                      float eps, float wd, float bc1, float bc2, float gs) {
    glm_cuda_prof(be, GLM_PROF_OPTIM, "adamw8");
    glm_adam8_scalars s = glm_adam8_prepare(lr, b1, b2, eps, wd, bc1, bc2); /* as the CPU op: same bits */
    glmk_adamw8(be->dtype, param, master, grad, qm, qv, absm, absv, n, bits, flat0, &s, gs, IM(be)->st);
    glm_cuda_op_done(be, "adamw8");
}

/* ---------------------------------------------------------------- extras, lifetime */

void *glm_cuda_stream(glm_backend *be) { return (void *)IM(be)->st; }

/* ---------------------------------------------------------------- host staging (cuda_copy.c) */

static glm_cuda_copies *copies(glm_backend *be) {
    if (!IM(be)->copies) IM(be)->copies = glm_cuda_copies_open();
    return IM(be)->copies;
}
static void *cu_host_alloc(glm_backend *be, size_t bytes) { return glm_cuda_host_alloc(bytes); }
static void cu_host_free(glm_backend *be, void *p) { glm_cuda_host_free(p); }
static long cu_copy_async(glm_backend *be, void *dst, const void *src, size_t bytes, int to_host) {
    return glm_cuda_copy_async(copies(be), IM(be)->st, dst, src, bytes, to_host);
}
static void cu_copy_wait(glm_backend *be, long t) { glm_cuda_copy_wait(copies(be), t); }
static void cu_compute_wait(glm_backend *be, long t) { glm_cuda_compute_wait(copies(be), IM(be)->st, t); }

void glm_cuda_fill_normal(glm_backend *be, void *p, size_t n, uint64_t seed, float std) {
    glmk_fill_normal(be->dtype, p, n, seed, std, IM(be)->st);
    glm_cuda_op_done(be, "fill_normal");
}
void glm_cuda_fill(glm_backend *be, void *p, size_t n, float value) {
    glmk_fill(be->dtype, p, n, value, IM(be)->st);
    glm_cuda_op_done(be, "fill");
}

static void cu_destroy(glm_backend *be) {
    cuda_impl *im = IM(be);
    cudaStreamSynchronize(im->st);
    glm_cuda_copies_close(im->copies);
    glm_cuda_gemm_free(im);
    if (im->prof_ev) {
        for (int i = 0; i < PROF_EVENTS; i++) cudaEventDestroy(im->prof_ev[i]);
        free(im->prof_ev);
        free(im->prof_evcat);
        free(im->prof_evop);
    }
    cudaFree(im->workspace);
    cudaFree(im->scratch);
    cudaFree(im->kv_grad);
    cudaFree(im->stage);
    cudaFree(im->ssq);
    cudaFree(im->ssq_spans);
    cudaFree(im->ssq_yoff);
    cublasLtDestroy(im->lt);
    cublasDestroy(im->blas);
    cudaStreamDestroy(im->st);
    free(im);
    free(be);
}

int glm_cuda_capability(glm_backend *be) { return IM(be)->cc; }

int glm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

glm_backend *glm_backend_cuda(int device, glm_dtype dtype, char *errbuf, size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (errbuf) snprintf(errbuf, errlen, "no usable CUDA GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= count) {
        if (errbuf) snprintf(errbuf, errlen, "CUDA device %d does not exist (%d visible)", device, count);
        return NULL;
    }
    CUDA_CHECK(cudaSetDevice(device));
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    /* Turing (7.5: T4, RTX 20xx) runs every op in fp16 or fp32: no bf16 (nor TF32) there, 64 KiB
     * of shared memory a block (k_flash.cu single-buffers), fp16's m16n8k16 as two m16n8k8
     * (cuda_common.cuh); CUDA 13 has no code for older GPUs. GLM_CUDA_TURING=1 sends a newer GPU
     * down the same paths (tests). */
    int cc = prop.major * 10 + prop.minor;
    const char *tu = getenv("GLM_CUDA_TURING");
    int turing = cc < 80 || (tu && tu[0] && strcmp(tu, "0") != 0);
    if (cc < 75) {
        if (errbuf)
            snprintf(errbuf, errlen, "GPU %d (%s) has compute capability %d.%d; glmtrain's CUDA kernels need 7.5 (Turing: "
                     "T4, RTX 20xx) or newer (CUDA 13 builds no code for older GPUs); or run on the CPU (--device cpu)",
                     device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    if (turing && dtype == GLM_BF16) {
        if (errbuf)
            snprintf(errbuf, errlen, "GPU %d (%s, compute capability %d.%d%s) has no bf16 tensor cores (8.0 or newer); use "
                     "float16 (training: --fp16, with loss scaling as PyTorch there; chat/generate/serve: --dtype float16) "
                     "or float32",
                     device, prop.name, prop.major, prop.minor, cc < 80 ? "" : ", treated as 7.5 by GLM_CUDA_TURING=1");
        return NULL;
    }
    char why[160] = "";
    if (!glmk_image_ok(why, sizeof why)) {
        if (errbuf)
            snprintf(errbuf, errlen,
                     "GPU %d (%s, compute capability %d.%d) cannot run this build's CUDA kernels (%s); rebuild with "
                     "code for it, e.g. make NVCC_ARCH='-gencode arch=compute_%d%d,code=sm_%d%d', or with a CUDA "
                     "toolkit and driver that know this GPU",
                     device, prop.name, prop.major, prop.minor, why, prop.major, prop.minor, prop.major, prop.minor);
        return NULL;
    }
    cuda_impl *im = glm_calloc(1, sizeof *im);
    glm_backend *be = glm_calloc(1, sizeof *be);
    im->device = device;
    if (cudaDeviceGetAttribute(&im->sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        (void)cudaGetLastError();
        im->sms = 1; /* still correct: the grid's blocks take every item in turn */
    }
    snprintf(im->name, sizeof im->name, "cuda:%d", device);
    const char *a = getenv("GLM_CUDA_ATTN"), *s = getenv("GLM_CUDA_SYNC");
    im->cc = turing ? 75 : cc;
    if (cudaDeviceGetAttribute(&im->smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        (void)cudaGetLastError();
        im->smem_max = 48 << 10; /* what every GPU gives a block without opting in */
    }
    if (turing && im->smem_max > (64 << 10)) im->smem_max = 64 << 10;
    im->force_simt = a && strcmp(a, "simt") == 0;
    im->use_wgmma = im->cc >= 80 && !im->force_simt && !(a && strcmp(a, "mma") == 0) && glmk_flash90_available(device);
    im->debug_sync = s && strcmp(s, "0") != 0 && s[0];
    const char *tn = getenv("GLM_CUDA_GEMM_TUNE"); /* 0: off; N: at a shape class's Nth call */
    im->gemm_tune = tn && tn[0] ? atoi(tn) : GEMM_TUNE_AFTER;
    if (im->gemm_tune < 0) im->gemm_tune = 0;
    /* orth_f64 on the device: off unless GLM_CUDA_ORTH=1 (test_cuda_ops and bench_svd turn it on):
     * its one-block Cholesky factor is a serial chain that took longer than the two host round
     * trips it saves (docs/PERF.md, session 34), so svd.c makes the factor on the host */
    const char *orth = getenv("GLM_CUDA_ORTH");
    int device_orth = orth && strcmp(orth, "1") == 0;
    CUDA_CHECK(cudaStreamCreateWithFlags(&im->st, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&im->lt));
    CUBLAS_CHECK(cublasCreate(&im->blas));
    CUBLAS_CHECK(cublasSetStream(im->blas, im->st));
    CUBLAS_CHECK(cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH)); /* no TF32 */
    *be = (glm_backend){
        .name = im->name, .device = device, .capability = im->cc, .dtype = dtype, .impl = im,
        .alloc = cu_alloc, .free = cu_free, .zero = cu_zero, .copy = cu_copy,
        .upload_f32 = cu_up_f32, .download_f32 = cu_down_f32, .upload_cast = cu_up_cast, .upload = cu_upload, .download = cu_download,
        .sync = cu_sync,
        .embedding_fwd = cu_emb_fwd, .embedding_bwd = cu_emb_bwd, .layernorm_fwd = cu_ln_fwd, .layernorm_bwd = cu_ln_bwd,
        .rope = cu_rope,
        .rmsnorm_fwd = cu_rms_fwd, .rmsnorm_bwd = cu_rms_bwd, .rmsnorm_bwd_add = cu_rms_bwd_add, .swiglu_fwd = cu_swiglu_fwd, .swiglu_bwd = cu_swiglu_bwd,
        .rope_pairs = cu_rope_pairs, .copy_rows = cu_copy_rows, .attention_fwd = cu_attn_fwd,
        .attention_bwd = cu_attn_bwd, .gelu_fwd = cu_gelu_fwd, .gelu_bwd = cu_gelu_bwd, .scale_add = cu_scale_add, .mask_scale = cu_mask_scale, .noise_add = cu_noise_add,
        .dora_norm = cu_dora_norm, .dora_scale = cu_dora_scale, .dora_bwd = cu_dora_bwd,
        .lora_down = cu_lora_down, .lora_down_bwd = cu_lora_down_bwd,
        .cross_entropy = cu_ce, .argmax_rows = cu_argmax, .scale_rows = cu_scale_rows, .gather_rows = cu_gather, .scatter_rows = cu_scatter, .sumsq = cu_sumsq, .sumsq_spans = cu_sumsq_spans,
        .add_sumsq_spans = cu_add_sumsq_spans,
        .adamw = cu_adamw, .adamw8 = cu_adamw8, .adam_dir = cu_adam_dir, .apply_dir = cu_apply_dir, .gram_f64 = cu_gram_f64, .mul_small_f64 = cu_mul_small_f64, .orth_f64 = device_orth ? cu_orth_f64 : NULL,
        .prefix_kv = cu_prefix_kv, .prefix_kv_bwd = cu_prefix_kv_bwd, .tanh_fwd = cu_tanh_fwd, .tanh_bwd = cu_tanh_bwd,
        .dequantize = cu_dequantize, .qmatmul_fwd = cu_qmatmul_fwd,
        .destroy = cu_destroy, .to_f32 = cu_to_f32, .from_f32 = cu_from_f32,
        .host_alloc = cu_host_alloc, .host_free = cu_host_free, .copy_async = cu_copy_async, .copy_wait = cu_copy_wait,
        .compute_wait = cu_compute_wait,
    };
    glm_cuda_gemm_bind(be); /* the products: cuda_gemm.c */
    im->workspace = cu_alloc(be, WORKSPACE_BYTES);
    im->ssq = cu_alloc(be, (SSQ_PARTIALS + SSQ_SPANS) * sizeof(double));
    im->ssq_spans = cu_alloc(be, SSQ_SPANS * sizeof(glm_span));
    im->ssq_yoff = cu_alloc(be, SSQ_SPANS * sizeof(size_t));
    return be;
}
#endif
