/* Extras of the CUDA backend beyond the ops interface (backend/backend.h), for benchmarks,
 * tests and the NCCL communicator: the stream every op runs on, device-side random fills
 * (a 6B-parameter model cannot be initialised on the host in reasonable time), memory
 * figures and a coarse per-category timer. All take a backend made by glm_backend_cuda. */
#ifndef GLM_CUDA_BACKEND_H
#define GLM_CUDA_BACKEND_H
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

/* The cudaStream_t all ops of this backend are ordered on (as void *, so C callers need no CUDA headers). */
void *glm_cuda_stream(glm_backend *be);
/* p[n] (S) = std * N(0,1), counter-based from (seed, index): same values for any launch shape. */
void glm_cuda_fill_normal(glm_backend *be, void *p, size_t n, uint64_t seed, float std);
void glm_cuda_fill(glm_backend *be, void *p, size_t n, float value);
/* The device's compute capability as 10 * major + minor (75 under GLM_CUDA_TURING=1). */
int glm_cuda_capability(glm_backend *be);
/* Device memory: in use now and the largest seen at any allocation (cudaMemGetInfo: every
 * process's use of the GPU, the CUDA context and library workspaces included), and the total. */
void glm_cuda_memory(glm_backend *be, size_t *used_now, size_t *peak_used, size_t *total);
/* Starts a new peak from the memory in use now. */
void glm_cuda_memory_reset_peak(glm_backend *be);
/* The products' plans (cuBLASLt descriptors, one per shape) made so far, and how many times
 * candidate kernels were timed (once per shape class, where tuning is on) */
void glm_cuda_gemm_counts(glm_backend *be, long *plans, long *tuned);

/* Step-time split. on = 1: every op records a CUDA event when its category differs from the
 * previous op's, so a category is charged from its first op to the next category's first op
 * (launch gaps inside a run of one category count for it). on = 2: an event at every op, and
 * per-op totals too (GEMMs labelled by kind and shape); costs a little host time per op. */
enum { GLM_PROF_GEMM, GLM_PROF_ATTN, GLM_PROF_OTHER, GLM_PROF_OPTIM, GLM_PROF_NCAT };
void glm_cuda_profile(glm_backend *be, int on);
/* Synchronises, adds the milliseconds per category since the last read into ms[GLM_PROF_NCAT],
 * and starts a new interval. */
void glm_cuda_profile_read(glm_backend *be, double *ms);
/* After a read in mode 2: up to max (op name, milliseconds) pairs, in first-seen order. */
int glm_cuda_profile_ops(glm_backend *be, const char **names, double *ms, int max);

#endif
