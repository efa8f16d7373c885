/* The model of a training run (train/trainer.h trainer_load_model): loaded or drawn at random,
 * on the backend, with its fine-tuning method set up first (LoRA and its variants, P-Tuning v2,
 * freeze, BAdam, GaLore, LLaMA Pro's added blocks) and the checkpointing the memory plan picks. */
#include "train/trainer.h"
#include "model/adapter.h"
#include "model/pissa.h"
#include "optim/adamw.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* The same distribution as glm_model_init_random (normal matrices, LayerNorm weights 1, zero
 * biases) drawn on the GPU: 6B normal samples take minutes on one host core. The numbers
 * differ from the CPU's for the same seed. */
static void init_random_on_device(glm_model *m, uint64_t seed, float std) {
#ifdef GLM_HAVE_CUDA
    glm_table full; /* streams numbered by the whole model's rows: a pipeline stage draws the same values */
    glm_table_build(&full, &m->cfg);
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(m, i, &p);
        if (glm_is_extra(t->kind)) continue; /* adapters, prefix: glm_model_init_adapters */
        uint64_t row = (uint64_t)(glm_table_find(&full, t->name) - full.t);
        if (t->qtype) { /* drawn in S, quantized on the host */
            float *host = glm_malloc(t->numel * sizeof(float));
            glm_cuda_fill_normal(m->be, m->qscratch, t->numel, seed * 1000003ULL + row, std);
            m->be->download_f32(m->be, host, m->qscratch, t->numel);
            glm_model_row_upload(m, t, p, host);
            free(host);
        } else if (t->ndim == 2) glm_cuda_fill_normal(m->be, p, t->numel, seed * 1000003ULL + row, std);
        else if (glm_is_norm_w(t->kind)) glm_cuda_fill(m->be, p, t->numel, 1.0f);
    }
    glm_table_free(&full);
#else
    glm_model_init_random(m, seed, std);
#endif
}

/* What trains, from the flags (model/config.h glm_peft); L is the model's layer count. */
/* --adapter_name_or_path / --ptuning_checkpoint: the adapter's own settings make the trainable part,
 * as LLaMA-Factory loads an adapter with its config; flags that say otherwise are named. */
void glm_train_adapters(const glm_train_args *a, char *merged, size_t nm, char *from, size_t nf) {
    glm_adapter_list_split(a->adapter_name_or_path, a->create_new_adapter, merged, nm, from, nf);
    if (a->ptuning_checkpoint) snprintf(from, nf, "%s", a->ptuning_checkpoint);
}

static int peft_from_adapter(const glm_train_args *a, const char *dir, glm_peft *p, glm_err *err) {
    const char *flag = a->adapter_name_or_path ? "--adapter_name_or_path" : "--ptuning_checkpoint", *k = a->finetuning_type;
    if (glm_adapter_read_config(dir, p, err)) return glm_wrap(err, "%s: ", flag);
    if (p->kind == GLM_FT_LORA) {
        if (a->ptuning_checkpoint)
            return glm_fail(err, "--ptuning_checkpoint %s is a LoRA adapter (adapter_config.json)", dir),
                   glm_hint(err, "pass it as --adapter_name_or_path");
        if ((strcmp(k, "full") && strcmp(k, "lora")) || a->pre_seq_len > 0)
            return glm_fail(err, "%s %s is a LoRA adapter, but the flags ask for %s", flag, dir,
                            a->pre_seq_len > 0 ? "P-Tuning v2 (--pre_seq_len)" : k),
                   glm_hint(err, "drop --finetuning_type/--pre_seq_len (the adapter decides), or start a new adapter without %s", flag);
        int alpha_flag = a->lora_alpha > 0 ? (int)a->lora_alpha : 2 * a->lora_rank;
        if ((a->lora_rank != 8 && a->lora_rank != p->lora_rank) || (a->lora_alpha > 0 && alpha_flag != (int)p->lora_alpha))
            glm_warn("%s: the adapter's rank %d and alpha %g are trained on; --lora_rank %d / --lora_alpha %g are not used",
                     dir, p->lora_rank, p->lora_alpha, a->lora_rank, a->lora_alpha);
        if (a->use_dora && !p->use_dora) glm_warn("%s is a plain LoRA adapter: --use_dora is not used", dir);
        if (a->additional_target && a->additional_target[0])
            glm_warn("%s: the adapter's own modules_to_save are trained on; --additional_target %s is not used", dir,
                     a->additional_target);
        glm_info("training on from the %s adapter %s (rank %d, alpha %g, dropout %g)", p->use_dora ? "DoRA" : "LoRA", dir,
                 p->lora_rank, p->lora_alpha, p->lora_dropout);
        return 0;
    }
    /* a P-Tuning v2 checkpoint: THUDM's main.py needs --pre_seq_len equal to it */
    if (strcmp(k, "full") && strcmp(k, "ptuning"))
        return glm_fail(err, "%s %s is a P-Tuning v2 checkpoint, but --finetuning_type is %s", flag, dir, k),
               glm_hint(err, "drop --finetuning_type (the checkpoint decides)");
    if (a->pre_seq_len > 0 && (a->pre_seq_len != p->pre_seq_len || !!a->prefix_projection != !!p->prefix_projection))
        return glm_fail(err, "--pre_seq_len %d --prefix_projection %s, but %s was trained with pre_seq_len %d, prefix_projection %s",
                        a->pre_seq_len, a->prefix_projection ? "true" : "false", dir, p->pre_seq_len,
                        p->prefix_projection ? "true" : "false"),
               glm_hint(err, "pass the checkpoint's values (or leave --pre_seq_len out: the checkpoint's are taken)");
    if (a->packing)
        return glm_fail(err, "--packing with P-Tuning v2: every query sees the prefix, which packed rows would share"),
               glm_hint(err, "drop --packing (dynamic padding keeps the batches tight)");
    p->prefix_dropout = (float)a->prefix_dropout;
    glm_info("training on from the P-Tuning v2 prefix of %s (pre_seq_len %d%s)", dir, p->pre_seq_len,
             p->prefix_projection ? ", projected" : "");
    return 0;
}

