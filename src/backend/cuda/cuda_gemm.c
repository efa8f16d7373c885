/* The CUDA backend's products (backend.h matmul_*) on cuBLASLt: fp32 accumulation, the bias,
 * GELU and beta epilogues, a plan cached per shape and layout, and the first call's timing of
 * the heuristic's candidates; products of inner size <= 16 (LoRA's B side) on the kernels of
 * k_lora.cu. Compiled to nothing without GLM_HAVE_CUDA. */
#ifdef GLM_HAVE_CUDA
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_gemm.h"

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
 * gradient of query_key_value, the weight gradient of dense_4h_to_h). So up to
 * GEMM_TUNE_CANDIDATES of them are timed on a call's own operands, and the fastest kept, but the
 * first pick unless another beats it by 3%: a margin meant to keep timing noise from making two
 * runs (or a run and its resumption) pick differently; --full_determinism is what guarantees
 * it. The timing launches the product ~48 times, so it is done once per shape class: the
 * products that differ only in their number of rows within a power of two (class_key). Real
 * batches change the rows of every product from step to step (each batch its own number of
 * supervised tokens in the head and the top layer, and with dynamic padding its own length
 * everywhere); timing each new shape cost a step several times its products, so a class is timed
 * at its GEMM_TUNE_AFTER-th call (a step's layers get there in the first step, the head in the
 * second) and every later shape of it takes the class's pick where cuBLASLt accepts it for that
 * shape (cublasLtMatmulAlgoCheck), the heuristic's first pick before that. Plans and classes are
 * evicted least recently used first. A product that accumulates into D is timed on a copy of D
 * put back afterwards: a transient allocation of at most GEMM_TUNE_SAVE_MAX (skipped, with the
 * first pick, for a larger D or when no memory is free for it). Only where the shapes repeat
 * (be->tune_products: training; a server's prompts come in every length); off under
 * --full_determinism (the heuristic's pick alone) and with GLM_CUDA_GEMM_TUNE=0 (=N: at a
 * class's Nth call; the GPU op tests take 1, to test the kernels a run would pick). */
/* The per-call pointers of a plan's epilogue: its bias (DGELU takes none) and aux matrix. */
static void set_epilogue_ptrs(gemm_plan *p, const void *bias, int epi, const void *aux) {
    if (bias && epi != EPI_DGELU)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epi != EPI_NONE)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
}

#define GEMM_TUNE_SAVE_MAX ((size_t)256 << 20) /* the largest D copied aside (a weight gradient of dense_h_to_4h: 128 MiB) */
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
    int pick = 0, first = -1; /* first: the heuristic's best-ranked candidate that runs */
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
        if (first < 0) { first = pick = i; t0 = best = med; }
        else if (med < best) { best = med; pick = i; }
    }
    if (pick != first && best > 0.97f * t0) pick = first;
    for (int j = 0; j < nev; j++) cudaEventDestroy(ev[j]);
    if (save) {
        CUDA_CHECK(cudaMemcpyAsync(D, save, dbytes, cudaMemcpyDeviceToDevice, im->st));
        CUDA_CHECK(cudaFree(save)); /* waits for the copy */
    }
    return pick;
}

/* A plan key's class: the two sizes a batch's rows can set (n, the rows of a product or its input
 * gradient; k, those a weight gradient sums over) rounded up to a power of two. */
static void class_key(const int key[18], int out[18]) {
    memcpy(out, key, 18 * sizeof(int));
    for (int i = 3; i <= 4; i++) {
        int v = 1;
        while (v < out[i] && v < (1 << 30)) v <<= 1;
        out[i] = v;
    }
}

