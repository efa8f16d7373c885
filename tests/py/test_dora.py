#!/usr/bin/env python3
"""DoRA (--use_dora, peft's use_dora) against PyTorch fp32 references and peft 0.10, on the CPU.

1. The C model through $GLM_BUILD/tests/tool_model_driver --use_dora against glm_ref (its
   linear() with peft's DoRA: c = m / ||W + s B A|| per output row, the norm detached, out =
   base + (c - 1) W x + c s B A x): the loss, every trainable gradient (A, B and the magnitudes),
   3 AdamW steps (the magnitudes decay, as the Trainer's groups have it), all within 1e-5
   relative; the frozen tensors bit-identical; gradient checkpointing (full, selective) bit-
   identical; glmtrain's initial magnitudes equal the base's row norms. The ChatGLM2 block
   against glm2_ref with the merged weight c (W + s B A) (the same function of A, B and m).
2. peft 0.10 itself (in /usr/local/lib/glmtrain-peft-0.10, scripts/install-deps.sh; a child
   process puts it on sys.path): LoraConfig(use_dora=True) on the THUDM-style stand-in with the
   same tensors gives glm_ref's loss and gradients, and the folder its save_pretrained writes
   loads in the driver.
3. `glmtrain train --use_dora`: the adapter folder (use_dora in adapter_config.json, the
   magnitudes under peft's names) loads in peft 0.10 and gives glm_ref's logits; `glmtrain merge`
   writes c (W + s B A), and generate answers with the adapter as with the merged model; a
   resumed run is bit-exact; 2 CPU ranks (ZeRO 1, 3) equal 1;
   and serve refuses a DoRA adapter, naming merge. DoRA's default dropout is 0 (peft's and
   LLaMA-Factory's); with --lora_dropout it trains as peft computes it (case D_all_dropout:
   glmtrain's masks rebuilt in glm_ref).
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

PEFT10 = os.environ.get("GLM_PEFT10_DIR", "/usr/local/lib/glmtrain-peft-0.10")
TOL = 1e-5
ALL = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
CHECKS = harness.Checks()
report, skip = CHECKS.report, CHECKS.skip


def with_magnitudes(params, adapters, seed, prefix=""):
    """A magnitude per adapted module: its base rows' norms times 1 +- 10%, so c != 1."""
    g = torch.Generator().manual_seed(seed)
    out = dict(adapters)
    for k in list(adapters):
        if k.endswith(".lora_B.weight"):
            mod = k[:-len(".lora_B.weight")]
            W = params[prefix + mod + ".weight"]
            out[mod + ".lora_magnitude_vector"] = W.norm(dim=1) * (1 + 0.1 * torch.randn(W.shape[0], generator=g))
    return out


# ---------------------------------------------------------------------------------------------
# the peft 0.10 child: python3 test_dora.py --peft-child JOB.json

def peft_child(job_path):
    sys.path.insert(0, PEFT10)
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    import glm_ref
    import test_lora_ref as L
    job = json.load(open(job_path))
    cfg = glm_ref.load_config(os.path.join(job["model"], "config.json"))
    params = {k: v.float() for k, v in load_file(os.path.join(job["model"], "model.safetensors")).items()}
    ids = torch.tensor(job["ids"])
    out = {"version": torch.tensor([float(x) for x in peft.__version__.split(".")[:2]])}
    if "adapters" in job:  # loss and gradients with these tensors, then save_pretrained
        ad = load_file(job["adapters"])
        pm = get_peft_model(L.standin(cfg, params), LoraConfig(r=job["r"], lora_alpha=job["alpha"], use_dora=True,
                                                               use_rslora=job["rslora"], target_modules=job["targets"],
                                                               lora_dropout=0.0))
        seen = set()
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if ".lora_" in n:
                    k = L.peft_key(n).replace("lora_magnitude_vector.default", "lora_magnitude_vector")
                    p.copy_(ad[k])
                    seen.add(k)
        if seen != set(ad):
            raise RuntimeError("peft made %s, the case has %s" % (sorted(seen ^ set(ad))[:4], len(ad)))
        pm.zero_grad()
        o = pm(input_ids=ids, labels=torch.tensor(job["labels"]))
        o.loss.backward()
        out["loss"] = o.loss.detach().reshape(1)
        for n, p in pm.named_parameters():
            if p.requires_grad:
                out["grad/" + L.peft_key(n).replace("lora_magnitude_vector.default", "lora_magnitude_vector")] = p.grad
        L.save_peft(pm, job["save"], True)
    if "load" in job:  # a folder glmtrain wrote, onto the stand-in
        pm = PeftModel.from_pretrained(L.standin(cfg, params), job["load"]).eval()
        with torch.no_grad():
            out["logits"] = pm(input_ids=ids, return_dict=True).logits
    save_file({k: v.contiguous() for k, v in out.items()}, job["out"])


