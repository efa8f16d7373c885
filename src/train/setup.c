/* Set-up of a training run (train/trainer.h): backend, model (loaded or drawn), tokenizer,
 * data and loaders, the step plan, and the output folder check. */
#include "train/trainer.h"
#include <errno.h>
#include <limits.h>
#include "model/adapter.h"
#include "model/pissa.h"
#include "data/thought.h"
#include "data/dataset_info.h"
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "data/hash.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* torch.optim.AdamW's ranges, with its wording; written as !(ok) so that nan fails too. A value
 * outside them does not crash: it trains to NaN (beta2 > 1) or quietly diverges. */
static int check_optimizer_args(const glm_train_args *a, glm_err *err) {
    const char *why = NULL, *flag = NULL;
    double v = 0;
    if (!(a->learning_rate >= 0 && isfinite(a->learning_rate))) why = "invalid learning rate", flag = "learning_rate", v = a->learning_rate;
    else if (!(a->adam_epsilon >= 0)) why = "invalid epsilon value", flag = "adam_epsilon", v = a->adam_epsilon;
    else if (!(a->adam_beta1 >= 0 && a->adam_beta1 < 1)) why = "invalid beta parameter at index 0", flag = "adam_beta1", v = a->adam_beta1;
    else if (!(a->adam_beta2 >= 0 && a->adam_beta2 < 1)) why = "invalid beta parameter at index 1", flag = "adam_beta2", v = a->adam_beta2;
    else if (!(a->weight_decay >= 0)) why = "invalid weight_decay value", flag = "weight_decay", v = a->weight_decay;
    else if (!(a->max_grad_norm >= 0)) why = "must be >= 0 (0 = no clipping)", flag = "max_grad_norm", v = a->max_grad_norm;
    if (why) {
        glm_fail(err, "--%s %g: %s", flag, v, why);
        return glm_hint(err, "AdamW (as torch.optim.AdamW) needs 0 <= learning_rate, 0 <= adam_epsilon, "
                             "0 <= adam_beta1 < 1, 0 <= adam_beta2 < 1, 0 <= weight_decay");
    }
    if (a->max_bad_steps < 1)
        return glm_fail(err, "--max_bad_steps %d: must be at least 1 (consecutive non-finite steps before the run stops)",
                        a->max_bad_steps);
    return 0;
}

/* The seed of the training rows' order: --data_seed, or --seed when it is not given (the
 * Trainer's data_seed). -1 with err for text that is not a whole number of int's range. */
static int data_seed(const glm_train_args *a, int *out, glm_err *err) {
    *out = a->seed;
    if (!a->data_seed) return 0;
    char *end;
    errno = 0;
    long v = strtol(a->data_seed, &end, 10);
    if (end == a->data_seed || *end || errno || v < INT_MIN || v > INT_MAX)
        return glm_fail(err, "--data_seed %s: not a whole number", a->data_seed), glm_hint(err, "e.g. --data_seed 42, or leave it out to use --seed");
    *out = (int)v;
    return 0;
}

/* --logging_steps, --eval_steps, --save_steps as the Trainer takes them: a whole number of steps,
 * or below 1 a ratio of the run's steps, checked where its strategy is steps; 0 where zero_ok
 * (eval_steps: then logging_steps). */
static int check_interval(const char *name, double v, int steps, int zero_ok, glm_err *err) {
    if (v == 0 && steps && !zero_ok) /* transformers' check, in its words */
        return glm_fail(err, "%.*s strategy steps requires non-zero --%s", (int)strcspn(name, "_"), name, name),
               glm_hint(err, "e.g. --%s 100, or --%s 0.1 for every tenth of the steps", name, name);
    if (!isfinite(v) || v < 0)
        return glm_fail(err, "--%s %g: a number of steps, or below 1 a ratio of the run's steps", name, v),
               glm_hint(err, "e.g. --%s 100, or --%s 0.1 for every tenth of the steps", name, name);
    if (steps && v > 1 && v != floor(v)) /* transformers' check, in its words */
        return glm_fail(err, "--%s must be an integer if bigger than 1: %g", name, v);
    return 0;
}

/* A step interval in steps: a ratio below 1 of the run's steps, rounded up as the Trainer does. */
static long interval_steps(double v, long total) { return v < 1 ? (long)ceil(v * (double)total) : (long)v; }

/* What evaluations drive: the best checkpoint (--load_best_model_at_end, --save_strategy best),
 * reduce_lr_on_plateau and early stopping; transformers' checks of them, in its words. */
