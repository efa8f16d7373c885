/* `glmtrain expand`: LLaMA Pro's block expansion (model/expand.h), as LLaMA-Factory's
 * scripts/llama_pro.py does it: --model_name_or_path, --output_dir, --num_expand; the new model
 * computes what the old one did, and `train --finetuning_type freeze --use_llama_pro
 * --freeze_trainable_layers N` then trains the N new blocks alone. Tensors stream through one
 * shard at a time. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/args.h"
#include "core/hub.h"
#include "core/log.h"
#include "model/expand.h"

typedef struct expand_args {
    char *model_name_or_path, *output_dir, *dtype, *max_shard_size, *shard_size;
    int num_expand, overwrite_output_dir, save_safetensors;
} expand_args;

#define F(name, type, def, help) {#name, type, offsetof(expand_args, name), def, help, NULL, NULL}
static const glm_flag expand_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "the model folder to expand (ChatGLM2/3-6B, GLM-4-9B)"),
    F(output_dir, ARG_STR, NULL, "the expanded model's folder"),
    F(num_expand, ARG_INT, "8", "blocks to add, one after each num_layers / num_expand layers (it must divide num_layers)"),
    {"dtype", ARG_STR, offsetof(expand_args, dtype), "bfloat16", "dtype of the written tensors", "float16|bfloat16|float32", NULL},
    F(max_shard_size, ARG_STR, "2GB", "largest shard (HF units; 0 = one file)"),
    F(shard_size, ARG_STR, NULL, "llama_pro.py's name for --max_shard_size"),
    F(save_safetensors, ARG_BOOL, "true", "llama_pro.py's: glmtrain writes safetensors (false is refused)"),
    F(overwrite_output_dir, ARG_BOOL, "false", "replace model weights already in --output_dir"),
};
#undef F

int glm_cmd_expand(int argc, char **argv) {
    expand_args a;
    int n = sizeof expand_flags / sizeof expand_flags[0];
    glm_err err = {0};
    glm_args_defaults(expand_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(expand_flags, n, "expand"); return 0; }
    int rc = glm_args_parse(expand_flags, n, &a, argc, argv, &err);
    if (!rc) rc = glm_hub_resolve(&a.model_name_or_path, "model_name_or_path", NULL, &err);
    glm_export_opts o;
    glm_export_opts_init(&o);
    const char *shard = a.shard_size ? a.shard_size : a.max_shard_size;
    if (!rc && (!a.model_name_or_path || !a.output_dir)) rc = glm_fail(&err, "--model_name_or_path and --output_dir are required");
    if (!rc && !a.save_safetensors)
        rc = glm_fail(&err, "--save_safetensors false: glmtrain writes safetensors only"),
        glm_hint(&err, "every loader of these folders reads safetensors; drop the flag");
    if (!rc && glm_parse_st_dtype(a.dtype, &o.dtype)) rc = glm_fail(&err, "--dtype %s: use float16, bfloat16 or float32", a.dtype);
    if (!rc && strcmp(shard, "0") && glm_parse_size(shard, &o.max_shard_bytes))
        rc = glm_fail(&err, "--max_shard_size %s is not a size", shard), glm_hint(&err, "e.g. 2GB, 5GB, or 0 for a single file");
    o.overwrite = a.overwrite_output_dir;
    double t0 = glm_now();
    if (!rc) rc = glm_ckpt_expand(a.model_name_or_path, a.num_expand, a.output_dir, &o, &err);
    if (rc) glm_err_print(&err);
    else
        glm_info("wrote %s: %d blocks added, each a copy with its output projections zeroed (the model computes what it did); "
                 "train them with --finetuning_type freeze --use_llama_pro --freeze_trainable_layers %d (%.1f s)",
                 a.output_dir, a.num_expand, a.num_expand, glm_now() - t0);
    glm_args_free(expand_flags, n, &a);
    return rc ? 1 : 0;
}
