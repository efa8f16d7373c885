/* `glmtrain info`: the model's size and the memory plan of a training setup, computed from
 * the tensor table before anything is allocated (the same numbers train prints at start). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/args.h"
#include "model/glm.h"

typedef struct info_args {
    char *model_name_or_path, *init_from_config;
    int per_device_train_batch_size, max_source_length, max_target_length, bf16, fp16, fp32, gradient_checkpointing;
    int chatglm6b;
} info_args;

#define F(name, type, def, help) {#name, type, offsetof(info_args, name), def, help, NULL, NULL}
static const glm_flag info_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "model folder with config.json"),
    F(init_from_config, ARG_STR, NULL, "a config.json"),
    F(chatglm6b, ARG_BOOL, "false", "use the ChatGLM-6B shapes (untied head, as the W1/W2 benchmarks)"),
    F(per_device_train_batch_size, ARG_INT, "8", "micro-batch rows"),
    F(max_source_length, ARG_INT, "1024", "prompt tokens"),
    F(max_target_length, ARG_INT, "128", "answer tokens"),
    F(bf16, ARG_BOOL, "false", "bf16 storage"),
    F(fp16, ARG_BOOL, "false", "fp16 storage"),
    F(fp32, ARG_BOOL, "false", "fp32 storage"),
    F(gradient_checkpointing, ARG_BOOL, "false", "recompute layers in backward"),
};
#undef F

static void row(const char *what, double bytes) { printf("  %-28s %10.2f GiB\n", what, bytes / 1073741824.0); }

int glm_cmd_info(int argc, char **argv) {
    info_args a;
    int n = sizeof info_flags / sizeof info_flags[0];
    glm_err err = {0};
    glm_args_defaults(info_flags, n, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help")) { glm_args_usage(info_flags, n, "info"); return 0; }
    int rc = glm_args_parse(info_flags, n, &a, argc, argv, &err);
    glm_config c = glm_config_chatglm6b();
    if (a.chatglm6b) c.tie_word_embeddings = 0;
    else if (!rc && (a.model_name_or_path || a.init_from_config))
        rc = glm_config_load(&c, a.model_name_or_path ? a.model_name_or_path : a.init_from_config, &err);
    else if (!rc) rc = glm_fail(&err, "--model_name_or_path, --init_from_config or --chatglm6b is required");
    if (rc) { glm_err_print(&err); return 1; }
    glm_dtype dt = a.fp32 ? GLM_F32 : a.fp16 ? GLM_F16 : a.bf16 ? GLM_BF16 : GLM_F32;
    int T = a.max_source_length + a.max_target_length, B = a.per_device_train_batch_size;
    glm_mem_plan p = glm_memory_plan(&c, dt, B, T, a.gradient_checkpointing, 256);
    glm_table tab;
    glm_table_build(&tab, &c);
    printf("model: %d layers, hidden %d, heads %d, MLP %d, vocab %d, %s head: %.3fB parameters\n", c.num_layers,
           c.hidden_size, c.num_attention_heads, c.inner_hidden_size, c.vocab_size,
           c.tie_word_embeddings ? "tied" : "untied", tab.n_params / 1e9);
    printf("memory plan per device (%s, micro-batch %d x %d tokens%s):\n", dt == GLM_F32 ? "fp32" : dt == GLM_BF16 ? "bf16" : "fp16",
           B, T, a.gradient_checkpointing ? ", gradient checkpointing" : "");
    row("weights", p.params);
    row("gradients", p.grads);
    row("fp32 master weights", p.master);
    row("AdamW moments (fp32)", p.moments);
    row("activations", p.activations);
    row("backward scratch + head", p.scratch);
    row("total", p.total);
    glm_table_free(&tab);
    for (int i = 0; i < n; i++) if (info_flags[i].type == ARG_STR) free(*(char **)((char *)&a + info_flags[i].offset));
    return 0;
}
