#!/usr/bin/env python3
"""--load_best_model_at_end, as Hugging Face's Trainer keeps the best checkpoint:
- best_model_checkpoint / best_metric in trainer_state.json name the saved step whose eval_loss
  (or eval_perplexity, or the greatest with --greater_is_better) is the best of the log history;
- --save_total_limit never deletes it (limit 2: the best and the newest; limit 1: both too);
- the final model's weights are that checkpoint's, bit for bit, and --do_eval after training
  evaluates it (its eval_loss is the best metric);
- a run resumed half-way keeps the best of its first half;
- the Trainer's own checks: eval and save strategies must match, save_steps a multiple of
  eval_steps, and a metric glmtrain computes;
- --early_stopping_patience / --early_stopping_threshold stop the run where transformers'
  EarlyStoppingCallback would on the same evaluations (its rule re-implemented here), keep the
  count in trainer_state.json's stateful_callbacks so a resumed run stops at the same step, and
  need --load_best_model_at_end as the callback does;
- --save_strategy best saves a checkpoint at each evaluation that beats the best before it;
- --lr_scheduler_type reduce_lr_on_plateau gives each step the rate torch's ReduceLROnPlateau gives
  when fed the same evaluations.
The validation set differs from the training data, so its loss falls and then rises: the best
is not the last checkpoint. Prints PASS/FAIL/SKIP lines."""
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
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP load_best: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-best-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, _ = T.write_data(d)
        odd = os.path.join(d, "odd_val.json")
        json.dump([{"instruction": "翻译成英文：%s" % w, "output": "story %d of the sea" % i}
                   for i, w in enumerate(["春", "风", "明月", "山", "水", "江南", "白云", "故人"])], open(odd, "w"), ensure_ascii=False)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--validation_file", odd,
                  "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none", "--seed", "3", "--device", "cpu",
                  "--learning_rate", "5e-2", "--lr_scheduler_type", "constant", "--eval_strategy", "steps", "--eval_steps", "2",
                  "--save_steps", "2", "--load_best_model_at_end"]

        def run(out, *flags):
            p = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, out)] + common + list(flags),
                               capture_output=True, text=True, timeout=300, env=ENV)
            p.dir = os.path.join(d, out)
            return p

        def state(p, step):
            return json.load(open(os.path.join(p.dir, "checkpoint-%d" % step, "trainer_state.json")))

        def weights(path):
            from safetensors.numpy import load_file
            return load_file(path)

        def same(final, ckpt):  # every tensor of the checkpoint (the final folder adds HF's derived ones)
            return bool(ckpt) and all(k in final and (final[k] == ckpt[k]).all() for k in ckpt)

        p = run("a", "--max_steps", "16", "--save_total_limit", "2", "--do_eval")
        ok = p.returncode == 0
        st = state(p, 16) if ok else {}
        evals = {r["step"]: r["eval_loss"] for r in st.get("log_history", []) if "eval_loss" in r and r["step"] <= 16}
        best = min(evals, key=evals.get) if evals else None
        report("best_checkpoint_is_the_lowest_eval_loss", ok and best not in (None, 16) and
               st.get("best_model_checkpoint", "").endswith("checkpoint-%d" % best) and
               abs(st.get("best_metric", 0) - evals[best]) < 1e-9, "%s %s %s" % (evals, st.get("best_model_checkpoint"),
                                                                              p.stderr[-300:]))
        kept = sorted(n for n in os.listdir(p.dir) if n.startswith("checkpoint-")) if ok else []
        report("rotation_keeps_the_best_and_the_newest", kept == sorted(["checkpoint-%d" % best, "checkpoint-16"]), str(kept))
        final_ok = ok and same(weights(os.path.join(p.dir, "model.safetensors")),
                               weights(os.path.join(p.dir, "checkpoint-%d" % best, "model.safetensors")))
        report("final_model_is_the_best_checkpoint", final_ok and "loading the best model from" in p.stderr, p.stderr[-300:])
        ev = json.load(open(os.path.join(p.dir, "eval_results.json"))) if ok else {}
        report("do_eval_after_training_evaluates_the_best", ok and abs(ev.get("eval_loss", 0) - evals[best]) <= 1e-6 * evals[best],
               "%s vs %s" % (ev, evals.get(best)))

        one = run("one", "--max_steps", "16", "--save_total_limit", "1")
        kept1 = sorted(n for n in os.listdir(one.dir) if n.startswith("checkpoint-")) if one.returncode == 0 else []
        report("limit_1_keeps_the_best_beside_the_newest", kept1 == sorted(["checkpoint-%d" % best, "checkpoint-16"]), str(kept1))

        # resumed half-way: the first half's best carries over
        h = run("half", "--max_steps", "8")
        r = subprocess.run([GLM, "train", "--output_dir", h.dir, "--resume_from_checkpoint"] + common + ["--max_steps", "16"],
                           capture_output=True, text=True, timeout=300, env=ENV) if h.returncode == 0 else h
        ok = r.returncode == 0
        st2 = json.load(open(os.path.join(h.dir, "checkpoint-16", "trainer_state.json"))) if ok else {}
        report("resume_keeps_the_best_of_the_first_half", ok and st2.get("best_model_checkpoint", "").endswith("checkpoint-%d" % best)
               and same(weights(os.path.join(h.dir, "model.safetensors")),
                        weights(os.path.join(p.dir, "checkpoint-%d" % best, "model.safetensors"))), r.stderr[-400:])

        g = run("greater", "--max_steps", "16", "--greater_is_better")
        worst = max(evals, key=evals.get) if evals else None
        stg = state(g, 16) if g.returncode == 0 else {}
        report("greater_is_better_takes_the_greatest", stg.get("best_model_checkpoint", "").endswith("checkpoint-%d" % worst),
               "%s vs %s" % (stg.get("best_model_checkpoint"), worst))

        # --early_stopping_patience: where transformers' EarlyStoppingCallback would stop on run a's evaluations
        # (check_metric_value against the best of the saved evaluations before), the same run stops
        def hf_stop(evals, patience, threshold):
            best, count = None, 0
            for step in sorted(evals):
                v = evals[step]
                count = 0 if best is None or (v < best and abs(v - best) > threshold) else count + 1
                if count >= patience:
                    return step
                best = v if best is None or v < best else best
            return None
        for name, pat, thr in (("patience_2", 2, 0.0), ("threshold", 2, 1e6)):
            want = hf_stop(evals, pat, thr)
            e = run("es_" + name, "--max_steps", "16", "--early_stopping_patience", str(pat), "--early_stopping_threshold", str(thr))
            ste = state(e, want) if e.returncode == 0 and want and os.path.isdir(os.path.join(e.dir, "checkpoint-%d" % want)) else {}
            cb = ste.get("stateful_callbacks", {}).get("EarlyStoppingCallback", {})
            report("early_stopping_%s_where_transformers_stops" % name, want is not None and want < 16
                   and ste.get("global_step") == want and not os.path.isdir(os.path.join(e.dir, "checkpoint-%d" % (want + 2)))
                   and "early stopping at step %d" % want in e.stderr
                   and cb.get("attributes", {}).get("early_stopping_patience_counter") == pat,
                   "want %s, evals %s, %s" % (want, evals, e.stderr[-300:]))
        want = hf_stop(evals, 2, 0.0)
        if want and want > 2:  # resumed just before it stops: the count carried in trainer_state.json stops it at the same step
            h2 = run("es_half", "--max_steps", str(want - 2), "--early_stopping_patience", "2")
            r2 = subprocess.run([GLM, "train", "--output_dir", h2.dir, "--resume_from_checkpoint"] + common +
                                ["--max_steps", "16", "--early_stopping_patience", "2"], capture_output=True, text=True, timeout=300,
                                env=ENV) if h2.returncode == 0 else h2
            report("early_stopping_count_survives_resume", r2.returncode == 0 and "early stopping at step %d" % want in r2.stderr,
                   r2.stderr[-300:])
        # --save_strategy best (transformers 4.47's): a checkpoint at each evaluation that beats the best before it
        sb = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, "save_best")] +
                            [x for x in common if x != "--load_best_model_at_end"] + ["--max_steps", "16", "--save_strategy", "best"],
                            capture_output=True, text=True, timeout=300, env=ENV)
        want_steps, low = [], None
        for step in sorted(evals):
            if low is None or evals[step] < low:
                want_steps.append(step)
                low = evals[step]
        got = sorted(int(n.split("-")[1]) for n in os.listdir(os.path.join(d, "save_best")) if n.startswith("checkpoint-")) \
            if sb.returncode == 0 else None
        report("save_strategy_best_saves_each_new_best", got == want_steps and len(want_steps) < len(evals),
               "%s vs %s %s" % (got, want_steps, sb.stderr[-300:]))
        # reduce_lr_on_plateau against torch's ReduceLROnPlateau fed the same evaluations: each step's rate
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None:
            print("SKIP plateau_rates_equal_torch: torch is not installed")
        else:
            base_args = [x for x in common if x != "--load_best_model_at_end"]
            i = base_args.index("--lr_scheduler_type")
            base_args[i + 1] = "reduce_lr_on_plateau"
            kw = {"patience": 0, "factor": 0.5, "threshold": 0.01}
            pl = subprocess.run([GLM, "train", "--output_dir", os.path.join(d, "plateau")] + base_args +
                                ["--max_steps", "16", "--logging_steps", "1", "--lr_scheduler_kwargs", json.dumps(kw)],
                                capture_output=True, text=True, timeout=300, env=ENV)
            hist = state(type("P", (), {"dir": os.path.join(d, "plateau")}), 16)["log_history"] if pl.returncode == 0 else []
            used = {r["step"]: r["learning_rate"] for r in hist if "learning_rate" in r}
            pev = {r["step"]: r["eval_loss"] for r in hist if "eval_loss" in r}
            opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=5e-2)
            sch = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **kw)
            want = {}
            for step in range(1, 17):
                want[step] = opt.param_groups[0]["lr"]
                if step in pev:
                    sch.step(pev[step])
            ok = len(used) == 16 and all(abs(used[k] - want[k]) <= 1e-7 * want[k] for k in want) and len(set(want.values())) > 2
            report("plateau_rates_equal_torch", ok, "%s vs %s %s" % (used, want, pl.stderr[-300:]))
            # stopped at step 8 and resumed: the saved state (rate, best, counts) gives the same rates after
            hdir = os.path.join(d, "plateau_half")
            args = base_args + ["--logging_steps", "1", "--lr_scheduler_kwargs", json.dumps(kw)]
            h = subprocess.run([GLM, "train", "--output_dir", hdir] + args + ["--max_steps", "8"], capture_output=True, text=True,
                               timeout=300, env=ENV)
            r = subprocess.run([GLM, "train", "--output_dir", hdir, "--resume_from_checkpoint"] + args + ["--max_steps", "16"],
                               capture_output=True, text=True, timeout=300, env=ENV) if h.returncode == 0 else h
            h16 = json.load(open(os.path.join(hdir, "checkpoint-16", "trainer_state.json")))["log_history"] if r.returncode == 0 else []
            used2 = {x["step"]: x["learning_rate"] for x in h16 if "learning_rate" in x}
            report("plateau_state_survives_resume", used2 == used and len(used) == 16, "%s vs %s %s" % (used2, used, r.stderr[-300:]))
        for name, flags, msg in (("plateau_without_eval", ["--lr_scheduler_type", "reduce_lr_on_plateau", "--eval_strategy", "no",
                                                           "--load_best_model_at_end", "false"], "requires an eval strategy"),
                                 ("save_best_without_eval", ["--save_strategy", "best", "--eval_strategy", "no",
                                                             "--load_best_model_at_end", "false"], "--eval_strategy is no"),
                                 ("early_stopping_without_best", ["--early_stopping_patience", "2", "--load_best_model_at_end", "false"],
                                  "--early_stopping_patience requires --load_best_model_at_end"),
                                 ("early_stopping_negative", ["--early_stopping_patience", "-1"], "a number of evaluations")):
            q = run("bad_" + name, "--max_steps", "2", *flags)
            report("refused_" + name, q.returncode != 0 and msg in q.stderr, q.stderr[-300:])
        for name, flags, msg in (("strategies_differ", ["--save_strategy", "epoch"], "save and eval strategy to match"),
                                 ("save_not_multiple", ["--save_steps", "3"], "round multiple of the evaluation steps"),
                                 ("unknown_metric", ["--metric_for_best_model", "bleu-4"], "--metric_for_best_model bleu-4")):
            q = run("bad_" + name, "--max_steps", "2", *flags)
            report("refused_" + name, q.returncode != 0 and msg in q.stderr and "hint:" in q.stderr, q.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
