#!/usr/bin/env python3
"""--save_only_model true, as Hugging Face's TrainingArguments names it: each checkpoint-N holds
the model as the final save would write it at that step (model weights for full and freeze
fine-tuning, peft's adapter files for LoRA, THUDM's prefix files for P-Tuning v2), with
trainer_state.json ("save_only_model": true), training_args.json and the tokenizer, sealed, and
no optimizer state:
- the checkpoint equals the final model of the same step, tensor for tensor;
- it loads where a model or adapter folder loads (generate, a new run's --model_name_or_path or
  --adapter_name_or_path);
- resuming from it is refused, naming the flag and the way to train on from its weights (the
  Trainer documents that such checkpoints cannot resume; it would restart the optimizer silently);
- --load_best_model_at_end loads the best one's weights;
- ZeRO-3 on 2 ranks and 2 pipeline stages write the same files;
- --save_on_interrupt still writes a full checkpoint, which resumes.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, NO_MPI, MPIRUN, report, st_read  # noqa: E402


def files(d):
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def tensors(d):
    """Every tensor of the safetensors files of folder d (F32 as lists, others as bytes)."""
    out = {}
    for n in files(d):
        if n.endswith(".safetensors"):
            out.update(st_read(os.path.join(d, n), others=True))
    return out


def same_model(a, b):
    ta, tb = tensors(a), tensors(b)
    return bool(ta) and ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta)


def model_only_checkpoint(d):
    """The checkpoint's own marks: no optimizer file, the flag in trainer_state.json, sealed."""
    names = files(d)
    st = json.load(open(os.path.join(d, "trainer_state.json"))) if "trainer_state.json" in names else {}
    return (not any(n.startswith("optimizer") for n in names) and st.get("save_only_model") is True and
            "checksums.json" in names and "training_args.json" in names)


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP save_only_model: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-som-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, val_file = T.write_data(d)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file,
                  "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none", "--seed", "3",
                  "--device", "cpu", "--learning_rate", "1e-2", "--max_source_length", "32", "--max_target_length", "16"]

        def run(out, *flags, np=1, base=None):
            cmd = (MPIRUN + ["-np", str(np)] if np > 1 else []) + [GLM, "train", "--output_dir", os.path.join(d, out)]
            p = subprocess.run(cmd + (common if base is None else base) + list(flags), capture_output=True, text=True,
                               timeout=300, env=ENV)
            p.dir = os.path.join(d, out)
            return p

        def ck(p, step):
            return os.path.join(p.dir, "checkpoint-%d" % step)

        # full fine-tuning: checkpoints of the model alone, equal to the final model of the last step
        full = run("full", "--max_steps", "4", "--save_steps", "2", "--save_only_model", "true")
        ok = full.returncode == 0
        report("full_checkpoints_hold_no_optimizer_state", ok and model_only_checkpoint(ck(full, 2)) and
               model_only_checkpoint(ck(full, 4)), full.stderr[-400:] + " " + str(files(ck(full, 4))))
        report("full_checkpoint_equals_the_final_model", ok and same_model(ck(full, 4), full.dir), str(files(full.dir)))
        normal = run("normal", "--max_steps", "4", "--save_steps", "4")
        size = lambda p: sum(os.path.getsize(os.path.join(p, n)) for n in files(p))
        nst = json.load(open(os.path.join(ck(normal, 4), "trainer_state.json"))) if normal.returncode == 0 else {}
        opt = os.path.join(ck(normal, 4), "optimizer.safetensors")
        report("a_normal_checkpoint_keeps_the_optimizer", normal.returncode == 0 and "save_only_model" not in nst and
               os.path.exists(opt) and size(ck(full, 4)) < size(ck(normal, 4)),
               "%s %d %d" % (files(ck(normal, 4)), size(ck(full, 4)) if ok else 0, size(ck(normal, 4)) if normal.returncode == 0 else 0))

        # resuming is refused, naming the flag and how to go on from the weights
        r = run("full", "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint")
        report("resume_from_a_model_only_checkpoint_is_refused", r.returncode != 0 and "--save_only_model" in r.stderr and
               "--model_name_or_path %s" % ck(full, 4) in r.stderr and "Traceback" not in r.stderr, r.stderr[-400:])
        r = run("full2", "--max_steps", "6", "--resume_from_checkpoint", ck(full, 2))
        report("resume_from_a_named_model_only_checkpoint_is_refused", r.returncode != 0 and "--save_only_model" in r.stderr and
               "optimizer" in r.stderr and "checkpoint-2" in r.stderr, r.stderr[-400:])
        g = subprocess.run([GLM, "generate", "--model_name_or_path", ck(full, 4), "--prompt", "写一句关于春的诗",
                            "--max_new_tokens", "4", "--device", "cpu"], capture_output=True, text=True, timeout=120, env=ENV)
        report("full_checkpoint_generates", g.returncode == 0 and g.stdout.strip() != "", g.stderr[-300:])
        base = [a for a in common if a not in ("--init_from_config", cfg)]
        ev = lambda out, model: run(out, "--model_name_or_path", model, "--do_train", "false", "--do_eval",
                                    "--validation_file", val_file, base=base)
        e1, e2 = ev("eval_ckpt", ck(full, 4)), ev("eval_final", full.dir)
        loss = lambda p: json.load(open(os.path.join(p.dir, "eval_results.json")))["eval_loss"] if p.returncode == 0 else None
        report("full_checkpoint_is_a_model_folder", loss(e1) is not None and loss(e1) == loss(e2),
               "%s %s %s" % (loss(e1), loss(e2), e1.stderr[-300:]))

        # LoRA: the adapter's files, which the next run and generate take
        on_base = ["--model_name_or_path", ck(full, 4)] + base
        lora = run("lora", "--finetuning_type", "lora", "--max_steps", "4", "--save_steps", "2", "--save_only_model", "true",
                   "--learning_rate", "5e-2", base=on_base)
        ok = lora.returncode == 0
        report("lora_checkpoint_is_the_adapter", ok and model_only_checkpoint(ck(lora, 4)) and
               {"adapter_config.json", "adapter_model.safetensors"} <= set(files(ck(lora, 4))) and
               same_model(ck(lora, 4), lora.dir), lora.stderr[-300:] + str(files(ck(lora, 4))))
        r = run("lora", "--finetuning_type", "lora", "--max_steps", "6", "--resume_from_checkpoint", base=on_base)
        report("lora_resume_refused_naming_adapter_name_or_path", r.returncode != 0 and
               "--adapter_name_or_path %s beside --model_name_or_path" % ck(lora, 4) in r.stderr, r.stderr[-300:])
        ev_a = lambda out, adapter: run(out, "--finetuning_type", "lora", "--adapter_name_or_path", adapter, "--do_train", "false",
                                        "--do_eval", "--validation_file", val_file, base=on_base)
        e1, e2 = ev_a("eval_lora_ckpt", ck(lora, 4)), ev_a("eval_lora_final", lora.dir)
        report("lora_checkpoint_loads_as_an_adapter", loss(e1) is not None and loss(e1) == loss(e2),
               "%s %s %s" % (loss(e1), loss(e2), e1.stderr[-300:]))
        n = run("lora_on", "--finetuning_type", "lora", "--adapter_name_or_path", ck(lora, 4), "--max_steps", "1", base=on_base)
        report("lora_checkpoint_trains_on", n.returncode == 0, n.stderr[-300:])

        # freeze: the whole model, so the folder is a model of its own
        fz = run("freeze", "--finetuning_type", "freeze", "--num_layer_trainable", "1", "--max_steps", "2", "--save_steps", "2",
                 "--save_only_model", "true")
        report("freeze_checkpoint_is_the_whole_model", fz.returncode == 0 and model_only_checkpoint(ck(fz, 2)) and
               same_model(ck(fz, 2), fz.dir) and any(".0." in k for k in tensors(ck(fz, 2))), fz.stderr[-300:])

        # P-Tuning v2: THUDM's prefix files
        pt = run("ptuning", "--finetuning_type", "ptuning", "--pre_seq_len", "4", "--max_steps", "2", "--save_steps", "2",
                 "--save_only_model", "true")
        report("ptuning_checkpoint_is_the_prefix", pt.returncode == 0 and model_only_checkpoint(ck(pt, 2)) and
               "pytorch_model.bin" in files(ck(pt, 2)) and same_model(ck(pt, 2), pt.dir), pt.stderr[-300:])

        # --load_best_model_at_end reads the best checkpoint's weights
        odd = os.path.join(d, "odd_val.json")
        json.dump([{"instruction": "翻译成英文：%s" % w, "output": "story %d of the sea" % i}
                   for i, w in enumerate(["春", "风", "明月", "山", "水", "江南", "白云", "故人"])], open(odd, "w"), ensure_ascii=False)
        best = run("best", "--max_steps", "16", "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2",
                   "--validation_file", odd, "--learning_rate", "5e-2", "--lr_scheduler_type", "constant",
                   "--load_best_model_at_end", "--save_total_limit", "2", "--save_only_model", "true")
        ok = best.returncode == 0
        st = json.load(open(os.path.join(ck(best, 16), "trainer_state.json"))) if ok else {}
        bdir = st.get("best_model_checkpoint", "")
        report("load_best_takes_a_model_only_checkpoint", ok and bdir and not bdir.endswith("-16") and
               model_only_checkpoint(bdir) and same_model(bdir, best.dir) and "loading the best model from" in best.stderr,
               best.stderr[-400:] + " " + bdir)

        # --save_on_interrupt: a checkpoint to resume from, so the optimizer is in it
        log = open(os.path.join(d, "int.log"), "w")
        p = subprocess.Popen([GLM, "train", "--output_dir", os.path.join(d, "int"), "--max_steps", "100000",
                              "--save_steps", "100000", "--save_only_model", "true", "--save_on_interrupt",
                              "--logging_steps", "1"] + common, stdout=log, stderr=subprocess.STDOUT, env=ENV)
        t0 = time.time()
        while time.time() - t0 < 120 and "'loss'" not in open(log.name, errors="replace").read():
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill(); rc = p.wait()
        log.close()
        kept = [n for n in files(os.path.join(d, "int")) if n.startswith("checkpoint-")]
        full_ck = bool(kept) and "optimizer.safetensors" in files(os.path.join(d, "int", kept[0]))
        r = run("int", "--max_steps", "%d" % (int(kept[0].split("-")[1]) + 1) if kept else "1", "--save_steps", "100000",
                "--resume_from_checkpoint") if full_ck else None
        report("save_on_interrupt_writes_a_checkpoint_that_resumes", full_ck and r.returncode == 0 and "resumed from" in r.stderr,
               "rc %s %s %s" % (rc, kept, (r.stderr[-300:] if r else open(log.name, errors="replace").read()[-300:])))

        # ZeRO-3 on 2 ranks, and 2 pipeline stages: the same files
        if not shutil.which("mpirun"):
            print("SKIP save_only_model_ranks: mpirun not installed")
            return
        z3 = run("z3", "--max_steps", "2", "--save_steps", "2", "--save_only_model", "true", "--zero_stage", "3",
                 "--per_device_train_batch_size", "2", np=2)
        if any(m in z3.stdout + z3.stderr for m in NO_MPI):
            print("SKIP save_only_model_ranks: this glmtrain was built without MPI")
            return
        report("zero3_two_ranks_checkpoint_is_the_final_model", z3.returncode == 0 and model_only_checkpoint(ck(z3, 2)) and
               same_model(ck(z3, 2), z3.dir), z3.stderr[-400:])
        pp = run("pp", "--max_steps", "2", "--save_steps", "2", "--save_only_model", "true", "--pipeline_parallel_size", "2",
                 np=2)
        report("pipeline_checkpoint_is_the_final_model", pp.returncode == 0 and model_only_checkpoint(ck(pp, 2)) and
               same_model(ck(pp, 2), pp.dir), pp.stderr[-400:] + str(files(ck(pp, 2))))
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    from mpi_runs import main_of
    main_of("save_only_model", main)