/* --stage and the preference flags (train/pref.h). */
static int check_pref_args(const glm_train_args *a, glm_err *err) {
    if (glm_train_is_pt(a)) {
        if (a->cutoff_len <= 0)
            return glm_fail(err, "--stage pt cuts the joined texts into blocks of --cutoff_len tokens: give --cutoff_len"),
                   glm_hint(err, "LLaMA-Factory's default is 2048");
        if (a->preprocessing_batch_size < 1)
            return glm_fail(err, "--preprocessing_batch_size %d: must be at least 1", a->preprocessing_batch_size);
        if (a->packing) return glm_fail(err, "--packing with --stage pt: its blocks are whole rows already"), glm_hint(err, "drop --packing");
        if (strcmp(a->finetuning_type, "ptuning") == 0)
            return glm_fail(err, "--stage pt with --finetuning_type ptuning is not supported"),
                   glm_hint(err, "use lora, freeze or full");
        return 0;
    }
    if (!glm_train_is_pref(a)) {
        if (a->ref_model || a->ref_model_adapters)
            return glm_fail(err, "--ref_model is --stage dpo's and kto's (the reference of a preference loss)"),
                   glm_hint(err, "drop it, or give --stage dpo");
        if (a->stage && !strcmp(a->stage, "ppo"))
            return glm_fail(err, "--stage ppo: LLaMA-Factory's PPO stage is not in glmtrain"),
                   glm_hint(err, "train on preference pairs with --stage dpo (or kto for answers marked good or bad); a "
                                 "reward model from --stage rm scores texts through glmtrain serve's POST "
                                 "/v1/score/evaluation (docs/DPO.md)");
        if (a->stage && strcmp(a->stage, "sft"))
            return glm_fail(err, "--stage %s: glmtrain trains sft (supervised fine-tuning), pt (pre-training on texts), "
                                 "dpo (preference pairs), rm (a reward model) and kto (desirable and undesirable answers)",
                            a->stage);
        return 0;
    }
    const char *stage = a->stage;
    if (a->ref_model_adapters && !a->ref_model)
        return glm_fail(err, "--ref_model_adapters without --ref_model"), glm_hint(err, "name the base they adapt with --ref_model");
    if (!strcmp(a->finetuning_type, "ptuning"))
        return glm_fail(err, "--stage %s with --finetuning_type ptuning: %s", stage,
                        glm_train_is_rm(a) ? "LLaMA-Factory trains reward models with lora, freeze or full"
                                           : "the reference would be the model without its prefix, which P-Tuning v2 "
                                             "cannot leave out"),
               glm_hint(err, "use --finetuning_type lora (or freeze, full), as LLaMA-Factory does");
    if (a->packing) return glm_fail(err, "--packing with --stage %s: a pair's two answers are rows of their own", stage),
                           glm_hint(err, "drop --packing");
    if (glm_train_uses_stages(a)) /* the pairs' loss needs every layer in one process */
        return glm_fail(err, "--stage %s on pipeline stages (--%s) is not supported", stage,
                        a->pipeline_parallel_size > 1 ? "pipeline_parallel_size" : "device_map"),
               glm_hint(err, "train on one GPU or with data parallelism (--nproc_per_node)");
    if (a->metric_for_best_model && strstr(a->metric_for_best_model, "perplexity"))
        return glm_fail(err, "--metric_for_best_model %s with --stage %s: a %s has no perplexity", a->metric_for_best_model,
                        stage, glm_train_is_rm(a) ? "reward model" : "preference loss"),
               glm_hint(err, "use eval_loss");
    if (a->do_predict && !glm_train_is_rm(a)) /* rm scores the test file's pairs (train/pref_train.c) */
        return glm_fail(err, "--do_predict with --stage %s: a preference run has no test answers to predict", stage),
               glm_hint(err, "after training: glmtrain generate --model_name_or_path OUTPUT_DIR --input_file FILE");
    if (glm_train_is_rm(a)) {
        if (a->ref_model) return glm_fail(err, "--ref_model with --stage rm: a reward model has no reference");
        if (!(a->summary_dropout_prob >= 0 && a->summary_dropout_prob < 1))
            return glm_fail(err, "--summary_dropout_prob %g: must be in [0, 1)", a->summary_dropout_prob);
        return 0;
    }
    if (!(a->pref_beta > 0)) return glm_fail(err, "--pref_beta %g: must be positive", a->pref_beta);
    if (!(a->pref_ftx >= 0)) return glm_fail(err, "--pref_ftx %g: must not be negative", a->pref_ftx);
    if (glm_train_is_kto(a)) {
        if (!(a->kto_chosen_weight > 0) || !(a->kto_rejected_weight > 0))
            return glm_fail(err, "--kto_chosen_weight %g, --kto_rejected_weight %g: both must be positive", a->kto_chosen_weight,
                            a->kto_rejected_weight);
        if (a->preprocessing_batch_size < 1)
            return glm_fail(err, "--preprocessing_batch_size %d: must be at least 1", a->preprocessing_batch_size);
        return 0;
    }
    glm_pref_loss l;
    if (glm_pref_loss_parse(a->pref_loss, &l))
        return glm_fail(err, "--pref_loss %s is not known", a->pref_loss), glm_hint(err, "sigmoid, hinge, ipo, orpo or simpo");
    if (a->ref_model && !glm_pref_uses_ref(l))
        return glm_fail(err, "--ref_model with --pref_loss %s: %s uses no reference model", a->pref_loss, a->pref_loss),
               glm_hint(err, "drop --ref_model, or use sigmoid, hinge or ipo");
    if (!(a->dpo_label_smoothing >= 0 && a->dpo_label_smoothing <= 0.5))
        return glm_fail(err, "--dpo_label_smoothing %g: must be in [0, 0.5]", a->dpo_label_smoothing);
    if (a->dpo_label_smoothing > 0 && l != GLM_PREF_SIGMOID)
        return glm_fail(err, "--dpo_label_smoothing applies to --pref_loss sigmoid, not %s", a->pref_loss);
    return 0;
}

