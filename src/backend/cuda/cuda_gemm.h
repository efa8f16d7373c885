/* The CUDA backend's products (cuda_gemm.c), for cuda_backend.c: the table's matmul_* ops and
 * the release of the cached plans. */
#ifndef GLM_CUDA_GEMM_H
#define GLM_CUDA_GEMM_H
#include "backend/cuda/cuda_impl.h"

void glm_cuda_gemm_bind(glm_backend *be);
/* D[m, n] (column-major, ld ldd) = op(A) op(B) with A, B in the backend's dtype and D in float,
 * on cuBLAS with float accumulation (no TF32): the small products beside the model's own, e.g.
 * DoRA's W A^T, whose sums stay in float. */
void glm_cuda_gemm_to_f32(glm_backend *be, int ta, int tb, int m, int n, int k, const void *A, int lda, const void *B, int ldb,
                          float *D, int ldd);
void glm_cuda_gemm_free(cuda_impl *im);

#endif
