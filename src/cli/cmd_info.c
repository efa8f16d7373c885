/* `glmtrain info`: the model's size and the memory plan of a training setup, computed from
 * the tensor table before anything is allocated (the same numbers train prints at start). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "ckpt/checkpoint.h"
#include "core/args.h"
#include "core/fileutil.h"
#include "core/hub.h"
#include "model/ckpt.h"
#include "model/glm.h"
#include "parallel/pipe_train.h"
#include "train/train.h"

typedef struct info_args {
    char *model_name_or_path, *init_from_config;
    int per_device_train_batch_size, max_source_length, max_target_length, cutoff_len, bf16, fp16, fp32, gradient_checkpointing;
    int chatglm6b;
    char *device_map, *max_memory_per_gpu, *optim, *offload_optimizer, *deepspeed;
    int optimizer_in_backward;
    int pipeline_parallel_size, gradient_accumulation_steps, data_parallel_size, zero_stage;
    char *finetuning_type, *lora_target, *quantization_type, *freeze_trainable_modules, *freeze_extra_modules, *additional_target;
    int lora_rank, use_dora, num_layer_trainable, pre_seq_len, prefix_projection, quantization_bit;
    double lora_dropout;
    int use_badam, badam_start_block;
    char *badam_switch_mode;
    int use_galore, galore_rank, galore_layerwise;
    char *galore_target, *galore_proj_type;
} info_args;

#define F(name, type, def, help) {#name, type, offsetof(info_args, name), def, help, NULL, NULL}
static const glm_flag info_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "model folder with config.json"),
    /* --config FILE (not a field): a training config as train reads it; the plan of that run */
    F(init_from_config, ARG_STR, NULL, "a config.json"),
    F(chatglm6b, ARG_BOOL, "false", "use the ChatGLM-6B shapes (untied head, as bench/bench_train.c)"),
    F(per_device_train_batch_size, ARG_INT, "8", "micro-batch rows"),
    F(max_source_length, ARG_INT, "1024", "prompt tokens"),
    F(max_target_length, ARG_INT, "128", "answer tokens"),
    F(cutoff_len, ARG_INT, "0", "LLaMA-Factory's: the tokens of the longest example, instead of the two lengths (as train)"),
    F(bf16, ARG_BOOL, "false", "bf16 storage"),
    F(fp16, ARG_BOOL, "false", "fp16 storage"),
    F(fp32, ARG_BOOL, "false", "fp32 storage"),
    {"gradient_checkpointing", ARG_BOOL, offsetof(info_args, gradient_checkpointing), "false",
     "recompute in backward: true = full, selective, auto (the least recompute that fits --max_memory_per_gpu)",
     GLM_CKPT_LEVELS, NULL},
    F(pipeline_parallel_size, ARG_INT, "1", "pipeline stages: the plan per stage"),
    F(device_map, ARG_STR, "auto", "auto, thudm or a JSON file module -> stage"),
    F(gradient_accumulation_steps, ARG_INT, "1", "micro-batches per step (inputs a pipeline stage stashes)"),
    F(data_parallel_size, ARG_INT, "1", "data-parallel replicas (of each stage)"),
    F(zero_stage, ARG_INT, "0", "ZeRO >= 1 divides the optimizer state by the replicas"),
    F(max_memory_per_gpu, ARG_STR, NULL, "say whether every stage fits in this (e.g. 70GiB), and if not which layouts do"),
    F(optim, ARG_STR, "adamw_torch", "adamw_torch or adamw_8bit (as train)"),
    F(offload_optimizer, ARG_STR, "none", "cpu: the optimizer state in host memory (as train)"),
    F(optimizer_in_backward, ARG_BOOL, "false", "the update inside backward: no whole-model gradient buffer (as train)"),
    F(deepspeed, ARG_STR, NULL, "a DeepSpeed config (as train): its ZeRO stage and optimizer offload enter the plan"),
    {"finetuning_type", ARG_STR, offsetof(info_args, finetuning_type), "full", "what trains (as train)", "full|lora|ptuning|freeze", NULL},
    F(lora_rank, ARG_INT, "8", "LoRA rank"),
    F(lora_dropout, ARG_FLOAT, "-1", "LoRA dropout (its scratch buffer); -1: 0.05, or 0 with --use_dora (as train)"),
    F(use_dora, ARG_BOOL, "false", "DoRA (as train): each adapted module's output kept for the magnitude's gradient"),
    F(lora_target, ARG_STR, "query_key_value", "LoRA modules (as train)"),
    F(num_layer_trainable, ARG_INT, "2", "freeze: the last N layers train (N < 0: the first -N)"),
    F(use_badam, ARG_BOOL, "false", "BAdam (as train, with --finetuning_type full): one whole layer trains at a time; the plan "
      "is that of the lowest layer the order reaches"),
    {"badam_switch_mode", ARG_STR, offsetof(info_args, badam_switch_mode), "ascending", "BAdam's order (as train)",
     "ascending|descending|random|fixed", NULL},
    F(badam_start_block, ARG_INT, "-1", "BAdam's first layer (as train)"),
    F(use_galore, ARG_BOOL, "false", "GaLore (as train): the projected weights' moments are rank --galore_rank projections"),
    F(galore_rank, ARG_INT, "16", "GaLore's rank (as train)"),
    F(galore_target, ARG_STR, "all", "GaLore's modules (as train)"),
    F(galore_layerwise, ARG_BOOL, "false", "GaLore inside backward, layer by layer (as train: --optimizer_in_backward)"),
    {"galore_proj_type", ARG_STR, offsetof(info_args, galore_proj_type), "std", "GaLore's projection side (as train)",
     "std|reverse_std|right|left|full", NULL},
    F(freeze_trainable_modules, ARG_STR, "all", "freeze: the modules of those layers that train (as train)"),
    F(freeze_extra_modules, ARG_STR, "", "freeze: modules outside the layers that train too (as train)"),
    F(additional_target, ARG_STR, "", "LoRA: modules outside the layers that train whole beside the adapters (as train)"),
    F(pre_seq_len, ARG_INT, "0", "P-Tuning v2 prefix length (as train)"),
    F(prefix_projection, ARG_BOOL, "false", "P-Tuning v2 with the projection MLP"),
    F(quantization_bit, ARG_INT, "0", "4 or 8: the frozen linear weights quantized (as train)"),
    {"quantization_type", ARG_STR, offsetof(info_args, quantization_type), "int", "int or nf4 (as train)", "int|nf4", NULL},
};
#undef F

