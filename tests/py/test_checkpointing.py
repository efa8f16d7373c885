#!/usr/bin/env python3
"""--gradient_checkpointing levels end to end with the tiny GLM of test_train.py (CPU, fp32):
  - selective (the norms, attention and activation rebuilt in backward) and full (each layer's
    forward again) train bit for bit like none: losses of every step and the final weights, for a
    full fine-tune, for LoRA with its dropout (0.05) and for P-Tuning v2 with the prefix dropout
    (0.1), where the recompute must draw the same masks;
  - the memory plan orders the levels none > selective > full (glmtrain info), and for ChatGLM-6B
    W1 selective stays within full's plan + 10%;
  - a full fine-tune refused under 24 GiB is told LoRA with selective checkpointing fits, and on
    the guide's 4 x 24 GB that 4 pipeline stages with 8-bit states and selective checkpointing do;
  - auto picks the least recompute that fits --max_memory_per_gpu: none under a roomy cap,
    selective between the two plans, full under a tight one, and a cap below every level is
    refused naming the layouts that fit;
  - the flag's words: true/false, full, selective, auto; anything else is refused naming them.
Prints PASS/FAIL/SKIP lines."""
import os, re, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train as T
from mpi_runs import losses, report, run, st_read

STEPS = 8


def info_total(args):
    """The whole-model plan in bytes from `glmtrain info` (its stage table, in MiB for a tiny model)."""
    p = subprocess.run([T.GLM, "info"] + args + ["--max_memory_per_gpu", "1TiB"], capture_output=True, text=True, timeout=60)
    m = re.search(r"^  0 +(?:[0-9.]+ +){6}([0-9.]+)$", p.stdout, re.M)
    unit = 1048576.0 if "(MiB)" in p.stdout else 1073741824.0
    if not m:
        raise RuntimeError("no plan in glmtrain info's output:\n" + p.stdout + p.stderr)
    return float(m.group(1)) * unit


