#!/usr/bin/env python3
"""Proves tests/py/glm2_ref.py (the PyTorch reference of ChatGLM2-6B / ChatGLM3-6B) before it
judges the C model:

1. against outputs of THUDM's ORIGINAL ChatGLM2-6B modeling_chatglm.py (shared/oracles/
   chatglm-cpp/glm2_model.data: 1 layer, hidden 32, 8 heads of 4, 2 KV groups, ffn 48; a
   3-token prompt at positions 0-2 with the causal mask, then two KV-cache decode steps at
   positions 3 and 4), in float32 (1e-5 max-abs) and in float64 (the same bound against the
   oracle, and the fp32 run against the float64 one);
2. negative controls on the oracle: rotating the second half of each head instead of the
   first, and mapping query heads to KV groups by h % G instead of h // (NH/G), must both fail;
3. the rotary against the spec's formula written out independently (head 16, so several
   interleaved pairs and frequencies, and rope_ratio 1 and 50) -- the oracle's heads of 4 have
   a single rotated pair at theta 1, so it cannot check the pairing or the frequencies;
4. KV-cache decoding (one token per step, and a 2-token chunk with a past) equals the
   full-sequence forward, with and without left padding (2 layers, batch 2, 4 heads, 2 groups);
5. gradients: every parameter gets a finite, non-zero loss gradient on a random right-padded
   batch (ChatGLM2's config, and a variant with LayerNorm, all biases, no multi-query
   attention, post-norm residuals and no final norm), and a float64 torch.autograd.gradcheck on
   a micro model.
SKIPs (no PASS) when torch or the oracle file is missing. Prints PASS/FAIL/SKIP lines
(tests/run.sh)."""
import array
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-5
ORACLE_CHECKS = ["oracle_glm2_model_fp32", "oracle_glm2_model_fp64", "oracle_glm2_rotary_second_half_fails",
                 "oracle_glm2_group_modulo_fails"]
OTHER_CHECKS = ["rotary_matches_spec_formula", "kv_cache_decode_equals_full_forward",
                "kv_cache_left_padding_equals_full_forward", "grads_finite_nonzero_glm2",
                "grads_finite_nonzero_variant", "gradcheck_float64_micro"]

try:
    import torch
except ImportError:
    torch = None

failures = 0


def report(name, ok, detail):
    global failures
    if ok:
        print("PASS %s (%s)" % (name, detail))
    else:
        failures += 1
        print("FAIL %s: %s" % (name, detail))
    sys.stdout.flush()


def oracle_candidates():
    """$GLM_SHARED/oracles (as tests/c/oracle.h), $GLM_ORACLES, then ../shared from the
    working directory and from this file's checkout."""
    out = []
    if os.environ.get("GLM_SHARED"):
        out.append(os.path.join(os.environ["GLM_SHARED"], "oracles"))
    if os.environ.get("GLM_ORACLES"):
        out.append(os.environ["GLM_ORACLES"])
    out += [os.path.join("..", "shared", "oracles"), os.path.join(HERE, "..", "..", "..", "shared", "oracles"),
            os.path.join(HERE, "..", "..", "shared", "oracles")]
    return out


def find_oracle():
    for d in oracle_candidates():
        p = os.path.join(d, "chatglm-cpp", "glm2_model.data")
        if os.path.isfile(p):
            return p
    return None


# glm2_model.data's model (oracle README); the rest as ChatGLM2-6B's config.json
ORACLE_CFG = {"padded_vocab_size": 5, "hidden_size": 32, "num_attention_heads": 8, "kv_channels": 4,
              "num_layers": 1, "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 48,
              "layernorm_epsilon": 1e-5, "rmsnorm": True, "add_qkv_bias": True, "add_bias_linear": False,
              "apply_residual_connection_post_layernorm": False, "post_layer_norm": True,
              "original_rope": True, "seq_length": 32768}


