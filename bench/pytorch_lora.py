#!/usr/bin/env python3
"""PyTorch + LoRA baseline for `bench_train --lora R` (issue 16): the model of
bench/pytorch_baseline.py (ChatGLM-6B shapes, untied head, SDPA with the GLM prefix mask, 2D
rotary, alpha = sqrt(56) residuals, loss over the answer half with logits only for supervised
rows, torch.compile per block) with a frozen base and peft-style LoRA adapters:

- every base weight (embedding, LayerNorms, linear weights and biases, head) is created directly
  in bf16 on the GPU with requires_grad=False: no fp32 master, no gradient, no optimizer state
  (with --base_quant the four linear weights of each layer are int8 / int4 instead, below);
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

--base_quant int8|int4 (default none) stores the frozen weights of the four linear modules of
every layer (query_key_value, dense, dense_h_to_4h, dense_4h_to_h; not their LoRA adapters, not
the embedding, LayerNorms, biases or head) quantized as THUDM's chatglm-6b quantization.py does:
one fp16 scale per output row s = max|w| / (2^(bits-1) - 1), q = round(w / s) as int8 [OC, C];
int4 packs two values a byte, int8 [OC, C/2], the even column in the high nibble
(q[2j] << 4 | q[2j+1] & 0xF). Each matrix is drawn in bf16 on the device (the same random
stream as --base_quant none), quantized in row chunks and freed, so no full-precision copy of the
model exists and the peak memory reflects the integer storage. The linears compute as a plain
PyTorch user would, "dequantize then matmul": an autograd.Function like THUDM's W8A16Linear
without its (wasted) weight gradient; forward unpacks (int4: arithmetic shifts on int8,
high = q >> 4, low = (q << 4) >> 4), multiplies by the scale into a bf16 [OC, C] temporary and
runs x @ w^T + b; backward dequantizes again and returns only grad_input = grad_out @ w (nothing
is saved for it but the integer weights). The LoRA branch is unchanged. Under torch.compile
dynamo traces the Function into the block's graph (dequantize fused into one kernel per weight,
the matmul stays an extern GEMM; seen with torch 2.15 on CPU: no graph break, and the backward
graph recomputes the dequantize from q and s rather than saving the bf16 weight);
--quant_eager keeps it out of the graph (torch.compiler.disable, a graph break at each quantized
linear) in case that tracing fails or is slower on some torch. N in the
MFU formula counts the quantized weights by their elements, as without quantization. The run
label gets a suffix as bench_train --quant does (512x8+lora8+int4) and the record has
"base_quant" (and "quant_eager", "base_gib": the frozen base's storage).
--selfcheck checks the quantization and exits (no timed runs): the int4 packing against a
scalar loop, |w - dequant(q)| <= s/2, and a 2-layer fp32 model with --base_quant int8/int4
(the chosen one, both for none) against a float model holding the dequantized weights: hidden
states and loss, and the LoRA gradients (B made nonzero), to 1e-4; without --no-compile also the
compiled dequantize bit for bit and the compiled blocks against the float model.

--freeze N (instead of LoRA): LLaMA-Factory's freeze mode for `bench_train --freeze N`: every
tensor of the last N layers trains, upcast to fp32 (as LLaMA-Factory upcasts trainable
parameters), under the same bf16 autocast; the rest stays frozen bf16, so autograd's backward
ends at the lowest trainable layer. MFU uses the LoRA formula (tokens/s is the comparison).

--ptuning P (instead of LoRA; with --lora it is an error): THUDM's P-Tuning v2 as
modeling_chatglm.py's PrefixEncoder without prefix_projection. No adapters; the one trainable
parameter is the prefix embedding [P, 2 L H] (fp32 under bf16 autocast, as THUDM's ptuning main.py
keeps the prefix encoder in float; N(0, 1) as nn.Embedding), made after the base so the base's
random stream is the LoRA runs'. Layer l's keys are its columns at slot 2l, its values at 2l + 1
(each [P, NH, HD]): one view + split(2) of the embedding gives each layer its [P, 2, NH, HD] slice
(the split's backward is one concatenation), passed as an input of the (compiled) block, which
casts it to the compute dtype, expands it to the B rows, applies prefix dropout (--prefix_dropout,
0.1, per batch row, training only) and concatenates the keys / values in front of the rotated
(the prefix is not rotated) keys / values; SDPA takes the boolean GLM prefix mask extended with P
always-visible columns, [B, 1, T, P + T]. Fused AdamW and clipping over the embedding only. The
label ends "+ptuning{P}" as bench_train's (512x8+ptuning128, 512x4+ckpt+ptuning128; bench_train
on CUDA also puts "+hc" before it, for its head chunk, which has no counterpart here); the records
keep "impl": "pytorch-lora" and carry bench_train's "ft" ("lora8", "lora8all", "ptuning128"),
"pre_seq_len" and "prefix_dropout"; n_trainable = P * 2 L H; MFU with the same 4N + 12 L H T (N
includes the prefix embedding, as bench_train's; the attention over the P extra keys is not
counted, as bench_train does not count it either).
--selfcheck also checks P-Tuning (P = --ptuning or 8; selfcheck_ptuning): a 2-layer fp32 model,
prefix dropout 0, against an explicit per-layer loop (torch.cat of the prefix keys / values,
plain softmax attention): hidden states and loss to 1e-4 and the prefix gradient (finite,
non-zero in every layer's key and value slot) against the loop's, eager with and without
checkpointing (and compiled without --no-compile); with dropout 0.1 the training loss moves and
the eval loss equals the reference.

  python3 bench/pytorch_lora.py --runs 512x8,2048x2,512x4c --lora 8 [--lora_target qkv|all]
      [--base_quant none|int8|int4 [--quant_eager]] [--steps 6] [--warmup 3] [--layers 28]
      [--ptuning P [--prefix_dropout 0.1]] (instead of --lora)
      [--no-compile] [--out FILE] [--selfcheck]
CPU smoke test (torch without compile or SDPA: --no-compile, tiny shapes):
  python3 bench/pytorch_lora.py --tiny --layers 2 --runs 64x2,64x2c --no-compile --steps 2 --warmup 1 \
      [--base_quant int4] [--ptuning 8]
  python3 bench/pytorch_lora.py --tiny --no-compile --selfcheck [--ptuning 8]
(on the GPU, `--tiny --selfcheck` also checks the compiled path, in about a minute)
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
QBITS = {"none": 0, "int8": 8, "int4": 4}  # --base_quant


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


def pack_int4(q):
    """int8 [OC, C] in [-8, 7] -> int8 [OC, C/2]: the even column in the high nibble (THUDM's
    int4WeightCompression)."""
    return (q[:, 0::2] << 4) | (q[:, 1::2] & 0xF)


def unpack_int4(p):
    """pack_int4's inverse by arithmetic shifts on int8: high = p >> 4, low = (p << 4) >> 4."""
    return torch.stack((p >> 4, (p << 4) >> 4), dim=-1).flatten(-2)


