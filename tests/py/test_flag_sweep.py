#!/usr/bin/env python3
"""Random combinations of every flag of `train`, `generate` and `info` (three flags a run, each at
an odd value: 0, -1, 2^31, nan, inf, "", "THUDM/chatglm-6b", a malformed JSON ...) on a tiny model,
seeded, so a run is the same each time: no run may crash (a signal, a sanitizer or an assertion),
fail without an "error:" line, or write bytes that are not UTF-8 to stderr or stdout. Each flag's
own refusals are tested where the flag is; this sweeps their combinations (a first sweep of 150
train runs found the first example printed with a character cut by truncation, not UTF-8; the
regression test for it is test_bad_input's). Prints PASS/FAIL/SKIP lines."""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402

VALUES = {" N": ["0", "-1", "1", "2", "3", "100000000000", "2147483648", "7", "-2147483648"],
          " X": ["0", "-1", "1e-3", "nan", "inf", "1e308", "0.5", "2", "-0"],
          " TEXT": ["", "x", "a,b", "auto", "none", "THUDM/chatglm-6b", "../", "all", "lora", "true", "epoch", "steps", "cpu"],
          " JSON": ["{}", "{\"num_cycles\": -1}", "[]", "{\"min_lr\": \"x\"}", "{"], "": ["true", "false", None]}
# flags that start other processes, wait or write outside the run's folder: not swept
SKIP = {"output_dir", "overwrite_output_dir", "init_from_config", "tokenizer_name", "train_file", "nproc_per_node", "nnodes",
        "master_addr", "master_port", "node_rank", "max_train_seconds", "num_train_epochs", "max_steps", "config",
        "deepspeed", "save_on_interrupt", "do_predict", "test_file", "model_name_or_path", "input_file", "output_file",
        "metrics_file", "device_map", "pipeline_parallel_size", "device", "cache_dir", "logging_dir"}


def sweep(cmd, base, runs, seed):
    p = subprocess.run([GLM, cmd, "--help"], capture_output=True, text=True, timeout=30)
    flags = [f for f in re.findall(r"^  --(\w+)( TEXT| N| X| JSON)?", p.stdout + p.stderr, re.M) if f[0] not in SKIP]
    rng = random.Random(seed)
    bad = []
    for _ in range(runs):
        extra = []
        for name, kind in rng.sample(flags, 3):
            v = rng.choice(VALUES[kind or ""])
            extra += ["--" + name] + ([v] if v is not None else [])
        try:
            p = subprocess.run([GLM, cmd] + base + extra, capture_output=True, timeout=120, env=ENV)
        except subprocess.TimeoutExpired:
            bad.append("timeout: " + " ".join(extra))
            continue
        try:
            err = p.stderr.decode("utf-8")
            p.stdout.decode("utf-8")
        except UnicodeDecodeError:
            bad.append("not UTF-8: " + " ".join(extra))
            continue
        if p.returncode < 0 or p.returncode > 2 or "Sanitizer" in err or "Assertion" in err:
            bad.append("rc %d: %s | %s" % (p.returncode, " ".join(extra), err[-200:]))
        elif p.returncode != 0 and "error:" not in err:
            bad.append("no error line: %s | %s" % (" ".join(extra), err[-200:]))
    report("flag_sweep_%s" % cmd, not bad, "; ".join(bad[:3]) + (" (+%d more)" % (len(bad) - 3) if len(bad) > 3 else ""))


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP flag_sweep: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-sweep-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, _ = T.write_data(d)
        out = os.path.join(d, "out")
        tb = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--output_dir", out,
              "--overwrite_output_dir", "--max_steps", "2", "--per_device_train_batch_size", "2", "--max_source_length", "16",
              "--max_target_length", "8", "--disable_tqdm", "--save_strategy", "no"]
        model = os.path.join(d, "model")
        p = subprocess.run([GLM, "train"] + [a if a != out else model for a in tb], capture_output=True, text=True, timeout=120, env=ENV)
        if p.returncode:
            report("flag_sweep_setup", False, p.stderr[-400:])
            return 0
        sweep("train", tb, 80, 1)
        sweep("generate", ["--model_name_or_path", model, "--prompt", "春风", "--max_new_tokens", "4", "--device", "cpu"], 50, 2)
        sweep("info", ["--model_name_or_path", model], 40, 3)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
