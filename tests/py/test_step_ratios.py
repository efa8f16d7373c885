#!/usr/bin/env python3
"""--logging_steps, --eval_steps and --save_steps below 1 as ratios of the run's steps, as
Hugging Face's Trainer takes them (transformers >= 4.31): the steps that log, evaluate and save
are those of ceil(ratio x max_steps) (Trainer._inner_training_loop, re-implemented here), and the
settings transformers' TrainingArguments refuses (4.33.3 from PyPI, the oracle of the checks:
2.5 steps, ratios mixed with steps under --load_best_model_at_end, ratios that are not
multiples) are refused, in its words, where the rest train. Prints PASS/FAIL/SKIP lines."""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402


def hf_verdict(kw):
    """None when transformers' TrainingArguments takes the settings, else its message; False when
    transformers cannot be imported here."""
    code = ("import json, sys\nfrom transformers import TrainingArguments\nkw = json.loads(sys.argv[1])\n"
            "try:\n    TrainingArguments(output_dir='/tmp/glm-ratio-hf', **kw)\n    print('OK')\n"
            "except ValueError as e:\n    print('ERR ' + str(e))\n")
    p = subprocess.run(["/usr/bin/python3", "-c", code, json.dumps(kw)], capture_output=True, text=True, timeout=300)
    out = p.stdout.strip().splitlines()
    if p.returncode != 0 or not out:
        return False
    return None if out[-1] == "OK" else out[-1][4:].replace("IntervalStrategy.STEPS", "steps")  # the enum as newer Pythons print it


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP step_ratios: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-ratio-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, val_file = T.write_data(d)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--device", "cpu",
                  "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none", "--max_steps", "10",
                  "--validation_file", val_file]

        def run(name, *flags):
            p = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, name)] + common + list(flags),
                               capture_output=True, text=True, timeout=300, env=ENV)
            p.dir = os.path.join(d, name)
            return p

        steps = lambda ratio, total=10: math.ceil(total * ratio)  # the Trainer's resolution
        p = run("a", "--logging_steps", "0.25", "--save_steps", "0.5", "--eval_strategy", "steps", "--eval_steps", "0.3")
        ok = p.returncode == 0
        hist = json.load(open(os.path.join(p.dir, "checkpoint-10", "trainer_state.json")))["log_history"] if ok else []
        logged = [r["step"] for r in hist if "loss" in r]
        evals = [r["step"] for r in hist if "eval_loss" in r]
        ckpts = sorted(int(n.split("-")[1]) for n in os.listdir(p.dir) if n.startswith("checkpoint-")) if ok else []
        every = lambda k: [s for s in range(1, 11) if s % k == 0]
        report("logging_ratio_logs_every_ceil_ratio_steps", ok and logged == sorted(set(every(steps(0.25)) + [10])),
               "%s %s" % (logged, p.stderr[-300:]))
        report("eval_ratio_evaluates_every_ceil_ratio_steps", evals == every(steps(0.3)), str(evals))
        report("save_ratio_saves_every_ceil_ratio_steps", ckpts == every(steps(0.5)), str(ckpts))
        report("ratios_kept_in_training_args", ok and json.load(open(os.path.join(p.dir, "training_args.json")))
               .get("save_steps") == 0.5)

        cases = [("whole_steps_above_one", {"save_steps": 2.5}, ["--save_steps", "2.5"]),
                 ("ratios_multiple", {"evaluation_strategy": "steps", "eval_steps": 0.2, "save_steps": 0.4,
                                      "load_best_model_at_end": True},
                  ["--eval_strategy", "steps", "--eval_steps", "0.2", "--save_steps", "0.4", "--load_best_model_at_end"]),
                 ("ratios_not_multiple", {"evaluation_strategy": "steps", "eval_steps": 0.3, "save_steps": 0.5,
                                          "load_best_model_at_end": True},
                  ["--eval_strategy", "steps", "--eval_steps", "0.3", "--save_steps", "0.5", "--load_best_model_at_end"]),
                 ("ratio_mixed_with_steps", {"evaluation_strategy": "steps", "eval_steps": 0.2, "save_steps": 4,
                                             "load_best_model_at_end": True},
                  ["--eval_strategy", "steps", "--eval_steps", "0.2", "--save_steps", "4", "--load_best_model_at_end"]),
                 ("steps_not_multiple", {"evaluation_strategy": "steps", "eval_steps": 3, "save_steps": 4,
                                         "load_best_model_at_end": True},
                  ["--eval_strategy", "steps", "--eval_steps", "3", "--save_steps", "4", "--load_best_model_at_end"]),
                 ("save_no_leaves_steps_unchecked", {"save_strategy": "no", "save_steps": 2.5},
                  ["--save_strategy", "no", "--save_steps", "2.5"]),
                 ("logging_zero", {"logging_steps": 0}, ["--logging_steps", "0"])]
        for name, kw, flags in cases:
            hf = hf_verdict(kw)
            if hf is False:
                print("SKIP %s: transformers cannot be imported by /usr/bin/python3" % name)
                continue
            p = run(name, *flags)
            first = hf.split(" for save_steps")[0].split(", but found")[0] if hf else ""
            same = (p.returncode == 0) if hf is None else (p.returncode != 0 and first.rstrip(".") in p.stderr)
            report("same_verdict_as_transformers_" + name, same and "Traceback" not in p.stderr,
                   "transformers: %s | glmtrain rc %d: %s" % (hf, p.returncode, p.stderr[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    from mpi_runs import main_of
    main_of("step_ratios", main)
