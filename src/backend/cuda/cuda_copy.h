/* The CUDA backend's host staging (cuda_copy.c), behind backend.h's host_alloc .. compute_wait. */
#ifndef GLM_CUDA_COPY_H
#define GLM_CUDA_COPY_H
#include <stddef.h>

typedef struct glm_cuda_copies glm_cuda_copies;
glm_cuda_copies *glm_cuda_copies_open(void);
void glm_cuda_copies_close(glm_cuda_copies *c);
void *glm_cuda_host_alloc(size_t bytes);
void glm_cuda_host_free(void *p);
long glm_cuda_copy_async(glm_cuda_copies *c, void *compute_stream, void *dst, const void *src, size_t bytes, int to_host);
void glm_cuda_copy_wait(glm_cuda_copies *c, long ticket);
void glm_cuda_compute_wait(glm_cuda_copies *c, void *compute_stream, long ticket);

#endif