static void row(const char *what, double bytes) { printf("  %-28s %10.2f GiB\n", what, bytes / 1073741824.0); }

static glm_par_opts opts_of(const info_args *a) {
    return (glm_par_opts){.per_device_train_batch_size = a->per_device_train_batch_size,
                          .seq_len = a->cutoff_len > 0 ? a->cutoff_len : a->max_source_length + a->max_target_length,
                          .gradient_checkpointing = a->gradient_checkpointing, .fp16 = a->fp16, .fp32 = a->fp32,
                          .gradient_accumulation_steps = a->gradient_accumulation_steps,
                          .pipeline_parallel_size = a->pipeline_parallel_size, .device_map = a->device_map,
                          .zero_stage = a->zero_stage, .max_memory_per_gpu = a->max_memory_per_gpu, .optim = a->optim,
                          .offload_optimizer = a->offload_optimizer, .optimizer_in_backward = a->optimizer_in_backward};
}

/* With stages (or a memory cap): the plan of each stage for the device map. */
static int stage_plans(const info_args *a, const glm_config *c, glm_err *err) {
    int states = strcmp(a->optim, "adamw_torch") || strcmp(a->offload_optimizer, "none") || a->optimizer_in_backward;
    if (a->pipeline_parallel_size <= 1 && !a->max_memory_per_gpu && !states && (!a->device_map || !strcmp(a->device_map, "auto")))
        return 0;
    glm_par_opts t = opts_of(a);
    int cuda = a->bf16 || a->fp16, D = a->data_parallel_size > 1 ? a->data_parallel_size : 1;
    glm_device_map map;
    glm_stage_shape sh;
    if (glm_pp_map(&t, c, cuda, &map, &sh, err)) return -1;
    sh.dp = a->zero_stage >= 1 ? D : 1;
    sh.zero2 = a->zero_stage >= 2;
    sh.zero3 = a->zero_stage == 3;
    printf("pipeline: %d stage%s (%s) x %d data-parallel replica%s, %d micro-batches per step:\n", map.n,
           map.n > 1 ? "s" : "", map.n > 1 ? map.source : "whole model", D, D > 1 ? "s" : "", sh.n_micro);
    glm_device_map_print(stdout, &map);
    double G = 1048576.0; /* small models in MiB, so the numbers say something */
    for (int k = 0; k < map.n; k++)
        if (glm_stage_memory_plan(c, &map, k, &sh).total >= 1073741824.0) G = 1073741824.0;
    printf("  %-6s %9s %9s %9s %9s %11s %9s %9s  (%s)\n", "stage", "weights", "grads", "master", "moments",
           "activations", "scratch", "total", G > 1048576.0 ? "GiB" : "MiB");
    for (int k = 0; k < map.n; k++) {
        glm_mem_plan p = glm_stage_memory_plan(c, &map, k, &sh);
        printf("  %-6d %9.2f %9.2f %9.2f %9.2f %11.2f %9.2f %9.2f\n", k, p.params / G, p.grads / G, p.master / G,
               p.moments / G, p.activations / G, p.scratch / G, p.total / G);
        if (p.host > 0) printf("  %-6s host memory %.2f (the offloaded optimizer state, master weights and staging)\n", "", p.host / G);
    }
    if (!a->max_memory_per_gpu) return 0;
    t.pipeline_parallel_size = map.n;
    glm_err e2 = {0};
    if (glm_pp_check_memory(&t, c, cuda, D * map.n, &e2) == 0) printf("every stage fits in %s\n", a->max_memory_per_gpu);
    else printf("does not fit: %s\n%s%s\n", e2.msg, e2.hint[0] ? "hint: " : "", e2.hint);
    return 0;
}

