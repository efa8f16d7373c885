#!/usr/bin/env python3
"""Proves tests/py/glm_ref.py (the PyTorch fp32 reference of ChatGLM-6B v1) before it judges the
C model:

1. against outputs of the ORIGINAL THUDM modeling_chatglm.py (shared/oracles/chatglm-cpp/
   glm_model.data, a 1-layer model: 3-token prompt, then two KV-cache decode steps);
2. the same with alpha = sqrt(2) must fail (the test can fail; alpha is sqrt(56) always);
3. masks/positions derived from input_ids reproduce the oracle's explicit ones;
4. KV-cache decoding equals the full-sequence forward (2 layers, batch 2);
5. autograd gradients of the loss equal finite differences (torch.autograd.gradcheck, float64,
   micro model with tied and untied heads, ragged right-padded batch), and the reference's
   gradient checkpointing gives the same gradients.
(test_model_vs_torch.py checks, per case, that the fp32 reference agrees with a float64 run far
below the 1e-5 used against the C model.)
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm_ref  # noqa: E402

torch.set_num_threads(2)
torch.set_default_dtype(torch.float32)

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE_DIRS = [os.environ.get("GLM_ORACLES", ""),
               os.path.join(HERE, "..", "..", "..", "shared", "oracles"),
               os.path.join(HERE, "..", "..", "shared", "oracles"),
               "/work/shared/oracles"]

failures = 0


def report(name, ok, detail):
    global failures
    if ok:
        print("PASS %s (%s)" % (name, detail))
    else:
        failures += 1
        print("FAIL %s: %s" % (name, detail))


def find_oracle():
    for d in ORACLE_DIRS:
        if d:
            p = os.path.join(d, "chatglm-cpp", "glm_model.data")
            if os.path.isfile(p):
                return p
    return None


ORACLE_CFG = {"vocab_size": 5, "hidden_size": 32, "num_attention_heads": 8, "num_layers": 1,
              "inner_hidden_size": 128, "layernorm_epsilon": 1e-5, "tie_word_embeddings": True,
              # ids inside the 5-token vocab chosen so that the oracle's prompt [0, 1, 2] reads as
              # "x [gMASK] <sop>": ctx 2, mask_pos 1 -> positions [0,1,1], blocks [0,0,1]
              "bos_token_id": 2, "gmask_token_id": 1, "mask_token_id": 4, "eos_token_id": 3,
              "pad_token_id": 0}


def load_oracle(path):
    cfg = glm_ref.load_config(ORACLE_CFG)
    raw = open(path, "rb").read()
    off = 0

    def take(shape, dtype=np.float32):
        nonlocal off
        n = int(np.prod(shape))
        a = np.frombuffer(raw, dtype=dtype, count=n, offset=off).reshape(shape)
        off += n * np.dtype(dtype).itemsize
        return torch.from_numpy(a.copy())

    params = {}
    for name, shape in glm_ref.param_shapes(cfg):
        params[name] = take(shape)
    data = {"x1": take((3,), np.int32), "y1": take((3, 32)), "x2": take((1,), np.int32), "y2": take((32,)),
            "x3": take((1,), np.int32), "y3": take((32,))}
    if off != len(raw):
        raise ValueError("%s: parsed %d of %d bytes" % (path, off, len(raw)))
    return cfg, params, data


def run_oracle_steps(cfg, params, data, alpha, explicit=True):
    """Prompt then two decode steps; returns the three hidden outputs."""
    x1 = data["x1"].long().view(1, 3)
    if explicit:
        pos = torch.tensor([[[0, 1, 1], [0, 0, 1]]])
        mask = torch.tensor([[[[False, False, True], [False, False, True], [False, False, False]]]])
    else:
        pos = mask = None
    o1 = glm_ref.forward(cfg, params, x1, position_ids=pos, attention_mask=mask, use_cache=True, alpha=alpha)
    seq = x1
    outs = [o1["hidden"][0]]
    past = o1["presents"]
    for key, want_pos in (("x2", (1, 2)), ("x3", (1, 3))):
        x = data[key].long().view(1, 1)
        seq = torch.cat([seq, x], dim=1)
        p = glm_ref.decode_position_ids(seq, cfg) if not explicit else torch.tensor([[[want_pos[0]], [want_pos[1]]]])
        if not explicit and tuple(p.view(-1).tolist()) != want_pos:
            raise AssertionError("decode_position_ids gave %s, README says %s" % (p.view(-1).tolist(), want_pos))
        o = glm_ref.forward(cfg, params, x, position_ids=p, past_key_values=past, use_cache=True, alpha=alpha)
        past = o["presents"]
        outs.append(o["hidden"][0, 0])
    return outs


def test_oracle():
    path = find_oracle()
    if path is None:
        print("SKIP oracle_glm_model: shared/oracles/chatglm-cpp/glm_model.data not found")
        print("SKIP oracle_alpha_sqrt2_fails: no oracle")
        print("SKIP oracle_derived_mask_positions: no oracle")
        return
    cfg, params, data = load_oracle(path)
    want = [data["y1"], data["y2"], data["y3"]]
    with torch.no_grad():
        got = run_oracle_steps(cfg, params, data, glm_ref.ALPHA)
        errs = [(g - w).abs().max().item() for g, w in zip(got, want)]
        report("oracle_glm_model", max(errs) < 1e-5,
               "max|diff| prompt %.2e, decode1 %.2e, decode2 %.2e; tol 1e-5" % tuple(errs))

        bad = run_oracle_steps(cfg, params, data, math.sqrt(2.0))
        berrs = [(g - w).abs().max().item() for g, w in zip(bad, want)]
        report("oracle_alpha_sqrt2_fails", min(berrs) > 1e-3,
               "with alpha=sqrt(2) max|diff| %.2e %.2e %.2e (must exceed 1e-3)" % tuple(berrs))

        try:
            der = run_oracle_steps(cfg, params, data, glm_ref.ALPHA, explicit=False)
            derrs = [(g - w).abs().max().item() for g, w in zip(der, want)]
            report("oracle_derived_mask_positions", max(derrs) < 1e-5,
                   "mask/positions from ids (bos=2, gmask=1): max|diff| %.2e %.2e %.2e" % tuple(derrs))
        except AssertionError as e:
            report("oracle_derived_mask_positions", False, str(e))


def micro_cfg(tied, layers=2, hidden=8, heads=2, inner=12, vocab=11):
    return glm_ref.load_config({"vocab_size": vocab, "hidden_size": hidden, "num_layers": layers,
                                "num_attention_heads": heads, "inner_hidden_size": inner,
                                "layernorm_epsilon": 1e-5, "tie_word_embeddings": tied,
                                "mask_token_id": 6, "gmask_token_id": 7, "bos_token_id": 8,
                                "eos_token_id": 9, "pad_token_id": 3})


def test_mask_positions_rules():
    """Spec 5.2/5.3 worked example plus the [MASK]-only and ragged-padding cases."""
    cfg = glm_ref.load_config({"vocab_size": 130528, "hidden_size": 8, "num_attention_heads": 2,
                               "num_layers": 1})
    ids = torch.tensor([[5, 74874, 130001, 130004]])
    pos = glm_ref.get_position_ids(ids, cfg)
    ok = pos[0, 0].tolist() == [0, 1, 2, 2] and pos[0, 1].tolist() == [0, 0, 0, 1]
    m = glm_ref.get_masks(ids, cfg)[0, 0].tolist()
    ok = ok and m == [[False, False, False, True]] * 3 + [[False] * 4]
    # [MASK] used only when no [gMASK]; [gMASK] preferred when both occur
    ids2 = torch.tensor([[130000, 7, 130004, 9, 10], [7, 130000, 130001, 130004, 11]])
    pos2 = glm_ref.get_position_ids(ids2, cfg)
    ok2 = (pos2[0, 0].tolist() == [0, 1, 0, 0, 0] and pos2[0, 1].tolist() == [0, 0, 1, 2, 3]
           and pos2[1, 0].tolist() == [0, 1, 2, 2, 2] and pos2[1, 1].tolist() == [0, 0, 0, 1, 2])
    report("mask_position_rules", ok and ok2,
           "spec 5.2 example pos %s block %s; [MASK]/[gMASK] priority %s" %
           (pos[0, 0].tolist(), pos[0, 1].tolist(), "ok" if ok2 else pos2.tolist()))


def test_kv_cache_equals_full():
    cfg = micro_cfg(tied=False, layers=2, hidden=16, heads=2, inner=40, vocab=12)
    params = glm_ref.init_params(cfg, seed=3, std=0.3)
    prompt = torch.tensor([[1, 2, 4, 7, 8], [5, 4, 10, 7, 8]])  # "a [gMASK] <sop>"
    gen = torch.tensor([[10, 11, 2], [1, 0, 5]])
    with torch.no_grad():
        full = glm_ref.forward(cfg, params, torch.cat([prompt, gen], dim=1))["hidden"]
        o = glm_ref.forward(cfg, params, prompt, use_cache=True)
        steps = [o["hidden"]]
        seq = prompt
        for t in range(gen.shape[1]):
            x = gen[:, t:t + 1]
            seq = torch.cat([seq, x], dim=1)
            o = glm_ref.forward(cfg, params, x, position_ids=glm_ref.decode_position_ids(seq, cfg),
                                past_key_values=o["presents"], use_cache=True)
            steps.append(o["hidden"])
        inc = torch.cat(steps, dim=1)
    err = (inc - full).abs().max().item()
    report("kv_cache_decode_equals_full_forward", err < 1e-5, "max|diff| %.2e over %d tokens" % (err, full.shape[1]))


def micro_batch(cfg):
    rows = [glm_ref.make_example([1, 2, 4], [5, 10], cfg), glm_ref.make_example([4], [2, 1, 5, 0], cfg),
            glm_ref.make_example([], [10], cfg)]
    return glm_ref.pad_batch([r[0] for r in rows], [r[1] for r in rows], cfg["pad_token_id"])


def test_gradcheck():
    for tied in (True, False):
        cfg = micro_cfg(tied)
        ids, labels = micro_batch(cfg)
        p64 = glm_ref.init_params(cfg, seed=1, std=0.4, dtype=torch.float64)
        names = list(p64.keys())
        leaves = [p64[n].clone().requires_grad_(True) for n in names]

        def f(*ts):
            return glm_ref.forward(cfg, dict(zip(names, ts)), ids, labels)["loss"]
        name = "gradcheck_float64_%s" % ("tied" if tied else "untied")
        try:
            ok = torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=False)
            n = sum(t.numel() for t in leaves)
            report(name, ok, "%d parameters, %d tensors, loss %.6f" % (n, len(leaves), f(*leaves).item()))
        except RuntimeError as e:
            report(name, False, str(e).splitlines()[0][:300])
        # gradient checkpointing in the reference gives the same gradients
        if tied:
            g1 = torch.autograd.grad(f(*leaves), leaves)
            g2 = torch.autograd.grad(glm_ref.forward(cfg, dict(zip(names, leaves)), ids, labels,
                                                     checkpoint=True)["loss"], leaves)
            d = max((a - b).abs().max().item() for a, b in zip(g1, g2))
            report("ref_checkpoint_same_grads", d == 0.0, "max|diff| %.1e" % d)


def main():
    for t in (test_oracle, test_mask_positions_rules, test_kv_cache_equals_full, test_gradcheck):
        try:
            t()
        except Exception as e:  # a crash in one check is one FAIL, the others still run
            report(t.__name__, False, "%s: %s" % (type(e).__name__, e))
    sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
