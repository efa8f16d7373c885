#!/usr/bin/env python3
"""--deepspeed FILE against the code that reads such files for the guide's users:
- which values differ from the training flags: the same keys as transformers' own
  HfTrainerDeepSpeedConfig (trainer_config_process + trainer_config_finalize) lists, for values
  known at once and for those known with the plan (steps, warmup, ranks); "auto" everywhere runs;
- the loss scaler of an fp16 section: DeepSpeed's DynamicLossScaler on the same overflow patterns
  (window, hysteresis, consecutive hysteresis, the minimum scale where DeepSpeed raises);
- WarmupLR / WarmupDecayLR / WarmupCosineLR: DeepSpeed's classes, over a grid (tool_schedules)
  and as a training run logs them;
- the files people have (THUDM ptuning's deepspeed.json, LLaMA-Factory's ds_z3_offload_config,
  ChatGLM3 finetune_demo's ds_zero_3 through a finetune_demo config) set --zero_stage and
  --offload_optimizer as they say;
- an optimizer section decays every tensor (DeepSpeed's one parameter group): a LayerNorm weight
  after one update differs from the flags' run by exactly lr * weight_decay * w;
- what glmtrain cannot do as asked is refused naming the key.
DeepSpeed 0.12.6 lives in its own folder (scripts/install-deps.sh); transformers 4.33.3 needs it
importable for its config class. Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402

DS_DIR = os.environ.get("GLM_DEEPSPEED_DIR", "/usr/local/lib/glmtrain-deepspeed")
TOOL = os.path.abspath(os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_schedules"))
GLMA = os.path.abspath(GLM)  # the runs start in their own folder (a relative --deepspeed path as users give it)
STEPS, WARMUP, LR, BS = 12, 3, 1e-3, 4


def deepspeed_modules():
    """DeepSpeed's loss scaler and schedulers, and transformers' config class, or None."""
    if not os.path.isdir(DS_DIR):
        return None
    sys.path.insert(0, DS_DIR)
    try:
        from deepspeed.runtime import lr_schedules
        from deepspeed.runtime.fp16 import loss_scaler
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
    except Exception as e:  # noqa: BLE001
        print("deepspeed import: %r" % e)
        return None
    loss_scaler.dist.get_rank = lambda: 0  # its log line asks the process group, which no run here has
    import logging
    from deepspeed.utils import logger
    logger.setLevel(logging.WARNING)  # a line an overflow otherwise
    return types.SimpleNamespace(lr=lr_schedules, scaler=loss_scaler, hf=HfTrainerDeepSpeedConfig)


def hf_mismatches(ds, cfg, world=1, bs=BS, gas=1, steps=STEPS, warmup=WARMUP, fp16=False, bf16=False):
    """The keys transformers finds differing, for a run with glmtrain's defaults and these flags."""
    args = types.SimpleNamespace(world_size=world, per_device_train_batch_size=bs, gradient_accumulation_steps=gas,
                                 max_grad_norm=1.0, learning_rate=LR, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                                 weight_decay=0.0, fp16=fp16, fp16_full_eval=False, fp16_backend="auto",
                                 save_on_each_node=False, fp16_opt_level="O1", bf16=bf16, bf16_full_eval=False)
    args.get_warmup_steps = lambda n: warmup
    c = ds.hf(json.loads(json.dumps(cfg)))
    c.trainer_config_process(args)
    try:
        c.trainer_config_finalize(args, types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=64)), steps)
    except ValueError as e:
        return sorted(re.findall(r"^- ds (\S+?)=", str(e), re.M))
    return []


def glm_keys(stderr):
    return sorted(re.findall(r"^- ds (\S+?)=", stderr, re.M))


