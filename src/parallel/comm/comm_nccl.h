/* What the two NCCL communicators (comm_nccl.c: data-parallel collectives; comm_nccl_pipe.c:
 * the pipeline's transport) share. Include only where nccl.h is available (GLM_HAVE_CUDA). */
#ifndef GLM_PARALLEL_COMM_NCCL_H
#define GLM_PARALLEL_COMM_NCCL_H
#include <nccl.h>
#include "parallel/comm/comm.h"

static inline ncclDataType_t glm_nccl_type(glm_cdtype dt) {
    return dt == GLM_C_F32 ? ncclFloat32 : dt == GLM_C_BF16 ? ncclBfloat16 : dt == GLM_C_F16 ? ncclFloat16 : ncclFloat64;
}

#endif