/* --deepspeed: the file read as train reads it, for what shapes the plan (the ZeRO stage, the
 * optimizer's place); its values that train would hold against the training flags are only noted,
 * since info has no learning rate or schedule to hold them against. */
static int info_deepspeed(info_args *a, glm_err *err) {
    glm_train_args t = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &t);
    t.deepspeed = glm_strdup(a->deepspeed);
    free(t.offload_optimizer);
    t.offload_optimizer = glm_strdup(a->offload_optimizer);
    free(t.optim);
    t.optim = glm_strdup(a->optim);
    t.per_device_train_batch_size = a->per_device_train_batch_size;
    t.gradient_accumulation_steps = a->gradient_accumulation_steps;
    t.bf16 = a->bf16;
    t.fp16 = a->fp16;
    t.zero_stage = a->zero_stage ? a->zero_stage : 1; /* train's default: the file's stage is taken over it */
    glm_err e = {0};
    int rc = glm_ds_apply(&t, &e);
    if (rc && !t.ds.on) { *err = e; glm_train_args_free(&t); return -1; } /* the file itself is unusable */
    if (rc && strstr(e.msg, "differ from the training flags")) { /* train's check against its flags */
        printf("note: %s\n", e.msg);
        rc = 0;
    }
    if (rc) { *err = e; glm_train_args_free(&t); return -1; }
    a->zero_stage = t.zero_stage;
    free(a->offload_optimizer);
    a->offload_optimizer = glm_strdup(t.offload_optimizer);
    printf("%s: ZeRO stage %d, optimizer %s\n", a->deepspeed, a->zero_stage,
           strcmp(a->offload_optimizer, "cpu") ? "on the GPU" : "offloaded to host memory");
    glm_train_args_free(&t);
    return 0;
}

/* The flags of info alone (not train's), and how many words each takes. */
static int info_only(const char *s) {
    return !strcmp(s, "--chatglm6b") ? 1 : !strcmp(s, "--data_parallel_size") ? 2 : 0;
}

static void set_str(char **dst, const char *v) {
    free(*dst);
    *dst = v ? glm_strdup(v) : NULL;
}

