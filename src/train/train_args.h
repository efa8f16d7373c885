/* Settings of `glmtrain train`, named as Hugging Face TrainingArguments (and THUDM
 * ptuning/main.py's data arguments) so users can carry their flags over. The flag table that
 * fills this struct lives in train_flags.c. */
#ifndef GLM_TRAIN_ARGS_H
#define GLM_TRAIN_ARGS_H
#include <string.h>
#include "core/args.h"
#include "parallel/par_opts.h"

/* What a --deepspeed FILE (train/deepspeed.c) sets beyond the flags it fills or checks: not
 * flags themselves, zero without a file. */
typedef struct glm_ds_settings {
    int on;
    int decay_all;        /* an optimizer section: DeepSpeed's one parameter group, so weight decay on every tensor */
    int sched;            /* 0, or its scheduler section's glm_lr_kind (LR_DS_*) */
    int log_warmup;
    double min_lr, warmup_min_ratio, cos_min_ratio;
    /* values given in the file that are known only once the steps and ranks are (-1: "auto" or absent) */
    long warmup_num_steps, total_num_steps, train_batch_size;
    int fp16_rule;        /* fp16 uses DeepSpeed's loss scaler with these */
    long scale_window;
    int hysteresis, consecutive_hysteresis;
    double min_scale;
} glm_ds_settings;

typedef struct glm_train_args {
    /* model */
    char *model_name_or_path, *init_from_config, *tokenizer_name, *device;
    char *model_revision; /* the Hugging Face cache's revision of a model named by repository (core/hub.h) */
    /* an adapter to go on from (LLaMA-Factory's --adapter_name_or_path, THUDM ptuning's --ptuning_checkpoint) */
    char *adapter_name_or_path, *ptuning_checkpoint;
    /* LLaMA-Factory's: every adapter of --adapter_name_or_path merges into the base and a new
     * one trains (else all but the last merge and the last trains on) */
    int create_new_adapter;
    int disable_shuffling; /* LLaMA-Factory's: the training rows in file order */
    /* data */
    char *train_file, *validation_file, *data_format, *prompt_column, *response_column, *history_column;
    char *dataset, *dataset_dir, *template, *stage, *eval_dataset; /* LLaMA-Factory's names (data/dataset_info.h) */
    /* THUDM's ptuning/train.sh passes these Hugging Face flags */
    int do_train, do_eval, do_predict, predict_with_generate, overwrite_cache, preprocessing_num_workers;
    /* and LLaMA-Factory's training configs these */
    int trust_remote_code, plot_loss, save_only_model, cutoff_len, mask_history, max_samples, enable_thinking;
    /* and THUDM's finetune_demo configs (ChatGLM3, GLM-4) these: glm_train_config_key */
    char *data_dir, *peft_type;
    int use_cpu;
    char *prompt_template, *history_template, *source_prefix, *default_system, *cache_dir, *conversation_labels;
    double val_size;
    int max_source_length, max_target_length, train_on_prompt, skip_bad_samples, group_by_length, packing;
    int dataloader_num_workers, max_train_samples;
    /* schedule */
    char *output_dir, *logging_dir, *report_to, *lr_scheduler_type, *eval_strategy, *save_strategy, *logging_strategy;
    double eval_delay;      /* steps or epochs (by eval_strategy) before the first evaluation */
    int eval_on_start;      /* one evaluation before the first step */
    char *data_seed;        /* the order's seed, an integer as text; NULL: seed (setup.c glm_train_data_seed) */
    int dataloader_drop_last;
    char *test_file;        /* --do_predict's records (cli/cmd_train.c runs glmtrain generate on them) */
    int max_predict_samples;
    char *lr_scheduler_kwargs; /* a JSON object (optim/schedule.h glm_lr_kwargs) */
    char *resume_from_checkpoint, *save_dtype, *max_shard_size, *resume_mismatch;
    int overwrite_output_dir;
    double num_train_epochs, learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
    double warmup_ratio, init_std, fp16_initial_scale;
    long max_steps, warmup_steps;
    /* steps, or below 1 a ratio of the run's steps (the Trainer's: ceil(ratio x steps)); the
     * trainer resolves them once the steps are known (trainer.h log_every, eval_every, save_every) */
    double logging_steps, eval_steps, save_steps;
    int per_device_train_batch_size, per_device_eval_batch_size, gradient_accumulation_steps;
    int save_total_limit, seed, disable_tqdm, logging_first_step, save_final_model;
    /* Hugging Face's best-checkpoint keeping (train.c) */
    int load_best_model_at_end, greater_is_better;
    int early_stopping_patience;     /* transformers' EarlyStoppingCallback: evaluations without improvement */
    double early_stopping_threshold; /* the improvement that counts */
    char *metric_for_best_model;
    int max_bad_steps;     /* consecutive non-finite steps (bf16/fp32) before the run stops */
    /* precision and memory */
    int bf16, fp16, fp32, tf32, gradient_checkpointing, full_determinism;
    /* the optimizer: --optim (Hugging Face's names), where its state lives, when it steps */
    char *optim, *offload_optimizer;
    int optimizer_in_backward;
    /* what trains (model/config.h glm_peft) */
    char *finetuning_type, *lora_target, *quantization_type, *freeze_trainable_modules, *freeze_extra_modules;
    char *additional_target;
    int quantization_bit;
    int lora_rank, use_rslora, use_dora, num_layer_trainable, pre_seq_len, prefix_projection;
    int pissa_init, pissa_iter, pissa_convert; /* PiSSA's start (model/pissa.h), LLaMA-Factory's names */
    /* BAdam (optim/badam.h), LLaMA-Factory's names */
    int use_badam, badam_start_block, badam_switch_interval, badam_verbose;
    int use_llama_pro; /* LLaMA Pro's added blocks train (model/expand.h) */
    char *badam_mode, *badam_switch_mode, *badam_mask_mode;
    double badam_update_ratio;
    /* GaLore (optim/galore.h), LLaMA-Factory's names */
    int use_galore, galore_rank, galore_update_interval, galore_layerwise;
    char *galore_target, *galore_proj_type;
    double galore_scale;
    double lora_alpha, lora_dropout, prefix_dropout, loraplus_lr_ratio;
    double neftune_noise_alpha; /* NEFTune's noise on the embeddings while training (0: none) */
    /* --stage dpo (train/pref.h), LLaMA-Factory's names */
    char *pref_loss;
    int preprocessing_batch_size; /* --stage pt's groups of records */
    double pref_beta, pref_ftx, simpo_gamma, dpo_label_smoothing, summary_dropout_prob, kto_chosen_weight, kto_rejected_weight;
    char *ref_model, *ref_model_adapters; /* --stage dpo/kto: the reference model (default: the one training starts from) */
    /* how the run stops early (tests, demos) */
    double max_train_seconds;
    /* data parallel (parallel/): launch, ZeRO stage, gradient buckets, fault handling */
    char *nproc_per_node, *master_addr;
    int nnodes, node_rank, master_port, zero_stage, save_on_interrupt;
    double bucket_size_mb, ddp_timeout;
    /* pipeline parallel (parallel/pipe/pipe_train.c): stages, the layer split, micro-batches, memory cap */
    char *device_map, *max_memory_per_gpu;
    int pipeline_parallel_size, num_microbatches;
    /* a DeepSpeed config as Hugging Face's Trainer takes one (--deepspeed FILE) */
    char *deepspeed;
    glm_ds_settings ds;
} glm_train_args;

