#!/usr/bin/env python3
"""The C model's ChatGLM2 block (ChatGLM2-6B / ChatGLM3-6B / GLM-4) against the PyTorch fp32
reference tests/py/glm2_ref.py (itself checked against THUDM's oracle by test_glm2_ref_oracle.py):
loss and every trainable gradient within 1e-5 relative, for full fine-tuning and LoRA, on 2- and
3-layer models with padded batches built as ChatGLM2's ptuning/main.py builds examples.

Drives $GLM_BUILD/tests/tool_model_driver (see its header). Cases:
  * full fine-tuning: A (kv_channels * heads != hidden, 2 groups), B (3 layers, 3 groups, no qkv
    bias); with --gradient_checkpointing (full and selective) bit-identical to without; 3 AdamW steps (losses and
    every parameter after them);
  * LoRA: query_key_value only, and all four modules with rslora; the reference adds
    scaling * B A to each targeted weight (peft's LoraLayer with dropout 0), gradients of A, B
    by autograd; frozen rows unchanged after the steps;
  * P-Tuning v2 as ChatGLM2's PrefixEncoder (embedding [P, 2 L G KC], or with prefix_projection
    Linear(kv, H), tanh, Linear(H, kv)): its output as every layer's past keys/values
    [P, b, G, KC] in the reference, gradients of the encoder's rows by autograd.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import glm2_ref  # noqa: E402
import glm_ref  # noqa: E402

torch.set_num_threads(2)
TOL = 1e-5
failures = 0
GMASK, SOP, EOS, PAD = 60, 61, 2, 0


def report(name, ok, detail):
    global failures
    if not ok:
        failures += 1
    print("%s %s%s %s" % ("PASS" if ok else "FAIL", name, "" if ok else ":", detail if not ok else "(%s)" % detail))
    sys.stdout.flush()


def find_driver():
    build = os.environ.get("GLM_BUILD", "build")
    for base in (os.getcwd(), REPO):
        p = os.path.join(base, build, "tests", "tool_model_driver")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    return None


def make_cfg(layers, hidden, heads, kc, groups, ffn, qkv_bias):
    raw = {"model_type": "chatglm", "padded_vocab_size": 64, "hidden_size": hidden, "num_layers": layers,
           "num_attention_heads": heads, "kv_channels": kc, "multi_query_attention": True,
           "multi_query_group_num": groups, "ffn_hidden_size": ffn, "layernorm_epsilon": 1e-5, "rmsnorm": True,
           "add_qkv_bias": qkv_bias, "add_bias_linear": False, "apply_residual_connection_post_layernorm": False,
           "post_layer_norm": True, "original_rope": True, "seq_length": 256, "eos_token_id": EOS,
           "pad_token_id": PAD, "tie_word_embeddings": False}
    return raw, glm2_ref.load_config(raw)


def make_rows(lengths, seed):
    """ChatGLM2 ptuning/main.py examples: ids = [gMASK, sop] + a + b + [eos], labels -100 over
    [gMASK, sop] + a, then b + [eos]."""
    g = torch.Generator().manual_seed(seed)
    ids, labels = [], []
    for la, lb in lengths:
        a = torch.randint(3, GMASK, (la,), generator=g).tolist()
        b = torch.randint(3, GMASK, (lb,), generator=g).tolist()
        i = [GMASK, SOP] + a + b + [EOS]
        ids.append(i)
        labels.append([-100] * (2 + la) + b + [EOS])
    return ids, labels


def write_case(tmp, name, raw, params, ids_rows, label_rows):
    from safetensors.torch import save_file
    mdir = os.path.join(tmp, name)
    os.makedirs(mdir, exist_ok=True)
    json.dump(raw, open(os.path.join(mdir, "config.json"), "w"))
    save_file({k: v.detach().float().contiguous() for k, v in params.items()}, os.path.join(mdir, "model.safetensors"))
    bpath = os.path.join(tmp, name + ".json")
    json.dump({"input_ids": ids_rows, "labels": label_rows}, open(bpath, "w"))
    ids, labels = glm_ref.pad_batch(ids_rows, label_rows, PAD)
    return ids, labels, mdir, bpath


def run_driver(driver, mdir, bpath, out, extra):
    cmd = [driver, "--model", mdir, "--batch", bpath, "--out", out] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("driver exit %d: %s" % (p.returncode, p.stdout.decode(errors="replace")[-800:]))
    from safetensors.torch import load_file
    return load_file(out)


def rel(a, b):
    m = b.abs().max().item()
    d = (a.double() - b.double()).abs().max().item()
    return float("inf") if d != d else (d / m if m > 0 else d)


def ref_loss_grads(cfg, params, ids, labels, lora=None, whole=None):
    """Loss and gradients; with lora = {module path: (A, B, scaling)} the targeted weights are
    W + scaling * B A and the gradients are those of A and B, and of the rows in whole {name:
    tensor} (peft's modules_to_save: whole copies that train beside the adapters)."""
    leaves = {}
    if lora is None:
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        leaves = p
    else:
        p = dict(params)
        for mod, (A, B, s) in lora.items():
            A = A.clone().requires_grad_(True)
            B = B.clone().requires_grad_(True)
            leaves[mod + ".lora_A.weight"] = A
            leaves[mod + ".lora_B.weight"] = B
            p[mod + ".weight"] = params[mod + ".weight"] + s * (B @ A)
        for k, v in (whole or {}).items():
            leaves[k] = p[k] = v.clone().requires_grad_(True)
    out = glm2_ref.forward(cfg, p, ids, labels)
    out["loss"].backward()
    return out["loss"].item(), {k: v.grad.detach() for k, v in leaves.items()}


def ref_ptuning(cfg, params, ids, labels, enc, proj):
    leaves = {k: v.clone().requires_grad_(True) for k, v in enc.items()}
    pre = "transformer.prefix_encoder."
    pkv = leaves[pre + "embedding.weight"]
    if proj:
        pkv = F.linear(torch.tanh(F.linear(pkv, leaves[pre + "trans.0.weight"], leaves[pre + "trans.0.bias"])),
                       leaves[pre + "trans.2.weight"], leaves[pre + "trans.2.bias"])
    P, L, G, KC = pkv.shape[0], cfg["num_layers"], cfg["kv_groups"], cfg["kv_channels"]
    b, s = ids.shape
    kv = pkv.view(P, 2 * L, G, KC)
    past = tuple((kv[:, 2 * l].unsqueeze(1).expand(P, b, G, KC), kv[:, 2 * l + 1].unsqueeze(1).expand(P, b, G, KC))
                 for l in range(L))
    pos = torch.arange(s).unsqueeze(0).repeat(b, 1)
    out = glm2_ref.forward(cfg, params, ids, labels, position_ids=pos, past_key_values=past)
    out["loss"].backward()
    return out["loss"].item(), {k: v.grad.detach() for k, v in leaves.items()}


def adamw_ref(cfg, params, ids, labels, steps, lr, wd=0.1, b1=0.9, b2=0.999, eps=1e-6):
    """torch.optim.AdamW steps on every parameter (decay on matrices, as glmtrain's groups)."""
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    decay = [v for k, v in p.items() if v.dim() >= 2]
    no = [v for k, v in p.items() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}],
                            lr=lr, betas=(b1, b2), eps=eps)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = glm2_ref.forward(cfg, p, ids, labels)["loss"]
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return losses, {k: v.detach() for k, v in p.items()}


