/* `glmtrain merge`: a base model and a LoRA adapter (glmtrain's or peft's) into one Hugging Face
 * folder, W += scaling * B A, streamed tensor by tensor (model/adapter.h): merging ChatGLM-6B
 * needs about one tensor of memory, no GPU. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/args.h"
#include "core/log.h"
#include "model/adapter.h"
#include "model/config.h"

typedef struct merge_args {
    char *model_name_or_path, *adapter, *output_dir, *dtype, *max_shard_size;
    int overwrite_output_dir, quantization_bit;
} merge_args;

#define F(name, type, def, help) {#name, type, offsetof(merge_args, name), def, help, NULL, NULL}
static const glm_flag merge_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "the base model folder the adapter was trained on"),
    F(adapter, ARG_STR, NULL, "LoRA adapter folder (adapter_config.json + adapter_model.safetensors/.bin)"),
    F(output_dir, ARG_STR, NULL, "where the merged model goes"),
    {"dtype", ARG_STR, offsetof(merge_args, dtype), "float16", "dtype of the written tensors", "float16|bfloat16|float32", NULL},
    F(max_shard_size, ARG_STR, "10GB", "largest shard (10GB = 1e10 bytes, 1GiB = 2^30; 0 = one file)"),
    F(overwrite_output_dir, ARG_BOOL, "false", "replace model weights already in --output_dir"),
    F(quantization_bit, ARG_INT, "0", "4 or 8: write the merged linear weights quantized (THUDM's chatglm-6b-int4/int8 layout); 0 = floats"),
};
#undef F

int glm_cmd_merge(int argc, char **argv) {
    merge_args a;
    int n = sizeof merge_flags / sizeof merge_flags[0];
    glm_err err = {0};
    glm_args_defaults(merge_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(merge_flags, n, "merge"); return 0; }
    int rc = glm_args_parse(merge_flags, n, &a, argc, argv, &err);
    glm_export_opts o;
    glm_export_opts_init(&o);
    if (!rc && (!a.model_name_or_path || !a.adapter || !a.output_dir))
        rc = glm_fail(&err, "--model_name_or_path, --adapter and --output_dir are required"),
        glm_hint(&err, "e.g. glmtrain merge --model_name_or_path chatglm-6b --adapter out --output_dir merged");
    if (!rc && glm_parse_st_dtype(a.dtype, &o.dtype)) rc = glm_fail(&err, "--dtype %s: use float16, bfloat16 or float32", a.dtype);
    if (!rc && strcmp(a.max_shard_size, "0") && glm_parse_size(a.max_shard_size, &o.max_shard_bytes))
        rc = glm_fail(&err, "--max_shard_size %s is not a size", a.max_shard_size), glm_hint(&err, "e.g. 10GB, 2GiB, or 0 for one file");
    o.overwrite = a.overwrite_output_dir;
    if (!rc) rc = glm_quant_parse(a.quantization_bit, NULL, &o.quant, &err);
    double t0 = glm_now();
    if (!rc) rc = glm_adapter_merge(a.model_name_or_path, a.adapter, a.output_dir, &o, &err);
    if (rc) glm_err_print(&err);
    else glm_info("merged %s into %s: %s (%s) in %.1f s", a.adapter, a.model_name_or_path, a.output_dir, a.dtype, glm_now() - t0);
    for (int i = 0; i < n; i++)
        if (merge_flags[i].type == ARG_STR) free(*(char **)((char *)&a + merge_flags[i].offset));
    return rc ? 1 : 0;
}