static gemm_class *class_of(cuda_impl *im, const int key[18]) {
    int ck[18];
    class_key(key, ck);
    gemm_class *c = NULL, *free_one = NULL, *oldest = &im->classes[0];
    for (int i = 0; i < GEMM_CLASSES && !c; i++) {
        gemm_class *x = &im->classes[i];
        if (x->used && memcmp(x->key, ck, sizeof ck) == 0) c = x;
        else if (!x->used && !free_one) free_one = x;
        else if (x->used && x->last_use < oldest->last_use) oldest = x;
    }
    if (!c) {
        c = free_one ? free_one : oldest;
        memset(c, 0, sizeof *c);
        c->used = 1;
        memcpy(c->key, ck, sizeof ck);
    }
    return c;
}

/* The class's timed pick for plan p, when cuBLASLt accepts it for p's shape. */
static int adopt_class_algo(cuda_impl *im, gemm_plan *p, const gemm_class *c) {
    cublasLtMatmulHeuristicResult_t r;
    if (cublasLtMatmulAlgoCheck(im->lt, p->op, p->a, p->b, p->d, p->d, &c->algo, &r) != CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > WORKSPACE_BYTES)
        return 0;
    p->algo = c->algo;
    return 1;
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
        if (!p) { /* the least recently used: a step's own products stay, the batches' passing shapes go */
            p = &im->plans[0];
            for (int i = 1; i < GEMM_CACHE; i++) if (im->plans[i].last_use < p->last_use) p = &im->plans[i];
            plan_destroy(p);
        }
        memset(p, 0, sizeof *p);
        im->gemm_plans++;
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
        int nres = 0, tune = im->gemm_tune > 0 && be->tune_products && !be->deterministic;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(im->lt, p->op, p->a, p->b, p->d, p->d, pref,
                                                          tune ? GEMM_TUNE_CANDIDATES : 1, p->cand, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        p->have_algo = s == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (p->have_algo) p->algo = p->cand[0].algo;
        p->ncand = p->have_algo && nres > 1 ? nres : 0;
    }
    p->last_use = ++im->gemm_clock;
    if (p->ncand) { /* a plan with candidates, in training: its class decides */
        gemm_class *c = class_of(im, key);
        c->last_use = im->gemm_clock;
        if (c->tuned) {
            adopt_class_algo(im, p, c); /* or the heuristic's pick, if this shape cannot take it */
            p->ncand = 0;
        } else if (++c->calls >= im->gemm_tune) { /* the class comes again: time its candidates now */
            set_epilogue_ptrs(p, bias, epi, aux);
            p->algo = p->cand[gemm_tune(be, p, p->cand, p->ncand, A, B, Cin, D, dbytes, beta)].algo;
            c->algo = p->algo;
            c->tuned = 1;
            p->ncand = 0;
            im->gemm_tuned++;
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
    glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 0, C, OC));
    /* a sum of a few terms (LoRA's B product): a write of out, at memory speed off cuBLAS */
    if (bias || !glmk_small_k_fwd(be->dtype, out, inp, w, N, C, OC, IM(be)->st))
        gemm(be, 1, 0, OC, N, C, w, C, inp, C, out, OC, 0.0f, bias, NULL);
    glm_cuda_op_done(be, "matmul_fwd");
}
static void cu_mm_fwd_add(glm_backend *be, void *out, const void *inp, const void *w, const void *bias, const void *res,
                          float res_scale, int N, int C, int OC) {
    glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 0, C, OC));
    gemm(be, 1, 0, OC, N, C, w, C, inp, C, out, OC, res_scale, bias, res);
    glm_cuda_op_done(be, "matmul_fwd_add");
}

static void cu_mm_fwd_gelu(glm_backend *be, void *act, void *pre, const void *inp, const void *w, const void *bias, int N,
                           int C, int OC) {
    glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 0, C, OC));
    gemm_epi(be, 1, 0, OC, N, C, w, C, inp, C, act, OC, 0.0f, bias, NULL, EPI_GELU_AUX, pre);
    glm_cuda_op_done(be, "matmul_fwd_gelu");
}
static void cu_mm_bwd_dgelu(glm_backend *be, void *dinp, const void *dout, const void *w, const void *pre, int N, int C,
                            int OC) {
    glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 1, C, OC));
    gemm_epi(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, 0.0f, NULL, NULL, EPI_DGELU, (void *)pre);
    glm_cuda_op_done(be, "matmul_bwd_dgelu");
}

