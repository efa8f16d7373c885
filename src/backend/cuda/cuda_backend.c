/* The CUDA backend: storage dtype bf16, fp16 or fp32 (fp32 with TF32 off, so it matches the
 * CPU oracle to ~1e-5). GEMMs go through cuBLASLt (fp32 accumulate, bias epilogue), the rest
 * through the kernels of this folder (launchers in cuda_kernels.h). Every op is enqueued on
 * one stream; only downloads and sumsq wait for it. All state lives in be->impl.
 * Compiled to nothing without GLM_HAVE_CUDA (the Makefile sets it when nvcc exists). */
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_copy.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/err.h"
#include "backend/quant8.h"

#define GEMM_CACHE 256
#define WORKSPACE_BYTES (32u << 20) /* cuBLASLt on Hopper wants 32 MiB */
#define STAGE_ELEMS (16u << 20)     /* fp32 staging for host <-> S conversions */
#define PROF_EVENTS 65536
#define PROF_OPS 96
#define SSQ_SPANS 256               /* sumsq_spans: result slots per download */
#define SSQ_PARTIALS (SSQ_SPANS * GLMK_SUMSQ_SPAN_BLOCKS) /* >= GLMK_SUMSQ_BLOCKS too */

typedef struct gemm_plan {
    int used;
    int key[18];
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int have_algo; /* 0: no cuBLASLt algorithm fits; use cublasGemmEx */
} gemm_plan;

typedef struct cuda_impl {
    int device;
    int sms;         /* its multiprocessors (the persistent attention forward's grid) */
    char name[32];
    cudaStream_t st;
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* fallback for shapes cuBLASLt declines */
    void *workspace;
    void *scratch;
    size_t scratch_bytes;
    void *kv_grad;       /* grouped attention's backward: per-query-head dk|dv before the group sum */
    size_t kv_grad_bytes;
    float *stage;
    double *ssq;         /* [SSQ_PARTIALS + SSQ_SPANS]: partials, then one result per span */
    glm_span *ssq_spans; /* [SSQ_SPANS] the span table of sumsq_spans */
    size_t *ssq_yoff;    /* [SSQ_SPANS] add_sumsq_spans: where each span's addend starts */
    gemm_plan plans[GEMM_CACHE];
    int next_evict;
    int force_simt;  /* GLM_CUDA_ATTN=simt: attention without tensor cores */
    int use_wgmma;   /* the sm_90a attention kernels (k_flash90.cu): a 9.0 device, unless GLM_CUDA_ATTN=mma */
    int debug_sync;  /* GLM_CUDA_SYNC=1: synchronise and check after every op */
    int gemm_tune;   /* time the heuristic's candidates at a product's first call (GLM_CUDA_GEMM_TUNE=0: off) */
    size_t peak_used;
    glm_cuda_copies *copies; /* an offloaded optimizer's copy streams (made at first use) */
    /* profiler (glm_cuda_profile): events at category changes, or at every op in detail mode */
    int prof_on, prof_n, prof_cat;
    cudaEvent_t *prof_ev;
    int *prof_evcat;
    const char **prof_evop;
    int n_ops;                 /* per-op totals of the last read (detail mode) */
    const char *op_name[PROF_OPS];
    double op_ms[PROF_OPS];
    int n_labels;              /* "matmul_fwd 4096x12288"-style labels, owned here */
    int label_key[PROF_OPS][3];
    char label[PROF_OPS][48];
} cuda_impl;

static cuda_impl *IM(glm_backend *be) { return (cuda_impl *)be->impl; }

/* ---------------------------------------------------------------- checked calls */

void glm_cuda_check_at(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    glm_fatal_at(file, line,
                 "CUDA errors from kernels surface at the next synchronising call; rerun with GLM_CUDA_SYNC=1 to stop at "
                 "the failing op, or under `compute-sanitizer` to find a bad access",
                 "CUDA error %s (%s) in %s", cudaGetErrorName(e), cudaGetErrorString(e), what);
}
#define CUDA_CHECK(call) glm_cuda_check_at((call), #call, __FILE__, __LINE__)

static void cublas_check_at(int status, const char *what, const char *file, int line) {
    if (status == 0) return;
    glm_fatal_at(file, line,
                 "a cuBLAS failure is usually a bad shape or pointer alignment, or an earlier CUDA error; rerun with "
                 "GLM_CUDA_SYNC=1",
                 "cuBLAS status %d in %s", status, what);
}
#define CUBLAS_CHECK(call) cublas_check_at((int)(call), #call, __FILE__, __LINE__)

/* After each op: in debug mode, wait and report the op by name. */
static void op_done(glm_backend *be, const char *op) {
    if (!IM(be)->debug_sync) return;
    cudaError_t e = cudaStreamSynchronize(IM(be)->st);
    if (e == cudaSuccess) e = cudaGetLastError();
    glm_cuda_check_at(e, op, __FILE__, __LINE__);
}

/* ---------------------------------------------------------------- profiler */

static void prof(glm_backend *be, int cat, const char *op) {
    cuda_impl *im = IM(be);
    if (!im->prof_on || (im->prof_on == 1 && cat == im->prof_cat) || im->prof_n >= PROF_EVENTS) return;
    CUDA_CHECK(cudaEventRecord(im->prof_ev[im->prof_n], im->st));
    im->prof_evcat[im->prof_n] = cat;
    im->prof_evop[im->prof_n++] = op;
    im->prof_cat = cat;
}

/* A persistent label for a GEMM of one shape class (kind 0 fwd, 1 dinp, 2 dw), so the detail
 * profile tells the head from the MLP. */
