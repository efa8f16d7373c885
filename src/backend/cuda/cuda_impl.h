/* The CUDA backend's own state and helpers, shared by its host files: cuda_impl.c (checked
 * calls, the debug sync, scratch, the profiler), cuda_gemm.c (the products on cuBLASLt) and
 * cuda_backend.c (the op table, memory, lifetime). Not for use outside this folder: the rest of
 * the program sees backend.h and cuda_backend.h. */
#ifndef GLM_CUDA_IMPL_H
#define GLM_CUDA_IMPL_H
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_copy.h"
#include "backend/cuda/cuda_kernels.h"

#define GEMM_CACHE 256
#define GEMM_TUNE_CANDIDATES 8
#define GEMM_TUNE_ROUNDS 5
#define GEMM_TUNE_AFTER 2   /* a shape class's candidates are timed at its second call (cuda_gemm.c) */
#define GEMM_CLASSES 64
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
    long last_use; /* cuda_impl.gemm_clock at its latest call: the least recently used plan goes first */
    int ncand;     /* the heuristic's candidates, best first, while the plan's class has not chosen
                    * (0: algo is final: timed, taken from its class, or the only candidate) */
    cublasLtMatmulHeuristicResult_t cand[GEMM_TUNE_CANDIDATES];
} gemm_plan;

/* Products whose shapes differ only in the number of rows within a power of two (cuda_gemm.c
 * class_key): one timing of the candidates serves them all. */
typedef struct gemm_class {
    int used;
    int key[18];
    int calls;
    int tuned;     /* algo is the timed pick of one of its plans */
    long last_use;
    cublasLtMatmulAlgo_t algo;
} gemm_class;

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
    gemm_class classes[GEMM_CLASSES];
    long gemm_clock;            /* products made: the plans' and classes' recency */
    long gemm_plans, gemm_tuned; /* plans made and plans timed, since the backend began */
    int cc;          /* compute capability, 10 * major + minor (75 under GLM_CUDA_TURING=1: no bf16, no TF32) */
    int smem_max;    /* shared memory a block may take (Turing: 64 KiB, also under GLM_CUDA_TURING=1) */
    int force_simt;  /* GLM_CUDA_ATTN=simt: attention without tensor cores */
    int use_wgmma;   /* the sm_90a attention kernels (k_flash90.cu): a 9.0 device, unless GLM_CUDA_ATTN=mma */
    int debug_sync;  /* GLM_CUDA_SYNC=1: synchronise and check after every op */
    int gemm_tune;   /* time the heuristic's candidates at a shape class's call number gemm_tune (0: never;
                      * GLM_CUDA_GEMM_TUNE=N, default GEMM_TUNE_AFTER) */
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

static inline cuda_impl *IM(glm_backend *be) { return (cuda_impl *)be->impl; }

/* checked calls: a failure stops the program with the call, its place and what to do */
#define CUDA_CHECK(call) glm_cuda_check_at((call), #call, __FILE__, __LINE__)
void glm_cuda_cublas_check_at(int status, const char *what, const char *file, int line);
#define CUBLAS_CHECK(call) glm_cuda_cublas_check_at((int)(call), #call, __FILE__, __LINE__)

/* the profiler's mark before an op (category cat; op names it in detail mode), and a label for a
 * product of one shape class (kind 0 forward, 1 input gradient, 2 weight gradient) */
void glm_cuda_prof(glm_backend *be, int cat, const char *op);
const char *glm_cuda_mm_label(glm_backend *be, int kind, int C, int OC);
/* after each op: in GLM_CUDA_SYNC mode, wait and report the op by name */
void glm_cuda_op_done(glm_backend *be, const char *op);
/* the backend's scratch of at least `bytes` (grown as needed; one user at a time) */
void *glm_cuda_scratch(glm_backend *be, size_t bytes);

#endif
