"""A NumPy/PyTorch reference of bitsandbytes' 8-bit blockwise AdamW (AdamW8bit: Optimizer2State
"adam" with block_wise=True; F.optimizer_update_8bit_blockwise -> kOptimizerStatic8bit2StateBlockwise
with BLOCKSIZE_2STATE 2048), written from its source for tests/py/test_adam8.py:

  * create_dynamic_map(signed, 7, 8) as functional.py computes it (float32 torch.linspace, means,
    python-float scale times the float32 tensor, sorted python floats, torch.tensor float32);
    signed=True is the first moment's map ("dynamic"), signed=False the second's ("udynamic");
  * quantize_2d: the kernel's quantize_2D<SIGNED> (7-step binary search from pivot 127, then the
    midpoint (a + b) * 0.5f comparison, ties to the search's pivot; NaN falls to code 0);
  * step: one optimizer step on a flat tensor in blocks of 2048, in the kernel's order:
        g = g * gnorm_scale
        s1 = qmap1[c1] * absmax1[b];  s1 = s1 * beta1 + (1 - beta1) * g
        s2 = qmap2[c2] * absmax2[b];  s2 = s2 * beta2 + ((1 - beta2) * g) * g
        absmax1[b] = max |s1|, absmax2[b] = max |s2| over the block
        p = p + step_size * (s1 / (sqrt(s2) + correction2 * eps)),
            correction2 = sqrt(1 - beta2^t), step_size = -lr * correction2 / (1 - beta1^t)
        p = p * (1 - lr * weight_decay)            (decoupled decay, after the update)
        c1 = quantize_2d<1>(s1 / absmax1[b]), moved one code toward s1 where the code's sign
             differs from s1's (signbit); c2 = quantize_2d<0>(s2 / absmax2[b])
    All in float32, one IEEE operation at a time (no FMA). Where glmtrain deliberately differs
    from the kernel (src/backend/quant8.h) the reference follows glmtrain, and says so:
    exact division (the kernel's __fdividef), bias corrections given rather than __powf(beta, t),
    a partial block's absmax over its real elements only (the kernel's padding lanes also fold
    in qmap1[128] * absmax1 * beta1), every tensor quantized (bitsandbytes keeps fp32 states
    under min_8bit_size = 4096 elements).

A fresh bitsandbytes state is torch.zeros: codes 0 and absmax 0."""
import numpy as np
import torch