class Run:
    def __init__(self, d):
        self.d = d
        self.tok, self.cfg = T.tiny_model(d)
        self.train, _ = T.write_data(d)
        self.n = 0

    def __call__(self, ds_cfg, *extra, steps=STEPS, check=False):
        self.n += 1
        out = os.path.join(self.d, "run%d" % self.n)
        args = [GLMA, "train", "--init_from_config", self.cfg, "--tokenizer_name", self.tok, "--train_file", self.train,
                "--output_dir", out, "--max_steps", str(steps), "--warmup_steps", str(WARMUP), "--learning_rate", str(LR),
                "--logging_steps", "1", "--save_steps", str(steps), "--per_device_train_batch_size", str(BS),
                "--disable_tqdm", "--report_to", "none", "--seed", "7", "--device", "cpu"]
        if ds_cfg is not None:
            path = ds_cfg if isinstance(ds_cfg, str) else os.path.join(self.d, "ds%d.json" % self.n)
            if not isinstance(ds_cfg, str):
                json.dump(ds_cfg, open(path, "w"), indent=2)
            args += ["--deepspeed", path]
        p = subprocess.run(args + list(extra), capture_output=True, text=True, timeout=300, env=ENV, cwd=self.d)
        p.out = out
        return p


def lrs_logged(out, steps=STEPS):
    hist = json.load(open(os.path.join(out, "checkpoint-%d" % steps, "trainer_state.json")))["log_history"]
    return [r["learning_rate"] for r in hist if "learning_rate" in r]


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(b), 1e-9)


def ds_rate(ds, kind, it, base, warmup, total, warmup_type, min_lr=0.0, wmin=0.0, cmin=1e-4):
    import torch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    if kind == "WarmupLR":
        s = ds.lr.WarmupLR(opt, warmup_min_lr=min_lr, warmup_max_lr=base, warmup_num_steps=warmup, warmup_type=warmup_type)
    elif kind == "WarmupDecayLR":
        s = ds.lr.WarmupDecayLR(opt, total, warmup_min_lr=min_lr, warmup_max_lr=base, warmup_num_steps=warmup,
                                warmup_type=warmup_type)
    else:
        s = ds.lr.WarmupCosineLR(opt, total, warmup_min_ratio=wmin, warmup_num_steps=warmup, cos_min_ratio=cmin,
                                 warmup_type=warmup_type)
    s.last_batch_iteration = it
    return s.get_lr()[0]


