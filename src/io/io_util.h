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

/* A reader's tensor table: n elements of `size` bytes, sorted by name, each starting with its
 * own (allocated) char *name. parse reads one file's table (shard = its index in io_shards). */
typedef struct io_table_format {
    size_t size;
    int (*parse)(const char *path, int fd, int shard, void **table, int *n, glm_err *err);
    const char *mismatch_hint; /* what to do when an index names a tensor its shard lacks */
} io_table_format;
/* Frees each element's name, then the table. */
void io_table_free(void *table, int n, size_t size);
/* Sorts a table by name. */
void io_table_sort(void *table, int n, size_t size);
/* The element named `name` in a sorted table, or NULL. */
const void *io_table_find(const void *table, int n, size_t size, const char *name);
/* The tensors a sharding index names, gathered from its shards (each opened into sh and parsed
 * once, in order of first mention: HF indexes list them grouped) into one table sorted by name. */
int io_index_gather(io_shards *sh, const char *index_path, const io_table_format *fmt, void **table, int *n, glm_err *err);
/* The file a checkpoint path names: a file as given; for a folder its index (index_name) when
 * present, else its single file (file_name), joined into buf. NULL with err when the folder has
 * neither. */
const char *io_checkpoint_file(const char *path, const char *index_name, const char *file_name, char *buf, size_t n,
                               glm_err *err);
/* True when path names a sharding index (*.json). */
int io_is_index(const char *path);

#endif
