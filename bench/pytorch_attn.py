#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention alone, forward and backward, on the shapes of
bench/bench_attn.c (issue 20's attention table), for the same masks and FLOP count:
  causal, full  the flash backend (FlashAttention-2 inside PyTorch), is_causal or no mask;
  prefix        GLM's prefix-LM rule (rows of half prompt and half answer), which the flash
                backend cannot take: the memory-efficient backend with the boolean mask.
FLOPs count the pairs the mask lets through, S: forward 4 * HD * NH * B * S, backward 2.5 times
that. Times are medians of --reps calls after one warm-up, each timed alone with CUDA events.

  python3 bench/pytorch_attn.py [--runs 512x8,2048x2,8192x1] [--masks prefix,causal,full]
                                [--heads 32] [--hd 128] [--reps 10] [--out FILE.jsonl]
  python3 bench/pytorch_attn.py --selfcheck   # CPU: the masks and their pair counts, tiny shapes
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def key_ranges(mask, T):
    """[T] lo, hi of each query (as bench_attn.c's make_ranges)."""
    i = torch.arange(T)
    hi = {"causal": i + 1, "full": torch.full((T,), T), "prefix": torch.where(i < T // 2, torch.full((T,), T // 2), i + 1)}[mask]
    return torch.zeros(T, dtype=torch.long), hi


def bool_mask(mask, T):
    """[T, T] True where query i may see key j."""
    lo, hi = key_ranges(mask, T)
    j = torch.arange(T)
    return (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])


def pairs(mask, B, T):
    lo, hi = key_ranges(mask, T)
    return B * int((hi - lo).sum())


def attend(q, k, v, mask, backend):
    if backend == "math" and not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0 (the CPU check)
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(s.masked_fill(~bool_mask(mask, q.shape[2]), float("-inf")), -1) @ v
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    with sdpa_kernel(be):
        if mask == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if mask == "full":
            return F.scaled_dot_product_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask(mask, q.shape[2]).to(q.device))


def selfcheck():
    """The pair counts against the masks themselves, and SDPA with each mask against a plain
    softmax(QK^T) V on the CPU."""
    ok = True
    for mask in ("prefix", "causal", "full"):
        T = 10
        m = bool_mask(mask, T)
        good = int(m.sum()) == pairs(mask, 1, T) and bool(m[T - 1, : T].all())
        q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
        s = (q.double() @ k.double().transpose(-1, -2)) / 8 ** 0.5  # the reference in float64, by its own text
        ref = (torch.softmax(s.masked_fill(~m, float("-inf")), -1) @ v.double()).float()
        got = attend(q, k, v, mask, "math")
        good = good and torch.allclose(got, ref, atol=1e-5)
        print(("PASS" if good else "FAIL"), "pytorch_attn_%s" % mask)
        ok = ok and good
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="512x8,2048x2,8192x1")
    ap.add_argument("--masks", default="prefix,causal,full")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--selfcheck", action="store_true")
    a = ap.parse_args()
    if a.selfcheck:
        raise SystemExit(0 if selfcheck() else 1)
    dev, dt = "cuda", torch.bfloat16
    print("%-8s %-7s %-9s %10s %9s %10s %9s   (bf16, NH %d, HD %d, torch %s)" %
          ("run", "mask", "backend", "fwd_ms", "TFLOP/s", "bwd_ms", "TFLOP/s", a.heads, a.hd, torch.__version__))
    for run in a.runs.split(","):
        T, B = (int(x) for x in run.split("x"))
        for mask in a.masks.split(","):
            backend = "efficient" if mask == "prefix" else "flash"
            q, k, v = (torch.randn(B, a.heads, T, a.hd, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
            g = torch.randn(B, a.heads, T, a.hd, device=dev, dtype=dt)
            tf, tb = [], []
            for r in range(a.reps + 1):
                e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                torch.cuda.synchronize()
                e[0].record()
                o = attend(q, k, v, mask, backend)
                e[1].record()
                torch.autograd.backward(o, g)
                e[2].record()
                torch.cuda.synchronize()
                if r:  # r = 0: the warm-up
                    tf.append(e[0].elapsed_time(e[1]))
                    tb.append(e[1].elapsed_time(e[2]))
                q.grad = k.grad = v.grad = None
            fwd, bwd = statistics.median(tf), statistics.median(tb)
            flops = 4.0 * a.hd * a.heads * pairs(mask, B, T)
            rec = {"impl": "pytorch-sdpa", "backend": backend, "run": run, "seq": T, "batch": B, "heads": a.heads,
                   "hd": a.hd, "mask": mask, "fwd_ms": fwd, "bwd_ms": bwd, "fwd_tflops": flops / fwd / 1e9,
                   "bwd_tflops": 2.5 * flops / bwd / 1e9, "torch": torch.__version__}
            print("%-8s %-7s %-9s %10.3f %9.1f %10.3f %9.1f" % (run, mask, backend, fwd, rec["fwd_tflops"], bwd, rec["bwd_tflops"]))
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
            del q, k, v, g, o
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
