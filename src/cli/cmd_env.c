/* `glmtrain env`: the environment check the fine-tuning guides ask users to do by hand, in one
 * command — CUDA runtime/driver, cuBLAS and NCCL versions, every visible GPU (name, memory,
 * compute capability, bf16), peer access between them, a small kernel on each GPU checked
 * against the CPU, and an NCCL all-reduce when there are two or more. Each line: ok / FAILED. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "backend/backend.h"
#include "cli/commands.h"
#include "core/rng.h"

static int line(int ok, const char *what, const char *detail) {
    printf("  %-8s %-28s %s\n", ok ? "ok" : "FAILED", what, detail);
    return ok ? 0 : 1;
}

/* A 64x96x80 matmul on a backend against the CPU twin. */
static int check_backend(glm_backend *be, char *detail, size_t n) {
    int N = 64, C = 96, OC = 80;
    float *x = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * OC * C), *ref = malloc(sizeof(float) * N * OC);
    float *got = malloc(sizeof(float) * N * OC);
    glm_rng r;
    glm_rng_seed(&r, 1);
    for (int i = 0; i < N * C; i++) x[i] = glm_rng_normal(&r);
    for (int i = 0; i < OC * C; i++) w[i] = glm_rng_normal(&r);
    glm_backend *cpu = glm_backend_cpu();
    cpu->matmul_fwd(cpu, ref, x, w, NULL, N, C, OC);
    cpu->destroy(cpu);
    size_t es = glm_dtype_size(be->dtype);
    void *dx = be->alloc(be, N * C * es), *dw = be->alloc(be, OC * C * es), *dy = be->alloc(be, N * OC * es);
    be->upload_f32(be, dx, x, N * C);
    be->upload_f32(be, dw, w, OC * C);
    be->matmul_fwd(be, dy, dx, dw, NULL, N, C, OC);
    be->download_f32(be, got, dy, N * OC);
    double md = 0, mr = 0;
    for (int i = 0; i < N * OC; i++) { md = fmax(md, fabs(got[i] - ref[i])); mr = fmax(mr, fabs(ref[i])); }
    be->free(be, dx); be->free(be, dw); be->free(be, dy);
    free(x); free(w); free(ref); free(got);
    snprintf(detail, n, "matmul 64x96x80 vs CPU: rel err %.2e", md / mr);
    return md / mr < 1e-4;
}

#ifdef GLM_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

static int nccl_check(int ndev, char *detail, size_t n) {
    ncclComm_t *comms = calloc(ndev, sizeof *comms);
    int *devs = malloc(sizeof(int) * ndev);
    float **buf = calloc(ndev, sizeof *buf);
    cudaStream_t *st = calloc(ndev, sizeof *st);
    for (int i = 0; i < ndev; i++) devs[i] = i;
    ncclResult_t r = ncclCommInitAll(comms, ndev, devs);
    int ok = r == ncclSuccess;
    const size_t count = 1 << 20;
    for (int i = 0; ok && i < ndev; i++) {
        cudaSetDevice(i);
        ok &= cudaMalloc((void **)&buf[i], count * 4) == cudaSuccess && cudaStreamCreate(&st[i]) == cudaSuccess;
        float *h = malloc(count * 4);
        for (size_t k = 0; k < count; k++) h[k] = (float)(i + 1);
        ok &= cudaMemcpy(buf[i], h, count * 4, cudaMemcpyHostToDevice) == cudaSuccess;
        free(h);
    }
    if (ok) {
        ncclGroupStart();
        for (int i = 0; i < ndev; i++) ncclAllReduce(buf[i], buf[i], count, ncclFloat, ncclSum, comms[i], st[i]);
        r = ncclGroupEnd();
        ok = r == ncclSuccess;
    }
    float expect = ndev * (ndev + 1) / 2.0f, got = -1;
    for (int i = 0; ok && i < ndev; i++) {
        cudaSetDevice(i);
        ok &= cudaStreamSynchronize(st[i]) == cudaSuccess;
        ok &= cudaMemcpy(&got, buf[i] + count - 1, 4, cudaMemcpyDeviceToHost) == cudaSuccess && got == expect;
    }
    snprintf(detail, n, "all-reduce of 4 MiB over %d GPUs: %s (got %g, want %g)", ndev, ok ? "right sum" : ncclGetErrorString(r), got, expect);
    for (int i = 0; i < ndev; i++) { if (buf[i]) { cudaSetDevice(i); cudaFree(buf[i]); } if (comms[i]) ncclCommDestroy(comms[i]); }
    free(comms); free(devs); free(buf); free(st);
    return ok;
}
#endif

int glm_cmd_env(int argc, char **argv) {
    int fails = 0;
    char d[512];
    printf("glmtrain env\n");
    snprintf(d, sizeof d, "%d OpenMP threads; ", omp_get_max_threads());
    glm_backend *cpu = glm_backend_cpu();
    fails += line(check_backend(cpu, d + strlen(d), sizeof d - strlen(d)) , "CPU backend", d);
    cpu->destroy(cpu);
#ifdef GLM_HAVE_CUDA
    int rt = 0, drv = 0, ndev = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    snprintf(d, sizeof d, "runtime %d.%d, driver supports %d.%d", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    fails += line(drv >= rt && drv > 0, "CUDA", drv == 0 ? "no NVIDIA driver found (no GPU on this machine?)" : drv >= rt ? d : "driver older than the runtime: update the NVIDIA driver");
    size_t lt = cublasLtGetVersion();
    snprintf(d, sizeof d, "%zu", lt);
    line(1, "cuBLASLt", d);
    int nv = 0;
    ncclGetVersion(&nv);
    snprintf(d, sizeof d, "%d.%d.%d (NCCL_NVLS_ENABLE=%s)", nv / 10000, nv / 100 % 100, nv % 100,
             getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "unset");
    line(1, "NCCL", d);
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        fails += line(0, "GPUs", e != cudaSuccess ? cudaGetErrorString(e) : "none visible (CUDA_VISIBLE_DEVICES?)");
    }
    for (int i = 0; i < ndev; i++) {
        struct cudaDeviceProp p;
        cudaGetDeviceProperties(&p, i);
        snprintf(d, sizeof d, "%s, %.1f GiB, sm_%d%d, %d SMs, bf16 %s", p.name, p.totalGlobalMem / 1073741824.0, p.major,
                 p.minor, p.multiProcessorCount, p.major >= 8 ? "yes" : "no (use --fp16)");
        char what[48];
        snprintf(what, sizeof what, "GPU %d", i);
        line(1, what, d);
        char msg[256];
        glm_backend *be = glm_backend_cuda(i, GLM_F32, msg, sizeof msg);
        snprintf(what, sizeof what, "GPU %d kernel", i);
        if (!be) { fails += line(0, what, msg); continue; }
        fails += line(check_backend(be, d, sizeof d), what, d);
        be->destroy(be);
    }
    for (int i = 0; i < ndev; i++)
        for (int j = 0; j < ndev; j++) {
            if (i == j) continue;
            int can = 0;
            cudaDeviceCanAccessPeer(&can, i, j);
            char what[48];
            snprintf(what, sizeof what, "peer access %d -> %d", i, j);
            line(1, what, can ? "yes" : "no (traffic goes through the host)");
        }
    if (ndev >= 2) fails += line(nccl_check(ndev, d, sizeof d), "NCCL", d);
#else
    line(1, "CUDA", "this glmtrain was built without CUDA (no nvcc at build time)");
#endif
    printf("%s\n", fails ? "some checks FAILED" : "all checks ok");
    return fails ? 1 : 0;
}
