#!/usr/bin/env python3
"""P-Tuning v2 (issue 16) against the PyTorch fp32 reference, on the CPU.

1. The reference first (glm_ref.py's prefix= path, prefix_encoder, prefix_past):
   - THUDM oracle shared/oracles/chatglm-cpp/glm_ptuning_v2_model.data (the original
     modeling_chatglm.py with pre_seq_len 5, 1 layer, hidden 32): the fp16 prefix cache
     [2L, NH, P, HD] turned into the encoder's [P, 2LH] output, glm_ref's prompt hidden states
     (after the final LayerNorm) reproduce y1 within 1e-5, and the two KV-cache decode steps
     after it y2 and y3; controls that must miss by > 1e-3: no prefix, keys/values slots
     swapped, prefix keys rotated as positions 0..P-1;
   - glm_ref.prefix_encoder equals THUDM's PrefixEncoder (the torch modules, both
     prefix_projection modes, state dict loaded strictly by the row names without
     "transformer.prefix_encoder."), and prefix_past equals get_prompt's view/permute/split.
2. The C model through $GLM_BUILD/tests/tool_model_driver --finetuning_type ptuning
   --pre_seq_len P [--prefix_projection] [--adapter FILE] against glm_ref.train_ptuning: the
   loss, every trainable gradient, the gradient norm, 3 AdamW steps (losses and the trained
   tensors), all within 1e-5 relative; the frozen base tensors after those steps bit-identical;
   the driver's table holds exactly the prefix rows as trainable and every base row as frozen.
   Cases: with and without projection, tied and untied heads, padded ragged batches (one with an
   empty prompt, one [MASK]-only row), P 4 and 8, 2-3 layers of hidden 32/64; prefixes read from
   a safetensors file with the row names, or glmtrain's own initial values
   (glm_model_init_adapters: the embedding N(0, 1) as nn.Embedding, the Linear layers as torch's
   default U(+-1/sqrt(in))), checked for those distributions; gradient checkpointing
   bit-identical. Each case checks that its fp32 reference agrees with float64 (< TOL/3) and
   that the prefix moves the loss (a model ignoring it cannot pass).
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import glm_ref  # noqa: E402
import test_model_vs_torch as V  # noqa: E402  (make_cfg, make_rows, rel, find_driver)
import test_glm_ref_oracle as O  # noqa: E402  (ORACLE_DIRS, ORACLE_CFG, load_oracle)
import test_lora_ref as LR  # noqa: E402  (run_driver, worst)

torch.set_num_threads(2)
TOL = 1e-5
failures = 0


def report(name, ok, detail):
    global failures
    failures += not ok
    print(("PASS %s (%s)" if ok else "FAIL %s: %s") % (name, detail))
    sys.stdout.flush()


def skip(name, why):
    print("SKIP %s: %s" % (name, why))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# 1. the reference

def find_ptuning_oracle():
    for d in O.ORACLE_DIRS:
        if d:
            p = os.path.join(d, "chatglm-cpp", "glm_ptuning_v2_model.data")
            if os.path.isfile(p):
                return p
    return None


def load_ptuning_oracle(path, tmp):
    """(cfg, params, data, kv [P, 2LH]) from the file: the fp16 cache [2L, NH, P, HD], then the
    items of glm_model.data (parsed by test_glm_ref_oracle.load_oracle)."""
    cfg = glm_ref.load_config(O.ORACLE_CFG)
    L, NH = cfg["num_layers"], cfg["num_attention_heads"]
    HD = cfg["hidden_size"] // NH
    P = 5
    raw = open(path, "rb").read()
    n = 2 * L * NH * P * HD
    cache = torch.from_numpy(np.frombuffer(raw, dtype=np.float16, count=n).astype(np.float32)).view(2 * L, NH, P, HD)
    rest = os.path.join(tmp, "glm_model_rest.data")
    with open(rest, "wb") as f:
        f.write(raw[2 * n:])
    cfg, params, data = O.load_oracle(rest)
    # README: the cache is the encoder's output viewed [P, 2L, NH, HD], permuted to [2L, NH, P, HD]
    kv = cache.permute(2, 0, 1, 3).reshape(P, 2 * L * NH * HD).contiguous()
    return cfg, params, data, kv


def oracle_steps(cfg, params, data, prefix):
    """The oracle's prompt (explicit positions/mask as in its README) with prefix, then two
    decode steps on the presents (which hold the prefix)."""
    x1 = data["x1"].long().view(1, 3)
    pos = torch.tensor([[[0, 1, 1], [0, 0, 1]]])
    mask = torch.tensor([[[[False, False, True], [False, False, True], [False, False, False]]]])
    o = glm_ref.forward(cfg, params, x1, position_ids=pos, attention_mask=mask, use_cache=True, prefix=prefix)
    outs, past = [o["hidden"][0]], o["presents"]
    for key, p in (("x2", (1, 2)), ("x3", (1, 3))):
        o = glm_ref.forward(cfg, params, data[key].long().view(1, 1), position_ids=torch.tensor([[[p[0]], [p[1]]]]),
                            past_key_values=past, use_cache=True)
        past = o["presents"]
        outs.append(o["hidden"][0, 0])
    return outs


def rotated(cfg, prefix):
    """The control: prefix keys rotated as positions 0..P-1 (first half; block positions 0)."""
    out = []
    for k, v in prefix:
        P, hd = k.shape[0], k.shape[-1]
        cos, sin = glm_ref.rotary_tables(hd // 2, P, k.dtype)
        pos = torch.arange(P).view(P, 1).expand(P, k.shape[1])
        k1, k2 = k.chunk(2, dim=-1)
        out.append((torch.cat([glm_ref.apply_rotary(k1, cos, sin, pos), k2], dim=-1), v))
    return tuple(out)


def test_oracle(tmp):
    path = find_ptuning_oracle()
    if path is None:
        skip("ptuning_oracle_y1", "shared/oracles/chatglm-cpp/glm_ptuning_v2_model.data not found")
        return
    cfg, params, data, kv = load_ptuning_oracle(path, tmp)
    want = [data["y1"], data["y2"], data["y3"]]
    with torch.no_grad():
        # the whole no-projection path: the cache is the embedding the encoder returns
        prefix = glm_ref.ptuning_prefix(cfg, {glm_ref.PREFIX + "embedding.weight": kv}, False)
        got = oracle_steps(cfg, params, data, prefix)
        errs = [(g - w).abs().max().item() for g, w in zip(got, want)]
        report("ptuning_oracle_y1", errs[0] < 1e-5,
               "prompt hidden states max|diff| %.2e (tol 1e-5), P 5, 1 layer hidden 32" % errs[0])
        report("ptuning_oracle_decode_after_prefix", max(errs[1:]) < 1e-5,
               "decode steps on the presents: max|diff| %.2e %.2e" % tuple(errs[1:]))
        controls = {
            "no prefix": oracle_steps(cfg, params, data, None)[0],
            "K/V slots swapped": oracle_steps(cfg, params, data, tuple((v, k) for k, v in prefix))[0],
            "prefix keys rotated": oracle_steps(cfg, params, data, rotated(cfg, prefix))[0],
        }
        cerr = {k: (v - want[0]).abs().max().item() for k, v in controls.items()}
        report("ptuning_oracle_controls_fail", min(cerr.values()) > 1e-3,
               "y1 max|diff| must exceed 1e-3: " + ", ".join("%s %.2e" % kv_ for kv_ in cerr.items()))


class ThudmPrefixEncoder(torch.nn.Module):
    """THUDM chatglm-6b modeling_chatglm.py's PrefixEncoder, as the spec (section 10) gives it."""

    def __init__(self, P, H, L, projection):
        super().__init__()
        self.prefix_projection = projection
        if projection:
            self.embedding = torch.nn.Embedding(P, H)
            self.trans = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Tanh(), torch.nn.Linear(H, L * H * 2))
        else:
            self.embedding = torch.nn.Embedding(P, L * H * 2)

    def forward(self, prefix):
        e = self.embedding(prefix)
        return self.trans(e) if self.prefix_projection else e


