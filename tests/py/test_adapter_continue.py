#!/usr/bin/env python3
"""Going on from an adapter, and evaluating without training:
- `--do_train false --do_eval` on base + a LoRA adapter (--adapter_name_or_path) gives the eval
  loss the adapter's own training run reported after its last step (--do_eval), and not the
  base's; likewise base + a P-Tuning v2 checkpoint (--ptuning_checkpoint); without a
  validation file it evaluates the training data, as LLaMA-Factory's --do_eval does; it writes
  eval_results.json and removes nothing from the output folder;
- training on from an adapter at learning rate 0 saves that adapter unchanged (its rows loaded
  into the trainable part, its rank and alpha kept over other flags), and at a real rate goes on
  lowering the loss from where the adapter left it;
- what does not fit is refused naming both sides: a prefix length other than the checkpoint's,
  a LoRA folder as --ptuning_checkpoint, an adapter with --finetuning_type freeze, no base, and
  --do_train false without --do_eval.
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


def main():
    if not os.path.exists(GLM) or not __import__("shutil").which("spm_train"):
        print("SKIP adapter_continue: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-adc-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, val_file = T.write_data(d)
        common = ["--tokenizer_name", tok, "--train_file", train_file, "--per_device_train_batch_size", "4",
                  "--disable_tqdm", "--report_to", "none", "--seed", "3", "--device", "cpu"]

        def run(out, *flags):
            p = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, out)] + common + list(flags),
                               capture_output=True, text=True, timeout=300, env=ENV)
            p.dir = os.path.join(d, out)
            return p

        def eval_loss(p):
            try:
                return json.load(open(os.path.join(p.dir, "eval_results.json")))["eval_loss"]
            except (OSError, ValueError, KeyError):
                return None

        base = run("base", "--init_from_config", cfg, "--max_steps", "6", "--learning_rate", "1e-2")
        report("base_trained", base.returncode == 0, base.stderr[-300:])
        b = ["--model_name_or_path", base.dir]
        lora = run("lora", *b, "--finetuning_type", "lora", "--lora_rank", "4", "--lora_alpha", "8", "--max_steps", "6",
                   "--learning_rate", "2e-2", "--validation_file", val_file, "--do_eval")
        pt = run("pt", *b, "--pre_seq_len", "4", "--max_steps", "6", "--learning_rate", "2e-2", "--validation_file", val_file,
                 "--do_eval")
        report("adapters_trained", lora.returncode == 0 and pt.returncode == 0, lora.stderr[-300:] + pt.stderr[-300:])

        ev_base = run("ev_base", *b, "--validation_file", val_file, "--do_train", "false", "--do_eval")
        ev_lora = run("ev_lora", *b, "--validation_file", val_file, "--do_train", "false", "--do_eval",
                      "--adapter_name_or_path", lora.dir)
        ev_pt = run("ev_pt", *b, "--validation_file", val_file, "--do_train", "false", "--do_eval",
                    "--ptuning_checkpoint", pt.dir, "--pre_seq_len", "4")
        lb, ll, lp = eval_loss(ev_base), eval_loss(ev_lora), eval_loss(ev_pt)
        wl, wp = eval_loss(lora), eval_loss(pt)
        report("eval_only_lora_equals_its_training_runs_eval", None not in (ll, wl, lb) and abs(ll - wl) <= 1e-6 * abs(wl)
               and abs(ll - lb) > 1e-4, "%s vs %s (base %s) %s" % (ll, wl, lb, ev_lora.stderr[-300:]))
        report("eval_only_ptuning_equals_its_training_runs_eval", None not in (lp, wp, lb) and abs(lp - wp) <= 1e-6 * abs(wp)
               and abs(lp - lb) > 1e-4, "%s vs %s (base %s) %s" % (lp, wp, lb, ev_pt.stderr[-300:]))
        report("eval_only_trains_and_saves_nothing", ev_lora.returncode == 0 and "eval_loss" in ev_lora.stderr and
               not os.path.exists(os.path.join(ev_lora.dir, "adapter_model.safetensors")) and
               not [n for n in os.listdir(ev_lora.dir) if n.startswith("checkpoint-")], str(os.listdir(ev_lora.dir)))
        # no validation file: the training data is what is evaluated
        ev_tr = run("ev_train", *b, "--do_train", "false", "--do_eval", "--adapter_name_or_path", lora.dir)
        ev_tr2 = run("ev_train2", *b, "--do_train", "false", "--do_eval", "--adapter_name_or_path", lora.dir,
                     "--validation_file", train_file)
        report("eval_only_without_validation_takes_the_training_data", eval_loss(ev_tr) is not None and
               eval_loss(ev_tr) == eval_loss(ev_tr2), "%s vs %s %s" % (eval_loss(ev_tr), eval_loss(ev_tr2), ev_tr.stderr[-300:]))
        # an output folder with a model and checkpoints: evaluated into, nothing removed
        keep = sorted(os.listdir(lora.dir))
        ev_in = subprocess.run([GLM, "train", "--output_dir", lora.dir, "--overwrite_output_dir"] + common + b +
                               ["--validation_file", val_file, "--do_train", "false", "--do_eval", "--adapter_name_or_path",
                                lora.dir], capture_output=True, text=True, timeout=300, env=ENV)
        left = sorted(os.listdir(lora.dir))
        report("eval_only_in_a_run_folder_removes_nothing", ev_in.returncode == 0 and all(n in left for n in keep),
               "%s -> %s %s" % (keep, left, ev_in.stderr[-300:]))

        # training on from the adapter: at rate 0 it is saved as loaded, its rank kept over --lora_rank
        from safetensors.numpy import load_file
        zero = run("lora_zero", *b, "--adapter_name_or_path", lora.dir, "--lora_rank", "16", "--max_steps", "2",
                   "--learning_rate", "0", "--save_steps", "100")
        ok = zero.returncode == 0
        if ok:
            w0 = load_file(os.path.join(lora.dir, "adapter_model.safetensors"))
            w1 = load_file(os.path.join(zero.dir, "adapter_model.safetensors"))
            c1 = json.load(open(os.path.join(zero.dir, "adapter_config.json")))
            ok = sorted(w0) == sorted(w1) and all((w0[k] == w1[k]).all() for k in w0) and c1["r"] == 4 and c1["lora_alpha"] == 8
        report("continue_at_rate_0_saves_the_adapter_unchanged", ok and "--lora_rank 16" in zero.stderr, zero.stderr[-400:])
        on = run("lora_on", *b, "--adapter_name_or_path", lora.dir, "--max_steps", "6", "--learning_rate", "2e-2",
                 "--validation_file", val_file, "--do_eval")
        report("continue_lowers_the_eval_loss_further", eval_loss(on) is not None and wl is not None and eval_loss(on) < wl,
               "%s vs %s %s" % (eval_loss(on), wl, on.stderr[-300:]))
        pz = run("pt_zero", *b, "--ptuning_checkpoint", pt.dir, "--max_steps", "2", "--learning_rate", "0", "--save_steps", "100")
        ok = pz.returncode == 0
        if ok:
            w0, w1 = load_file(os.path.join(pt.dir, "model.safetensors")), load_file(os.path.join(pz.dir, "model.safetensors"))
            ok = sorted(w0) == sorted(w1) and all((w0[k] == w1[k]).all() for k in w0)
        report("continue_ptuning_at_rate_0_saves_the_prefix_unchanged", ok, pz.stderr[-300:])

        # LLaMA-Factory's adapter lists: the adapters before the last merge into the base as it loads
        from safetensors.numpy import load_file as np_load
        lora2 = run("lora2", *b, "--finetuning_type", "lora", "--lora_rank", "2", "--lora_target", "dense,dense_4h_to_h",
                    "--max_steps", "4", "--learning_rate", "5e-2")
        merged = os.path.join(d, "merged_lora2")
        pm = subprocess.run([GLM, "merge", "--model_name_or_path", base.dir, "--adapter", lora2.dir, "--output_dir", merged,
                             "--dtype", "float32"], capture_output=True, text=True, timeout=300, env=ENV)
        report("list_setup", lora2.returncode == 0 and pm.returncode == 0, lora2.stderr[-300:] + pm.stderr[-300:])
        m = ["--model_name_or_path", merged, "--tokenizer_name", tok]
        # the last adapter trains on: at rate 0 saved unchanged; evaluated as the merged folder with it
        sz = run("list_zero", *b, "--adapter_name_or_path", lora2.dir + "," + lora.dir, "--max_steps", "2", "--learning_rate",
                 "0", "--save_steps", "100", "--validation_file", val_file, "--do_eval")
        ez = run("list_zero_ref", *m, "--adapter_name_or_path", lora.dir, "--validation_file", val_file, "--do_train", "false",
                 "--do_eval")
        ok = sz.returncode == 0
        if ok:
            w0, w1 = np_load(os.path.join(lora.dir, "adapter_model.safetensors")), np_load(os.path.join(sz.dir, "adapter_model.safetensors"))
            ok = sorted(w0) == sorted(w1) and all((w0[k] == w1[k]).all() for k in w0)
        report("list_trains_the_last_on", ok and "merged into the base as it loads: " + lora2.dir in sz.stderr and
               "the last adapter trains on" in sz.stderr, sz.stderr[-400:])
        lz, lr_ = eval_loss(sz), eval_loss(ez)
        report("list_evaluates_as_the_merged_folder", None not in (lz, lr_, ll) and abs(lz - lr_) <= 1e-6 * abs(lr_) and
               abs(lz - ll) > 1e-4, "%s vs %s (lora alone %s) %s" % (lz, lr_, ll, sz.stderr[-300:] + ez.stderr[-300:]))

        # a P-Tuning v2 checkpoint last in a list: the LoRA adapters before it merge, the prefix applies
        ep = run("list_pt", *b, "--adapter_name_or_path", lora2.dir + "," + pt.dir, "--validation_file", val_file,
                 "--do_train", "false", "--do_eval")
        epr = run("list_pt_ref", *m, "--ptuning_checkpoint", pt.dir, "--validation_file", val_file, "--do_train", "false",
                  "--do_eval")
        report("list_with_a_prefix_last_evaluates_as_the_merged_folder", None not in (eval_loss(ep), eval_loss(epr)) and
               abs(eval_loss(ep) - eval_loss(epr)) <= 1e-6 * abs(eval_loss(epr)) and abs(eval_loss(ep) - lp) > 1e-4,
               "%s vs %s (prefix alone %s) %s" % (eval_loss(ep), eval_loss(epr), lp, ep.stderr[-300:]))

        def losses(p):
            try:
                st = json.load(open(os.path.join(p.dir, "checkpoint-4", "trainer_state.json")))
                return [h["loss"] for h in st["log_history"] if "loss" in h]
            except (OSError, ValueError, KeyError):
                return []
        # --create_new_adapter: every adapter merges and a new one trains, as on the merged folder
        steps = ["--finetuning_type", "lora", "--lora_rank", "4", "--max_steps", "4", "--learning_rate", "2e-2",
                 "--logging_steps", "1", "--save_steps", "2"]
        cn = run("create_new", *b, "--adapter_name_or_path", lora2.dir, "--create_new_adapter", *steps)
        cr = run("create_new_ref", *m, *steps)
        lc, lf = losses(cn), losses(cr)
        report("create_new_adapter_trains_as_on_the_merged_folder", cn.returncode == 0 and len(lc) == 4 and lc == lf and
               "a new adapter trains on top" in cn.stderr, "%s vs %s %s" % (lc, lf, (cn.stderr + cr.stderr)[-400:]))
        ok = cn.returncode == 0
        if ok:
            w = np_load(os.path.join(cn.dir, "adapter_model.safetensors"))
            c1 = json.load(open(os.path.join(cn.dir, "adapter_config.json")))
            ok = c1["r"] == 4 and c1["target_modules"] == ["query_key_value"] and all(k.endswith("query_key_value.lora_A.weight") or
                                                                                       k.endswith("query_key_value.lora_B.weight") for k in w)
        report("create_new_adapter_saves_the_new_one", ok, cn.stderr[-300:])
        # a resume must merge what the checkpoint's run merged
        rs = run("create_new", *b, "--adapter_name_or_path", lora2.dir, "--create_new_adapter", *steps,
                 "--resume_from_checkpoint", os.path.join(cn.dir, "checkpoint-2"), "--overwrite_output_dir", "false")
        report("create_new_adapter_resumes", rs.returncode == 0 and losses(rs) == lc, "%s vs %s %s" % (losses(rs), lc, rs.stderr[-300:]))
        rb = run("create_new", *b, *steps, "--resume_from_checkpoint", os.path.join(cn.dir, "checkpoint-2"))
        report("resume_without_the_merged_adapters_refused", rb.returncode != 0 and lora2.dir in rb.stderr and
               "merged into it" in rb.stderr and "hint:" in rb.stderr, rb.stderr[-300:])
        # full fine-tuning from the merged base: its model at rate 0 is the merged folder's
        fz = run("full_zero", *b, "--adapter_name_or_path", lora2.dir, "--create_new_adapter", "--max_steps", "1",
                 "--learning_rate", "0", "--save_steps", "100")
        ok = fz.returncode == 0
        if ok:
            wf, wm = np_load(os.path.join(fz.dir, "model.safetensors")), np_load(os.path.join(merged, "model.safetensors"))
            ok = sorted(wf) == sorted(wm) and all((wf[k].astype("float32") == wm[k]).all() for k in wm)
        report("create_new_adapter_full_starts_from_the_merged_weights", ok, fz.stderr[-300:])

        # refused, naming both sides
        for name, flags, msgs in (
                ("ptuning_length", ["--ptuning_checkpoint", pt.dir, "--pre_seq_len", "8"], ["--pre_seq_len 8", "pre_seq_len 4"]),
                ("lora_as_ptuning_checkpoint", ["--ptuning_checkpoint", lora.dir], ["is a LoRA adapter", "--adapter_name_or_path"]),
                ("adapter_with_freeze", ["--adapter_name_or_path", lora.dir, "--finetuning_type", "freeze"], ["freeze"]),
                ("no_train_no_eval", ["--do_train", "false"], ["without --do_eval"]),
                ("create_new_with_ptuning", ["--ptuning_checkpoint", pt.dir, "--create_new_adapter"], ["cannot merge"]),
                ("ptuning_merged", ["--adapter_name_or_path", pt.dir + "," + lora.dir], ["cannot be merged"])):
            p = run("bad_" + name, *b, *flags, "--max_steps", "1")
            report("refused_" + name, p.returncode != 0 and all(m in p.stderr for m in msgs) and "hint:" in p.stderr,
                   p.stderr[-300:])
        p = run("bad_nobase", "--init_from_config", cfg, "--adapter_name_or_path", lora.dir, "--max_steps", "1")
        report("refused_adapter_without_base", p.returncode != 0 and "--model_name_or_path" in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
