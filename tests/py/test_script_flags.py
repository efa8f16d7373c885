#!/usr/bin/env python3
"""THUDM's ptuning/train.sh flags as written there (ChatGLM-6B's, which the guides copy), on a
tiny model: `--do_train --preprocessing_num_workers 10 --overwrite_cache --predict_with_generate`
and the rest are accepted and mean what they mean there:
  * --overwrite_cache tokenizes again (the cache says rebuilt);
  * --do_eval evaluates the validation set once after training (an eval_loss line, and
    eval_results.json as trainer.save_metrics writes it), and with --predict_with_generate the log says where generation metrics
    come from;
  * --do_predict answers --test_file after training, and alone with evaluate.sh's flags (no
    --do_train, no training data): generated_predictions.txt holds one {"labels", "predict"} line a
    record, the labels the records' answers, predict_results.json BLEU-4 and ROUGE; the answers are
    `glmtrain generate`'s with main.py's trainer.predict settings (top_p 0.7, temperature 0.95,
    max_length 512), the same in both runs; --do_predict without --test_file and --do_train false
    without --do_eval or --do_predict are refused;
  * --report_to all writes TensorBoard, --report_to wandb is refused naming wandb sync;
  * transformers' older names set their flags; its settings that change nothing here are left alone
    with a line, those that would change training (label smoothing, ...) are refused;
  * --eval_on_start evaluates the model before the first step: its eval_loss at step 0 is the one
    `--do_train false --do_eval` gives the same initial model;
  * --data_seed orders the training rows alone: equal to --seed it changes nothing, another value
    changes the losses but not the initial model (the same eval_loss at step 0).
Prints PASS/FAIL/SKIP lines."""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402