def run_peft(job, tmp, name):
    """The child's outputs, or None with a SKIP when peft 0.10 is not there."""
    if not os.path.exists(os.path.join(PEFT10, "peft", "tuners", "lora", "layer.py")):
        skip(name, "peft 0.10 not in %s (scripts/install-deps.sh installs it)" % PEFT10)
        return None
    job = dict(job, out=os.path.join(tmp, name + ".peft.safetensors"))
    jp = os.path.join(tmp, name + ".job.json")
    json.dump(job, open(jp, "w"))
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--peft-child", jp], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=600)
    if p.returncode != 0:
        report(name, False, "peft 0.10 child failed: %s" % p.stdout.decode(errors="replace")[-800:])
        return None
    from safetensors.torch import load_file
    return load_file(job["out"])


# ---------------------------------------------------------------------------------------------
# 1 + 2. the driver against glm_ref, and peft 0.10

OPTS = dict(steps=3, lr=1e-4, weight_decay=0.1, eps=1e-5)
CASES = [
    # name, model (layers, hidden, heads, inner), tied, rows, targets, r, alpha, rslora, checkpointing, dropout
    ("D_qkv_untied", (2, 64, 4, 256), False, [(5, 4), (9, 1), (2, 7)], ["query_key_value"], 4, 8.0, False, False, 0.0),
    ("D_all_tied_rslora", (3, 96, 6, 320), True, [(7, 3), (0, 5), (4, 9), (6, 5, "mask_and_gmask")], ALL, 8, 16.0, True,
     True, 0.0),
    # dropout 0.1 (glmtrain's masks, rebuilt by glm_ref): peft's base on x plus (c - 1) W u + c s B A u
    ("D_all_dropout", (2, 64, 4, 256), False, [(5, 4), (9, 1), (2, 7)], ALL, 4, 8.0, False, True, 0.1),
    ("L_all_dropout", (2, 64, 4, 256), True, [(5, 4), (9, 1), (2, 7)], ALL, 4, 8.0, False, False, 0.05),
]