void glm_train_badam(const glm_train_args *a, int layers, glm_badam *b) {
    int order = glm_badam_parse_order(a->badam_switch_mode);
    *b = (glm_badam){.order = order < 0 ? GLM_BADAM_ASCENDING : order, .start = a->badam_start_block,
                     .interval = a->badam_switch_interval, .blocks = layers, .seed = (uint64_t)a->seed};
}

/* LLaMA-Factory's rule for --use_llama_pro: every (L / n)-th layer is a block glmtrain expand added,
 * n = --num_layer_trainable (its freeze_trainable_layers). */
static int llama_pro_stride(const glm_train_args *a, int L, int *stride, glm_err *err) {
    int n = a->num_layer_trainable;
    if (n < 1 || L % n != 0)
        return glm_fail(err, "--use_llama_pro with --num_layer_trainable %d: the %d layers must divide into %d groups, one "
                        "added block each", n, L, n < 1 ? 1 : n),
               glm_hint(err, "pass the --num_expand the model was expanded with (glmtrain expand), a divisor of %d", L);
    *stride = L / n;
    return 0;
}

/* --use_badam: freeze fine-tuning of one whole layer, the first block of the schedule (the
 * flags LLaMA-Factory's BAdam takes, and what its BlockOptimizer would fail on, checked here). */
static int badam_peft(const glm_train_args *a, const glm_config *c, const char *from, glm_peft *p, glm_err *err) {
    int L = c->num_layers;
    if (strcmp(a->finetuning_type, "full") != 0 || from[0])
        return glm_fail(err, "--use_badam with %s: BAdam updates every weight of the layers, in turn (full fine-tuning)",
                        from[0] ? "an adapter to train on" : a->finetuning_type),
               glm_hint(err, "use --finetuning_type full%s", from[0] ? " without --adapter_name_or_path (or with "
                        "--create_new_adapter, which merges the adapters first)" : "");
    if (strcmp(a->badam_mode, "layer") != 0)
        return glm_fail(err, "--badam_mode %s: BAdam's ratio mode (parts of every matrix) is not here", a->badam_mode),
               glm_hint(err, "use --badam_mode layer, LLaMA-Factory's default");
    if (a->badam_switch_interval < 1)
        return glm_fail(err, "--badam_switch_interval %d: optimizer steps between switches, at least 1", a->badam_switch_interval),
               glm_hint(err, "BAdam's paper and LLaMA-Factory's examples use 50");
    if (a->badam_start_block < -1 || a->badam_start_block >= L)
        return glm_fail(err, "--badam_start_block %d: the model has layers 0 to %d", a->badam_start_block, L - 1),
               glm_hint(err, "-1 starts where the order does: 0 ascending, %d descending", L - 1);
    if (a->pre_seq_len > 0 || a->use_llama_pro)
        return glm_fail(err, "--use_badam with %s: BAdam trains every layer in turn", a->pre_seq_len > 0 ?
                        "--pre_seq_len, a P-Tuning prefix" : "--use_llama_pro, LLaMA Pro's added blocks alone"),
               glm_hint(err, "drop one of them");
    int order = glm_badam_parse_order(a->badam_switch_mode);
    if (order == GLM_BADAM_FIXED && a->badam_start_block < 0)
        return glm_fail(err, "--badam_switch_mode fixed needs --badam_start_block: the one layer that trains"),
               glm_hint(err, "BAdam's BlockOptimizer has no block to fix without it either");
    if (order == GLM_BADAM_RANDOM && a->badam_start_block >= 0)
        return glm_fail(err, "--badam_start_block with --badam_switch_mode random: the random order draws its own first layer"),
               glm_hint(err, "drop --badam_start_block (BAdam's BlockOptimizer fails at its first switch with both)");
    glm_badam b;
    glm_train_badam(a, L, &b);
    *p = (glm_peft){.kind = GLM_FT_FREEZE, .badam = 1, .badam_layer = glm_badam_block(&b, 1)};
    return 0;
}

