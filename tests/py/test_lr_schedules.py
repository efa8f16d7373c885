#!/usr/bin/env python3
"""Every --lr_scheduler_type against transformers' get_scheduler (PyPI transformers 4.33.3 beside
Debian's torch): the learning rates glmtrain logs in trainer_state.json over a 12-step run with
warmup equal the LambdaLR's (rel 1e-6, same step indexing as linear's), for linear, cosine,
constant, constant_with_warmup, cosine_with_restarts, polynomial and inverse_sqrt; with
--lr_scheduler_kwargs (transformers' scheduler_specific_kwargs) against the same functions
called with those settings (num_cycles, lr_end and power, timescale), and cosine_with_min_lr
(transformers 4.38+, with min_lr_rate or min_lr) against its lambda written out here when the
installed transformers lacks it; the kwargs from a YAML mapping and a JSON config object equal
the flag's; inverse_sqrt without warmup (transformers divides by zero), reduce_lr_on_plateau
without evaluations (transformers' check; with them it runs as torch's, tests/py/test_load_best.py),
a factor of 1 or more (torch's check), a setting the kind does not take and cosine_with_min_lr
without its floor are refused.
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


# settings runs: (name, --lr_scheduler_type, --lr_scheduler_kwargs)
WITH_KWARGS = [("cosine_cycles", "cosine", {"num_cycles": 0.8}),
               ("cosine_with_restarts_cycles", "cosine_with_restarts", {"num_cycles": 3}),
               ("polynomial_end_power", "polynomial", {"lr_end": 1e-4, "power": 2.0}),
               ("inverse_sqrt_timescale", "inverse_sqrt", {"timescale": 7}),
               ("cosine_with_min_lr_rate", "cosine_with_min_lr", {"min_lr_rate": 0.1}),
               ("cosine_with_min_lr_abs", "cosine_with_min_lr", {"min_lr": 2e-4, "num_cycles": 0.4})]


def min_lr_schedule(opt, kw):
    """transformers' get_cosine_with_min_lr_schedule_with_warmup (4.38+), or its lambda as written
    there (optimization.py) where the installed release lacks it."""
    import math
    import transformers.optimization as O
    from torch.optim.lr_scheduler import LambdaLR
    if hasattr(O, "get_cosine_with_min_lr_schedule_with_warmup"):
        return O.get_cosine_with_min_lr_schedule_with_warmup(opt, WARMUP, STEPS, **kw)
    cycles = kw.get("num_cycles", 0.5)
    rate = kw["min_lr_rate"] if "min_lr_rate" in kw else kw["min_lr"] / opt.defaults["lr"]

    def f(step):
        if step < WARMUP:
            return float(step) / float(max(1, WARMUP))
        progress = float(step - WARMUP) / float(max(1, STEPS - WARMUP))
        factor = 0.5 * (1.0 + math.cos(math.pi * float(cycles) * 2.0 * progress))
        return max(0, factor * (1 - rate) + rate)
    return LambdaLR(opt, f)


def hf_lrs(kind, kw=None):
    """transformers' learning rate for the updates 0..STEPS-1 (kw: the schedule's settings)."""
    import torch
    import transformers.optimization as O
    from transformers import get_scheduler
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    make = {"cosine": O.get_cosine_schedule_with_warmup, "cosine_with_restarts": O.get_cosine_with_hard_restarts_schedule_with_warmup,
            "polynomial": O.get_polynomial_decay_schedule_with_warmup}
    if kind == "cosine_with_min_lr":
        sch = min_lr_schedule(opt, kw)
    elif kw and kind == "inverse_sqrt":
        sch = O.get_inverse_sqrt_schedule(opt, WARMUP, **kw)
    elif kw:
        sch = make[kind](opt, WARMUP, STEPS, **kw)
    else:
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

        def rates(name, args):
            out = os.path.join(d, name)
            p = subprocess.run([GLM, "train", "--output_dir", out] + common + args, capture_output=True, text=True, timeout=300, env=ENV)
            if p.returncode != 0:
                report("lr_%s_equals_transformers" % name, False, p.stderr[-400:])
                return None
            hist = json.load(open(os.path.join(out, "checkpoint-%d" % STEPS, "trainer_state.json")))["log_history"]
            return [r["learning_rate"] for r in hist if "learning_rate" in r]
        for kind in KINDS:
            r = rates(kind, ["--lr_scheduler_type", kind])
            if r is not None:
                got[kind] = r
        for name, kind, kw in WITH_KWARGS:
            r = rates(name, ["--lr_scheduler_type", kind, "--lr_scheduler_kwargs", json.dumps(kw)])
            if r is not None:
                got[name] = r
        # the step glmtrain logs the rate of: found on linear, then held for every schedule
        lin = hf_lrs("linear")
        shift = next((s for s in (0, 1) if len(got.get("linear", [])) == STEPS and
                      all(abs(g - w) <= 1e-6 * max(abs(w), 1e-12) for g, w in zip(got["linear"], (lin[s:] + [0.0])[:STEPS]))), None)
        report("lr_linear_indexing_found", shift is not None, "%s vs %s" % (got.get("linear"), lin))
        for name, kind, kw in [(k, k, None) for k in KINDS] + WITH_KWARGS:
            if name not in got or shift is None:
                continue
            want = (hf_lrs(kind, kw)[shift:] + [None])[:STEPS]
            bad = [(i, g, w) for i, (g, w) in enumerate(zip(got[name], want)) if w is not None and
                   abs(g - w) > 1e-6 * max(abs(w), 1e-9)]
            report("lr_%s_equals_transformers" % name, len(got[name]) == STEPS and not bad, "%s vs %s: %s" % (got[name], want, bad[:3]))
        # the settings from a LLaMA-Factory YAML (a mapping) and a --config JSON file (an object)
        if "cosine_with_min_lr_abs" in got:
            yml, js = os.path.join(d, "kw.yaml"), os.path.join(d, "kw.json")
            open(yml, "w").write("lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs:\n  min_lr: 2.0e-4\n  num_cycles: 0.4\n")
            json.dump({"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr": 2e-4, "num_cycles": 0.4}}, open(js, "w"))
            a, b = rates("kw_yaml", ["--config", yml]), rates("kw_json", ["--config", js])
            report("lr_kwargs_from_yaml_and_json_configs", a == got["cosine_with_min_lr_abs"] == b, "%s / %s / %s" % (
                a, b, got["cosine_with_min_lr_abs"]))
        for name, extra, msg in (("inverse_sqrt_without_warmup", ["--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", "0"], "warmup"),
                                 ("reduce_lr_on_plateau_without_eval", ["--lr_scheduler_type", "reduce_lr_on_plateau"],
                                  "reduce_lr_on_plateau requires an eval strategy"),
                                 ("reduce_lr_on_plateau_factor", ["--lr_scheduler_type", "reduce_lr_on_plateau", "--eval_strategy",
                                                                  "steps", "--lr_scheduler_kwargs", '{"factor": 1.5}'],
                                  "Factor should be < 1.0."),
                                 ("setting_of_another_kind", ["--lr_scheduler_type", "linear", "--lr_scheduler_kwargs",
                                                              '{"num_cycles": 2}'], 'linear does not take "num_cycles"'),
                                 ("min_lr_without_floor", ["--lr_scheduler_type", "cosine_with_min_lr"], "min_lr_rate"),
                                 ("kwargs_not_an_object", ["--lr_scheduler_kwargs", "[1]"], "not a JSON object")):
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
