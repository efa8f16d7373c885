#!/usr/bin/env python3
"""PyTorch + LoRA baseline for `bench_train --lora R` (issue 16): the model of
bench/pytorch_baseline.py (ChatGLM-6B shapes, untied head, SDPA with the GLM prefix mask, 2D
rotary, alpha = sqrt(56) residuals, loss over the answer half with logits only for supervised
rows, torch.compile per block) with a frozen base and peft-style LoRA adapters:

- every base weight (embedding, LayerNorms, linear weights and biases, head) is created directly
  in bf16 on the GPU with requires_grad=False: no fp32 master, no gradient, no optimizer state;
- each targeted linear module (query_key_value, or all four: + dense, dense_h_to_4h, dense_4h_to_h)
  gets peft's LoraLayer: A [r, in] kaiming-uniform(a=sqrt(5)), B [out, r] zero, both fp32
  parameters, y = base(x) + (dropout(x) @ A^T @ B^T) * alpha / r under bf16 autocast (B = 0
  still computes the branch), dropout 0.05, alpha 2r (glmtrain train's defaults);
- fused AdamW and grad-norm clipping (1.0) over the adapter parameters only.

Reported per run as pytorch_baseline.py: tokens/s, MFU with bench_train's LoRA formula
(4N + 12 L H T per token, N = all parameters, frozen included: forward 2N + input gradients
2N, no weight gradients of the base), peak memory (allocated, reserved, and the device's
used memory after the timed steps, which like bench_train's figure includes the CUDA context
and library workspaces), one JSON line per run ("RESULT {...}") and with --out appended to a
jsonl file.

  python3 bench/pytorch_lora.py --runs 512x8,2048x2,512x4c --lora 8 [--lora_target qkv|all]
      [--steps 6] [--warmup 3] [--layers 28] [--no-compile] [--out FILE]
CPU smoke test (torch without compile or SDPA: --no-compile, tiny shapes):
  python3 bench/pytorch_lora.py --tiny --layers 2 --runs 64x2,64x2c --no-compile --steps 2 --warmup 1
"""
import argparse
import gc
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_baseline as PB  # noqa: E402  (shapes, rotary, batch; read at run time so --tiny works)

TARGETS = {"qkv": ("qkv",), "all": ("qkv", "dense", "fc1", "fc2")}


def _sdpa_reference(q, k, v, attn_mask=None):
    """Plain attention for torch < 2.0 (CPU smoke test only); boolean mask, True = attend."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return s.softmax(-1) @ v


SDPA = getattr(F, "scaled_dot_product_attention", _sdpa_reference)


def frozen(shape, dev, dtype, std=None, fill=None):
    """A frozen base tensor made on the device in the storage dtype (no fp32 copy ever exists)."""
    t = torch.empty(shape, device=dev, dtype=dtype)
    if std is not None:
        t.normal_(0.0, std)
    else:
        t.fill_(fill)
    return nn.Parameter(t, requires_grad=False)


class LoraLinear(nn.Module):
    """peft's lora.Linear over a frozen base: W x + b + scaling * B A dropout(x)."""

    def __init__(self, inp, out, dev, dtype, r=0, alpha=16.0, dropout=0.05, bias=True):
        super().__init__()
        self.weight = frozen((out, inp), dev, dtype, std=0.02)
        self.bias = frozen((out,), dev, dtype, fill=0.0) if bias else None
        self.r = r
        if r > 0:
            self.lora_A = nn.Parameter(torch.empty(r, inp, device=dev, dtype=torch.float32))
            self.lora_B = nn.Parameter(torch.zeros(out, r, device=dev, dtype=torch.float32))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.scaling = alpha / r

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.r > 0:
            y = y + F.linear(F.linear(self.drop(x), self.lora_A), self.lora_B) * self.scaling
        return y