int glm_train_galore(const glm_train_args *a, glm_config *c, glm_err *err) {
    glm_peft *p = &c->peft;
    if (p->kind != GLM_FT_FULL && p->kind != GLM_FT_FREEZE)
        return glm_fail(err, "--use_galore with %s: GaLore projects the optimizer state of weights that train whole",
                        p->kind == GLM_FT_LORA ? "LoRA" : "P-Tuning v2"),
               glm_hint(err, "use --finetuning_type full or freeze (LLaMA-Factory refuses LoRA with GaLore too)");
    if (p->badam)
        return glm_fail(err, "--use_galore with --use_badam: each is an optimizer of its own"), glm_hint(err, "pick one");
    int proj = glm_galore_proj_parse(a->galore_proj_type ? a->galore_proj_type : "std");
    if (proj < 0)
        return glm_fail(err, "--galore_proj_type %s: std, reverse_std, right, left or full", a->galore_proj_type),
               glm_hint(err, "use std, LLaMA-Factory's default");
    if (a->galore_rank < 1) return glm_fail(err, "--galore_rank %d must be at least 1", a->galore_rank);
    if (a->galore_update_interval < 1)
        return glm_fail(err, "--galore_update_interval %d: optimizer steps between projections, at least 1",
                        a->galore_update_interval);
    if (!(a->galore_scale > 0 && a->galore_scale < 1e6))
        return glm_fail(err, "--galore_scale %g must be positive", a->galore_scale), glm_hint(err, "LLaMA-Factory's default is 2.0");
    if (glm_optim_parse(a->optim ? a->optim : "adamw_torch") == GLM_OPTIM_ADAMW8)
        return glm_fail(err, "--use_galore with --optim %s: GaLore's 8-bit AdamW is not here", a->optim),
               glm_hint(err, "use --optim adamw_torch (the projected moments are small already)");
    const char *target = a->galore_target ? a->galore_target : "all";
    if (strlen(target) >= sizeof p->galore_target)
        return glm_fail(err, "--galore_target: %zu characters, at most %zu", strlen(target), sizeof p->galore_target - 1);
    p->galore_rank = a->galore_rank;
    p->galore_gap = a->galore_update_interval;
    p->galore_proj = proj;
    p->galore_scale = (float)a->galore_scale;
    snprintf(p->galore_target, sizeof p->galore_target, "%s", target);
    glm_table tab;
    glm_table_build(&tab, c); /* the base rows: which linear weights the targets reach */
    int hit = 0;
    for (int i = 0; i < tab.n; i++) hit += glm_galore_applies(c, &tab.t[i]);
    glm_table_free(&tab);
    if (!hit)
        return glm_fail(err, "--galore_target %s matches no linear weight that trains", target),
               glm_hint(err, "use all, or parts of the modules' names: %s", c->family == GLM_FAMILY_GLM2 ?
                        "query_key_value, dense, dense_h_to_4h, dense_4h_to_h, output_layer" :
                        "query_key_value, dense, dense_h_to_4h, dense_4h_to_h, lm_head");
    return hit;
}

/* --use_galore in this run: the layouts glmtrain's GaLore does not run in are refused by name. */
static int galore_setup(const glm_train_args *a, trainer *t, glm_config *c, int stages, glm_err *err) {
    int hit = glm_train_galore(a, c, err);
    if (hit < 0) return -1;
    const char *no = stages                                                     ? "pipeline stages"
                     : t->dp->world > 1 && a->zero_stage >= 1                   ? "--zero_stage 1, 2 or 3 over several ranks"
                     : strcmp(a->offload_optimizer, "none") != 0                ? "--offload_optimizer"
                                                                                : NULL;
    if (no)
        return glm_fail(err, "--use_galore with %s: glmtrain's GaLore keeps its whole state on the device of each process "
                             "and updates every projected weight whole", no),
               glm_hint(err, "one process, or data parallel with --zero_stage 0");
    if (t->dp->rank == 0)
        glm_info("GaLore: %d weights keep their AdamW moments in a rank-%d projection (%s), renewed every %d steps, scale "
                 "%g; every weight updates as galore_torch's AdamW%s", hit, c->peft.galore_rank, a->galore_proj_type,
                 c->peft.galore_gap, c->peft.galore_scale, a->galore_layerwise ? ", layer by layer inside backward" : "");
    return 0;
}