def load_oracle(path, glm2_ref):
    cfg = glm2_ref.load_config(ORACLE_CFG)
    with open(path, "rb") as f:
        raw = f.read()
    off = 0

    def take(shape, code="f"):
        nonlocal off
        n = 1
        for d in shape:
            n *= d
        a = array.array(code)
        a.frombytes(raw[off:off + 4 * n])
        if sys.byteorder != "little":
            a.byteswap()
        off += 4 * n
        t = torch.tensor(a.tolist(), dtype=torch.float32 if code == "f" else torch.long)
        return t.view(*shape)

    params = {}
    for name, shape in glm2_ref.param_shapes(cfg):
        if name != "transformer.output_layer.weight":  # the file stops at final_layernorm
            params[name] = take(shape)
    g = torch.Generator().manual_seed(7)
    params["transformer.output_layer.weight"] = torch.rand((5, 32), generator=g) - 0.5
    data = {"x1": take((3,), "i"), "y1": take((3, 32)), "x2": take((1,), "i"), "y2": take((32,)),
            "x3": take((1,), "i"), "y3": take((32,))}
    if off != len(raw):
        raise ValueError("%s: parsed %d of %d bytes" % (path, off, len(raw)))
    return cfg, params, data


def run_oracle_steps(glm2_ref, cfg, params, data):
    """The README's three calls: prompt x1 at positions 0-2 (padding mask all ones, so THUDM
    builds no mask and attends causally), then x2 at position 3 and x3 at position 4, each
    with the previous step's cache and the grown all-ones mask (as HF generation passes it)."""
    x1 = data["x1"].view(1, 3)
    o = glm2_ref.forward(cfg, params, x1, position_ids=torch.tensor([[0, 1, 2]]),
                         attention_mask=torch.ones((1, 3), dtype=torch.long), use_cache=True)
    outs = [o["hidden"][0]]
    past = o["presents"]
    for key, pos in (("x2", 3), ("x3", 4)):
        o = glm2_ref.forward(cfg, params, data[key].view(1, 1), position_ids=torch.tensor([[pos]]),
                             attention_mask=torch.ones((1, pos + 1), dtype=torch.long),
                             past_key_values=past, use_cache=True)
        past = o["presents"]
        outs.append(o["hidden"][0, 0])
    if past[0][0].shape != (5, 1, 2, 4):
        raise AssertionError("cache after 5 tokens has shape %s, want [5, 1, 2, 4]" % (tuple(past[0][0].shape),))
    return outs


def errs_of(got, want):
    return [(g.double() - w.double()).abs().max().item() for g, w in zip(got, want)]


