/* The CUDA backend's shared helpers (cuda_impl.h): checked calls, the per-op debug sync, the
 * scratch buffer, and the profiler's events (cuda_backend.h glm_cuda_profile*). Compiled to
 * nothing without GLM_HAVE_CUDA. */
#ifdef GLM_HAVE_CUDA
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_impl.h"
#include "core/err.h"

/* ---------------------------------------------------------------- checked calls */

void glm_cuda_check_at(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    glm_fatal_at(file, line,
                 "CUDA errors from kernels surface at the next synchronising call; rerun with GLM_CUDA_SYNC=1 to stop at "
                 "the failing op, or under `compute-sanitizer` to find a bad access",
                 "CUDA error %s (%s) in %s", cudaGetErrorName(e), cudaGetErrorString(e), what);
}
void glm_cuda_cublas_check_at(int status, const char *what, const char *file, int line) {
    if (status == 0) return;
    glm_fatal_at(file, line,
                 "a cuBLAS failure is usually a bad shape or pointer alignment, or an earlier CUDA error; rerun with "
                 "GLM_CUDA_SYNC=1",
                 "cuBLAS status %d in %s", status, what);
}

/* After each op: in debug mode, wait and report the op by name. */
void glm_cuda_op_done(glm_backend *be, const char *op) {
    if (!IM(be)->debug_sync) return;
    cudaError_t e = cudaStreamSynchronize(IM(be)->st);
    if (e == cudaSuccess) e = cudaGetLastError();
    glm_cuda_check_at(e, op, __FILE__, __LINE__);
}

/* ---------------------------------------------------------------- profiler */

void glm_cuda_prof(glm_backend *be, int cat, const char *op) {
    cuda_impl *im = IM(be);
    if (!im->prof_on || (im->prof_on == 1 && cat == im->prof_cat) || im->prof_n >= PROF_EVENTS) return;
    CUDA_CHECK(cudaEventRecord(im->prof_ev[im->prof_n], im->st));
    im->prof_evcat[im->prof_n] = cat;
    im->prof_evop[im->prof_n++] = op;
    im->prof_cat = cat;
}

/* A persistent label for a GEMM of one shape class (kind 0 fwd, 1 dinp, 2 dw), so the detail
 * profile tells the head from the MLP. */
const char *glm_cuda_mm_label(glm_backend *be, int kind, int C, int OC) {
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
    glm_cuda_prof(be, GLM_PROF_NCAT, "end"); /* closing mark */
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

/* ---------------------------------------------------------------- scratch */

/* Device scratch for one op at a time (ops are stream-ordered); grows, never shrinks. */
void *glm_cuda_scratch(glm_backend *be, size_t bytes) {
    cuda_impl *im = IM(be);
    if (bytes > im->scratch_bytes) {
        be->free(be, im->scratch); /* cudaFree waits for work that may still use it */
        im->scratch_bytes = bytes + bytes / 4;
        im->scratch = be->alloc(be, im->scratch_bytes);
    }
    return im->scratch;
}
#endif