def thudm_get_prompt(cfg, enc, P, b):
    """get_prompt (dropout 0): [b, P, 2LH] -> view -> permute [2L, P, b, NH, HD] -> split(2)."""
    L, NH, H = cfg["num_layers"], cfg["num_attention_heads"], cfg["hidden_size"]
    tokens = torch.arange(P).long().unsqueeze(0).expand(b, -1)
    pkv = enc(tokens).view(b, P, L * 2, NH, H // NH)
    return pkv.permute([2, 1, 0, 3, 4]).split(2)


def test_prefix_encoder_vs_thudm():
    cfg = V.make_cfg(3, 32, 4, 128, True)
    ok, det = True, []
    for projection in (False, True):
        P = 6
        torch.manual_seed(5 + projection)
        enc = ThudmPrefixEncoder(P, cfg["hidden_size"], cfg["num_layers"], projection)
        names = sorted(glm_ref.PREFIX + k for k in enc.state_dict())
        want_names = sorted(n for n, _ in glm_ref.prefix_shapes(cfg, P, projection))
        shapes_ok = names == want_names and all(
            tuple(enc.state_dict()[n[len(glm_ref.PREFIX):]].shape) == s for n, s in glm_ref.prefix_shapes(cfg, P, projection))
        pp = glm_ref.init_prefix(cfg, P, projection, seed=7)
        enc.load_state_dict({k[len(glm_ref.PREFIX):]: v for k, v in pp.items()}, strict=True)
        with torch.no_grad():
            got = glm_ref.prefix_encoder(pp, projection)
            want = enc(torch.arange(P).long())
            e_enc = (got - want).abs().max().item()
            prompt = thudm_get_prompt(cfg, enc, P, 2)
            mine = glm_ref.ptuning_prefix(cfg, pp, projection)
            e_kv = max(max((m[0].expand_as(t[0]) - t[0]).abs().max().item(), (m[1].expand_as(t[1]) - t[1]).abs().max().item())
                       for m, t in zip(mine, prompt))
        ok = ok and shapes_ok and e_enc < 1e-6 and e_kv < 1e-6 and len(prompt) == cfg["num_layers"]
        det.append("%s: names/shapes %s, encoder max|diff| %.1e, past max|diff| %.1e" % (
            "projection" if projection else "no projection", "ok" if shapes_ok else "%s vs %s" % (names, want_names),
            e_enc, e_kv))
    report("prefix_encoder_equals_thudm_module", ok, "; ".join(det))


# ---------------------------------------------------------------------------------------------
# 2. the driver against glm_ref

OPTS = dict(steps=3, lr=1e-4, weight_decay=0.1, eps=1e-5)
# name, model (layers, hidden, heads, inner), tied, rows (test_model_vs_torch.make_rows), P,
# prefix_projection, where the prefix comes from ("file": safetensors with the row names; "init":
# glmtrain's own initial values), also run with --gradient_checkpointing
CASES = [
    ("PT_noproj_tied_P4", (2, 64, 4, 256), True, [(5, 4), (9, 1), (2, 7)], 4, False, "file", False),
    ("PT_proj_untied_P8", (3, 32, 4, 128), False, [(3, 6), (8, 2), (1, 1), (6, 5, "mask_and_gmask")], 8, True, "file", True),
    ("PT_noproj_untied_P8", (2, 32, 4, 128), False, [(7, 3), (0, 5), (4, 9)], 8, False, "file", True),
    ("PT_proj_tied_P4", (2, 64, 4, 256), True, [(2, 2), (10, 4, "mask_only"), (5, 0)], 4, True, "file", False),
    ("PT_proj_tied_init", (2, 64, 4, 256), True, [(4, 4), (7, 2)], 4, True, "init", False),
    ("PT_noproj_untied_init", (2, 32, 4, 128), False, [(6, 3), (2, 5), (9, 1)], 8, False, "init", False),
]


def check_init(name, cfg, P, projection, pp):
    """glm_model_init_adapters against THUDM's modules: nn.Embedding N(0, 1); nn.Linear weight
    kaiming_uniform(a = sqrt(5)) = U(+-1/sqrt(in)), bias U(+-1/sqrt(in))."""
    bad = []
    want = dict(glm_ref.prefix_shapes(cfg, P, projection))
    if sorted(pp) != sorted(want):
        report(name + "_init_like_torch", False, "rows %s, want %s" % (sorted(pp), sorted(want)))
        return
    for k, v in pp.items():
        v = v.double()
        if tuple(v.shape) != want[k]:
            bad.append("%s shape %s" % (k, tuple(v.shape)))
            continue
        if k.endswith("embedding.weight"):
            m, sd = v.mean().item(), v.std().item()
            if abs(m) > 0.15 or abs(sd - 1.0) > 0.15:
                bad.append("%s mean %.3f std %.3f, want N(0, 1)" % (k, m, sd))
            continue
        b = 1.0 / math.sqrt(cfg["hidden_size"])  # in_features of both Linear layers is H
        mx, sd = v.abs().max().item(), v.std().item()
        if mx > b * (1 + 1e-6) or mx < 0.75 * b or abs(sd - b / math.sqrt(3)) > 0.25 * b / math.sqrt(3):
            bad.append("%s max %.4f std %.4f, want <= %.4f and std %.4f" % (k, mx, sd, b, b / math.sqrt(3)))
    heads = [tuple(v.flatten()[:4].tolist()) for v in pp.values()]
    distinct = len(set(heads)) == len(heads)
    report(name + "_init_like_torch", not bad and distinct,
           "%d rows: embedding N(0,1), Linear U(+-1/sqrt(H)), streams distinct" % len(pp) if not bad and distinct
           else "; ".join(bad[:3]) + ("" if distinct else " (rows start with the same values)"))


def driver_case(driver, tmp, ci, name, shape, tied, lengths, P, projection, src, ckpt):
    layers, hidden, heads, inner = shape
    cfg = V.make_cfg(layers, hidden, heads, inner, tied)
    ids_rows, label_rows = V.make_rows(cfg, lengths, seed=600 + ci)
    # weights of std 0.1 (not 0.02): with alpha = sqrt(56) on the residual, a small model of std
    # 0.02 weights hardly feels its attention, prefix included
    params = glm_ref.init_params(cfg, seed=700 + ci, std=0.1)
    ids, labels, mdir, bpath = LR.write_case(tmp, name, cfg, params, ids_rows, label_rows)
    flags = ["--finetuning_type", "ptuning", "--pre_seq_len", str(P)] + (["--prefix_projection"] if projection else [])
    base_names = [n for n, _ in glm_ref.param_shapes(cfg)]
    if src == "init":
        # glmtrain's own initial prefix encoder: read back from a run with lr 0 (AdamW then
        # leaves every value as it was)
        try:
            got0 = LR.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".init.safetensors"),
                                 flags + ["--adapter_seed", "13"], dict(steps=1, lr=0.0))
        except Exception as e:
            report(name + "_driver", False, str(e)[:500])
            return
        pp = {k[len("param/"):]: v for k, v in got0.items() if k.startswith("param/")}
        check_init(name, cfg, P, projection, pp)
        if sorted(pp) != sorted(n for n, _ in glm_ref.prefix_shapes(cfg, P, projection)):
            return
        flags += ["--adapter_seed", "13"]
    else:
        pp = glm_ref.init_prefix(cfg, P, projection, seed=800 + ci, std_emb=1.0)
        from safetensors.torch import save_file
        path = os.path.join(tmp, name + ".prefix.safetensors")
        save_file({k: v.contiguous() for k, v in pp.items()}, path)
        flags += ["--adapter", path]
    trainable = [n for n, _ in glm_ref.prefix_shapes(cfg, P, projection)]

    ref = glm_ref.train_ptuning(cfg, params, ids, labels, pp, projection, **OPTS)
    r64 = glm_ref.train_ptuning(cfg, {k: v.double() for k, v in params.items()}, ids, labels,
                                {k: v.double() for k, v in pp.items()}, projection, **OPTS)
    cond = max([(V.rel(ref["grads"][k], r64["grads"][k]), "grad " + k) for k in trainable] +
               [(V.rel(ref["params"][k], r64["params"][k]), "param " + k) for k in trainable] +
               [(abs(a - b) / abs(b), "loss") for a, b in zip(ref["losses"], r64["losses"])])
    report(name + "_ref_conditioning", cond[0] < TOL / 3,
           "fp32 vs float64 reference worst %s rel %.1e, must be < %.1e" % (cond[1], cond[0], TOL / 3))
    # the prefix matters: without it the loss and the logits move far beyond TOL; every
    # trainable gradient is nonzero (a model ignoring the prefix cannot pass)
    with torch.no_grad():
        plain = glm_ref.forward(cfg, params, ids, labels)
        withp = glm_ref.forward(cfg, params, ids, labels, prefix=glm_ref.ptuning_prefix(cfg, pp, projection))
    moved = abs(plain["loss"].item() - ref["loss"]) / abs(ref["loss"])
    lmoved = V.rel(withp["logits"], plain["logits"])
    zero = [k for k in trainable if not bool(ref["grads"][k].abs().max() > 0)]
    # (the loss, a mean over many targets, moves less than the logits do)
    report(name + "_prefix_matters", moved > 3 * TOL and lmoved > 100 * TOL and not zero,
           "loss with prefix %.6f, without %.6f (rel %.1e, must be > %.0e), logits rel %.1e (> %.0e); zero gradients: %s" % (
               ref["loss"], plain["loss"].item(), moved, 3 * TOL, lmoved, 100 * TOL, zero or "none"))
    try:
        got = LR.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".out.safetensors"), flags, OPTS)
    except Exception as e:
        report(name + "_driver", False, str(e)[:500])
        return
    print("# %s: %d layers hidden %d %s, P %d %s, batch %dx%d, prefix from %s" % (
        name, layers, hidden, "tied" if tied else "untied", P, "projection" if projection else "no projection",
        ids.shape[0], ids.shape[1], src))

    have = sorted(k[5:] for k in got if k.startswith("grad/"))
    fro = sorted(k[7:] for k in got if k.startswith("fparam/"))
    tab_ok = have == sorted(trainable) and fro == sorted(base_names)
    report(name + "_table", tab_ok, "%d trainable rows (the prefix encoder), %d frozen rows" % (len(have), len(fro)) if tab_ok
           else "trainable extra %s missing %s; frozen extra %s missing %s" % (
               sorted(set(have) - set(trainable))[:3], sorted(set(trainable) - set(have))[:3],
               sorted(set(fro) - set(base_names))[:3], sorted(set(base_names) - set(fro))[:3]))
    e = abs(got["loss"].item() - ref["loss"]) / abs(ref["loss"])
    report(name + "_loss", e < TOL, "C %.7f torch %.7f rel %.1e" % (got["loss"].item(), ref["loss"], e))
    ok, txt = LR.worst([(V.rel(got["grad/" + k], ref["grads"][k]) if "grad/" + k in got else float("inf"), k)
                        for k in trainable])
    report(name + "_grads", ok, txt)
    e = abs(got["grad_norm"].item() - ref["grad_norm"]) / ref["grad_norm"]
    report(name + "_grad_norm", e < TOL, "C %.7f torch %.7f rel %.1e" % (got["grad_norm"].item(), ref["grad_norm"], e))
    gl = got["losses"].tolist() if "losses" in got else []
    le = max(abs(a - b) / abs(b) for a, b in zip(gl, ref["losses"])) if len(gl) == len(ref["losses"]) else float("inf")
    ok, txt = LR.worst([(V.rel(got["param/" + k], ref["params"][k]) if "param/" + k in got else float("inf"), k)
                        for k in trainable])
    report(name + "_adamw_steps", ok and le < TOL, "losses rel %.1e over %d steps; trained tensors: %s" % (le, OPTS["steps"], txt))
    diff = [k for k in base_names if "fparam/" + k not in got or not torch.equal(got["fparam/" + k], params[k])]
    report(name + "_frozen_bit_identical", not diff,
           "%d frozen tensors unchanged after %d steps" % (len(base_names), OPTS["steps"]) if not diff
           else "%d changed or missing, first %s" % (len(diff), diff[:3]))
    for level, label in ([("", "_checkpointing_identical"), ("selective", "_selective_checkpointing_identical")]
                         if ckpt else []):
        try:
            got2 = LR.run_driver(driver, mdir, bpath, os.path.join(tmp, name + ".ckpt%s.safetensors" % level),
                                 flags + ["--gradient_checkpointing"] + ([level] if level else []), OPTS)
        except Exception as e:
            report(name + label, False, str(e)[:500])
            continue
        diff = sorted(k for k in set(got) | set(got2) if k not in got or k not in got2 or not torch.equal(got[k], got2[k]))
        report(name + label, not diff, "%d outputs bit-identical" % len(got) if not diff
               else "%d of %d outputs differ: %s" % (len(diff), len(got), diff[:3]))