static const char *mm_label(glm_backend *be, int kind, int C, int OC) {
    cuda_impl *im = IM(be);
    if (im->prof_on < 2) return "matmul";
    for (int i = 0; i < im->n_labels; i++)
        if (im->label_key[i][0] == kind && im->label_key[i][1] == C && im->label_key[i][2] == OC) return im->label[i];
    if (im->n_labels == PROF_OPS) return "matmul (other shapes)";
    int i = im->n_labels++;
    im->label_key[i][0] = kind; im->label_key[i][1] = C; im->label_key[i][2] = OC;
    static const char *kinds[3] = {"matmul_fwd", "matmul_bwd_dinp", "matmul_bwd_dw"};
    snprintf(im->label[i], sizeof im->label[i], "%s %dx%d", kinds[kind], C, OC);
    return im->label[i];
}

void glm_cuda_profile(glm_backend *be, int on) {
    cuda_impl *im = IM(be);
    if (on && !im->prof_ev) {
        im->prof_ev = glm_calloc(PROF_EVENTS, sizeof(cudaEvent_t));
        im->prof_evcat = glm_calloc(PROF_EVENTS, sizeof(int));
        im->prof_evop = glm_calloc(PROF_EVENTS, sizeof(char *));
        for (int i = 0; i < PROF_EVENTS; i++) CUDA_CHECK(cudaEventCreate(&im->prof_ev[i]));
    }
    im->prof_on = on;
    im->prof_n = 0;
    im->prof_cat = -1;
}

void glm_cuda_profile_read(glm_backend *be, double *ms) {
    cuda_impl *im = IM(be);
    if (!im->prof_on) return;
    im->prof_cat = -1;
    prof(be, GLM_PROF_NCAT, "end"); /* closing mark */
    CUDA_CHECK(cudaStreamSynchronize(im->st));
    im->n_ops = 0;
    for (int i = 0; i + 1 < im->prof_n; i++) {
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, im->prof_ev[i], im->prof_ev[i + 1]));
        if (im->prof_evcat[i] < GLM_PROF_NCAT) ms[im->prof_evcat[i]] += t;
        if (im->prof_on < 2) continue;
        int k = 0;
        while (k < im->n_ops && strcmp(im->op_name[k], im->prof_evop[i]) != 0) k++;
        if (k == im->n_ops) {
            if (k == PROF_OPS) continue;
            im->op_name[k] = im->prof_evop[i];
            im->op_ms[k] = 0;
            im->n_ops++;
        }
        im->op_ms[k] += t;
    }
    im->prof_n = 0;
    im->prof_cat = -1;
}

int glm_cuda_profile_ops(glm_backend *be, const char **names, double *ms, int max) {
    cuda_impl *im = IM(be);
    int n = im->n_ops < max ? im->n_ops : max;
    for (int i = 0; i < n; i++) { names[i] = im->op_name[i]; ms[i] = im->op_ms[i]; }
    return n;
}

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
    prof(be, GLM_PROF_OTHER, "zero");
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, IM(be)->st));
}
static void cu_copy(glm_backend *be, void *dst, const void *src, size_t bytes) {
    prof(be, GLM_PROF_OTHER, "copy");
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
    if (sdt == be->dtype) { cu_upload(be, dst, src, n * es); op_done(be, "upload_cast"); return; }
    void *s = stage(be);
    size_t per = STAGE_ELEMS * sizeof(float) / es;
    for (size_t off = 0; off < n; off += per) {
        size_t c = n - off < per ? n - off : per;
        cu_upload(be, s, (const char *)src + off * es, c * es);
        glmk_convert(glm_at(be, dst, off), be->dtype, s, sdt, c, IM(be)->st);
    }
    op_done(be, "upload_cast");
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
    op_done(be, "to_f32");
}

/* Device scratch for one op at a time (ops are stream-ordered); grows, never shrinks. */
static void *scratch(glm_backend *be, size_t bytes) {
    cuda_impl *im = IM(be);
    if (bytes > im->scratch_bytes) {
        cu_free(be, im->scratch); /* cudaFree waits for work that may still use it */
        im->scratch_bytes = bytes + bytes / 4;
        im->scratch = cu_alloc(be, im->scratch_bytes);
    }
    return im->scratch;
}

/* ---------------------------------------------------------------- GEMM */

static cudaDataType_t cuda_type(glm_dtype d) { return d == GLM_F32 ? CUDA_R_32F : d == GLM_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a & (uintptr_t)(al - 1))) al >>= 1;
    return al;
}

static void plan_destroy(gemm_plan *p) {
    if (!p->used) return;
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    p->used = 0;
}

/* What the product's epilogue does besides bias and beta C: nothing; GELU (D = gelu(P), the
 * pre-activation P written to aux, same layout as D); or GELU's derivative (D = P * gelu'(aux)). */
enum { EPI_NONE, EPI_GELU_AUX, EPI_DGELU };

static void gemm_epi(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb,
                     void *D, int ldd, float beta, const void *bias, const void *Cin, int epi, void *aux);

/* An epilogue as two steps: the plain product (into aux for GELU_AUX), then GELU's pass. */
static void epi_unfused(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B,
                        int ldb, void *D, int ldd, float beta, const void *bias, const void *Cin, int epi, void *aux) {
    gemm_epi(be, ta, tb, m, n, k, A, lda, B, ldb, epi == EPI_GELU_AUX ? aux : D, ldd, beta, bias, Cin, EPI_NONE, NULL);
    if (epi == EPI_GELU_AUX) glmk_gelu_fwd(be->dtype, D, aux, (size_t)ldd * n, IM(be)->st);
    else glmk_gelu_bwd(be->dtype, D, aux, D, (size_t)ldd * n, IM(be)->st);
}