static int check_eval_args(const glm_train_args *a, glm_err *err) {
    int save_best = !strcmp(a->save_strategy, "best"), plateau = !strcmp(a->lr_scheduler_type, "reduce_lr_on_plateau");
    if (plateau && !strcmp(a->eval_strategy, "no")) /* transformers' TrainingArguments check, in its words */
        return glm_fail(err, "lr_scheduler_type reduce_lr_on_plateau requires an eval strategy"),
               glm_hint(err, "add --eval_strategy steps (with --eval_steps) or epoch: the rate is cut on the evaluations' "
                             "--metric_for_best_model");
    if (plateau && (a->warmup_steps > 0 || a->warmup_ratio > 0))
        glm_info("--warmup_steps / --warmup_ratio are not used by reduce_lr_on_plateau (transformers' get_scheduler gives it none)");
    if (save_best && !strcmp(a->eval_strategy, "no"))
        return glm_fail(err, "--save_strategy best saves at the evaluations that beat the best so far, and --eval_strategy is no"),
               glm_hint(err, "add --eval_strategy steps (with --eval_steps) or epoch");
    if (a->load_best_model_at_end || save_best || plateau) { /* transformers' TrainingArguments checks, in its words */
        const char *m = a->metric_for_best_model;
        int accuracy = glm_train_is_rm(a) && (!strcmp(m, "accuracy") || !strcmp(m, "eval_accuracy")); /* rm's evaluations give it */
        if (!accuracy && strcmp(m, "loss") && strcmp(m, "eval_loss") && strcmp(m, "perplexity") && strcmp(m, "eval_perplexity"))
            return glm_fail(err, "--metric_for_best_model %s: glmtrain's evaluation gives eval_loss and eval_perplexity%s", m,
                            glm_train_is_rm(a) ? " (--stage rm: eval_loss and eval_accuracy)" : ""),
                   glm_hint(err, "use loss or perplexity; BLEU/ROUGE of generated answers come from glmtrain generate --input_file");
    }
    if (a->load_best_model_at_end && !save_best) {
        if (strcmp(a->eval_strategy, a->save_strategy))
            return glm_fail(err, "--load_best_model_at_end requires the save and eval strategy to match, but found\n"
                                 "- Evaluation strategy: %s\n- Save strategy: %s", a->eval_strategy, a->save_strategy),
                   glm_hint(err, "give --eval_strategy and --save_strategy the same value (steps or epoch)");
        double ev = a->eval_steps > 0 ? a->eval_steps : a->logging_steps, sv = a->save_steps;
        if (!strcmp(a->save_strategy, "steps") && (ev < 1) != (sv < 1))
            return glm_fail(err, "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation steps, "
                                 "which cannot get guaranteed when mixing ratio and absolute steps for save_steps %g and "
                                 "eval_steps %g", sv, ev),
                   glm_hint(err, "give both as steps, or both as ratios of the run's steps");
        if (!strcmp(a->save_strategy, "steps") && ev < 1 && llround(sv * 1e6) % llround(ev * 1e6))
            return glm_fail(err, "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation steps, "
                                 "but found %g, which is not a multiple of %g", sv, ev);
        if (!strcmp(a->save_strategy, "steps") && ev >= 1 && (long)sv % (long)ev)
            return glm_fail(err, "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
                                 "steps, but found %ld, which is not a round multiple of %ld", (long)sv, (long)ev),
                   glm_hint(err, "e.g. --save_steps %ld", (long)ev * ((long)sv / (long)ev > 0 ? (long)sv / (long)ev : 1));
    }
    if (a->early_stopping_patience < 0) return glm_fail(err, "--early_stopping_patience %d: a number of evaluations (0: never stop early)", a->early_stopping_patience);
    if (!(a->early_stopping_threshold >= 0 && isfinite(a->early_stopping_threshold)))
        return glm_fail(err, "--early_stopping_threshold %g: the improvement that counts, 0 or more", a->early_stopping_threshold);
    if (a->early_stopping_patience > 0 && !a->load_best_model_at_end) /* transformers' EarlyStoppingCallback asserts both */
        return glm_fail(err, "--early_stopping_patience requires --load_best_model_at_end"),
               glm_hint(err, "add --load_best_model_at_end with --eval_strategy and --save_strategy steps (or epoch): the run "
                             "then ends on its best checkpoint");
    if (a->early_stopping_patience > 0 && !strcmp(a->eval_strategy, "no"))
        return glm_fail(err, "--early_stopping_patience requires an --eval_strategy of steps or epoch");
    return 0;
}

