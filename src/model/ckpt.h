/* Checkpoint interop: one reader over both on-disk formats (safetensors and torch.save .bin,
 * single or sharded with an index), and export of a model (or a checkpoint) as a Hugging Face
 * folder: config.json, safetensors shards with model.safetensors.index.json, tokenizer files.
 *
 * Export writes tensors in state-dict order with HF names. With `original_layout` it also
 * writes what the original chatglm-6b checkpoint holds beyond our parameters: lm_head.weight
 * for a tied model (a copy of word_embeddings, as the original ships it; chatglm.cpp's
 * converter and HF both read it) and each layer's attention.rotary_emb.inv_freq buffer [HD/4]
 * (fp16-rounded 1/10000^(2j/(HD/2)), the values the model uses). Loading ignores both. */
#ifndef GLM_MODEL_CKPT_H
#define GLM_MODEL_CKPT_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/safetensors.h"
#include "io/torchbin.h"
#include "model/glm.h"

/* ---- reading ---- */
typedef struct glm_ckpt {
    st_reader *st;       /* exactly one of st / tb is open */
    tbin_reader *tb;
    char path[4096];     /* as given, for messages */
    /* transformers' own GLM layout (model/hf_layout.h): every name below is THUDM's original
     * one, and query_key_value reads as its three stored row blocks one after another; names[]
     * lists the tensors by those names */
    int hf;
    char **names;
    int n_names;
} glm_ckpt;

/* path: a folder (safetensors preferred over .bin, as Hugging Face does), a .safetensors or
 * .bin file, or either index json. */
int glm_ckpt_open(glm_ckpt *c, const char *path, glm_err *err);
void glm_ckpt_close(glm_ckpt *c);
const char *glm_ckpt_format(const glm_ckpt *c); /* "safetensors" or "torch .bin" */
int glm_ckpt_count(const glm_ckpt *c);
const char *glm_ckpt_name(const glm_ckpt *c, int i);
/* 0 when present (fills the NULL-able outputs), -1 when absent. */
int glm_ckpt_info(const glm_ckpt *c, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]);
int glm_ckpt_read_f32(glm_ckpt *c, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err);
/* THUDM's pre-quantized weight layout: `name` int8 [OC, C] (INT8) or [OC, C/2] (INT4, two per
 * byte) beside `name`_scale fp16 [OC]. The type a checkpoint stores `name` as (GLM_Q_NONE when
 * it is not such an int8 tensor), and its two tensors read into backend/quant.h's layout of q
 * (dst: glm_qlayout_of(q, OC, C).bytes). */
int glm_ckpt_quantized_type(const glm_ckpt *c, const char *name, int64_t OC, int64_t C);
int glm_ckpt_read_quantized(glm_ckpt *c, const char *name, int q, int64_t OC, int64_t C, void *dst, glm_err *err);
/* Table row t's values as float: read and converted, or a THUDM-quantized weight (int8 `name` +
 * fp16 `name`_scale) dequantized (the values the model computes with). */
int glm_ckpt_read_values(glm_ckpt *c, const char *name, const glm_tensor *t, float *dst, glm_err *err);
/* query_key_value's LoRA A (b_side 0) or B (1), `name` in THUDM's terms, as transformers'
 * layout's three adapters stacked (config.h glm_lora_split: A [3 r, cols], B [qkv width, r]) into
 * dst, whichever way the file holds it: stacked under that name, peft's q_proj / k_proj / v_proj
 * (some of them: the others' rows zero, no adapter there), or THUDM's one adapter (A [r, cols]:
 * each of q, k, v gets it, which is the same product). 1 when read, 0 when the file holds none of
 * it, -1 on an error. */
int glm_ckpt_read_qkv_lora(glm_ckpt *c, const char *name, int b_side, const glm_config *cfg, int r, int64_t cols,
                           float *dst, glm_err *err);
/* The bytes of a tensor stored as `dtype` (bytes must be its size): int8 quantized weights. */
int glm_ckpt_read_raw(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err);
/* Whether `name`'s bytes can be read in parts (safetensors: always; .bin: unless stored as a
 * strided view), and bytes [off, off + bytes) of them. */
int glm_ckpt_partwise(glm_ckpt *c, const char *name);
int glm_ckpt_read_raw_at(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err);

