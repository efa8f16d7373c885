/* Host staging for an offloaded optimizer (backend.h: host_alloc .. compute_wait): page-locked
 * host buffers and copies on two copy streams, one per direction, so gradients going to the
 * host and updated weights coming back move at once and neither waits behind compute kernels.
 * A ticket names the event recorded after its copy; events are reused round a ring, which only
 * makes a wait on a very old ticket wait for a later copy (never too little). */
#include "backend/cuda/cuda_copy.h"
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "core/err.h"

#define RING 1024

struct glm_cuda_copies {
    cudaStream_t st[2];      /* [0] host -> device, [1] device -> host */
    cudaEvent_t ev[RING];    /* ticket t's copy done: ev[t % RING] */
    cudaEvent_t after[2];    /* the compute stream's work so far, per direction */
    long next;               /* tickets handed out */
    pthread_mutex_t mu;      /* copy_async may be called from several threads */
};

#define CK(call)                                                                                                      \
    do {                                                                                                              \
        cudaError_t e_ = (call);                                                                                      \
        if (e_ != cudaSuccess) GLM_FATAL("a CUDA error in the optimizer's host copies usually follows an earlier one; rerun with GLM_CUDA_SYNC=1", \
                                         "%s failed: %s", #call, cudaGetErrorString(e_));                            \
    } while (0)

glm_cuda_copies *glm_cuda_copies_open(void) {
    glm_cuda_copies *c = glm_calloc(1, sizeof *c);
    for (int d = 0; d < 2; d++) {
        CK(cudaStreamCreateWithFlags(&c->st[d], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&c->after[d], cudaEventDisableTiming));
    }
    for (int i = 0; i < RING; i++) CK(cudaEventCreateWithFlags(&c->ev[i], cudaEventDisableTiming));
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void glm_cuda_copies_close(glm_cuda_copies *c) {
    if (!c) return;
    for (int d = 0; d < 2; d++) {
        cudaStreamSynchronize(c->st[d]);
        cudaStreamDestroy(c->st[d]);
        cudaEventDestroy(c->after[d]);
    }
    for (int i = 0; i < RING; i++) cudaEventDestroy(c->ev[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

void *glm_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess)
        GLM_FATAL("--offload_optimizer cpu keeps the optimizer state and a staging copy of the weights in host memory: "
                  "free host memory, or use --optim adamw_8bit (a quarter of the moments' bytes); `glmtrain info` prints the plan",
                  "cannot allocate %.2f GiB of page-locked host memory (%s)", bytes / 1073741824.0, cudaGetErrorString(e));
    return p;
}

void glm_cuda_host_free(void *p) { if (p) CK(cudaFreeHost(p)); }

long glm_cuda_copy_async(glm_cuda_copies *c, void *compute_stream, void *dst, const void *src, size_t bytes, int to_host) {
    int d = to_host ? 1 : 0;
    pthread_mutex_lock(&c->mu);
    long t = ++c->next;
    CK(cudaEventRecord(c->after[d], (cudaStream_t)compute_stream));
    CK(cudaStreamWaitEvent(c->st[d], c->after[d], 0));
    if (bytes) CK(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, c->st[d]));
    CK(cudaEventRecord(c->ev[t % RING], c->st[d]));
    pthread_mutex_unlock(&c->mu);
    return t;
}

void glm_cuda_copy_wait(glm_cuda_copies *c, long ticket) {
    if (ticket <= 0) return;
    CK(cudaEventSynchronize(c->ev[ticket % RING]));
}

void glm_cuda_compute_wait(glm_cuda_copies *c, void *compute_stream, long ticket) {
    if (ticket <= 0) return;
    pthread_mutex_lock(&c->mu);
    CK(cudaStreamWaitEvent((cudaStream_t)compute_stream, c->ev[ticket % RING], 0));
    pthread_mutex_unlock(&c->mu);
}
