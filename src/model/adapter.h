/* LoRA adapters in peft's format, so they travel between glmtrain and Python: a folder with
 * adapter_config.json (peft's LoraConfig: r, lora_alpha, lora_dropout, target_modules, ...)
 * and adapter_model.safetensors holding
 *   base_model.model.transformer.layers.N.<module>.lora_A.weight  [r, in]
 *   base_model.model.transformer.layers.N.<module>.lora_B.weight  [out, r]
 * (peft's PeftModel.from_pretrained(base, folder) loads it; glmtrain reads folders peft wrote,
 * adapter_model.bin included). */
#ifndef GLM_MODEL_ADAPTER_H
#define GLM_MODEL_ADAPTER_H
#include "core/err.h"
#include "io/safetensors.h"
#include "model/ckpt.h"
#include "model/glm.h"

#define GLM_ADAPTER_PREFIX "base_model.model."

/* Writes adapter_config.json and adapter_model.safetensors (tensors as dtype) into dir. */
int glm_adapter_save(glm_model *m, const char *dir, st_dtype dtype, glm_err *err);
/* A PiSSA adapter (model/pissa.h) converted into a plain LoRA for the original base, written
 * into dir: rank 2r, A' = [A; A0], B' = [B, -B0], lora_alpha doubled (times sqrt 2 with rslora),
 * as peft's save_pretrained(..., path_initial_model_for_weight_conversion) writes it. */
int glm_adapter_save_pissa_converted(glm_model *m, const char *dir, glm_err *err);
/* adapter_config.json alone (m's peft settings and origin), e.g. when the adapter rows were
 * written by pipeline stages. */
int glm_adapter_write_config(const glm_model *m, const char *dir, glm_err *err);
/* Reads a folder's adapter_config.json into p (kind LoRA, rank, alpha, dropout, targets,
 * rslora), or, without one, a P-Tuning v2 checkpoint's config.json (pre_seq_len,
 * prefix_projection: THUDM's ptuning layout); an error names the file and the key for what
 * glmtrain cannot use. */
int glm_adapter_read_config(const char *dir, glm_peft *p, glm_err *err);
/* Loads the adapter tensors of dir into the model's LoRA rows (shapes checked, named), or a
 * P-Tuning checkpoint's transformer.prefix_encoder.* (model.safetensors or pytorch_model.bin). */
int glm_adapter_load(glm_model *m, const char *dir, glm_err *err);
/* Whether dir holds a LoRA adapter (adapter_config.json). */
int glm_is_adapter_dir(const char *dir);
/* The tensor file of an adapter folder into path: adapter_model.safetensors, or the
 * adapter_model.bin older peft versions write; -1 when it has neither. */
int glm_adapter_file(const char *dir, char *path, size_t n);


/* LLaMA-Factory's adapter lists: --adapter_name_or_path a,b,c applies the adapters in turn,
 * those before the last merged into the base (all of them for an export, or where a new adapter
 * trains: --create_new_adapter). A string that is one folder is one item, commas and all. */
int glm_adapter_list_count(const char *list);
/* merged: the items before the last ("" for one), or all of them with merge_all (last ""). */
void glm_adapter_list_split(const char *list, int merge_all, char *merged, size_t nm, char *last, size_t nl);

/* Adapters merged into base weights as they are read (model/adapter_merge.c). */
typedef struct glm_merge glm_merge;
/* Opens the LoRA adapters of `list` for a model of config c, each checked as --adapter checks
 * one (a P-Tuning checkpoint refused: it is no weight change); *out NULL for an empty list. */
int glm_merge_open(glm_merge **out, const glm_config *c, const char *list, glm_err *err);
/* Whether an adapter of g changes row t (a LoRA target, or a modules_to_save copy). */
int glm_merge_changes(const glm_merge *g, const glm_tensor *t);
/* w [t->numel]: row t's base values (its name in the base's files: `name`) in, merged out:
 * W += scaling * B A for each adapter in turn (DoRA's rescale, peft's merge), a whole copy
 * where an adapter saved the module (modules_to_save). */
int glm_merge_apply(glm_merge *g, const char *name, const glm_tensor *t, float *w, glm_err *err);
void glm_merge_close(glm_merge *g);
/* w [out, C] += scale B_k A_k on the host over the row blocks of an adapter split `split` ways
 * (glm_lora_blocks: transformers' q, k, v, or 1, the whole; b [out, r], a [split r, C]): a merge,
 * and PiSSA's residual (scale < 0). norm != NULL: first each row's ||w + scale B A|| into norm [out]
 * (DoRA's row norms). */
void glm_lora_add_host(const glm_config *c, int split, float *w, int64_t out, int64_t C, const float *b, const float *a, int r,
                       float scale, float *norm);

/* Writes base + adapters as one Hugging Face folder at dir (every adapter of the list merged in
 * turn), streaming tensor by tensor as glm_ckpt_convert does, with the base's config.json and
 * code files. A P-Tuning v2 checkpoint cannot be merged (its prefix is not a weight change):
 * an error says so. */
int glm_adapter_merge(const char *base, const char *adapters, const char *dir, const glm_export_opts *o, glm_err *err);

#endif
