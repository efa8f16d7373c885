#!/usr/bin/env python3
"""PyTorch baseline for `bench_train --family chatglm2`: the ChatGLM2-6B / ChatGLM3-6B architecture
(V 65024, H 4096, 28 layers, 32 query heads of kv_channels 128, 2 key/value groups, SwiGLU FFN
13696, RMSNorm, qkv bias and no other bias, untied output_layer; ChatGLM3-6B has the same shapes),
random init on the device, whole optimizer steps timed as bench/pytorch_baseline.py (the GLM v1
baseline) times them: zero grads, bf16-autocast forward + backward, grad-norm clip 1.0, fused AdamW.

The model, [B, T, ...] layout, as THUDM's modeling_chatglm.py computes it (tests/py/glm2_ref.py):
  * h = word_embeddings(ids); per layer x = RMSNorm(h) (mean of squares in fp32, eps 1e-5),
    q|k|v = x W^T + b split [32*128 | 2*128 | 2*128] (NOT interleaved per head), rotary on the first
    64 dims of every q / k head in interleaved pairs (2i, 2i+1), theta_i = 10000^(-2i/64), positions
    0..T-1 (THUDM's default position ids); causal attention with query head h reading key/value group
    h // 16; h1 = h + dense(attn); y = RMSNorm(h1); h = h1 + dense_4h_to_h(silu(a) * b) with
    a | b = dense_h_to_4h(y) (2*13696 outputs); final RMSNorm, output_layer, cross-entropy;
  * rows as bench_train's: prompt T/2-1 random tokens, [gMASK] 64790, sop 64792, answer, eos 2;
    labels on sop..eos, so the loss is over the T/2 answer positions of each row, and only those
    rows go through the final norm and the output layer (logits only for supervised rows);
  * the rotary cos/sin table [T, 32] is computed once per step (in fp32, outside the blocks) and
    passed to every block, which casts it to the activations' dtype (bf16, as THUDM's bf16 cache);
  * attention: F.scaled_dot_product_attention(is_causal=True) (flash on an H200). Grouped keys
    either by SDPA's own enable_gqa=True (torch >= 2.5: flash reads the 2 groups, no expanded copy
    of k / v) or by expand + reshape of k / v to 32 heads. --gqa auto (default) takes enable_gqa
    only when this torch has it, the flash backend alone runs it (bf16, causal, forward + backward;
    elsewhere SDPA would fall back to its math kernel, which repeats k / v and materializes the
    scores: a dishonestly slow baseline) and a one-layer model of ChatGLM2's head layout with it,
    bf16 autocast, eager and compiled per block as the runs are, gives the loss and gradients of
    the same model with expanded keys (probed once at start, about a minute with compile); else
    expand. The record says which ("gqa") and why ("gqa_note"); --gqa expand|native skips the
    probe and forces one. (torch 2.5.1's inductor on the CPU fails on enable_gqa's bf16 backward,
    so on the CPU auto gives expand when compiling);
  * torch.compile per block (blk.compile(): one compiled code shared by the 28 blocks; dynamo's
    cache limit raised so no block runs eagerly); --runs ...c wraps each block in non-reentrant
    activation checkpointing (torch.utils.checkpoint, use_reentrant=False).

Full fine-tuning (default) as pytorch_baseline.py: fp32 parameters (they are AdamW's master copy;
autocast runs the matmuls in bf16 from them), fused AdamW (lr 1e-5, wd 0.01) over all of them.
--lora R: peft's LoRA as bench_train --lora: every base weight made directly in bf16 on the device,
requires_grad=False (no fp32 copy, no gradient, no optimizer state); on query_key_value
(--lora_target qkv, the default) or all four linear modules (--lora_target all: + dense,
dense_h_to_4h, dense_4h_to_h) y = base(x) + dropout(x) A^T B^T * alpha / r, A [r, in]
kaiming-uniform(a=sqrt(5)), B [out, r] zero, both fp32 (bf16 under autocast), alpha 2R, dropout 0.05
on the adapter input (--lora_alpha / --lora_dropout override); fused AdamW (lr 1e-4, wd 0.01) and
clipping over the adapters only.

Reported per run, as bench_train's header defines them: tokens/s (all B*T tokens of a step, median
step of --steps after --warmup), MFU = tok/s * F / 989e12 with N = all parameters (frozen and
adapters included): F = 6N + 12 L H T (full) or 4N + 12 L H T (LoRA); peak memory
(torch.cuda.max_memory_allocated, also max reserved and the device's used memory after the timed
steps). One line "RESULT {json}" per run, appended to --out FILE as JSON lines. Labels as
bench_train --family chatglm2 labels them: 512x8+glm2, 512x8+ckpt+glm2, 512x8+lora8+glm2,
512x8+lora8all+glm2; "impl" is "pytorch" (full) or "pytorch-lora", "model" "chatglm2-6b". A run that
runs out of memory gives a record with "oom": true and the next run goes on (the full fine-tune's
parameters, gradients and AdamW moments alone are 93 GiB; PYTORCH_CUDA_ALLOC_CONF, recorded as
"alloc_conf", e.g. expandable_segments:True, is left to the caller as for the other baselines).

  python3 bench/pytorch_glm2.py --runs 512x8,2048x2,512x8c [--steps 6] [--warmup 3] [--layers 28]
      [--lora R [--lora_target qkv|all]] [--gqa auto|expand|native] [--no-compile] [--out FILE]
  python3 bench/pytorch_glm2.py --selfcheck [--no-compile]     (CPU, or the GPU when there is one)
CPU smoke test (real shapes, one layer; 15 GiB of host memory for full fine-tuning, ~1.5 min a step
on 2 cores with torch 1.13, whose CPU bf16 matmuls are slow; LoRA ~3 s a step):
  python3 bench/pytorch_glm2.py --device cpu --layers 1 --runs 32x2 --steps 1 --warmup 0 --no-compile

--selfcheck: a tiny ChatGLM2 (V 96, H 64, 4 heads of kv_channels 24 so heads * kv_channels != H,
2 groups, FFN 80, 2 layers, qkv bias; the qkv weights x8 and dense_h_to_4h x4 over glm2_ref's init
so that attention is sharp and the MLP matters) in fp32: the bench's model, loaded with
glm2_ref.init_params, gives glm2_ref.forward's loss (1e-5) and every parameter's gradient (1e-5
relative to the tensor's largest; 1e-4 compiled) on the bench's batch; eager with --gqa expand, with
checkpointing, with enable_gqa when torch has it (>= 2.5), compiled when torch can compile (>= 2.2,
not with --no-compile); LoRA (qkv and all four, dropout 0, B made non-zero) against the reference
with W + scaling * B A in place of each targeted weight (gradients of every A and B), only the
adapters trainable and in fp32; LoRA dropout acts on the adapter's input x (a hook on it) and in
training only; a bf16-autocast train_step with checkpointing (full fp32 and LoRA on a bf16 base)
gives a loss within 2% of fp32 and moves exactly the trainable tensors; the full ChatGLM2-6B model
(on the meta device) has glm2_ref.param_shapes' names and shapes, N = 6,243,584,000; and the batch
of a 512-token row has bench_train's layout (256 supervised positions, each target the next id).
It runs on the CPU with torch 1.13 (no SDPA: a plain softmax attention stands in, so the SDPA and
enable_gqa paths are checked only where torch has them) in about 2 s; on torch 2.5 with compile
about 2.5 min on 2 CPU cores. Exits non-zero on any mismatch.
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

# ChatGLM2-6B (and ChatGLM3-6B: the same shapes, seq_length 8192)
CHATGLM2_6B = dict(V=65024, H=4096, L=28, NH=32, KC=128, G=2, FF=13696, eps=1e-5, qkv_bias=True)
GMASK, SOP, EOS = 64790, 64792, 2  # ChatGLM2's tokenizer ([gMASK], sop, eos), as bench_train --family chatglm2
PEAK = 989e12  # H100/H200 dense bf16, as bench_train
TARGETS = {"qkv": ("query_key_value",),
           "all": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")}


# --------------------------------------------------------------------------------------------
# Attention: SDPA where torch has it (>= 2.0); a plain softmax attention for torch 1.13 (the CPU
# selfcheck only), with the same arguments.

def _sdpa_math(q, k, v, is_causal=False, enable_gqa=False):
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        T, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(T, S, dtype=torch.bool, device=s.device).tril_(), float("-inf"))
    return s.softmax(-1) @ v


HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
SDPA = F.scaled_dot_product_attention if HAVE_SDPA else _sdpa_math


def sdpa_has_gqa():
    """Whether F.scaled_dot_product_attention takes enable_gqa (torch >= 2.5): one tiny CPU call."""
    if not HAVE_SDPA:
        return False
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    try:
        out = F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return torch.allclose(out, _sdpa_math(q, k, k, True, True), atol=1e-5)


def choose_gqa(mode, dev, compile_):
    """--gqa auto|expand|native -> ("native" | "expand", note). auto takes SDPA's enable_gqa only
    when (on CUDA) the flash backend alone runs a bf16 causal enable_gqa forward + backward, and a
    one-layer model of ChatGLM2's head layout (32 heads of 128, 2 groups; small H, FFN, vocabulary)
    with enable_gqa, under bf16 autocast, eager and (unless --no-compile) compiled per block as the
    runs do, gives the loss and gradients of the same model with expanded keys; otherwise expand."""
    have = sdpa_has_gqa()
    if mode == "expand":
        return "expand", "forced (--gqa expand)"
    if mode == "native":
        if not have:
            raise SystemExit(f"--gqa native: torch {torch.__version__} has no enable_gqa in scaled_dot_product_attention")
        return "native", "forced (--gqa native)"
    if not have:
        return "expand", f"torch {torch.__version__} has no enable_gqa"
    KC = CHATGLM2_6B["KC"]
    if dev.type == "cuda":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            return "expand", "no torch.nn.attention.sdpa_kernel to probe the flash backend"
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(2, 32, 256, KC, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        k = torch.randn(2, 2, 256, KC, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        v = torch.randn(2, 2, 256, KC, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_()
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                out.float().sum().backward()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (any failure means: do not use it)
            return "expand", f"enable_gqa not taken by the flash backend: {type(e).__name__}: {str(e)[:160]}"
        err = (out.float() - _sdpa_math(q.float(), k.float(), v.float(), True, True)).abs().max().item()
        if not err < 5e-2:
            return "expand", f"enable_gqa on flash off by {err:.3g}"
    # the block with enable_gqa against the block with expanded keys
    c = dict(CHATGLM2_6B, V=512, H=256, L=1, FF=256)
    batch = make_batch(2, 128, c["V"], dev)[2]

    def loss_grads(gqa, compiled):
        torch.manual_seed(0)
        m = GLM2(c, dev, torch.float32)
        m.set_gqa(gqa)
        if compiled:
            for blk in m.layers:
                blk.compile()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = m(*batch)
        loss.backward()
        return loss.detach().float(), [p.grad.float() for p in m.parameters()]

    ref_l, ref_g = loss_grads("expand", False)
    for tag, compiled in [("eager", False)] + ([("compiled", True)] if compile_ else []):
        try:
            l_, g_ = loss_grads("native", compiled)
        except Exception as e:  # noqa: BLE001
            return "expand", f"enable_gqa in the {tag} block failed: {type(e).__name__}: {str(e).strip()[-160:]}"
        finally:
            if compiled:
                torch._dynamo.reset()
        bad = [i for i, (a_, b_) in enumerate(zip(g_, ref_g))
               if not (a_ - b_).abs().max().item() <= 5e-2 * b_.abs().max().item() + 1e-6]
        if not abs(l_.item() - ref_l.item()) <= 1e-2 * abs(ref_l.item()) or bad:
            return "expand", f"enable_gqa in the {tag} block: loss {l_.item():.5f} vs {ref_l.item():.5f}, {len(bad)} gradients off"
    return "native", ("enable_gqa on the flash backend, " if dev.type == "cuda" else "enable_gqa, ") + \
        f"the block with it = the block with expanded keys ({'eager and compiled' if compile_ else 'eager'})"


# --------------------------------------------------------------------------------------------
# The model

def rope_tables(T, KC, dev):
    """cos, sin [T, KC/4] (fp32) of position * theta_i, theta_i = 10000^(-2i / (KC/2)), positions
    0..T-1: RotaryEmbedding(KC // 2) of modeling_chatglm.py, rope_ratio 1."""
    n = KC // 2
    theta = 1.0 / (10000.0 ** (torch.arange(0, n, 2, device=dev, dtype=torch.float32) / n))
    ang = torch.arange(T, device=dev, dtype=torch.float32)[:, None] * theta[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x [B, T, heads, KC]: dims [0, KC/2) rotated in interleaved pairs (2i, 2i+1), the rest kept."""
    B, T, n, KC = x.shape
    R = cos.shape[-1] * 2
    xr = x[..., :R].reshape(B, T, n, R // 2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos[None, :, None, :].to(x.dtype)
    s = sin[None, :, None, :].to(x.dtype)
    out = torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).reshape(B, T, n, R)
    return torch.cat((out, x[..., R:]), dim=-1)


def _param(shape, dev, dtype, trainable, std=None, fill=None):
    t = torch.empty(shape, device=dev, dtype=dtype)
    if std is not None:
        t.normal_(0.0, std)
    else:
        t.fill_(fill)
    return nn.Parameter(t, requires_grad=trainable)


class Linear(nn.Module):
    """A linear module of the block (THUDM's name), optionally with peft's LoRA adapter:
    y = x W^T + b + (dropout(x) A^T B^T) * alpha / r."""

    def __init__(self, inp, out, bias, dev, dtype, trainable, r=0, alpha=0.0, dropout=0.0):
        super().__init__()
        self.weight = _param((out, inp), dev, dtype, trainable, std=0.02)
        self.bias = _param((out,), dev, dtype, trainable, fill=0.0) if bias else None
        self.r = r
        if r > 0:
            self.lora_A = nn.Parameter(torch.empty(r, inp, device=dev, dtype=torch.float32))
            self.lora_B = nn.Parameter(torch.zeros(out, r, device=dev, dtype=torch.float32))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.scaling = alpha / r

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        if self.r > 0:
            y = y + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling
        return y


class RMSNorm(nn.Module):
    def __init__(self, n, eps, dev, dtype, trainable):
        super().__init__()
        self.weight = _param((n,), dev, dtype, trainable, fill=1.0)
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


class Block(nn.Module):
    """GLMBlock of ChatGLM2: pre-norm, grouped-query attention with half-head rotary, SwiGLU."""

    def __init__(self, c, dev, dtype, trainable, lora):
        super().__init__()
        H, NH, KC, G, FF = c["H"], c["NH"], c["KC"], c["G"], c["FF"]
        self.c = c
        self.gqa = "expand"  # or "native" (SDPA's enable_gqa)

        def lin(name, i, o, bias=False):
            r = lora["r"] if lora and name in lora["targets"] else 0
            return Linear(i, o, bias, dev, dtype, trainable, r, lora["alpha"] if r else 0.0,
                          lora["dropout"] if r else 0.0)

        self.input_layernorm = RMSNorm(H, c["eps"], dev, dtype, trainable)
        self.query_key_value = lin("query_key_value", H, NH * KC + 2 * G * KC, c["qkv_bias"])
        self.dense = lin("dense", NH * KC, H)
        self.post_attention_layernorm = RMSNorm(H, c["eps"], dev, dtype, trainable)
        self.dense_h_to_4h = lin("dense_h_to_4h", H, 2 * FF)
        self.dense_4h_to_h = lin("dense_4h_to_h", FF, H)

    def forward(self, h, cos, sin):
        B, T, _ = h.shape
        NH, KC, G = self.c["NH"], self.c["KC"], self.c["G"]
        x = self.input_layernorm(h)
        q, k, v = self.query_key_value(x).split([NH * KC, G * KC, G * KC], dim=-1)
        q = apply_rope(q.view(B, T, NH, KC), cos, sin).transpose(1, 2)  # [B, NH, T, KC]
        k = apply_rope(k.view(B, T, G, KC), cos, sin).transpose(1, 2)  # [B, G, T, KC]
        v = v.view(B, T, G, KC).transpose(1, 2)
        if self.gqa == "native":
            a = SDPA(q, k, v, is_causal=True, enable_gqa=True)
        else:  # query head h reads group h // (NH / G)
            k = k[:, :, None].expand(B, G, NH // G, T, KC).reshape(B, NH, T, KC)
            v = v[:, :, None].expand(B, G, NH // G, T, KC).reshape(B, NH, T, KC)
            a = SDPA(q, k, v, is_causal=True)
        h1 = h + self.dense(a.transpose(1, 2).reshape(B, T, NH * KC))
        y = self.post_attention_layernorm(h1)
        gate, up = self.dense_h_to_4h(y).chunk(2, dim=-1)
        return h1 + self.dense_4h_to_h(F.silu(gate) * up)


class GLM2(nn.Module):
    """ChatGLMForConditionalGeneration's compute. Full fine-tuning: trainable parameters in dtype
    (fp32 for the bench); lora = dict(r, alpha, dropout, targets): a frozen base in dtype (bf16 for
    the bench) and fp32 adapters."""

    def __init__(self, c, dev, dtype, lora=None):
        super().__init__()
        trainable = not lora
        self.c = c
        self.word_embeddings = _param((c["V"], c["H"]), dev, dtype, trainable, std=0.02)
        self.layers = nn.ModuleList(Block(c, dev, dtype, trainable, lora) for _ in range(c["L"]))
        self.final_layernorm = RMSNorm(c["H"], c["eps"], dev, dtype, trainable)
        self.output_layer = _param((c["V"], c["H"]), dev, dtype, trainable, std=0.02)
        self.ckpt = False

    def set_gqa(self, mode):
        for blk in self.layers:
            blk.gqa = mode

    def hidden(self, ids):
        h = F.embedding(ids, self.word_embeddings)
        cos, sin = rope_tables(ids.shape[1], self.c["KC"], ids.device)  # once per step, all layers
        for blk in self.layers:
            if self.ckpt:
                h = checkpoint(blk, h, cos, sin, use_reentrant=False)
            else:
                h = blk(h, cos, sin)
        return h

    def forward(self, ids, sup_idx, sup_tgt):
        h = self.hidden(ids).reshape(-1, self.c["H"])[sup_idx]  # only the supervised rows
        logits = F.linear(self.final_layernorm(h), self.output_layer)
        return F.cross_entropy(logits.float(), sup_tgt)


def n_params_of(c):
    """Parameters of the model by the formula (no allocation)."""
    H, NH, KC, G, FF, L, V = c["H"], c["NH"], c["KC"], c["G"], c["FF"], c["L"], c["V"]
    qkv = NH * KC + 2 * G * KC
    layer = 2 * H + qkv * H + (qkv if c["qkv_bias"] else 0) + NH * KC * H + 2 * FF * H + FF * H
    return 2 * V * H + L * layer + H


def make_batch(B, T, V, dev, seed=42):
    """bench_train's rows: prompt T/2-1 random tokens, [gMASK], sop, answer tokens, eos; labels on
    sop..eos. Returns ids [B, T], the labels [B, T] (-100 = none) and the model's inputs
    (flat indices of the supervised positions, each predicting the next token; their targets)."""
    g = torch.Generator().manual_seed(seed)
    top = min(V - 10, 120000)
    ids = 5 + torch.randint(0, top, (B, T), generator=g)
    ctx = T // 2
    gmask, sop = (GMASK, SOP) if V > SOP else (V - 2, V - 1)  # tiny vocabularies: the last two ids
    ids[:, ctx - 1] = gmask
    ids[:, ctx] = sop
    ids[:, T - 1] = EOS
    labels = torch.full((B, T), -100, dtype=torch.long)
    labels[:, ctx:] = ids[:, ctx:]
    targets = torch.full((B, T), -100, dtype=torch.long)
    targets[:, :-1] = labels[:, 1:]  # position i predicts label i+1
    flat = targets.reshape(-1)
    sup_idx = (flat != -100).nonzero().squeeze(1)
    return ids.to(dev), labels.to(dev), [ids.to(dev), sup_idx.to(dev), flat[sup_idx].to(dev)]


# --------------------------------------------------------------------------------------------
# The bench

def train_step(model, opt, params, batch, dev):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = model(*batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss


def raise_dynamo_cache(layers):
    # one Block class, L instances: where dynamo guards on the module (torch < 2.5) each is a cache
    # entry of the same code; the default limit (8) would leave the rest eager
    for name in ("cache_size_limit", "recompile_limit"):  # the name moved between versions
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 2 * layers + 8))


def measure(a, c, T, B, ck, dev, lora, gqa, res):
    """A fresh model and optimizer, --warmup steps, then --steps timed ones; fills res."""
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    t_run = time.time()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    # full: fp32 parameters (AdamW's master copy), bf16 matmuls by autocast; LoRA: a bf16 base
    model = GLM2(c, dev, torch.bfloat16 if lora else torch.float32, lora)
    model.ckpt = ck
    model.set_gqa(gqa)
    model.train()
    if not a.no_compile:
        for blk in model.layers:
            blk.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4 if lora else 1e-5, weight_decay=0.01,
                            **({"fused": True} if cuda else {}))
    n_all = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in params)
    batch = make_batch(B, T, c["V"], dev)[2]
    first = None
    for i in range(a.warmup):
        loss = train_step(model, opt, params, batch, dev)
        sync()
        if i == 0:
            first = time.time() - t_run
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = train_step(model, opt, params, batch, dev)
        sync()
        times.append(time.perf_counter() - t0)
    if first is None:
        first = time.time() - t_run
    med = sorted(times)[len(times) // 2]
    tok = B * T / med
    flops_tok = (4 if lora else 6) * n_all + 12 * a.layers * c["H"] * T
    res.update(step_ms=med * 1e3, step_ms_all=[round(t * 1e3, 2) for t in times], tok_s=tok,
               mfu=tok * flops_tok / PEAK, flops_per_token=flops_tok, first_step_s=first, loss=float(loss),
               n_params=n_all, n_trainable=n_train, steps=a.steps, warmup=a.warmup)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        res.update(peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                   device_used_gib=(total - free) / 2**30, device_name=torch.cuda.get_device_name())


def bench_run(a, c, run, dev, lora, gqa, gqa_note):
    """One run "TxB[c]": its record (with "oom": true when it ran out of device memory)."""
    ck = run.endswith("c")
    T, B = map(int, run.rstrip("c").split("x"))
    if T < 4 or T % 2 or B < 1:
        raise SystemExit(f"run {run}: T must be even and >= 4, B >= 1")
    ft = f"lora{lora['r']}{'' if a.lora_target == 'qkv' else a.lora_target}" if lora else "full"
    label = f"{T}x{B}{'+ckpt' if ck else ''}{'+' + ft if lora else ''}+glm2"
    res = dict(impl="pytorch-lora" if lora else "pytorch", model="chatglm2-6b" if a.layers == CHATGLM2_6B["L"] else
               f"chatglm2-6b-{a.layers}layers", run=label, seq=T, batch=B, ckpt=int(ck), ft=ft,
               lora_rank=lora["r"] if lora else 0, lora_target=a.lora_target if lora else None,
               compile=not a.no_compile, gqa=gqa, gqa_note=gqa_note, layers=a.layers, device=dev.type,
               torch=torch.__version__, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    try:
        measure(a, c, T, B, ck, dev, lora, gqa, res)
    except Exception as e:  # noqa: BLE001
        oom = getattr(torch.cuda, "OutOfMemoryError", None)
        if not ((oom is not None and isinstance(e, oom)) or "out of memory" in str(e)):
            raise
        res.update(oom=True, error=str(e).split("\n")[0][:300])
        if dev.type == "cuda":
            res.update(peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30)
    # the run's model, optimizer and (after an OOM) its traceback's frames are gone here
    if not a.no_compile:
        torch._dynamo.reset()  # compiled blocks hold the old parameters
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


# --------------------------------------------------------------------------------------------
# --selfcheck

TINY = dict(V=96, H=64, L=2, NH=4, KC=24, G=2, FF=80, eps=1e-5, qkv_bias=True)


def ref_config(c):
    import glm2_ref
    return glm2_ref.load_config({
        "padded_vocab_size": c["V"], "hidden_size": c["H"], "num_layers": c["L"], "num_attention_heads": c["NH"],
        "kv_channels": c["KC"], "multi_query_attention": True, "multi_query_group_num": c["G"],
        "ffn_hidden_size": c["FF"], "layernorm_epsilon": c["eps"], "add_qkv_bias": c["qkv_bias"],
        "seq_length": 4096})


def ref_name(n):
    """The bench model's parameter name -> THUDM's (glm2_ref's) name."""
    if n == "word_embeddings":
        return "transformer.embedding.word_embeddings.weight"
    if n == "output_layer":
        return "transformer.output_layer.weight"
    if n.startswith("final_layernorm."):
        return "transformer.encoder." + n
    _, l, mod, rest = n.split(".", 3)
    sub = {"query_key_value": "self_attention.", "dense": "self_attention.", "dense_h_to_4h": "mlp.",
           "dense_4h_to_h": "mlp."}.get(mod, "")
    return f"transformer.encoder.layers.{l}.{sub}{mod}.{rest}"


class Fail(Exception):
    pass


def _close(name, got, ref, tol, rel=False):
    d = (got.detach().double() - ref.detach().double()).abs().max().item() if got.numel() else 0.0
    lim = tol * max(ref.detach().double().abs().max().item(), 1e-30) if rel else tol
    if not d <= lim:
        raise Fail(f"{name}: max abs diff {d:.3g} > {lim:.3g}")
    return d / (lim / tol) if rel else d


def selfcheck(a, dev):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
    import glm2_ref
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    c = dict(TINY)
    cfg = ref_config(c)
    assert c["NH"] * c["KC"] != c["H"] and c["G"] < c["NH"]
    B, T = 3, 16
    ids, labels, batch = make_batch(B, T, c["V"], dev)
    assert int(batch[1].numel()) == B * T // 2, "supervised rows: the answer half of every row"
    p0 = glm2_ref.init_params(cfg, seed=3)
    for l in range(c["L"]):  # sharper attention than std 0.02 gives at H 64 (positions matter), a larger MLP
        p0[f"transformer.encoder.layers.{l}.self_attention.query_key_value.weight"] *= 8.0
        p0[f"transformer.encoder.layers.{l}.mlp.dense_h_to_4h.weight"] *= 4.0
    ok = True

    def check(tag, fn):
        nonlocal ok
        try:
            msg = fn()
            print(f"  ok   {tag}{': ' + msg if msg else ''}", flush=True)
        except Fail as e:
            ok = False
            print(f"  FAIL {tag}: {e}", flush=True)

    def build(lora=None, dtype=torch.float32):
        torch.manual_seed(0)
        m = GLM2(c, dev, dtype, lora)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_" not in n:
                    p.copy_(p0[ref_name(n)])
        return m

    # the reference: glm2_ref.forward in fp32 on the CPU, its loss and every gradient
    rp = {k: v.clone().requires_grad_() for k, v in p0.items()}
    out = glm2_ref.forward(cfg, rp, ids.cpu(), labels=labels.cpu())
    rl = out["loss"]
    rg = dict(zip(rp, torch.autograd.grad(rl, list(rp.values()))))
    print(f"selfcheck: tiny ChatGLM2 {c} (B {B}, T {T}) on {dev.type}, reference loss {rl.item():.6f}", flush=True)

    def full_case(gqa, ck, compiled):
        def run():
            m = build()
            m.set_gqa(gqa)
            m.ckpt = ck
            if compiled:
                for blk in m.layers:
                    blk.compile()
            loss = m(*batch)
            loss.backward()
            names = [n for n, _ in m.named_parameters()]
            if sorted(ref_name(n) for n in names) != sorted(rp):
                raise Fail("parameter names differ from the reference's")
            d = _close("loss", loss, rl, 1e-5)
            worst = 0.0
            for n, p in m.named_parameters():
                if p.grad is None:
                    raise Fail(f"{n}: no gradient")
                worst = max(worst, _close(f"grad {n}", p.grad.cpu(), rg[ref_name(n)], 1e-5 if not compiled else 1e-4,
                                          rel=True))
            return f"loss diff {d:.2g}, worst grad diff {worst:.2g} (relative to the tensor's max), {len(names)} tensors"
        return run

    variants = [("expand", False, False), ("expand", True, False)]
    if sdpa_has_gqa():
        variants += [("native", False, False), ("native", True, False)]
    else:
        print(f"  (torch {torch.__version__}: no enable_gqa, the native GQA path is not checked here)", flush=True)
    can_compile = hasattr(nn.Module, "compile") and not a.no_compile
    if can_compile:
        raise_dynamo_cache(c["L"])
        variants += [(g, False, True) for g in ("expand", "native") if g == "expand" or sdpa_has_gqa()]
        variants += [("expand", True, True)]
    else:
        print(f"  (compiled blocks not checked: {'--no-compile' if a.no_compile else 'torch ' + torch.__version__ + ' has no nn.Module.compile'})",
              flush=True)
    sdpa_name = "SDPA" if HAVE_SDPA else "plain softmax attention (torch < 2: no SDPA)"
    for gqa, ck, compiled in variants:
        check(f"full fine-tuning, gqa {gqa}{', checkpointing' if ck else ''}{', compiled' if compiled else ''}, "
              f"{sdpa_name} vs glm2_ref: loss and every gradient", full_case(gqa, ck, compiled))
        if compiled:
            torch._dynamo.reset()

    # LoRA against the reference with W + scaling * B A in place of each targeted weight
    def lora_case(target, ck, compiled=False):
        def run():
            r, alpha = 4, 8.0
            lo = dict(r=r, alpha=alpha, dropout=0.0, targets=TARGETS[target])
            m = build(lo)
            m.ckpt = ck
            g = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for mod in m.modules():
                    if isinstance(mod, Linear) and mod.r:
                        mod.lora_B.copy_(torch.randn(mod.lora_B.shape, generator=g) * 0.1)
            if compiled:
                for blk in m.layers:
                    blk.compile()
            train = {n: p for n, p in m.named_parameters() if p.requires_grad}
            want = {f"layers.{l}.{mod}.lora_{x}" for l in range(c["L"]) for mod in TARGETS[target] for x in "AB"}
            if set(train) != want:
                raise Fail(f"trainable {sorted(train)} != the adapters {sorted(want)}")
            if any(p.dtype != torch.float32 for p in train.values()):
                raise Fail("adapters not fp32")
            loss = m(*batch)
            loss.backward()
            if any(p.grad is not None for n, p in m.named_parameters() if n not in train):
                raise Fail("a frozen parameter got a gradient")
            # the reference: merged weights as functions of leaf copies of A and B
            ab = {n: p.detach().cpu().clone().requires_grad_() for n, p in train.items()}
            pm = dict(p0)
            for l in range(c["L"]):
                for mod in TARGETS[target]:
                    pre = f"layers.{l}.{mod}."
                    rn = ref_name(pre + "weight")
                    pm[rn] = p0[rn] + (alpha / r) * (ab[pre + "lora_B"] @ ab[pre + "lora_A"])
            lr_ = glm2_ref.forward(cfg, pm, ids.cpu(), labels=labels.cpu())["loss"]
            gr = dict(zip(ab, torch.autograd.grad(lr_, list(ab.values()))))
            d = _close("loss", loss, lr_, 1e-5)
            worst = 0.0
            for n, p in train.items():
                if p.grad is None or gr[n].abs().max() == 0:
                    raise Fail(f"{n}: no gradient")
                worst = max(worst, _close(f"grad {n}", p.grad.cpu(), gr[n], 1e-4 if compiled else 1e-5, rel=True))
            return f"loss diff {d:.2g}, worst adapter grad diff {worst:.2g} (relative), {len(train)} adapter tensors"
        return run

    for target in ("qkv", "all"):
        for ck in (False, True):
            check(f"LoRA r=4 alpha=8 on {target}{', checkpointing' if ck else ''} vs glm2_ref with W + 2 B A: "
                  f"loss and every adapter gradient", lora_case(target, ck))
    if can_compile:
        check("LoRA on all, compiled vs glm2_ref", lora_case("all", False, True))
        torch._dynamo.reset()

    def lora_dropout():
        lo = dict(r=4, alpha=8.0, dropout=0.05, targets=TARGETS["all"])
        m = build(lo)
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, Linear) and mod.r:
                    mod.lora_B.normal_(0.0, 0.1)
        m.train()
        lt = m(*batch).item()
        m.eval()
        with torch.no_grad():
            le = m(*batch).item()
        m0 = GLM2(c, dev, torch.float32, dict(lo, dropout=0.0))
        m0.load_state_dict(m.state_dict())
        with torch.no_grad():
            l0 = m0(*batch).item()
        if abs(le - l0) > 1e-6:
            raise Fail(f"eval loss {le} != the dropout-free loss {l0}")
        if abs(lt - l0) < 1e-7:
            raise Fail("dropout 0.05 did not change the training loss")
        # where the dropout sits: on the adapter's input x, not on its output nor on the base's
        mod = m.layers[0].query_key_value
        mod.train()
        mod.lora_dropout.p = 0.5
        seen = {}
        hk = mod.lora_dropout.register_forward_hook(lambda _m, i, o: seen.update(x=i[0], d=o))
        x = torch.randn(5, c["H"], device=dev)
        y = mod(x)
        hk.remove()
        d = seen["d"]
        if not (seen["x"] is x and torch.allclose(d[d != 0], 2 * x[d != 0]) and 0 < int((d == 0).sum()) < d.numel()):
            raise Fail("the LoRA dropout does not act on the adapter's input x")
        want = F.linear(x, mod.weight, mod.bias) + F.linear(F.linear(d, mod.lora_A), mod.lora_B) * mod.scaling
        _close("y = base(x) + scaling * B A dropout(x)", y, want, 1e-5, rel=True)
        return f"training loss {lt:.6f} vs eval {le:.6f} = dropout-free {l0:.6f}"

    check("LoRA dropout 0.05 on the adapter input: training only", lora_dropout)

    def bf16_step():
        msgs = []
        for lo in (None, dict(r=4, alpha=8.0, dropout=0.05, targets=TARGETS["qkv"])):
            m = build(lo, torch.bfloat16 if lo else torch.float32)
            m.ckpt = True
            params = [p for p in m.parameters() if p.requires_grad]
            frozen = {n: p.detach().clone() for n, p in m.named_parameters() if not p.requires_grad}
            before = [p.detach().clone() for p in params]
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01,
                                    **({"fused": True} if dev.type == "cuda" else {}))
            loss = train_step(m, opt, params, batch, dev)
            _close("bf16 autocast loss (relative)", loss.float().cpu(), rl, 2e-2, rel=True)
            if not all((p.detach() != b).any() for p, b in zip(params, before)):
                raise Fail("a trainable tensor did not move in one AdamW step")
            if any(not torch.equal(p, frozen[n]) for n, p in m.named_parameters() if not p.requires_grad):
                raise Fail("a frozen tensor moved")
            msgs.append(f"{'LoRA (bf16 base)' if lo else 'full (fp32)'} loss {loss.item():.4f}, "
                        f"{len(params)} trainable moved, {len(frozen)} frozen kept")
        return "; ".join(msgs) + f" (fp32 reference {rl.item():.4f})"

    check("one bf16-autocast training step with checkpointing (train_step), full and LoRA", bf16_step)

    def full_size():
        cf = dict(CHATGLM2_6B)
        rcfg = ref_config(cf)
        shapes = dict(glm2_ref.param_shapes(rcfg))
        m = GLM2(cf, torch.device("meta"), torch.float32)
        got = {ref_name(n): tuple(p.shape) for n, p in m.named_parameters()}
        if got != {k: tuple(v) for k, v in shapes.items()}:
            raise Fail("ChatGLM2-6B parameter shapes differ from glm2_ref.param_shapes")
        n = sum(p.numel() for p in m.parameters())
        nr = sum(math.prod(s) for s in shapes.values())
        if not n == nr == n_params_of(cf) == 6243584000:
            raise Fail(f"N {n} vs glm2_ref {nr} vs formula {n_params_of(cf)}")
        return f"N = {n:,} in {len(got)} tensors, the same names and shapes as glm2_ref"

    check("the ChatGLM2-6B model (meta device) against glm2_ref.param_shapes", full_size)

    def batch_layout():
        _, lab, (i2, si, st) = make_batch(2, 512, CHATGLM2_6B["V"], torch.device("cpu"))
        ctx = 256
        if not ((i2[:, ctx - 1] == GMASK).all() and (i2[:, ctx] == SOP).all() and (i2[:, -1] == EOS).all()):
            raise Fail("row layout")
        if int(i2.max()) >= CHATGLM2_6B["V"] or int(i2.min()) < 0:
            raise Fail("ids outside the vocabulary")
        pos = si % 512
        if not (pos.min() == ctx - 1 and pos.max() == 510 and si.numel() == 512):
            raise Fail("supervised positions")
        if not torch.equal(st, i2.reshape(-1)[si + 1]):
            raise Fail("targets are not the next tokens")
        return "prompt 255 + [gMASK] + sop + answer + eos; 256 supervised positions a row (255..510)"

    check("bench_train's batch at 512x2", batch_layout)
    print("SELFCHECK " + ("ok" if ok else "FAILED"), flush=True)
    return ok


# --------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="512x8,2048x2,512x8c", help="comma-separated TxB[c] (c: activation checkpointing)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=CHATGLM2_6B["L"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--lora", type=int, default=0, metavar="R", help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--lora_target", default="qkv", choices=sorted(TARGETS))
    ap.add_argument("--lora_alpha", type=float, default=0.0, help="default 2R")
    ap.add_argument("--lora_dropout", type=float, default=0.05)
    ap.add_argument("--gqa", default="auto", choices=("auto", "expand", "native"),
                    help="grouped keys: SDPA's enable_gqa (native), expand+reshape to all heads, or auto")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"), help="default: cuda when there is one")
    ap.add_argument("--out", default=None, help="append one JSON record per run")
    ap.add_argument("--selfcheck", action="store_true", help="check the model against tests/py/glm2_ref.py and exit")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.layers < 1 or a.lora < 0:
        ap.error("--steps and --layers must be >= 1, --warmup and --lora >= 0")
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device")
    if a.selfcheck:
        sys.exit(0 if selfcheck(a, dev) else 1)
    if not a.no_compile and not hasattr(nn.Module, "compile"):
        ap.error(f"torch {torch.__version__} has no nn.Module.compile; use --no-compile")
    c = dict(CHATGLM2_6B, L=a.layers)
    lora = dict(r=a.lora, alpha=a.lora_alpha if a.lora_alpha > 0 else 2.0 * a.lora, dropout=a.lora_dropout,
                targets=TARGETS[a.lora_target]) if a.lora else None
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if not a.no_compile:
        raise_dynamo_cache(a.layers)
    gqa, note = choose_gqa(a.gqa, dev, not a.no_compile)
    ft = (f"LoRA r={lora['r']} alpha={lora['alpha']:g} dropout={lora['dropout']:g} on {','.join(lora['targets'])}, "
          "bf16 base" if lora else "full fine-tuning, fp32 parameters")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}: "
          f"ChatGLM2-6B shapes, {a.layers} layers, {ft}, bf16 autocast, "
          f"{'torch.compile per block' if not a.no_compile else 'eager'}, attention "
          f"{'SDPA' if HAVE_SDPA else 'plain (no SDPA)'} gqa={gqa} ({note})", flush=True)
    for run in a.runs.split(","):
        res = bench_run(a, c, run.strip(), dev, lora, gqa, note)
        print("RESULT " + json.dumps(res), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
