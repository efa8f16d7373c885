#!/usr/bin/env python3
"""GaLore (--use_galore, LLaMA-Factory's; optim/galore.h) against galore_torch itself.

1. The C model through $GLM_BUILD/tests/tool_model_driver --galore_rank R ... against glm_ref's
   model trained by galore_torch's GaLoreAdamW with LLaMA-Factory's three parameter groups
   (_create_galore_optimizer: no decay for biases and norms, decay for the other weights, the
   projected linear weights with rank, update_proj_gap, scale and proj_type): the loss of every
   step and every weight after the run within 1e-5 relative. The projection changes during the
   runs, so the moments carried across a change are compared too; galore_torch's SVD is given
   glmtrain's sign convention (an SVD's signs are free: LAPACK's differ between CPU and GPU).
   Cases: std over all linear modules (both sides: tall and wide weights), reverse_std on the
   modules whose names hold "dense", right, left and full (both sides), weight decay and
   clipping, freeze mode, an untied head named as a target, and the ChatGLM2 block.
2. The command line on a tiny model: the loss falls, a checkpoint holds optimizer_galore.safetensors
   and no full-size moments of the projected weights, a resume is bit-identical to the straight
   run, a GaLore checkpoint does not resume a run without GaLore (and the reverse), and the
   refusals name their flags.
3. The memory plan: GaLore's moments are those of the rows it does not project plus the
   projections, as the trainer prints the plan before allocating.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import importlib.util
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import glm_ref  # noqa: E402
from test_lora_cli import check  # noqa: E402  (its PASS/FAIL printer, counting failures)
from test_model_vs_torch import find_driver, make_cfg, make_rows, rel  # noqa: E402

LINEAR = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")


def galore_modules():
    """galore_torch's AdamW and GaLoreProjector, loaded without its package __init__ (which imports
    bitsandbytes for the 8-bit variant)."""
    if "galore_torch.adamw" not in sys.modules:
        spec = importlib.util.find_spec("galore_torch")
        if spec is None:
            return None
        pkg = types.ModuleType("galore_torch")
        pkg.__path__ = [os.path.dirname(spec.origin)]
        sys.modules["galore_torch"] = pkg
    import galore_torch.adamw as adamw
    import galore_torch.galore_projector as proj
    return adamw, proj


def signed_svd(matrix):
    """torch.linalg.svd with glmtrain's signs: each triplet's right vector has its largest |entry|
    (the first of equal ones) positive (backend/svd.h glm_svd_fix_signs)."""
    import torch
    U, s, Vh = torch.linalg.svd(matrix, full_matrices=False)
    for j in range(Vh.shape[0]):
        k = int(torch.argmax(Vh[j].abs()))
        if Vh[j, k] < 0:
            U[:, j] = -U[:, j]
            Vh[j] = -Vh[j]
    return U, s, Vh


def patch_signs(proj_mod):
    import torch
    real = proj_mod.GaLoreProjector.get_orthogonal_matrix

    def get_orthogonal_matrix(self, weights, rank, type):
        U, s, Vh = signed_svd(weights.data.float())
        if type == "right":
            return Vh[:rank, :]
        if type == "left":
            return U[:, :rank]
        if type == "full":
            return [U[:, :rank], Vh[:rank, :]]
        raise ValueError(type)
    proj_mod.GaLoreProjector.get_orthogonal_matrix = get_orthogonal_matrix
    return lambda: setattr(proj_mod.GaLoreProjector, "get_orthogonal_matrix", real)


def galore_names(params, target):
    """LLaMA-Factory's galore_params: weights of Linear modules whose name holds a target (all:
    find_all_linear_modules, every linear module but the output layer)."""
    out = []
    for n, v in params.items():
        if v.ndim != 2 or not n.endswith(".weight"):
            continue
        module = n[:-len(".weight")]
        leaf = module.split(".")[-1]
        linear = leaf in LINEAR or leaf in ("lm_head", "output_layer")
        if not linear:
            continue
        if target == "all":
            if leaf in LINEAR:
                out.append(n)
        elif any(t in module for t in target.split(",")):
            out.append(n)
    return out


def reference(cfg, params, ids, labels, steps, o, trains=None, fwd=None):
    """GaLoreAdamW as LLaMA-Factory builds it, on the same batch every step: (losses, final params)."""
    import torch
    import warnings
    adamw, proj = galore_modules()
    fwd = fwd or glm_ref.forward
    leaves = {n: v.detach().clone().requires_grad_(trains is None or n in trains) for n, v in params.items()}
    named = [(n, p) for n, p in leaves.items() if p.requires_grad]
    gal = set(galore_names({n: p for n, p in named}, o["target"]))
    decay = [p for n, p in named if n not in gal and p.ndim >= 2]  # the Trainer spares biases and norms
    nodecay = [p for n, p in named if n not in gal and p.ndim < 2]
    groups = [dict(params=nodecay, weight_decay=0.0), dict(params=decay, weight_decay=o["wd"]),
              dict(params=[leaves[n] for n in sorted(gal)], weight_decay=o["wd"], rank=o["rank"],
                   update_proj_gap=o["gap"], scale=o["scale"], proj_type=o["proj"])]
    warnings.filterwarnings("ignore", category=FutureWarning)
    restore = patch_signs(proj)
    try:
        opt = adamw.AdamW(groups, lr=o["lr"], betas=(0.9, 0.999), eps=o["eps"])
        losses = []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = fwd(cfg, leaves, ids, labels)["loss"]
            loss.backward()
            losses.append(loss.item())
            if o.get("clip", 0) > 0:
                torch.nn.utils.clip_grad_norm_([p for _, p in named], o["clip"])
            opt.step()
    finally:
        restore()
    return losses, {n: v.detach().clone() for n, v in leaves.items()}, sorted(gal)


def run_case(driver, tmp, name, model, batch, cfg, params, ids, labels, o, extra=(), trains=None, fwd=None):
    from safetensors.torch import load_file
    out = os.path.join(tmp, name + ".safetensors")
    cmd = [driver, "--model", model, "--batch", batch, "--out", out, "--steps", str(o["steps"]), "--lr", repr(o["lr"]),
           "--eps", repr(o["eps"]), "--weight_decay", repr(o["wd"]), "--max_grad_norm", repr(o.get("clip", 0.0)),
           "--galore_rank", str(o["rank"]), "--galore_gap", str(o["gap"]), "--galore_scale", repr(o["scale"]),
           "--galore_proj", o["proj"], "--galore_target", o["target"]] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not check("galore_%s_driver_runs" % name, p.returncode == 0, (p.stdout + p.stderr)[-400:]):
        return
    got = load_file(out)
    losses, ref, gal = reference(cfg, params, ids, labels, o["steps"], o, trains, fwd)
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), losses))
    worst, where = 0.0, ""
    for n, v in ref.items():
        g = got.get("param/" + n, got.get("fparam/" + n))
        e = rel(g, v) if g is not None else float("inf")
        if e > worst:
            worst, where = e, n
    check("galore_%s_matches_galore_torch" % name, worst_loss < 1e-5 and worst < 1e-5 and len(gal) > 0,
          "loss %.3g, weights %.3g at %s (%d projected)" % (worst_loss, worst, where, len(gal)))
    return gal


def driver_cases(tmp):
    driver = find_driver()
    if driver is None:
        print("SKIP galore_driver: tool_model_driver not built")
        return
    if galore_modules() is None:
        print("SKIP galore_driver: galore-torch not installed (scripts/install-deps.sh)")
        return
    import torch
    cfg = make_cfg(2, 64, 4, 160, False)
    params = glm_ref.init_params(cfg, seed=7, std=0.05)
    model = os.path.join(tmp, "m2")
    glm_ref.save_model_dir(model, cfg, params)
    ids_rows, label_rows = make_rows(cfg, [(6, 9), (3, 12), (9, 8), (5, 10)], seed=3)
    ids, labels = glm_ref.pad_batch(ids_rows, label_rows, cfg["pad_token_id"])
    batch = os.path.join(tmp, "batch.json")
    json.dump({"input_ids": ids_rows, "labels": label_rows}, open(batch, "w"))
    # eps 1e-5: components of a projected gradient near zero would otherwise turn fp32 rounding
    # into whole steps (Adam's direction of a tiny component is its sign)
    base = dict(steps=6, lr=1e-3, eps=1e-5, wd=0.0, rank=4, gap=2, scale=2.0, proj="std", target="all")
    gal = run_case(driver, tmp, "std_all", model, batch, cfg, params, ids, labels, base)
    if gal is not None:  # tall weights project from the right, the wide dense_4h_to_h from the left
        check("galore_std_all_projects_the_four_modules", len(gal) == 8 and not any("lm_head" in n for n in gal), str(gal))
    run_case(driver, tmp, "reverse_std_dense", model, batch, cfg, params, ids, labels,
             dict(base, proj="reverse_std", target="dense", scale=0.25, gap=3, steps=7, wd=0.1, clip=0.05))
    run_case(driver, tmp, "right", model, batch, cfg, params, ids, labels, dict(base, proj="right", gap=1, steps=4))
    run_case(driver, tmp, "left", model, batch, cfg, params, ids, labels, dict(base, proj="left", rank=3, steps=5))
    run_case(driver, tmp, "full", model, batch, cfg, params, ids, labels, dict(base, proj="full", steps=5, wd=0.1))
    run_case(driver, tmp, "head_and_qkv", model, batch, cfg, params, ids, labels,
             dict(base, target="lm_head,query_key_value", wd=0.05))
    # a rank above the gradients' own (one short row of 9 tokens, rank 12: 24 vectors asked of
    # gradients of rank 6-9): the iteration meets dependent columns (Gram-Schmidt's fallback). The
    # vectors past the gradient's rank, or of singular values 1e-4 of the first, are set by
    # rounding alone, in torch's SVD as here, and the moments carried across a new projection go
    # with them; so the losses are compared, and every weight must stay finite
    short = os.path.join(tmp, "short.json")
    sid, slab = make_rows(cfg, [(3, 4)], seed=9)
    json.dump({"input_ids": sid, "labels": slab}, open(short, "w"))
    s_ids, s_labels = glm_ref.pad_batch(sid, slab, cfg["pad_token_id"])
    o = dict(base, rank=12, steps=4, gap=2)
    out = os.path.join(tmp, "rank_above.safetensors")
    p = subprocess.run([driver, "--model", model, "--batch", short, "--out", out, "--steps", "4", "--lr", repr(o["lr"]),
                        "--eps", repr(o["eps"]), "--galore_rank", "12", "--galore_gap", "2"], capture_output=True, text=True,
                       timeout=300)
    if check("galore_rank_above_gradient_runs", p.returncode == 0, (p.stdout + p.stderr)[-400:]):
        from safetensors.torch import load_file
        got = load_file(out)
        losses, _, _ = reference(cfg, params, s_ids, s_labels, 4, o)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), losses))
        check("galore_rank_above_gradient_losses_match_and_weights_finite",
              worst < 1e-5 and all(bool(torch.isfinite(v).all()) for v in got.values()), "loss %.3g" % worst)
    # freeze: the last layer trains; GaLore projects its linear weights, the rest stay as loaded
    last = {n for n in params if ".layers.1." in n}
    run_case(driver, tmp, "freeze", model, batch, cfg, params, ids, labels, dict(base, steps=5),
             extra=["--finetuning_type", "freeze", "--num_layer_trainable", "1"], trains=last)

    import glm2_ref
    from test_glm2_grads import make_cfg as glm2_cfg, make_rows as glm2_rows, write_case
    raw, cfg2 = glm2_cfg(2, 64, 4, 16, 2, 96, True)
    params2 = glm2_ref.init_params(cfg2, seed=9, std=0.05)
    ids2, labels2, mdir, bpath = write_case(tmp, "glm2", raw, params2,
                                            *glm2_rows([(5, 10), (7, 9), (4, 12)], seed=4))
    run_case(driver, tmp, "glm2", mdir, bpath, cfg2, params2, ids2, labels2, dict(base, steps=5, wd=0.1),
             fwd=glm2_ref.forward)


# ---------------------------------------------------------------- command line

def cli_cases(tmp):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    from test_lora_cli import run, tiny_poem_run
    setup = tiny_poem_run(tmp, "galore_cli")
    if setup is None:
        return
    tok, cfg, params, data = setup
    common = ["--model_name_or_path", tok, "--train_file", data, "--use_galore", "--galore_rank", "4",
              "--galore_update_interval", "3", "--per_device_train_batch_size", "4", "--logging_steps", "1",
              "--disable_tqdm", "--report_to", "none", "--max_source_length", "32", "--max_target_length", "16",
              "--device", "cpu", "--seed", "5", "--learning_rate", "1e-2", "--max_steps", "8", "--save_steps", "4",
              "--weight_decay", "0.01"]
    out = os.path.join(tmp, "galore")
    p = run(["train", "--output_dir", out] + common)
    if not check("galore_cli_trains", p.returncode == 0, p.stderr[-800:]):
        return
    state = json.load(open(os.path.join(out, "checkpoint-8", "trainer_state.json")))
    losses = [r["loss"] for r in state["log_history"] if "loss" in r]
    check("galore_cli_loss_falls", len(losses) == 8 and losses[-1] < losses[0], str(losses))
    check("galore_cli_logs_its_settings", "GaLore:" in p.stderr and "rank-4" in p.stderr, p.stderr[-600:])
    # new projections at steps 1, 4 and 7 (every 3), each logged with its cost
    check("galore_cli_logs_new_projections", [int(x) for x in re.findall(r"GaLore: step (\d+): new projections of 8 weights",
                                                                          p.stderr)] == [1, 4, 7], p.stderr[-600:])
    ck = os.path.join(out, "checkpoint-4")
    gfile = os.path.join(ck, "optimizer_galore.safetensors")
    ok = os.path.exists(gfile)
    if ok:  # the projected weights' state there, and no full-size moments of theirs in optimizer.safetensors
        with safe_open(gfile, "pt") as f:
            gkeys = set(f.keys())
        with safe_open(os.path.join(ck, "optimizer.safetensors"), "pt") as f:
            okeys = set(f.keys())
        qkv = "transformer.layers.0.attention.query_key_value.weight"
        ok = ({"proj/" + qkv, "exp_avg/" + qkv, "exp_avg_sq/" + qkv} <= gkeys and "exp_avg/" + qkv not in okeys
              and "exp_avg/transformer.word_embeddings.weight" in okeys)
    check("galore_cli_checkpoint_keeps_projected_state", ok, gfile)
    # the disk plan's checkpoint size (train/disk.c, from the tensor table) is what was written
    m = re.search(r"disk: \d+ checkpoints? ahead of about ([0-9.]+) (kB|MB|GB)", p.stderr)
    written = sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck))
    planned = float(m.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)] if m else 0
    check("galore_cli_disk_plan_is_the_checkpoint", m is not None and abs(planned - written) < 0.05 * written,
          "planned %s, written %d bytes" % (m.group(0) if m else None, written))

    # resume from step 4 (inside the second projection interval): bit-identical to the straight run
    res = os.path.join(tmp, "galore_resume")
    shutil.copytree(out, res)
    shutil.rmtree(os.path.join(res, "checkpoint-8"))
    p2 = run(["train", "--output_dir", res, "--resume_from_checkpoint", os.path.join(res, "checkpoint-4")] + common)
    if check("galore_cli_resumes", p2.returncode == 0, p2.stderr[-800:]):
        a = load_file(os.path.join(out, "model.safetensors"))
        b = load_file(os.path.join(res, "model.safetensors"))
        check("galore_cli_resume_bit_identical", a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
              str([k for k in a if not torch.equal(a[k], b.get(k, a[k] + 1))][:3]))
    # both sides (full): U_r and Vh_r in the checkpoint, and the resume exact too
    full = os.path.join(tmp, "galore_full")
    pf = run(["train", "--output_dir", full, "--galore_proj_type", "full"] + common)
    if check("galore_cli_full_trains", pf.returncode == 0, pf.stderr[-600:]):
        with safe_open(os.path.join(full, "checkpoint-4", "optimizer_galore.safetensors"), "pt") as f:
            qkv = "transformer.layers.0.attention.query_key_value.weight"
            shapes = [list(f.get_slice(k + qkv).get_shape()) for k in ("proj/", "proj_right/", "exp_avg/")]
        check("galore_cli_full_keeps_both_sides", shapes == [[3 * cfg["hidden_size"], 4], [4, cfg["hidden_size"]], [4, 4]],
              str(shapes))
        snap = load_file(os.path.join(full, "model.safetensors"))
        shutil.rmtree(os.path.join(full, "checkpoint-8"))
        pr = run(["train", "--output_dir", full, "--galore_proj_type", "full", "--resume_from_checkpoint",
                  os.path.join(full, "checkpoint-4")] + common)
        again = load_file(os.path.join(full, "model.safetensors")) if pr.returncode == 0 else {}
        check("galore_cli_full_resume_bit_identical", pr.returncode == 0 and all(torch.equal(again[k], v) for k, v in snap.items()),
              pr.stderr[-400:])
    # --galore_layerwise (LLaMA-Factory's): each layer updated inside backward; without clipping it is
    # the same run as GaLore after backward (--max_grad_norm 0), weight for weight; a clipping norm
    # is left out with a warning, as LLaMA-Factory's layer-wise GaLore clips nothing
    unclipped = os.path.join(tmp, "galore_noclip")
    layer = os.path.join(tmp, "galore_layerwise")
    pa = run(["train", "--output_dir", unclipped, "--max_grad_norm", "0", "--save_strategy", "no"] + common)
    pb = run(["train", "--output_dir", layer, "--galore_layerwise", "--save_strategy", "no"] + common)
    if check("galore_cli_layerwise_trains", pa.returncode == 0 and pb.returncode == 0, (pa.stderr + pb.stderr)[-600:]):
        a = load_file(os.path.join(unclipped, "model.safetensors"))
        b = load_file(os.path.join(layer, "model.safetensors"))
        worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-30)) for k in a)
        check("galore_cli_layerwise_equals_unclipped", worst < 1e-6 and "--max_grad_norm 1 is left out" in pb.stderr
              and "layer by layer inside backward" in pb.stderr, "%.3g %s" % (worst, pb.stderr[-400:]))
    pc = run(["train", "--output_dir", os.path.join(tmp, "lw_acc"), "--galore_layerwise", "--gradient_accumulation_steps",
              "2"] + common)
    check("galore_cli_layerwise_refuses_accumulation", pc.returncode != 0 and "--gradient_accumulation_steps 2" in pc.stderr,
          pc.stderr[-300:])
    # a GaLore checkpoint does not resume a run without GaLore, and the reverse
    plain = [c for c in common if c not in ("--use_galore",)]
    plain = [c for i, c in enumerate(plain) if not (c.startswith("--galore") or (i and plain[i - 1].startswith("--galore")))]
    p3 = run(["train", "--output_dir", os.path.join(tmp, "r3"), "--resume_from_checkpoint", ck] + plain)
    check("galore_cli_checkpoint_needs_galore", p3.returncode != 0 and "with GaLore" in p3.stderr
          and "--use_galore" in p3.stderr, p3.stderr[-400:])
    out_plain = os.path.join(tmp, "plain")
    p4 = run(["train", "--output_dir", out_plain] + plain)
    if check("galore_cli_plain_trains", p4.returncode == 0, p4.stderr[-400:]):
        p5 = run(["train", "--output_dir", os.path.join(tmp, "r5"), "--resume_from_checkpoint",
                  os.path.join(out_plain, "checkpoint-4")] + common)
        check("galore_cli_plain_checkpoint_refused_with_galore", p5.returncode != 0 and "without GaLore" in p5.stderr,
              p5.stderr[-400:])

    # data parallel over 2 CPU ranks (mpirun) under ZeRO-0, 2 rows each: every rank takes the SVD of
    # the same summed gradients, so the run follows 1 rank with 4 rows; ZeRO-1 is refused by name
    from mpi_runs import run as mpi_run
    if shutil.which("mpirun"):
        dz = os.path.join(tmp, "dp_z0")
        try:
            mpi_run(["--output_dir", dz, "--zero_stage", "0"] + common + ["--per_device_train_batch_size", "2"], np=2,
                    timeout=300)
            h = json.load(open(os.path.join(dz, "checkpoint-8", "trainer_state.json")))["log_history"]
            got = [r["loss"] for r in h if "loss" in r]
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, losses)) if len(got) == len(losses) else float("inf")
            check("galore_2_ranks_zero0_equal_1_rank", worst < 1e-5, "%.3g: %s vs %s" % (worst, got, losses))
        except RuntimeError as e:
            check("galore_2_ranks_zero0_equal_1_rank", False, str(e)[-400:])
        p1 = mpi_run(["--output_dir", os.path.join(tmp, "dp_z1"), "--zero_stage", "1"] + common +
                     ["--per_device_train_batch_size", "2"], np=2, timeout=300, check=False)
        check("galore_cli_refuses_zero1_ranks", p1.returncode != 0 and "--zero_stage 1, 2 or 3 over several ranks" in
              p1.stdout + p1.stderr, (p1.stdout + p1.stderr)[-300:])
    else:
        print("SKIP galore_2_ranks: mpirun (openmpi-bin) not installed")

    refusals = [
        ("lora", ["--finetuning_type", "lora"], "--use_galore with LoRA"),
        ("badam", ["--use_badam"], "--use_badam"),
        ("proj_unknown", ["--galore_proj_type", "both"], '"both" is not one of std|reverse_std|right|left|full'),
        ("adamw_8bit", ["--optim", "adamw_8bit"], "--optim adamw_8bit"),
        ("offload", ["--offload_optimizer", "cpu"], "--offload_optimizer"),
        ("target_none", ["--galore_target", "word_embeddings"], "matches no linear weight"),
        ("rank_0", ["--galore_rank", "0"], "--galore_rank 0"),
    ]
    for name, flags, words in refusals:
        p = run(["train", "--output_dir", os.path.join(tmp, "no_" + name)] + common + flags)
        check("galore_cli_refuses_%s" % name, p.returncode != 0 and words in p.stderr and "Traceback" not in p.stderr,
              p.stderr[-300:])


# ---------------------------------------------------------------- memory plan

def plan_case(tmp):
    """`glmtrain info --use_galore` (the plan train prints before allocating, from the same tables):
    for ChatGLM-6B's shapes the moments are the unprojected rows' (embedding, head, norms, biases)
    plus rank-16 projections and their moments; a LLaMA-Factory YAML with use_galore plans the same."""
    import re
    from test_generate import GLM
    from test_lora_cli import run
    if not os.path.exists(GLM):
        print("SKIP galore_plan: %s not built" % GLM)
        return
    H, F, V, L, r = 4096, 16384, 130528, 28, 16
    flat = 2 * V * H + 2 * H + L * (2 * H + 3 * H + H + 2 * H + F + H)  # embedding, head, final norm; per layer
    #                                                                   # the norms and biases
    low = L * ((2 * 3 * H * r + r * H) + (2 * H * r + r * H) + (2 * F * r + r * H)  # qkv, dense, h_to_4h: right
               + (2 * r * F + H * r))                                                # dense_4h_to_h [H, F]: left
    want = (2 * flat + low) * 4 / 2 ** 30

    def moments(p):
        m = re.search(r"AdamW moments \(fp32(, GaLore)?\)\s+([0-9.]+) GiB", p.stdout)
        return float(m.group(2)) if m and p.returncode == 0 else None
    base = ["info", "--chatglm6b", "--bf16", "--per_device_train_batch_size", "1"]
    got, full = moments(run(base + ["--use_galore"])), moments(run(base))
    check("galore_plan_moments", got is not None and full is not None and abs(got - want) < 0.006 and got < full / 5,
          "plan %s GiB, expected %.3f (AdamW %s)" % (got, want, full))
    yml = os.path.join(tmp, "galore.yaml")
    open(yml, "w").write("model_name_or_path: x\nstage: sft\nfinetuning_type: full\nuse_galore: true\n"
                         "galore_rank: 16\nbf16: true\nper_device_train_batch_size: 1\n")
    p = run(["info", "--config", yml, "--chatglm6b"])
    check("galore_plan_from_yaml", moments(p) == got and "GaLore: 112 linear weights" in p.stdout, (p.stdout + p.stderr)[-500:])
    # a full fine-tune refused under an 80 GiB cap lists GaLore among the layouts that fit
    p = run(["info", "--chatglm6b", "--bf16", "--per_device_train_batch_size", "4", "--max_source_length", "64",
             "--max_target_length", "192", "--max_memory_per_gpu", "80GiB"])
    m = re.search(r"--use_galore \(plans ([0-9.]+) GiB\)", p.stdout + p.stderr)
    check("galore_listed_among_layouts_that_fit", m is not None and 50 < float(m.group(1)) < 80, (p.stdout + p.stderr)[-600:])
    p = run(base + ["--use_galore", "--finetuning_type", "lora"])
    check("galore_plan_refuses_lora", p.returncode != 0 and "--use_galore with LoRA" in p.stderr, p.stderr[-300:])


def main():
    tmp = tempfile.mkdtemp(prefix="glm_galore_")
    try:
        driver_cases(tmp)
        if "--driver-only" not in sys.argv:
            cli_cases(tmp)
            plan_case(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import test_lora_cli
    sys.exit(1 if test_lora_cli.fails else 0)


if __name__ == "__main__":
    main()