def test_oracle(glm2_ref):
    path = find_oracle()
    if path is None:
        for n in ORACLE_CHECKS:
            print("SKIP %s: chatglm-cpp/glm2_model.data not found under %s" % (n, ", ".join(oracle_candidates())))
        return
    cfg, params, data = load_oracle(path, glm2_ref)
    want = [data["y1"], data["y2"], data["y3"]]
    with torch.no_grad():
        got = run_oracle_steps(glm2_ref, cfg, params, data)
        e = errs_of(got, want)
        report("oracle_glm2_model_fp32", max(e) < TOL,
               "max|diff| prompt %.2e, decode1 %.2e, decode2 %.2e; tol %.0e" % (e[0], e[1], e[2], TOL))

        p64 = {k: v.double() for k, v in params.items()}
        got64 = run_oracle_steps(glm2_ref, cfg, p64, data)
        e64 = errs_of(got64, want)
        e3264 = errs_of(got, got64)
        report("oracle_glm2_model_fp64", max(e64) < TOL and max(e3264) < TOL,
               "float64 vs oracle %.2e %.2e %.2e; fp32 vs float64 %.2e %.2e %.2e; tol %.0e"
               % tuple(e64 + e3264 + [TOL]))

        # negative controls: the check can fail
        # rotary on the second half of each head instead of the first
        orig_rot = glm2_ref.apply_rotary

        def second_half(x, rope):
            n = x.shape[-1] // 2
            swap = torch.cat([x[..., n:], x[..., :n]], dim=-1)
            y = orig_rot(swap, rope)
            return torch.cat([y[..., n:], y[..., :n]], dim=-1)
        try:
            glm2_ref.apply_rotary = second_half
            bad = errs_of(run_oracle_steps(glm2_ref, cfg, params, data), want)
        finally:
            glm2_ref.apply_rotary = orig_rot
        report("oracle_glm2_rotary_second_half_fails", min(bad) > 1e-3,
               "rotating dims 2-3 of each head instead of 0-1: max|diff| %.2e %.2e %.2e (must exceed 1e-3)"
               % tuple(bad))

        orig_expand = glm2_ref.expand_groups

        def modulo(t, nh):
            s, b, g, hd = t.shape
            return t.unsqueeze(2).expand(s, b, nh // g, g, hd).reshape(s, b, nh, hd)
        try:
            glm2_ref.expand_groups = modulo
            bad = errs_of(run_oracle_steps(glm2_ref, cfg, params, data), want)
        finally:
            glm2_ref.expand_groups = orig_expand
        report("oracle_glm2_group_modulo_fails", min(bad) > 1e-3,
               "query head h -> group h %% G: max|diff| %.2e %.2e %.2e (must exceed 1e-3)" % tuple(bad))


def test_rotary_formula(glm2_ref):
    """apply_rotary(rope_cache) against spec 11's formula, written out per element in float64."""
    worst = 0.0
    for ratio in (1, 50):
        cfg = glm2_ref.load_config({"hidden_size": 32, "num_attention_heads": 2, "kv_channels": 16,
                                    "multi_query_group_num": 1, "rope_ratio": ratio})
        g = torch.Generator().manual_seed(5)
        s, b, nh, hd = 6, 2, 3, 16
        x = torch.randn((s, b, nh, hd), generator=g, dtype=torch.float64)
        pos = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 7, 8, 9, 4000]])  # [b, s]
        rope = glm2_ref.rope_cache(cfg, 4001, torch.float64)[pos].transpose(0, 1)
        got = glm2_ref.apply_rotary(x, rope)
        want = x.clone()
        half = hd // 2
        for si in range(s):
            for bi in range(b):
                p = float(pos[bi, si])
                for i in range(half // 2):
                    th = p * (10000.0 * ratio) ** (-2.0 * i / half)
                    c, sn = math.cos(th), math.sin(th)
                    a0, a1 = x[si, bi, :, 2 * i], x[si, bi, :, 2 * i + 1]
                    want[si, bi, :, 2 * i] = a0 * c - a1 * sn
                    want[si, bi, :, 2 * i + 1] = a1 * c + a0 * sn
        worst = max(worst, (got - want).abs().max().item())
    report("rotary_matches_spec_formula", worst < 1e-9,
           "head 16 (4 interleaved pairs rotated, 8 dims passed), rope_ratio 1 and 50, positions to 4000: "
           "max|diff| %.1e" % worst)


def micro_cfg(glm2_ref, layers=2, **kw):
    c = {"padded_vocab_size": 13, "hidden_size": 16, "num_layers": layers, "num_attention_heads": 4,
         "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 20,
         "seq_length": 64}
    c.update(kw)
    return glm2_ref.load_config(c)


def incremental(glm2_ref, cfg, params, ids, pad, chunks):
    """ids [b, T] fed as `chunks` (lengths summing to T) with the KV cache; pad [b, T] the padding
    mask (1 = keep); positions as the tokenizer's left padding gives them (real tokens from 0).
    Returns the concatenated hidden states [b, T, H] and logits."""
    pos_all = (pad.cumsum(1) - 1).clamp(min=0)
    past, hs, ls, t = None, [], [], 0
    for n in chunks:
        o = glm2_ref.forward(cfg, params, ids[:, t:t + n], position_ids=pos_all[:, t:t + n],
                             attention_mask=pad[:, :t + n], past_key_values=past, use_cache=True)
        past = o["presents"]
        hs.append(o["hidden"])
        ls.append(o["logits"])
        t += n
    return torch.cat(hs, 1), torch.cat(ls, 1), pos_all


def test_kv_cache(glm2_ref):
    cfg = micro_cfg(glm2_ref)
    params = glm2_ref.init_params(cfg, seed=3, std=0.3)
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 13, (2, 8), generator=g)
    with torch.no_grad():
        full = glm2_ref.forward(cfg, params, ids)
        ones = torch.ones((2, 8), dtype=torch.long)
        h1, l1, _ = incremental(glm2_ref, cfg, params, ids, ones, [5, 1, 1, 1])
        h2, l2, _ = incremental(glm2_ref, cfg, params, ids, ones, [4, 2, 1, 1])  # a 2-token step with a past
        e = max((h1 - full["hidden"]).abs().max().item(), (l1 - full["logits"]).abs().max().item())
        e2 = max((h2 - full["hidden"]).abs().max().item(), (l2 - full["logits"]).abs().max().item())
        report("kv_cache_decode_equals_full_forward", max(e, e2) < TOL,
               "prompt 5 + 3 single steps %.2e; prompt 4 + a 2-token chunk + 2 steps %.2e (hidden, logits)"
               % (e, e2))

        # left padding: row 0 has 3 pads; the full forward with the padding mask and the
        # tokenizer's positions equals incremental decoding on the real positions
        pad = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
        pos = (pad.cumsum(1) - 1).clamp(min=0)
        fullp = glm2_ref.forward(cfg, params, ids, position_ids=pos, attention_mask=pad)
        h3, l3, _ = incremental(glm2_ref, cfg, params, ids, pad, [5, 1, 1, 1])
        real = pad.bool()
        e3 = max((h3 - fullp["hidden"])[real].abs().max().item(), (l3 - fullp["logits"])[real].abs().max().item())
        # the real tokens of the padded row equal the same tokens run alone (unpadded)
        alone = glm2_ref.forward(cfg, params, ids[:1, 3:])
        e4 = (fullp["hidden"][0, 3:] - alone["hidden"][0]).abs().max().item()
        finite = bool(torch.isfinite(fullp["hidden"]).all())
        report("kv_cache_left_padding_equals_full_forward", max(e3, e4) < TOL and finite,
               "incremental vs full on real tokens %.2e; padded row vs the row alone %.2e; finite %s"
               % (e3, e4, finite))


