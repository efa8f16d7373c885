/* How far cuBLASLt's first heuristic pick is from the fastest of its candidates, for the
 * products of a ChatGLM-6B training step (bf16, fp32 accumulate, the layouts and epilogues
 * cuda_backend.c's gemm_epi uses). For each product: the candidates the heuristic returns (up to
 * --algos), each timed over --reps launches after warm-up; prints the first pick's time, the
 * fastest, its rank, and TFLOP/s.
 * --sustain MS: each candidate also runs back to back for MS ms after an idle pause of --cool MS
 * (default 400), and prints its speed in the first 10 launches (clocks not yet lowered by the
 * power limit) and over the last quarter of the MS (held at the limit), with its tile and
 * cluster ids: a step of back-to-back products runs at the second figure, and the ranking of
 * the two can differ. --only SUBSTR limits the products to names holding SUBSTR.
 *   bench_gemm [--tokens N] [--algos K] [--reps R] [--sustain MS [--cool MS]] [--only SUBSTR] [--out FILE.jsonl] */
#include <unistd.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d cublasLt status %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)

enum { EPI_NONE, EPI_BIAS, EPI_GELU_AUX_BIAS, EPI_DGELU };
static const char *epi_name[] = {"none", "bias", "gelu_aux_bias", "dgelu"};

typedef struct { const char *name; int ta, tb, m, n, k; int epi; float beta; } prod;

static float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                       cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, const void *A, const void *B, void *D,
                       float beta, void *ws, size_t wsb, int reps, cudaStream_t st) {
    float alpha = 1.0f, ms = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        if (cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, algo, ws, wsb, st) != CUBLAS_STATUS_SUCCESS)
            return -1;
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++) cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, algo, ws, wsb, st);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / reps;
}

/* Launches of one candidate for `ms` ms after `cool` ms idle: the speed of the first 10 and of
 * the launches in the last quarter (both ms a launch) */
static void sustain_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                         cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, const void *A, const void *B, void *D,
                         float beta, void *ws, size_t wsb, int ms, int cool, cudaStream_t st, float *burst, float *held) {
    float alpha = 1.0f, el = 0, tail = 0;
    int tail_n = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    usleep(cool * 1000);
    *burst = *held = -1;
    for (int w = 0; el < ms; w++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 10; i++)
            if (cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, algo, ws, wsb, st) != CUBLAS_STATUS_SUCCESS)
                goto done;
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (w == 0) *burst = t / 10;
        el += t;
        if (el > 0.75f * ms) { tail += t; tail_n += 10; }
    }
    if (tail_n) *held = tail / tail_n;
