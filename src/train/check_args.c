/* The training flags checked together before anything is loaded (train/train.h
 * glm_train_check_args): each range, combination and strategy as transformers' TrainingArguments
 * and LLaMA-Factory check them, in their words where they have them. */
#include "train/trainer.h"
#include <math.h>
#include <string.h>
#include "optim/adamw.h"
#include "optim/schedule.h"
#include "train/pref.h"

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

/* What evaluations drive: the best checkpoint (--load_best_model_at_end, --save_strategy best),
 * reduce_lr_on_plateau and early stopping; transformers' checks of them, in its words. */
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
    if (trainer_data_seed(a, &order_seed, err)) return -1;
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