def driver_case(driver, tmp, ci, case):
    import glm_ref
    import test_lora_ref as L
    import test_model_vs_torch as V
    name, shape, tied, lengths, targets, r, alpha, rslora, ckpt, pdrop = case
    dora = name.startswith("D_")
    cfg = V.make_cfg(*shape, tied)
    ids_rows, label_rows = V.make_rows(cfg, lengths, seed=310 + ci)
    params = glm_ref.init_params(cfg, seed=410 + ci)
    ids, labels, mdir, bpath = L.write_case(tmp, name, cfg, params, ids_rows, label_rows)
    adapters = glm_ref.init_lora(cfg, r, targets, seed=510 + ci)
    if dora:
        adapters = with_magnitudes(params, adapters, 610 + ci)
    from safetensors.torch import save_file
    apath = os.path.join(tmp, name + ".adapter.safetensors")
    save_file(adapters, apath)
    scaling = glm_ref.lora_scaling(alpha, r, rslora)
    flags = ["--finetuning_type", "lora", "--lora_rank", str(r), "--lora_alpha", repr(alpha), "--lora_target",
             ",".join(targets)] + (["--use_dora"] if dora else []) + (["--use_rslora"] if rslora else [])
    drop = None
    if pdrop:
        drop = (pdrop, 12345)
        flags += ["--lora_dropout", repr(pdrop), "--dropout_seed", "12345"]
    trainable = list(adapters)
    ref = glm_ref.train_peft(cfg, params, ids, labels, trainable, adapters, scaling, drop=drop, **OPTS)
    got = L.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".out.safetensors"), flags + ["--adapter", apath], OPTS)
    have = sorted(k[5:] for k in got if k.startswith("grad/"))
    report(name + "_table", have == sorted(trainable), "%d trainable rows (A, B, magnitudes)" % len(have)
           if have == sorted(trainable) else "extra %s missing %s" % (sorted(set(have) - set(trainable))[:3],
                                                                       sorted(set(trainable) - set(have))[:3]))
    e = abs(got["loss"].item() - ref["loss"]) / abs(ref["loss"])
    report(name + "_loss", e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), ref["loss"], e))
    ok, txt = L.worst([(V.rel(got["grad/" + k], ref["grads"][k]) if "grad/" + k in got else float("inf"), k)
                       for k in trainable])
    report(name + "_grads", ok, txt)
    le = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), ref["losses"]))
    ok, txt = L.worst([(V.rel(got["param/" + k], ref["params"][k]), k) for k in trainable])
    report(name + "_adamw_steps", ok and le < TOL, "losses rel %.1e over 3 steps; trained tensors: %s" % (le, txt))
    moved = [k for k in trainable if "magnitude" in k and not torch.equal(got["param/" + k], adapters[k])]
    frozen = [k for k in params if k not in trainable]
    diff = [k for k in frozen if "fparam/" + k not in got or not torch.equal(got["fparam/" + k], params[k])]
    if pdrop:  # the masks matter: the reference without them is another loss
        nodrop = glm_ref.train_peft(cfg, params, ids, labels, trainable, adapters, scaling, steps=0)
        e = min(V.rel(nodrop["grads"][k], ref["grads"][k]) for k in trainable)
        report(name + "_dropout_matters", e > 100 * TOL, "without the masks every gradient moves, by at least %.1e" % e)
    report(name + "_frozen_bit_identical", not diff and (moved or not dora),
           "%d frozen tensors unchanged, %d magnitudes trained" % (len(frozen), len(moved)) if not diff and moved
           else "changed %s; magnitudes moved %d" % (diff[:3], len(moved)))
    for level, label in ([("", "_checkpointing_identical"), ("selective", "_selective_checkpointing_identical")]
                         if ckpt else []):
        got2 = L.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".ck%s.safetensors" % level),
                            flags + ["--adapter", apath, "--gradient_checkpointing"] + ([level] if level else []), OPTS)
        d2 = sorted(k for k in got if k not in got2 or not torch.equal(got[k], got2[k]))
        report(name + label, not d2, "%d outputs bit-identical" % len(got) if not d2 else "differ: %s" % d2[:3])
    if pdrop or not dora:
        return
    # peft 0.10 on the same tensors: the reference is peft's DoRA
    pj = run_peft(dict(model=mdir, ids=ids.tolist(), labels=labels.tolist(), adapters=apath, r=r, alpha=alpha,
                       rslora=rslora, targets=targets, save=os.path.join(tmp, name + ".peftdir")),
                  tmp, name + "_vs_peft010")
    if pj is None:
        return
    ref0 = glm_ref.train_peft(cfg, params, ids, labels, trainable, adapters, scaling, steps=0)
    e = abs(pj["loss"].item() - ref0["loss"]) / abs(ref0["loss"])
    ok, txt = L.worst([(V.rel(pj["grad/" + k], ref0["grads"][k]) if "grad/" + k in pj else float("inf"), k)
                       for k in trainable])
    report(name + "_glm_ref_is_peft010", e < TOL and ok, "peft %s: loss rel %.1e; grads %s" % (
        ".".join(str(int(x)) for x in pj["version"].tolist()), e, txt))
    # the folder peft 0.10 wrote (adapter_config.json with use_dora, lora_magnitude_vector) in the driver
    # (the driver's table comes from its flags; glmtrain's commands take it from adapter_config.json)
    g3 = L.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".peftdir.safetensors"),
                      flags + ["--adapter", os.path.join(tmp, name + ".peftdir")], {})
    e = abs(g3["loss"].item() - ref0["loss"]) / abs(ref0["loss"])
    report(name + "_reads_peft010_folder", e < TOL, "loss C %.7f glm_ref %.7f rel %.1e" % (g3["loss"].item(), ref0["loss"], e))