int glm_train_peft(const glm_train_args *a, const glm_config *c, glm_peft *p, glm_err *err) {
    int L = c->num_layers;
    *p = (glm_peft){0};
    char merged[4096], from[4096];
    glm_train_adapters(a, merged, sizeof merged, from, sizeof from);
    if (a->use_badam && from[0]) return badam_peft(a, c, from, p, err); /* refused, naming the adapter */
    if (a->pissa_init && from[0])
        return glm_fail(err, "--pissa_init starts a new adapter, but %s trains %s on from its own start",
                        a->ptuning_checkpoint ? "--ptuning_checkpoint" : "--adapter_name_or_path", from),
               glm_hint(err, "drop --pissa_init (a PiSSA adapter trains on as one), or add --create_new_adapter");
    if (from[0]) return peft_from_adapter(a, from, p, err);
    const char *k = a->finetuning_type;
    if (strcmp(k, "full") == 0 && a->pre_seq_len > 0) k = "ptuning"; /* THUDM's ptuning/main.py selects it so */
    if (a->use_dora && strcmp(k, "lora") != 0)
        return glm_fail(err, "--use_dora with --finetuning_type %s: DoRA is a form of LoRA", k),
               glm_hint(err, "add --finetuning_type lora");
    int default_modules = !a->freeze_trainable_modules || !strcmp(a->freeze_trainable_modules, "all");
    if (strcmp(k, "lora") != 0 && a->additional_target && a->additional_target[0])
        return glm_fail(err, "--additional_target %s with --finetuning_type %s: it names modules that train whole beside LoRA "
                        "(peft's modules_to_save)", a->additional_target, k),
               glm_hint(err, !strcmp(k, "freeze") ? "freeze mode's name for it is --freeze_extra_modules"
                             : !strcmp(k, "full")  ? "with --finetuning_type full every module trains already"
                                                   : "add --finetuning_type lora");
    if (strcmp(k, "freeze") != 0 && (!default_modules || (a->freeze_extra_modules && a->freeze_extra_modules[0])))
        return glm_fail(err, "--%s with --finetuning_type %s: it says what freeze fine-tuning trains",
                        default_modules ? "freeze_extra_modules" : "freeze_trainable_modules", k),
               glm_hint(err, "add --finetuning_type freeze, or drop the flag");
    if (a->use_badam) return badam_peft(a, c, from, p, err);
    if (a->use_llama_pro && strcmp(k, "freeze") != 0 && strcmp(k, "lora") != 0)
        return glm_fail(err, "--use_llama_pro with --finetuning_type %s: LLaMA Pro trains the added blocks (freeze), or "
                        "LoRA on them", k),
               glm_hint(err, "use --finetuning_type freeze or lora with --num_layer_trainable N (N: the blocks glmtrain "
                             "expand added)");
    if (strcmp(k, "full") == 0) return 0;
    if (strcmp(k, "ptuning") != 0 && a->pre_seq_len > 0)
        return glm_fail(err, "--pre_seq_len %d with --finetuning_type %s: the prefix is P-Tuning v2's", a->pre_seq_len, k),
               glm_hint(err, "use --finetuning_type ptuning, or drop --pre_seq_len");
    if (strcmp(k, "ptuning") == 0) {
        if (a->pre_seq_len < 1)
            return glm_fail(err, "--finetuning_type ptuning needs --pre_seq_len N (the prefix length)"), glm_hint(err, "THUDM's ptuning/train.sh uses --pre_seq_len 128");
        if (a->packing)
            return glm_fail(err, "--packing with P-Tuning v2: every query sees the prefix, which packed rows would share"),
                   glm_hint(err, "drop --packing (dynamic padding keeps the batches tight)");
        if (!(a->prefix_dropout >= 0 && a->prefix_dropout < 1))
            return glm_fail(err, "--prefix_dropout %g must be in [0, 1)", a->prefix_dropout);
        *p = (glm_peft){.kind = GLM_FT_PTUNING, .pre_seq_len = a->pre_seq_len, .prefix_projection = a->prefix_projection,
                        .prefix_dropout = (float)a->prefix_dropout};
        return 0;
    }
    if (strcmp(k, "freeze") == 0) {
        int n = a->num_layer_trainable;
        if (n == 0 || n > L || n < -L)
            return glm_fail(err, "--num_layer_trainable %d: the model has %d layers", n, L),
                   glm_hint(err, "N from 1 to %d trains the last N layers, -1 to -%d the first -N", L, L);
        *p = (glm_peft){.kind = GLM_FT_FREEZE, .num_layer_trainable = n};
        if (a->use_llama_pro && llama_pro_stride(a, L, &p->llama_pro, err)) return -1;
        if (glm_modules_parse(c, "--freeze_trainable_modules", a->freeze_trainable_modules ? a->freeze_trainable_modules : "all",
                              0, &p->freeze_modules, err) ||
            glm_modules_parse(c, "--freeze_extra_modules", a->freeze_extra_modules ? a->freeze_extra_modules : "", 1,
                              &p->extra_modules, err))
            return -1;
        if (p->freeze_modules == glm_modules_all(c)) p->freeze_modules = 0; /* one spelling of "all" */
        return 0;
    }
    /* lora */
    if (a->lora_rank < 1) return glm_fail(err, "--lora_rank %d must be at least 1", a->lora_rank);
    if (!(a->lora_dropout >= 0 && a->lora_dropout < 1)) return glm_fail(err, "--lora_dropout %g must be in [0, 1)", a->lora_dropout);
    if (!(a->lora_alpha >= 0)) return glm_fail(err, "--lora_alpha %g must not be negative", a->lora_alpha);
    if (a->pissa_init && a->use_dora)
        return glm_fail(err, "--pissa_init with --use_dora: glmtrain starts DoRA as peft's default only"),
               glm_hint(err, "drop one of them");
    if (a->pissa_init && a->pissa_iter < -1)
        return glm_fail(err, "--pissa_iter %d: a count of subspace iterations, or -1 for the full SVD's triplets", a->pissa_iter),
               glm_hint(err, "LLaMA-Factory's default is 16");
    *p = (glm_peft){.kind = GLM_FT_LORA, .lora_rank = a->lora_rank, .use_rslora = a->use_rslora, .use_dora = a->use_dora,
                    .lora_alpha = (float)(a->lora_alpha > 0 ? a->lora_alpha : 2.0 * a->lora_rank),
                    .lora_dropout = (float)a->lora_dropout, .pissa = a->pissa_init, .pissa_niter = a->pissa_iter};
    if (glm_lora_targets_parse_layout(a->lora_target, c->hf_layout, &p->lora_targets, &p->lora_qkv_parts, err)) return -1;
    if (a->use_llama_pro) { /* LLaMA-Factory's find_expanded_modules: the adapters on the added blocks alone */
        int stride = 1;
        if (L > 64) return glm_fail(err, "--use_llama_pro with LoRA on a model of %d layers: at most 64 here", L);
        if (llama_pro_stride(a, L, &stride, err)) return -1;
        for (int l = stride - 1; l < L; l += stride) p->lora_layers |= 1ull << l;
    }
    if (a->additional_target && glm_modules_parse(c, "--additional_target", a->additional_target, 1, &p->extra_modules, err))
        return -1;
    return glm_extra_modules_check(c, p, a->additional_target && a->additional_target[0] ? "--additional_target" : "--lora_target",
                                   err);
}