def quantize(w, bits, rows=1024):
    """THUDM chatglm-6b quantization.py: s = max|w| / (2^(bits-1) - 1) per output row (fp16),
    q = round(w / s) int8, int4 packed by pack_int4. Works in row chunks so the temporaries stay
    small next to w (the division is in fp32 where THUDM's is fp16 / fp16)."""
    OC, C = w.shape
    assert bits in (4, 8) and (bits == 8 or C % 2 == 0), (bits, w.shape)
    maxq = 2 ** (bits - 1) - 1
    s = torch.empty(OC, device=w.device, dtype=torch.float16)
    q = torch.empty(OC, C if bits == 8 else C // 2, device=w.device, dtype=torch.int8)
    for r in range(0, OC, rows):
        wr = w[r:r + rows].float()
        sr = (wr.abs().amax(dim=1) / maxq).half()
        s[r:r + rows] = sr
        sr = sr.float()
        qr = torch.round(wr / torch.where(sr > 0, sr, torch.ones_like(sr))[:, None]).clamp_(-maxq, maxq).to(torch.int8)
        q[r:r + rows] = qr if bits == 8 else pack_int4(qr)
    return q, s


def dequantize(q, s, bits, dtype):
    """The [OC, C] weight in dtype: unpack (int4), convert, times the row scale."""
    if bits == 4:
        q = unpack_int4(q)
    return q.to(dtype).mul_(s.to(dtype)[:, None])


class QuantLinearFn(torch.autograd.Function):
    """THUDM's W8A16Linear without its weight gradient (the base is frozen): y = x @ deq(q)^T + b,
    grad_x = grad_y @ deq(q), the weight dequantized again in backward; only q and s are saved."""

    @staticmethod
    def forward(ctx, x, q, s, bias, bits, dtype):
        ctx.save_for_backward(q, s)
        ctx.bits, ctx.dtype, ctx.x_dtype = bits, dtype, x.dtype
        w = dequantize(q, s, bits, dtype)
        return F.linear(x.to(dtype), w, None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad_y):
        # called only when x needs a gradient (q, s and the bias never do)
        q, s = ctx.saved_tensors
        w = dequantize(q, s, ctx.bits, ctx.dtype)
        return (grad_y.to(ctx.dtype) @ w).to(ctx.x_dtype), None, None, None, None, None


def _quant_linear(x, q, s, bias, bits, dtype):
    return QuantLinearFn.apply(x, q, s, bias, bits, dtype)


# --quant_eager: the same Function kept out of torch.compile's graphs (where torch has dynamo)
_dynamo_disable = getattr(getattr(torch, "compiler", None), "disable", None) or \
    getattr(getattr(torch, "_dynamo", None), "disable", None)
_quant_linear_eager = _dynamo_disable(_quant_linear) if _dynamo_disable else _quant_linear


class LoraLinear(nn.Module):
    """peft's lora.Linear over a frozen base: W x + b + scaling * B A dropout(x). bits 8/4: the
    base weight is stored quantized (qweight int8, qscale fp16 buffers) and used by QuantLinearFn,
    computing in dtype (bf16; fp32 in --selfcheck)."""

    def __init__(self, inp, out, dev, dtype, r=0, alpha=16.0, dropout=0.05, bias=True, bits=0, eager=False, dora=False):
        super().__init__()
        self.dora = dora and r > 0
        self.bits, self.eager, self.cdtype, self.n_base = bits, eager, dtype, out * inp
        if bits:
            w = torch.empty((out, inp), device=dev, dtype=dtype).normal_(0.0, 0.02)  # as frozen(): the same stream
            q, sc = quantize(w, bits)
            del w
            self.register_buffer("qweight", q)
            self.register_buffer("qscale", sc)
            self.weight = None
        else:
            self.weight = frozen((out, inp), dev, dtype, std=0.02)
        self.bias = frozen((out,), dev, dtype, fill=0.0) if bias else None
        self.r = r
        if r > 0:
            self.lora_A = nn.Parameter(torch.empty(r, inp, device=dev, dtype=torch.float32))
            self.lora_B = nn.Parameter(torch.zeros(out, r, device=dev, dtype=torch.float32))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.scaling = alpha / r
            if self.dora:  # peft's lora_magnitude_vector: the base's row norms (B = 0)
                base = self.weight if self.weight is not None else self.dequantized(dtype)
                self.magnitude = nn.Parameter(base.float().norm(dim=1))

    def dequantized(self, dtype):
        return dequantize(self.qweight, self.qscale, self.bits, dtype)

    def forward(self, x):
        if self.bits:
            y = (_quant_linear_eager if self.eager else _quant_linear)(
                x, self.qweight, self.qscale, self.bias, self.bits, self.cdtype)
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.r > 0 and self.dora:
            # peft >= 0.12's DoraLinearLayer without dropout: the base result reused, the norm of
            # W + s B A detached, (c - 1) base + c s B A x added
            lora = F.linear(F.linear(self.drop(x), self.lora_A), self.lora_B)
            with torch.no_grad():
                w = self.weight if self.weight is not None else self.dequantized(self.cdtype)
                norm = (w.float() + self.scaling * (self.lora_B @ self.lora_A)).norm(dim=1)
            c = self.magnitude / norm
            base = y - self.bias if self.bias is not None else y
            return (y + (c - 1) * base + c * lora * self.scaling).to(y.dtype)  # peft's result.to(torch_result_dtype)
        if self.r > 0:
            y = y + F.linear(F.linear(self.drop(x), self.lora_A), self.lora_B) * self.scaling
        return y


class FrozenLN(nn.Module):
    def __init__(self, n, dev, dtype):
        super().__init__()
        self.weight = frozen((n,), dev, dtype, fill=1.0)
        self.bias = frozen((n,), dev, dtype, fill=0.0)

    def forward(self, x):
        w, b = self.weight, self.bias
        if w.dtype != x.dtype and not x.is_cuda:  # --freeze's fp32 norms: CPU autocast leaves layer_norm alone
            w, b = w.to(x.dtype), b.to(x.dtype)
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


class Block(nn.Module):
    """pytorch_baseline.Block with LoRA-capable linears (the same forward). With pkv (P-Tuning v2,
    this layer's [P, 2, NH, HD] slice of the prefix embedding, fp32) the P prefix keys and values
    go in front of the rotated keys and values of every row, after prefix dropout (per batch row,
    training only); the mask then has P + T columns."""

    def __init__(self, dev, dtype, r, alpha, dropout, targets, bits=0, eager=False, prefix_dropout=0.0, dora=False):
        super().__init__()
        H, FF = PB.H, PB.FF
        self.prefix_dropout = prefix_dropout

        def lin(name, i, o):
            return LoraLinear(i, o, dev, dtype, r if name in targets else 0, alpha, dropout, bits=bits, eager=eager, dora=dora)

        self.ln1 = FrozenLN(H, dev, dtype)
        self.qkv = lin("qkv", H, 3 * H)
        self.dense = lin("dense", H, H)
        self.ln2 = FrozenLN(H, dev, dtype)
        self.fc1 = lin("fc1", H, FF)
        self.fc2 = lin("fc2", FF, H)

    def forward(self, h, mask, cos1, sin1, cos2, sin2, pkv=None, pmask=None):
        B, T, _ = h.shape
        H, NH, HD = PB.H, PB.NH, PB.HD
        x = self.ln1(h)
        qkv = self.qkv(x).view(B, T, NH, 3, HD)
        q, k, v = qkv.unbind(3)
        q = PB.apply_rope(q, cos1, sin1, cos2, sin2)
        k = PB.apply_rope(k, cos1, sin1, cos2, sin2)
        if pkv is not None:  # P-Tuning v2: [P, 2, NH, HD] -> B rows of P keys and values, not rotated
            P = pkv.shape[0]
            pkv = pkv.to(k.dtype)[None].expand(B, P, 2, NH, HD)  # cast the [P, 2H] slice once, then rows
            if pmask is not None:  # THUDM's prefix dropout, per row: the keep mask / (1 - p), drawn outside
                pkv = (pkv * pmask).to(k.dtype)  # the compiled block (dropout inside it did not act under torch.compile)
            pk, pv = pkv.unbind(2)
            k = torch.cat((pk, k), dim=1)
            v = torch.cat((pv, v), dim=1)
        a = SDPA(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        h1 = PB.ALPHA * x + self.dense(a.transpose(1, 2).reshape(B, T, H))
        y = self.ln2(h1)
        return PB.ALPHA * y + self.fc2(F.gelu(self.fc1(y), approximate="tanh"))


class GLMLora(nn.Module):
    """The frozen base with LoRA adapters (r > 0) or, with pre_seq_len P > 0, THUDM's P-Tuning v2
    prefix encoder without prefix_projection: a trainable fp32 embedding [P, 2 L H], N(0, 1) as
    nn.Embedding, layer l's keys at slot 2l and values at 2l + 1 (each [P, NH, HD]); made after the
    base so the base's random stream is the LoRA runs'."""

    def __init__(self, layers, dev, dtype, r, alpha, dropout, targets, bits=0, eager=False,
                 pre_seq_len=0, prefix_dropout=0.1, dora=False):
        super().__init__()
        assert not (r > 0 and pre_seq_len > 0), "LoRA and P-Tuning exclude each other"
        self.wte = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.blocks = nn.ModuleList(Block(dev, dtype, r, alpha, dropout, targets, bits, eager, prefix_dropout, dora)
                                    for _ in range(layers))
        self.lnf = FrozenLN(PB.H, dev, dtype)
        self.head = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.ckpt = False
        self.pre_seq_len = pre_seq_len
        self.prefix_embedding = None
        if pre_seq_len > 0:
            self.prefix_embedding = nn.Parameter(
                torch.empty(pre_seq_len, 2 * layers * PB.H, device=dev, dtype=torch.float32).normal_(0.0, 1.0))

    def prefix_kv(self):
        """Per layer its [P, 2, NH, HD] view of the prefix embedding (keys, values): one split, whose
        backward is one concatenation of the layers' gradients into the embedding's."""
        if self.prefix_embedding is None:
            return [None] * len(self.blocks)
        P, L = self.pre_seq_len, len(self.blocks)
        return self.prefix_embedding.view(P, 2 * L, PB.NH, PB.HD).split(2, dim=1)

    def prefix_mask(self, mask):
        """The GLM prefix mask [B, 1, T, T] with P always-visible columns in front: [B, 1, T, P + T]."""
        if self.prefix_embedding is None:
            return mask
        B, _, T, _ = mask.shape
        return torch.cat((mask.new_ones(B, 1, T, self.pre_seq_len), mask), dim=-1)

    def hidden(self, ids, pos, bpos, mask):
        h = F.embedding(ids, self.wte)
        cos1, sin1 = PB.rotary_tables(pos, PB.HD // 2)
        cos2, sin2 = PB.rotary_tables(bpos, PB.HD // 2)
        mask = self.prefix_mask(mask)
        p = self.blocks[0].prefix_dropout if len(self.blocks) else 0.0
        for blk, pkv in zip(self.blocks, self.prefix_kv()):
            pmask = None
            if pkv is not None and self.training and p > 0:  # eager, so compile cannot drop it
                B = ids.shape[0]
                keep = torch.rand((B,) + tuple(pkv.shape), device=h.device) >= p
                pmask = keep.to(h.dtype if h.dtype != torch.float32 else torch.float32) / (1.0 - p)
            if self.ckpt:
                h = checkpoint(blk, h, mask, cos1, sin1, cos2, sin2, pkv, pmask, use_reentrant=False)
            else:
                h = blk(h, mask, cos1, sin1, cos2, sin2, pkv, pmask)
        return self.lnf(h)

    def forward(self, ids, pos, bpos, mask, sup_idx, sup_tgt):
        h = self.hidden(ids, pos, bpos, mask).reshape(-1, PB.H)[sup_idx]
        logits = F.linear(h, self.head)
        return F.cross_entropy(logits.float(), sup_tgt)


def make_batch(B, T, dev, tiny):
    batch = PB.make_batch(B, T, "cpu")
    if tiny:
        batch[0], batch[5] = batch[0] % PB.V, batch[5] % PB.V
    return [t.to(dev) for t in batch]


def model_sizes(model):
    """N for the MFU formula (every base weight by its elements, quantized ones too) and the bytes
    of the frozen base as stored."""
    n = sum(p.numel() for p in model.parameters())
    n += sum(m.n_base for m in model.modules() if isinstance(m, LoraLinear) and m.bits)
    base = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    base += sum(b.numel() * b.element_size() for b in model.buffers())
    return n, base


def kernel_kind(name):
    """A CUDA kernel's category for --profile: the products, attention, or the rest."""
    n = name.lower()  # attention first: cuDNN's attention kernels' names hold "sm90_" too
    if any(k in n for k in ("fmha", "attention", "flash", "sdpa", "dot_do_o", "convert_dq")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")):
        return "products"
    return "other"


def profile_step(step, sync):
    """--profile: one more step under torch.profiler; prints the CUDA kernels by total time and
    the sums by category, to set beside bench_train --detail."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync()
    rows, kinds = [], {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = e.cuda_time_total
        if us <= 0:
            continue
        rows.append((us, e.count, e.key))
        kinds[kernel_kind(e.key)] = kinds.get(kernel_kind(e.key), 0.0) + us
    rows.sort(reverse=True)
    print(f"  profile: one step, CUDA kernels {sum(r[0] for r in rows) / 1e3:.2f} ms; " +
          ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])), flush=True)
    for us, n, key in rows[:40]:
        print(f"    {us / 1e3:9.3f} ms {n:5d}x  {key[:110]}", flush=True)


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
    bits = QBITS[a.base_quant]
    model = GLMLora(a.layers, dev, dtype, a.lora, alpha, a.lora_dropout, targets, bits, a.quant_eager,
                    a.ptuning, a.prefix_dropout, a.dora)
    model.ckpt = ck
    if a.freeze:  # LLaMA-Factory's freeze: every tensor of the last N layers trains, upcast to fp32
        for blk in model.blocks[-a.freeze:]:
            for mod in blk.modules():
                for name, p in list(mod.named_parameters(recurse=False)):
                    setattr(mod, name, nn.Parameter(p.detach().float(), requires_grad=True))
    if not a.no_compile:
        for blk in model.blocks:
            blk.compile()
    train = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(train, lr=1e-4, weight_decay=0.01, **({"fused": True} if cuda else {}))
    n_all, base_bytes = model_sizes(model)
    n_train = sum(p.numel() for p in train)
    batch = make_batch(B, T, dev, a.tiny)

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
    in_order = [round(t * 1e3, 2) for t in times]  # the steps as they ran (the GPU's clock moves between them)
    times.sort()
    med = times[len(times) // 2]
    tok = B * T / med
    flops_tok = 4 * n_all + 12 * a.layers * PB.H * T
    mfu = tok * flops_tok / 989e12
    # the fine-tuning kind as bench_train names it (its "ft" field and label suffix)
    ft = (f"ptuning{a.ptuning}" if a.ptuning else f"freeze{a.freeze}" if a.freeze
          else f"{'dora' if a.dora else 'lora'}{a.lora}{'' if a.lora_target == 'qkv' else a.lora_target}")
    if a.ptuning:
        assert n_train == a.ptuning * 2 * a.layers * PB.H, n_train
    if a.profile and cuda:
        profile_step(step, sync)
    res = dict(impl="pytorch-lora", run=f"{T}x{B}{'+ckpt' if ck else ''}+{ft}{'+' + a.base_quant if bits else ''}",
               seq=T, batch=B, ckpt=int(ck), ft=ft, lora_rank=a.lora,
               lora_target=None if a.ptuning or a.freeze else a.lora_target, freeze=a.freeze, pre_seq_len=a.ptuning,
               prefix_dropout=a.prefix_dropout if a.ptuning else None, base_quant=a.base_quant,
               quant_eager=bool(bits and a.quant_eager), compile=not a.no_compile, step_ms=med * 1e3, step_ms_all=in_order,
               tok_s=tok, mfu=mfu, flops_per_token=flops_tok, first_step_s=first, loss=float(loss),
               n_params=n_all, n_trainable=n_train, base_gib=base_bytes / 2**30, tiny=a.tiny, layers=a.layers)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        res.update(peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30,
                   peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                   device_used_gib=(total - free) / 2**30, torch=torch.__version__)
    return res


def _close(name, got, ref, tol, rel=False):
    """max |got - ref| < tol (rel: tol times max |ref|); prints the figure, raises if not."""
    d = (got.float() - ref.float()).abs().max().item() if got.numel() else 0.0
    lim = tol * max(ref.float().abs().max().item(), 1e-30) if rel else tol
    print(f"  {name}: max abs diff {d:.3g} (limit {lim:.3g})", flush=True)
    if not d < lim:
        raise AssertionError(f"selfcheck {name}: max abs diff {d:.3g} >= {lim:.3g}")


def ptuning_reference(m, ids, pos, bpos, mask, sup_idx, sup_tgt):
    """P-Tuning v2 written out for --selfcheck (fp32, prefix dropout 0): a per-layer loop over the
    frozen weights, layer l's prefix keys / values sliced from the embedding's columns
    [2l H, (2l+1) H) / [(2l+1) H, (2l+2) H), torch.cat in front of the rotated keys / values, a
    plain softmax attention over P + T keys with the GLM mask extended by P visible columns.
    Returns the final hidden states and the loss."""
    B, T = ids.shape
    H, NH, HD, P = PB.H, PB.NH, PB.HD, m.pre_seq_len
    E = m.prefix_embedding

    def ln(x, mod):
        return F.layer_norm(x, (H,), mod.weight, mod.bias, 1e-5)

    def lin(x, mod):
        assert mod.r == 0 and not mod.bits
        return x @ mod.weight.t() + mod.bias

    allowed = torch.zeros(B, T, P + T, dtype=torch.bool, device=ids.device)
    allowed[:, :, :P] = True  # every query sees every prefix key
    allowed[:, :, P:] = mask[:, 0]  # then its own GLM-mask keys
    cos1, sin1 = PB.rotary_tables(pos, HD // 2)
    cos2, sin2 = PB.rotary_tables(bpos, HD // 2)
    h = m.wte[ids]
    for l, blk in enumerate(m.blocks):
        x = ln(h, blk.ln1)
        qkv = lin(x, blk.qkv).view(B, T, NH, 3, HD)
        q = PB.apply_rope(qkv[:, :, :, 0], cos1, sin1, cos2, sin2)
        k = PB.apply_rope(qkv[:, :, :, 1], cos1, sin1, cos2, sin2)
        v = qkv[:, :, :, 2]
        pk = E[:, 2 * l * H:(2 * l + 1) * H].reshape(P, NH, HD)
        pv = E[:, (2 * l + 1) * H:(2 * l + 2) * H].reshape(P, NH, HD)
        kk = torch.cat([pk.unsqueeze(0).expand(B, P, NH, HD), k], dim=1)  # [B, P + T, NH, HD]
        vv = torch.cat([pv.unsqueeze(0).expand(B, P, NH, HD), v], dim=1)
        sc = torch.einsum("bqnd,bknd->bnqk", q, kk) / math.sqrt(HD)
        sc = sc.masked_fill(~allowed[:, None], float("-inf"))
        att = torch.einsum("bnqk,bknd->bqnd", sc.softmax(dim=-1), vv).reshape(B, T, H)
        h1 = PB.ALPHA * x + lin(att, blk.dense)
        y = ln(h1, blk.ln2)
        h = PB.ALPHA * y + lin(F.gelu(lin(y, blk.fc1), approximate="tanh"), blk.fc2)
    hid = ln(h, m.lnf)
    logits = hid.reshape(-1, H)[sup_idx] @ m.head.t()
    return hid, F.cross_entropy(logits, sup_tgt)


def selfcheck_ptuning(a, dev):
    """--selfcheck, P-Tuning v2: the model (eager, and compiled without --no-compile; with and
    without checkpointing) against ptuning_reference, fp32, prefix dropout 0: hidden states and
    loss to 1e-4, the prefix gradient (finite, non-zero in every layer's key and value slots)
    against the reference's; then prefix dropout 0.1: training changes the loss, eval does not."""
    B, T, layers, P = 2, 16, min(a.layers, 2), a.ptuning or 8
    H = PB.H
    batch = make_batch(B, T, dev, a.tiny)

    def build(pdrop):
        torch.manual_seed(0)
        m = GLMLora(layers, dev, torch.float32, 0, 0.0, 0.0, (), 0, False, P, pdrop)
        with torch.no_grad():  # sharper attention than std 0.02 gives at H 64, so the prefix keys matter
            for blk in m.blocks:
                blk.qkv.weight.mul_(8.0)
        return m

    mr = build(0.0)
    train = [p_ for p_ in mr.parameters() if p_.requires_grad]
    assert len(train) == 1 and train[0] is mr.prefix_embedding and train[0].numel() == P * 2 * layers * H
    assert not any(isinstance(mod, LoraLinear) and mod.r for mod in mr.modules()), "LoRA adapters with --ptuning"
    hr, lr = ptuning_reference(mr, *batch)
    gr, = torch.autograd.grad(lr, mr.prefix_embedding)
    hr, lr = hr.detach(), lr.detach()
    assert torch.isfinite(gr).all(), "reference prefix gradient not finite"
    print(f"  P-Tuning P={P}: 1 trainable tensor [{P}, {2 * layers * H}] = {P * 2 * layers * H} = P*2*L*H; "
          f"reference loss {lr.item():.5f}", flush=True)

    def fwd_bwd(m):
        m.prefix_embedding.grad = None
        with torch.no_grad():
            hid = m.hidden(*batch[:4])
        loss = m(*batch)
        loss.backward()
        return hid, loss.detach(), m.prefix_embedding.grad

    variants = [("eager", build(0.0), False), ("eager + checkpointing", build(0.0), True)]
    if not a.no_compile:
        mc = build(0.0)
        for blk in mc.blocks:
            blk.compile()
        variants.append(("compiled", mc, False))
    for tag, m, ck in variants:
        m.ckpt = ck
        print(f"  P-Tuning {tag} vs the reference loop:", flush=True)
        hq, lq, gq = fwd_bwd(m)
        rel = tag == "compiled"  # inductor's fp32 kernels round differently from eager's
        _close("hidden", hq, hr, 1e-4, rel)
        _close("loss", lq, lr, 1e-4, rel)
        assert gq is not None and torch.isfinite(gq).all(), "prefix gradient not finite"
        slots = gq.view(P, 2 * layers, H).abs().amax(dim=(0, 2))
        assert (slots > 0).all(), f"a layer's prefix key/value gradient is zero: {slots.tolist()}"
        _close("prefix grad (relative)", gq, gr, 1e-4, True)
        print(f"  prefix grad: finite, |g| max {gq.abs().max().item():.3g}, non-zero in all {2 * layers} slots",
              flush=True)
    md = build(0.1)
    l0 = fwd_bwd(md)[1]
    gd = md.prefix_embedding.grad
    assert torch.isfinite(gd).all() and gd.abs().max() > 0, "prefix gradient with dropout"
    md.eval()
    with torch.no_grad():
        le = md(*batch)
    md.train()
    _close("prefix dropout 0.1, eval: loss", le, lr, 1e-4)
    d = abs(l0.item() - lr.item())
    print(f"  prefix dropout 0.1, training: loss {l0.item():.5f} (differs by {d:.3g}), gradient finite", flush=True)
    assert d > 1e-6, "prefix dropout had no effect in training"


def selfcheck(a, dev, cuda):
    """--selfcheck: the quantization and the quantized linears against plain float ones (fp32);
    then P-Tuning v2 against a reference loop (selfcheck_ptuning)."""
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(1)
    # int4 layout: THUDM's nibble order, by a scalar loop; unpack_int4 inverts it
    q = torch.randint(-8, 8, (3, 10), generator=g, dtype=torch.int8)
    p = pack_int4(q)
    for r in range(q.shape[0]):
        for j in range(q.shape[1] // 2):
            byte = ((int(q[r, 2 * j]) & 0xF) << 4) | (int(q[r, 2 * j + 1]) & 0xF)
            assert int(p[r, j]) == (byte - 256 if byte > 127 else byte), (r, j, q[r], p[r])
    assert torch.equal(unpack_int4(p), q)
    allb = torch.arange(-128, 128, dtype=torch.int8).reshape(4, 64)  # every byte
    assert torch.equal(pack_int4(unpack_int4(allb)), allb)
    print("  int4 packing: high nibble = even column, unpack inverts it (all 256 bytes)", flush=True)
    bits_list = [QBITS[a.base_quant]] if a.base_quant != "none" else [8, 4]
    for bits in bits_list:
        maxq = 2 ** (bits - 1) - 1
        w = (torch.randn(96, 64, generator=g) * 0.02).to(dev)
        w[5] = 0.0  # a zero row: scale 0, q 0
        q, sc = quantize(w, bits, rows=40)
        qi = unpack_int4(q) if bits == 4 else q
        assert q.dtype == torch.int8 and q.shape == (96, 64 if bits == 8 else 32) and sc.dtype == torch.float16
        assert int(qi.abs().max()) == maxq and int(qi[5].abs().max()) == 0
        ref_s = (w.abs().amax(dim=1) / maxq).half()
        assert torch.equal(sc, ref_s)
        deq = dequantize(q, sc, bits, torch.float32)
        err = ((w - deq).abs() / sc.float().clamp_min(1e-30)[:, None]).max().item()
        print(f"  int{bits} quantize: max |w - deq| / s = {err:.4f} (<= 0.5)", flush=True)
        assert err <= 0.5 + 1e-3, err

    # a 2-layer fp32 model, quantized, against a float model holding the dequantized weights
    B, T, layers = 2, 16, min(a.layers, 2)
    batch = make_batch(B, T, dev, a.tiny)
    for bits in bits_list:
        def build(b):
            torch.manual_seed(0)
            return GLMLora(layers, dev, torch.float32, 4, 8.0, 0.0, TARGETS["all"], b, a.quant_eager)
        mq, mf = build(bits), build(0)
        with torch.no_grad():
            for pn, pq in mq.named_parameters():
                dict(mf.named_parameters())[pn].copy_(pq)
            for (nq, lq), (nf, lf) in zip(mq.named_modules(), mf.named_modules()):
                if isinstance(lq, LoraLinear):
                    assert nq == nf and lq.bits == bits and lf.weight is not None
                    lf.weight.copy_(lq.dequantized(torch.float32))
                    if lq.r:  # B = 0 would leave A's gradient zero
                        lq.lora_B.normal_(0.0, 0.05)
                        lf.lora_B.copy_(lq.lora_B)
        nq_all, bq = model_sizes(mq)
        nf_all, bf = model_sizes(mf)
        assert nq_all == nf_all, (nq_all, nf_all)
        print(f"  int{bits} model: N {nq_all} as the float model's; base storage {bq} B vs {bf} B fp32", flush=True)

        def fwd_bwd(m):
            for p_ in m.parameters():
                p_.grad = None
            hid = m.hidden(*batch[:4])
            loss = m(*batch)
            loss.backward()
            return hid.detach(), loss.detach(), {n: p_.grad for n, p_ in m.named_parameters() if p_.requires_grad}

        hf, lf_, gf = fwd_bwd(mf)
        variants = [("eager", mq)]
        if not a.no_compile:
            mc = build(bits)
            mc.load_state_dict(mq.state_dict())
            for blk in mc.blocks:
                blk.compile()
            variants.append(("compiled" + (" (--quant_eager)" if a.quant_eager else ""), mc))
        for tag, m in variants:
            print(f"  int{bits} {tag} vs float model with the dequantized weights:", flush=True)
            hq, lq_, gq = fwd_bwd(m)
            rel = tag != "eager"  # inductor's fp32 kernels round differently from eager's
            _close("hidden", hq, hf, 1e-4, rel)
            _close("loss", lq_, lf_, 1e-4, rel)
            assert gq.keys() == gf.keys() and len(gq) == 4 * layers * 2
            worst = max(gf, key=lambda n: ((gq[n] - gf[n]).abs().max() / gf[n].abs().max().clamp_min(1e-30)).item())
            assert all(gf[n].abs().max() > 0 for n in gf), "a LoRA gradient is zero"
            _close(f"LoRA grads ({len(gf)}; worst {worst}, relative)", gq[worst], gf[worst], 1e-4, True)
        if not a.no_compile:
            # the compiled dequantize bit for bit (the int4 shifts must stay int8 arithmetic)
            qq = torch.randint(-128, 128, (256, 64), generator=g, dtype=torch.int8).to(dev)
            ss = (torch.rand(256, generator=g) * 0.01 + 1e-4).half().to(dev)
            fn = torch.compile(dequantize)
            for dt in (torch.float32, torch.bfloat16):
                got, ref = fn(qq, ss, bits, dt), dequantize(qq, ss, bits, dt)
                if dt == torch.float32:
                    assert torch.equal(got, ref), f"compiled dequantize int{bits} differs from eager"
                else:  # inductor may round q * s once in fp32 where eager rounds s to bf16 first
                    _close(f"compiled dequantize int{bits} bf16", got, ref, 1e-2, True)
            print(f"  int{bits} compiled dequantize: fp32 bit-identical to eager", flush=True)
        del mq, mf
    selfcheck_ptuning(a, dev)
    print(f"SELFCHECK ok (base_quant {','.join(f'int{b}' for b in bits_list)}, P-Tuning P={a.ptuning or 8}, {layers} layers, "
          f"{'compiled and eager' if not a.no_compile else 'eager'}, {dev.type})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="512x8", help="comma-separated TxB[c] (c: activation checkpointing)")
    ap.add_argument("--lora", type=int, default=None, help="rank r (default 8; not with --ptuning)")
    ap.add_argument("--lora_target", default="qkv", choices=sorted(TARGETS))
    ap.add_argument("--lora_alpha", type=float, default=0.0, help="default 2r")
    ap.add_argument("--lora_dropout", type=float, default=0.05)
    ap.add_argument("--dora", action="store_true", help="DoRA as peft >= 0.12 computes it without dropout (needs --lora_dropout 0: "
                    "glmtrain's DoRA default)")
    ap.add_argument("--ptuning", type=int, default=0, metavar="P",
                    help="P-Tuning v2 (THUDM, no prefix_projection) with pre_seq_len P instead of LoRA")
    ap.add_argument("--freeze", type=int, default=0, metavar="N",
                    help="instead of LoRA: the last N layers train (LLaMA-Factory's freeze mode, fp32 masters)")
    ap.add_argument("--prefix_dropout", type=float, default=0.1, help="P-Tuning's dropout on the prefix keys/values")
    ap.add_argument("--base_quant", default="none", choices=list(QBITS),
                    help="store the four linear weights of every layer int8 / int4 (THUDM's scheme)")
    ap.add_argument("--quant_eager", action="store_true",
                    help="keep the quantized linears out of torch.compile (torch._dynamo.disable)")
    ap.add_argument("--selfcheck", action="store_true",
                    help="check the quantized linears and P-Tuning numerically, then exit")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=PB.L)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one more step under torch.profiler: its kernels by time")
    ap.add_argument("--tiny", action="store_true", help="V 1024, H 64, 4 heads, FFN 256 (CPU smoke test)")
    ap.add_argument("--out", default=None, help="append one JSON record per run")
    a = ap.parse_args()
    if a.ptuning and a.lora is not None:
        ap.error("--ptuning and --lora exclude each other")
    if a.ptuning < 0 or not 0 <= a.prefix_dropout < 1:
        ap.error("--ptuning must be >= 0 and --prefix_dropout in [0, 1)")
    if a.dora and a.lora_dropout > 0:
        ap.error("--dora needs --lora_dropout 0 (peft's reuse of the base result, as glmtrain's DoRA)")
    if a.freeze and (a.ptuning or a.lora is not None or a.base_quant != "none"):
        ap.error("--freeze excludes --lora, --ptuning and --base_quant")
    if not 0 <= a.freeze <= a.layers:
        ap.error("--freeze N needs 0 <= N <= --layers")
    a.lora = 0 if a.ptuning or a.freeze else 8 if a.lora is None else a.lora
    if a.steps < 1 or (not a.ptuning and not a.freeze and a.lora < 1):
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
    peft = (f"P-Tuning v2 pre_seq_len={a.ptuning} prefix dropout={a.prefix_dropout:g} "
            f"({a.ptuning * 2 * a.layers * PB.H} trainable)" if a.ptuning else
            f"freeze: the last {a.freeze} layers train" if a.freeze else
            f"{'DoRA' if a.dora else 'LoRA'} r={a.lora} alpha={alpha:g} dropout={a.lora_dropout:g} on {','.join(targets)}")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name() if cuda else 'CPU'}: {peft}, base "
          f"{'bf16' if a.base_quant == 'none' else a.base_quant + ' (qkv,dense,fc1,fc2)'}"
          f"{' eager' if a.base_quant != 'none' and a.quant_eager and not a.no_compile else ''}", flush=True)
    if a.selfcheck:
        selfcheck(a, dev, cuda)
        return

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