def padded_batch(V, g):
    """3 rows, right-padded with 0 (labels -100 there and on the prompt), lengths 7, 5, 3."""
    lens, T = [7, 5, 3], 7
    ids = torch.zeros((3, T), dtype=torch.long)
    labels = torch.full((3, T), -100, dtype=torch.long)
    mask = torch.zeros((3, T), dtype=torch.long)
    for r, n in enumerate(lens):
        ids[r, :n] = torch.randint(1, V, (n,), generator=g)
        labels[r, 2:n] = ids[r, 2:n]
        mask[r, :n] = 1
    return ids, labels, mask


def grad_sanity(glm2_ref, name, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    params = glm2_ref.init_params(cfg, seed=seed, std=0.2)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    ids, labels, mask = padded_batch(cfg["padded_vocab_size"], g)
    loss = glm2_ref.forward(cfg, leaves, ids, labels, attention_mask=mask)["loss"]
    loss.backward()
    bad = [k for k, v in leaves.items()
           if v.grad is None or not bool(torch.isfinite(v.grad).all()) or float(v.grad.abs().max()) == 0.0]
    norm = math.sqrt(sum(float(v.grad.double().pow(2).sum()) for v in leaves.values() if v.grad is not None))
    report(name, not bad and math.isfinite(loss.item()),
           "%d tensors, loss %.5f, grad norm %.4e%s" % (len(leaves), loss.item(), norm,
                                                         "" if not bad else "; zero/non-finite: " + ", ".join(bad)))


def test_grads(glm2_ref):
    grad_sanity(glm2_ref, "grads_finite_nonzero_glm2", micro_cfg(glm2_ref, layers=2), 21)
    grad_sanity(glm2_ref, "grads_finite_nonzero_variant",
                micro_cfg(glm2_ref, layers=2, rmsnorm=False, add_bias_linear=True, multi_query_attention=False,
                          apply_residual_connection_post_layernorm=True, post_layer_norm=False), 22)

    cfg = glm2_ref.load_config({"padded_vocab_size": 7, "hidden_size": 8, "num_layers": 2, "num_attention_heads": 2,
                                "kv_channels": 4, "multi_query_group_num": 1, "ffn_hidden_size": 6, "seq_length": 16})
    g = torch.Generator().manual_seed(9)
    ids, labels, mask = padded_batch(7, g)
    p64 = glm2_ref.init_params(cfg, seed=4, std=0.4, dtype=torch.float64)
    names = list(p64)
    leaves = [p64[n].clone().requires_grad_(True) for n in names]

    def f(*ts):
        return glm2_ref.forward(cfg, dict(zip(names, ts)), ids, labels, attention_mask=mask)["loss"]
    try:
        ok = torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=False)
        report("gradcheck_float64_micro", ok, "%d parameters in %d tensors, loss %.6f"
               % (sum(t.numel() for t in leaves), len(leaves), f(*leaves).item()))
    except RuntimeError as e:
        report("gradcheck_float64_micro", False, str(e).splitlines()[0][:300])


def main():
    if torch is None:
        for n in ORACLE_CHECKS + OTHER_CHECKS:
            print("SKIP %s: torch is not installed for %s" % (n, sys.executable))
        return 0
    torch.set_num_threads(2)
    sys.path.insert(0, HERE)
    import glm2_ref
    for t in (test_oracle, test_rotary_formula, test_kv_cache, test_grads):
        try:
            t(glm2_ref)
        except Exception as e:  # a crash in one check is one FAIL, the others still run
            report(t.__name__, False, "%s: %s" % (type(e).__name__, e))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