/* --gradient_checkpointing auto: the level the memory plan fits under --max_memory_per_gpu, or
 * under the GPU's memory without the flag (a CPU run without it keeps everything). */
static void pick_checkpointing(trainer *t, glm_par_opts *po, const glm_config *c, int cuda) {
    size_t capb = 0;
    double cap = 0;
    const char *from = "no memory cap";
    if (po->max_memory_per_gpu && glm_parse_size(po->max_memory_per_gpu, &capb) == 0) {
        cap = (double)capb;
        from = "--max_memory_per_gpu";
    }
#ifdef GLM_HAVE_CUDA
    else if (cuda) {
        glm_cuda_memory(t->be, NULL, NULL, &capb);
        cap = (double)capb;
        from = "the GPU's memory";
    }
#endif
    double plan = 0;
    int level = glm_pp_pick_checkpointing(po, c, cuda, t->dp->world, cap, &plan);
    t->a->gradient_checkpointing = po->gradient_checkpointing = level;
    char sz[32];
    if (t->dp->rank == 0)
        glm_info("--gradient_checkpointing auto: %s (plans %s%s%s)", glm_ckpt_level_name(level), glm_plan_size_str(sz, sizeof sz, plan),
                 cap > 0 ? " under " : ", ", from);
}

/* A parameter count for people: 6.71B, 3.670M, 42.3K, 512 (a test model's thousands no longer
 * print as "0.0M"). */