def check_grads(name, got, ref_grads, key_prefix="grad/"):
    errs = []
    for n, g in ref_grads.items():
        t = got.get(key_prefix + n)
        if t is None or tuple(t.shape) != tuple(g.shape):
            errs.append((float("inf"), n))
        else:
            errs.append((rel(t, g), n))
    extra = sorted(k for k in got if k.startswith(key_prefix) and k[len(key_prefix):] not in ref_grads)
    errs.sort(reverse=True)
    report(name, errs[0][0] < TOL and not extra,
           "%d tensors, worst %s rel %.1e%s" % (len(errs), errs[0][1], errs[0][0],
                                                "; unexpected %s" % extra if extra else ""))


FULL = [
    # name, (layers, hidden, heads, kv_channels, groups, ffn, qkv_bias), rows (len a, len b)
    ("A", (2, 32, 4, 16, 2, 48, True), [(5, 4), (9, 1), (2, 7)]),
    ("B", (3, 48, 6, 8, 3, 40, False), [(7, 3), (0, 5), (4, 9), (12, 2)]),
]
LORA = [
    # name, model of FULL, targets, r, alpha, rslora
    ("qkv", 0, ["self_attention.query_key_value"], 4, 8.0, False),
    ("all_rslora", 1, ["self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h",
                       "mlp.dense_4h_to_h"], 2, 6.0, True),
    # with peft's modules_to_save on ChatGLM2's names: the untied output_layer and the final norm
    ("qkv_output_layer", 0, ["self_attention.query_key_value"], 4, 8.0, False, ["output_layer", "final_layernorm"]),
]


