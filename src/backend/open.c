/* The one reading of a command's --device (backend.h glm_backend_open): the CPU, a GPU, or why no
 * GPU can be used, with the same words for every command. */
#include <stdio.h>
#include <string.h>
#include "backend/backend.h"
#include "core/err.h"

int glm_backend_open(const char *device, int gpu, const glm_dtype *dtypes, int n_dtypes, glm_backend **out, char *why,
                     size_t cap, glm_err *err) {
    *out = NULL;
    if (cap) why[0] = 0;
    if (!strcmp(device, "cpu")) {
        *out = glm_backend_cpu();
        return 0;
    }
#ifdef GLM_HAVE_CUDA
    for (int i = 0; i < n_dtypes && !*out; i++) {
        char msg[512] = "";
        *out = glm_backend_cuda(gpu, dtypes[i], msg, sizeof msg);
        if (!*out && i == 0) snprintf(why, cap, "%s", msg); /* the first type's reason speaks for the GPU */
    }
    if (*out) return 0;
    if (!strcmp(device, "cuda")) {
        glm_fail(err, "--device cuda: %s", why);
        return glm_hint(err, "use --device cpu, or check nvidia-smi");
    }
#else
    (void)gpu;
    (void)dtypes;
    (void)n_dtypes;
    if (!strcmp(device, "cuda")) { /* under "auto" a build without CUDA has no GPU to explain: why stays empty */
        glm_fail(err, "--device cuda: this glmtrain was built without CUDA");
        return glm_hint(err, "rebuild with nvcc on the PATH (make), or use --device cpu");
    }
#endif
    return 0;
}
