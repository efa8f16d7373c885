#!/usr/bin/env python3
"""Training on a quantized base (issue 17) against PyTorch fp32 references, on the CPU.

The C model through $GLM_BUILD/tests/tool_model_driver with --quantization_bit 8|4 or
--quantization_type nf4 (the frozen linear weights of every layer quantized as they load)
against glm_ref computing with the DEQUANTIZED weights, where the quantization is
tests/py/quant_ref.py's PyTorch re-implementation of THUDM's quantize() and of bitsandbytes' NF4
(not the C code's): the loss, every trainable gradient, the gradient norm and 2 AdamW steps of
LoRA (two target sets; DoRA on all four), P-Tuning v2 (with and without the projection) and freeze, within 1e-5
relative. Batches of more than 16 tokens take the dequantize-then-GEMM path; a batch of at most
16 tokens takes qmatmul_fwd (the decoding product). Each case also requires quantization to
matter: the reference on the float weights differs from the one on the dequantized weights (the
loss or a gradient) by more than 10x the tolerance, so a driver that ignored the flag would fail.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import os
import sys
import tempfile
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("SKIP quant_grads: torch is not installed (use /usr/bin/python3)")
    sys.exit(0)

import glm_ref  # noqa: E402
import test_model_vs_torch as V  # noqa: E402
import test_lora_ref as LR  # noqa: E402

torch.set_num_threads(2)
TOL = 1e-5
BUILD = os.environ.get("GLM_BUILD", "build")
DRIVER = os.path.join(BUILD, "tests", "tool_model_driver")
LINEAR = ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
OPTS = dict(steps=2, lr=1e-4, weight_decay=0.1, eps=1e-5)  # as test_lora_ref
failures = 0


def report(name, ok, detail):
    global failures
    failures += not ok
    print(("PASS %s (%s)" if ok else "FAIL %s: %s") % (name, detail))
    sys.stdout.flush()


def dequantized(cfg, params, qtype, layers, keep=()):
    """params with the four linear weights of `layers` (but those named in `keep`, which train)
    replaced by their quantize -> dequantize values under quant_ref (THUDM's INT8/INT4,
    bitsandbytes' NF4)."""
    import quant_ref as Q
    out = dict(params)
    for l in layers:
        for mod in LINEAR:
            k = "transformer.layers.%d.%s.weight" % (l, mod)
            if k in keep:
                continue
            w = params[k]
            if qtype == "nf4":
                out[k] = Q.nf4_dequantize(*Q.nf4_quantize(w), shape=w.shape)
            else:
                q, s = Q.thudm_quantize(w, int(qtype))
                out[k] = Q.thudm_dequantize(q, s, int(qtype))
    return out


def qflags(qtype):
    return ["--quantization_type", "nf4"] if qtype == "nf4" else ["--quantization_bit", qtype]


def case(tmp, ci, name, kind, qtype, lengths, shape=(2, 64, 4, 128), tied=True):
    layers, hidden, heads, inner = shape
    cfg = V.make_cfg(layers, hidden, heads, inner, tied)
    ids_rows, label_rows = V.make_rows(cfg, lengths, seed=900 + ci)
    params = glm_ref.init_params(cfg, seed=1000 + ci, std=0.1)
    ids, labels, mdir, bpath = LR.write_case(tmp, name, cfg, params, ids_rows, label_rows)
    from safetensors.torch import save_file
    if kind["ft"] == "lora":
        adapters = glm_ref.init_lora(cfg, kind["r"], kind["targets"], seed=1100 + ci)
        if kind.get("dora"):  # DoRA: its row norms from the dequantized weights (peft's dequantize_module_weight)
            import test_dora as D
            adapters = D.with_magnitudes(params, adapters, 1300 + ci)
        path = os.path.join(tmp, name + ".adapter.safetensors")
        save_file(adapters, path)
        scaling = glm_ref.lora_scaling(2.0 * kind["r"], kind["r"], False)
        flags = ["--finetuning_type", "lora", "--lora_rank", str(kind["r"]), "--lora_target", ",".join(kind["targets"]),
                 "--adapter", path] + (["--use_dora"] if kind.get("dora") else [])
        frozen_layers = range(layers)
        run = lambda p: glm_ref.train_peft(cfg, p, ids, labels, list(adapters), adapters, scaling, **OPTS)  # noqa: E731
    elif kind["ft"] == "ptuning":
        P, proj = kind["P"], kind["projection"]
        pp = glm_ref.init_prefix(cfg, P, proj, seed=1200 + ci, std_emb=1.0)
        path = os.path.join(tmp, name + ".prefix.safetensors")
        save_file({k: v.contiguous() for k, v in pp.items()}, path)
        flags = ["--finetuning_type", "ptuning", "--pre_seq_len", str(P), "--adapter", path] + (
            ["--prefix_projection"] if proj else [])
        frozen_layers = range(layers)
        run = lambda p: glm_ref.train_ptuning(cfg, p, ids, labels, pp, proj, **OPTS)  # noqa: E731
    else:  # freeze: what trains stays in full precision, the other linear weights are quantized
        n, modules = kind["n"], kind.get("modules", ["all"])
        flags = ["--finetuning_type", "freeze", "--num_layer_trainable", str(n), "--freeze_trainable_modules",
                 ",".join(modules)]
        frozen_layers = range(layers)
        trainable = glm_ref.freeze_trainable(cfg, n, modules)
        run = lambda p: glm_ref.train_peft(cfg, p, ids, labels, trainable, None, 0.0, **OPTS)  # noqa: E731
    try:
        deq = dequantized(cfg, params, qtype, frozen_layers, keep=set(trainable) if kind["ft"] == "freeze" else ())
    except Exception as e:
        report(name + "_reference", False, "quant_ref: %s: %s" % (type(e).__name__, e))
        return
    ref = run(deq)
    plain = run(params)
    moved = abs(plain["loss"] - ref["loss"]) / abs(ref["loss"])
    gmoved = max(V.rel(plain["grads"][k], ref["grads"][k]) for k in ref["grads"])
    report(name + "_quantization_matters", max(moved, gmoved) > 10 * TOL,
           "loss on float weights %.7f vs dequantized %.7f (rel %.1e), gradients rel %.1e" % (
               plain["loss"], ref["loss"], moved, gmoved))
    try:
        got = LR.run_driver(DRIVER, mdir, bpath, os.path.join(tmp, name + ".out.safetensors"), flags + qflags(qtype), OPTS)
    except Exception as e:
        report(name + "_driver", False, str(e)[:600])
        return
    e = abs(got["loss"].item() - ref["loss"]) / abs(ref["loss"])
    report(name + "_loss", e < TOL, "C %.7f torch %.7f rel %.1e (%d tokens)" % (got["loss"].item(), ref["loss"], e, ids.numel()))
    trainable = sorted(ref["grads"])
    ok, txt = LR.worst([(V.rel(got["grad/" + k], ref["grads"][k]) if "grad/" + k in got else float("inf"), k)
                        for k in trainable])
    report(name + "_grads", ok, txt)
    e = abs(got["grad_norm"].item() - ref["grad_norm"]) / ref["grad_norm"]
    report(name + "_grad_norm", e < TOL, "C %.7f torch %.7f rel %.1e" % (got["grad_norm"].item(), ref["grad_norm"], e))
    le = max(abs(a - b) / abs(b) for a, b in zip(got["losses"].tolist(), ref["losses"]))
    ok, txt = LR.worst([(V.rel(got["param/" + k], ref["params"][k]) if "param/" + k in got else float("inf"), k)
                        for k in trainable])
    report(name + "_adamw_steps", ok and le < TOL, "losses rel %.1e over %d steps; trained tensors: %s" % (le, OPTS["steps"], txt))


def main():
    if not os.path.exists(DRIVER):
        print("SKIP quant_grads: %s not built" % DRIVER)
        return 0
    try:
        import quant_ref  # noqa: F401
    except ImportError as e:
        print("FAIL quant_grads_reference: tests/py/quant_ref.py does not import: %s" % e)
        return 1
    tmp = tempfile.mkdtemp(prefix="glm-qgrad-")
    try:
        big = [(9, 7), (12, 5), (6, 9)]   # 3 rows, > 16 tokens: dequantize + GEMM
        small = [(1, 1), (1, 1)]          # 2 rows of 4 tokens: 8, the decoding product (<= 8 rows for every type)
        lora_qkv = dict(ft="lora", r=4, targets=["query_key_value"])
        lora_all = dict(ft="lora", r=2, targets=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"])
        dora_all = dict(lora_all, dora=True)
        ci = 0
        for qtype in ("8", "4", "nf4"):
            for tag, kind, lengths in (("lora_qkv", lora_qkv, big), ("lora_all", lora_all, big),
                                       ("lora_all_small", lora_all, small),
                                       ("ptuning_proj", dict(ft="ptuning", P=3, projection=True), big),
                                       ("ptuning_emb_small", dict(ft="ptuning", P=2, projection=False), small),
                                       ("freeze", dict(ft="freeze", n=1), big),
                                       # one layer holds quantized attention beside a float MLP that trains
                                       ("freeze_first_mlp", dict(ft="freeze", n=-1, modules=["mlp"]), big),
                                       ("dora_all", dora_all, big), ("dora_all_small", dora_all, small)):
                ci += 1
                qn = "int" + qtype if qtype != "nf4" else "nf4"
                case(tmp, ci, "quant_%s_%s" % (qn, tag), kind, qtype, lengths)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
