#!/usr/bin/env python3
"""Every --lr_scheduler_type against transformers' get_scheduler (PyPI transformers 4.33.3 beside
Debian's torch): the learning rates glmtrain logs in trainer_state.json over a 12-step run with
warmup equal the LambdaLR's (rel 1e-6, same step indexing as linear's), for linear, cosine,
constant, constant_with_warmup, cosine_with_restarts, polynomial and inverse_sqrt; inverse_sqrt
without warmup (transformers divides by zero) and reduce_lr_on_plateau are refused.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402

KINDS = ["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial", "inverse_sqrt"]
STEPS, WARMUP, LR = 12, 3, 1e-3


def hf_lrs(kind):
    """transformers' learning rate for the updates 0..STEPS-1."""
    import torch
    from transformers import get_scheduler
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sch = get_scheduler(kind, opt, num_warmup_steps=WARMUP, num_training_steps=STEPS)
    out = []
    for _ in range(STEPS):
        out.append(sch.get_last_lr()[0])
        opt.step()
        sch.step()
    return out


def main():
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP lr_schedules: transformers is not installed (scripts/install-deps.sh)")
        return 0
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP lr_schedules: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-lr-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, _ = T.write_data(d)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--max_steps", str(STEPS),
                  "--warmup_steps", str(WARMUP), "--learning_rate", str(LR), "--logging_steps", "1", "--save_steps", str(STEPS),
                  "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none", "--seed", "7"]
        got = {}
        for kind in KINDS:
            out = os.path.join(d, kind)
            p = subprocess.run([GLM, "train", "--lr_scheduler_type", kind, "--output_dir", out] + common,
                               capture_output=True, text=True, timeout=300, env=ENV)
            if p.returncode != 0:
                report("lr_%s_equals_transformers" % kind, False, p.stderr[-400:])
                continue
            hist = json.load(open(os.path.join(out, "checkpoint-%d" % STEPS, "trainer_state.json")))["log_history"]
            got[kind] = [r["learning_rate"] for r in hist if "learning_rate" in r]
        # the step glmtrain logs the rate of: found on linear, then held for every schedule
        lin = hf_lrs("linear")
        shift = next((s for s in (0, 1) if len(got.get("linear", [])) == STEPS and
                      all(abs(g - w) <= 1e-6 * max(abs(w), 1e-12) for g, w in zip(got["linear"], (lin[s:] + [0.0])[:STEPS]))), None)
        report("lr_linear_indexing_found", shift is not None, "%s vs %s" % (got.get("linear"), lin))
        for kind in KINDS:
            if kind not in got or shift is None:
                continue
            want = (hf_lrs(kind)[shift:] + [None])[:STEPS]
            bad = [(i, g, w) for i, (g, w) in enumerate(zip(got[kind], want)) if w is not None and
                   abs(g - w) > 1e-6 * max(abs(w), 1e-9)]
            report("lr_%s_equals_transformers" % kind, len(got[kind]) == STEPS and not bad, "%s vs %s: %s" % (got[kind], want, bad[:3]))
        for name, extra, msg in (("inverse_sqrt_without_warmup", ["--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", "0"], "warmup"),
                                 ("reduce_lr_on_plateau", ["--lr_scheduler_type", "reduce_lr_on_plateau"], "lr_scheduler_type")):
            args = [a for a in common]
            i = args.index("--warmup_steps")
            del args[i:i + 2]
            p = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, "bad")] + args + extra, capture_output=True,
                               text=True, timeout=120, env=ENV)
            report("lr_%s_refused" % name, p.returncode != 0 and msg in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
