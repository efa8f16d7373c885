/* Hugging Face safetensors: read and write, single file or sharded with
 * model.safetensors.index.json. Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the raw little-endian data. Every failure names the file and tensor. */
#ifndef GLM_SAFETENSORS_H
#define GLM_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL, ST_NDTYPES } st_dtype;
#define ST_MAX_DIMS 8

const char *st_dtype_name(st_dtype d);   /* "F32", "BF16", ... */
size_t st_dtype_size(st_dtype d);
int st_dtype_parse(const char *s, st_dtype *out); /* 0 ok, -1 unknown */

/* ---- reading ---- */
typedef struct st_reader st_reader;
/* path: a .safetensors file, a model.safetensors.index.json, or a folder holding either. */
int st_open(st_reader **out, const char *path, glm_err *err);
void st_close(st_reader *r);
int st_count(const st_reader *r);
const char *st_name(const st_reader *r, int i); /* sorted by name */
/* 0 and fills what is asked for (NULLs allowed) when the tensor exists; -1 when it does not. */
int st_info(const st_reader *r, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]);
/* Reads tensor `name` converted to float32 (from F32/F16/BF16/F64). Fails, naming file and
 * tensor, when it is missing, when its shape differs from (ndim, shape), or when the data lie
 * outside the file. */
int st_read_f32(st_reader *r, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err);
/* Reads the raw bytes of a tensor whose dtype must equal `dtype` (for int tensors, RNG state). */
int st_read_raw(st_reader *r, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err);
/* Bytes [off, off + bytes) of the tensor's data (a part of a large tensor). */
int st_read_raw_at(st_reader *r, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err);

/* ---- writing ---- */
typedef struct st_entry {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;     /* host memory, in data_dtype */
    st_dtype data_dtype;  /* dtype of `data` */
    st_dtype file_dtype;  /* dtype written: F32 data may be written as F32/F16/BF16; others as-is */
} st_entry;

/* Writes entries to `path`. max_shard_bytes == 0: one file at `path` (a file name).
 * Otherwise `path` is a folder: model-0000i-of-0000n.safetensors shards of at most
 * max_shard_bytes each (a single larger tensor gets its own shard) plus
 * model.safetensors.index.json; with one shard, just model.safetensors.
 * Files are written under a temporary name and renamed when complete. */
int st_save(const char *path, const st_entry *entries, int n, size_t max_shard_bytes, glm_err *err);

/* Conversions (exported for the backends and tests): round to nearest even. */
uint16_t st_f32_to_f16(float f);
float st_f16_to_f32(uint16_t h);
/* The index of the first NaN or infinity among n elements of dtype d (F32/F16/BF16, as stored),
 * or n when all are finite. Uses every thread. */
size_t st_first_nonfinite(st_dtype d, const void *src, size_t n);
/* The index of the first finite float among n that float16 cannot hold (|x| >= 65520 rounds to
 * infinity), or n. Uses every thread. */
size_t st_first_past_f16(const float *src, size_t n);
/* The words st_save's refusal of such a value starts with, for a caller that writes float32 instead. */
#define ST_PAST_F16 "past float16's range"
uint16_t st_f32_to_bf16(float f);
float st_bf16_to_f32(uint16_t h);

#endif
