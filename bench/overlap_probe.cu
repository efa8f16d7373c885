// Overlap probe (2 GPUs, one process): how much does gradient communication running beside
// backward-shaped bf16 GEMMs slow those GEMMs, by transport? Answers why data parallel's
// backward stretches by 14-18 ms on W1 (docs/PERF.md) before anyone builds a new transport.
//
// Each GPU runs the same GEMM loop (the four GEMM shapes of one ChatGLM-6B layer's backward at
// 4096 tokens) on its compute stream, and beside it, on a high-priority stream, one of:
//   nccl        31 reduce-scatters of 400 MiB bf16 buckets (W1's gradients, 12.4 GB)
//   nccl-ctaN   the same on a communicator capped at N CTAs (ncclConfig_t.maxCTAs)
//   ce          the same bytes moved by the copy engines (cudaMemcpyPeerAsync of each bucket's
//               peer half) plus a bf16 add kernel per bucket: a reduce-scatter with no SMs held
//               while data moves
//   ce-copy     the copies alone
//   spin-N      a kernel of N CTAs that only spins as long as the GEMM loop lasts (SMs held,
//               no memory traffic)
// and prints the GEMM loop's time and the communication's time, alone and together.
//   nvcc -O3 -arch=sm_90 bench/overlap_probe.cu -lcublas -lnccl -o overlap_probe && ./overlap_probe
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #call, (int)s_); exit(1); } } while (0)
#define CKN(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); exit(1); } } while (0)

enum { NGPU = 2, NBUCKET = 31, LOOPS = 40 };
static const size_t BUCKET = 400ull << 20;            // bytes per bucket (bf16 elements * 2)
static const int T = 4096, H = 4096, F = 16384;       // tokens, hidden, FFN inner

struct gpu {
    cudaStream_t compute, comm;
    cublasHandle_t blas;
    __nv_bfloat16 *a, *b, *c;   // GEMM operands: a [F*H], b [T*F], c [T*F]
    __nv_bfloat16 *grad;        // [NBUCKET * BUCKET/2] gradient buckets
    __nv_bfloat16 *recv;        // [BUCKET/2 / 2] one bucket's received half (reduce-scatter output)
    __nv_bfloat16 *peer_in;     // [NBUCKET * BUCKET/4] landing zone for the peer's halves (ce)
    cudaEvent_t t0, g1, c1;
    int *spin_stop;             // set by the host-free trick below: spin kernels poll it
};

__global__ void add_bf16(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *y, size_t n) {
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8, stride = (size_t)gridDim.x * blockDim.x * 8;
    for (; i + 8 <= n; i += stride) {
        uint4 u = *(const uint4 *)(x + i), v = *(const uint4 *)(y + i), w;
        const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u, *q = (const __nv_bfloat162 *)&v;
        __nv_bfloat162 *r = (__nv_bfloat162 *)&w;
        for (int k = 0; k < 4; k++) r[k] = __hadd2(p[k], q[k]);
        *(uint4 *)(out + i) = w;
    }
}

__global__ void fill(__nv_bfloat16 *x, size_t n, unsigned seed) { // values in [-1, 1): real GEMM power, not zeros
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
    }
}

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

