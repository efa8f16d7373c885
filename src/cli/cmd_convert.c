/* `glmtrain convert`: a checkpoint folder (the original pytorch_model-0000X-of-0000N.bin, a
 * training checkpoint, any safetensors export) to a Hugging Face folder of safetensors shards
 * in float16, bfloat16 or float32, with config.json, tokenizer and remote-code files. Tensors
 * stream through one shard at a time: converting ChatGLM-6B needs about a shard of memory. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/hub.h"
#include "core/args.h"
#include "core/log.h"
#include "model/ckpt.h"

typedef struct convert_args {
    char *from, *to, *dtype, *max_shard_size, *layout;
    int original_layout, overwrite_output_dir;
} convert_args;

#define F(name, type, def, help) {#name, type, offsetof(convert_args, name), def, help, NULL, NULL}
static const glm_flag convert_flags[] = {
    F(from, ARG_STR, NULL, "model folder: config.json + pytorch_model*.bin or model*.safetensors (+ tokenizer)"),
    F(to, ARG_STR, NULL, "output folder"),
    {"dtype", ARG_STR, offsetof(convert_args, dtype), "float16", "dtype of the written tensors", "float16|bfloat16|float32", NULL},
    F(max_shard_size, ARG_STR, "2GB", "largest shard (HF units: 2GB = 2e9 bytes, 1GiB = 2^30; 0 = one file)"),
    F(original_layout, ARG_BOOL, "true", "also write lm_head.weight for a tied model and the rotary inv_freq buffers, as the original checkpoint"),
    F(overwrite_output_dir, ARG_BOOL, "false", "replace model weights already in --to"),
    {"layout", ARG_STR, offsetof(convert_args, layout), NULL,
     "a GLM-4 model's tensor names and config.json: THUDM's (model_type chatglm) or transformers' (model_type glm, "
     "GlmForCausalLM); default: the source's", "thudm|transformers", NULL},
};
#undef F

int glm_cmd_convert(int argc, char **argv) {
    convert_args a;
    int n = sizeof convert_flags / sizeof convert_flags[0];
    glm_err err = {0};
    glm_args_defaults(convert_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(convert_flags, n, "convert"); return 0; }
    int rc = glm_args_parse(convert_flags, n, &a, argc, argv, &err);
    if (!rc) rc = glm_hub_resolve(&a.from, "from", NULL, &err);
    glm_export_opts o;
    glm_export_opts_init(&o);
    if (!rc && (!a.from || !a.to)) rc = glm_fail(&err, "--from and --to are required");
    if (!rc && glm_parse_st_dtype(a.dtype, &o.dtype)) rc = glm_fail(&err, "--dtype %s: use float16, bfloat16 or float32", a.dtype);
    if (!rc && strcmp(a.max_shard_size, "0") && glm_parse_size(a.max_shard_size, &o.max_shard_bytes)) {
        rc = glm_fail(&err, "--max_shard_size %s is not a size", a.max_shard_size);
        glm_hint(&err, "e.g. 2GB, 500MB, 10GiB, or 0 for a single file");
    }
    o.original_layout = a.original_layout;
    o.layout = !a.layout ? -1 : !strcmp(a.layout, "transformers") ? 1 : 0;
    o.overwrite = a.overwrite_output_dir;
    double t0 = glm_now();
    if (!rc) rc = glm_ckpt_convert(a.from, a.to, &o, &err);
    if (rc) glm_err_print(&err);
    else glm_info("wrote %s (%s) in %.1f s", a.to, a.dtype, glm_now() - t0);
    glm_args_free(convert_flags, n, &a);
    return rc ? 1 : 0;
}