static const char *count_str(char *s, size_t n, double x) {
    if (x >= 1e9) snprintf(s, n, "%.2fB", x / 1e9);
    else if (x >= 1e6) snprintf(s, n, "%.3fM", x / 1e6);
    else if (x >= 1e3) snprintf(s, n, "%.1fK", x / 1e3);
    else snprintf(s, n, "%.0f", x);
    return s;
}

int trainer_load_model(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_config c;
    const char *src = a->model_name_or_path ? a->model_name_or_path : a->init_from_config;
    if (glm_config_load(&c, src, err)) {
        char file[4096]; /* the library's hint names --model_name_or_path: name the flag used */
        if (glm_is_dir(src)) glm_path_join(file, sizeof file, src, "config.json");
        else snprintf(file, sizeof file, "%s", src);
        if (!a->model_name_or_path && !glm_is_file(file))
            glm_hint(err, "--init_from_config takes a config.json file (or a folder holding one)");
        return -1;
    }
    if (glm_train_peft(a, &c, &c.peft, err)) return -1;
    char merged[4096], from[4096];
    glm_train_adapters(a, merged, sizeof merged, from, sizeof from);
    if (merged[0]) { /* every adapter to merge fits this base, before anything is allocated */
        glm_merge *g;
        if (glm_merge_open(&g, &c, merged, err)) return glm_wrap(err, "--adapter_name_or_path: ");
        glm_merge_close(g);
        if (t->dp->rank == 0)
            glm_info("merged into the base as it loads: %s; %s", merged,
                     from[0] ? "the last adapter trains on" : "a new adapter trains on top (--create_new_adapter)");
    } else if (a->create_new_adapter && t->dp->rank == 0 && !a->adapter_name_or_path) {
        glm_warn("--create_new_adapter without --adapter_name_or_path: there is nothing to merge, a new adapter trains");
    }
    if ((a->pissa_init || a->pissa_convert) && c.peft.kind != GLM_FT_LORA)
        return glm_fail(err, "--%s is PiSSA's, a start of LoRA adapters, but this run trains %s",
                        a->pissa_init ? "pissa_init" : "pissa_convert",
                        c.peft.kind == GLM_FT_FULL ? "every weight" : c.peft.kind == GLM_FT_PTUNING ? "a P-Tuning v2 prefix" : "some layers"),
               glm_hint(err, "add --finetuning_type lora");
    int stages = glm_train_uses_stages(a);
    if (a->pissa_convert && stages)
        return glm_fail(err, "--pissa_convert with pipeline stages: each stage holds a part of the adapter"),
               glm_hint(err, "train without pipeline stages, or use the output folder as it is: generate, chat and merge "
                             "read its pissa_init/");
    if (a->pissa_convert && !c.peft.pissa)
        return glm_fail(err, "--pissa_convert converts a PiSSA adapter, and this run's adapter starts as plain LoRA"),
               glm_hint(err, "add --pissa_init");
    if (!(a->neftune_noise_alpha >= 0 && a->neftune_noise_alpha < 1e6))
        return glm_fail(err, "--neftune_noise_alpha %g must be 0 (off) or positive", a->neftune_noise_alpha),
               glm_hint(err, "NEFTune's paper and LLaMA-Factory's examples use 5");
    c.neftune_alpha = (float)a->neftune_noise_alpha;
    c.value_head = glm_train_is_rm(a); /* the table gains the value head's rows */
    c.value_head_dropout = (float)a->summary_dropout_prob;
    if (a->loraplus_lr_ratio != 0) { /* LoRA+: a learning-rate factor of the lora_B rows (the table's lr_scale) */
        if (!(a->loraplus_lr_ratio > 0 && a->loraplus_lr_ratio < 1e6))
            return glm_fail(err, "--loraplus_lr_ratio %g must be positive (0: off)", a->loraplus_lr_ratio),
                   glm_hint(err, "LoRA+'s paper and LLaMA-Factory's examples use 16");
        if (c.peft.kind != GLM_FT_LORA)
            return glm_fail(err, "--loraplus_lr_ratio is LoRA+'s (lora_B's learning rate), but this run trains %s",
                            c.peft.kind == GLM_FT_FULL ? "every weight" : c.peft.kind == GLM_FT_PTUNING ? "a P-Tuning v2 prefix" : "the last layers"),
                   glm_hint(err, "add --finetuning_type lora, or drop --loraplus_lr_ratio");
        if (glm_optim_parse(a->optim) == GLM_OPTIM_ADAMW8)
            return glm_fail(err, "--loraplus_lr_ratio with --optim %s: the 8-bit moments' blocks span lora_A and lora_B rows", a->optim),
                   glm_hint(err, "use --optim adamw_torch: LoRA's optimizer state is a few MB");
        c.peft.loraplus_lr_ratio = (float)a->loraplus_lr_ratio;
        if (t->dp->rank == 0) glm_info("LoRA+: the lora_B matrices train at %g x the learning rate", a->loraplus_lr_ratio);
    }
    if (c.neftune_alpha > 0 && t->dp->rank == 0)
        glm_info("NEFTune: noise of %g/sqrt(seq x %d) on the embeddings while training", c.neftune_alpha, c.hidden_size);
    int nf4 = a->quantization_type && strcmp(a->quantization_type, "nf4") == 0;
    if (glm_config_set_quant(&c, a->quantization_bit, a->quantization_type, src, err)) return -1;
    if (c.peft.pissa && !from[0]) { /* a new PiSSA start: what it cannot start on */
        const char *no = a->zero_stage >= 3 ? "--zero_stage 3 (the frozen weights are sharded)"
                         : stages            ? "pipeline stages"
                                             : NULL;
        if (no)
            return glm_fail(err, "--pissa_init with %s: glmtrain starts PiSSA on the whole base in each process", no),
                   glm_hint(err, "start it without, or train plain LoRA (LLaMA-Factory refuses these too)");
    }
    if (c.peft.badam) { /* every process holds the whole model: the switch moves rows inside it */
        const char *no = c.quant != GLM_Q_NONE                                   ? "a quantized base (its layers could not train in turn)"
                         : stages                                                 ? "pipeline stages"
                         : t->dp->world > 1 && a->zero_stage >= 2                 ? "--zero_stage 2 or 3 over several ranks"
                         : strcmp(a->offload_optimizer, "none") != 0              ? "--offload_optimizer"
                         : a->optimizer_in_backward                               ? "--optimizer_in_backward"
                                                                                  : NULL;
        if (no)
            return glm_fail(err, "--use_badam with %s: glmtrain's BAdam keeps the whole model in every process, with the "
                                 "state of one layer (whole, or sharded by ZeRO-1)", no),
                   glm_hint(err, "%s", c.quant != GLM_Q_NONE ? "train on a float base" : "data parallel with --zero_stage 0 "
                            "or 1, or one process (one layer's state is small: its gradients need no sharding)");
        if (a->weight_decay > 0 && t->dp->rank == 0)
            glm_warn("--weight_decay %g with --use_badam: no weight decay applies, as in LLaMA-Factory's BAdam (its "
                     "BlockOptimizer takes the decay of LLaMA-Factory's first parameter group, which has none)", a->weight_decay);
        glm_train_badam(a, c.num_layers, &t->badam);
        static const char *const orders[] = {"ascending", "descending", "random", "fixed"};
        glm_info("BAdam: one whole layer trains at a time, from layer %d, %s, switching every %d steps with a fresh "
                 "optimizer state (the first layer %d steps); the embedding, final norm and head stay as loaded",
                 c.peft.badam_layer, orders[t->badam.order], t->badam.interval, t->badam.interval > 1 ? t->badam.interval - 1 : 1);
    }
    if (a->use_galore && galore_setup(a, t, &c, stages, err)) return -1;
    if (c.quant != GLM_Q_NONE && c.peft.kind == GLM_FT_FULL) {
        glm_fail(err, "%s weights with --finetuning_type full: a quantized weight cannot train",
                 a->quantization_bit || nf4 ? "--quantization_bit/--quantization_type" : "quantized (config.json quantization_bit)");
        return glm_hint(err, "use --finetuning_type lora, ptuning or freeze on a quantized base (THUDM's ptuning trains on INT4 so)");
    }
    int cuda = glm_backend_on_gpu(t->be);
    glm_par_opts po = glm_train_par_opts(a);
    glm_config pc = c; /* what the plan assumes: under BAdam the lowest layer the run trains, where the backward goes deepest */
    if (c.peft.badam) pc.peft.badam_layer = glm_badam_lowest(&t->badam);
    if (a->gradient_checkpointing == GLM_CKPT_AUTO) pick_checkpointing(t, &po, &pc, cuda);
    if (t->dp->rank == 0) glm_pp_print_plan(&po, &pc, cuda, t->dp->world, stderr);
    if (glm_pp_check_memory(&po, &pc, cuda, t->dp->world, err)) return -1;
#ifdef GLM_HAVE_CUDA
    if (cuda) {
        size_t device_bytes = 0;
        glm_cuda_memory(t->be, NULL, NULL, &device_bytes);
        if (glm_pp_check_device_memory(&po, &pc, cuda, t->dp->world, device_bytes, err)) return -1;
    }
#endif
    if (glm_pp_check_host_memory(&po, &pc, cuda, t->dp->world, t->dp->dist.local_world, err)) return -1;
    if (glm_train_uses_stages(a)) {
        if (glm_pp_open(&t->pp, t->dp, &po, &c, t->be, err)) return -1; /* from here t->dp is this stage's replicas */
        glm_pp_model_init(t->pp, &t->m, &c, t->be);
    } else if (glm_dp_whole_grads(t->dp, 1)) {
        glm_model_init(&t->m, &c, t->be);
    } else {
        glm_model_init_staged(&t->m, &c, t->be); /* the layout stages gradients: no buffer of them, ever */
    }
    t->m.gradient_checkpointing = a->gradient_checkpointing;
    snprintf(t->m.origin, sizeof t->m.origin, "%s", src); /* what the folders it writes carry over */
    if (t->dp->world > 1 && t->dp->rank > 0 && c.peft.kind == GLM_FT_FULL) {
        /* nothing to read or draw: glm_dp_attach broadcasts rank 0's weights (the trainable
         * ones: a frozen base is read or drawn by every rank below) */
    } else if (a->model_name_or_path) {
        snprintf(t->m.merged, sizeof t->m.merged, "%s", merged);
        if (glm_model_load(&t->m, a->model_name_or_path, err)) return -1;
    } else if (glm_backend_on_gpu(t->be)) {
        init_random_on_device(&t->m, (uint64_t)a->seed, (float)a->init_std);
    } else {
        glm_model_init_random(&t->m, (uint64_t)a->seed, (float)a->init_std);
    }
    if (c.peft.kind == GLM_FT_LORA || c.peft.kind == GLM_FT_PTUNING || c.value_head)
        glm_model_init_adapters(&t->m, (uint64_t)a->seed); /* the same on every rank */
    if (from[0] && glm_adapter_load(&t->m, from, err)) return -1;
    if (c.value_head) { /* LLaMA-Factory's load_valuehead_params: beside the adapter, else the model (a resume's checkpoint replaces it) */
        const char *vh = from[0] ? from : a->model_name_or_path;
        int got = vh ? glm_model_load_value_head(&t->m, vh, 0, err) : 1;
        if (got < 0) return -1;
        if (t->dp->rank == 0) {
            if (got == 0) glm_info("--stage rm: the value head from %s/%s", vh, GLM_VALUE_HEAD_FILE);
            else glm_info("--stage rm: a new value head (v_head.summary, Linear(%d, 1) drawn as torch draws one)%s",
                          c.hidden_size, vh ? "; none beside the model or adapter" : "");
        }
    }
    if (c.peft.pissa && !from[0] && !a->resume_from_checkpoint) { /* a resume takes the checkpoint's start instead */
        double t0 = glm_now();
        if (glm_pissa_init(&t->m, (uint64_t)a->seed, err)) return -1;
        if (t->dp->rank == 0)
            glm_info("PiSSA: the adapters start from their weights' %d principal singular triplets (%s, %.1f s); the base "
                     "keeps the residual", c.peft.lora_rank, c.peft.pissa_niter < 0 ? "iterated until they stop moving, as the "
                     "full SVD's" : "a randomized SVD", glm_now() - t0);
    }
    size_t base = t->m.ftab.n_params + (c.peft.kind == GLM_FT_LORA ? 0 : t->m.tab.n_params);
    char n1[32], n2[32];
    glm_info("model: %d layers, hidden %d, %d heads, vocab %d, %s parameters (%s head), backend %s",
             c.num_layers, c.hidden_size, c.num_attention_heads, c.vocab_size, count_str(n1, sizeof n1, (double)base),
             c.tie_word_embeddings ? "tied" : "untied", t->be->name);
    static const char *const kinds[] = {"full", "lora", "ptuning", "freeze"};
    char what[320];
    if (c.peft.kind == GLM_FT_FREEZE) glm_info("freeze: %s train", glm_freeze_describe(&c, &c.peft, what, sizeof what));
    if (c.peft.kind != GLM_FT_FULL)
        glm_info("%s: %s trainable parameters (%.3f%% of %s), the rest frozen", kinds[c.peft.kind],
                 count_str(n1, sizeof n1, (double)t->m.tab.n_params),
                 100.0 * t->m.tab.n_params / (t->m.tab.n_params + t->m.ftab.n_params),
                 count_str(n2, sizeof n2, (double)(t->m.tab.n_params + t->m.ftab.n_params)));
    return 0;
}