/* cuBLASLt's heuristic ranks its kernels without running them; on an H200 its first pick is up
 * to ~10% slower than the fastest of its next few for some of a step's products (the input
 * gradient of query_key_value, the weight gradient of dense_4h_to_h). So a product's first call
 * times up to GEMM_TUNE_CANDIDATES of them on the call's own operands and keeps the fastest,
 * but the first pick unless another beats it by 3%: a margin meant to keep timing noise from
 * making two runs (or a run and its resumption) pick differently; --full_determinism is what
 * guarantees it. A product that accumulates into D is timed
 * on a copy of D put back afterwards: a transient allocation of at most GEMM_TUNE_SAVE_MAX
 * during the first step (skipped, with the first pick, for a larger D or when no memory is free
 * for it). Only where the shapes repeat (be->tune_products: training; a server's prompts come in
 * every length); off under --full_determinism (the heuristic's pick alone) and with
 * GLM_CUDA_GEMM_TUNE=0. */
/* The per-call pointers of a plan's epilogue: its bias (DGELU takes none) and aux matrix. */
static void set_epilogue_ptrs(gemm_plan *p, const void *bias, int epi, const void *aux) {
    if (bias && epi != EPI_DGELU)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epi != EPI_NONE)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
}

#define GEMM_TUNE_CANDIDATES 8
#define GEMM_TUNE_SAVE_MAX ((size_t)256 << 20) /* the largest D copied aside (a weight gradient of dense_h_to_4h: 128 MiB) */
#define GEMM_TUNE_ROUNDS 5
/* The candidates are timed in rounds, one launch of each per round, and ranked by their median
 * launch: under the GPU's power limit the clock falls within tens of milliseconds of sustained
 * products, so candidates timed one after another would each meet another clock (on an H200 a
 * candidate timed first ran ~12% faster than the same one at the limit), and the ranking
 * would follow the order of timing more than the kernels. */
