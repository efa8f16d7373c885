#!/usr/bin/env python3
"""The disk plan said before the first step: the size of each checkpoint (full, LoRA, P-Tuning,
--save_only_model) and of the final model, within 10% of the folders the run then writes, and a
warning naming --save_total_limit and --save_only_model when the checkpoints kept at once and the
final model do not fit in what output_dir's disk has free (a tmpfs of a set size; root only).
Prints PASS/FAIL/SKIP lines."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402

UNIT = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def plan(stderr):
    """(checkpoint bytes, final bytes, checkpoints ahead, at most at once) from the disk line."""
    m = re.search(r"disk: (\d+) checkpoints? ahead of about ([\d.]+) (kB|MB|GB) each .*?at most (\d+) at once.*?"
                  r"the final model about ([\d.]+) (kB|MB|GB)", stderr)
    if not m:
        return None
    return (float(m.group(2)) * UNIT[m.group(3)], float(m.group(5)) * UNIT[m.group(6)], int(m.group(1)), int(m.group(4)))


def near(est, real):
    return real > 0 and abs(est - real) <= 0.1 * real


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP disk_plan: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-disk-")
    mnt = os.path.join(d, "small")
    mounted = False
    try:
        tok, cfg = T.tiny_model(d)
        train_file, _ = T.write_data(d)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--device", "cpu",
                  "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none", "--max_steps", "4",
                  "--save_steps", "2"]

        def run(out, *flags):
            p = subprocess.run([GLM, "train", "--output_dir", out] + common + list(flags), capture_output=True, text=True,
                               timeout=300, env=ENV)
            p.dir = out
            return p

        def final_files(out):  # what the final save wrote: everything in output_dir but the run's other folders
            return sum(size(os.path.join(out, n)) for n in os.listdir(out)
                       if not n.startswith("checkpoint-") and n not in ("runs", ".cache", "run_id.txt", "logs"))

        for name, flags in (("full", []), ("full_bf16_dtype", ["--save_dtype", "bfloat16"]),
                            ("lora", ["--finetuning_type", "lora"]),
                            ("ptuning", ["--finetuning_type", "ptuning", "--pre_seq_len", "4"]),
                            ("freeze", ["--finetuning_type", "freeze", "--num_layer_trainable", "1"]),
                            ("model_only", ["--save_only_model", "true"]),
                            ("lora_model_only", ["--finetuning_type", "lora", "--save_only_model", "true"])):
            p = run(os.path.join(d, name), *flags)
            pl = plan(p.stderr)
            ok = p.returncode == 0 and pl is not None
            real_ck = size(os.path.join(p.dir, "checkpoint-4")) if ok else 0
            real_final = final_files(p.dir) if ok else 0
            report("%s_estimates_within_10_percent" % name, ok and near(pl[0], real_ck) and near(pl[1], real_final) and
                   pl[2] == 2 and pl[3] == 2, "plan %s, checkpoint %d, final %d %s" % (pl, real_ck, real_final, p.stderr[-200:]))

        # glmtrain info: ChatGLM-6B's sizes from its parameter counts (bf16: fp32 weights, master and two moments)
        for flags, per, what in ((["--bf16"], 16, "full"), (["--bf16", "--finetuning_type", "lora"], 16, "lora"),
                                 ([], 12, "full_fp32")):
            q = subprocess.run([GLM, "info", "--chatglm6b"] + flags, capture_output=True, text=True, timeout=60)
            n = re.search(r"([\d.]+)B parameters", q.stdout)
            tr = re.search(r"([\d.]+)M trainable parameters", q.stdout)
            ck = re.search(r"disk: a checkpoint about ([\d.]+) (kB|MB|GB)", q.stdout)
            params = float(tr.group(1)) * 1e6 if tr else float(n.group(1)) * 1e9 if n else 0
            est = float(ck.group(1)) * UNIT[ck.group(2)] if ck else 0
            report("info_checkpoint_size_%s" % what, q.returncode == 0 and params > 0 and abs(est - per * params) < 0.01 * est,
                   "%s vs %d x %g" % (est, per, params))

        # --cutoff_len in info: the plan of examples that long (as the two lengths adding up to it)
        tot = lambda *f: re.search(r"total\s+([\d.]+) GiB", subprocess.run([GLM, "info", "--chatglm6b", "--bf16"] + list(f),
                                                                        capture_output=True, text=True).stdout)
        a_, b_ = tot("--cutoff_len", "2048"), tot("--max_source_length", "1536", "--max_target_length", "512")
        c_ = tot()
        report("info_cutoff_len_is_the_example_length", a_ and b_ and c_ and a_.group(1) == b_.group(1) != c_.group(1),
               "%s %s %s" % (a_ and a_.group(1), b_ and b_.group(1), c_ and c_.group(1)))

        # too little disk: a tmpfs that holds one checkpoint and the final model, not four checkpoints
        os.makedirs(mnt)
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", mnt], capture_output=True, text=True)
        if m.returncode != 0:
            print("SKIP disk_plan_warning: cannot mount a tmpfs here: %s" % m.stderr.strip())
            return
        mounted = True
        p = run(os.path.join(mnt, "a"), "--max_steps", "8")
        warned = "warning: the saves of this run need about" in p.stderr
        report("short_disk_is_warned_before_the_first_step", warned and "--save_total_limit (now 0)" in p.stderr and
               "--save_only_model true" in p.stderr and p.stderr.index("the saves of this run") < p.stderr.find("saved "),
               p.stderr[-500:])
        report("the_warned_run_then_fails_at_a_save", p.returncode != 0 and "disk is full" in p.stderr, p.stderr[-300:])
        shutil.rmtree(os.path.join(mnt, "a"), ignore_errors=True)
        p = run(os.path.join(mnt, "b"), "--max_steps", "8", "--save_total_limit", "1")
        report("a_fitting_limit_is_not_warned", p.returncode == 0 and "the saves of this run need" not in p.stderr and
               "at most 2 at once" in p.stderr, p.stderr[-300:])
    finally:
        if mounted:
            subprocess.run(["umount", mnt])
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    from mpi_runs import main_of
    main_of("disk_plan", main)
