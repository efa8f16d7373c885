/* Internal helpers shared by the checkpoint readers (safetensors, torch .bin): positioned
 * reads that never load a whole shard, dtype conversion to float32, and the sharding index
 * ({"weight_map": {name: file}}) that both Hugging Face formats use. Not a public API. */
#ifndef GLM_IO_UTIL_H
#define GLM_IO_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "glmtrain's checkpoint readers assume a little-endian host (both file formats are little-endian)"
#endif

/* pread until n bytes arrived (large reads in pieces on all threads). 0 ok; -1 on error or end of file (errno 0 for a short file). */
int io_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* Converts n elements of a float dtype (F32/F16/BF16/F64) to float32. -1 for other dtypes. */
int io_to_f32(st_dtype d, const void *src, float *dst, size_t n);

/* Reads n contiguous elements of dtype d at file offset off into dst as float32, in bounded
 * chunks so a multi-GB tensor needs no second buffer of its size. -1 as io_pread_full. */
int io_read_f32(int fd, uint64_t off, st_dtype d, size_t n, float *dst);

/* True when dtype d converts to float32 (F32/F16/BF16/F64). */
int io_is_float(st_dtype d);

/* "[a, b, c]" into buf (for error messages). Returns buf. */
const char *io_shape_str(char *buf, size_t n, int ndim, const int64_t *shape);

/* A parsed sharding index: n (tensor name, shard file) pairs; files are paths joined to the
 * index's folder. Shard names that are absolute or climb with ".." are refused. */
typedef struct io_index {
    int n;
    char **names;
    char **files;
} io_index;
/* Also refuses a tensor named twice (JSON objects may repeat a key). */
int io_index_load(io_index *ix, const char *index_path, glm_err *err);
void io_index_free(io_index *ix);

/* The files a reader keeps open: a sharded checkpoint names each shard many times, and each is
 * opened once. */
typedef struct io_shards {
    char **paths;
    int *fds;
    int n;
} io_shards;
/* Index of `path`, opening it on first use; -1 with err when it cannot be opened. */
int io_shards_open(io_shards *s, const char *path, glm_err *err);
void io_shards_close(io_shards *s);

#endif