static int gemm_tune(glm_backend *be, gemm_plan *p, const cublasLtMatmulHeuristicResult_t *res, int nres, const void *A,
                     const void *B, const void *C, void *D, size_t dbytes, float beta) {
    cuda_impl *im = IM(be);
    float alpha = 1.0f;
    void *save = NULL;
    if (beta != 0.0f && (!C || C == D)) {
        if (dbytes > GEMM_TUNE_SAVE_MAX || cudaMalloc(&save, dbytes) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        CUDA_CHECK(cudaMemcpyAsync(save, D, dbytes, cudaMemcpyDeviceToDevice, im->st));
    }
    /* the launches back to back (as in a step), an event between each two, read after the last:
     * launch j of the sequence takes ev[j] -> ev[j + 1] */
    cudaEvent_t ev[GEMM_TUNE_CANDIDATES * GEMM_TUNE_ROUNDS + 1];
    int ok[GEMM_TUNE_CANDIDATES], nok = 0, nev = 0;
    for (int i = 0; i < nres; i++) { /* a first launch of each: the ones that run, and warm */
        ok[i] = cublasLtMatmul(im->lt, p->op, &alpha, A, p->a, B, p->b, &beta, C ? C : D, p->d, D, p->d, &res[i].algo,
                               im->workspace, WORKSPACE_BYTES, im->st) == CUBLAS_STATUS_SUCCESS;
        nok += ok[i];
    }
    for (int j = 0; j <= nok * GEMM_TUNE_ROUNDS; j++) CUDA_CHECK(cudaEventCreate(&ev[j]));
    CUDA_CHECK(cudaEventRecord(ev[nev++], im->st));
    for (int r = 0; r < GEMM_TUNE_ROUNDS; r++)
        for (int i = 0; i < nres; i++) {
            if (!ok[i]) continue;
            cublasLtMatmul(im->lt, p->op, &alpha, A, p->a, B, p->b, &beta, C ? C : D, p->d, D, p->d, &res[i].algo,
                           im->workspace, WORKSPACE_BYTES, im->st);
            CUDA_CHECK(cudaEventRecord(ev[nev++], im->st));
        }
    CUDA_CHECK(cudaEventSynchronize(ev[nev - 1]));
    int pick = 0;
    float t0 = 0, best = 0;
    for (int i = 0, k = 0; i < nres; i++) { /* k: candidate i's place among those that run */
        if (!ok[i]) continue;
        float t[GEMM_TUNE_ROUNDS];
        for (int r = 0; r < GEMM_TUNE_ROUNDS; r++) {
            int j = r * nok + k;
            CUDA_CHECK(cudaEventElapsedTime(&t[r], ev[j], ev[j + 1]));
        }
        k++;
        for (int a = 1; a < GEMM_TUNE_ROUNDS; a++) /* the median: an insertion sort of five */
            for (int b = a; b > 0 && t[b] < t[b - 1]; b--) { float x = t[b]; t[b] = t[b - 1]; t[b - 1] = x; }
        float med = t[GEMM_TUNE_ROUNDS / 2];
        if (i == 0) t0 = best = med;
        else if (med < best) { best = med; pick = i; }
    }
    if (pick && best > 0.97f * t0) pick = 0;
    for (int j = 0; j < nev; j++) cudaEventDestroy(ev[j]);
    if (save) {
        CUDA_CHECK(cudaMemcpyAsync(D, save, dbytes, cudaMemcpyDeviceToDevice, im->st));
        CUDA_CHECK(cudaFree(save)); /* waits for the copy */
    }
    return pick;
}

/* Column-major D[m,n] = op(A) op(B) (+ bias[m] per row) + beta C, fp32 accumulate, where C is
 * Cin (same layout as D; NULL: D itself), then the epilogue epi with aux. The model's row-major
 * products map onto this with swapped operands (see cu_mm_fwd / cu_mm_bwd). */
static void gemm_epi(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb,
                     void *D, int ldd, float beta, const void *bias, const void *Cin, int epi, void *aux) {
    if (m <= 0 || n <= 0) return;
    cuda_impl *im = IM(be);
    cudaDataType_t t = cuda_type(be->dtype);
    float alpha = 1.0f;
    size_t dbytes = (size_t)ldd * n * glm_dtype_size(be->dtype);
    if (epi != EPI_NONE && (k <= 0 || ldd % 8)) { /* no epilogue for these: the product, then the pass */
        epi_unfused(be, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, beta, bias, Cin, epi, aux);
        return;
    }
    if (k <= 0) { /* empty product: D = beta C (+ bias) */
        if (Cin && Cin != D && beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(D, Cin, dbytes, cudaMemcpyDeviceToDevice, im->st));
        if (beta != 0.0f && beta != 1.0f) glmk_scale_add(be->dtype, D, beta - 1.0f, D, D, (size_t)ldd * n, im->st);
        if (beta == 0.0f) CUDA_CHECK(cudaMemsetAsync(D, 0, dbytes, im->st));
        if (bias) glmk_bias_add(be->dtype, D, bias, n, m, im->st);
        return;
    }
    int tf32 = be->dtype == GLM_F32 && be->allow_tf32;
    int key[18] = {ta, tb, m, n, k, lda, ldb, ldd, bias != NULL, beta != 0.0f, align_of(A), align_of(B), align_of(D),
                   bias ? align_of(bias) : 0, Cin ? align_of(Cin) : align_of(D), tf32, epi, aux ? align_of(aux) : 0};
    gemm_plan *p = NULL;
    for (int i = 0; i < GEMM_CACHE && !p; i++)
        if (im->plans[i].used && memcmp(im->plans[i].key, key, sizeof key) == 0) p = &im->plans[i];
    if (!p) {
        for (int i = 0; i < GEMM_CACHE && !p; i++) if (!im->plans[i].used) p = &im->plans[i];
        if (!p) { p = &im->plans[im->next_evict]; im->next_evict = (im->next_evict + 1) % GEMM_CACHE; plan_destroy(p); }
        memset(p, 0, sizeof *p);
        memcpy(p->key, key, sizeof key);
        p->used = 1;
        cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        /* fp32: CUBLAS_COMPUTE_32F never uses TF32; ..._FAST_TF32 does (--tf32, as torch's allow_tf32) */
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        cublasLtEpilogue_t e = epi == EPI_GELU_AUX ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                               : epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                               : bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
        if (e != CUBLASLT_EPILOGUE_DEFAULT)
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
        if (epi != EPI_NONE) { /* aux is laid out as D; its pointer is set per call */
            int64_t ld = ldd;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        }
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, ta ? k : m, ta ? m : k, lda));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, tb ? n : k, tb ? k : n, ldb));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, t, m, n, ldd));
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = WORKSPACE_BYTES;
        uint32_t al[4] = {(uint32_t)key[10], (uint32_t)key[11], (uint32_t)(key[14] < key[12] ? key[14] : key[12]),
                          (uint32_t)key[12]};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
        cublasLtMatmulHeuristicResult_t res[GEMM_TUNE_CANDIDATES];
        int nres = 0, tune = im->gemm_tune && be->tune_products && !be->deterministic;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(im->lt, p->op, p->a, p->b, p->d, p->d, pref,
                                                          tune ? GEMM_TUNE_CANDIDATES : 1, res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        p->have_algo = s == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (p->have_algo && nres > 1) {
            set_epilogue_ptrs(p, bias, epi, aux);
            p->algo = res[gemm_tune(be, p, res, nres, A, B, Cin, D, dbytes, beta)].algo;
        } else if (p->have_algo) {
            p->algo = res[0].algo;
        }
    }
    if (!p->have_algo && epi != EPI_NONE) { /* no kernel with this epilogue: the product, then the pass */
        epi_unfused(be, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, beta, bias, Cin, epi, aux);
        return;
    }
    if (p->have_algo) {
        set_epilogue_ptrs(p, bias, epi, aux);
        CUBLAS_CHECK(cublasLtMatmul(im->lt, p->op, &alpha, A, p->a, B, p->b, &beta, Cin ? Cin : D, p->d, D, p->d, &p->algo,
                                    im->workspace, WORKSPACE_BYTES, im->st));
    } else {
        if (Cin && Cin != D && beta != 0.0f) CUDA_CHECK(cudaMemcpyAsync(D, Cin, dbytes, cudaMemcpyDeviceToDevice, im->st));
        CUBLAS_CHECK(cublasGemmEx(im->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                                  A, t, lda, B, t, ldb, &beta, D, t, ldd,
                                  tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (bias) glmk_bias_add(be->dtype, D, bias, n, m, im->st);
    }
}

static void gemm(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb,
                 void *D, int ldd, float beta, const void *bias, const void *Cin) {
    gemm_epi(be, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, beta, bias, Cin, EPI_NONE, NULL);
}

/* out[N,OC] = inp[N,C] w[OC,C]^T + bias: column-major out^T[OC,N] = (w^T)^T... i.e. op(A=w)=T, B=inp. */
static void cu_mm_fwd(glm_backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int C, int OC) {
    prof(be, GLM_PROF_GEMM, mm_label(be, 0, C, OC));
    /* a sum of a few terms (LoRA's B product): a write of out, at memory speed off cuBLAS */
    if (bias || !glmk_small_k_fwd(be->dtype, out, inp, w, N, C, OC, IM(be)->st))
        gemm(be, 1, 0, OC, N, C, w, C, inp, C, out, OC, 0.0f, bias, NULL);
    op_done(be, "matmul_fwd");
}
static void cu_mm_fwd_add(glm_backend *be, void *out, const void *inp, const void *w, const void *bias, const void *res,
                          float res_scale, int N, int C, int OC) {
    prof(be, GLM_PROF_GEMM, mm_label(be, 0, C, OC));
    gemm(be, 1, 0, OC, N, C, w, C, inp, C, out, OC, res_scale, bias, res);
    op_done(be, "matmul_fwd_add");
}

static void cu_mm_fwd_gelu(glm_backend *be, void *act, void *pre, const void *inp, const void *w, const void *bias, int N,
                           int C, int OC) {
    prof(be, GLM_PROF_GEMM, mm_label(be, 0, C, OC));
    gemm_epi(be, 1, 0, OC, N, C, w, C, inp, C, act, OC, 0.0f, bias, NULL, EPI_GELU_AUX, pre);
    op_done(be, "matmul_fwd_gelu");
}
static void cu_mm_bwd_dgelu(glm_backend *be, void *dinp, const void *dout, const void *w, const void *pre, int N, int C,
                            int OC) {
    prof(be, GLM_PROF_GEMM, mm_label(be, 1, C, OC));
    gemm_epi(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, 0.0f, NULL, NULL, EPI_DGELU, (void *)pre);
    op_done(be, "matmul_bwd_dgelu");
}

static void cu_mm_bwd_add(glm_backend *be, void *dinp, const void *dout, const void *w, const void *res, float res_scale,
                          int N, int C, int OC) {
    prof(be, GLM_PROF_GEMM, mm_label(be, 1, C, OC));
    gemm(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, res_scale, NULL, res);
    op_done(be, "matmul_bwd_add");
}

static void cu_mm_bwd(glm_backend *be, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                      const void *w, int N, int C, int OC, int acc) {
    /* sums over a few columns (LoRA's B side, C the rank): both products in one read of dout,
     * where cuBLAS reads it once for each (nothing is launched when the kernel does not take it) */
    if (dinp && dw && !dbias && C <= 16) {
        prof(be, GLM_PROF_GEMM, mm_label(be, 1, C, OC));
        float *s = scratch(be, glmk_small_k_bwd_scratch(N, C, OC) * sizeof(float));
        if (glmk_small_k_bwd(be->dtype, dinp, dw, dout, inp, w, N, C, OC, acc, s, IM(be)->st)) {
            op_done(be, "matmul_bwd");
            return;
        }
    }
    /* dinp^T[C,N] = w^T[C,OC] dout^T[OC,N] */
    if (dinp) {
        prof(be, GLM_PROF_GEMM, mm_label(be, 1, C, OC));
        gemm(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, acc ? 1.0f : 0.0f, NULL, NULL);
    }
    /* dw^T[C,OC] += inp^T[C,N] dout[N,OC] */
    if (dw) {
        prof(be, GLM_PROF_GEMM, mm_label(be, 2, C, OC));
        gemm(be, 0, 1, C, OC, N, inp, C, dout, OC, dw, C, 1.0f, NULL, NULL);
    }
    if (dbias) prof(be, GLM_PROF_GEMM, "bias_grad");
    if (dbias) glmk_bias_grad(be->dtype, dbias, dout, N, OC, scratch(be, glmk_colsum_scratch(N, OC) * sizeof(float)), IM(be)->st);
    op_done(be, "matmul_bwd");
}

/* ---------------------------------------------------------------- other ops */

static void cu_emb_fwd(glm_backend *be, void *out, const int32_t *ids, const void *wte, int N, int H) {
    prof(be, GLM_PROF_OTHER, "embedding_fwd");
    glmk_embedding_fwd(be->dtype, out, ids, wte, N, H, IM(be)->st);
    op_done(be, "embedding_fwd");
}
static void cu_emb_bwd(glm_backend *be, void *dwte, const void *dout, const int32_t *ids, int N, int H, int V) {
    prof(be, GLM_PROF_OTHER, "embedding_bwd");
    glmk_embedding_bwd(be->dtype, dwte, dout, ids, N, H, IM(be)->st);
    op_done(be, "embedding_bwd");
}
static void cu_ln_fwd(glm_backend *be, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b,
                      int N, int C, float eps) {
    prof(be, GLM_PROF_OTHER, "layernorm_fwd");
    glmk_layernorm_fwd(be->dtype, out, mean, rstd, x, w, b, N, C, eps, IM(be)->st);
    op_done(be, "layernorm_fwd");
}
static void cu_ln_bwd(glm_backend *be, void *dx, void *dw, void *db, const void *dout, const void *x, const void *w,
                      const float *mean, const float *rstd, int N, int C) {
    prof(be, GLM_PROF_OTHER, "layernorm_bwd");
    float *s = scratch(be, 2 * glmk_colsum_scratch(N, C) * sizeof(float));
    glmk_layernorm_bwd(be->dtype, dx, dw, db, dout, x, w, mean, rstd, N, C, s, IM(be)->st);
    op_done(be, "layernorm_bwd");
}
static void cu_rope(glm_backend *be, void *qkv, const int32_t *pos, const int32_t *bpos, int N, int NH, int HD, int inv) {
    prof(be, GLM_PROF_OTHER, "rope");
    int R = HD / 2;
    float f[128];
    GLM_ASSERT(R / 2 <= 128);
    for (int j = 0; j < R / 2; j++) f[j] = cpu_rope_inv_freq(j, R); /* the CPU's fp16-rounded table */
    glmk_rope(be->dtype, qkv, pos, bpos, N, NH, HD, inv, f, IM(be)->st);
    op_done(be, "rope");
}
static void cu_attn_fwd(glm_backend *be, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                        const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale) {
    prof(be, GLM_PROF_ATTN, "attention_fwd");
    if (!IM(be)->force_simt && glmk_decode_attention_supported(Tq, Tk, HD)) /* decoding: the keys split over many blocks */
        glmk_decode_attention(be->dtype, out, lse, scratch(be, glmk_decode_attention_scratch(B, Tq, Tk, NH, HD)), q, k,
                              v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->st);
    else if (!IM(be)->force_simt && glmk_flash_supported(be->dtype, HD, q, k, v, out, NULL)) {
        if (!IM(be)->use_wgmma || !glmk_flash90_fwd(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->sms, IM(be)->st))
            glmk_flash_fwd(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->st);
    }
    else
        glmk_attention_fwd_simt(be->dtype, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->st);
    op_done(be, "attention_fwd");
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
    char *scr = scratch(be, dbytes + (wgmma ? glmk_flash90_bwd_scratch(B, Tq, NH, HD) : 0));
    float *D = (float *)scr;
    prof(be, GLM_PROF_ATTN, "attention_bwd_rowdot");
    glmk_attn_rowdot(be->dtype, D, dout, out, B, Tq, NH, HD, IM(be)->st);
    prof(be, GLM_PROF_ATTN, "attention_bwd");
    if (!IM(be)->force_simt && glmk_flash_supported(be->dtype, HD, q, k, v, dout, NULL) &&
        glmk_flash_supported(be->dtype, HD, dq, dk, dv, NULL, NULL)) {
        if (!wgmma ||
            !glmk_flash90_bwd(be->dtype, dq, dk, dv, (float *)(scr + dbytes), dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH,
                              HD, scale, IM(be)->st))
            glmk_flash_bwd(be->dtype, dq, dk, dv, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->st);
    }
    else
        glmk_attention_bwd_simt(be->dtype, dq, dk, dv, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, HD, scale, IM(be)->st);
    if (g > 1) {
        glmk_group_sum(be->dtype, dk_out, dk.base, B, Tk, NH / g, g, HD, IM(be)->st);
        glmk_group_sum(be->dtype, dv_out, dv.base, B, Tk, NH / g, g, HD, IM(be)->st);
    }
    op_done(be, "attention_bwd");
}
static void cu_rms_fwd(glm_backend *be, void *out, float *rstd, const void *x, const void *w, int N, int C, float eps) {
    prof(be, GLM_PROF_OTHER, "rmsnorm_fwd");
    glmk_rmsnorm_fwd(be->dtype, out, rstd, x, w, N, C, eps, IM(be)->st);
    op_done(be, "rmsnorm_fwd");
}
static void cu_rms_bwd_add(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                           const float *rstd, const void *res, int N, int C) {
    prof(be, GLM_PROF_OTHER, "rmsnorm_bwd");
    float *s = scratch(be, glmk_rmsnorm_bwd_scratch(N, C) * sizeof(float));
    glmk_rmsnorm_bwd(be->dtype, dx, dw, dout, x, w, rstd, res, N, C, s, IM(be)->st);
    op_done(be, "rmsnorm_bwd");
}
static void cu_rms_bwd(glm_backend *be, void *dx, void *dw, const void *dout, const void *x, const void *w,
                       const float *rstd, int N, int C) {
    cu_rms_bwd_add(be, dx, dw, dout, x, w, rstd, NULL, N, C);
}
static void cu_swiglu_fwd(glm_backend *be, void *out, const void *x, int N, int F) {
    prof(be, GLM_PROF_OTHER, "swiglu_fwd");
    glmk_swiglu_fwd(be->dtype, out, x, N, F, IM(be)->st);
    op_done(be, "swiglu_fwd");
}
static void cu_swiglu_bwd(glm_backend *be, void *dx, const void *x, const void *dout, int N, int F) {
    prof(be, GLM_PROF_OTHER, "swiglu_bwd");
    glmk_swiglu_bwd(be->dtype, dx, x, dout, N, F, IM(be)->st);
    op_done(be, "swiglu_bwd");
}
static void cu_rope_pairs(glm_backend *be, void *x, long rs, int N, int nh, int HD, int rot, const int32_t *pos,
                          float theta, int inv) {
    prof(be, GLM_PROF_OTHER, "rope_pairs");
    float w[256];
    GLM_ASSERT(rot / 2 <= 256);
    for (int i = 0; i < rot / 2; i++) w[i] = cpu_rope_pair_freq(i, rot, theta); /* the CPU's table */
    glmk_rope_pairs(be->dtype, x, rs, N, nh, HD, rot, pos, w, inv, IM(be)->st);
    op_done(be, "rope_pairs");
}
static void cu_copy_rows(glm_backend *be, void *dst, size_t ds, const void *src, size_t ss, size_t width, size_t rows) {
    size_t es = glm_dtype_size(be->dtype);
    if (!rows || !width) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, ds * es, src, ss * es, width * es, rows, cudaMemcpyDeviceToDevice, IM(be)->st));
    op_done(be, "copy_rows");
}
static void cu_gelu_fwd(glm_backend *be, void *out, const void *x, size_t n) {
    prof(be, GLM_PROF_OTHER, "gelu_fwd");
    glmk_gelu_fwd(be->dtype, out, x, n, IM(be)->st);
    op_done(be, "gelu_fwd");
}
static void cu_gelu_bwd(glm_backend *be, void *dx, const void *x, const void *dout, size_t n) {
    prof(be, GLM_PROF_OTHER, "gelu_bwd");
    glmk_gelu_bwd(be->dtype, dx, x, dout, n, IM(be)->st);
    op_done(be, "gelu_bwd");
}
static void cu_scale_add(glm_backend *be, void *out, float alpha, const void *x, const void *y, size_t n) {
    prof(be, GLM_PROF_OTHER, "scale_add");
    glmk_scale_add(be->dtype, out, alpha, x, y, n, IM(be)->st);
    op_done(be, "scale_add");
}
static void cu_mask_scale(glm_backend *be, void *out, const void *x, size_t n, float scale, float p, uint64_t seed) {
    prof(be, GLM_PROF_OTHER, "mask_scale");
    glmk_mask_scale(be->dtype, out, x, n, scale, p, seed, IM(be)->st);
    op_done(be, "mask_scale");
}
static int cu_lora_down(glm_backend *be, void *t, const void *x, const void *a, int N, int C, int r, float scale, float p,
                        uint64_t seed) {
    prof(be, GLM_PROF_GEMM, "lora_down");
    int done = glmk_lora_down(be->dtype, t, x, a, N, C, r, scale, p, seed, IM(be)->st);
    op_done(be, "lora_down");
    return done;
}
static int cu_lora_down_bwd(glm_backend *be, void *da, void *dx, const void *dt, const void *x, const void *a, int N, int C,
                            int r, float p, uint64_t seed) {
    prof(be, GLM_PROF_GEMM, "lora_down_bwd");
    float *s = da ? scratch(be, glmk_lora_down_bwd_scratch(be->dtype, N, C, r) * sizeof(float)) : NULL;
    int done = glmk_lora_down_bwd(be->dtype, da, dx, dt, x, a, N, C, r, p, seed, s, IM(be)->st);
    op_done(be, "lora_down_bwd");
    return done;
}
static void cu_prefix_kv(glm_backend *be, void *kv, const void *qkv, const void *pkv, int layer, int L, int B, int T,
                         int P, int NH, int HD, float p, uint64_t seed) {
    prof(be, GLM_PROF_OTHER, "prefix_kv");
    glmk_prefix_kv(be->dtype, kv, qkv, pkv, layer, L, B, T, P, NH, HD, p, seed, IM(be)->st);
    op_done(be, "prefix_kv");
}
static void cu_prefix_kv_bwd(glm_backend *be, void *dqkv, void *dpkv, const void *dkv, int layer, int L, int B, int T,
                             int P, int NH, int HD, float p, uint64_t seed) {
    prof(be, GLM_PROF_OTHER, "prefix_kv_bwd");
    glmk_prefix_kv_bwd(be->dtype, dqkv, dpkv, dkv, layer, L, B, T, P, NH, HD, p, seed, IM(be)->st);
    op_done(be, "prefix_kv_bwd");
}
static void cu_tanh_fwd(glm_backend *be, void *out, const void *x, size_t n) {
    prof(be, GLM_PROF_OTHER, "tanh_fwd");
    glmk_tanh_fwd(be->dtype, out, x, n, IM(be)->st);
    op_done(be, "tanh_fwd");
}
static void cu_tanh_bwd(glm_backend *be, void *dx, const void *out, const void *dout, size_t n) {
    prof(be, GLM_PROF_OTHER, "tanh_bwd");
    glmk_tanh_bwd(be->dtype, dx, out, dout, n, IM(be)->st);
    op_done(be, "tanh_bwd");
}
/* Quantized weights: dequantize feeds the GEMMs (a linear layer's weight in S, per use), qmatmul_fwd
 * is the decode GEMV on the packed bytes; both charged to the GEMM category. */
