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

  python3 bench/pytorch_lora.py --runs 512x8,2048x2,512x4c --lora 8 [--lora_target qkv|all]
      [--base_quant none|int8|int4 [--quant_eager]] [--steps 6] [--warmup 3] [--layers 28]
      [--no-compile] [--out FILE] [--selfcheck]
CPU smoke test (torch without compile or SDPA: --no-compile, tiny shapes):
  python3 bench/pytorch_lora.py --tiny --layers 2 --runs 64x2,64x2c --no-compile --steps 2 --warmup 1 \
      [--base_quant int4]
  python3 bench/pytorch_lora.py --tiny --no-compile --selfcheck
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

    def __init__(self, inp, out, dev, dtype, r=0, alpha=16.0, dropout=0.05, bias=True, bits=0, eager=False):
        super().__init__()
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

    def dequantized(self, dtype):
        return dequantize(self.qweight, self.qscale, self.bits, dtype)

    def forward(self, x):
        if self.bits:
            y = (_quant_linear_eager if self.eager else _quant_linear)(
                x, self.qweight, self.qscale, self.bias, self.bits, self.cdtype)
        else:
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

    def __init__(self, dev, dtype, r, alpha, dropout, targets, bits=0, eager=False):
        super().__init__()
        H, FF = PB.H, PB.FF

        def lin(name, i, o):
            return LoraLinear(i, o, dev, dtype, r if name in targets else 0, alpha, dropout, bits=bits, eager=eager)

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
    def __init__(self, layers, dev, dtype, r, alpha, dropout, targets, bits=0, eager=False):
        super().__init__()
        self.wte = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.blocks = nn.ModuleList(Block(dev, dtype, r, alpha, dropout, targets, bits, eager) for _ in range(layers))
        self.lnf = FrozenLN(PB.H, dev, dtype)
        self.head = frozen((PB.V, PB.H), dev, dtype, std=0.02)
        self.ckpt = False

    def hidden(self, ids, pos, bpos, mask):
        h = F.embedding(ids, self.wte)
        cos1, sin1 = PB.rotary_tables(pos, PB.HD // 2)
        cos2, sin2 = PB.rotary_tables(bpos, PB.HD // 2)
        for blk in self.blocks:
            if self.ckpt:
                h = checkpoint(blk, h, mask, cos1, sin1, cos2, sin2, use_reentrant=False)
            else:
                h = blk(h, mask, cos1, sin1, cos2, sin2)
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
    model = GLMLora(a.layers, dev, dtype, a.lora, alpha, a.lora_dropout, targets, bits, a.quant_eager)
    model.ckpt = ck
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
    times.sort()
    med = times[len(times) // 2]
    tok = B * T / med
    flops_tok = 4 * n_all + 12 * a.layers * PB.H * T
    mfu = tok * flops_tok / 989e12
    res = dict(impl="pytorch-lora", run=f"{T}x{B}{'+ckpt' if ck else ''}+lora{a.lora}"
               f"{'' if a.lora_target == 'qkv' else a.lora_target}{'+' + a.base_quant if bits else ''}",
               seq=T, batch=B, ckpt=int(ck), lora_rank=a.lora, lora_target=a.lora_target, base_quant=a.base_quant,
               quant_eager=bool(bits and a.quant_eager), compile=not a.no_compile, step_ms=med * 1e3,
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


def selfcheck(a, dev, cuda):
    """--selfcheck: the quantization and the quantized linears against plain float ones (fp32)."""
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
    print(f"SELFCHECK ok (base_quant {','.join(f'int{b}' for b in bits_list)}, {layers} layers, "
          f"{'compiled and eager' if not a.no_compile else 'eager'}, {dev.type})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="512x8", help="comma-separated TxB[c] (c: activation checkpointing)")
    ap.add_argument("--lora", type=int, default=8, help="rank r")
    ap.add_argument("--lora_target", default="qkv", choices=sorted(TARGETS))
    ap.add_argument("--lora_alpha", type=float, default=0.0, help="default 2r")
    ap.add_argument("--lora_dropout", type=float, default=0.05)
    ap.add_argument("--base_quant", default="none", choices=list(QBITS),
                    help="store the four linear weights of every layer int8 / int4 (THUDM's scheme)")
    ap.add_argument("--quant_eager", action="store_true",
                    help="keep the quantized linears out of torch.compile (torch._dynamo.disable)")
    ap.add_argument("--selfcheck", action="store_true", help="check the quantized linears numerically, then exit")
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
          f"alpha={alpha:g} dropout={a.lora_dropout:g} on {','.join(targets)}, base "
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