class FrozenLN(nn.Module):
    def __init__(self, n, dev, dtype):
        super().__init__()
        self.weight = frozen((n,), dev, dtype, fill=1.0)
        self.bias = frozen((n,), dev, dtype, fill=0.0)

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class Block(nn.Module):
    """pytorch_baseline.Block with LoRA-capable linears (the same forward)."""

    def __init__(self, dev, dtype, r, alpha, dropout, targets):
        super().__init__()
        H, FF = PB.H, PB.FF

        def lin(name, i, o):
            return LoraLinear(i, o, dev, dtype, r if name in targets else 0, alpha, dropout)

        self.ln1 = FrozenLN(H, dev, dtype)
        self.qkv = lin("qkv", H, 3 * H)
        self.dense = lin("dense", H, H)
        self.ln2 = FrozenLN(H, dev, dtype)
        self.fc1 = lin("fc1", H, FF)
        self.fc2 = lin("fc2", FF, H)

    def forward(self, h, mask, cos1, sin1, cos2, sin2):
        B, T, _ = h.shape
        H, NH, HD = PB.H, PB.NH, PB.HD
        x = self.ln1(h)
        qkv = self.qkv(x).view(B, T, NH, 3, HD)
        q, k, v = qkv.unbind(3)
        q = PB.apply_rope(q, cos1, sin1, cos2, sin2)
        k = PB.apply_rope(k, cos1, sin1, cos2, sin2)
        a = SDPA(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        h1 = PB.ALPHA * x + self.dense(a.transpose(1, 2).reshape(B, T, H))
        y = self.ln2(h1)
        return PB.ALPHA * y + self.fc2(F.gelu(self.fc1(y), approximate="tanh"))


class GLMLora(nn.Module):
    def __init__(self, layers, dev, dtype, r, alpha, dropout, targets):
        super().__init__()
        self.wte = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.blocks = nn.ModuleList(Block(dev, dtype, r, alpha, dropout, targets) for _ in range(layers))
        self.lnf = FrozenLN(PB.H, dev, dtype)
        self.head = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.ckpt = False

    def forward(self, ids, pos, bpos, mask, sup_idx, sup_tgt):
        h = F.embedding(ids, self.wte)
        cos1, sin1 = PB.rotary_tables(pos, PB.HD // 2)
        cos2, sin2 = PB.rotary_tables(bpos, PB.HD // 2)
        for blk in self.blocks:
            if self.ckpt:
                h = checkpoint(blk, h, mask, cos1, sin1, cos2, sin2, use_reentrant=False)
            else:
                h = blk(h, mask, cos1, sin1, cos2, sin2)
        h = self.lnf(h).reshape(-1, PB.H)[sup_idx]
        logits = F.linear(h, self.head)
        return F.cross_entropy(logits.float(), sup_tgt)


def bench_run(a, run, dev, dtype, alpha, targets, cuda):
    """One run "TxB[c]": a fresh model and optimizer, warm-up steps, then the timed ones; its record."""
    def sync():
        if cuda:
            torch.cuda.synchronize()

    ck = run.endswith("c")
    T, B = map(int, run.rstrip("c").split("x"))
    t_run = time.time()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    model = GLMLora(a.layers, dev, dtype, a.lora, alpha, a.lora_dropout, targets)
    model.ckpt = ck
    if not a.no_compile:
        for blk in model.blocks:
            blk.compile()
    train = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(train, lr=1e-4, weight_decay=0.01, **({"fused": True} if cuda else {}))
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in train)
    batch = PB.make_batch(B, T, "cpu")
    if a.tiny:
        batch[0], batch[5] = batch[0] % PB.V, batch[5] % PB.V
    batch = [t.to(dev) for t in batch]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(*batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(train, 1.0)
        opt.step()
        return loss

    first = None
    for i in range(a.warmup):
        loss = step()
        sync()
        if i == 0:
            first = time.time() - t_run
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    tok = B * T / med
    flops_tok = 4 * n_all + 12 * a.layers * PB.H * T
    mfu = tok * flops_tok / 989e12
    res = dict(impl="pytorch-lora", run=f"{T}x{B}{'+ckpt' if ck else ''}+lora{a.lora}"
               f"{'' if a.lora_target == 'qkv' else a.lora_target}", seq=T, batch=B, ckpt=int(ck),
               lora_rank=a.lora, lora_target=a.lora_target, compile=not a.no_compile, step_ms=med * 1e3,
               tok_s=tok, mfu=mfu, flops_per_token=flops_tok, first_step_s=first, loss=float(loss),
               n_params=n_all, n_trainable=n_train, tiny=a.tiny, layers=a.layers)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        res.update(peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                   device_used_gib=(total - free) / 2**30, torch=torch.__version__)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="512x8", help="comma-separated TxB[c] (c: activation checkpointing)")
    ap.add_argument("--lora", type=int, default=8, help="rank r")
    ap.add_argument("--lora_target", default="qkv", choices=sorted(TARGETS))
    ap.add_argument("--lora_alpha", type=float, default=0.0, help="default 2r")
    ap.add_argument("--lora_dropout", type=float, default=0.05)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=PB.L)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="V 1024, H 64, 4 heads, FFN 256 (CPU smoke test)")
    ap.add_argument("--out", default=None, help="append one JSON record per run")
    a = ap.parse_args()
    if a.steps < 1 or a.lora < 1:
        ap.error("--steps and --lora must be >= 1")
    if not a.no_compile and not hasattr(nn.Module, "compile"):
        ap.error(f"torch {torch.__version__} has no nn.Module.compile; use --no-compile")
    if a.tiny:
        PB.V, PB.H, PB.NH, PB.FF = 1024, 64, 4, 256
        PB.HD = PB.H // PB.NH
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    # bf16 storage on the GPU; the CPU smoke test keeps bf16 too (autocast on CPU is bf16)
    dtype = torch.bfloat16
    alpha = a.lora_alpha if a.lora_alpha > 0 else 2.0 * a.lora
    targets = TARGETS[a.lora_target]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    if not a.no_compile:
        # 28 instances of one Block: where dynamo guards on the module (torch < 2.5), each is a
        # cache entry of the same code; the default limit (8) would run the rest eagerly
        for name in ("cache_size_limit", "recompile_limit"):  # the name moved between versions
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 2 * a.layers + 8))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if cuda else 'CPU'}: LoRA r={a.lora} "
          f"alpha={alpha:g} dropout={a.lora_dropout:g} on {','.join(targets)}", flush=True)

    for run in a.runs.split(","):
        res = bench_run(a, run, dev, dtype, alpha, targets, cuda)
        print("RESULT " + json.dumps(res), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
        if not a.no_compile:
            torch._dynamo.reset()  # compiled blocks hold the old parameters
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

if __name__ == "__main__":
    main()
