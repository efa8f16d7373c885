#!/usr/bin/env python3
"""Pipeline parallelism through `glmtrain train` on CPU ranks under mpirun (OpenMPI), with the
tiny GLM and tokenizer of test_train.py (4 layers here, tied head):
  - P=2 and P=2 x D=2 (ZeRO-2) reproduce the single-process loss curve within 1e-6 relative
    over 20 steps; so does P=3 with the thudm map (its stage 0 holds only the embedding);
  - LoRA (with dropout and NEFTune's noise), freeze and P-Tuning v2 over P=2 follow one process;
  - checkpoints resume across P: P=2 -> one process, one process -> P=2 x D=2 (ZeRO-1),
    P=2 x D=2 -> P=3; the final model is one HF folder (shards + index) that a single process
    reads back;
  - 8-bit AdamW over P=2 tracks one process's 8-bit run, and its checkpoint resumes on P=2 bit
    for bit (each stage's codes kept) and on one process near the curve;
  - invalid device maps are rejected naming the module; --max_memory_per_gpu refuses P=1 when
    its plan (glmtrain info) is over the cap and lets P=2 train.
Prints PASS/FAIL/SKIP lines; SKIP when mpirun or an MPI build is missing."""
import json, os, re, shutil, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train as T

from mpi_runs import losses, probe, rel, report, run


def resume_from(d, name, src, args, np):
    out = os.path.join(d, name)
    os.makedirs(out)
    shutil.copytree(os.path.join(src, "checkpoint-10"), os.path.join(out, "checkpoint-10"))
    run(args + ["--output_dir", out, "--resume_from_checkpoint"], np=np)
    return out