static void cu_dequantize(glm_backend *be, void *w, const void *q, int qtype, int OC, int C) {
    prof(be, GLM_PROF_GEMM, "dequantize");
    glmk_dequantize(be->dtype, w, q, qtype, OC, C, IM(be)->st);
    op_done(be, "dequantize");
}
static void cu_qmatmul_fwd(glm_backend *be, void *out, const void *inp, const void *q, int qtype, const void *bias,
                           int N, int C, int OC) {
    prof(be, GLM_PROF_GEMM, "qmatmul_fwd");
    glmk_qmatmul_fwd(be->dtype, out, inp, q, qtype, bias, N, C, OC, IM(be)->st);
    op_done(be, "qmatmul_fwd");
}
static void cu_ce(glm_backend *be, void *logits, float *losses, const int32_t *t, int R, int V, float dscale) {
    prof(be, GLM_PROF_OTHER, "cross_entropy");
    glmk_cross_entropy(be->dtype, logits, losses, t, R, V, dscale, IM(be)->st);
    op_done(be, "cross_entropy");
}
static void cu_gather(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) {
    prof(be, GLM_PROF_OTHER, "gather_rows");
    glmk_gather_rows(be->dtype, out, x, idx, R, C, IM(be)->st);
    op_done(be, "gather_rows");
}
static void cu_argmax(glm_backend *be, int32_t *out, const void *x, int R, int V) {
    prof(be, GLM_PROF_OTHER, "argmax_rows");
    int32_t *d = scratch(be, (size_t)R * sizeof(int32_t));
    glmk_argmax_rows(be->dtype, d, x, R, V, IM(be)->st);
    cu_download(be, out, d, (size_t)R * sizeof(int32_t));
    op_done(be, "argmax_rows");
}
static void cu_scatter(glm_backend *be, void *out, const void *x, const int32_t *idx, int R, int C) {
    prof(be, GLM_PROF_OTHER, "scatter_rows");
    glmk_scatter_rows(be->dtype, out, x, idx, R, C, IM(be)->st);
    op_done(be, "scatter_rows");
}
/* Each span's partials reduce into its own result slot (fixed order: deterministic) in two
 * launches per SSQ_SPANS spans; the slots come back in one download and are summed here in
 * span order. The span tables go up in the same stream (small, pinned-free copies). */
