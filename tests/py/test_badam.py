#!/usr/bin/env python3
"""BAdam (--use_badam, LLaMA-Factory's layer mode; optim/badam.h) against the badam package itself.

1. The C model through $GLM_BUILD/tests/tool_model_driver --badam_interval K --badam_order O
   against glm_ref's model trained by badam's BlockOptimizer wrapped around torch.optim.AdamW
   with LLaMA-Factory's two parameter groups (_create_badam_optimizer): the loss of every step,
   the layer each step trains, and every weight after the run (the frozen ones included) within
   1e-5 relative; the embedding, final norm and head bit-identical to the start. Orders ascending
   (switching every step and every 2), descending from a given layer, random (the package's
   torch.randperm replaced by the permutations glmtrain drew, read off the layers it trained) and
   fixed (one layer whose state still starts afresh at each switch), clipping on in one case; the
   ChatGLM2 block (glm2_ref) in descending order.
2. The command line on a tiny model: the switches in the log, the final folder a whole model
   whose embedding and head are the base's and whose every layer moved; resume from a checkpoint
   at a switch and from one inside a round gives the same losses and bit-identical weights;
   weight decay warned about (none applies, as in LLaMA-Factory's BAdam); the refusals by name.
3. The memory plan (glmtrain info): BAdam's equals freeze fine-tuning's of the lowest layer it
   reaches, and a full fine-tune refused under a 24 GiB cap lists --use_badam among what fits;
   `info --config` plans a LLaMA-Factory BAdam YAML as its flags.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import glm_ref  # noqa: E402
import test_lora_cli as T_lora  # noqa: E402
from test_lora_cli import check  # noqa: E402  (its PASS/FAIL printer, counting failures)
from test_model_vs_torch import find_driver, make_cfg, make_rows, rel  # noqa: E402



def badam_round(step, k):
    """BAdam's switches before 1-based step `step` (it switches after step s when (s + 1) % k == 0)."""
    return step - 1 if k <= 1 else step // k


def reference(cfg, params, ids, labels, steps, k, mode, start, lr, eps, max_grad_norm, perms=None, fwd=None):
    """badam's BlockOptimizer over torch's AdamW, as LLaMA-Factory builds it, on the same batch
    every step (fwd: the reference model's forward, glm_ref's by default): (losses, layer trained
    per step, final params)."""
    import re
    import torch
    fwd = fwd or glm_ref.forward
    import badam.block_optim as bo
    leaves = {n: v.detach().clone().requires_grad_(True) for n, v in params.items()}
    named = list(leaves.items())
    decay = [p for n, p in named if p.ndim >= 2]  # the Trainer spares biases and LayerNorm weights
    nodecay = [p for n, p in named if p.ndim < 2]
    base = torch.optim.AdamW([{"params": nodecay, "weight_decay": 0.0}, {"params": decay, "weight_decay": 0.0}],
                             lr=lr, eps=eps)
    import contextlib
    import io
    import warnings
    warnings.filterwarnings("ignore", message="BAdam expect")  # fp32 here on purpose: the comparison is exact
    quiet = contextlib.redirect_stdout(io.StringIO())  # its switch messages
    real_randperm = bo.torch.randperm
    if perms is not None:  # the permutations glmtrain drew, in the order BlockOptimizer asks for them
        queue = list(perms)
        bo.torch.randperm = lambda n: torch.tensor(queue.pop(0) if queue else list(range(n)))
    try:
        quiet.__enter__()
        opt = bo.BlockOptimizer(base_optimizer=base, named_parameters_list=named, block_prefix_list=None,
                                switch_block_every=k, start_block=start, switch_mode=mode, verbose=0)
        losses, blocks = [], []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = fwd(cfg, leaves, ids, labels)["loss"]
            loss.backward()
            trained = {int(re.search(r"layers\.(\d+)\.", n).group(1)) for n, p in named if p.grad is not None}
            blocks.append(sorted(trained))
            losses.append(loss.item())
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([p for _, p in named if p.grad is not None], max_grad_norm)
            opt.step()
    finally:
        quiet.__exit__(None, None, None)
        bo.torch.randperm = real_randperm
    return losses, blocks, {n: v.detach().clone() for n, v in named}