def train_2ranks(tmp):
    """P-Tuning v2 through `glmtrain train`: 2 CPU ranks (ZeRO 0 and 1) equal 1 rank (prefix
    dropout 0: its masks are drawn per micro-batch), and a resumed run reproduces the steps."""
    import test_train as T
    import mpi_runs as M
    why = T.parallel_missing()
    if why:
        skip("train_ptuning_2ranks", why)
        return
    d = os.path.join(tmp, "train")
    os.makedirs(d)
    cfg_path, flags = T.parallel_setup(d)
    cfg = glm_ref.load_config(cfg_path)
    base = os.path.join(d, "base")
    glm_ref.save_model_dir(base, cfg, glm_ref.init_params(cfg, seed=4, std=0.1))
    i = flags.index("--init_from_config")
    flags = flags[:i] + ["--model_name_or_path", base] + flags[i + 2:]
    pt = ["--pre_seq_len", "4", "--prefix_projection", "--prefix_dropout", "0", "--max_steps", "8", "--save_steps", "4"]
    one = os.path.join(d, "one")
    M.run(flags + pt + ["--per_device_train_batch_size", "4", "--output_dir", one])
    want = M.losses(one, 8)
    from safetensors.torch import load_file
    want_w = load_file(os.path.join(one, "model.safetensors"))
    if not M.probe(flags + pt + ["--per_device_train_batch_size", "2", "--max_steps", "1", "--save_strategy", "no",
                                 "--output_dir", os.path.join(d, "probe")], "train_ptuning_2ranks", "2-rank P-Tuning probe"):
        return
    for zero in (0, 1):
        two = os.path.join(d, "two-z%d" % zero)
        M.run(flags + pt + ["--per_device_train_batch_size", "2", "--zero_stage", str(zero), "--output_dir", two], np=2)
        err, n = M.rel(M.losses(two, 8), want)
        got_w = load_file(os.path.join(two, "model.safetensors"))
        we = max(float((got_w[k] - v).abs().max() / v.abs().max()) for k, v in want_w.items())
        report("train_ptuning_2ranks_zero%d_matches_1rank" % zero, n == 8 and err < 1e-6 and we < TOL,
               "losses max rel %.1e over %d steps, prefix encoder max rel %.1e" % (err, n, we))
    res = os.path.join(d, "resumed")
    os.makedirs(res)
    shutil.copytree(os.path.join(one, "checkpoint-4"), os.path.join(res, "checkpoint-4"))
    M.run(flags + pt + ["--per_device_train_batch_size", "4", "--output_dir", res, "--resume_from_checkpoint"])
    got = M.losses(res, 8)
    same = all(s in got and got[s] == want[s] for s in range(5, 9))
    fa, fb = (open(os.path.join(x, "model.safetensors"), "rb").read() for x in (one, res))
    report("train_ptuning_resume_bit_exact", same and fa == fb, "steps 5-8 %s, prefix files %s" % (
        "identical" if same else "differ", "byte-identical" if fa == fb else "differ"))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="glm_ptuning_ref_") as tmp:
        for t in (test_oracle, test_prefix_encoder_vs_thudm):
            try:
                t(tmp) if t is test_oracle else t()
            except Exception as e:
                report(t.__name__, False, "%s: %s" % (type(e).__name__, str(e)[:600]))
        driver = V.find_driver()
        if driver is None:
            skip("ptuning_driver_all", "%s/tests/tool_model_driver not built" % os.environ.get("GLM_BUILD", "build"))
        else:
            for ci, case in enumerate(CASES):
                try:
                    driver_case(driver, tmp, ci, *case)
                except Exception as e:
                    report(case[0], False, "%s: %s" % (type(e).__name__, str(e)[:600]))
        try:
            train_2ranks(tmp)
        except Exception as e:
            report("train_ptuning_2ranks", False, "%s: %s" % (type(e).__name__, str(e)[:600]))
    print("# test_ptuning_ref: %.1f s" % (time.time() - t0))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
