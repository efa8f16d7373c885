/* The CUDA backend's products (cuda_gemm.c), for cuda_backend.c: the table's matmul_* ops and
 * the release of the cached plans. */
#ifndef GLM_CUDA_GEMM_H
#define GLM_CUDA_GEMM_H
#include "backend/cuda/cuda_impl.h"

void glm_cuda_gemm_bind(glm_backend *be);
void glm_cuda_gemm_free(cuda_impl *im);

#endif