def driver_cases(tmp):
    import torch
    from safetensors.torch import load_file
    driver = find_driver()
    if driver is None:
        print("SKIP badam_driver: tool_model_driver not built")
        return
    cfg = make_cfg(3, 96, 6, 320, False)
    params = glm_ref.init_params(cfg, seed=7, std=0.02)
    model = os.path.join(tmp, "m3")
    glm_ref.save_model_dir(model, cfg, params)
    ids_rows, label_rows = make_rows(cfg, [(6, 4), (3, 7), (9, 2)], seed=3)
    ids, labels = glm_ref.pad_batch(ids_rows, label_rows, cfg["pad_token_id"])
    batch = os.path.join(tmp, "batch.json")
    json.dump({"input_ids": ids_rows, "labels": label_rows}, open(batch, "w"))
    # name, steps, interval, order, start, clip
    cases = [("ascending_k2", 9, 2, "ascending", None, 0.0), ("ascending_k1", 5, 1, "ascending", None, 0.0),
             ("descending_from_1", 8, 3, "descending", 1, 1.0), ("random_k2", 11, 2, "random", None, 0.0),
             ("fixed_k3", 8, 3, "fixed", 2, 0.0)]
    lr, eps = 1e-4, 1e-6
    for name, steps, k, mode, start, clip in cases:
        out = os.path.join(tmp, name + ".safetensors")
        cmd = [driver, "--model", model, "--batch", batch, "--out", out, "--steps", str(steps), "--lr", repr(lr),
               "--eps", repr(eps), "--max_grad_norm", repr(clip), "--badam_interval", str(k), "--badam_order", mode,
               "--seed", "5"]
        if start is not None:
            cmd += ["--badam_start", str(start)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if not check("badam_driver_%s_runs" % name, p.returncode == 0, (p.stdout + p.stderr)[-400:]):
            continue
        got = load_file(out)
        ours = [int(b) for b in got["blocks"].tolist()]
        perms = None
        if mode == "random":  # each round of 3 switches a permutation; BlockOptimizer pops from its end
            seq = {}
            for s in range(1, steps + 1):
                seq.setdefault(badam_round(s, k), ours[s - 1])
            rounds = [seq[r] for r in sorted(seq)]
            perms = [list(reversed(rounds[i:i + 3])) for i in range(0, len(rounds) - len(rounds) % 3, 3)]
            check("badam_random_rounds_are_permutations", all(sorted(pp) == [0, 1, 2] for pp in perms) and len(perms) >= 2,
                  str(rounds))
        losses, blocks, ref = reference(cfg, params, ids, labels, steps, k, mode, start, lr, eps, clip, perms)
        check("badam_%s_same_layers_as_blockoptimizer" % name, [[b] for b in ours] == blocks, "%s vs %s" % (ours, blocks))
        worst_loss = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), losses))
        worst, where = 0.0, ""
        for n, v in ref.items():
            g = got.get("param/" + n, got.get("fparam/" + n))
            e = rel(g, v) if g is not None else float("inf")
            if e > worst:
                worst, where = e, n
        check("badam_%s_losses_and_weights_match_badam" % name, worst_loss < 1e-5 and worst < 1e-5,
              "loss %.3g, weights %.3g at %s" % (worst_loss, worst, where))
        still = [n for n in params if ".layers." not in n]
        check("badam_%s_outside_layers_untouched" % name,
              all(torch.equal(got.get("fparam/" + n, torch.zeros(1)), params[n]) for n in still), str(still))


