#!/usr/bin/env python3
"""Where the optimizer state lives and when it steps, end to end with the tiny GLM of
test_train.py on the CPU backend (fp32):
  - --offload_optimizer cpu equals the on-device AdamW bit for bit (losses and final weights),
    with accumulation and clipping, and resumes on the same curve;
  - --optimizer_in_backward equals the normal step bit for bit (both with --max_grad_norm 0),
    with and without offload, with and without gradient checkpointing;
  - --optim adamw_8bit tracks fp32 AdamW (stated tolerance), offloaded equals on-device bit for
    bit, and a checkpoint resumes it on the same curve bit for bit;
  - on 2 CPU ranks (mpirun): ZeRO-1 and ZeRO-2 with offload equal 1 rank; 8-bit ZeRO-1 on 2 ranks
    tracks 8-bit on 1 (its blocks are cut per shard, so not bit for bit);
  - the refusals: --optimizer_in_backward with accumulation, with clipping, with fp16; an unknown
    --optim; --offload_optimizer with ZeRO-0 on 2 ranks.
Prints PASS/FAIL/SKIP lines."""
import json, os, re, shutil, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_train as T
from mpi_runs import losses, probe, rel, report, run, st_read


def weights(out):
    """The tensors of out/model.safetensors (the final model): F32 as flat lists, others as bytes."""
    return st_read(os.path.join(out, "model.safetensors"), others=True)


def curve(out, last):
    return losses(out, last)


def resumed(d, src, name, args, np=1):
    """A run that resumes from src's checkpoint-10 (copied into d/name) with args; its folder."""
    x = os.path.join(d, name)
    shutil.copytree(os.path.join(src, "checkpoint-10"), os.path.join(x, "checkpoint-10"))
    run(args + ["--output_dir", x, "--resume_from_checkpoint"], np=np)
    return x


def worst_after_resume(c, ref):
    """The largest relative loss gap over steps 11-20 (after a resume at step 10)."""
    return max(abs(c[s] - ref[s]) / ref[s] for s in range(11, 21))


