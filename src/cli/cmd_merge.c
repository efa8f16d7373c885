/* `glmtrain merge`: a base model and a LoRA adapter (glmtrain's or peft's) into one Hugging Face
 * folder, W += scaling * B A, streamed tensor by tensor (model/adapter.h): merging ChatGLM-6B
 * needs about one tensor of memory, no GPU. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/hub.h"
#include "core/args.h"
#include "core/log.h"
#include "model/adapter.h"
#include "model/config.h"

typedef struct merge_args {
    char *model_name_or_path, *adapter, *output_dir, *dtype, *max_shard_size;
    int overwrite_output_dir, quantization_bit;
    /* LLaMA-Factory's export (llamafactory-cli export, examples/merge_lora YAML files) names */
    char *adapter_name_or_path, *export_dir, *template, *finetuning_type, *export_device;
    int export_size, export_legacy_format, export_quantization_bit;
} merge_args;

#define F(name, type, def, help) {#name, type, offsetof(merge_args, name), def, help, NULL, NULL}
static const glm_flag merge_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "the base model folder the adapter was trained on"),
    F(adapter, ARG_STR, NULL, "LoRA adapter folder (adapter_config.json + adapter_model.safetensors/.bin), or a comma list "
      "of them merged in turn (LLaMA-Factory's export of several adapters)"),
    F(output_dir, ARG_STR, NULL, "where the merged model goes"),
    {"dtype", ARG_STR, offsetof(merge_args, dtype), "float16", "dtype of the written tensors", "float16|bfloat16|float32", NULL},
    F(max_shard_size, ARG_STR, "10GB", "largest shard (10GB = 1e10 bytes, 1GiB = 2^30; 0 = one file)"),
    F(overwrite_output_dir, ARG_BOOL, "false", "replace model weights already in --output_dir"),
    F(quantization_bit, ARG_INT, "0", "4 or 8: write the merged linear weights quantized (THUDM's chatglm-6b-int4/int8 layout); 0 = floats"),
    F(adapter_name_or_path, ARG_STR, NULL, "LLaMA-Factory's name for --adapter"),
    F(export_dir, ARG_STR, NULL, "LLaMA-Factory's name for --output_dir"),
    F(export_size, ARG_INT, "0", "LLaMA-Factory's shard size in GB (sets --max_shard_size NGB)"),
    F(template, ARG_STR, NULL, "LLaMA-Factory's; the model's own tokenizer files are copied, nothing to choose"),
    F(finetuning_type, ARG_STR, "lora", "LLaMA-Factory's; only LoRA adapters merge"),
    F(export_device, ARG_STR, "cpu", "LLaMA-Factory's; glmtrain merges tensor by tensor on the CPU"),
    F(export_legacy_format, ARG_BOOL, "false", "LLaMA-Factory's: true would write .bin files; glmtrain writes safetensors"),
    F(export_quantization_bit, ARG_INT, "0", "LLaMA-Factory's GPTQ export, which glmtrain has not: see --quantization_bit"),
};

/* LLaMA-Factory's export names onto merge's own; 0 or -1 with err */
static int take_export_names(merge_args *a, glm_err *err) {
    if (a->adapter_name_or_path) {
        if (a->adapter) return glm_fail(err, "--adapter and --adapter_name_or_path both given"), glm_hint(err, "give one");
        a->adapter = glm_strdup(a->adapter_name_or_path);
    }
    if (a->export_dir) {
        if (a->output_dir) return glm_fail(err, "--output_dir and --export_dir both given"), glm_hint(err, "give one");
        a->output_dir = glm_strdup(a->export_dir);
    }
    if (a->export_size < 0) return glm_fail(err, "--export_size %d: a size in GB", a->export_size);
    if (a->export_size > 0) {
        char s[32];
        snprintf(s, sizeof s, "%dGB", a->export_size); /* LLaMA-Factory passes f"{export_size}GB" to save_pretrained */
        free(a->max_shard_size);
        a->max_shard_size = glm_strdup(s);
    }
    if (strcmp(a->finetuning_type, "lora"))
        return glm_fail(err, "--finetuning_type %s: only a LoRA adapter merges into the weights", a->finetuning_type),
               glm_hint(err, "a %s run's output folder already holds the whole model (P-Tuning v2's prefix cannot merge)",
                        a->finetuning_type);
    if (a->export_legacy_format)
        return glm_fail(err, "--export_legacy_format true asks for .bin files; glmtrain writes safetensors"),
               glm_hint(err, "drop it (THUDM's code and transformers read safetensors; glmtrain convert reads .bin)");
    if (a->export_quantization_bit)
        return glm_fail(err, "--export_quantization_bit %d is LLaMA-Factory's GPTQ export, which glmtrain has not",
                        a->export_quantization_bit),
               glm_hint(err, "--quantization_bit 4|8 writes THUDM's INT4/INT8 layout (chatglm-6b-int4), which THUDM's code loads");
    return 0;
}
#undef F

int glm_cmd_merge(int argc, char **argv) {
    merge_args a;
    int n = sizeof merge_flags / sizeof merge_flags[0];
    glm_err err = {0};
    glm_args_defaults(merge_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(merge_flags, n, "merge"); return 0; }
    int rc = glm_args_parse(merge_flags, n, &a, argc, argv, &err);
    if (!rc) rc = take_export_names(&a, &err);
    if (!rc && (glm_hub_resolve(&a.model_name_or_path, "model_name_or_path", NULL, &err) || glm_hub_resolve_list(&a.adapter, "adapter", &err)))
        rc = -1;
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
    glm_args_free(merge_flags, n, &a);
    return rc ? 1 : 0;
}