def more_trainer_settings(sh):
    """Newer TrainingArguments: left alone at values that change nothing, refused (with what to use) otherwise."""
    quiet = ["--ddp_backend", "nccl", "--torch_empty_cache_steps", "10", "--logging_nan_inf_filter", "true",
             "--use_liger_kernel", "false", "--average_tokens_across_devices", "true", "--label_names", "labels"]
    p = subprocess.run([GLM, "train"] + sh + quiet + ["--max_steps", "1"], capture_output=True, text=True, timeout=120, env=ENV)
    said = [quiet[i][2:] for i in range(0, len(quiet), 2) if ("%s is not used" % quiet[i]) in p.stderr]
    report("newer_trainer_settings_left_alone", p.returncode == 0 and len(said) == len(quiet) // 2, "%s %s" % (said, p.stderr[-300:]))
    # LLaMA-Factory's arguments (its webui's commands): left alone, passed on under glmtrain's names, or refused
    lf = ["--upcast_layernorm", "true", "--print_param_status", "true", "--double_quantization", "true",
          "--mix_strategy", "concat", "--use_apollo", "false", "--freeze_vision_tower", "true",
          "--include_effective_tokens_per_second", "true", "--use_fast_tokenizer", "true", "--low_cpu_mem_usage", "true",
          "--model_max_length", "2048", "--split_special_tokens", "false", "--disable_version_checking", "true"]
    p = subprocess.run([GLM, "train"] + sh + lf + ["--max_steps", "1"], capture_output=True, text=True, timeout=120, env=ENV)
    said = [lf[i][2:] for i in range(0, len(lf), 2) if ("%s is not used" % lf[i]) in p.stderr]
    report("llamafactory_settings_left_alone", p.returncode == 0 and len(said) == len(lf) // 2, "%s %s" % (said, p.stderr[-300:]))
    p = subprocess.run([GLM, "train"] + sh + ["--finetuning_type", "freeze", "--freeze_trainable_layers", "1", "--neat_packing", "true",
                                              "--max_steps", "1"], capture_output=True, text=True, timeout=120, env=ENV)
    report("llamafactory_names_set_flags", p.returncode == 0 and re.search(r'"num_layer_trainable":\s*1,', p.stderr)
           and re.search(r'"packing":\s*true', p.stderr), p.stderr[-300:])
    p = subprocess.run([GLM, "train"] + sh + ["--efficient_packing", "true", "--max_steps", "1"], capture_output=True, text=True,
                       timeout=120, env=ENV)
    report("llamafactory_efficient_packing_is_packing", p.returncode == 0 and re.search(r'"packing":\s*true', p.stderr),
           p.stderr[-300:])
    # freeze_trainable_layers < 0 trains the first layers; freeze_trainable_modules / freeze_extra_modules pick modules
    p = subprocess.run([GLM, "train"] + sh + ["--finetuning_type", "freeze", "--freeze_trainable_layers", "-1",
                                              "--freeze_trainable_modules", "mlp", "--freeze_extra_modules", "final_layernorm",
                                              "--max_steps", "1"], capture_output=True, text=True, timeout=120, env=ENV)
    report("llamafactory_freeze_first_layer_modules", p.returncode == 0 and
           "freeze: layer 0 (mlp) and final_layernorm train" in p.stderr, p.stderr[-300:])
    for name, extra, want in (("additional_target", ["--additional_target", "lm_head"], "modules_to_save"),
                              ("use_dora_without_lora", ["--use_dora", "true"], "DoRA is a form of LoRA"),
                              ("mask_history_without_cutoff_len", ["--mask_history", "true"], "needs --cutoff_len"),
                              ("double_quantization_off", ["--double_quantization", "false"], "always quantizes the blocks' scales"),
                              ("freeze_module_of_another_family", ["--finetuning_type", "freeze", "--freeze_trainable_modules",
                                                                   "self_attention"], "input_layernorm, attention, post_attention_layernorm, mlp"),
                              ("freeze_modules_without_freeze", ["--finetuning_type", "lora", "--freeze_extra_modules",
                                                                 "final_layernorm"], "add --finetuning_type freeze"),
                              ("use_apollo", ["--use_apollo", "true"], "--use_galore, --optim adamw_8bit"),
                              ("new_special_tokens", ["--new_special_tokens", "<tool>"], "keep the model's vocabulary"),
                              ("split_special_tokens", ["--split_special_tokens", "true"], "special tokens whole"),
                              ("eval_on_each_dataset", ["--eval_on_each_dataset", "true"], "one loss"),
                              ("use_llama_pro_with_full", ["--use_llama_pro", "true"], "LLaMA Pro trains the added blocks")):
        p = subprocess.run([GLM, "train"] + sh + extra, capture_output=True, text=True, timeout=120, env=ENV)
        report("llamafactory_setting_refused_%s" % name, p.returncode != 0 and want in p.stderr, p.stderr[-300:])
    for name, extra, want in (("fsdp", ["--fsdp", "full_shard auto_wrap"], "--zero_stage 3"),
                              ("ddp_backend_ccl", ["--ddp_backend", "ccl"], "NCCL between GPUs"),
                              ("average_tokens_false", ["--average_tokens_across_devices", "false"], "whole global batch"),
                              ("debug", ["--debug", "underflow_overflow"], "--max_bad_steps"),
                              ("data_seed_text", ["--data_seed", "4x"], "--data_seed 4x: not a whole number")):
        p = subprocess.run([GLM, "train"] + sh + extra, capture_output=True, text=True, timeout=120, env=ENV)
        report("trainer_setting_refused_%s" % name, p.returncode != 0 and want in p.stderr and "hint:" in p.stderr,
               p.stderr[-300:])


def eval_on_start_and_data_seed(d, tok, cfg, train_file, val_file):
    base = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--validation_file", val_file,
            "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--logging_steps", "1", "--seed", "7",
            "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm", "--max_steps", "3",
            "--save_steps", "3", "--overwrite_output_dir", "--save_final_model", "false"]
    runs = {}
    for name, extra in (("plain", []), ("same", ["--data_seed", "7"]), ("other", ["--data_seed", "9"]),
                        ("noshuf7", ["--disable_shuffling", "true", "--data_seed", "7"]),
                        ("noshuf9", ["--disable_shuffling", "true", "--data_seed", "9"])):
        out = os.path.join(d, "seed_" + name)
        p = subprocess.run([GLM, "train"] + base + ["--output_dir", out, "--eval_on_start"] + extra, capture_output=True,
                           text=True, timeout=300, env=ENV)
        h = T.history(out) if p.returncode == 0 else []
        runs[name] = ([r["eval_loss"] for r in h if "eval_loss" in r and r["step"] == 0], [r["loss"] for r in h if "loss" in r])
        if p.returncode != 0:
            print(p.stderr[-600:])
    # the model before any step, evaluated alone
    out = os.path.join(d, "eval_alone")
    p = subprocess.run([GLM, "train"] + base + ["--output_dir", out, "--do_train", "false", "--do_eval"], capture_output=True,
                       text=True, timeout=120, env=ENV)
    res = os.path.join(out, "eval_results.json")
    alone = json.load(open(res))["eval_loss"] if p.returncode == 0 and os.path.exists(res) else None
    first = runs["plain"][0]
    report("eval_on_start_evaluates_the_initial_model", alone is not None and len(first) == 1
           and abs(first[0] - alone) <= 1e-6 * abs(alone), "step-0 evals %s, alone %s %s" % (first, alone, p.stderr[-300:]))
    report("data_seed_equal_to_seed_changes_nothing", len(runs["plain"][1]) == 3 and runs["same"] == runs["plain"],
           "%s vs %s" % (runs["plain"], runs["same"]))
    report("data_seed_orders_the_rows_alone", len(runs["other"][1]) == 3 and runs["other"][0] == first
           and runs["other"][1][0] != runs["plain"][1][0], "%s vs %s" % (runs["plain"], runs["other"]))
    # LLaMA-Factory's disable_shuffling: the rows in file order, whatever the data seed
    report("disable_shuffling_keeps_file_order", len(runs["noshuf7"][1]) == 3 and runs["noshuf7"] == runs["noshuf9"]
           and runs["noshuf7"][1][0] != runs["plain"][1][0] and runs["noshuf7"][1][0] != runs["other"][1][0],
           "%s vs %s (shuffled %s, %s)" % (runs["noshuf7"], runs["noshuf9"], runs["plain"][1], runs["other"][1]))


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP script_flags: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-flags-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, val_file = T.write_data(d)
        out = os.path.join(d, "out")
        sh = ["--do_train", "--train_file", train_file, "--validation_file", val_file, "--preprocessing_num_workers", "10",
              "--prompt_column", "instruction", "--response_column", "output", "--overwrite_cache",
              "--init_from_config", cfg, "--tokenizer_name", tok, "--output_dir", out, "--overwrite_output_dir",
              "--max_source_length", "64", "--max_target_length", "128", "--per_device_train_batch_size", "1",
              "--per_device_eval_batch_size", "1", "--gradient_accumulation_steps", "16", "--predict_with_generate",
              "--max_steps", "3", "--logging_steps", "1", "--save_steps", "1000", "--learning_rate", "2e-2",
              "--disable_tqdm", "--report_to", "none"]
        p = subprocess.run([GLM, "train"] + sh, capture_output=True, text=True, timeout=300, env=ENV)
        report("thudm_train_sh_flags_run", p.returncode == 0 and "cache rebuilt: --overwrite_cache" in p.stderr,
               p.stderr[-800:])
        p = subprocess.run([GLM, "train"] + sh + ["--do_eval"], capture_output=True, text=True, timeout=300, env=ENV)
        log = p.stdout + p.stderr
        res = os.path.join(out, "eval_results.json")
        ev = json.load(open(res)) if p.returncode == 0 and os.path.exists(res) else {}
        report("do_eval_evaluates_after_training", p.returncode == 0 and log.count("'eval_loss'") == 1 and ev.get("step") == 3
               and ("'eval_loss': %.4f" % ev.get("eval_loss", -1)) in log, log[-800:])
        report("predict_with_generate_says_where_metrics_are", "glmtrain generate" in log and "--predict_with_generate" in log,
               log[-400:])
        # transformers' older names (--evaluation_strategy, --per_gpu_train_batch_size) set the flags they became
        p = subprocess.run([GLM, "train"] + sh + ["--evaluation_strategy", "no", "--per_gpu_train_batch_size", "2",
                                                  "--max_steps", "1"], capture_output=True, text=True, timeout=120, env=ENV)
        report("older_trainer_names_set_their_flags", p.returncode == 0 and re.search(r'"eval_strategy":\s*"no"', p.stderr)
               and re.search(r'"per_device_train_batch_size":\s*2,', p.stderr), p.stderr[-300:])
        # the Trainer's settings that change nothing here are read and left alone, each said once; the ones
        # that would change what trains are refused naming the value
        quiet = ["--remove_unused_columns", "false", "--ddp_find_unused_parameters", "False", "--save_safetensors",
                 "--log_level", "info", "--dataloader_pin_memory", "true", "--torch_compile", "--local_rank=0"]
        p = subprocess.run([GLM, "train"] + sh + quiet + ["--max_steps", "1"], capture_output=True, text=True, timeout=120,
                           env=ENV)
        said = [n for n in ("remove_unused_columns", "ddp_find_unused_parameters", "save_safetensors", "log_level",
                            "dataloader_pin_memory", "torch_compile", "local_rank") if ("--%s is not used" % n) in p.stderr]
        report("trainer_settings_left_alone", p.returncode == 0 and len(said) == 7, "%s %s" % (said, p.stderr[-300:]))
        for name, extra, want in (("label_smoothing", ["--label_smoothing_factor", "0.1"], "label smoothing changes the loss"),
                                  ("push_to_hub", ["--push_to_hub"], "uploads nothing"),
                                  ("save_safetensors_false", ["--save_safetensors", "false"], "writes safetensors"),
                                  ("auto_find_batch_size", ["--auto_find_batch_size", "true"], "memory plan")):
            p = subprocess.run([GLM, "train"] + sh + extra, capture_output=True, text=True, timeout=120, env=ENV)
            report("trainer_setting_refused_%s" % name, p.returncode != 0 and want in p.stderr and "hint:" in p.stderr,
                   p.stderr[-300:])
        for name, extra, want in (("do_predict_without_test_file", ["--do_predict"], "--test_file"),
                                  ("do_train_false", ["--do_train", "false"], "glmtrain generate --input_file")):
            p = subprocess.run([GLM, "train"] + sh + extra, capture_output=True, text=True, timeout=120, env=ENV)
            report("%s_refused" % name, p.returncode != 0 and want in p.stderr, p.stderr[-400:])
        # --do_predict after training, then alone as evaluate.sh runs it on the trained model
        out_p = os.path.join(d, "pred_train")
        args = [x if x != out else out_p for x in sh]
        p = subprocess.run([GLM, "train"] + args + ["--do_predict", "--test_file", val_file], capture_output=True, text=True,
                           timeout=300, env=ENV)
        recs = json.load(open(val_file))

        def preds(folder):
            path = os.path.join(folder, "generated_predictions.txt")
            return [json.loads(x) for x in open(path, encoding="utf-8")] if os.path.exists(path) else []
        got = preds(out_p)
        res = os.path.join(out_p, "predict_results.json")
        metrics = json.load(open(res)) if os.path.exists(res) else {}
        report("do_predict_after_training", p.returncode == 0 and len(got) == len(recs) and
               [g.get("labels") for g in got] == [r["output"] for r in recs] and all(isinstance(g.get("predict"), str) for g in got)
               and {"predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l"} <= set(metrics),
               "%d of %d records, metrics %s: %s" % (len(got), len(recs), sorted(metrics), p.stderr[-600:]))
        ev = ["--do_predict", "--validation_file", val_file, "--test_file", val_file, "--overwrite_cache", "--prompt_column",
              "instruction", "--response_column", "output", "--model_name_or_path", out_p, "--tokenizer_name", tok,
              "--output_dir", os.path.join(d, "pred_alone"), "--overwrite_output_dir", "--max_source_length", "64",
              "--max_target_length", "128", "--per_device_eval_batch_size", "1", "--predict_with_generate"]
        p = subprocess.run([GLM, "train"] + ev, capture_output=True, text=True, timeout=300, env=ENV)
        alone = preds(os.path.join(d, "pred_alone"))
        report("do_predict_alone_as_evaluate_sh", p.returncode == 0 and alone == got and "trained" not in p.stderr,
               "%s vs %s: %s" % (alone[:1], got[:1], p.stderr[-600:]))
        gp = os.path.join(d, "gen.jsonl")
        q = subprocess.run([GLM, "generate", "--model_name_or_path", out_p, "--tokenizer_name", tok, "--input_file", val_file,
                            "--prompt_column", "instruction", "--response_column", "output", "--output_file", gp,
                            "--do_sample", "true", "--top_p", "0.7", "--temperature", "0.95", "--max_length", "512",
                            "--seed", "42", "--max_source_length", "64", "--per_device_eval_batch_size", "1"], capture_output=True, text=True, timeout=300, env=ENV)
        gen = [json.loads(x) for x in open(gp, encoding="utf-8")] if q.returncode == 0 else []
        report("do_predict_is_generate_with_main_py_settings", gen and [g["predict"] for g in gen] == [g["predict"] for g in got],
               "%s vs %s %s" % ([g["predict"] for g in gen][:2], [g["predict"] for g in got][:2], q.stderr[-300:]))
        # --report_to: the Trainer's "all" is TensorBoard here; wandb is refused with how to feed it the event files
        p = subprocess.run([GLM, "train"] + sh + ["--report_to", "wandb"], capture_output=True, text=True, timeout=120, env=ENV)
        report("report_to_wandb_names_wandb_sync", p.returncode != 0 and "wandb sync --sync-tensorboard" in p.stderr,
               p.stderr[-300:])
        more_trainer_settings(sh)
        eval_on_start_and_data_seed(d, tok, cfg, train_file, val_file)
        out_all = os.path.join(d, "all")
        args = [a if a != out else out_all for a in sh]
        p = subprocess.run([GLM, "train"] + args + ["--report_to", "all", "--max_steps", "1"], capture_output=True, text=True,
                           timeout=120, env=ENV)
        runs = os.path.join(out_all, "runs")
        report("report_to_all_writes_tensorboard", p.returncode == 0 and os.path.isdir(runs) and
               any(n.startswith("events.out.tfevents") for n in os.listdir(runs)), p.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