def init_case(driver, tmp):
    """glmtrain's own initial DoRA adapters: A uniform, B zero, magnitudes = the base's row norms."""
    import glm_ref
    import test_lora_ref as L
    import test_model_vs_torch as V
    cfg = V.make_cfg(2, 64, 4, 256, False)
    ids_rows, label_rows = V.make_rows(cfg, [(4, 4), (7, 2)], seed=333)
    params = glm_ref.init_params(cfg, seed=444)
    ids, labels, mdir, bpath = L.write_case(tmp, "D_init", cfg, params, ids_rows, label_rows)
    flags = ["--finetuning_type", "lora", "--lora_rank", "4", "--lora_target", "query_key_value,dense_h_to_4h", "--use_dora",
             "--adapter_seed", "11"]
    got = L.run_driver(driver, mdir, bpath, os.path.join(tmp, "D_init.safetensors"), flags, dict(steps=1, lr=0.0))
    mags = {k[6:]: v for k, v in got.items() if k.startswith("param/") and "magnitude" in k}
    errs = [(V.rel(v, params[k.replace(".lora_magnitude_vector", ".weight")].norm(dim=1)), k) for k, v in mags.items()]
    ok, txt = L.worst(errs)
    report("D_init_magnitudes_are_row_norms", ok and len(mags) == 4, "%s (%d magnitudes)" % (txt, len(mags)))


def glm2_case(driver, tmp):
    """The ChatGLM2 block: DoRA on all four modules against glm2_ref with the merged weight."""
    import glm2_ref
    import test_glm2_grads as G2
    import test_lora_ref as L
    raw, cfg = G2.make_cfg(*G2.FULL[1][1])
    params = glm2_ref.init_params(cfg, seed=720)
    ids_rows, label_rows = G2.make_rows(G2.FULL[1][2], seed=820)
    ids, labels, mdir, bpath = G2.write_case(tmp, "d2", raw, params, ids_rows, label_rows)
    r, alpha = 2, 6.0
    flags = ["--finetuning_type", "lora", "--lora_rank", str(r), "--lora_alpha", repr(alpha), "--lora_target", "all",
             "--use_dora"]
    init = G2.run_driver(driver, mdir, bpath, os.path.join(tmp, "d2.init.st"), flags + ["--steps", "1", "--lr", "0"])
    g = torch.Generator().manual_seed(901)
    ad = {}
    for k, v in init.items():
        if k.startswith("param/") and (".lora_" in k):
            n = k[len("param/"):]
            ad[n] = v if ".lora_A." in n else 0.05 * torch.randn(v.shape, generator=g) if ".lora_B." in n else \
                v * (1 + 0.1 * torch.randn(v.shape, generator=g))
    from safetensors.torch import save_file
    apath = os.path.join(tmp, "d2.adapters.safetensors")
    save_file({k: v.contiguous() for k, v in ad.items()}, apath)
    s = alpha / r
    leaves = {k: v.clone().requires_grad_(True) for k, v in ad.items()}
    p = dict(params)
    for k in ad:
        if k.endswith(".lora_A.weight"):
            mod = k[:-len(".lora_A.weight")]
            A, B, m = leaves[mod + ".lora_A.weight"], leaves[mod + ".lora_B.weight"], leaves[mod + ".lora_magnitude_vector"]
            Wd = params[mod + ".weight"] + s * (B @ A)
            p[mod + ".weight"] = (m / Wd.detach().norm(dim=1)).view(-1, 1) * Wd
    out = glm2_ref.forward(cfg, p, ids, labels)
    out["loss"].backward()
    got = G2.run_driver(driver, mdir, bpath, os.path.join(tmp, "d2.st"), flags + ["--adapter", apath])
    e = abs(got["loss"].item() - out["loss"].item()) / abs(out["loss"].item())
    ok, txt = L.worst([(G2.rel(got["grad/" + k], v.grad) if "grad/" + k in got else float("inf"), k)
                       for k, v in leaves.items()])
    report("D_glm2_all_loss_grads", e < TOL and ok and len(leaves) == 3 * 4 * cfg["num_layers"],
           "loss rel %.1e; %s" % (e, txt))


# ---------------------------------------------------------------------------------------------
# 3. glmtrain train --use_dora, merge