def glm2_case(tmp):
    """The ChatGLM2 block (RMSNorm, grouped-query attention, SwiGLU, untied output_layer) under
    BAdam, descending over 3 layers, against BlockOptimizer on glm2_ref's model."""
    import torch
    import glm2_ref
    from safetensors.torch import load_file
    from test_glm2_grads import make_cfg as glm2_cfg, make_rows as glm2_rows, write_case
    driver = find_driver()
    if driver is None:
        print("SKIP badam_glm2: tool_model_driver not built")
        return
    raw, cfg = glm2_cfg(3, 64, 4, 16, 2, 96, True)
    params = glm2_ref.init_params(cfg, seed=9, std=0.05)
    ids, labels, mdir, bpath = write_case(tmp, "glm2", raw, params, *glm2_rows([(5, 4), (2, 6)], seed=4))
    out = os.path.join(tmp, "glm2.safetensors")
    steps, k, lr, eps = 7, 2, 1e-4, 1e-4  # eps 1e-4: near-linear updates, where fp32 rounding is not amplified
    p = subprocess.run([driver, "--model", mdir, "--batch", bpath, "--out", out, "--steps", str(steps), "--lr", repr(lr),
                        "--eps", repr(eps), "--badam_interval", str(k), "--badam_order", "descending"],
                       capture_output=True, text=True, timeout=300)
    if not check("badam_glm2_driver_runs", p.returncode == 0, (p.stdout + p.stderr)[-400:]):
        return
    got = load_file(out)
    losses, blocks, ref = reference(cfg, params, ids, labels, steps, k, "descending", None, lr, eps, 0.0, fwd=glm2_ref.forward)
    ours = [[int(b)] for b in got["blocks"].tolist()]
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), losses))
    worst = max(rel(got.get("param/" + n, got.get("fparam/" + n)), v) for n, v in ref.items())
    check("badam_glm2_matches_blockoptimizer", ours == blocks and worst_loss < 1e-5 and worst < 1e-5,
          "layers %s vs %s, loss %.3g, weights %.3g" % (ours, blocks, worst_loss, worst))
    check("badam_glm2_outside_layers_untouched",
          all(torch.equal(got["fparam/" + n], params[n]) for n in params if ".layers." not in n))