def main():
    why = T.parallel_missing()
    if why:
        print("SKIP pipeline_all: " + why)
        return
    d = tempfile.mkdtemp(prefix="glmtrain-pp-")
    try:
        cfg_path, base = T.parallel_setup(d, num_layers=4)
        base += ["--max_steps", "20", "--save_steps", "10", "--gradient_accumulation_steps", "2"]
        b4, b2 = ["--per_device_train_batch_size", "4"], ["--per_device_train_batch_size", "2"]

        if not probe(base + b4 + ["--output_dir", os.path.join(d, "probe"), "--max_steps", "1", "--save_strategy", "no",
                                  "--pipeline_parallel_size", "2"], "pipeline_all", "2-stage probe"):
            return

        # 1. the single-process curve, P=2, P=2 x D=2 with ZeRO-2, P=3 (thudm: stage 0 only embeds)
        ref = os.path.join(d, "ref")
        run(base + b4 + ["--output_dir", ref])
        full = losses(ref)
        layouts = [("p2", 2, b4 + ["--pipeline_parallel_size", "2"]),
                   ("p2_x_dp2_zero2", 4, b2 + ["--pipeline_parallel_size", "2", "--zero_stage", "2", "--bucket_size_mb", "0.02"]),
                   ("p3_thudm", 3, b4 + ["--pipeline_parallel_size", "3", "--device_map", "thudm"])]
        outs = {}
        for name, np_, extra in layouts:
            out = outs[name] = os.path.join(d, name)
            p = run(base + extra + ["--output_dir", out], np=np_)
            err, n = rel(losses(out), full)
            report("pipeline_%s_matches_single_process" % name, n == 20 and err < 1e-6,
                   "max relative loss difference %.2e over %d steps" % (err, n))
        report("pipeline_logs_stages_and_bubble", "stage 0: word_embeddings\n" in p.stderr and "bubble" in p.stderr,
               p.stderr[-400:])

        # 2. the final model is one folder: shards + index, read by a single process
        out = outs["p2"]
        ok = all(os.path.exists(os.path.join(out, f)) for f in
                 ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "config.json", "ice_text.model"])
        wm = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"] if ok else {}
        ok = ok and len(wm) == 4 * 12 + 3 and "lm_head.weight" not in wm
        gen = run(["--model_name_or_path", out, "--prompt", "写一句关于春的诗", "--max_new_tokens", "4"], check=False,
                  cmd="generate")
        report("pipeline_final_model_is_one_hf_folder", ok and gen.returncode == 0,
               "%d index entries; generate exit %d %s" % (len(wm), gen.returncode, gen.stderr[-300:]))

        # 3. resume across layouts (steps 11-20 on the uninterrupted curve)
        for name, src, np_, extra in [("p2_to_single", outs["p2"], 1, b4),
                                      ("single_to_p2_x_dp2_zero1", ref, 4, b2 + ["--pipeline_parallel_size", "2", "--zero_stage", "1"]),
                                      ("p2_x_dp2_to_p3", outs["p2_x_dp2_zero2"], 3, b4 + ["--pipeline_parallel_size", "3"])]:
            o = resume_from(d, "resume_" + name, src, base + extra, np_)
            err, n = rel(losses(o), full, after=10)
            report("pipeline_resume_%s" % name, n == 10 and err < 1e-6,
                   "steps 11-20: max relative loss difference %.2e over %d steps" % (err, n))

        # 4. invalid maps are rejected naming the module
        bad = {"missing": ({"transformer.word_embeddings": 0, "transformer.layers.0": 0, "transformer.layers.1": 0,
                            "transformer.layers.3": 1, "transformer.final_layernorm": 1}, "transformer.layers.2 is missing"),
               "out_of_order": ({"transformer.word_embeddings": 0, "transformer.layers.0": 1, "transformer.layers.1": 0,
                                 "transformer.layers.2": 1, "transformer.layers.3": 1, "transformer.final_layernorm": 1},
                                "transformer.layers.1 on stage 0 comes after transformer.layers.0 on stage 1")}
        for name, (m, needle) in bad.items():
            path = os.path.join(d, "map_%s.json" % name)
            json.dump(m, open(path, "w"))
            p = run(base + b4 + ["--output_dir", os.path.join(d, "bad_" + name), "--device_map", path], check=False)
            report("pipeline_rejects_map_%s" % name, p.returncode != 0 and needle in p.stderr, p.stderr.strip()[-300:])

        # 5. --max_memory_per_gpu: between the P=1 and P=2 plans, P=1 is refused and P=2 trains
        def plan(P):
            p = run(["--init_from_config", cfg_path, "--per_device_train_batch_size", "4", "--max_source_length", "32",
                     "--max_target_length", "16", "--gradient_accumulation_steps", "2", "--pipeline_parallel_size", str(P),
                     "--max_memory_per_gpu", "1TB"], cmd="info")
            rows = re.findall(r"^\s+\d+\s+(?:[\d.]+\s+){6}([\d.]+)$", p.stdout, re.M)
            assert "(MiB)" in p.stdout and rows, p.stdout
            return max(float(r) for r in rows)
        p1, p2 = plan(1), plan(2)
        cap = "%dKiB" % int((p1 + p2) / 2 * 1024)
        r1 = run(base + b4 + ["--output_dir", os.path.join(d, "cap1"), "--max_memory_per_gpu", cap], check=False)
        r2 = run(base + b4 + ["--output_dir", os.path.join(d, "cap2"), "--max_memory_per_gpu", cap, "--max_steps", "2",
                              "--pipeline_parallel_size", "2"], np=2, check=False)
        report("pipeline_memory_cap_refuses_p1_trains_p2",
               p2 < p1 and r1.returncode != 0 and "the model plans" in r1.stderr and "--pipeline_parallel_size 2" in r1.stderr
               and r2.returncode == 0, "plans %.3f / %.3f MiB, cap %s: %s | %s" % (p1, p2, cap, r1.stderr.strip()[-200:],
                                                                                     r2.stderr.strip()[-200:]))
        # 4. LoRA over pipeline stages (dropout 0.05 and NEFTune's noise on: micro-batch masks and
        # noise as one process draws them): the same curve as one process, peft's adapter files
        # out, resume on 2 stages
        lb = base + b4 + ["--finetuning_type", "lora", "--lora_target", "all", "--learning_rate", "1e-2",
                          "--neftune_noise_alpha", "5"]
        lref = os.path.join(d, "lora_ref")
        run(lb + ["--output_dir", lref])
        lp2 = os.path.join(d, "lora_p2")
        run(lb + ["--output_dir", lp2, "--pipeline_parallel_size", "2"], np=2)
        err, n = rel(losses(lp2), losses(lref))
        report("pipeline_lora_p2_matches_single_process", n == 20 and err < 1e-6,
               "max relative loss difference %.2e over %d steps" % (err, n))
        from safetensors.torch import load_file
        a = load_file(os.path.join(lp2, "adapter_model.safetensors")) if os.path.exists(os.path.join(lp2, "adapter_model.safetensors")) else {}
        b = load_file(os.path.join(lref, "adapter_model.safetensors"))
        same = sorted(a) == sorted(b) and all(torch_equal(a[k], b[k]) for k in b)
        report("pipeline_lora_p2_writes_peft_adapter", same and os.path.exists(os.path.join(lp2, "adapter_config.json"))
               and not any(f.startswith("model-") for f in os.listdir(lp2)),
               "%d adapter tensors (one process: %d), files %s" % (len(a), len(b), sorted(os.listdir(lp2))))
        lres = resume_from(d, "lora_resumed", lp2, lb + ["--pipeline_parallel_size", "2"], 2)
        err, n = rel(losses(lres), losses(lref), after=10)
        report("pipeline_lora_p2_resumes_on_the_curve", n == 10 and err < 1e-6,
               "max relative loss difference %.2e over steps 11-20" % err)
        # 4c. a new adapter on a merged one (LLaMA-Factory's --create_new_adapter) over stages: each
        # stage merges its layers' rows as it loads, the same curve as one process
        assert base[0] == "--init_from_config"
        cn = ["--model_name_or_path", ref] + base[2:] + b4 + ["--adapter_name_or_path", lref, "--create_new_adapter",
                                                              "--finetuning_type", "lora", "--learning_rate", "1e-2"]
        c1, c2 = os.path.join(d, "create_new_ref"), os.path.join(d, "create_new_p2")
        run(cn + ["--output_dir", c1])
        p = run(cn + ["--output_dir", c2, "--pipeline_parallel_size", "2"], np=2)
        err, n = rel(losses(c2), losses(c1))
        report("pipeline_create_new_adapter_p2_matches_single_process", n == 20 and err < 1e-6 and
               "merged into the base as it loads" in p.stderr, "max relative loss difference %.2e over %d steps" % (err, n))
        # 4b. 8-bit AdamW over stages: each stage's moments in 8 bits (blocks cut per unit, as one
        # process cuts them). With an untied head the stages' gradients are one process's bit for
        # bit, so the 8-bit curve is too (a tied head sums its two copies' gradients in another
        # order, and 8-bit codes then round apart). A P=2 checkpoint keeps each stage's codes
        # (optimizer_8bit-0000K-of-00002) and resumes on P=2 bit for bit; on one process (another
        # layout) it resumes from the fp32 moments, near the curve
        cu = json.load(open(cfg_path))
        cu["tie_word_embeddings"] = False
        cfg_untied = os.path.join(d, "config_untied.json")
        json.dump(cu, open(cfg_untied, "w"))
        qb = [cfg_untied if x == cfg_path else x for x in base] + b4 + ["--optim", "adamw_8bit"]
        q1 = os.path.join(d, "q8_ref")
        run(qb + ["--output_dir", q1])
        q2 = os.path.join(d, "q8_p2")
        run(qb + ["--output_dir", q2, "--pipeline_parallel_size", "2"], np=2)
        a_, b_ = losses(q2), losses(q1)
        report("pipeline_adamw8_p2_equals_single_process", len(a_) == 20 and a_ == b_,
               "20 losses identical (untied head)" if a_ == b_ else "max relative difference %.2e" % rel(a_, b_)[0])
        ck = os.path.join(q2, "checkpoint-10")
        files = sorted(f for f in os.listdir(ck) if f.startswith("optimizer_8bit")) if os.path.isdir(ck) else []
        report("pipeline_adamw8_checkpoint_keeps_each_stage_codes",
               files == ["optimizer_8bit-00001-of-00002.safetensors", "optimizer_8bit-00002-of-00002.safetensors"], str(files))
        qres = resume_from(d, "q8_p2_resumed", q2, qb + ["--pipeline_parallel_size", "2"], 2)
        a_, b_ = losses(qres), losses(q2)
        report("pipeline_adamw8_p2_resumes_bit_for_bit", all(a_.get(k) == b_[k] for k in range(11, 21)),
               "steps 11-20: %s" % ("identical" if all(a_.get(k) == b_[k] for k in range(11, 21)) else "%s vs %s" % (a_, b_)))
        qd = os.path.join(d, "q8_p2_x_dp2")  # the stages' replicas shard the 8-bit state (ZeRO-1)
        qd_args = [x if x != "4" or i != qb.index("--per_device_train_batch_size") + 1 else "2" for i, x in enumerate(qb)]
        qd_args += ["--pipeline_parallel_size", "2", "--zero_stage", "1"]
        run(qd_args + ["--output_dir", qd], np=4)
        qdr = resume_from(d, "q8_p2_x_dp2_resumed", qd, qd_args, 4)
        a_, b_ = losses(qdr), losses(qd)
        report("pipeline_adamw8_p2_x_dp2_zero1_resumes_bit_for_bit", all(a_.get(k) == b_[k] for k in range(11, 21)),
               "steps 11-20 %s" % ("identical" if all(a_.get(k) == b_[k] for k in range(11, 21)) else "differ: %s vs %s" % (a_, b_)))
        q21 = resume_from(d, "q8_p2_on_one", q2, qb, 1)
        err, n = rel(losses(q21), losses(q2), after=10)
        report("pipeline_adamw8_p2_resumes_on_one_process_near_the_curve", n == 10 and err < 0.02,
               "steps 11-20: max relative loss difference %.2e (from the fp32 moments)" % err)
        # 5. freeze over stages: the same curve, and the final folder is the whole model (every
        # stage's frozen rows too) with the weights one process writes; the word embedding trains
        # too (LLaMA-Factory's freeze_extra_modules), tied to the head: the first and last stages'
        # copies get their gradients summed
        fb = base + b4 + ["--finetuning_type", "freeze", "--num_layer_trainable", "1", "--freeze_extra_modules",
                          "word_embeddings"]
        fref, fp2 = os.path.join(d, "freeze_ref"), os.path.join(d, "freeze_p2")
        run(fb + ["--output_dir", fref])
        run(fb + ["--output_dir", fp2, "--pipeline_parallel_size", "2"], np=2)
        err, n = rel(losses(fp2), losses(fref))
        report("pipeline_freeze_p2_matches_single_process", n == 20 and err < 1e-6,
               "max relative loss difference %.2e over %d steps" % (err, n))

        def weights(folder):
            out = {}
            for f in os.listdir(folder):
                if f.startswith("model") and f.endswith(".safetensors"):
                    out.update(load_file(os.path.join(folder, f)))
            return out
        wa, wb = weights(fp2), weights(fref)
        # one process writes the original's layout (its rotary buffers and the tied lm_head copy too)
        wb = {k: v for k, v in wb.items() if "inv_freq" not in k and k != "lm_head.weight"}
        # the frozen rows bit for bit; the trained ones (the last layer, the embedding whose two
        # stages' gradients add in another order than one process's) within 1e-4 after 20 AdamW
        # steps, whose normalised updates carry such rounding on (a head gradient left out of the
        # sum moves the loss curve above, far past its 1e-6)
        last = max(int(k.split(".")[2]) for k in wb if k.startswith("transformer.layers."))
        trained = [k for k in wb if "word_embeddings" in k or k.startswith("transformer.layers.%d." % last)]
        worst, wname = max((((wa[k].double() - wb[k].double()).abs().max() / wb[k].double().abs().max()).item(), k)
                           for k in trained if k in wa) if set(wa) == set(wb) else (float("inf"), "")
        same = sorted(wa) == sorted(wb) and all(torch_equal(wa[k], wb[k]) for k in wb if k not in trained)
        report("pipeline_freeze_p2_final_model_is_whole", same and worst < 1e-4,
               "%d tensors from the stages, %d from one process (without its buffers): %d frozen identical, %d trained "
               "within rel %.1e (worst %s)" % (len(wa), len(wb), len(wb) - len(trained), len(trained), worst, wname))
        # 6. P-Tuning v2 over stages (each stage runs a copy of the prefix encoder for its layers, the
        # copies' gradients summed), with and without the projection, prefix dropout on: the same
        # curve and the same THUDM-layout prefix as one process, and a resume on the curve
        for proj in (False, True):
            tag = "_proj" if proj else ""
            pb = base + b4 + ["--finetuning_type", "ptuning", "--pre_seq_len", "4", "--learning_rate", "1e-2"] + \
                (["--prefix_projection"] if proj else [])
            pref, pp2 = os.path.join(d, "pt_ref" + tag), os.path.join(d, "pt_p2" + tag)
            run(pb + ["--output_dir", pref])
            run(pb + ["--output_dir", pp2, "--pipeline_parallel_size", "2"], np=2)
            err, n = rel(losses(pp2), losses(pref))
            report("pipeline_ptuning%s_p2_matches_single_process" % tag, n == 20 and err < 1e-6,
                   "max relative loss difference %.2e over %d steps" % (err, n))
            wa, wb = weights(pp2), weights(pref)
            # with the projection each stage backpropagates its layers' share through the encoder
            # and the shares are summed: the same gradient in another order (rounding only)
            worst = max(((wa[k] - wb[k]).abs().max() / wb[k].abs().max().clamp(min=1e-30)).item() for k in wb) \
                if sorted(wa) == sorted(wb) and wb else float("inf")
            report("pipeline_ptuning%s_p2_writes_the_prefix" % tag, worst <= (1e-5 if proj else 0.0),
                   "%d prefix tensors (one process: %d), worst relative difference %.2e, files %s" %
                   (len(wa), len(wb), worst, sorted(f for f in os.listdir(pp2) if "." in f)))
        # with data parallelism inside each stage too (2 stages x 2 replicas, ZeRO-1; prefix dropout 0,
        # since the replicas draw their own masks)
        pt0 = base + ["--finetuning_type", "ptuning", "--pre_seq_len", "4", "--learning_rate", "1e-2", "--prefix_dropout", "0"]
        pr0, pd = os.path.join(d, "pt_ref0"), os.path.join(d, "pt_p2_x_dp2")
        run(pt0 + b4 + ["--output_dir", pr0])
        run(pt0 + b2 + ["--output_dir", pd, "--pipeline_parallel_size", "2", "--zero_stage", "1"], np=4)
        err, n = rel(losses(pd), losses(pr0))
        report("pipeline_ptuning_p2_x_dp2_zero1_matches_single_process", n == 20 and err < 1e-6,
               "max relative loss difference %.2e over %d steps" % (err, n))
        pres = resume_from(d, "pt_resumed", os.path.join(d, "pt_p2"), base + b4 + ["--finetuning_type", "ptuning",
                           "--pre_seq_len", "4", "--learning_rate", "1e-2", "--pipeline_parallel_size", "2"], 2)
        err, n = rel(losses(pres), losses(os.path.join(d, "pt_ref")), after=10)
        report("pipeline_ptuning_p2_resumes_on_the_curve", n == 10 and err < 1e-6,
               "max relative loss difference %.2e over steps 11-20" % err)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def torch_equal(x, y):
    import torch
    return torch.equal(x, y)


if __name__ == "__main__":
    import mpi_runs
    mpi_runs.main_of("test_pipeline", main)
