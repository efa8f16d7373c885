/* `glmtrain quantize`: a model folder with its linear weights quantized as THUDM's
 * chatglm-6b-int8 / chatglm-6b-int4 downloads hold them (model/ckpt.h glm_export_opts.quant),
 * streamed tensor by tensor: about one shard of memory, no GPU. The folder loads in glmtrain
 * and in THUDM's code (config.json says quantization_bit; the code files come along). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/hub.h"
#include "core/args.h"
#include "core/log.h"
#include "model/ckpt.h"

typedef struct quantize_args {
    char *model_name_or_path, *output_dir, *quantization_type, *dtype, *max_shard_size;
    int quantization_bit, overwrite_output_dir;
} quantize_args;

#define F(name, type, def, help) {#name, type, offsetof(quantize_args, name), def, help, NULL, NULL}
static const glm_flag quantize_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "the model folder (float16/bfloat16/float32 weights, or an already quantized one)"),
    F(quantization_bit, ARG_INT, NULL, "4 or 8: THUDM's INT4 (two per byte) or INT8, per-row absmax with fp16 scales"),
    {"quantization_type", ARG_STR, offsetof(quantize_args, quantization_type), "int", "int (THUDM's); nf4 is quantized as a model loads, not written", "int|nf4", NULL},
    F(output_dir, ARG_STR, NULL, "where the quantized model goes"),
    {"dtype", ARG_STR, offsetof(quantize_args, dtype), "float16", "dtype of the other tensors (THUDM's are float16)", "float16|bfloat16|float32", NULL},
    F(max_shard_size, ARG_STR, "10GB", "largest shard (10GB = 1e10 bytes, 1GiB = 2^30; 0 = one file)"),
    F(overwrite_output_dir, ARG_BOOL, "false", "replace model weights already in --output_dir"),
};
#undef F

int glm_cmd_quantize(int argc, char **argv) {
    quantize_args a;
    int n = sizeof quantize_flags / sizeof quantize_flags[0];
    glm_err err = {0};
    glm_args_defaults(quantize_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(quantize_flags, n, "quantize"); return 0; }
    a.quantization_bit = -1;
    int rc = glm_args_parse(quantize_flags, n, &a, argc, argv, &err);
    if (!rc) rc = glm_hub_resolve(&a.model_name_or_path, "model_name_or_path", NULL, &err);
    glm_export_opts o;
    glm_export_opts_init(&o);
    if (!rc && (!a.model_name_or_path || !a.output_dir || a.quantization_bit < 0))
        rc = glm_fail(&err, "--model_name_or_path, --quantization_bit and --output_dir are required"),
        glm_hint(&err, "e.g. glmtrain quantize --model_name_or_path chatglm-6b --quantization_bit 4 --output_dir chatglm-6b-int4");
    if (!rc && strcmp(a.quantization_type, "nf4") == 0)
        rc = glm_fail(&err, "--quantization_type nf4: NF4 folders are not written (THUDM's code cannot load them)"),
        glm_hint(&err, "pass --quantization_type nf4 to train/generate/chat instead: the float model is quantized as it loads");
    if (!rc && a.quantization_bit == 0)
        rc = glm_fail(&err, "--quantization_bit 0: quantize needs 4 or 8"), glm_hint(&err, "use --quantization_bit 4 (INT4) or 8 (INT8)");
    if (!rc) rc = glm_quant_parse(a.quantization_bit, NULL, &o.quant, &err);
    if (!rc && glm_parse_st_dtype(a.dtype, &o.dtype)) rc = glm_fail(&err, "--dtype %s: use float16, bfloat16 or float32", a.dtype);
    if (!rc && strcmp(a.max_shard_size, "0") && glm_parse_size(a.max_shard_size, &o.max_shard_bytes))
        rc = glm_fail(&err, "--max_shard_size %s is not a size", a.max_shard_size), glm_hint(&err, "e.g. 10GB, 2GiB, or 0 for one file");
    o.overwrite = a.overwrite_output_dir;
    glm_config c;
    if (!rc && glm_config_load(&c, a.model_name_or_path, &err)) rc = -1;
    if (!rc && c.quant != GLM_Q_NONE && c.quant != o.quant) {
        rc = glm_fail(&err, "%s is already quantized as %s; re-quantizing it as int%d would compound the rounding",
                      a.model_name_or_path, glm_qtype_name((glm_qtype)c.quant), a.quantization_bit);
        glm_hint(&err, "quantize the float16 model instead");
    }
    double t0 = glm_now();
    if (!rc) rc = glm_ckpt_convert(a.model_name_or_path, a.output_dir, &o, &err);
    if (rc) glm_err_print(&err);
    else glm_info("quantized %s to %s: int%d linear weights, %s elsewhere, in %.1f s", a.model_name_or_path, a.output_dir,
                  a.quantization_bit, a.dtype, glm_now() - t0);
    glm_args_free(quantize_flags, n, &a);
    return rc ? 1 : 0;
}