def cli_cases(tmp):
    import torch
    from safetensors.torch import load_file
    from test_lora_cli import run, tiny_poem_run
    setup = tiny_poem_run(tmp, "badam_cli")
    if setup is None:
        return
    tok, cfg, params, data = setup
    common = ["--model_name_or_path", tok, "--train_file", data, "--use_badam", "--badam_switch_interval", "2",
              "--per_device_train_batch_size", "4", "--logging_steps", "1", "--disable_tqdm", "--report_to", "none",
              "--max_source_length", "32", "--max_target_length", "16", "--device", "cpu", "--seed", "5",
              "--learning_rate", "1e-2", "--max_steps", "7", "--save_steps", "3"]
    out = os.path.join(tmp, "badam")
    p = run(["train", "--output_dir", out, "--weight_decay", "0.1"] + common)
    if not check("badam_cli_trains", p.returncode == 0, p.stderr[-800:]):
        return
    switches = [l for l in p.stderr.splitlines() if "BAdam: after step" in l]
    check("badam_cli_switches_logged", len(switches) == 4 and "after step 1 layer 1 trains (was layer 0)" in switches[0] and
          "after step 3 layer 0 trains" in switches[1] and "after step 5 layer 1 trains" in switches[2], "\n".join(switches))
    check("badam_cli_weight_decay_warned", "no weight decay applies" in p.stderr, p.stderr[-400:])
    final = load_file(os.path.join(out, "model.safetensors"))
    moved = {n: not torch.equal(final[n], params[n]) for n in params}
    check("badam_cli_final_is_whole_model", set(params) <= set(final) and
          all(moved[n] == (".layers." in n) for n in params),
          "%s %s" % (set(params) - set(final), [n for n in params if moved[n] != (".layers." in n)]))
    ck = load_file(os.path.join(out, "checkpoint-3", "model.safetensors"))
    check("badam_checkpoint_holds_every_weight", sorted(ck) == sorted(params), str(sorted(ck))[:200])

    def losses(d):
        st = json.load(open(os.path.join(d, "checkpoint-6", "trainer_state.json")))
        return [h["loss"] for h in st["log_history"] if "loss" in h]
    before = losses(out)
    for at in ("3", "6"):  # after step 3 layer 0 took over (a fresh state); after step 6 layer 1 is a step into its round
        snap = os.path.join(tmp, "straight_%s.safetensors" % at)
        shutil.copy(os.path.join(out, "model.safetensors"), snap)
        r = run(["train", "--output_dir", out, "--weight_decay", "0.1", "--resume_from_checkpoint",
                 os.path.join(out, "checkpoint-" + at)] + common)
        again = load_file(os.path.join(out, "model.safetensors")) if r.returncode == 0 else {}
        same = r.returncode == 0 and losses(out) == before and all(torch.equal(again[n], v) for n, v in load_file(snap).items())
        check("badam_resume_from_checkpoint_%s_is_exact" % at, same and len(before) == 6,
              "%s vs %s %s" % (losses(out) if r.returncode == 0 else None, before, r.stderr[-400:]))

    # data parallel over 2 CPU ranks (mpirun), each holding the whole model: ZeRO-0 and ZeRO-1 (the
    # state of the layer sharded, its master copy refilled per shard at each switch) with 2 rows
    # each follow 1 rank with 4
    from mpi_runs import run as mpi_run
    if shutil.which("mpirun"):
        for zero in ("0", "1"):
            dz = os.path.join(tmp, "dp_z" + zero)
            try:
                mpi_run(["--output_dir", dz, "--weight_decay", "0.1", "--zero_stage", zero] + common +
                        ["--per_device_train_batch_size", "2"], np=2, timeout=300)
                got = losses(dz)
                worst = max(abs(a - b) / abs(b) for a, b in zip(got, before)) if len(got) == len(before) else float("inf")
                check("badam_2_ranks_zero%s_equal_1_rank" % zero, worst < 1e-6, "%.3g: %s vs %s" % (worst, got, before))
            except RuntimeError as e:
                check("badam_2_ranks_zero%s_equal_1_rank" % zero, False, str(e)[-400:])
    else:
        print("SKIP badam_2_ranks: mpirun (openmpi-bin) not installed")

    # 8-bit moments (bitsandbytes' blockwise codes) start afresh at each switch too, and resume exactly
    out8 = os.path.join(tmp, "badam8")
    p8 = run(["train", "--output_dir", out8, "--optim", "adamw_8bit"] + common)
    if check("badam_adamw_8bit_trains", p8.returncode == 0 and "BAdam: after step 5" in p8.stderr, p8.stderr[-400:]):
        snap = os.path.join(tmp, "straight8.safetensors")
        shutil.copy(os.path.join(out8, "model.safetensors"), snap)
        r8 = run(["train", "--output_dir", out8, "--optim", "adamw_8bit", "--resume_from_checkpoint",
                  os.path.join(out8, "checkpoint-6")] + common)
        again = load_file(os.path.join(out8, "model.safetensors")) if r8.returncode == 0 else {}
        check("badam_adamw_8bit_resume_is_exact", r8.returncode == 0 and
              all(torch.equal(again[n], v) for n, v in load_file(snap).items()), r8.stderr[-400:])

    # a full fine-tuning checkpoint is not a BAdam one
    full = os.path.join(tmp, "full")
    plain = [a for a in common if a != "--use_badam"]
    del plain[plain.index("--badam_switch_interval"):plain.index("--badam_switch_interval") + 2]
    pf = run(["train", "--output_dir", full] + plain)
    rb = run(["train", "--output_dir", full, "--resume_from_checkpoint", os.path.join(full, "checkpoint-3")] + common)
    check("badam_resume_of_full_checkpoint_refused", pf.returncode == 0 and rb.returncode != 0 and
          "every layer in turn (BAdam)" in rb.stderr, (pf.stderr + rb.stderr)[-300:])

    refusals = [
        ("lora", ["--finetuning_type", "lora"], "BAdam updates every weight"),
        ("ratio", ["--badam_mode", "ratio"], "ratio mode"),
        ("fixed_without_start", ["--badam_switch_mode", "fixed"], "needs --badam_start_block"),
        ("random_with_start", ["--badam_switch_mode", "random", "--badam_start_block", "1"], "draws its own first layer"),
        ("start_out_of_range", ["--badam_start_block", "2"], "layers 0 to 1"),
        ("interval_zero", ["--badam_switch_interval", "0"], "at least 1"),
        ("quantized", ["--quantization_bit", "8"], "a quantized base"),
        ("offload", ["--offload_optimizer", "cpu"], "--offload_optimizer"),
        ("prefix", ["--pre_seq_len", "4"], "a P-Tuning prefix"),
        ("llama_pro", ["--use_llama_pro"], "LLaMA Pro's added blocks alone"),
    ]
    for name, extra, want in refusals:
        q = run(["train", "--output_dir", os.path.join(tmp, "r_" + name)] + common + extra)
        check("badam_refused_" + name, q.returncode != 0 and want in q.stderr, q.stderr[-300:])


