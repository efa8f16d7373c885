#!/usr/bin/env python3
"""PyTorch baseline for bench/bench_train.c: the same ChatGLM-6B shapes (V 130528, H 4096,
28 layers, 32 heads, FFN 16384, untied head), random init, full fine-tune with fused AdamW
(fp32 master weights), bf16 autocast, SDPA attention with the GLM prefix mask, 2D rotary,
the alpha = sqrt(56) residuals of GLM v1, and the loss over the answer half only (logits only
for supervised rows, as our code does). torch.compile per layer block (one compilation shared
by the 28 blocks). Prints tokens/s, MFU (same formula as bench_train) and peak memory.

  python3 bench/pytorch_baseline.py --runs 512x8,512x8c [--no-compile] [--steps 6] [--layers 28]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

V, H, L, NH, FF = 130528, 4096, 28, 32, 16384
HD = H // NH
ALPHA = math.sqrt(2 * 28)
GMASK, SOP, EOP = 130001, 130004, 130005


def rotary_tables(pos, dim):
    """cos/sin [B, T, dim] for one half of the head (dim = HD/2); fp16-rounded inv_freq as the original."""
    inv = (1.0 / (10000 ** (torch.arange(0, dim, 2, device=pos.device).float() / dim))).half().float()
    ang = pos.float()[..., None] * inv  # [B, T, dim/2]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rot_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rope(x, cos1, sin1, cos2, sin2):
    # x [B, T, NH, HD]: first half by position, second half by block position
    x1, x2 = x.chunk(2, dim=-1)
    c1, s1, c2, s2 = (t[:, :, None, :].to(x.dtype) for t in (cos1, sin1, cos2, sin2))
    return torch.cat([x1 * c1 + rot_half(x1) * s1, x2 * c2 + rot_half(x2) * s2], dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(H, eps=1e-5)
        self.qkv = nn.Linear(H, 3 * H)
        self.dense = nn.Linear(H, H)
        self.ln2 = nn.LayerNorm(H, eps=1e-5)
        self.fc1 = nn.Linear(H, FF)
        self.fc2 = nn.Linear(FF, H)

    def forward(self, h, mask, cos1, sin1, cos2, sin2):
        B, T, _ = h.shape
        x = self.ln1(h)
        qkv = self.qkv(x).view(B, T, NH, 3, HD)
        q, k, v = qkv.unbind(3)
        q = apply_rope(q, cos1, sin1, cos2, sin2)
        k = apply_rope(k, cos1, sin1, cos2, sin2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        h1 = ALPHA * x + self.dense(a.transpose(1, 2).reshape(B, T, H))
        y = self.ln2(h1)
        return ALPHA * y + self.fc2(F.gelu(self.fc1(y), approximate="tanh"))


class GLM(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.wte = nn.Embedding(V, H)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.lnf = nn.LayerNorm(H, eps=1e-5)
        self.head = nn.Linear(H, V, bias=False)
        self.ckpt = False
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, ids, pos, bpos, mask, sup_idx, sup_tgt):
        h = self.wte(ids)
        cos1, sin1 = rotary_tables(pos, HD // 2)
        cos2, sin2 = rotary_tables(bpos, HD // 2)
        for blk in self.blocks:
            if self.ckpt:
                h = checkpoint(blk, h, mask, cos1, sin1, cos2, sin2, use_reentrant=False)
            else:
                h = blk(h, mask, cos1, sin1, cos2, sin2)
        h = self.lnf(h).reshape(-1, H)[sup_idx]
        logits = self.head(h)
        return F.cross_entropy(logits.float(), sup_tgt)


def make_batch(B, T, dev):
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(5, 120005, (B, T), generator=g)
    ctx = T // 2
    ids[:, ctx - 1] = GMASK
    ids[:, ctx] = SOP
    ids[:, T - 1] = EOP
    i = torch.arange(T)
    pos = torch.where(i < ctx, i, torch.full_like(i, ctx - 1)).expand(B, T)
    bpos = torch.where(i < ctx, torch.zeros_like(i), i - ctx + 1).expand(B, T)
    allowed = (i[None, :] < ctx) | (i[None, :] <= i[:, None])  # [T(query), T(key)]
    mask = allowed[None, None].expand(B, 1, T, T)
    targets = torch.full((B, T), -100)
    targets[:, ctx - 1:T - 1] = ids[:, ctx:T]  # token i predicts label i+1 (answer half)
    flat = targets.reshape(-1)
    sup_idx = (flat != -100).nonzero().squeeze(1)
    return [t.to(dev) for t in (ids, pos, bpos, mask, sup_idx, flat[sup_idx])]


def train_step(model, opt, batch, device_type="cuda"):
    """One optimizer step: bf16-autocast forward, backward, clip the grad norm to 1, AdamW."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        loss = model(*batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="512x8")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=L)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for run in a.runs.split(","):
        ck = run.endswith("c")
        T, B = map(int, run.rstrip("c").split("x"))
        t_run = time.time()
        torch.cuda.reset_peak_memory_stats()
        model = GLM(a.layers).to(dev)
        model.ckpt = ck
        if not a.no_compile:
            for blk in model.blocks:
                blk.compile()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
        n_params = sum(p.numel() for p in model.parameters())
        batch = make_batch(B, T, dev)

        def step():
            return train_step(model, opt, batch)

        first = None
        for i in range(a.warmup):
            loss = step()
            torch.cuda.synchronize()
            if i == 0:
                first = time.time() - t_run
        times = []
        for _ in range(a.steps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step()
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        in_order = [round(t * 1e3, 2) for t in times]  # the steps as they ran
        times.sort()
        med = times[len(times) // 2]
        tok = B * T / med
        mfu = tok * (6 * n_params + 12 * a.layers * H * T) / 989e12
        peak = torch.cuda.max_memory_allocated() / 2**30
        res = dict(impl="pytorch", run=f"{T}x{B}{'+ckpt' if ck else ''}", compile=not a.no_compile, step_ms=med * 1e3, step_ms_all=in_order,
                   tok_s=tok, mfu=mfu, peak_alloc_gib=peak, first_step_s=first, loss=float(loss), n_params=n_params)
        print("RESULT " + json.dumps(res), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
        del model, opt, batch, step
        import gc
        torch._dynamo.reset()  # compiled blocks hold the old parameters
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