def train_checks(tmp):
    import glm_ref
    import mpi_runs as M
    import test_model_vs_torch as V
    import test_train as T
    if not os.path.exists(T.GLM) or not shutil.which("spm_train"):
        skip("dora_train_all", "%s or spm_train (Debian sentencepiece) missing" % T.GLM)
        return
    d = os.path.join(tmp, "train")
    os.makedirs(d)
    cfg_path, flags = T.parallel_setup(d)
    cfg = glm_ref.load_config(cfg_path)
    params = glm_ref.init_params(cfg, seed=19, std=0.05)
    base = os.path.join(d, "base")
    glm_ref.save_model_dir(base, cfg, params)
    i = flags.index("--init_from_config")
    flags = flags[:i] + ["--model_name_or_path", base] + flags[i + 2:]
    dora = ["--finetuning_type", "lora", "--lora_rank", "4", "--lora_target", "query_key_value,dense_4h_to_h", "--use_dora",
            "--per_device_train_batch_size", "4", "--max_steps", "6", "--save_steps", "3"]
    drp = os.path.join(d, "dropout")
    M.run(flags + dora + ["--lora_dropout", "0.1", "--save_strategy", "no", "--output_dir", drp])
    dc = json.load(open(os.path.join(drp, "adapter_config.json")))
    report("train_dora_with_dropout", dc.get("use_dora") is True and dc.get("lora_dropout") == 0.1,
           "use_dora %s, lora_dropout %s" % (dc.get("use_dora"), dc.get("lora_dropout")))
    out = os.path.join(d, "dora6")
    M.run(flags + dora + ["--output_dir", out])
    acfg = json.load(open(os.path.join(out, "adapter_config.json")))
    from safetensors.torch import load_file
    ad = load_file(os.path.join(out, "adapter_model.safetensors"))
    mags = sorted(k for k in ad if k.endswith(".lora_magnitude_vector"))
    report("train_dora_writes_peft_dora_adapter", acfg.get("use_dora") is True and acfg.get("lora_dropout") == 0
           and len(mags) == 2 * cfg["num_layers"] and len(ad) == 3 * len(mags),
           "use_dora %s, lora_dropout %s, %d magnitudes of %d tensors" % (acfg.get("use_dora"), acfg.get("lora_dropout"),
                                                                          len(mags), len(ad)))
    adapters = {k[len("base_model.model."):]: v for k, v in ad.items()}
    scaling = glm_ref.lora_scaling(acfg["lora_alpha"], acfg["r"])
    ids_rows, _ = V.make_rows(cfg, [(5, 4), (9, 2), (3, 7)], seed=77)
    ids, _ = glm_ref.pad_batch(ids_rows, None, cfg["pad_token_id"])
    with torch.no_grad():
        want = glm_ref.forward(cfg, params, ids, lora=(adapters, scaling))["logits"]
        plain = glm_ref.forward(cfg, params, ids)["logits"]
    pj = run_peft(dict(model=base, ids=ids.tolist(), load=out), tmp, "train_dora_adapter_loads_in_peft010")
    if pj is not None:
        e, effect = V.rel(pj["logits"], want), V.rel(plain, want)
        report("train_dora_adapter_loads_in_peft010", e < TOL and effect > 100 * TOL,
               "logits rel %.1e vs glm_ref with the adapter (which moves them by %.1e)" % (e, effect))
    # merge: c (W + s B A) per adapted module, the rest as the base
    mdir = os.path.join(d, "merged")
    p = subprocess.run([T.GLM, "merge", "--model_name_or_path", base, "--adapter", out, "--output_dir", mdir,
                        "--dtype", "float32"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if p.returncode != 0:
        report("merge_dora", False, p.stdout.decode(errors="replace")[-500:])
    else:
        merged = {}
        for f in os.listdir(mdir):
            if f.endswith(".safetensors"):
                merged.update(load_file(os.path.join(mdir, f)))
        worst = 0.0
        for k, W in params.items():
            mod = k[:-len(".weight")]
            if mod + ".lora_A.weight" in adapters:
                Wd = W + scaling * adapters[mod + ".lora_B.weight"] @ adapters[mod + ".lora_A.weight"]
                W = (adapters[mod + ".lora_magnitude_vector"] / Wd.norm(dim=1)).view(-1, 1) * Wd
            worst = max(worst, V.rel(merged[k], W) if k in merged else float("inf"))
        mp = {k: merged[k] for k in params}
        with torch.no_grad():
            ml = glm_ref.forward(cfg, mp, ids)["logits"]
        e = V.rel(ml, want)
        report("merge_dora_weights_and_logits", worst < TOL and e < TOL,
               "merged tensors worst rel %.1e; its logits vs the adapter's rel %.1e" % (worst, e))
        # generate: the adapter (its norms computed once, kept over the decoding steps) and the
        # merged model answer the same tokens
        tok = flags[flags.index("--tokenizer_name") + 1]
        outs = []
        for extra in (["--model_name_or_path", base, "--adapter", out], ["--model_name_or_path", mdir]):
            g = subprocess.run([T.GLM, "generate", "--tokenizer_name", tok, "--prompt", "hello world", "--max_new_tokens",
                                "12", "--device", "cpu"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=300)
            outs.append((g.returncode, g.stdout.decode(errors="replace"), g.stderr.decode(errors="replace")[-300:]))
        sv = subprocess.run([T.GLM, "serve", "--model_name_or_path", base, "--tokenizer_name", tok, "--adapter", "a=" + out,
                             "--port", "0", "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        msg = sv.stderr.decode(errors="replace")
        report("serve_refuses_dora_adapter_naming_merge", sv.returncode != 0 and "DoRA adapter" in msg and "glmtrain merge" in msg,
               "exit %d: %s" % (sv.returncode, msg.strip().splitlines()[-1][:160] if msg.strip() else ""))
        report("generate_dora_adapter_equals_merged", outs[0][0] == 0 and outs[0][:2] == outs[1][:2] and outs[0][1].strip(),
               "both answer %r" % outs[0][1].strip()[:80] if outs[0][:2] == outs[1][:2] else "%r vs %r (%s)" % (
                   outs[0][1][:80], outs[1][1][:80], outs[0][2]))
    # resume: checkpoint-3 + 3 steps == 6 steps, bit for bit
    res = os.path.join(d, "dora-resumed")
    os.makedirs(res)
    shutil.copytree(os.path.join(out, "checkpoint-3"), os.path.join(res, "checkpoint-3"))
    M.run(flags + dora + ["--output_dir", res, "--resume_from_checkpoint"])
    la, lb = M.losses(out, 6), M.losses(res, 6)
    same_l = len(la) == 6 and all(s in lb and la[s] == lb[s] for s in range(4, 7))
    fa = open(os.path.join(out, "adapter_model.safetensors"), "rb").read()
    fb = open(os.path.join(res, "adapter_model.safetensors"), "rb").read()
    report("train_dora_resume_bit_exact", same_l and fa == fb, "steps 4-6 losses %s, adapter files %s" % (
        "identical" if same_l else "%s vs %s" % (la, lb), "byte-identical" if fa == fb else "differ"))
    # 2 CPU ranks (ZeRO 1, and 3: the magnitudes gathered with their layer) == 1 rank
    why = T.parallel_missing()
    if why:
        skip("train_dora_2ranks", why)
        return
    i = dora.index("--per_device_train_batch_size")
    two_flags = dora[:i] + dora[i + 2:]
    want_a = load_file(os.path.join(out, "adapter_model.safetensors"))
    for zero in (1, 3):
        two = os.path.join(d, "dora-2ranks-z%d" % zero)
        M.run(flags + two_flags + ["--per_device_train_batch_size", "2", "--zero_stage", str(zero), "--output_dir", two], np=2)
        err, n = M.rel(M.losses(two, 6), la)
        got_a = load_file(os.path.join(two, "adapter_model.safetensors"))
        ae = max(V.rel(got_a[k], want_a[k]) if k in got_a else float("inf") for k in want_a)
        report("train_dora_2ranks_zero%d_matches_1rank" % zero, n == 6 and err < 1e-6 and ae < TOL,
               "losses max rel %.1e over %d steps, adapters max rel %.1e" % (err, n, ae))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--peft-child":
        peft_child(sys.argv[2])
        return 0
    import test_model_vs_torch as V
    torch.set_num_threads(2)
    t0 = time.time()
    driver = V.find_driver()
    with tempfile.TemporaryDirectory(prefix="glm_dora_") as tmp:
        if driver is None:
            skip("dora_all", "%s/tests/tool_model_driver not built" % os.environ.get("GLM_BUILD", "build"))
            return 0
        for ci, case in enumerate(CASES):
            try:
                driver_case(driver, tmp, ci, case)
            except Exception as e:
                report(case[0], False, "%s: %s" % (type(e).__name__, str(e)[:600]))
        for fn in (init_case, glm2_case):
            try:
                fn(driver, tmp)
            except Exception as e:
                report(fn.__name__, False, "%s: %s" % (type(e).__name__, str(e)[:600]))
        try:
            train_checks(tmp)
        except Exception as e:
            report("dora_train", False, "%s: %s" % (type(e).__name__, str(e)[-1500:]))
    print("# test_dora: %.1f s" % (time.time() - t0))
    return CHECKS.status()


if __name__ == "__main__":
    sys.exit(main())