def main():
    driver = find_driver()
    if not driver:
        print("SKIP glm2_grads: tool_model_driver not built ($GLM_BUILD/tests)")
        return 0
    tmp = tempfile.mkdtemp(prefix="glm2_grads_")
    models = []
    for ci, (name, shape, lengths) in enumerate(FULL):
        raw, cfg = make_cfg(*shape)
        params = glm2_ref.init_params(cfg, seed=700 + ci)
        ids_rows, label_rows = make_rows(lengths, seed=800 + ci)
        ids, labels, mdir, bpath = write_case(tmp, "full_" + name, raw, params, ids_rows, label_rows)
        models.append((raw, cfg, params, ids, labels, mdir, bpath))
        loss, grads = ref_loss_grads(cfg, params, ids, labels)
        got = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".st"), [])
        e = abs(got["loss"].item() - loss) / abs(loss)
        report("glm2_full_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss, e))
        check_grads("glm2_full_%s_grads" % name, got, grads)
        for level, label in (("", "checkpointing"), ("selective", "selective_checkpointing")):
            ck = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".ck%s.st" % level),
                            ["--gradient_checkpointing"] + ([level] if level else []))
            same = all(torch.equal(ck[k], got[k]) for k in got if k.startswith("grad/")) and torch.equal(ck["loss"], got["loss"])
            report("glm2_full_%s_%s_bit_identical" % (name, label), same, "loss and %d gradients" %
                   sum(k.startswith("grad/") for k in got))
        # 3 AdamW steps
        lr = 1e-4
        losses, after = adamw_ref(cfg, params, ids, labels, 3, lr)
        st = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".steps.st"),
                        ["--steps", "3", "--lr", repr(lr), "--weight_decay", "0.1", "--eps", "1e-6",
                         "--max_grad_norm", "0"])
        el = max(abs(a - b) / abs(b) for a, b in zip(st["losses"].tolist(), losses))
        perr = max((rel(st["param/" + k], v), k) for k, v in after.items())
        report("glm2_full_%s_adamw_steps" % name, el < TOL and perr[0] < TOL,
               "3 steps %.5f -> %.5f, losses rel %.1e, worst parameter %s rel %.1e" % (losses[0], losses[-1], el,
                                                                                        perr[1], perr[0]))
    for name, mi, targets, r, alpha, rslora, *extra in LORA:
        raw, cfg, params, ids, labels, mdir, bpath = models[mi]
        extra = extra[0] if extra else []
        flags = ["--finetuning_type", "lora", "--lora_rank", str(r), "--lora_alpha", repr(alpha),
                 "--lora_target", ",".join(t.split(".")[-1] for t in targets), "--additional_target", ",".join(extra)]
        if rslora:
            flags.append("--use_rslora")
        # glmtrain's own initial adapters (B = 0 would hide A's gradient): take them from a first
        # run, give B values, and feed the same adapters to both sides
        init = run_driver(driver, mdir, bpath, os.path.join(tmp, "lora_%s.init.st" % name),
                          flags + ["--steps", "1", "--lr", "0"])
        g = torch.Generator().manual_seed(900)
        adapters = {}
        for k, v in init.items():
            if k.startswith("param/") and ".lora_" in k:
                n = k[len("param/"):]
                adapters[n] = v if ".lora_A." in n else 0.05 * torch.randn(v.shape, generator=g)
        whole = {k: params[k] + 0.05 * torch.randn(params[k].shape, generator=g)
                 for k in glm_ref.freeze_trainable(cfg, 1, [], extra, names=list(params))}
        adapters.update(whole)
        from safetensors.torch import save_file
        apath = os.path.join(tmp, "lora_%s.adapters.safetensors" % name)
        save_file({k: v.contiguous() for k, v in adapters.items()}, apath)
        s = alpha / (r ** 0.5 if rslora else r)
        L = cfg["num_layers"]
        lora = {}
        for l in range(L):
            for t in targets:
                mod = "transformer.encoder.layers.%d.%s" % (l, t)
                lora[mod] = (adapters[mod + ".lora_A.weight"], adapters[mod + ".lora_B.weight"], s)
        loss, grads = ref_loss_grads(cfg, params, ids, labels, lora, whole)
        got = run_driver(driver, mdir, bpath, os.path.join(tmp, "lora_%s.st" % name), flags + ["--adapter", apath])
        e = abs(got["loss"].item() - loss) / abs(loss)
        report("glm2_lora_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss, e))
        check_grads("glm2_lora_%s_grads" % name, got, grads)
        st = run_driver(driver, mdir, bpath, os.path.join(tmp, "lora_%s.steps.st" % name),
                        flags + ["--adapter", apath, "--steps", "2", "--lr", "1e-3"])
        frozen = [k for k in st if k.startswith("fparam/")]
        same = all(torch.equal(st[k], params[k[len("fparam/"):]].float()) for k in frozen)
        report("glm2_lora_%s_frozen_unchanged" % name, same and len(frozen) == len(params) - len(whole),
               "%d frozen rows bit-identical after 2 steps" % len(frozen))
    # freeze mode with LLaMA-Factory's module flags on ChatGLM2's names (self_attention,
    # output_layer): which tensors train by glm_ref.freeze_trainable's rule (LLaMA-Factory's),
    # their gradients those of the full reference
    for name, mi, n, modules, extra in (("freeze_first1_attn_head", 1, -1, ["self_attention"], ["output_layer"]),
                                        ("freeze_last1_mlp_ln1_emb", 0, 1, ["mlp", "input_layernorm"], ["word_embeddings"])):
        raw, cfg, params, ids, labels, mdir, bpath = models[mi]
        trainable = glm_ref.freeze_trainable(cfg, n, modules, extra, names=list(params))
        loss, grads = ref_loss_grads(cfg, params, ids, labels)
        flags = ["--finetuning_type", "freeze", "--num_layer_trainable", str(n), "--freeze_trainable_modules",
                 ",".join(modules), "--freeze_extra_modules", ",".join(extra)]
        got = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".st"), flags)
        e = abs(got["loss"].item() - loss) / abs(loss)
        report("glm2_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss, e))
        check_grads("glm2_%s_grads" % name, got, {k: grads[k] for k in trainable})
        st = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".steps.st"), flags + ["--steps", "2", "--lr", "1e-3"])
        frozen = sorted(k[len("fparam/"):] for k in st if k.startswith("fparam/"))
        same = all(torch.equal(st["fparam/" + k], params[k].float()) for k in frozen)
        report("glm2_%s_frozen_unchanged" % name, frozen == sorted(set(params) - set(trainable)) and same,
               "%d frozen rows bit-identical after 2 steps, %d trainable (%s, ...)" % (len(frozen), len(trainable),
                                                                                     trainable[0]))
    for name, mi, P, proj in (("ptuning", 0, 3, False), ("ptuning_proj", 1, 4, True)):
        raw, cfg, params, ids, labels, mdir, bpath = models[mi]
        H, L = cfg["hidden_size"], cfg["num_layers"]
        KV = 2 * L * cfg["kv_groups"] * cfg["kv_channels"]
        g = torch.Generator().manual_seed(950 + mi)
        pre = "transformer.prefix_encoder."
        enc = {pre + "embedding.weight": 0.5 * torch.randn(P, KV, generator=g)}
        if proj:
            enc.update({pre + "trans.0.weight": 0.1 * torch.randn(H, KV, generator=g), pre + "trans.0.bias": 0.1 * torch.randn(H, generator=g),
                        pre + "trans.2.weight": 0.3 * torch.randn(KV, H, generator=g), pre + "trans.2.bias": 0.1 * torch.randn(KV, generator=g)})
        from safetensors.torch import save_file
        apath = os.path.join(tmp, name + ".prefix.safetensors")
        save_file({k: v.contiguous() for k, v in enc.items()}, apath)
        flags = ["--finetuning_type", "ptuning", "--pre_seq_len", str(P), "--adapter", apath] + (["--prefix_projection"] if proj else [])
        loss, grads = ref_ptuning(cfg, params, ids, labels, enc, proj)
        got = run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".st"), flags)
        e = abs(got["loss"].item() - loss) / abs(loss)
        report("glm2_%s_loss" % name, e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), loss, e))
        check_grads("glm2_%s_grads" % name, got, grads)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
