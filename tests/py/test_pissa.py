#!/usr/bin/env python3
"""PiSSA (LLaMA-Factory's --pissa_init / --pissa_iter / --pissa_convert; peft's init_lora_weights
"pissa_niter_N") through the command line, against torch:
- the first A and B are the weights' principal singular triplets as torch.linalg.svd gives them
  (on a base whose query_key_value weights have well-separated singular values, so the randomized
  SVD of 16 iterations has converged), A0 = diag(sqrt(S/s)) Vh, B0 = U diag(sqrt(S/s)) up to each
  triplet's sign, and at learning rate 0 the model evaluates as the base (W - s B0 A0 + s B0 A0);
- the folders: the adapter with init_lora_weights pissa_niter_16 and its first values in
  pissa_init/ (checkpoints too, sealed in checksums.json), and pissa_converted/, a plain LoRA of
  rank 2r with [A; A0], [B, -B0] and alpha doubled;
- after training, generate with the PiSSA folder, with the converted one, and the torch reference
  of the converted adapter merged into the original base give the same tokens; merge of either
  writes the same weights; resume is exact;
- refused by name: a PiSSA folder without pissa_init/, serve of it, peft's olora/loftq starts,
  PiSSA with freeze, DoRA, or an adapter to train on; --pissa_iter -1 (the full SVD's triplets) reaches
  torch.linalg.svd's where 16 iterations stop short.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_generate import GLM, PENALTY, debug_ids, make_tokenizer, tiny_config, torch_greedy  # noqa: E402
from test_lora_cli import check, run  # noqa: E402  (its PASS/FAIL printer and its glmtrain runner)

QKV = "transformer.layers.%d.attention.query_key_value"


def main():
    import torch
    import glm_ref
    from safetensors.torch import load_file
    if not os.path.exists(GLM):
        print("SKIP pissa_all: %s not built" % GLM)
        return 0
    if not shutil.which("spm_train"):
        print("SKIP pissa_all: spm_train (Debian sentencepiece) not installed")
        return 0
    tmp = tempfile.mkdtemp(prefix="glm-pissa-")
    try:
        tok, ids, vocab = make_tokenizer(tmp)
        cfg = tiny_config(ids, vocab)
        params = glm_ref.init_params(cfg, seed=4, std=0.3)
        g = torch.Generator().manual_seed(11)
        for l in range(2):  # singular values 2 * 0.6^i: the randomized SVD converges in a few iterations
            for mod, (o, i) in (("attention.query_key_value", (96, 32)), ("attention.dense", (32, 32)),
                                ("mlp.dense_h_to_4h", (64, 32)), ("mlp.dense_4h_to_h", (32, 64))):
                u, _ = torch.linalg.qr(torch.randn(o, 32, generator=g, dtype=torch.float64))
                v, _ = torch.linalg.qr(torch.randn(i, 32, generator=g, dtype=torch.float64))
                s = torch.tensor([2 * 0.6 ** k for k in range(32)], dtype=torch.float64)
                params["transformer.layers.%d.%s.weight" % (l, mod)] = (u @ torch.diag(s) @ v.T).float()
        glm_ref.save_model_dir(tok, cfg, params)
        base = tok
        data = os.path.join(tmp, "train.json")
        json.dump([{"instruction": "写一句关于%s的诗" % w, "output": w * 3} for w in ["春", "风", "山", "水"] * 4],
                  open(data, "w"), ensure_ascii=False)
        r, alpha = 4, 8.0
        scaling = alpha / r
        common = ["--model_name_or_path", base, "--train_file", data, "--finetuning_type", "lora", "--lora_rank", str(r),
                  "--lora_alpha", str(int(alpha)), "--lora_dropout", "0", "--per_device_train_batch_size", "4",
                  "--logging_steps", "1", "--disable_tqdm", "--report_to", "none", "--max_source_length", "32",
                  "--max_target_length", "16", "--device", "cpu", "--seed", "5"]

        # 1. the start: the principal triplets, the base's function kept
        out0 = os.path.join(tmp, "pissa_lr0")
        p = run(["train", "--output_dir", out0, "--pissa_init", "--pissa_convert", "--max_steps", "1", "--learning_rate", "0",
                 "--save_steps", "100", "--validation_file", data, "--do_eval"] + common)
        ev_base = run(["train", "--output_dir", os.path.join(tmp, "ev_base"), "--do_train", "false", "--do_eval",
                       "--validation_file", data] + common)  # a fresh LoRA (B = 0) computes the base
        if check("pissa_train_runs", p.returncode == 0 and "PiSSA: the adapters start from" in p.stderr, p.stderr[-800:]):
            init = load_file(os.path.join(out0, "pissa_init", "adapter_model.safetensors"))
            worst_ba, worst_rows = 0.0, 0.0
            for l in range(2):
                w = params[QKV % l + ".weight"].double()
                U, S, Vh = torch.linalg.svd(w, full_matrices=False)
                a0 = init["base_model.model." + QKV % l + ".lora_A.weight"].double()
                b0 = init["base_model.model." + QKV % l + ".lora_B.weight"].double()
                ref_ba = U[:, :r] @ torch.diag(S[:r]) @ Vh[:r]
                worst_ba = max(worst_ba, float((scaling * b0 @ a0 - ref_ba).abs().max() / ref_ba.abs().max()))
                ref_a = torch.diag(torch.sqrt(S[:r] / scaling)) @ Vh[:r]
                sign = torch.sign((a0 * ref_a).sum(1, keepdim=True))  # each triplet's sign is free
                worst_rows = max(worst_rows, float((a0 - sign * ref_a).abs().max() / ref_a.abs().max()))
            check("pissa_first_values_are_the_principal_triplets", worst_ba < 1e-4 and worst_rows < 1e-4,
                  "s B0 A0 vs torch's rank-%d SVD: %.3g, A0 rows %.3g" % (r, worst_ba, worst_rows))

            ad = load_file(os.path.join(out0, "adapter_model.safetensors"))
            check("pissa_at_rate_0_saves_the_start", sorted(ad) == sorted(init) and all(torch.equal(ad[k], init[k]) for k in ad),
                  str(sorted(ad)))
            conf = json.load(open(os.path.join(out0, "adapter_config.json")))
            conf0 = json.load(open(os.path.join(out0, "pissa_init", "adapter_config.json")))
            check("pissa_adapter_configs", conf.get("init_lora_weights") == "pissa_niter_16" and conf.get("r") == r and
                  conf0.get("init_lora_weights") is True and conf0.get("r") == r, "%s / %s" % (conf, conf0))
            try:
                e0 = json.load(open(os.path.join(out0, "eval_results.json")))["eval_loss"]
                eb = json.load(open(os.path.join(ev_base.args[ev_base.args.index("--output_dir") + 1], "eval_results.json")))["eval_loss"]
            except (OSError, ValueError, KeyError):
                e0 = eb = None
            check("pissa_start_evaluates_as_the_base", e0 is not None and abs(e0 - eb) <= 1e-5 * abs(eb),
                  "%s vs base %s %s" % (e0, eb, ev_base.stderr[-300:]))
            conv = load_file(os.path.join(out0, "pissa_converted", "adapter_model.safetensors"))
            cconf = json.load(open(os.path.join(out0, "pissa_converted", "adapter_config.json")))
            name = "base_model.model." + QKV % 0
            ok = cconf.get("r") == 2 * r and cconf.get("lora_alpha") == 2 * alpha and cconf.get("init_lora_weights") is True
            ok = ok and torch.equal(conv[name + ".lora_A.weight"], torch.cat([ad[name + ".lora_A.weight"], init[name + ".lora_A.weight"]]))
            ok = ok and torch.equal(conv[name + ".lora_B.weight"], torch.cat([ad[name + ".lora_B.weight"], -init[name + ".lora_B.weight"]], 1))
            check("pissa_converted_is_plain_lora_of_twice_the_rank", ok, str(cconf))

        # --pissa_iter -1 (peft's "pissa", the full SVD's triplets) on singular values with a small
        # gap after the r-th (1.8 then 1.75): 16 iterations stop short of torch.linalg.svd's triplets,
        # iterating until they stop moving reaches them
        gap = {k: v.clone() for k, v in params.items()}
        for l in range(2):
            u, _ = torch.linalg.qr(torch.randn(96, 32, generator=g, dtype=torch.float64))
            v, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
            sg = torch.tensor([2 - 0.05 * k for k in range(32)], dtype=torch.float64)
            gap[QKV % l + ".weight"] = (u @ torch.diag(sg) @ v.T).float()
        gdir = os.path.join(tmp, "gap_base")
        glm_ref.save_model_dir(gdir, cfg, gap)
        errs = {}
        for it in ("16", "-1"):
            og = os.path.join(tmp, "gap_" + it)
            q = run(["train", "--output_dir", og, "--pissa_init", "--pissa_iter", it, "--max_steps", "1", "--learning_rate", "0",
                     "--save_strategy", "no"] + common + ["--model_name_or_path", gdir, "--tokenizer_name", base])
            errs[it] = None
            if q.returncode == 0:
                ig = load_file(os.path.join(og, "pissa_init", "adapter_model.safetensors"))
                e = 0.0
                for l in range(2):
                    U, S, Vh = torch.linalg.svd(gap[QKV % l + ".weight"].double(), full_matrices=False)
                    ref_ba = U[:, :r] @ torch.diag(S[:r]) @ Vh[:r]
                    ba = scaling * ig["base_model.model." + QKV % l + ".lora_B.weight"].double() @ \
                        ig["base_model.model." + QKV % l + ".lora_A.weight"].double()
                    e = max(e, float((ba - ref_ba).abs().max() / ref_ba.abs().max()))
                errs[it] = e
            else:
                print(q.stderr[-400:])
        check("pissa_iter_minus_1_reaches_the_full_svd", errs["-1"] is not None and errs["-1"] < 1e-4 and
              errs["16"] is not None and errs["16"] > 1e-3, "rank-%d error: 16 iterations %s, -1 %s" % (r, errs["16"], errs["-1"]))
        print("  rank-%d error against torch.linalg.svd: 16 iterations %s, -1 %s" % (r, errs["16"], errs["-1"]))

        # QPiSSA: on a quantized base the SVD splits the float weights (read again from the files)
        # and the residual is what gets quantized: the same start as the float run's, and (every
        # module adapted: its principal part leaves the quantized weight) the model at rate 0
        # closer to the float base than the quantized base alone
        def eval_of(d):
            try:
                return json.load(open(os.path.join(d, "eval_results.json")))["eval_loss"]
            except (OSError, ValueError, KeyError):
                return None
        outq, outf = os.path.join(tmp, "qpissa_lr0"), os.path.join(tmp, "pissa_all_lr0")
        lr0 = ["--pissa_init", "--max_steps", "1", "--learning_rate", "0", "--save_steps", "100", "--validation_file", data,
               "--do_eval", "--lora_target", "all"]
        pq = run(["train", "--output_dir", outq, "--quantization_bit", "4"] + lr0 + common)
        pf = run(["train", "--output_dir", outf] + lr0 + common)
        q4 = os.path.join(tmp, "ev_int4")
        pb = run(["train", "--output_dir", q4, "--quantization_bit", "4", "--do_train", "false", "--do_eval",
                  "--validation_file", data] + common)
        ok = pq.returncode == 0 and pf.returncode == 0
        if ok:
            iq = load_file(os.path.join(outq, "pissa_init", "adapter_model.safetensors"))
            i0 = load_file(os.path.join(outf, "pissa_init", "adapter_model.safetensors"))
            ok = sorted(iq) == sorted(i0) and len(iq) == 16 and all(torch.equal(iq[k], i0[k]) for k in iq)
        check("qpissa_start_is_the_float_weights_start", ok, (pq.stderr + pf.stderr)[-400:])
        eq, e4, ef = eval_of(outq), eval_of(q4), eval_of(outf)
        # what is quantized is the float residual W - s B0 A0: a float folder holding that residual
        # (made by torch from the run's first values), quantized as it loads with the first values
        # as a plain LoRA beside it, evaluates as the QPiSSA run
        eres = None
        if ok:
            res = {k: v.clone() for k, v in params.items()}
            for k in i0:
                if k.endswith(".lora_A.weight"):
                    n = k[len("base_model.model."):-len(".lora_A.weight")]
                    b0, a0 = i0[k.replace("lora_A", "lora_B")].double(), i0[k].double()
                    res[n + ".weight"] = (res[n + ".weight"].double() - scaling * b0 @ a0).float()
            rdir = os.path.join(tmp, "residual_base")
            glm_ref.save_model_dir(rdir, cfg, res)
            er = run(["train", "--output_dir", os.path.join(tmp, "ev_residual"), "--quantization_bit", "4", "--do_train", "false",
                      "--do_eval", "--validation_file", data, "--adapter_name_or_path", os.path.join(outf, "pissa_init")]
                     + common[2:] + ["--model_name_or_path", rdir, "--tokenizer_name", base])
            eres = eval_of(os.path.join(tmp, "ev_residual"))
        check("qpissa_quantizes_the_float_residual", None not in (eq, eres, e4) and abs(eq - eres) <= 1e-6 * abs(eres) and
              abs(eq - e4) > 1e-6 * abs(e4), "QPiSSA %s, quantized torch residual %s, INT4 base %s, float %s" % (eq, eres, e4, ef))
        evq = run(["train", "--output_dir", os.path.join(tmp, "ev_qpissa"), "--quantization_bit", "4", "--do_train", "false",
                   "--do_eval", "--validation_file", data, "--adapter_name_or_path", outq, "--lora_target", "all"] + common)
        check("qpissa_folder_evaluates_as_its_run", eval_of(os.path.join(tmp, "ev_qpissa")) == eq and eq is not None,
              "%s vs %s %s" % (eval_of(os.path.join(tmp, "ev_qpissa")), eq, evq.stderr[-300:]))

        # 2. trained: the PiSSA folder, its converted form and the torch reference agree
        out = os.path.join(tmp, "pissa_run")
        p = run(["train", "--output_dir", out, "--pissa_init", "--pissa_convert", "--max_steps", "4", "--learning_rate", "1e-1",
                 "--save_steps", "2"] + common)
        if check("pissa_trains", p.returncode == 0, p.stderr[-600:]):
            conv = load_file(os.path.join(out, "pissa_converted", "adapter_model.safetensors"))
            ref = {k: v.clone() for k, v in params.items()}
            for l in range(2):
                n = QKV % l
                a, b = conv["base_model.model." + n + ".lora_A.weight"], conv["base_model.model." + n + ".lora_B.weight"]
                ref[n + ".weight"] = ref[n + ".weight"] + ((2 * alpha) / (2 * r)) * (b.double() @ a.double()).float()
            prompt = "写一首关于春天的诗"

            def greedy(extra):
                q = run(["generate", "--model_name_or_path", base, "--prompt", prompt, "--do_sample", "false", "--device", "cpu",
                         "--repetition_penalty", str(PENALTY), "--max_new_tokens", "12", "--debug"] + extra)
                return q, debug_ids(q.stderr, "prompt").get(0), debug_ids(q.stderr, "response").get(0)
            q1, pin, raw = greedy(["--adapter", out])
            q2, _, cv = greedy(["--adapter", os.path.join(out, "pissa_converted")])
            _, _, plain = greedy([])
            want, gap = torch_greedy(cfg, ref, pin, 12) if pin else (None, 0)
            check("pissa_folder_generates_as_its_converted_form_and_the_reference",
                  raw is not None and raw == cv == want and gap > 1e-4 and raw != plain,
                  "pissa %s, converted %s, torch %s (gap %.2g), base %s %s" % (raw, cv, want, gap, plain, (q1.stderr + q2.stderr)[-300:]))
            m1, m2 = os.path.join(tmp, "merged_pissa"), os.path.join(tmp, "merged_conv")
            p1 = run(["merge", "--model_name_or_path", base, "--adapter", out, "--output_dir", m1, "--dtype", "float32"])
            p2 = run(["merge", "--model_name_or_path", base, "--adapter", os.path.join(out, "pissa_converted"), "--output_dir", m2,
                      "--dtype", "float32"])
            worst = 1.0
            if p1.returncode == 0 and p2.returncode == 0:
                g1, g2 = load_file(os.path.join(m1, "model.safetensors")), load_file(os.path.join(m2, "model.safetensors"))
                worst = max(float((g1[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ref)
                worst = max(worst, max(float((g1[k] - g2[k]).abs().max() / g2[k].abs().max()) for k in g2))
            check("pissa_merge_equals_converted_merge_and_reference", worst < 1e-5, "%.3g %s" % (worst, (p1.stderr + p2.stderr)[-300:]))
            man = json.load(open(os.path.join(out, "checkpoint-2", "checksums.json")))["files"]
            check("pissa_checkpoint_seals_its_first_values", "pissa_init/adapter_model.safetensors" in man and
                  "pissa_init/adapter_config.json" in man, str(sorted(man)))

            # resume: the checkpoint's start, not a new one
            def losses(d):
                st = json.load(open(os.path.join(d, "checkpoint-4", "trainer_state.json")))
                return [h["loss"] for h in st["log_history"] if "loss" in h]
            before = losses(out)
            rs = run(["train", "--output_dir", out, "--pissa_init", "--max_steps", "4", "--learning_rate", "1e-1",
                      "--save_steps", "2", "--resume_from_checkpoint", os.path.join(out, "checkpoint-2")] + common)
            check("pissa_resume_is_exact", rs.returncode == 0 and losses(out) == before and len(before) == 4,
                  "%s vs %s %s" % (losses(out) if rs.returncode == 0 else None, before, rs.stderr[-300:]))
            rb = run(["train", "--output_dir", out, "--max_steps", "4", "--learning_rate", "1e-1", "--save_steps", "2",
                      "--resume_from_checkpoint", os.path.join(out, "checkpoint-2")] + common)
            check("resume_pissa_checkpoint_as_plain_lora_refused", rb.returncode != 0 and "PiSSA adapter" in rb.stderr and
                  "a LoRA adapter" in rb.stderr, rb.stderr[-300:])
            f = os.path.join(out, "checkpoint-2", "pissa_init", "adapter_model.safetensors")
            data_bytes = bytearray(open(f, "rb").read())
            data_bytes[-5] ^= 0xFF
            open(f, "wb").write(bytes(data_bytes))
            rd = run(["train", "--output_dir", out, "--pissa_init", "--max_steps", "4", "--learning_rate", "1e-1",
                      "--save_steps", "2", "--resume_from_checkpoint", os.path.join(out, "checkpoint-2")] + common)
            check("pissa_damaged_first_values_refused", rd.returncode != 0 and "pissa_init/adapter_model.safetensors" in rd.stderr,
                  rd.stderr[-300:])

            # --load_best_model_at_end loads a checkpoint of this run into a base that is its residual
            # already: the evaluation after training is the best checkpoint's
            outb = os.path.join(tmp, "pissa_best")
            pb = run(["train", "--output_dir", outb, "--pissa_init", "--max_steps", "4", "--learning_rate", "1e-1",
                      "--save_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2", "--load_best_model_at_end",
                      "--validation_file", data, "--do_eval"] + common)
            try:
                hist = json.load(open(os.path.join(outb, "checkpoint-4", "trainer_state.json")))["log_history"]
                best = min(h["eval_loss"] for h in hist if "eval_loss" in h)
                final = json.load(open(os.path.join(outb, "eval_results.json")))["eval_loss"]
            except (OSError, ValueError, KeyError):
                best = final = None
            check("pissa_load_best_evaluates_the_best_checkpoint", pb.returncode == 0 and best is not None and
                  abs(final - best) <= 1e-6 * abs(best), "final %s, best %s %s" % (final, best, pb.stderr[-300:]))
            # a PiSSA folder without its first values, and serve
            bare = os.path.join(tmp, "pissa_bare")
            shutil.copytree(out, bare, ignore=shutil.ignore_patterns("pissa_init", "checkpoint-*", "pissa_converted"))
            q, _, _ = greedy(["--adapter", bare])
            check("pissa_folder_without_first_values_refused", q.returncode != 0 and "pissa_init" in q.stderr and
                  "pissa_converted" in q.stderr, q.stderr[-300:])
            q = subprocess.run([GLM, "serve", "--model_name_or_path", base, "--adapter", "x=" + out, "--port", "0", "--device", "cpu"],
                               capture_output=True, text=True, timeout=120)
            check("serve_pissa_adapter_refused", q.returncode != 0 and "PiSSA" in q.stderr and "pissa_converted" in q.stderr,
                  q.stderr[-300:])
            for start in ("olora", "loftq", "something"):
                d = os.path.join(tmp, "adapter_" + start)
                shutil.copytree(os.path.join(out, "pissa_converted"), d)
                c = json.load(open(os.path.join(d, "adapter_config.json")))
                c["init_lora_weights"] = start
                json.dump(c, open(os.path.join(d, "adapter_config.json"), "w"))
                q, _, _ = greedy(["--adapter", d])
                check("adapter_init_%s_refused" % start, q.returncode != 0 and "init_lora_weights" in q.stderr and
                      start in q.stderr and "path_initial_model_for_weight_conversion" in q.stderr, q.stderr[-300:])

        # 3. what PiSSA does not start on
        lora = os.path.join(tmp, "pissa_run")
        for name, flags, msgs in (
                ("bad_iter", ["--pissa_init", "--pissa_iter", "-2"], ["--pissa_iter -2", "full SVD"]),
                ("freeze", ["--pissa_init", "--finetuning_type", "freeze"], ["pissa_init", "some layers"]),
                ("convert_alone", ["--pissa_convert"], ["--pissa_convert", "--pissa_init"]),
                ("dora", ["--pissa_init", "--use_dora"], ["--use_dora"]),
                ("on_an_adapter", ["--pissa_init", "--adapter_name_or_path", lora], ["--pissa_init starts a new adapter"])):
            q = run(["train", "--output_dir", os.path.join(tmp, "bad_" + name), "--max_steps", "1"] + common + flags)
            check("pissa_%s_refused" % name, q.returncode != 0 and all(m in q.stderr for m in msgs) and "hint:" in q.stderr,
                  q.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