/* ---- export ---- */
typedef struct glm_export_opts {
    st_dtype dtype;          /* ST_F32, ST_F16 or ST_BF16 (round to nearest even) */
    size_t max_shard_bytes;  /* 0: one model.safetensors; else HF-style greedy shards + index */
    int original_layout;     /* see above */
    int overwrite;           /* replace model*.safetensors* already in the folder */
    const char *files_from;  /* folder to copy tokenizer / remote-code files from (NULL: none) */
    const char *config_from; /* config.json to copy with torch_dtype updated (NULL: from the config) */
    /* glm_qtype INT8 / INT4: the four linear weights of every layer written quantized as THUDM's
     * chatglm-6b-int8/int4 hold them (`weight` int8 [OC, C] or [OC, C/2] packed, `weight_scale`
     * float16 [OC] beside it) and config.json says quantization_bit; GLM_Q_NONE: floats */
    int quant;
    /* glm_ckpt_convert: the folder's layout, THUDM's (0) or transformers' (1: model/hf_layout.h),
     * -1 the source's */
    int layout;
} glm_export_opts;
void glm_export_opts_init(glm_export_opts *o); /* F16, one file, original layout */

/* config.json for weights written as `dtype` into dir: the text of config_from (NULL: made
 * from c) with only torch_dtype set (and for a P-Tuning model pre_seq_len and
 * prefix_projection, as THUDM's ptuning writes them), every other byte as written
 * (core/json_text.h), so auto_map, _name_or_path and number literals like 1e-05 reach the
 * original loaders intact. */
int glm_write_hf_config(const glm_config *c, const char *config_from, st_dtype dtype, const char *dir, glm_err *err);
/* What the original loaders need from a source model folder beside the weights, copied byte
 * for byte: its code files (*.py: THUDM's modeling/configuration/tokenization/quantization),
 * tokenizer files (with their own auto_map) and generation_config.json. */
int glm_copy_source_files(const char *from, const char *dir, glm_err *err);
/* The config.json and the folder of a model's origin (glm_model.origin): "" where there is
 * none (a config file has no folder to copy files from). */
void glm_origin_paths(const char *origin, char *config, char *folder, size_t n);
/* Whether dir has the code files transformers needs to load a chatglm folder with
 * trust_remote_code; when not, logs what a user must add (once per folder written). */
int glm_check_remote_code(const char *dir);

/* Fills dst[numel] (float) with tensor `name`; the table row is given for parameters. */
typedef int (*glm_tensor_reader)(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err);
/* For a quantized export: fills dst with row t's bytes in backend/quant.h's layout of type q
 * when the source stores it so (returns 1; copied, never re-quantized), else returns 0 and the
 * floats are quantized; -1 on an error. NULL: always the floats. */
typedef int (*glm_qtensor_reader)(void *ctx, const glm_tensor *t, int q, void *dst, glm_err *err);

/* Export from any source of tensors (the model, a checkpoint). Every shard is complete on disk
 * (written under a temporary name and renamed) before the index and config.json are written. */
int glm_export(const glm_config *c, glm_tensor_reader rd, glm_qtensor_reader qrd, void *ctx, const char *dir,
               const glm_export_opts *o,
               glm_err *err);
/* glm_export with config_from / files_from defaulting to those of `origin` (a model folder or a
 * config.json: glm_origin_paths), as every writer of a model folder wants them. */
int glm_export_from(const glm_config *c, glm_tensor_reader rd, glm_qtensor_reader qrd, void *ctx, const char *origin,
                    const char *dir, const glm_export_opts *o, glm_err *err);
/* The model's parameters; config_from / files_from default to the model's origin. */
int glm_model_export(glm_model *m, const char *dir, const glm_export_opts *o, glm_err *err);
/* A glm_tensor_reader over an open glm_ckpt (ctx): tensor `name` as floats (a tied model's
 * embedding found as lm_head where that is all the file has). */
int glm_ckpt_reader(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err);
/* A checkpoint converted (config.json of `from` decides the tensors) without building a model:
 * memory stays at about one shard. */
int glm_ckpt_convert(const char *from, const char *dir, const glm_export_opts *o, glm_err *err);

/* "2GB" (10^9), "500MB", "1GiB" (2^30), "64KiB", "12345" (bytes). -1 when malformed. */
int glm_parse_size(const char *s, size_t *out);
/* "float16"/"fp16"/"F16", "bfloat16"/"bf16"/"BF16", "float32"/"fp32"/"F32". -1 otherwise. */
int glm_parse_st_dtype(const char *s, st_dtype *out);

#endif