def plan_cases():
    """The memory plan: BAdam's is freeze fine-tuning's of the lowest layer it reaches (the first,
    ascending; the one fixed), and a full fine-tune refused under a 24 GiB cap lists it."""
    from test_generate import GLM
    if not os.path.exists(GLM):
        print("SKIP badam_plan: %s not built" % GLM)
        return
    base = [GLM, "info", "--chatglm6b", "--bf16", "--per_device_train_batch_size", "4", "--cutoff_len", "512",
            "--gradient_checkpointing"]

    def plan(extra):
        p = subprocess.run(base + extra, capture_output=True, text=True)
        rows = [l for l in p.stdout.splitlines() if l.strip().startswith(("weights", "gradients", "fp32 master", "AdamW", "activations",
                                                                          "backward", "total"))]
        return p.returncode, rows
    rb, badam = plan(["--use_badam"])
    rf, freeze = plan(["--finetuning_type", "freeze", "--num_layer_trainable", "-1"])
    check("badam_plans_as_freeze_of_the_first_layer", rb == 0 and rf == 0 and badam == freeze and len(badam) == 7,
          "%s vs %s" % (badam, freeze))
    rx, fixed = plan(["--use_badam", "--badam_switch_mode", "fixed", "--badam_start_block", "27"])
    ry, last = plan(["--finetuning_type", "freeze", "--num_layer_trainable", "1"])
    check("badam_fixed_plans_as_freeze_of_that_layer", rx == 0 and fixed == last and fixed != badam, "%s vs %s" % (fixed, last))
    # a LLaMA-Factory training config (YAML, with keys info has no flag for) planned by info --config
    # as train would read it: the same plan as the flags
    conf = os.path.join(tempfile.mkdtemp(prefix="glm-badam-conf-"), "badam_sft.yaml")
    open(conf, "w").write("stage: sft\ndo_train: true\nfinetuning_type: full\nuse_badam: true\nbadam_mode: layer\n"
                          "badam_switch_mode: ascending\nbadam_switch_interval: 50\nbf16: true\ngradient_checkpointing: true\n"
                          "per_device_train_batch_size: 4\ncutoff_len: 512\nlearning_rate: 1.0e-5\nlr_scheduler_type: cosine\n")
    p = subprocess.run([GLM, "info", "--config", conf, "--chatglm6b"], capture_output=True, text=True)
    rows = [l for l in p.stdout.splitlines() if l.strip().startswith(("weights", "gradients", "fp32 master", "AdamW", "activations",
                                                                     "backward", "total"))]
    check("info_config_plans_a_training_config_as_its_flags", p.returncode == 0 and rows == badam, "%s vs %s %s" %
          (rows, badam, p.stderr[-300:]))
    shutil.rmtree(os.path.dirname(conf), ignore_errors=True)
    p = subprocess.run(base[:-1] + ["--max_memory_per_gpu", "24GiB"], capture_output=True, text=True)
    check("badam_listed_among_layouts_that_fit_24gib", "; --use_badam (plans " in p.stdout + p.stderr,
          (p.stdout + p.stderr)[-600:])
    p4 = subprocess.run(base[:-1] + ["--max_memory_per_gpu", "24GiB", "--data_parallel_size", "4"], capture_output=True, text=True)
    check("badam_listed_for_4_ranks_too", "; --use_badam (plans " in p4.stdout + p4.stderr, (p4.stdout + p4.stderr)[-600:])


def main():
    tmp = tempfile.mkdtemp(prefix="glm-badam-")
    try:
        try:
            import badam  # noqa: F401
        except ImportError:
            print("SKIP badam_all: the badam package is not installed (scripts/install-deps.sh)")
            return 0
        plan_cases()
        driver_cases(tmp)
        glm2_case(tmp)
        cli_cases(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if T_lora.fails else 0


if __name__ == "__main__":
    sys.exit(main())