def scaler_cases(ds):
    rng = random.Random(5)
    bad = []
    cases = [("ds", 2.0 ** 16, 1000, 2, 0, 1.0), ("ds", 8.0, 3, 2, 0, 1.0), ("ds", 8.0, 4, 3, 1, 1.0),
             ("ds", 64.0, 5, 1, 0, 2.0), ("ds", 2.0 ** 20, 7, 4, 0, 0.25)]
    for mode, init, window, hyst, consec, mn in cases:
        for p in (0.05, 0.3, 0.6):
            flags = "".join("1" if rng.random() < p else "0" for _ in range(300))
            out = subprocess.run([TOOL, "scaler", mode, repr(init), str(window), str(hyst), str(consec), repr(mn), flags],
                                 capture_output=True, text=True, timeout=30).stdout.split("\n")
            got = [tuple(float(x) for x in line.split()) for line in out if line]
            s = ds.scaler.DynamicLossScaler(init_scale=init, scale_window=window, min_scale=mn, delayed_shift=hyst,
                                            consecutive_hysteresis=bool(consec))
            want = []
            for f in flags:
                try:
                    s.update_scale(f == "1")
                    want.append((1.0 if f == "1" else 0.0, float(s.cur_scale)))
                except Exception:  # noqa: BLE001 (DeepSpeed raises a bare Exception at the minimum scale)
                    want.append((-1.0, float(s.cur_scale)))
                    break
            if got != want:
                i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
                bad.append((init, window, hyst, consec, mn, p, i, got[i:i + 2], want[i:i + 2]))
    return bad


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train") or not os.path.exists(TOOL):
        print("SKIP deepspeed_config: glmtrain, tool_schedules or spm_train missing")
        return 0
    ds = deepspeed_modules()
    if ds is None:
        print("SKIP deepspeed_config: DeepSpeed 0.12.6 is not installed in %s (scripts/install-deps.sh)" % DS_DIR)
        return 0
    bad = scaler_cases(ds)
    report("fp16_scaler_equals_deepspeed_dynamic_loss_scaler", not bad, str(bad[:2]))

    grid_bad = []
    for kind in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        for wt in ("log", "linear"):
            for warmup, total, mn, wmin, cmin in ((0, 20, 0.0, 0.0, 1e-4), (1, 9, 1e-5, 0.1, 0.0), (5, 40, 2e-4, 0.3, 0.05),
                                                  (10, 12, 0.0, 0.0, 1e-4)):
                out = subprocess.run([TOOL, "lr", kind, "0.002", str(warmup), str(total), str(int(wt == "log")), repr(mn),
                                      repr(wmin), repr(cmin), str(total + 3)], capture_output=True, text=True, timeout=30)
                got = [float(x) for x in out.stdout.split()]
                want = [ds_rate(ds, kind, u, 0.002, warmup, total, wt, mn, wmin, cmin) for u in range(total + 3)]
                if len(got) != len(want) or not all(close(g, w, 1e-6) for g, w in zip(got, want)):
                    grid_bad.append((kind, wt, warmup, total, got[:6], want[:6]))
    report("ds_schedulers_equal_deepspeed_over_a_grid", not grid_bad, str(grid_bad[:2]))

    d = tempfile.mkdtemp(prefix="glmtrain-ds-")
    try:
        run = Run(d)
        # the rate of each update in a run: glmtrain logs one rate a step, at the index its own
        # --lr_scheduler_type linear run shows against transformers' (test_lr_schedules.py)
        p = run(None, "--lr_scheduler_type", "linear")
        lin = lrs_logged(p.out) if p.returncode == 0 else []
        shift = next((s for s in (0, 1) if len(lin) == STEPS and all(
            close(g, w) for g, w in zip(lin, [LR * min(u / WARMUP, (STEPS - u) / (STEPS - WARMUP)) for u in range(s, s + STEPS)]))),
            None)
        report("ds_run_indexing_found", shift is not None, str(lin) + p.stderr[-300:])
        for kind, wt, extra in (("WarmupLR", "log", {}), ("WarmupDecayLR", "linear", {"warmup_min_lr": 1e-4}),
                                ("WarmupCosineLR", "log", {"warmup_min_ratio": 0.2, "cos_min_ratio": 0.01})):
            params = dict({"warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_type": wt}, **extra)
            if kind != "WarmupCosineLR":
                params.update(warmup_min_lr=extra.get("warmup_min_lr", "auto"), warmup_max_lr="auto")
            p = run({"train_micro_batch_size_per_gpu": "auto", "scheduler": {"type": kind, "params": params}},
                    "--lr_scheduler_type", "cosine")
            got = lrs_logged(p.out) if p.returncode == 0 else []
            want = [ds_rate(ds, kind, u, LR, WARMUP, STEPS, wt, extra.get("warmup_min_lr", 0.0), extra.get("warmup_min_ratio", 0.0),
                            extra.get("cos_min_ratio", 1e-4)) for u in range((shift or 0), (shift or 0) + STEPS)]
            report("ds_run_%s_%s_rates_equal_deepspeed" % (kind, wt), shift is not None and len(got) == STEPS and
                   all(close(g, w) for g, w in zip(got, want)) and "--lr_scheduler_type cosine is not used" in p.stderr,
                   "%s vs %s %s" % (got, want, p.stderr[-300:]))

        # values that differ from the flags: the keys transformers lists, known at once ...
        first = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": "auto", "weight_decay": 0.1}},
                 "fp16": {"enabled": True}, "bf16": {"enabled": "auto"}}
        p = run(first)
        want = hf_mismatches(ds, first)
        report("mismatches_named_as_transformers", p.returncode != 0 and want and glm_keys(p.stderr) == want and
               "set them to \"auto\"" in p.stderr, "%s vs %s: %s" % (glm_keys(p.stderr), want, p.stderr[-600:]))
        # ... and with the plan (steps, warmup, ranks)
        second = {"train_batch_size": 99, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100,
                                                                                             "warmup_num_steps": 5}}}
        p = run(second)
        want = hf_mismatches(ds, second)
        report("plan_mismatches_named_as_transformers", p.returncode != 0 and want and glm_keys(p.stderr) == want,
               "%s vs %s: %s" % (glm_keys(p.stderr), want, p.stderr[-600:]))
        agree = {"train_micro_batch_size_per_gpu": BS, "gradient_accumulation_steps": 1, "train_batch_size": BS,
                 "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999],
                                                                                        "eps": 1e-8, "weight_decay": 0}},
                 "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": LR, "warmup_num_steps": WARMUP}}}
        p = run(agree)
        report("values_equal_to_the_flags_run", p.returncode == 0 and hf_mismatches(ds, agree) == [], p.stderr[-400:])

        # the files people have
        thudm = {"train_micro_batch_size_per_gpu": "auto", "zero_allow_untested_optimizer": True,
                 "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1},
                 "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                                       "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                                       "contiguous_gradients": True}}
        p = run(thudm, steps=2)
        ta = json.load(open(os.path.join(p.out, "training_args.json"))) if p.returncode == 0 else {}
        report("thudm_ptuning_deepspeed_json_sets_zero_2", ta.get("zero_stage") == 2 and "overlap_comm" in p.stderr and
               "left alone" in p.stderr, p.stderr[-500:])
        lf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
              "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                       "hysteresis": 2, "min_loss_scale": 1}, "bf16": {"enabled": "auto"},
              "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                                    "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                                    "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                                    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                                    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                                    "stage3_gather_16bit_weights_on_model_save": True}}
        p = run(lf, steps=2)
        m = re.search(r'"zero_stage":\s*(\d+)', p.stderr)
        o = re.search(r'"offload_optimizer":\s*"(\w+)"', p.stderr)
        report("llama_factory_z3_offload_sets_zero_3_and_offload", m and m.group(1) == "3" and o and o.group(1) == "cpu" and
               "offload_param.device cpu" in p.stderr, p.stderr[-600:])
        # a finetune_demo config naming its DeepSpeed file in training_args
        json.dump({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}},
                  open(os.path.join(d, "ds_zero_2.json"), "w"))
        yml = os.path.join(d, "lora.yaml")
        open(yml, "w").write("data_config:\n  train_file: %s\nmax_input_length: 64\nmax_output_length: 32\n"
                             "training_args:\n  output_dir: %s\n  max_steps: 2\n  per_device_train_batch_size: 4\n"
                             "  deepspeed: ds_zero_2.json\n  save_strategy: 'no'\n  report_to: none\n"
                             % (run.train, os.path.join(d, "demo")))
        p = subprocess.run([GLMA, "train", "--config", yml, "--init_from_config", run.cfg, "--tokenizer_name", run.tok,
                            "--device", "cpu", "--disable_tqdm"], capture_output=True, text=True, timeout=300, env=ENV, cwd=d)
        m = re.search(r'"zero_stage":\s*(\d+)', p.stderr)
        report("finetune_demo_config_deepspeed_file_applied", p.returncode == 0 and m and m.group(1) == "2", p.stderr[-500:])

        # an optimizer section: DeepSpeed's one parameter group, so a LayerNorm weight decays too
        wd = 0.1  # one update at a constant rate: AdamW's step is the same in both runs but for the decay
        a = run({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}, "--weight_decay", str(wd),
                "--max_grad_norm", "0", "--warmup_steps", "0", "--lr_scheduler_type", "constant", "--learning_rate", "1e-2", steps=1)
        b = run(None, "--weight_decay", str(wd), "--max_grad_norm", "0", "--warmup_steps", "0", "--lr_scheduler_type", "constant",
                "--learning_rate", "1e-2", steps=1)
        if a.returncode == 0 and b.returncode == 0:
            import numpy as np
            from safetensors.numpy import load_file
            wa = load_file(os.path.join(a.out, "checkpoint-1", "model.safetensors"))
            wb = load_file(os.path.join(b.out, "checkpoint-1", "model.safetensors"))
            ln = [k for k in wa if k.endswith("input_layernorm.weight")][0]
            mat = [k for k in wa if k.endswith("dense_h_to_4h.weight")][0]
            # b: w1 = w0 - lr*u (no decay on norms); a: w1 = w0 - lr*wd*w0 - lr*u, so a - b = -lr*wd*w0, where
            # w0 = 1 (a LayerNorm weight as initialised)
            diff = wa[ln].astype(np.float64) - wb[ln].astype(np.float64)
            want = np.full_like(diff, -1e-2 * wd)
            ok = np.allclose(diff, want, rtol=1e-3, atol=3e-7)  # 3e-7: a few float ulps of weights near 1 and np.array_equal(wa[mat], wb[mat])
            why = "max |diff - want| %g, matrices equal %s" % (float(np.abs(diff - want).max()), np.array_equal(wa[mat], wb[mat]))
        else:
            ok, why = False, a.stderr[-300:] + b.stderr[-300:]
        report("optimizer_section_decays_every_tensor", ok, why)

        # glmtrain info: the file's stage and offload enter the memory plan as the flags would
        z3 = os.path.join(d, "z3off.json")
        json.dump({"bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
                   "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}, open(z3, "w"))
        info = [GLMA, "info", "--chatglm6b", "--bf16", "--data_parallel_size", "4", "--per_device_train_batch_size", "4",
                "--max_memory_per_gpu", "24GiB"]
        p1 = subprocess.run(info + ["--deepspeed", z3], capture_output=True, text=True, timeout=60, env=ENV)
        p2 = subprocess.run(info + ["--zero_stage", "3", "--offload_optimizer", "cpu"], capture_output=True, text=True,
                            timeout=60, env=ENV)
        plan1 = p1.stdout[p1.stdout.find("model:"):]
        report("info_plan_with_the_file_equals_the_flags", p1.returncode == 0 and plan1 and plan1 == p2.stdout[p2.stdout.find("model:"):]
               and "ZeRO stage 3, optimizer offloaded" in p1.stdout and "note:" in p1.stdout and "host memory" in plan1,
               p1.stdout[-600:] + p1.stderr[-300:])

        # refused, naming the key
        for name, cfg, extra, msg in (
                ("nvme_offload", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}, [],
                 "offload_optimizer.device nvme"),
                ("lamb", {"optimizer": {"type": "Lamb", "params": {}}}, [], "optimizer.type Lamb"),
                ("adam_l2", {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, [], "adam_w_mode false"),
                ("onecycle", {"scheduler": {"type": "OneCycle", "params": {}}}, [], "scheduler.type OneCycle"),
                ("apex_amp", {"amp": {"enabled": True}}, [], "amp.enabled true"),
                ("typo", {"zero_optimisation": {"stage": 3}}, [], "zero_optimisation is not a DeepSpeed setting"),
                ("curriculum", {"curriculum_learning": {"enabled": True}}, [], "curriculum_learning changes what"),
                ("fp16_without_section", {"zero_optimization": {"stage": 1}}, ["--fp16"], "has no fp16 section"),
                ("static_loss_scale", {"fp16": {"enabled": "auto", "loss_scale": 128}}, ["--fp16"], "fp16.loss_scale 128"),
                ("stage_twice", {"zero_optimization": {"stage": 2}}, ["--zero_stage", "3"], "--zero_stage 3"),
                ("optim_twice", {"optimizer": {"type": "AdamW"}}, ["--optim", "adamw_8bit"], "replaces --optim adamw_8bit"),
                ("cosine_too_short", {"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": "auto"}}},
                 ["--warmup_steps", str(STEPS)], "WarmupCosineLR needs more steps"),
                ("huge_batch", {"train_batch_size": 2.6e98}, [], "train_batch_size must be a whole number below 2^31"),
                ("missing_file", os.path.join(d, "nope.json"), [], "nope.json")):
            p = run(cfg, *extra)
            report("refused_%s" % name, p.returncode != 0 and msg in p.stderr and "hint:" in p.stderr,
                   p.stderr[-400:])
        bad_json = os.path.join(d, "broken.json")
        open(bad_json, "w").write('{\n  "zero_optimization": {\n    "stage": 2,\n  }\n}\n')
        p = run(bad_json)
        report("refused_json_syntax_names_line", p.returncode != 0 and "broken.json:4:" in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