int glm_train_check_args(glm_train_args *a, glm_err *err) {
    if (!a->output_dir) return glm_fail(err, "--output_dir is required"), glm_hint(err, "e.g. --output_dir out/my-run");
    if (!a->train_file && !a->dataset && (a->do_train || (a->do_eval && !a->validation_file && !a->eval_dataset)))
        return glm_fail(err, "--train_file is required"), glm_hint(err, "a .json or .jsonl file of {\"instruction\", \"output\"} records");
    if (a->train_file && a->dataset)
        return glm_fail(err, "--train_file and --dataset both given"),
               glm_hint(err, "--dataset names LLaMA-Factory dataset_info.json entries; give one or the other");
    int order_seed;
    if (data_seed(a, &order_seed, err)) return -1;
    { /* the schedule's settings, checked before anything loads (the warmup here: set or not) */
        glm_lr_sched s = {.base_lr = (float)a->learning_rate, .warmup = a->warmup_steps > 0 || a->warmup_ratio > 0, .total = 2};
        glm_lr_kind_parse(a->lr_scheduler_type, &s.kind);
        if (glm_lr_kwargs(&s, a->lr_scheduler_kwargs, err)) return -1;
    }
    if (a->cutoff_len < 0 || (a->cutoff_len > 0 && a->cutoff_len < 8))
        return glm_fail(err, "--cutoff_len %d: the tokens an example keeps, at least 8 (0: --max_source_length and "
                             "--max_target_length instead)", a->cutoff_len);
    if (a->max_samples < 0) return glm_fail(err, "--max_samples %d: must be 0 (all) or a count", a->max_samples);
    if (!a->do_train && !a->do_eval && !a->do_predict)
        return glm_fail(err, "--do_train false without --do_eval: nothing to do"),
               glm_hint(err, "add --do_eval for the loss and perplexity on the data; for predictions with BLEU/ROUGE: "
                             "glmtrain generate --input_file FILE --model_name_or_path DIR");
    if (a->adapter_name_or_path && a->ptuning_checkpoint)
        return glm_fail(err, "--adapter_name_or_path and --ptuning_checkpoint both name an adapter to start from"),
               glm_hint(err, "give one");
    if (a->create_new_adapter && a->ptuning_checkpoint)
        return glm_fail(err, "--create_new_adapter with --ptuning_checkpoint: a P-Tuning v2 prefix is not a weight change and "
                             "cannot merge into the base"),
               glm_hint(err, "train the prefix on (drop --create_new_adapter), or start a new one without --ptuning_checkpoint");
    if ((a->adapter_name_or_path || a->ptuning_checkpoint) && !a->model_name_or_path)
        return glm_fail(err, "--%s needs the base model it was trained on: --model_name_or_path",
                        a->adapter_name_or_path ? "adapter_name_or_path" : "ptuning_checkpoint");
    if (a->do_predict && !a->test_file)
        return glm_fail(err, "--do_predict needs --test_file (the records to answer), as THUDM's main.py"),
               glm_hint(err, "e.g. --test_file AdvertiseGen/dev.json");
    if (a->do_predict && a->do_train && !a->save_final_model && !glm_train_is_rm(a)) /* rm scores with the model in memory */
        return glm_fail(err, "--do_predict after training answers with the final model, but --save_final_model is false"),
               glm_hint(err, "drop --save_final_model false, or predict later: glmtrain generate --input_file");
    if (a->do_predict && a->do_train && !glm_train_is_rm(a) && !a->model_name_or_path && strcmp(a->finetuning_type, "full") &&
        strcmp(a->finetuning_type, "freeze"))
        return glm_fail(err, "--do_predict after --finetuning_type %s needs the base it adapts: --model_name_or_path", a->finetuning_type);
    if (check_pref_args(a, err)) return -1;
    if (!a->model_name_or_path && !a->init_from_config)
        return glm_fail(err, "one of --model_name_or_path or --init_from_config is required"),
               glm_hint(err, "--model_name_or_path takes a Hugging Face style chatglm-6b folder");
    if (a->per_device_train_batch_size < 1) return glm_fail(err, "--per_device_train_batch_size must be at least 1");
    if (a->per_device_eval_batch_size < 1) return glm_fail(err, "--per_device_eval_batch_size must be at least 1");
    if (a->gradient_accumulation_steps < 1) return glm_fail(err, "--gradient_accumulation_steps must be at least 1");
    if (check_optimizer_args(a, err)) return -1;
    if (a->num_train_epochs <= 0 && a->max_steps <= 0) return glm_fail(err, "--num_train_epochs must be positive (or set --max_steps)");
    if (check_interval("logging_steps", a->logging_steps, !strcmp(a->logging_strategy, "steps"), 0, err) ||
        check_interval("eval_steps", a->eval_steps, !strcmp(a->eval_strategy, "steps"), 1, err) ||
        check_interval("save_steps", a->save_steps, !strcmp(a->save_strategy, "steps"), 0, err))
        return -1;
    if (!(a->eval_delay >= 0)) return glm_fail(err, "--eval_delay %g must not be negative", a->eval_delay);
    if (a->bf16 + a->fp16 + a->fp32 > 1) return glm_fail(err, "choose one of --bf16, --fp16, --fp32");
    if (glm_optim_parse(a->optim) < 0)
        return glm_fail(err, "--optim %s is not an optimizer glmtrain has", a->optim),
               glm_hint(err, "choose adamw_torch (also adamw_hf, adamw_torch_fused, paged_adamw_32bit) or adamw_8bit (also "
                             "adamw_bnb_8bit, paged_adamw_8bit)");
    if (!strncmp(a->optim, "paged_", 6))
        glm_info("--optim %s: the update of %s; its state stays where the memory plan puts it (--offload_optimizer cpu "
                 "moves it to host memory)", a->optim, glm_optim_parse(a->optim) == GLM_OPTIM_ADAMW8 ? "adamw_8bit" : "adamw_torch");
    if (strcmp(a->offload_optimizer, "none") && strcmp(a->offload_optimizer, "cpu"))
        return glm_fail(err, "--offload_optimizer %s: choose cpu or none", a->offload_optimizer),
               glm_hint(err, "nvme offload is not supported");
    if (a->galore_layerwise) { /* LLaMA-Factory's layer-wise GaLore: each weight updated as its gradient is ready */
        if (!a->use_galore)
            return glm_fail(err, "--galore_layerwise without --use_galore"), glm_hint(err, "add --use_galore, or drop it");
        if (a->gradient_accumulation_steps > 1)
            return glm_fail(err, "--galore_layerwise updates each layer from one micro-batch, so it cannot take "
                                 "--gradient_accumulation_steps %d (LLaMA-Factory refuses it too)", a->gradient_accumulation_steps),
                   glm_hint(err, "raise --per_device_train_batch_size instead, or drop --galore_layerwise");
        if (a->max_grad_norm > 0) {
            glm_warn("--galore_layerwise: no clipping (--max_grad_norm %g is left out): each layer is updated before the "
                     "whole model's gradient norm is known, and LLaMA-Factory's layer-wise GaLore clips nothing either",
                     a->max_grad_norm);
            a->max_grad_norm = 0;
        }
        a->optimizer_in_backward = 1; /* parallel/dp/dp_offload.c's update inside backward, unit by unit */
    }
    if (a->optimizer_in_backward) {
        if (a->gradient_accumulation_steps > 1)
            return glm_fail(err, "--optimizer_in_backward updates each layer from one micro-batch, so it cannot take "
                                 "--gradient_accumulation_steps %d", a->gradient_accumulation_steps),
                   glm_hint(err, "raise --per_device_train_batch_size instead (with --gradient_checkpointing to fit it), or drop --optimizer_in_backward");
        if (a->max_grad_norm > 0)
            return glm_fail(err, "--optimizer_in_backward cannot clip by the global gradient norm (--max_grad_norm %g): "
                                 "each layer is updated before the norm of the whole model is known", a->max_grad_norm),
                   glm_hint(err, "add --max_grad_norm 0 (torchtune's optimizer_in_bwd does the same), or drop --optimizer_in_backward");
        if (a->fp16)
            return glm_fail(err, "--optimizer_in_backward cannot take --fp16: the loss scaler skips steps whose gradients "
                                 "overflow, which needs every gradient before any update"),
                   glm_hint(err, "use --bf16");
        if (a->pipeline_parallel_size > 1)
            return glm_fail(err, "--optimizer_in_backward does not combine with --pipeline_parallel_size %d", a->pipeline_parallel_size);
    }
    if (strcmp(a->offload_optimizer, "cpu") == 0 && a->pipeline_parallel_size > 1)
        return glm_fail(err, "--offload_optimizer cpu does not combine with --pipeline_parallel_size %d yet", a->pipeline_parallel_size);
    if (a->warmup_ratio < 0 || a->warmup_ratio > 1) return glm_fail(err, "--warmup_ratio must be in [0, 1]");
    if (!(a->fp16_initial_scale > 0)) return glm_fail(err, "--fp16_initial_scale must be positive");
    if (a->save_total_limit < 0) return glm_fail(err, "--save_total_limit must not be negative");
    if (!strcmp(a->report_to, "all")) { /* the Trainer's "every integration installed": here that is TensorBoard */
        free(a->report_to);
        a->report_to = glm_strdup("tensorboard");
    } else if (strcmp(a->report_to, "tensorboard") && strcmp(a->report_to, "none")) {
        glm_fail(err, "--report_to %s: glmtrain writes TensorBoard event files (tensorboard) or nothing (none)", a->report_to);
        if (strstr(a->report_to, "wandb"))
            return glm_hint(err, "use --report_to tensorboard; Weights & Biases takes the event files with "
                                 "`wandb sync --sync-tensorboard <output_dir>/runs`");
        return glm_hint(err, "use --report_to tensorboard (or none); other trackers read TensorBoard's event files");
    }
    if (check_eval_args(a, err)) return -1;
    if (a->pipeline_parallel_size < 1) return glm_fail(err, "--pipeline_parallel_size must be at least 1");
    if (a->num_microbatches < 0) return glm_fail(err, "--num_microbatches must not be negative");
    if (a->num_microbatches > 0) a->gradient_accumulation_steps = a->num_microbatches; /* the same count, pipeline's name */
    size_t shard;
    if (strcmp(a->max_shard_size, "0") != 0 && glm_parse_size(a->max_shard_size, &shard))
        return glm_fail(err, "--max_shard_size %s is not a size", a->max_shard_size), glm_hint(err, "e.g. 10GB, 500MB, 2GiB, or 0 for one file");
    return 0;
}