static double cu_add_sumsq_spans(glm_backend *be, void *x, const void *y, const size_t *yoff, const glm_span *s, int k) {
    prof(be, GLM_PROF_OPTIM, "sumsq");
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
    prof(be, GLM_PROF_OPTIM, "sumsq");
    cuda_impl *im = IM(be);
    glmk_sumsq(be->dtype, x, n, im->ssq, im->ssq + SSQ_PARTIALS, im->st);
    double r = 0;
    cu_download(be, &r, im->ssq + SSQ_PARTIALS, sizeof r);
    return r;
}
static void cu_adamw(glm_backend *be, void *param, float *master, const void *grad, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, float gs) {
    prof(be, GLM_PROF_OPTIM, "adamw");
    glmk_adamw(be->dtype, param, master, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, gs, IM(be)->st);
    op_done(be, "adamw");
}
static void cu_adamw8(glm_backend *be, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv,
                      float *absm, float *absv, size_t n, const uint8_t *bits, size_t flat0, float lr, float b1, float b2,
                      float eps, float wd, float bc1, float bc2, float gs) {
    prof(be, GLM_PROF_OPTIM, "adamw8");
    glm_adam8_scalars s = glm_adam8_prepare(lr, b1, b2, eps, wd, bc1, bc2); /* as the CPU op: same bits */
    glmk_adamw8(be->dtype, param, master, grad, qm, qv, absm, absv, n, bits, flat0, &s, gs, IM(be)->st);
    op_done(be, "adamw8");
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
    op_done(be, "fill_normal");
}
void glm_cuda_fill(glm_backend *be, void *p, size_t n, float value) {
    glmk_fill(be->dtype, p, n, value, IM(be)->st);
    op_done(be, "fill");
}

