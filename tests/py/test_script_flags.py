#!/usr/bin/env python3
"""THUDM's ptuning/train.sh flags as written there (ChatGLM-6B's, which the guides copy), on a
tiny model: `--do_train --preprocessing_num_workers 10 --overwrite_cache --predict_with_generate`
and the rest are accepted and mean what they mean there:
  * --overwrite_cache tokenizes again (the cache says rebuilt);
  * --do_eval evaluates the validation set once after training (an eval_loss line, and
    eval_results.json as trainer.save_metrics writes it), and with --predict_with_generate the log says where generation metrics
    come from;
  * --do_predict and --do_train false without --do_eval are refused, naming glmtrain generate --input_file;
  * --report_to all writes TensorBoard, --report_to wandb is refused naming wandb sync;
  * transformers' older names set their flags; its settings that change nothing here are left alone
    with a line, those that would change training (label smoothing, ...) are refused.
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
        for name, extra, want in (("do_predict", ["--do_predict"], "generate --model_name_or_path"),
                                  ("do_train_false", ["--do_train", "false"], "glmtrain generate --input_file")):
            p = subprocess.run([GLM, "train"] + sh + extra, capture_output=True, text=True, timeout=120, env=ENV)
            report("%s_refused" % name, p.returncode != 0 and want in p.stderr, p.stderr[-400:])
        # --report_to: the Trainer's "all" is TensorBoard here; wandb is refused with how to feed it the event files
        p = subprocess.run([GLM, "train"] + sh + ["--report_to", "wandb"], capture_output=True, text=True, timeout=120, env=ENV)
        report("report_to_wandb_names_wandb_sync", p.returncode != 0 and "wandb sync --sync-tensorboard" in p.stderr,
               p.stderr[-300:])
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
