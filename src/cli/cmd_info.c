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
#include "parallel/pipe/pipe_train.h"
#include "train/train.h"

/* info's own flags; every other flag is train's, read by train's parser (glm_train_flags, --config
 * FILE too), so the plan is that of the run train would make from the same words */
typedef struct info_args {
    int chatglm6b, data_parallel_size;
} info_args;

#define F(name, type, def, help) {#name, type, offsetof(info_args, name), def, help, NULL, NULL}
static const glm_flag info_flags[] = {
    F(chatglm6b, ARG_BOOL, "false", "use the ChatGLM-6B shapes (untied head, as bench/bench_train.c) instead of a model folder"),
    F(data_parallel_size, ARG_INT, "1", "data-parallel replicas (of each stage); train's --nproc_per_node gives it too"),
};
#undef F
#define INFO_NFLAGS ((int)(sizeof info_flags / sizeof info_flags[0]))

static void row(const char *what, double bytes) { printf("  %-28s %10.2f GiB\n", what, bytes / 1073741824.0); }

/* With stages (or a memory cap): the plan of each stage for the device map; D data-parallel
 * replicas of each. */
static int stage_plans(const glm_train_args *a, int D, const glm_config *c, glm_err *err) {
    int states = strcmp(a->optim, "adamw_torch") || strcmp(a->offload_optimizer, "none") || a->optimizer_in_backward;
    if (a->pipeline_parallel_size <= 1 && !a->max_memory_per_gpu && !states && (!a->device_map || !strcmp(a->device_map, "auto")))
        return 0;
    glm_par_opts t = glm_train_par_opts(a);
    int cuda = a->bf16 || a->fp16;
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

/* info's words and train's apart: info's own flags (and how many words each takes) */
static int info_only(const char *s) {
    return !strcmp(s, "--chatglm6b") ? 1 : !strcmp(s, "--data_parallel_size") ? 2 : 0;
}

/* The training settings as train reads them: train's flag table and its --config FILE reading
 * (flat YAML or JSON, LLaMA-Factory's and finetune_hf.py's keys), then train's resolution of them.
 * A --deepspeed file is read as train reads it, for what shapes the plan (the ZeRO stage, the
 * optimizer's place); its values that train would hold against the training flags are only noted,
 * since info has no learning rate or schedule to hold them against. info's own flags after. */
static int read_settings(glm_train_args *t, info_args *a, int argc, char **argv, glm_err *err) {
    char **targ = glm_calloc((size_t)argc + 1, sizeof *targ), **iarg = glm_calloc((size_t)argc + 1, sizeof *iarg);
    int nt = 0, ni = 0;
    for (int i = 0; i < argc; i++) {
        int k = info_only(argv[i]);
        if (!k) { targ[nt++] = argv[i]; continue; }
        iarg[ni++] = argv[i];
        if (k == 2 && i + 1 < argc) iarg[ni++] = argv[++i];
        else if (k == 1 && i + 1 < argc && (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false"))) iarg[ni++] = argv[++i];
    }
    glm_args_defaults(glm_train_flags, glm_train_nflags, t);
    glm_args_defaults(info_flags, INFO_NFLAGS, a);
    int rc = glm_args_parse_ex(glm_train_flags, glm_train_nflags, t, nt, targ, glm_train_config_key, err);
    char *ds = NULL;
    if (!rc) { /* the DeepSpeed file after the rest, with info's tolerance of its training values */
        ds = t->deepspeed;
        t->deepspeed = NULL;
        rc = glm_train_resolve_args(t, err);
    }
    if (!rc && ds) {
        t->deepspeed = ds;
        ds = NULL;
        glm_err e = {0};
        rc = glm_ds_apply(t, &e);
        if (rc && t->ds.on && strstr(e.msg, "differ from the training flags")) { /* train's check against its flags */
            printf("note: %s\n", e.msg);
            rc = 0;
        }
        if (rc) *err = e;
        else
            printf("%s: ZeRO stage %d, optimizer %s\n", t->deepspeed, t->zero_stage,
                   strcmp(t->offload_optimizer, "cpu") ? "on the GPU" : "offloaded to host memory");
    }
    free(ds);
    if (!rc) rc = glm_args_parse(info_flags, INFO_NFLAGS, a, ni, iarg, err);
    if (!rc && t->nproc_per_node && atoi(t->nproc_per_node) > 1 && a->data_parallel_size <= 1) {
        a->data_parallel_size = atoi(t->nproc_per_node); /* torchrun's processes: stages x replicas */
        if (t->pipeline_parallel_size > 1) a->data_parallel_size /= t->pipeline_parallel_size;
    }
    if (t->galore_layerwise && t->use_galore) t->optimizer_in_backward = 1; /* as train's reading of it */
    free(targ);
    free(iarg);
    return rc ? -1 : 0;
}

int glm_cmd_info(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            glm_args_usage(info_flags, INFO_NFLAGS, "info");
            printf("\nand every flag of train, read as train reads it (the plan is that of its run):\n");
            glm_args_list(glm_train_flags, glm_train_nflags);
            return 0;
        }
    glm_train_args t;
    info_args a;
    glm_err err = {0};
    int rc = read_settings(&t, &a, argc, argv, &err);
    int D = a.data_parallel_size > 1 ? a.data_parallel_size : 1;
    glm_config c = glm_config_chatglm6b();
    if (!rc && a.chatglm6b) c.tie_word_embeddings = 0;
    else if (!rc && (t.model_name_or_path || t.init_from_config))
        rc = glm_config_load(&c, t.model_name_or_path ? t.model_name_or_path : t.init_from_config, &err);
    else if (!rc) rc = glm_fail(&err, "--model_name_or_path, --init_from_config or --chatglm6b is required");
    if (!rc) rc = glm_train_peft(&t, &c, &c.peft, &err);
    int galore = 0; /* the weights GaLore projects */
    if (!rc && t.use_galore) {
        galore = glm_train_galore(&t, &c, &err);
        if (galore < 0) rc = -1;
    }
    if (!rc && c.peft.badam) { /* the deepest backward the run reaches */
        glm_badam b;
        glm_train_badam(&t, c.num_layers, &b);
        c.peft.badam_layer = glm_badam_lowest(&b);
    }
    if (!rc) rc = glm_config_set_quant(&c, t.quantization_bit, t.quantization_type,
                                       t.model_name_or_path ? t.model_name_or_path : "the model", &err);
    if (rc) { glm_err_print(&err); glm_train_args_free(&t); return 1; }
    static const char *const levels[] = {"", ", gradient checkpointing", ", selective checkpointing"};
    if (t.gradient_checkpointing == GLM_CKPT_AUTO) { /* the least recompute that fits the cap (none without one) */
        size_t cap = 0;
        if (t.max_memory_per_gpu && glm_parse_size(t.max_memory_per_gpu, &cap)) cap = 0; /* stage_plans reports it */
        glm_par_opts o = glm_train_par_opts(&t);
        double plan = 0;
        t.gradient_checkpointing = glm_pp_pick_checkpointing(&o, &c, t.bf16 || t.fp16, D, (double)cap, &plan);
        printf("--gradient_checkpointing auto: %s\n", glm_ckpt_level_name(t.gradient_checkpointing));
    }
    glm_dtype dt = t.fp32 ? GLM_F32 : t.fp16 ? GLM_F16 : t.bf16 ? GLM_BF16 : GLM_F32;
    int T = glm_train_seq_len(&t), B = glm_train_rows(&t); /* rows: a batch of P pairs has 2P */
    glm_mem_plan p = glm_memory_plan(&c, dt, B, T, t.gradient_checkpointing, t.bf16 || t.fp16 ? 2048 : 256);
    glm_table tab;
    glm_table_build(&tab, &c);
    printf("model: %d layers, hidden %d, heads %d, MLP %d, vocab %d, %s head: %.3fB parameters\n", c.num_layers,
           c.hidden_size, c.num_attention_heads, c.inner_hidden_size, c.vocab_size,
           c.tie_word_embeddings ? "tied" : "untied", tab.n_params / 1e9);
    if (c.peft.kind != GLM_FT_FULL) {
        glm_table tr;
        glm_table_build_range(&tr, &c, 0, c.num_layers, 1, 1);
        printf("finetuning %s: %.3fM trainable parameters (gradients, master weights and moments for those only)\n",
               t.finetuning_type, tr.n_params / 1e6);
        char what[320];
        if (c.peft.kind == GLM_FT_FREEZE) printf("freeze: %s train\n", glm_freeze_describe(&c, &c.peft, what, sizeof what));
        glm_table_free(&tr);
    }
    if (galore > 0)
        printf("GaLore: %d linear weights keep rank-%d projections of their AdamW moments (%s), the other rows full ones\n",
               galore, c.peft.galore_rank, t.galore_proj_type);
    if (c.quant != GLM_Q_NONE) {
        glm_table q;
        glm_table_build_part(&q, &c, 0, c.num_layers, 1, 1, 64, GLM_PART_QUANT);
        printf("quantized %s: %d linear weights, %.3fB parameters in %.2f GiB (%.2f bytes each)\n",
               glm_qtype_name((glm_qtype)c.quant), q.n, q.n_params / 1e9, q.total / 1073741824.0,
               q.n_params ? (double)q.total / q.n_params : 0.0);
        glm_table_free(&q);
    }
    printf("memory plan per device (%s, micro-batch %d x %d tokens%s):\n", dt == GLM_F32 ? "fp32" : dt == GLM_BF16 ? "bf16" : "fp16",
           B, T, levels[t.gradient_checkpointing]);
    row("weights", p.params);
    row("gradients", p.grads);
    row("fp32 master weights", p.master);
    row(galore > 0 ? "AdamW moments (fp32, GaLore)" : "AdamW moments (fp32)", p.moments);
    row("activations", p.activations);
    row("backward scratch + head", p.scratch);
    row("total", p.total);
    glm_table_free(&tab);
    { /* what train's saves write (train/disk.c says it again against the output folder's disk) */
        int kinds = 2 + (dt != GLM_F32) + (strstr(t.optim, "8bit") != NULL);
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
    if (stage_plans(&t, D, &c, &err)) { glm_err_print(&err); rc = 1; }
    glm_train_args_free(&t);
    return rc;
}