def main():
    if not os.path.exists(T.GLM) or not shutil.which("spm_train"):
        print("SKIP checkpointing: glmtrain or spm_train missing")
        return
    d = tempfile.mkdtemp(prefix="glmtrain-ckpt-")
    try:
        cfg, base = T.parallel_setup(d)
        base = base + ["--per_device_train_batch_size", "4", "--save_steps", str(STEPS), "--max_steps", str(STEPS)]

        def go(name, extra, check=True):
            out = os.path.join(d, name)
            return out, run(base + ["--output_dir", out] + extra, check=check)

        # 1. the levels train bit for bit alike
        kinds = [("full", [], "model.safetensors"),
                 ("lora", ["--finetuning_type", "lora", "--lora_rank", "4", "--lora_target", "all"], "adapter_model.safetensors"),
                 ("ptuning", ["--finetuning_type", "ptuning", "--pre_seq_len", "4", "--prefix_projection"], "model.safetensors")]
        for kind, flags, weights_file in kinds:
            outs = {}
            for level in ("false", "selective", "full"):
                outs[level], _ = go("%s_%s" % (kind, level), flags + ["--gradient_checkpointing", level])
            ref_l = losses(outs["false"], STEPS)
            ref_w = st_read(os.path.join(outs["false"], weights_file), others=True)
            for level in ("selective", "full"):
                c = losses(outs[level], STEPS)
                w = st_read(os.path.join(outs[level], weights_file), others=True)
                report("%s_%s_checkpointing_bit_identical" % (kind, level), c == ref_l and len(c) == STEPS and w == ref_w,
                       "%d losses and %s equal (last loss %.6f)" % (len(c), weights_file, c.get(STEPS, float("nan")))
                       if c == ref_l and w == ref_w else "losses %s vs %s; weights %s" % (c, ref_l, "equal" if w == ref_w else "differ"))

        # 2. the plan orders the levels
        shape = ["--init_from_config", cfg, "--per_device_train_batch_size", "4", "--max_source_length", "32",
                 "--max_target_length", "16"]
        plan = {lv: info_total(shape + ["--gradient_checkpointing", lv]) for lv in ("false", "selective", "true")}
        report("plan_orders_levels", plan["false"] > plan["selective"] > plan["true"],
               "none %.0f > selective %.0f > full %.0f bytes" % (plan["false"], plan["selective"], plan["true"]))
        w1 = ["--chatglm6b", "--bf16", "--per_device_train_batch_size", "8", "--max_source_length", "256",
              "--max_target_length", "256"]
        p6 = {lv: info_total(w1 + ["--gradient_checkpointing", lv]) for lv in ("false", "selective", "true")}
        report("plan_w1_selective_within_full_plus_10pct", p6["selective"] <= 1.1 * p6["true"] and p6["selective"] < p6["false"],
               "ChatGLM-6B W1: none %.2f, selective %.2f, full %.2f GiB" % tuple(p6[k] / 2 ** 30 for k in ("false", "selective", "true")))

        # the refusal's hint for one 24 GB card names LoRA with the least recompute that fits
        p = subprocess.run([T.GLM, "info"] + w1 + ["--max_memory_per_gpu", "24GiB"], capture_output=True, text=True, timeout=60)
        hint = [l for l in p.stdout.splitlines() if l.startswith("hint:")]
        report("plan_24gb_hint_lora_selective", bool(hint) and "--finetuning_type lora --gradient_checkpointing selective (plans" in hint[0],
               hint[0][:300] if hint else p.stdout[-300:])

        # the guide's 4 x 24 GB: the hint names 4 stages with 8-bit states and selective checkpointing,
        # and that layout's plan fits
        p = subprocess.run([T.GLM, "info"] + w1 + ["--data_parallel_size", "4", "--zero_stage", "1", "--max_memory_per_gpu", "24GiB"],
                           capture_output=True, text=True, timeout=60)
        hint = [l for l in p.stdout.splitlines() if l.startswith("hint:")]
        named = bool(hint) and "--pipeline_parallel_size 4 --device_map auto --optim adamw_8bit --gradient_checkpointing selective" in hint[0]
        q = subprocess.run([T.GLM, "info"] + w1 + ["--pipeline_parallel_size", "4", "--optim", "adamw_8bit", "--gradient_checkpointing",
                                                    "selective", "--max_memory_per_gpu", "24GiB"], capture_output=True, text=True, timeout=60)
        report("plan_guide_4x24gb_pipeline_8bit_selective", named and "every stage fits in 24GiB" in q.stdout,
               (hint[0][-200:] if hint else p.stdout[-200:]) + " | " + q.stdout.strip().splitlines()[-1])

        # 3. auto under caps: roomy, between none and selective, between selective and full, below full
        def auto(cap):
            out = os.path.join(d, "auto_%d" % cap)
            p = run(base + ["--output_dir", out, "--max_steps", "1", "--gradient_checkpointing", "auto",
                            "--max_memory_per_gpu", str(int(cap))], check=False)
            m = re.search(r"--gradient_checkpointing auto: (\w+)", p.stderr + p.stdout)
            return (m.group(1) if m else None), p

        for cap, want in ((plan["false"] * 2, "none"), ((plan["false"] + plan["selective"]) / 2, "selective"),
                          ((plan["selective"] + plan["true"]) / 2, "full")):
            got, p = auto(cap)
            report("auto_picks_%s" % want, got == want and p.returncode == 0,
                   "cap %d bytes: %s (rc %d)%s" % (cap, got, p.returncode, "" if p.returncode == 0 else " " + p.stderr[-300:]))
        # without a cap on the CPU there is nothing to fit: auto keeps everything
        p = run(base + ["--output_dir", os.path.join(d, "auto_nocap"), "--max_steps", "1", "--gradient_checkpointing", "auto"])
        m = re.search(r"--gradient_checkpointing auto: (\w+) \(plans [0-9.]+ [MG]iB, no memory cap\)", p.stderr + p.stdout)
        report("auto_without_cap_on_cpu_keeps_everything", bool(m) and m.group(1) == "none",
               m.group(0) if m else (p.stderr + p.stdout)[-300:])
        got, p = auto(plan["true"] * 0.9)
        txt = p.stdout + p.stderr
        report("auto_below_every_level_refused", p.returncode != 0 and got == "full" and "--max_memory_per_gpu" in txt
               and "layouts that fit" in txt, txt.strip().splitlines()[-1][:300] if txt.strip() else "")

        # 4. the flag's words
        p = run(base + ["--output_dir", os.path.join(d, "bad"), "--gradient_checkpointing", "partial"], check=False)
        txt = p.stdout + p.stderr
        report("unknown_level_refused", p.returncode != 0 and "partial" in txt and "selective" in txt and "auto" in txt,
               txt.strip().splitlines()[-1][:300] if txt.strip() else "")
        out, _ = go("words", ["--gradient_checkpointing", "selective", "--max_steps", "1"])
        args = open(os.path.join(out, "training_args.json")).read()
        report("training_args_records_level", '"gradient_checkpointing":\t"selective"' in args or
               '"gradient_checkpointing": "selective"' in args, re.search(r'"gradient_checkpointing"[^,\n]*', args).group(0))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