BLOCK = 2048
F32 = np.float32


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes.functional.create_dynamic_map."""
    data = []
    non_sign_bits = total_bits - (1 if signed else 1)
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        boundaries = torch.linspace(0.1, 1, additional_items + 1, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    gap = 256 - len(data)
    for i in range(gap):
        data.append(0)
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


SIGNED = create_dynamic_map(True).numpy()
UNSIGNED = create_dynamic_map(False).numpy()


def quantize_2d(code, x, signed):
    """quantize_2D<SIGNED>(quadrants, code, x) for every element of x (float32): codes uint8.
    (The kernel's quadrants are code[63], code[127], code[191]: the values the first two
    search steps read from code itself.)"""
    x = np.asarray(x, F32)
    pivot = np.full(x.shape, 127, np.int64)
    upper_pivot = np.full(x.shape, 255, np.int64)
    lower_pivot = np.zeros(x.shape, np.int64)
    lower = np.full(x.shape, -1.0 if signed else 0.0, F32)
    upper = np.full(x.shape, 1.0, F32)
    val = code[pivot]
    i = 64
    while i > 0:
        gt = x > val
        lower_pivot = np.where(gt, pivot, lower_pivot)
        lower = np.where(gt, val, lower)
        upper_pivot = np.where(gt, upper_pivot, pivot)
        upper = np.where(gt, upper, val)
        pivot = np.where(gt, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    gt = x > val
    mid_up = (upper + val) * F32(0.5)
    mid_lo = (lower + val) * F32(0.5)
    r = np.where(gt, np.where(x > mid_up, upper_pivot, pivot), np.where(x < mid_lo, lower_pivot, pivot))
    return r.astype(np.uint8)


def encode(code, signed, value, amax):
    """The optimizer's quantization of moments value in blocks of absmax amax (elementwise):
    quantize_2d of value / amax, and for the signed map the sign fix (signbit of the code's value
    against value's; uint8 arithmetic, so 0 - 1 wraps to 255 as in the kernel)."""
    value = np.asarray(value, F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = value / np.asarray(amax, F32)
    c = quantize_2d(code, x, signed)
    if signed:
        fix = np.signbit(code[c]) != np.signbit(value)
        moved = np.where(value > 0, c.astype(np.int64) + 1, c.astype(np.int64) - 1) & 0xFF
        c = np.where(fix, moved, c).astype(np.uint8)
    return c


def block_absmax(x):
    """max |x| per block of 2048 (a partial last block over its elements)."""
    x = np.abs(np.asarray(x, F32))
    nb = (x.size + BLOCK - 1) // BLOCK
    pad = np.zeros(nb * BLOCK, F32)  # zeros: |x| >= 0, so the padding never wins
    pad[:x.size] = x
    return pad.reshape(nb, BLOCK).max(axis=1)


def dequantize(code, q, absmax):
    blk = np.arange(q.size) // BLOCK
    return code[q] * np.asarray(absmax, F32)[blk]


def quantize_state(code, signed, x):
    a = block_absmax(x)
    blk = np.arange(np.asarray(x).size) // BLOCK
    return encode(code, signed, x, a[blk]), a


def decay_mask(bits, flat0, n):
    """Element j decays when bit (flat0 + j) // 64 of the byte string bits is set."""
    k = (flat0 + np.arange(n)) // 64
    b = np.frombuffer(bytes(bits), np.uint8)
    return ((b[k >> 3] >> (k & 7).astype(np.uint8)) & 1).astype(bool)


class State:
    """One tensor's 8-bit state: codes qm, qv (uint8 [n]), absmax am, av (float32 [blocks])."""

    def __init__(self, n, qm=None, qv=None, am=None, av=None):
        nb = (n + BLOCK - 1) // BLOCK
        self.qm = np.zeros(n, np.uint8) if qm is None else np.asarray(qm, np.uint8).copy()
        self.qv = np.zeros(n, np.uint8) if qv is None else np.asarray(qv, np.uint8).copy()
        self.am = np.zeros(nb, F32) if am is None else np.asarray(am, F32).copy()
        self.av = np.zeros(nb, F32) if av is None else np.asarray(av, F32).copy()

    def copy(self):
        return State(self.qm.size, self.qm, self.qv, self.am, self.av)


def step(p, g, st, lr, b1, b2, eps, wd, bc1, bc2, gs, decays, maps=None, variant=None):
    """One step on float32 p [n] (returned, new array) and State st (updated in place); returns
    (p, m, v) with the unquantized moments. decays: bool [n]; bc1 = 1 - b1^t, bc2 = 1 - b2^t
    (float32, as the caller computed them). maps: (signed, unsigned) to use other tables;
    variant: a deliberate error for the negative controls of test_adam8.py."""
    S, U = maps if maps is not None else (SIGNED, UNSIGNED)
    p = np.asarray(p, F32).copy()
    n = p.size
    blk = np.arange(n) // BLOCK
    lr, b1, b2, eps, wd, bc1, bc2, gs = (F32(x) for x in (lr, b1, b2, eps, wd, bc1, bc2, gs))
    g = np.asarray(g, F32) * gs
    m = (S[st.qm] * st.am[blk]) * b1 + (F32(1) - b1) * g
    v = (U[st.qv] * st.av[blk]) * b2 + ((F32(1) - b2) * g) * g
    am, av = block_absmax(m), block_absmax(v)
    c2 = np.sqrt(bc2)
    step_size = (-lr * c2) / bc1
    decay = F32(1) - lr * wd
    if variant == "decay_first":  # PyTorch's AdamW order
        p = np.where(decays, p * decay, p)
    eps_term = eps if variant == "eps_uncorrected" else c2 * eps
    p = p + step_size * (m / (np.sqrt(v) + eps_term))
    if variant != "decay_first":
        p = np.where(decays, p * decay, p)
    if variant == "no_sign_fix":
        st.qm = quantize_2d(S, np.asarray(m / am[blk], F32), True)
    else:
        st.qm = encode(S, True, m, am[blk])
    st.qv = encode(U, False, v, av[blk])
    st.am, st.av = am, av
    return p, m, v


def step_scalar(p, g, qm, qv, am, av, lr, b1, b2, eps, wd, bc1, bc2, gs, decays):
    """The same step one element at a time with numpy float32 scalars and plain Python control
    flow (a second formulation for small n, so the vectorised reference is checked too)."""
    f = F32
    n = len(p)
    nb = (n + BLOCK - 1) // BLOCK
    lr, b1, b2, eps, wd, bc1, bc2, gs = (f(x) for x in (lr, b1, b2, eps, wd, bc1, bc2, gs))
    m = [f(0)] * n
    v = [f(0)] * n
    for j in range(n):
        gj = f(g[j]) * gs
        m[j] = f(SIGNED[qm[j]]) * f(am[j // BLOCK]) * b1 + (f(1) - b1) * gj
        v[j] = f(UNSIGNED[qv[j]]) * f(av[j // BLOCK]) * b2 + (f(1) - b2) * gj * gj
    nam = [f(0)] * nb
    nav = [f(0)] * nb
    for j in range(n):
        nam[j // BLOCK] = max(nam[j // BLOCK], abs(m[j]))
        nav[j // BLOCK] = max(nav[j // BLOCK], abs(v[j]))
    c2 = f(np.sqrt(bc2))
    step_size = (-lr * c2) / bc1
    out = []
    nqm, nqv = [], []
    for j in range(n):
        pj = f(p[j]) + step_size * (m[j] / (f(np.sqrt(v[j])) + c2 * eps))
        if decays[j]:
            pj = pj * (f(1) - lr * wd)
        out.append(pj)
        for vals, code, signed, amax, dst in ((m, SIGNED, True, nam, nqm), (v, UNSIGNED, False, nav, nqv)):
            x = vals[j] / amax[j // BLOCK] if amax[j // BLOCK] != 0 else f(np.nan)
            c = scalar_search(code, signed, x)
            if signed and bool(np.signbit(code[c])) != bool(np.signbit(vals[j])):
                c = (c + 1 if vals[j] > 0 else c - 1) & 0xFF
            dst.append(c)
    return (np.array(out, F32), np.array(nqm, np.uint8), np.array(nqv, np.uint8), np.array(nam, F32),
            np.array(nav, F32))


def scalar_search(code, signed, x):
    """quantize_2D for one float32 value, with branches as the kernel has them."""
    pivot, upper_pivot, lower_pivot = 127, 255, 0
    lower, upper = F32(-1.0 if signed else 0.0), F32(1.0)
    val = code[pivot]
    i = 64
    while i > 0:
        if x > val:
            lower_pivot, lower, pivot = pivot, val, pivot + i
        else:
            upper_pivot, upper, pivot = pivot, val, pivot - i
        val = code[pivot]
        i >>= 1
    if x > val:
        return upper_pivot if x > (upper + val) * F32(0.5) else pivot
    return lower_pivot if x < (lower + val) * F32(0.5) else pivot