static void cu_mm_bwd_add(glm_backend *be, void *dinp, const void *dout, const void *w, const void *res, float res_scale,
                          int N, int C, int OC) {
    glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 1, C, OC));
    gemm(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, res_scale, NULL, res);
    glm_cuda_op_done(be, "matmul_bwd_add");
}

static void cu_mm_bwd(glm_backend *be, void *dinp, void *dw, void *dbias, const void *dout, const void *inp,
                      const void *w, int N, int C, int OC, int acc) {
    /* sums over a few columns (LoRA's B side, C the rank): both products in one read of dout,
     * where cuBLAS reads it once for each (nothing is launched when the kernel does not take it) */
    if (dinp && dw && !dbias && C <= 16) {
        glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 1, C, OC));
        float *s = glm_cuda_scratch(be, glmk_small_k_bwd_scratch(N, C, OC) * sizeof(float));
        if (glmk_small_k_bwd(be->dtype, dinp, dw, dout, inp, w, N, C, OC, acc, s, IM(be)->st)) {
            glm_cuda_op_done(be, "matmul_bwd");
            return;
        }
    }
    /* dinp^T[C,N] = w^T[C,OC] dout^T[OC,N] */
    if (dinp) {
        glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 1, C, OC));
        gemm(be, 0, 0, C, N, OC, w, C, dout, OC, dinp, C, acc ? 1.0f : 0.0f, NULL, NULL);
    }
    /* dw^T[C,OC] += inp^T[C,N] dout[N,OC] */
    if (dw) {
        glm_cuda_prof(be, GLM_PROF_GEMM, glm_cuda_mm_label(be, 2, C, OC));
        gemm(be, 0, 1, C, OC, N, inp, C, dout, OC, dw, C, 1.0f, NULL, NULL);
    }
    if (dbias) glm_cuda_prof(be, GLM_PROF_GEMM, "bias_grad");
    if (dbias) glmk_bias_grad(be->dtype, dbias, dout, N, OC, glm_cuda_scratch(be, glmk_colsum_scratch(N, OC) * sizeof(float)), IM(be)->st);
    glm_cuda_op_done(be, "matmul_bwd");
}

void glm_cuda_gemm_to_f32(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb,
                          float *D, int ldd) {
    cuda_impl *im = IM(be);
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t t = cuda_type(be->dtype);
    CUBLAS_CHECK(cublasGemmEx(im->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, A, t,
                              lda, B, t, ldb, &zero, D, CUDA_R_32F, ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C in float32 (cpu_sgemm's convention): cuBLAS's
 * column-major C^T = op(B)^T op(A)^T, so the operands swap. */
static void cu_sgemm(glm_backend *be, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
    cuda_impl *im = IM(be);
    CUBLAS_CHECK(cublasGemmEx(im->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                              CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    glm_cuda_op_done(be, "sgemm");
}

void glm_cuda_gemm_bind(glm_backend *be) {
    be->sgemm = cu_sgemm;
    be->matmul_fwd = cu_mm_fwd;
    be->matmul_fwd_add = cu_mm_fwd_add;
    be->matmul_fwd_gelu = cu_mm_fwd_gelu;
    be->matmul_bwd_dgelu = cu_mm_bwd_dgelu;
    be->matmul_bwd = cu_mm_bwd;
    be->matmul_bwd_add = cu_mm_bwd_add;
}

void glm_cuda_gemm_counts(glm_backend *be, long *plans, long *tuned) {
    *plans = IM(be)->gemm_plans;
    *tuned = IM(be)->gemm_tuned;
}

void glm_cuda_gemm_free(cuda_impl *im) {
    for (int i = 0; i < GEMM_CACHE; i++) plan_destroy(&im->plans[i]);
}
#endif