static void cu_destroy(glm_backend *be) {
    cuda_impl *im = IM(be);
    cudaStreamSynchronize(im->st);
    glm_cuda_copies_close(im->copies);
    for (int i = 0; i < GEMM_CACHE; i++) plan_destroy(&im->plans[i]);
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
    if (prop.major < 8) { /* the kernels use sm_80 instructions (mma.sync, cp.async, bf16) */
        if (errbuf)
            snprintf(errbuf, errlen, "GPU %d (%s) has compute capability %d.%d; glmtrain's CUDA kernels need 8.0 or newer%s",
                     device, prop.name, prop.major, prop.minor,
                     dtype == GLM_BF16 ? " (and bf16 needs it too: on older GPUs --fp16 is what PyTorch would use)" : "");
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
    im->force_simt = a && strcmp(a, "simt") == 0;
    im->use_wgmma = !im->force_simt && !(a && strcmp(a, "mma") == 0) && glmk_flash90_available(device);
    im->debug_sync = s && strcmp(s, "0") != 0 && s[0];
    const char *tn = getenv("GLM_CUDA_GEMM_TUNE");
    im->gemm_tune = !(tn && strcmp(tn, "0") == 0);
    CUDA_CHECK(cudaStreamCreateWithFlags(&im->st, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&im->lt));
    CUBLAS_CHECK(cublasCreate(&im->blas));
    CUBLAS_CHECK(cublasSetStream(im->blas, im->st));
    CUBLAS_CHECK(cublasSetMathMode(im->blas, CUBLAS_DEFAULT_MATH)); /* no TF32 */
    *be = (glm_backend){
        .name = im->name, .dtype = dtype, .impl = im,
        .alloc = cu_alloc, .free = cu_free, .zero = cu_zero, .copy = cu_copy,
        .upload_f32 = cu_up_f32, .download_f32 = cu_down_f32, .upload_cast = cu_up_cast, .upload = cu_upload, .download = cu_download,
        .sync = cu_sync,
        .embedding_fwd = cu_emb_fwd, .embedding_bwd = cu_emb_bwd, .layernorm_fwd = cu_ln_fwd, .layernorm_bwd = cu_ln_bwd,
        .matmul_fwd = cu_mm_fwd, .matmul_fwd_add = cu_mm_fwd_add, .matmul_fwd_gelu = cu_mm_fwd_gelu,
        .matmul_bwd_dgelu = cu_mm_bwd_dgelu, .matmul_bwd = cu_mm_bwd, .matmul_bwd_add = cu_mm_bwd_add, .rope = cu_rope,
        .rmsnorm_fwd = cu_rms_fwd, .rmsnorm_bwd = cu_rms_bwd, .rmsnorm_bwd_add = cu_rms_bwd_add, .swiglu_fwd = cu_swiglu_fwd, .swiglu_bwd = cu_swiglu_bwd,
        .rope_pairs = cu_rope_pairs, .copy_rows = cu_copy_rows, .attention_fwd = cu_attn_fwd,
        .attention_bwd = cu_attn_bwd, .gelu_fwd = cu_gelu_fwd, .gelu_bwd = cu_gelu_bwd, .scale_add = cu_scale_add, .mask_scale = cu_mask_scale,
        .lora_down = cu_lora_down, .lora_down_bwd = cu_lora_down_bwd,
        .cross_entropy = cu_ce, .argmax_rows = cu_argmax, .gather_rows = cu_gather, .scatter_rows = cu_scatter, .sumsq = cu_sumsq, .sumsq_spans = cu_sumsq_spans,
        .add_sumsq_spans = cu_add_sumsq_spans,
        .adamw = cu_adamw, .adamw8 = cu_adamw8,
        .prefix_kv = cu_prefix_kv, .prefix_kv_bwd = cu_prefix_kv_bwd, .tanh_fwd = cu_tanh_fwd, .tanh_bwd = cu_tanh_bwd,
        .dequantize = cu_dequantize, .qmatmul_fwd = cu_qmatmul_fwd,
        .destroy = cu_destroy, .to_f32 = cu_to_f32,
        .host_alloc = cu_host_alloc, .host_free = cu_host_free, .copy_async = cu_copy_async, .copy_wait = cu_copy_wait,
        .compute_wait = cu_compute_wait,
    };
    im->workspace = cu_alloc(be, WORKSPACE_BYTES);
    im->ssq = cu_alloc(be, (SSQ_PARTIALS + SSQ_SPANS) * sizeof(double));
    im->ssq_spans = cu_alloc(be, SSQ_SPANS * sizeof(glm_span));
    im->ssq_yoff = cu_alloc(be, SSQ_SPANS * sizeof(size_t));
    return be;
}
#endif