def main():
    why = T.parallel_missing() if shutil.which("mpirun") else None
    if not os.path.exists(T.GLM) or not shutil.which("spm_train"):
        print("SKIP optim_modes: glmtrain or spm_train missing")
        return
    d = tempfile.mkdtemp(prefix="glmtrain-optim-")
    try:
        cfg, base = T.parallel_setup(d)
        base = base + ["--per_device_train_batch_size", "4", "--save_steps", "10", "--max_steps", "20"]

        def go(name, extra, np_=1, check=True):
            out = os.path.join(d, name)
            p = run(base + ["--output_dir", out] + extra, np=np_, check=check)
            return out, p

        # 1. offload == on device: bit for bit with clipping; with accumulation the gradient sums are
        # made another way (each micro-batch's gradients added on the host to the earlier ones',
        # where backward adds into the buffer inside its products), so within rounding
        clip = ["--max_grad_norm", "0.5"]
        ref1, _ = go("ref1", clip)
        off1, _ = go("off1", clip + ["--offload_optimizer", "cpu"])
        a1, b1 = curve(ref1, 20), curve(off1, 20)
        report("offload_equals_device_losses", a1 == b1 and len(a1) == 20, "max rel %.3g over %d steps" % rel(b1, a1))
        report("offload_equals_device_weights", weights(ref1) == weights(off1), "final model.safetensors")
        acc = ["--gradient_accumulation_steps", "2", "--max_grad_norm", "0.5"]
        ref, _ = go("ref", acc)
        off, _ = go("off", acc + ["--offload_optimizer", "cpu"])
        a, b = curve(ref, 20), curve(off, 20)
        worst, n = rel(b, a)
        report("offload_accumulation_tracks_device", n == 20 and worst < 1e-6, "max rel %.3g over %d steps" % (worst, n))
        # resume the offloaded run from step 10 on the same curve
        res = os.path.join(d, "off_resume")
        shutil.copytree(os.path.join(off, "checkpoint-10"), os.path.join(res, "checkpoint-10"))
        shutil.copy(os.path.join(off, "run_id.txt"), res) if os.path.exists(os.path.join(off, "run_id.txt")) else None
        run(base + ["--output_dir", res, "--resume_from_checkpoint"] + acc + ["--offload_optimizer", "cpu"])
        c = curve(res, 20)
        report("offload_resume_same_curve", all(c[s] == b[s] for s in range(11, 21)) and weights(res) == weights(off),
               "steps 11-20 after resuming at 10")

        # 2. the update inside backward == the normal step (no clipping, no accumulation)
        noclip = ["--max_grad_norm", "0"]
        ref0, _ = go("ref0", noclip)
        r0 = curve(ref0, 20)
        for name, extra in [("ib", []), ("ib_off", ["--offload_optimizer", "cpu"]),
                            ("ib_ckpt", ["--gradient_checkpointing"])]:
            out, _ = go(name, noclip + ["--optimizer_in_backward"] + extra)
            c = curve(out, 20)
            report("in_backward_equals_step_" + name, c == r0 and weights(out) == weights(ref0),
                   "max rel %.3g over %d steps" % rel(c, r0))
        ibres = resumed(d, os.path.join(d, "ib_off"), "ib_resume", base + ["--optimizer_in_backward", "--offload_optimizer", "cpu"] + noclip)
        c = curve(ibres, 20)
        report("in_backward_resume_same_curve", all(c[s] == r0[s] for s in range(11, 21)), "steps 11-20")

        # 3. 8-bit AdamW
        q8, _ = go("q8", ["--optim", "adamw_8bit"] + acc)
        c8 = curve(q8, 20)
        worst, n = rel(c8, a)
        # 8-bit moments change each update by at most half a code step of their block; over 20
        # steps at lr 1e-2 the tiny model's loss stays within a few percent of fp32 AdamW's
        report("adamw8_tracks_fp32", n == 20 and worst < 0.05 and c8[20] < c8[1] * 0.9,
               "max rel %.3g over %d steps; loss %.4f -> %.4f (fp32 %.4f)" % (worst, n, c8[1], c8[20], a[20]))
        report("adamw8_differs_from_fp32", c8 != a, "8-bit states are really used")
        q8c, _ = go("q8_clip", ["--optim", "adamw_8bit"] + clip)
        q8o, _ = go("q8_off", ["--optim", "adamw_bnb_8bit", "--offload_optimizer", "cpu"] + clip)
        report("adamw8_offload_equals_device", curve(q8o, 20) == curve(q8c, 20) and weights(q8o) == weights(q8c), "losses and weights")
        # bitsandbytes' paged optimizers (QLoRA's --optim paged_adamw_32bit / paged_adamw_8bit) update as their twins
        q8p, _ = go("q8_paged", ["--optim", "paged_adamw_8bit"] + clip)
        p32, _ = go("paged32", ["--optim", "paged_adamw_32bit"] + clip)
        report("paged_optimizers_update_as_their_twins", curve(q8p, 20) == curve(q8c, 20) and curve(p32, 20) == a1
               and weights(p32) == weights(ref1), "paged_adamw_8bit vs adamw_8bit, paged_adamw_32bit vs adamw_torch")
        q8ib, _ = go("q8_ib", ["--optim", "adamw_8bit", "--optimizer_in_backward"] + noclip)
        q8n, _ = go("q8_noclip", ["--optim", "adamw_8bit"] + noclip)
        report("adamw8_in_backward_equals_step", curve(q8ib, 20) == curve(q8n, 20), "losses")
        q8r = resumed(d, q8, "q8_resume", base + ["--optim", "adamw_8bit"] + acc)
        c = curve(q8r, 20)
        report("adamw8_resume_same_curve", all(c[s] == c8[s] for s in range(11, 21)) and weights(q8r) == weights(q8),
               "steps 11-20 after resuming at 10")
        # an fp32 checkpoint continues under 8-bit (the moments quantized), close to the fp32 curve
        x = resumed(d, ref, "fp32_to_q8", base + ["--optim", "adamw_8bit"] + acc)
        c = curve(x, 20)
        worst = max(abs(c[s] - a[s]) / a[s] for s in range(11, 21))
        report("fp32_checkpoint_resumes_as_8bit", worst < 0.05, "max rel %.3g vs the fp32 curve" % worst)

        # 4. the memory plan: ChatGLM-6B on the guide's cards
        six = [T.GLM, "info", "--chatglm6b", "--bf16", "--per_device_train_batch_size", "8", "--max_source_length", "256",
               "--max_target_length", "256", "--max_memory_per_gpu", "24GiB"]
        import subprocess
        out = subprocess.run(six, capture_output=True, text=True).stdout
        report("plan_one_24gb_card_lists_offload", "does not fit" in out and "layouts that fit: --offload_optimizer cpu --gradient_checkpointing" in out
               and "--finetuning_type lora" in out and "--pipeline_parallel_size" in out,
               out.strip().splitlines()[-1][:300] if out.strip() else "")
        out = subprocess.run(six + ["--offload_optimizer", "cpu", "--gradient_checkpointing"], capture_output=True, text=True).stdout
        report("plan_one_24gb_card_offload_fits", "every stage fits in 24GiB" in out and "host memory" in out, out.strip().splitlines()[-1])
        out = subprocess.run(six + ["--data_parallel_size", "4", "--zero_stage", "1"], capture_output=True, text=True).stdout
        report("plan_guide_4x24gb", "--zero_stage 2 --offload_optimizer cpu --gradient_checkpointing (plans 19.9 GiB" in out,
               out.strip().splitlines()[-1][:300])
        # info reads train's own flags: the same words give the same plan with any flag of the run
        # beside them (before, info had its own copy of the flags and refused the others), train's
        # defaults (ZeRO-1 over replicas), and torchrun's --nproc_per_node as the replicas
        four = six + ["--data_parallel_size", "4"]
        rest = ["--learning_rate", "2e-2", "--num_train_epochs", "3", "--output_dir", "/nonexistent/out", "--logging_steps", "5",
                "--lora_alpha", "32", "--report_to", "tensorboard"]
        p0 = subprocess.run(four, capture_output=True, text=True)
        p1 = subprocess.run(four + rest, capture_output=True, text=True)
        report("info_takes_every_train_flag", p0.returncode == 0 and p1.returncode == 0 and p0.stdout == p1.stdout,
               p1.stderr[-300:])
        p2 = subprocess.run(four + ["--zero_stage", "1"], capture_output=True, text=True)
        report("info_defaults_are_trains", p2.returncode == 0 and p2.stdout == p0.stdout and "4 data-parallel replicas" in p0.stdout,
               p0.stdout[-300:])
        p3 = subprocess.run(six + ["--nproc_per_node", "4"], capture_output=True, text=True)
        report("info_nproc_per_node_gives_the_replicas", p3.returncode == 0 and p3.stdout == p0.stdout, p3.stdout[-300:] + p3.stderr[-200:])
        p4 = subprocess.run(six + ["--learning_rate", "x"], capture_output=True, text=True)
        report("info_checks_train_flags_as_train", p4.returncode != 0 and "learning_rate" in p4.stderr, p4.stderr[-200:])
        # a run refused by its plan names the layouts that fit (the tiny model plans 4.23 MiB), and
        # one of them then runs under the same cap
        _, p = go("capped", ["--max_memory_per_gpu", "3500KiB"], check=False)
        txt = p.stdout + p.stderr
        report("cap_refusal_lists_layouts", p.returncode != 0 and "layouts that fit:" in txt and
               "--offload_optimizer cpu --gradient_checkpointing (plans" in txt, txt.strip().splitlines()[-1][:300] if txt.strip() else "")
        _, p = go("capped_ok", ["--max_memory_per_gpu", "3500KiB", "--offload_optimizer", "cpu", "--gradient_checkpointing"], check=False)
        report("cap_suggested_layout_runs", p.returncode == 0, (p.stdout + p.stderr).strip().splitlines()[-1][:200])

        # an offloaded plan that needs more host memory than the node has is refused before anything
        # is allocated (a 280-layer ChatGLM-6B: about 850 GiB of host state)
        huge = json.load(open(cfg))
        huge.update(hidden_size=4096, num_layers=280, num_attention_heads=32, inner_hidden_size=16384, vocab_size=130528)
        hcfg = os.path.join(d, "huge.json")
        json.dump(huge, open(hcfg, "w"))
        hb = list(base)
        hb[hb.index("--init_from_config") + 1] = hcfg
        p = run(hb + ["--output_dir", os.path.join(d, "huge"), "--offload_optimizer", "cpu"], check=False, timeout=60)
        txt = p.stdout + p.stderr
        report("offload_refuses_more_host_memory_than_available", p.returncode != 0 and "of host memory on this node" in txt
               and "is available" in txt and "--optim adamw_8bit" in txt, txt.strip().splitlines()[-2][:200] if txt.strip() else "")
        # and on the CPU backend without offload the whole plan is host memory: refused the same way
        # (the kernel's out-of-memory killer would end it part-way, silently: allocations only reserve)
        p = run(hb + ["--output_dir", os.path.join(d, "huge_cpu")], check=False, timeout=60)
        txt = p.stdout + p.stderr
        report("cpu_run_refuses_more_host_memory_than_available", p.returncode != 0 and "this CPU run plans" in txt
               and "is available" in txt and "--finetuning_type lora" in txt, txt.strip().splitlines()[-2][:200] if txt.strip() else "")

        # 5. refusals
        def refused(name, extra, text, np_=1):
            _, p = go(name, extra, np_=np_, check=False)
            out = p.stdout + p.stderr
            report("refuses_" + name, p.returncode != 0 and text in out, out.strip().splitlines()[-1] if out.strip() else "")
        refused("ib_accumulation", ["--optimizer_in_backward", "--max_grad_norm", "0", "--gradient_accumulation_steps", "2"],
                "cannot take --gradient_accumulation_steps 2")
        refused("ib_clipping", ["--optimizer_in_backward"], "--max_grad_norm 0")
        refused("ib_fp16", ["--optimizer_in_backward", "--max_grad_norm", "0", "--fp16"], "cannot take --fp16")
        refused("unknown_optim", ["--optim", "adafactor"], "--optim adafactor is not an optimizer")
        refused("offload_nvme", ["--offload_optimizer", "nvme"], "choose cpu or none")

        # 6. 2 CPU ranks
        if why:
            print("SKIP optim_modes_mpi: " + why)
            return
        half = [x for x in base]
        i = half.index("--per_device_train_batch_size")
        half[i + 1] = "2"
        def go2(name, extra, check=True):
            out = os.path.join(d, name)
            p = run(half + ["--output_dir", out] + extra, np=2, check=check)
            return out, p
        if not probe(half + ["--output_dir", os.path.join(d, "probe"), "--max_steps", "1", "--save_strategy", "no"],
                     "optim_modes_mpi", "2-rank probe"):
            return
        for z in ("1", "2"):
            out, _ = go2("off_z" + z, acc + ["--offload_optimizer", "cpu", "--zero_stage", z])
            worst, n = rel(curve(out, 20), a)
            report("offload_zero%s_2ranks_equals_1" % z, n == 20 and worst < 1e-6, "max rel %.3g over %d steps" % (worst, n))
        for z in ("1", "2", "3"):
            out, _ = go2("q8_z" + z, acc + ["--optim", "adamw_8bit", "--zero_stage", z])
            worst, n = rel(curve(out, 20), c8)
            report("adamw8_zero%s_2ranks_tracks_1" % z, n == 20 and worst < 0.02, "max rel %.3g over %d steps" % (worst, n))
            # its own checkpoint on the same ranks resumes on its curve exactly (the codes as stored)
            x = resumed(d, out, "q8_z%s_resume" % z, half + ["--optim", "adamw_8bit", "--zero_stage", z] + acc, np=2)
            c, r = curve(x, 20), curve(out, 20)
            report("adamw8_zero%s_resume_same_curve" % z, all(c[s] == r[s] for s in range(11, 21)), "steps 11-20 after resuming at 10")
        # re-sharding between layouts and rank counts: 2 ranks ZeRO-2 offloaded -> 1 rank on the
        # device; 1 rank 8-bit -> 2 ranks ZeRO-1 8-bit (its blocks cut per shard: quantized again)
        x = resumed(d, os.path.join(d, "off_z2"), "z2off_to_1", base + acc)
        worst = worst_after_resume(curve(x, 20), a)
        report("offload_zero2_2ranks_resumes_on_1_device", worst < 1e-6, "max rel %.3g vs the 1-rank curve, steps 11-20" % worst)
        x = resumed(d, q8, "q8_to_2", half + ["--optim", "adamw_8bit", "--zero_stage", "1"] + acc, np=2)
        worst = worst_after_resume(curve(x, 20), c8)
        report("adamw8_1rank_resumes_on_2_ranks", worst < 0.02, "max rel %.3g vs the 1-rank 8-bit curve, steps 11-20" % worst)
        # ZeRO-3: the weights sharded too, each unit gathered when forward or backward needs it
        for name, extra, np_ in [("z3", [], 2), ("z3_ckpt", ["--gradient_checkpointing"], 2), ("z3_off", ["--offload_optimizer", "cpu"], 2),
                                 ("z3_sel", ["--gradient_checkpointing", "selective"], 2), ("z3_4", [], 4)]:
            args = list(half) if np_ == 2 else [x if x != "2" or i != half.index("--per_device_train_batch_size") + 1 else "1"
                                                for i, x in enumerate(half)]
            out = os.path.join(d, name)
            run(args + ["--output_dir", out, "--zero_stage", "3"] + acc + extra, np=np_)
            worst, n = rel(curve(out, 20), a)
            report("zero3_%s_equals_1_rank" % name, n == 20 and worst < 1e-6, "max rel %.3g over %d steps (%d ranks)" % (worst, n, np_))
        x = resumed(d, os.path.join(d, "z3"), "z3_to_1", base + acc)
        worst = worst_after_resume(curve(x, 20), a)
        report("zero3_checkpoint_resumes_on_1_rank", worst < 1e-6, "max rel %.3g, steps 11-20" % worst)
        x = resumed(d, ref, "one_to_z3", half + ["--zero_stage", "3"] + acc, np=2)
        worst = worst_after_resume(curve(x, 20), a)
        report("one_rank_checkpoint_resumes_as_zero3", worst < 1e-6, "max rel %.3g, steps 11-20" % worst)
        # without accumulation (every micro-batch's gradients reduce-scattered straight into the
        # shard), and P-Tuning v2 (the prefix encoder sharded, gathered for its forward and backward)
        out = os.path.join(d, "z3_noacc")
        run(half + ["--output_dir", out, "--zero_stage", "3"] + clip, np=2)
        worst, n = rel(curve(out, 20), a1)
        report("zero3_no_accumulation_equals_1_rank", n == 20 and worst < 1e-6, "max rel %.3g over %d steps" % (worst, n))
        pt = ["--finetuning_type", "ptuning", "--pre_seq_len", "4", "--prefix_projection", "--prefix_dropout", "0"] + acc
        p1, _ = go("pt_1", pt)
        for z in ("2", "3"):  # ZeRO-2 lost part of the prefix gradients of a tied model before this test
            out = os.path.join(d, "pt_z" + z)
            run(half + ["--output_dir", out, "--zero_stage", z] + pt, np=2)
            worst, n = rel(curve(out, 20), curve(p1, 20))
            report("zero%s_ptuning_equals_1_rank" % z, n == 20 and worst < 1e-6, "max rel %.3g over %d steps" % (worst, n))
        # without the projection every layer reads the prefix embedding itself, while its own unit is gathered
        ptn = ["--finetuning_type", "ptuning", "--pre_seq_len", "4", "--prefix_dropout", "0"] + acc
        pn1, _ = go("ptn_1", ptn)
        out = os.path.join(d, "ptn_z3")
        run(half + ["--output_dir", out, "--zero_stage", "3"] + ptn, np=2)
        worst, n = rel(curve(out, 20), curve(pn1, 20))
        report("zero3_ptuning_without_projection_equals_1_rank", n == 20 and worst < 1e-6, "max rel %.3g over %d steps" % (worst, n))
        lora = ["--finetuning_type", "lora", "--lora_rank", "4", "--lora_target", "all", "--lora_dropout", "0"] + acc
        l1, _ = go("lora_1", lora)
        l3 = os.path.join(d, "lora_z3")
        run(half + ["--output_dir", l3, "--zero_stage", "3"] + lora, np=2)
        worst, n = rel(curve(l3, 20), curve(l1, 20))
        report("zero3_lora_equals_1_rank", n == 20 and worst < 1e-6, "max rel %.3g over %d steps (the frozen base replicated)" % (worst, n))
        log = open(os.path.join(d, "z3", "logs", "rank-1.log"), errors="replace").read()
        report("zero3_shards_the_weights", "ZeRO-3: weights" in log and "per rank at rest" in log,
               "".join([l for l in log.splitlines() if "ZeRO-3" in l][:1]))
        m = re.search(r"ZeRO-3: (\d+) unit gathers, (\d+) of them started ahead", log)
        report("zero3_prefetches_the_next_unit", bool(m) and int(m.group(2)) > int(m.group(1)) // 2,
               m.group(0) if m else "no prefetch count in rank 1's log")
        fin_ref, fin_z3 = weights(ref), weights(os.path.join(d, "z3"))
        close = all(max(abs(u - v) for u, v in zip(fin_ref[k], fin_z3[k])) < 1e-5 for k in fin_ref if isinstance(fin_ref[k], list))
        report("zero3_final_model_equals_1_rank", set(fin_ref) == set(fin_z3) and close, "every tensor within 1e-5")
        _, p = go2("off_z0", ["--offload_optimizer", "cpu", "--zero_stage", "0"], check=False)
        report("refuses_offload_zero0", p.returncode != 0 and "needs --zero_stage 1 or 2" in p.stdout + p.stderr, "")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