static void gemm_loop(struct gpu *g) { // one layer's backward GEMMs, LOOPS times (~ LOOPS layers)
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < LOOPS; l++) {
        int shapes[4][3] = {{H, T, F}, {F, H, T}, {F, T, H}, {H, F, T}}; // m, n, k (column-major)
        for (int s = 0; s < 4; s++) {
            int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            CKB(cublasGemmEx(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, g->a, CUDA_R_16BF, m, g->b, CUDA_R_16BF, k,
                             &zero, g->c, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
}

static void comm_nccl(struct gpu *gs, ncclComm_t *comms) {
    size_t n = BUCKET / 2 / NGPU; // elements each rank keeps per bucket
    for (int b = 0; b < NBUCKET; b++) {
        CKN(ncclGroupStart());
        for (int d = 0; d < NGPU; d++)
            CKN(ncclReduceScatter(gs[d].grad + b * (BUCKET / 2), gs[d].recv, n, ncclBfloat16, ncclSum, comms[d], gs[d].comm));
        CKN(ncclGroupEnd());
    }
}

static void comm_ce(struct gpu *gs, int with_add) {
    size_t half = BUCKET / 2 / NGPU; // elements: rank d keeps half d of each bucket
    for (int b = 0; b < NBUCKET; b++)
        for (int d = 0; d < NGPU; d++) {
            int p = 1 - d; // peer gets our copy of its half
            CK(cudaSetDevice(d));
            CK(cudaMemcpyPeerAsync(gs[p].peer_in + b * half, p, gs[d].grad + b * (BUCKET / 2) + p * half, d,
                                   half * 2, gs[d].comm));
        }
    if (!with_add) return;
    // each rank adds the peer's half into its own (a real transport would wait for the peer's
    // copy of bucket b with a flag; here stream order on the sender side is enough for timing)
    for (int b = 0; b < NBUCKET; b++)
        for (int d = 0; d < NGPU; d++) {
            CK(cudaSetDevice(d));
            __nv_bfloat16 *mine = gs[d].grad + b * (BUCKET / 2) + d * half;
            add_bf16<<<264, 256, 0, gs[d].comm>>>(mine, mine, gs[d].peer_in + b * half, half);
        }
}

static float ms(cudaEvent_t a, cudaEvent_t b) { float t; CK(cudaEventElapsedTime(&t, a, b)); return t; }

// mode: 0 gemm alone, 1 comm alone, 2 both
static void run(const char *name, struct gpu *gs, ncclComm_t *comms, int kind, int spin_ctas, int mode) {
    for (int d = 0; d < NGPU; d++) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); CK(cudaEventRecord(gs[d].t0, gs[d].compute));
        CK(cudaStreamWaitEvent(gs[d].comm, gs[d].t0, 0)); }
    if (mode != 1) for (int d = 0; d < NGPU; d++) { CK(cudaSetDevice(d)); gemm_loop(&gs[d]); }
    if (mode != 0) {
        if (kind == 0) comm_nccl(gs, comms);
        else if (kind == 1) comm_ce(gs, 1);
        else if (kind == 2) comm_ce(gs, 0);
        else for (int d = 0; d < NGPU; d++) { CK(cudaSetDevice(d)); spin<<<spin_ctas, 128, 0, gs[d].comm>>>(1980LL * 1000 * 150); }
    }
    for (int d = 0; d < NGPU; d++) { CK(cudaSetDevice(d)); CK(cudaEventRecord(gs[d].g1, gs[d].compute)); CK(cudaEventRecord(gs[d].c1, gs[d].comm)); }
    for (int d = 0; d < NGPU; d++) { CK(cudaSetDevice(d)); CK(cudaDeviceSynchronize()); }
    printf("%-12s %-10s", name, mode == 0 ? "gemm" : mode == 1 ? "comm" : "both");
    for (int d = 0; d < NGPU; d++)
        printf("  gpu%d gemm %7.2f ms comm %7.2f ms", d, mode == 1 ? 0.f : ms(gs[d].t0, gs[d].g1), mode == 0 ? 0.f : ms(gs[d].t0, gs[d].c1));
    printf("\n");
    fflush(stdout);
}

int main(void) {
    struct gpu gs[NGPU];
    int devs[NGPU] = {0, 1};
    ncclComm_t comms[NGPU], capped[3][NGPU];
    int caps[3] = {4, 8, 16};
    for (int d = 0; d < NGPU; d++) {
        struct gpu *g = &gs[d];
        CK(cudaSetDevice(d));
        int lo, hi;
        CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        CK(cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithPriority(&g->comm, cudaStreamNonBlocking, hi));
        CKB(cublasCreate(&g->blas));
        CKB(cublasSetStream(g->blas, g->compute));
        CK(cudaMalloc(&g->a, (size_t)F * H * 2)); CK(cudaMalloc(&g->b, (size_t)T * F * 2)); CK(cudaMalloc(&g->c, (size_t)T * F * 2));
        fill<<<1024, 256>>>(g->a, (size_t)F * H, 1 + d); fill<<<1024, 256>>>(g->b, (size_t)T * F, 7 + d);
        CK(cudaMalloc(&g->grad, NBUCKET * BUCKET)); CK(cudaMemset(g->grad, 0, NBUCKET * BUCKET));
        CK(cudaMalloc(&g->recv, BUCKET / NGPU));
        CK(cudaMalloc(&g->peer_in, NBUCKET * BUCKET / NGPU)); CK(cudaMemset(g->peer_in, 0, NBUCKET * BUCKET / NGPU));
        CK(cudaEventCreate(&g->t0)); CK(cudaEventCreate(&g->g1)); CK(cudaEventCreate(&g->c1));
        if (cudaDeviceEnablePeerAccess(1 - d, 0) != cudaSuccess) { printf("no peer access %d->%d\n", d, 1 - d); return 1; }
    }
    CKN(ncclCommInitAll(comms, NGPU, devs));
    for (int c = 0; c < 3; c++) {
        ncclUniqueId id;
        CKN(ncclGetUniqueId(&id));
        CKN(ncclGroupStart());
        for (int d = 0; d < NGPU; d++) {
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.maxCTAs = caps[c]; cfg.minCTAs = 1;
            CK(cudaSetDevice(d));
            CKN(ncclCommInitRankConfig(&capped[c][d], NGPU, id, d, &cfg));
        }
        CKN(ncclGroupEnd());
    }
    // warm up every path once
    run("warmup", gs, comms, 0, 0, 2); run("warmup", gs, comms, 1, 0, 2);
    run("gemm", gs, comms, 0, 0, 0);
    run("gemm", gs, comms, 0, 0, 0);
    for (int rep = 0; rep < 2; rep++) {
        run("nccl", gs, comms, 0, 0, 1); run("nccl", gs, comms, 0, 0, 2);
        for (int c = 0; c < 3; c++) {
            char nm[32]; snprintf(nm, sizeof nm, "nccl-cta%d", caps[c]);
            run(nm, gs, capped[c], 0, 0, 1); run(nm, gs, capped[c], 0, 0, 2);
        }
        run("ce", gs, comms, 1, 0, 1); run("ce", gs, comms, 1, 0, 2);
        run("ce-copy", gs, comms, 2, 0, 1); run("ce-copy", gs, comms, 2, 0, 2);
        int spins[3] = {4, 24, 66};
        for (int s = 0; s < 3; s++) { char nm[32]; snprintf(nm, sizeof nm, "spin-%d", spins[s]); run(nm, gs, comms, 3, spins[s], 2); }
        run("gemm", gs, comms, 0, 0, 0);
    }
    return 0;
}