done:
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    int N = 4096, K = 16, reps = 20, sustain = 0, cool = 400;
    const char *out = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--algos") && i + 1 < argc) K = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--sustain") && i + 1 < argc) sustain = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cool") && i + 1 < argc) cool = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gemm [--tokens N] [--algos K] [--reps R] [--sustain MS [--cool MS]] [--only SUBSTR] [--out FILE]\n");
            return 2;
        }
    }
    if (K > 64) K = 64;
    int H = 4096, F = 16384, Q = 12288, V = 130528, HC = 2048;
    /* column-major D[m,n] = op(A) op(B), as gemm_epi: forward (1,0,OC,N,C), input gradient
     * (0,0,C,N,OC), weight gradient (0,1,C,OC,N) accumulating (beta 1) */
    prod ps[] = {
        {"fwd qkv", 1, 0, Q, N, H, EPI_BIAS, 0}, {"fwd qkv+lora", 1, 0, Q, N, H, EPI_BIAS, 1}, {"fwd dense+res", 1, 0, H, N, H, EPI_BIAS, 1},
        {"fwd fc1 gelu", 1, 0, F, N, H, EPI_GELU_AUX_BIAS, 0}, {"fwd fc1 plain", 1, 0, F, N, H, EPI_BIAS, 0},
        {"fwd fc2+res", 1, 0, H, N, F, EPI_BIAS, 1}, {"fwd head chunk", 1, 0, V, HC, H, EPI_NONE, 0},
        {"dinp qkv", 0, 0, H, N, Q, EPI_NONE, 0}, {"dinp dense", 0, 0, H, N, H, EPI_NONE, 0},
        {"dinp fc1", 0, 0, H, N, F, EPI_NONE, 0}, {"dinp fc1+res", 0, 0, H, N, F, EPI_NONE, 1},
        {"dinp dense+res", 0, 0, H, N, H, EPI_NONE, 1}, {"dinp fc2 dgelu", 0, 0, F, N, H, EPI_DGELU, 0},
        {"dinp fc2 plain", 0, 0, F, N, H, EPI_NONE, 0}, {"dinp head chunk", 0, 0, H, HC, V, EPI_NONE, 0},
        {"dw qkv", 0, 1, H, Q, N, EPI_NONE, 1}, {"dw dense", 0, 1, H, H, N, EPI_NONE, 1},
        {"dw fc1", 0, 1, H, F, N, EPI_NONE, 1}, {"dw fc2", 0, 1, F, H, N, EPI_NONE, 1},
        {"dw head chunk", 0, 1, H, V, HC, EPI_NONE, 1},
    };
    size_t maxe = (size_t)V * H;
    if ((size_t)N * F > maxe) maxe = (size_t)N * F;
    void *A, *B, *D, *aux, *bias, *ws;
    size_t wsb = 32u << 20;
    CK(cudaMalloc(&A, maxe * 2));
    CK(cudaMalloc(&B, maxe * 2));
    CK(cudaMalloc(&D, maxe * 2));
    CK(cudaMalloc(&aux, (size_t)N * F * 2));
    CK(cudaMalloc(&bias, (size_t)V * 2));
    CK(cudaMalloc(&ws, wsb));
    /* small values (bf16 bit patterns of magnitude < 1): timing does not depend on them, but
     * denormals or inf would */
    uint16_t *h = malloc(maxe * 2);
    uint32_t s = 12345;
    for (size_t i = 0; i < maxe; i++) { s = s * 1664525u + 1013904223u; h[i] = (uint16_t)(0x3c00 + (s >> 24)) ^ ((s >> 16) & 0x8000); }
    CK(cudaMemcpy(A, h, maxe * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, h, maxe * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D, h, maxe * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(aux, h, (size_t)N * F * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bias, h, (size_t)V * 2, cudaMemcpyHostToDevice));
    free(h);
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    FILE *fo = out ? fopen(out, "a") : NULL;
    printf("%-18s %6s %6s %6s %-14s %5s | %9s %9s %5s %7s %7s %6s\n", "product", "m", "n", "k", "epilogue", "algos",
           "first_ms", "best_ms", "rank", "TF_1st", "TF_best", "gain");
    double tot1 = 0, totb = 0;
    for (size_t p = 0; p < sizeof ps / sizeof ps[0]; p++) {
        prod *q = &ps[p];
        if (only && !strstr(q->name, only)) continue;
        cublasLtMatmulDesc_t op;
        cublasLtMatrixLayout_t la, lb, ld;
        LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t opa = q->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = q->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
        cublasLtEpilogue_t e = q->epi == EPI_BIAS ? CUBLASLT_EPILOGUE_BIAS : q->epi == EPI_GELU_AUX_BIAS ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                               : q->epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT;
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
        if (q->epi == EPI_BIAS || q->epi == EPI_GELU_AUX_BIAS)
            LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        if (q->epi == EPI_GELU_AUX_BIAS || q->epi == EPI_DGELU) {
            int64_t l = q->m;
            LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &l, sizeof l));
            LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        }
        int lda = q->ta ? q->k : q->m, ldb = q->tb ? q->n : q->k;
        LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, q->ta ? q->k : q->m, q->ta ? q->m : q->k, lda));
        LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, q->tb ? q->n : q->k, q->tb ? q->k : q->n, ldb));
        LK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, q->m, q->n, q->m));
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t w = wsb;
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof w));
        cublasLtMatmulHeuristicResult_t res[64];
        int nres = 0;
        LK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, K, res, &nres));
        double flop = 2.0 * q->m * q->n * q->k;
        float first = -1, best = 1e30f;
        int rank = -1;
        for (int i = 0; i < nres; i++) {
            float t = time_algo(lt, op, la, lb, ld, &res[i].algo, A, B, D, q->beta, ws, wsb, reps, st);
            if (i == 0) first = t;
            if (t > 0 && t < best) { best = t; rank = i; }
        }
        for (int i = 0; sustain > 0 && i < nres; i++) {
            float b, hd;
            int tile = -1, cl = -1, stages = -1;
            size_t sz;
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sz);
            cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl, &sz);
            sustain_algo(lt, op, la, lb, ld, &res[i].algo, A, B, D, q->beta, ws, wsb, sustain, cool, st, &b, &hd);
            printf("  %-16s cand %2d tile %3d stages %3d cluster %2d: burst %7.0f TF/s, held %7.0f TF/s\n", q->name, i, tile,
                   stages, cl, b > 0 ? flop / b / 1e9 : 0, hd > 0 ? flop / hd / 1e9 : 0);
            if (fo)
                fprintf(fo, "{\"product\": \"%s\", \"candidate\": %d, \"tile\": %d, \"stages\": %d, \"cluster\": %d, "
                            "\"burst_ms\": %.4f, \"held_ms\": %.4f, \"sustain_ms\": %d}\n",
                        q->name, i, tile, stages, cl, b, hd, sustain);
        }
        tot1 += first;
        totb += best;
        printf("%-18s %6d %6d %6d %-14s %5d | %9.3f %9.3f %5d %7.0f %7.0f %5.1f%%\n", q->name, q->m, q->n, q->k,
               epi_name[q->epi], nres, first, best, rank, flop / first / 1e9, flop / best / 1e9, 100.0 * (first - best) / first);
        if (fo)
            fprintf(fo, "{\"product\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"epilogue\": \"%s\", \"beta\": %g, \"algos\": %d, "
                        "\"first_ms\": %.4f, \"best_ms\": %.4f, \"best_rank\": %d}\n",
                    q->name, q->m, q->n, q->k, epi_name[q->epi], q->beta, nres, first, best, rank);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
    }
    printf("sum of one of each: first %.3f ms, best %.3f ms (%.1f%%)\n", tot1, totb, 100.0 * (tot1 - totb) / tot1);
    if (fo) fclose(fo);
    return 0;
}