int trainer_pick_backend(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_dtype dt = a->fp32 ? GLM_F32 : a->fp16 ? GLM_F16 : GLM_BF16;
    char why[512];
    if (glm_backend_open(a->device, glm_local_device(t->dp->dist.local_rank), &dt, 1, &t->be, why, sizeof why, err))
        return -1;
    if (t->be && glm_backend_on_gpu(t->be)) {
        if (a->tf32 && t->be->capability < 80) { /* as Hugging Face's Trainer: TF32 is Ampere's */
            t->be->destroy(t->be);
            t->be = NULL;
            glm_fail(err, "--tf32 needs an Ampere or newer GPU (compute capability 8.0+); this one has no TF32");
            return glm_hint(err, "drop --tf32: the fp32 products then run in plain fp32");
        }
        t->be->allow_tf32 = a->tf32; /* Ampere and newer (checked above) */
        t->be->deterministic = a->full_determinism;
        t->be->tune_products = 1;
        if (a->tf32 && dt != GLM_F32)
            glm_warn("--tf32 changes only fp32 products; this run's are %s (pass --fp32 with --tf32)", a->fp16 ? "fp16" : "bf16");
        return 0;
    }
    if (!t->be && glm_cuda_device_count() > 0) { /* a GPU this run cannot use as asked: say so, do not crawl on the CPU */
        glm_fail(err, "%s", why);
        return glm_hint(err, "or pass --device cpu to train on the CPU");
    }
    if (!t->be && why[0]) glm_info("no usable GPU (%s); training on the CPU", why);
    if (a->tf32 || a->bf16 || a->fp16) { /* the CPU trains in plain fp32 */
        if (t->be) t->be->destroy(t->be);
        t->be = NULL;
        if (a->tf32) {
            glm_fail(err, "--tf32 needs an NVIDIA GPU (Ampere or newer): the CPU backend has no TF32");
            return glm_hint(err, "drop --tf32 to train on the CPU in plain fp32");
        }
        glm_fail(err, "--%s needs a GPU; the CPU backend trains in fp32", a->bf16 ? "bf16" : "fp16");
        return glm_hint(err, "drop --%s (or pass --fp32) to train on the CPU", a->bf16 ? "bf16" : "fp16");
    }
    if (!t->be) t->be = glm_backend_cpu();
    return 0;
}

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