extern const glm_flag glm_train_flags[];
extern const int glm_train_nflags;
/* The train command's reading of a --config file's other keys (core/args.h glm_config_key_fn):
 * THUDM's finetune_demo configs (finetune_hf.py's lora.yaml / ptuning_v2.yaml / sft.yaml of
 * ChatGLM3 and GLM-4): data_config.*, max_input_length / max_output_length, training_args.*
 * (Seq2SeqTrainingArguments' names), peft_config.* (peft's LoraConfig / PrefixTuningConfig). */
const char *glm_train_config_key(const char *key, const char *value, char *why, size_t why_len);
/* Once after parsing, before anything reads them: the other-named settings into glmtrain's
 * (peft_type -> finetuning_type, use_cpu -> device, data files under data_dir). */
int glm_train_resolve_args(glm_train_args *a, glm_err *err);
void glm_train_args_free(glm_train_args *a);
/* --deepspeed FILE (train/deepspeed.c), as Hugging Face's Trainer reads one: "auto" takes the
 * flag's value, a value given must equal the flag's (every difference listed in one error, as
 * transformers does); zero_optimization sets --zero_stage and --offload_optimizer; the
 * optimizer, scheduler and fp16 sections are DeepSpeed's AdamW (decay on every tensor), its
 * WarmupLR / WarmupDecayLR / WarmupCosineLR and its loss scaler; what only tunes DeepSpeed's own
 * engine is named once and left alone, anything glmtrain cannot do as asked is an error. */
int glm_ds_apply(glm_train_args *a, glm_err *err);
/* The file's values that depend on the plan: warmup_num_steps, total_num_steps, train_batch_size. */
int glm_ds_check_plan(const glm_train_args *a, int world, long total_steps, long warmup_steps, glm_err *err);
/* The settings the parallel layer reads (launch, memory plan, layout), pointing into a. */
glm_par_opts glm_train_par_opts(const glm_train_args *a);

/* --stage rm: a value head scores the preference pairs */
static inline int glm_train_is_rm(const glm_train_args *a) { return a->stage && !strcmp(a->stage, "rm"); }
/* --stage kto: examples with a desirable/undesirable tag, each beside its KL example (a pair of rows too) */
static inline int glm_train_is_kto(const glm_train_args *a) { return a->stage && !strcmp(a->stage, "kto"); }
/* --stage dpo, rm or kto: batches of two-row examples (train/pref.h) */
static inline int glm_train_is_pref(const glm_train_args *a) {
    return a->stage && (!strcmp(a->stage, "dpo") || glm_train_is_rm(a) || glm_train_is_kto(a));
}

/* --stage pt: texts cut into blocks (data/examples.h pt_block) */
static inline int glm_train_is_pt(const glm_train_args *a) { return a->stage && !strcmp(a->stage, "pt"); }

/* The run is a pipeline of stages: more than one, or a device map file (auto and thudm only say how
 * to split when there are stages). */
static inline int glm_train_uses_stages(const glm_train_args *a) {
    return a->pipeline_parallel_size > 1 || (a->device_map && strcmp(a->device_map, "auto") && strcmp(a->device_map, "thudm"));
}

/* Rows of a micro-batch: a batch of P preference pairs has 2P (the memory plan's B). */
static inline int glm_train_rows(const glm_train_args *a) { return a->per_device_train_batch_size * (glm_train_is_pref(a) ? 2 : 1); }

/* The longest training example in tokens: --cutoff_len, else the two lengths together. */
static inline int glm_train_seq_len(const glm_train_args *a) {
    return a->cutoff_len > 0 ? a->cutoff_len : a->max_source_length + a->max_target_length;
}

/* --lora_dropout as given, or its default (-1): 0.05, and 0 with --use_dora (peft's and
 * LLaMA-Factory's DoRA default: dropout costs DoRA a second base product) */
static inline double glm_train_lora_dropout(double given, int use_dora) { return given == -1 ? (use_dora ? 0.0 : 0.05) : given; }
#endif