/* --config FILE: a training configuration (any file train takes: flat YAML or JSON, LLaMA-Factory's
 * and finetune_hf.py's keys, a --deepspeed file inside it) read by train's own parser, the plan
 * then made from what train would use; the command line's other train flags go on top, info's
 * own (--chatglm6b, --data_parallel_size) after them. */
static int from_train_config(info_args *a, int argc, char **argv, glm_err *err) {
    char **targ = glm_calloc((size_t)argc + 1, sizeof *targ), **iarg = glm_calloc((size_t)argc + 1, sizeof *iarg);
    int nt = 0, ni = 0;
    for (int i = 0; i < argc; i++) {
        int k = info_only(argv[i]);
        if (!k) { targ[nt++] = argv[i]; continue; }
        iarg[ni++] = argv[i];
        if (k == 2 && i + 1 < argc) iarg[ni++] = argv[++i];
        else if (k == 1 && i + 1 < argc && (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false"))) iarg[ni++] = argv[++i];
    }
    glm_train_args t = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &t);
    int rc = glm_args_parse_ex(glm_train_flags, glm_train_nflags, &t, nt, targ, glm_train_config_key, err) ||
             glm_train_resolve_args(&t, err);
    if (!rc) {
        set_str(&a->model_name_or_path, t.model_name_or_path);
        set_str(&a->init_from_config, t.init_from_config);
        set_str(&a->device_map, t.device_map ? t.device_map : "auto");
        set_str(&a->max_memory_per_gpu, t.max_memory_per_gpu);
        set_str(&a->optim, t.optim);
        set_str(&a->offload_optimizer, t.offload_optimizer);
        set_str(&a->finetuning_type, t.finetuning_type);
        set_str(&a->lora_target, t.lora_target);
        set_str(&a->freeze_trainable_modules, t.freeze_trainable_modules);
        set_str(&a->freeze_extra_modules, t.freeze_extra_modules);
        set_str(&a->additional_target, t.additional_target);
        set_str(&a->quantization_type, t.quantization_type);
        set_str(&a->badam_switch_mode, t.badam_switch_mode);
        set_str(&a->galore_target, t.galore_target);
        set_str(&a->galore_proj_type, t.galore_proj_type);
        set_str(&a->deepspeed, NULL); /* train's reading of it is in t already */
        a->per_device_train_batch_size = t.per_device_train_batch_size;
        a->max_source_length = t.max_source_length;
        a->max_target_length = t.max_target_length;
        a->cutoff_len = t.cutoff_len;
        a->bf16 = t.bf16; a->fp16 = t.fp16; a->fp32 = t.fp32;
        a->gradient_checkpointing = t.gradient_checkpointing;
        a->pipeline_parallel_size = t.pipeline_parallel_size;
        a->gradient_accumulation_steps = t.gradient_accumulation_steps;
        a->zero_stage = t.zero_stage;
        a->optimizer_in_backward = t.optimizer_in_backward;
        a->lora_rank = t.lora_rank; a->lora_dropout = t.lora_dropout; a->use_dora = t.use_dora;
        a->num_layer_trainable = t.num_layer_trainable;
        a->pre_seq_len = t.pre_seq_len; a->prefix_projection = t.prefix_projection;
        a->quantization_bit = t.quantization_bit;
        a->use_badam = t.use_badam; a->badam_start_block = t.badam_start_block;
        a->use_galore = t.use_galore; a->galore_rank = t.galore_rank; a->galore_layerwise = t.galore_layerwise;
        if (t.nproc_per_node && atoi(t.nproc_per_node) > 1) a->data_parallel_size = atoi(t.nproc_per_node);
        if (t.pipeline_parallel_size > 1 && a->data_parallel_size > 1) a->data_parallel_size /= t.pipeline_parallel_size;
        rc = glm_args_parse(info_flags, sizeof info_flags / sizeof info_flags[0], a, ni, iarg, err);
    }
    glm_train_args_free(&t);
    free(targ);
    free(iarg);
    return rc ? -1 : 0;
}

int glm_cmd_info(int argc, char **argv) {
    info_args a;
    int n = sizeof info_flags / sizeof info_flags[0];
    glm_err err = {0};
    glm_args_defaults(info_flags, n, &a);
    int config = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) { glm_args_usage(info_flags, n, "info"); return 0; }
        config |= !strcmp(argv[i], "--config");
    }
    int rc = config ? from_train_config(&a, argc, argv, &err) : glm_args_parse(info_flags, n, &a, argc, argv, &err);
    if (!rc) rc = glm_hub_resolve(&a.model_name_or_path, "model_name_or_path", NULL, &err);
    if (a.galore_layerwise && a.use_galore) a.optimizer_in_backward = 1; /* as train's reading of it */
    if (!rc && a.deepspeed) rc = info_deepspeed(&a, &err);
    glm_config c = glm_config_chatglm6b();
    if (a.chatglm6b) c.tie_word_embeddings = 0;
    else if (!rc && (a.model_name_or_path || a.init_from_config))
        rc = glm_config_load(&c, a.model_name_or_path ? a.model_name_or_path : a.init_from_config, &err);
    else if (!rc) rc = glm_fail(&err, "--model_name_or_path, --init_from_config or --chatglm6b is required");
    glm_train_args ta = {.finetuning_type = a.finetuning_type, .lora_target = a.lora_target, .lora_rank = a.lora_rank,
                         .lora_dropout = glm_train_lora_dropout(a.lora_dropout, a.use_dora),
                         .use_dora = a.use_dora, .num_layer_trainable = a.num_layer_trainable,
                         .freeze_trainable_modules = a.freeze_trainable_modules, .freeze_extra_modules = a.freeze_extra_modules,
                         .additional_target = a.additional_target,
                         .pre_seq_len = a.pre_seq_len, .prefix_projection = a.prefix_projection, .prefix_dropout = 0.1,
                         .pipeline_parallel_size = a.pipeline_parallel_size, .use_badam = a.use_badam,
                         .badam_mode = "layer", .badam_switch_mode = a.badam_switch_mode,
                         .badam_start_block = a.badam_start_block, .badam_switch_interval = 50};
    if (!rc) rc = glm_train_peft(&ta, &c, &c.peft, &err);
    int galore = 0; /* the weights GaLore projects */
    if (!rc && a.use_galore) { /* train's defaults for what info has no flag for (the interval, the scale) */
        glm_train_args tg;
        glm_args_defaults(glm_train_flags, glm_train_nflags, &tg);
        tg.galore_rank = a.galore_rank;
        set_str(&tg.galore_target, a.galore_target);
        set_str(&tg.galore_proj_type, a.galore_proj_type);
        set_str(&tg.optim, a.optim);
        galore = glm_train_galore(&tg, &c, &err);
        if (galore < 0) rc = -1;
        glm_args_free(glm_train_flags, glm_train_nflags, &tg);
    }
    if (!rc && c.peft.badam) { /* the deepest backward the run reaches */
        glm_badam b;
        glm_train_badam(&ta, c.num_layers, &b);
        c.peft.badam_layer = glm_badam_lowest(&b);
    }
    if (!rc) rc = glm_config_set_quant(&c, a.quantization_bit, a.quantization_type,
                                       a.model_name_or_path ? a.model_name_or_path : "the model", &err);
    if (rc) { glm_err_print(&err); return 1; }
    static const char *const levels[] = {"", ", gradient checkpointing", ", selective checkpointing"};
    if (a.gradient_checkpointing == GLM_CKPT_AUTO) { /* the least recompute that fits the cap (none without one) */
        size_t cap = 0;
        if (a.max_memory_per_gpu && glm_parse_size(a.max_memory_per_gpu, &cap)) cap = 0; /* stage_plans reports it */
        glm_par_opts t = opts_of(&a);
        double plan = 0;
        a.gradient_checkpointing = glm_pp_pick_checkpointing(&t, &c, a.bf16 || a.fp16, a.data_parallel_size > 1 ? a.data_parallel_size : 1,
                                                             (double)cap, &plan);
        printf("--gradient_checkpointing auto: %s\n", glm_ckpt_level_name(a.gradient_checkpointing));
    }
    glm_dtype dt = a.fp32 ? GLM_F32 : a.fp16 ? GLM_F16 : a.bf16 ? GLM_BF16 : GLM_F32;
    int T = a.cutoff_len > 0 ? a.cutoff_len : a.max_source_length + a.max_target_length, B = a.per_device_train_batch_size;
    glm_mem_plan p = glm_memory_plan(&c, dt, B, T, a.gradient_checkpointing, a.bf16 || a.fp16 ? 2048 : 256);
    glm_table tab;
    glm_table_build(&tab, &c);
    printf("model: %d layers, hidden %d, heads %d, MLP %d, vocab %d, %s head: %.3fB parameters\n", c.num_layers,
           c.hidden_size, c.num_attention_heads, c.inner_hidden_size, c.vocab_size,
           c.tie_word_embeddings ? "tied" : "untied", tab.n_params / 1e9);
    if (c.peft.kind != GLM_FT_FULL) {
        glm_table tr;
        glm_table_build_range(&tr, &c, 0, c.num_layers, 1, 1);
        printf("finetuning %s: %.3fM trainable parameters (gradients, master weights and moments for those only)\n",
               a.finetuning_type, tr.n_params / 1e6);
        char what[320];
        if (c.peft.kind == GLM_FT_FREEZE) printf("freeze: %s train\n", glm_freeze_describe(&c, &c.peft, what, sizeof what));
        glm_table_free(&tr);
    }
    if (galore > 0)
        printf("GaLore: %d linear weights keep rank-%d projections of their AdamW moments (%s), the other rows full ones\n",
               galore, c.peft.galore_rank, a.galore_proj_type);
    if (c.quant != GLM_Q_NONE) {
        glm_table q;
        glm_table_build_part(&q, &c, 0, c.num_layers, 1, 1, 64, GLM_PART_QUANT);
        printf("quantized %s: %d linear weights, %.3fB parameters in %.2f GiB (%.2f bytes each)\n",
               glm_qtype_name((glm_qtype)c.quant), q.n, q.n_params / 1e9, q.total / 1073741824.0,
               q.n_params ? (double)q.total / q.n_params : 0.0);
        glm_table_free(&q);
    }
    printf("memory plan per device (%s, micro-batch %d x %d tokens%s):\n", dt == GLM_F32 ? "fp32" : dt == GLM_BF16 ? "bf16" : "fp16",
           B, T, levels[a.gradient_checkpointing]);
    row("weights", p.params);
    row("gradients", p.grads);
    row("fp32 master weights", p.master);
    row(galore > 0 ? "AdamW moments (fp32, GaLore)" : "AdamW moments (fp32)", p.moments);
    row("activations", p.activations);
    row("backward scratch + head", p.scratch);
    row("total", p.total);
    glm_table_free(&tab);
    { /* what train's saves write (train/disk.c says it again against the output folder's disk) */
        int kinds = 2 + (dt != GLM_F32) + (strstr(a.optim, "8bit") != NULL);
        char ck[32], f32[32], f16[32];
        glm_fmt_bytes(ck, sizeof ck, glm_checkpoint_bytes(&c, kinds, NULL, 0));
        glm_fmt_bytes(f32, sizeof f32, glm_final_model_bytes(&c, 4, NULL, 0));
        glm_fmt_bytes(f16, sizeof f16, glm_final_model_bytes(&c, 2, NULL, 0));
        /* a --save_only_model checkpoint is the final model's size */
        if (c.peft.kind == GLM_FT_LORA || c.peft.kind == GLM_FT_PTUNING) /* adapters are written in fp32 */
            printf("disk: a checkpoint about %s (trainable rows and optimizer state), the final %s about %s (and so a "
                   "checkpoint with --save_only_model true)\n", ck, c.peft.kind == GLM_FT_LORA ? "adapter" : "prefix encoder", f32);
        else
            printf("disk: a checkpoint about %s (weights and optimizer state), the final model about %s as float32, %s as "
                   "bfloat16 (--save_dtype; and so a checkpoint with --save_only_model true)\n", ck, f32, f16);
    }
    if (stage_plans(&a, &c, &err)) { glm_err_print(&err); rc = 1; }
    glm_args_free(info_flags, n, &a);
    return rc;
}