int trainer_load_tokenizer(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    const char *p = a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path;
    char dir[4096];
    if (!p) { /* random init: look beside the config */
        snprintf(dir, sizeof dir, "%s", a->init_from_config);
        char *slash = strrchr(dir, '/');
        if (glm_is_file(dir)) { if (slash) *slash = 0; else snprintf(dir, sizeof dir, "."); }
        p = dir;
    }
    snprintf(t->tok_path, sizeof t->tok_path, "%s", p);
    if (glm_tokenizer_load(&t->tok, p, err)) return glm_hint(err, "pass --tokenizer_name with the folder holding ice_text.model");
    if (glm_tokenizer_vocab_size(t->tok) > t->m.cfg.vocab_size) {
        glm_fail(err, "tokenizer %s has %d pieces but the model's vocab_size is %d", p, glm_tokenizer_vocab_size(t->tok),
                 t->m.cfg.vocab_size);
        return glm_hint(err, "use the tokenizer that belongs to the model");
    }
    return glm_encoder_from_tokenizer(&t->enc, t->tok, p, err);
}

/* Rank 0 tokenizes (or validates) the cache first; the others wait without the collective
 * timeout (that can take long on a big file), then read the cache it wrote. */
static int data_vote(trainer *t, double *failed, glm_err *err) {
    const char *what = "data cache built by rank 0";
    glm_par p = {t->dp, t->pp};
    return glm_par_sum(&p, failed, 1, 1, what, err);
}

static int load_data_ranked(trainer *t, glm_err *err) {
    if (!lead(t)) {
        double failed = 0;
        if (data_vote(t, &failed, err)) return -1;
        if (failed > 0) return glm_fail(err, "rank %d: rank 0 could not load the data (see its error)", t->dp->rank);
    }
    int rc = glm_data_load(&t->data, &t->dcfg, &t->enc, err);
    if (lead(t)) {
        double failed = rc != 0;
        glm_err e2;
        if (data_vote(t, &failed, rc ? &e2 : err)) return -1;
    }
    return rc;
}


/* The text of ids[0..n) with every token as itself, special tokens by name (what the model reads). */
/* The tokens' bytes as text: valid UTF-8 as it is, any other byte as SentencePiece names a byte
 * piece (<0xE5>), so a character that truncation cut, or a run of byte pieces, stays readable
 * text on the terminal and in log files. */
static void put_tokens(FILE *f, const glm_tokenizer *tok, const int32_t *ids, int n) {
    char *all = NULL;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t k;
        char *b = glm_tokenizer_token_bytes(tok, ids[i], &k);
        all = glm_realloc(all, len + k + 1);
        memcpy(all + len, b, k);
        len += k;
        free(b);
    }
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)all[i];
        size_t k = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
        if (k && i + k <= len && glm_utf8_valid(all + i, k)) { fwrite(all + i, 1, k, f); i += k; }
        else { fprintf(f, "<0x%02X>", c); i++; }
    }
    free(all);
}

/* The first training example as the model sees it, the way THUDM's ptuning (print_dataset_example)
 * and LLaMA-Factory show it before training: where a template or a label went wrong, it shows. */
static void print_first_example(FILE *f, const glm_tokenizer *tok, const glm_examples *ex) {
    if (ex->n == 0) return;
    int n = glm_examples_len(ex, 0), targets = 0;
    int32_t *lab = glm_malloc(sizeof *lab * (size_t)(n + 1));
    glm_examples_labels(ex, 0, lab);
    for (int i = 0; i < n; i++) targets += lab[i] != -100;
    const int32_t *ids = ex->ids + ex->off[0];
    fprintf(f, "[glmtrain] the first training example (%d tokens, %d of them targets; special tokens by name):\ninputs: ", n,
            targets);
    put_tokens(f, tok, ids, n);
    fprintf(f, "\nlabels: "); /* the target tokens, \u22ef where tokens without a target come between them */
    for (int i = 0, any = 0; i < n;) {
        if (lab[i] == -100) { i++; continue; }
        int j = i;
        while (j < n && lab[j] != -100) j++; /* a run of targets, written as one text */
        if (any) fputs(" \u22ef ", f);
        any = 1;
        put_tokens(f, tok, &lab[i], j - i);
        i = j;
    }
    fputc('\n', f);
    free(lab);
}

