/* Internal: a small pickle VM for torch.save's data.pkl. It builds plain objects (no code
 * runs: GLOBALs are only names) and understands the few callables a state_dict uses:
 * collections.OrderedDict, torch._utils._rebuild_tensor(_v2), torch._utils._rebuild_parameter
 * and persistent ids ("storage", torch.XStorage, key, location, numel). Hostile input is
 * bounded by limits on stack depth, memo size, object count and tensor sizes. */
#ifndef GLM_TORCHBIN_PICKLE_H
#define GLM_TORCHBIN_PICKLE_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/safetensors.h"

/* One tensor of the top-level dict, validated: ndim <= ST_MAX_DIMS, sizes/strides >= 0, and
 * every element it views lies inside its storage of storage_numel elements. */
typedef struct tp_tensor {
    char *name;
    char *key; /* storage key: the archive entry is <root>/data/<key> */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS], stride[ST_MAX_DIMS];
    uint64_t offset;        /* in elements */
    uint64_t storage_numel; /* elements in the storage */
} tp_tensor;

/* Parses a pickle whose result is a dict (or OrderedDict) name -> tensor. Non-tensor values
 * are skipped. `what` names the file in messages. On success *out holds *n tensors in dict
 * order (free with tp_free). */
int tp_load(const unsigned char *data, size_t len, const char *what, tp_tensor **out, int *n, glm_err *err);
void tp_free(tp_tensor *t, int n);

#endif
