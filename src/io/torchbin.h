/* PyTorch checkpoint import: `torch.save(state_dict)` zip archives (pytorch_model.bin), single
 * or sharded through pytorch_model.bin.index.json ({"weight_map": {name: file}}). Read-only;
 * the same shape of API as safetensors.h and the same dtype enum. Tensor data stay on disk
 * and are read with pread when asked for. Hostile files (truncated, lying sizes, absurd
 * shapes, odd pickles) give an error naming the file and tensor, never a crash. */
#ifndef GLM_TORCHBIN_H
#define GLM_TORCHBIN_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/safetensors.h"

typedef struct tbin_reader tbin_reader;

/* path: a .bin archive, a pytorch_model.bin.index.json, or a folder holding either. */
int tbin_open(tbin_reader **out, const char *path, glm_err *err);
void tbin_close(tbin_reader *r);
int tbin_count(const tbin_reader *r);
const char *tbin_name(const tbin_reader *r, int i); /* sorted by name */
/* 0 and fills what is asked for (NULLs allowed) when the tensor exists; -1 when it does not. */
int tbin_info(const tbin_reader *r, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]);
/* Reads tensor `name` converted to float32 (from F32/F16/BF16/F64 storages), honouring the
 * storage offset and gathering strided views. Fails, naming file and tensor, when it is
 * missing, when its shape differs from (ndim, shape), or when its data cannot be read. */
int tbin_read_f32(tbin_reader *r, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err);
/* Reads the elements of a tensor whose dtype must equal `dtype`, row-major and contiguous,
 * into dst of exactly `bytes` = numel * st_dtype_size(dtype). */
int tbin_read_raw(tbin_reader *r, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err);
/* Whether the tensor's elements lie in storage in order (what tbin_read_raw_at can read in
 * parts; torch.save of a transposed view stores strides); 0 also when absent. */
int tbin_contiguous(tbin_reader *r, const char *name);
/* Bytes [off, off + bytes) of a contiguous tensor's data. */
int tbin_read_raw_at(tbin_reader *r, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err);

/* Writes float32 tensors as torch.save(OrderedDict) would (pytorch_model.bin that torch.load
 * and THUDM's loaders read), atomically; under 4 GB (no zip64). */
int tbin_save(const char *path, const st_entry *t, int n, glm_err *err);

/* True when path looks like a torch.save zip archive (starts with "PK\3\4"). */
int tbin_is_archive(const char *path);

#endif