int trainer_load_data(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cfg *d = &t->dcfg;
    glm_data_cfg_init(d);
    d->train_file = a->train_file;
    d->validation_file = a->validation_file;
    if (a->dataset) {
        if (glm_dataset_info_sources(a->dataset_dir, a->dataset, &t->sources, &d->n_sources, err)) return -1;
        d->sources = t->sources;
    }
    if (a->eval_dataset) {
        if (a->validation_file)
            return glm_fail(err, "--eval_dataset and --validation_file both name the validation set"), glm_hint(err, "give one");
        if (glm_dataset_info_sources(a->dataset_dir, a->eval_dataset, &t->val_sources, &d->n_val_sources, err)) return -1;
        d->val_sources = t->val_sources;
        if (a->val_size > 0) /* LLaMA-Factory splits off val_size only without an eval_dataset */
            glm_info("--val_size %g is not used: --eval_dataset %s is the validation set", a->val_size, a->eval_dataset);
    }
    if (!a->do_train) { /* an evaluation alone: of the validation set, or else of the training data itself */
        if (!a->do_eval && !d->train_file && !d->n_sources) /* --stage rm's scores alone: the loader reads the test file */
            d->train_file = d->validation_file = a->test_file;
        if (!d->validation_file && !d->n_val_sources && a->val_size <= 0) {
            d->validation_file = a->train_file;
            d->val_sources = d->sources;
            d->n_val_sources = d->n_sources;
        }
        if (!d->train_file && !d->n_sources) { /* the loader wants a training set: the same data */
            d->train_file = d->validation_file;
            d->sources = d->val_sources;
            d->n_sources = d->n_val_sources;
        }
        if (!d->validation_file && !d->n_val_sources && !(a->val_size > 0))
            return glm_fail(err, "--do_train false --do_eval: no data to evaluate"),
                   glm_hint(err, "give --validation_file FILE (or --train_file, --dataset, --eval_dataset)");
    }
    if (a->template && glm_lf_template_check(a->template, t->enc.layout, err)) return -1;
    const char *tp = a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path;
    if (!a->template && t->enc.layout == GLM_LAYOUT_GLM4 && glm_tokenizer_template_thinks(tp))
        glm_info("%s's chat template writes <think> thoughts (GLM-Z1): give --template glmz1 to train as LLaMA-Factory's "
                 "glmz1 (answers without a thought get the empty one; --enable_thinking)", tp);
    if ((a->dataset || a->template) && a->quantization_bit == 4 && !strcmp(a->quantization_type, "int"))
        glm_warn("--quantization_bit 4 is THUDM's INT4 here; LLaMA-Factory's is bitsandbytes NF4: add --quantization_type nf4 for that");
    if (glm_schema_parse(strcmp(a->data_format, "chatglm") == 0 ? "columns" : a->data_format, &d->read.schema))
        return glm_fail(err, "--data_format %s is not known", a->data_format);
    d->read.pairs = glm_train_is_pref(a) && !glm_train_is_kto(a); /* KTO's second row is built, not read */
    d->read.kto = d->example.kto = glm_train_is_kto(a);
    if (d->read.kto) d->example.pt_group = a->preprocessing_batch_size;
    d->read.texts = glm_train_is_pt(a);
    if (d->read.texts) {
        if (t->enc.layout == GLM_LAYOUT_GLM)
            return glm_fail(err, "--stage pt with a ChatGLM-6B tokenizer: ChatGLM-6B is a prefix-LM (GLM's blank infilling), "
                                 "and plain next-token blocks would let every token see the ones it predicts"),
                   glm_hint(err, "continue pre-training a ChatGLM2/3 or GLM-4 model, or train ChatGLM-6B with --stage sft");
        if (t->enc.text_eos < 0) return glm_fail(err, "--stage pt: the tokenizer has no eos token to end each text with");
        d->example.pt_block = a->cutoff_len;
        d->example.pt_group = a->preprocessing_batch_size;
    }
    d->read.columns.prompt = a->prompt_column;
    d->read.columns.response = a->response_column;
    d->read.columns.history = a->history_column;
    d->read.skip_bad_samples = a->skip_bad_samples;
    d->example.max_source_length = a->max_source_length;
    d->example.max_target_length = a->max_target_length;
    d->example.cutoff_len = a->cutoff_len;
    d->example.mask_history = a->mask_history;
    d->example.source_prefix = a->source_prefix;
    d->example.default_system = a->default_system;
    if (a->prompt_template) glm_unescape(a->prompt_template);
    if (a->history_template) glm_unescape(a->history_template);
    d->example.prompt_template = a->prompt_template;
    d->example.history_template = a->history_template;
    d->example.train_on_prompt = a->train_on_prompt;
    d->example.reasoning = glm_lf_template_reasons(a->template);
    d->example.disable_thinking = d->example.reasoning && !a->enable_thinking;
    if (!a->enable_thinking && !d->example.reasoning)
        glm_info("--enable_thinking false changes nothing without --template glmz1 (the other templates have no thoughts)");
    if (glm_conv_labels_parse(a->conversation_labels, &d->example.conv_labels))
        return glm_fail(err, "--conversation_labels %s is not known (thudm or eos)", a->conversation_labels);
    if (glm_example_cfg_check(&d->example, err)) return -1;
    d->val_size = a->eval_dataset ? 0 : a->val_size;
    if (a->max_train_samples < 0) return glm_fail(err, "--max_train_samples %d: must be 0 (all) or a count", a->max_train_samples);
    d->max_train_samples = a->max_train_samples;
    d->max_samples = a->max_samples;
    if (a->plot_loss)
        glm_info("--plot_loss: no PNG is drawn; the loss is in checkpoint-N/trainer_state.json (and TensorBoard with --report_to tensorboard)");
    d->seed = (uint64_t)a->seed;
    d->num_threads = a->preprocessing_num_workers > 0 ? a->preprocessing_num_workers : a->dataloader_num_workers;
    d->overwrite_cache = a->overwrite_cache;
    if (a->cache_dir) snprintf(t->cache_dir, sizeof t->cache_dir, "%s", a->cache_dir);
    else glm_path_join(t->cache_dir, sizeof t->cache_dir, a->output_dir, ".cache");
    d->cache_dir = t->cache_dir;
    if (load_data_ranked(t, err)) return -1;
    glm_data_print_summary(stderr, &t->data, d);
    print_first_example(stderr, t->tok, t->data.train_ex);
    const glm_examples *ex = t->data.train_ex; /* the examples as trained: file, tokenizer and settings together */
    t->data_hash = glm_xxh64(ex->sup, (size_t)ex->n_tokens, glm_xxh64(ex->ids, (size_t)ex->n_tokens * 4, 0x5eed));
    glm_loader_cfg lc;
    glm_loader_cfg_init(&lc);
    lc.batch_size = a->per_device_train_batch_size;
    lc.group_by_length = a->group_by_length;
    lc.packing = a->packing;
    lc.pairs = glm_train_is_pref(a);
    lc.drop_last = a->dataloader_drop_last;
    lc.shuffle = !a->disable_shuffling;
    int order_seed;
    if (data_seed(a, &order_seed, err)) return -1;
    lc.seed = (uint64_t)order_seed;
    lc.rank = t->dp->rank;
    lc.world = t->dp->world;
    if (lc.packing) lc.max_len = glm_train_seq_len(a);
    if (glm_loader_open(&t->train_ld, &t->data.train, &lc, err)) return -1;
    if (t->data.val.n > 0) {
        glm_loader_cfg ec;
        glm_loader_cfg_init(&ec);
        ec.batch_size = a->per_device_eval_batch_size;
        ec.shuffle = 0;
        ec.no_loss_on_wrap = 1; /* eval counts each example once over the ranks */
        ec.pairs = lc.pairs;
        ec.rank = t->dp->rank;
        ec.world = t->dp->world;
        if (glm_loader_open(&t->eval_ld, &t->data.val, &ec, err)) return -1;
        glm_loader_batch_alloc(t->eval_ld, &t->eval_batch);
    }
    t->micro = glm_calloc(a->gradient_accumulation_steps, sizeof(glm_batch));
    for (int i = 0; i < a->gradient_accumulation_steps; i++) glm_loader_batch_alloc(t->train_ld, &t->micro[i]);
    if (glm_train_is_pref(a)) return trainer_pref_setup(t, err);
    return 0;
}

int trainer_plan_steps(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    t->micro_per_epoch = glm_loader_steps_per_epoch(t->train_ld);
    t->steps_per_epoch = (t->micro_per_epoch + a->gradient_accumulation_steps - 1) / a->gradient_accumulation_steps;
    if (t->steps_per_epoch < 1) t->steps_per_epoch = 1;
    t->total_steps = a->max_steps > 0 ? a->max_steps : (long)ceil(a->num_train_epochs * t->steps_per_epoch);
    t->warmup = a->warmup_steps > 0 ? a->warmup_steps : (long)ceil(a->warmup_ratio * t->total_steps);
    t->log_every = interval_steps(a->logging_steps, t->total_steps);
    t->eval_every = a->eval_steps > 0 ? interval_steps(a->eval_steps, t->total_steps) : t->log_every;
    t->save_every = interval_steps(a->save_steps, t->total_steps);
    if (t->log_every < 1) t->log_every = 1; /* a ratio of a run of no steps */
    if (t->eval_every < 1) t->eval_every = 1;
    if (t->save_every < 1) t->save_every = 1;
    t->sched = (glm_lr_sched){.base_lr = (float)a->learning_rate, .warmup = t->warmup, .total = t->total_steps};
    glm_lr_kind_parse(a->lr_scheduler_type, &t->sched.kind);
    if (glm_lr_kwargs(&t->sched, a->lr_scheduler_kwargs, err)) return -1; /* the warmup of a ratio may round to 0 */
    if (a->ds.sched) { /* a --deepspeed file's scheduler replaces --lr_scheduler_type, as in the Trainer */
        t->sched.kind = (glm_lr_kind)a->ds.sched;
        t->sched.log_warmup = a->ds.log_warmup;
        t->sched.min_lr = a->ds.min_lr;
        t->sched.warmup_min_ratio = a->ds.warmup_min_ratio;
        t->sched.cos_min_ratio = a->ds.cos_min_ratio;
    }
    return glm_ds_check_plan(a, t->dp->world, t->total_steps, t->warmup, err);
}

int trainer_check_output_dir(glm_train_args *a, glm_err *err) {
    if (!glm_is_dir(a->output_dir)) return glm_mkdirs(a->output_dir, err);
    char probe[4096];
    glm_path_join(probe, sizeof probe, a->output_dir, "config.json");
    char latest[4096];
    int has = glm_is_file(probe) || glm_checkpoint_latest(a->output_dir, latest, sizeof latest) == 0;
    if (has && !a->overwrite_output_dir && !a->resume_from_checkpoint && a->do_train) {
        glm_fail(err, "output directory %s already holds a model or checkpoints", a->output_dir);
        return glm_hint(err, "pass --resume_from_checkpoint to continue it, --overwrite_output_dir to start over, or another --output_dir");
    }
    return 0;
}

/* Once per run, on the lead rank (every rank calls trainer_check_output_dir, so it cannot
 * delete): the run's id, then what would make this run trip on another's files. A fresh start
 * with --overwrite_output_dir removes the previous run's checkpoints, which resume and rotation
 * would otherwise take for this run's; tmp-checkpoint-* of a killed save are removed always. */
int trainer_prepare_output_dir(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_run_id_new(t->st.run_id, sizeof t->st.run_id); /* resume replaces it with the checkpoint's */
    if (!lead(t) || !a->do_train) return 0; /* an evaluation alone writes eval_results.json and removes nothing */
    if (a->overwrite_output_dir && a->resume_from_checkpoint)
        glm_info("--overwrite_output_dir with --resume_from_checkpoint: keeping the checkpoints in %s to resume from", a->output_dir);
    else if (a->overwrite_output_dir && glm_checkpoint_remove_all(a->output_dir, err))
        return -1;
    if (!a->resume_from_checkpoint && glm_output_run_id_write(a->output_dir, t->st.run_id, err)) return -1;
    return glm_checkpoint_clean_stale(a->output_dir, err);
}
