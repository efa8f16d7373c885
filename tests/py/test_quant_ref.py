#!/usr/bin/env python3
"""Issue 17: glmtrain's host quantizers (src/backend/quant.c, through tests/c/tool_quant) against
the PyTorch references of tests/py/quant_ref.py, byte for byte and bit for bit:

  * `tool_quant layout` equals quant_ref.qlayout_of (glm_qlayout_of's offsets) on many shapes;
  * the code tables: C's NF4 values and its signed dynamic map (read back through `tool_quant
    deq` of hand-made bytes) equal bitsandbytes' NF4 list and create_dynamic_map(signed=True)
    computed with torch as bitsandbytes does;
  * INT8, INT4 and NF4 on random matrices (normal, uniform, heavy-tailed with outliers) and
    structured ones (values exactly at .5 quantization boundaries and one fp16 ulp either side,
    float32 values exactly halfway between two fp16,
    fp16 subnormals, a row whose fp16 scale is subnormal so q overflows (clamped, see quant_ref),
    values near the fp16 maximum, constant / single-non-zero / all-negative / all-zero rows;
    for NF4 a block of zeros, values exactly at dQuantizeNF4's thresholds and one ulp either
    side, absmax exactly at the dynamic map's midpoints (dQuantize's ties), every block with the
    same absmax (absmax2 = 0), a partial last block of 256): the bytes `tool_quant quant` writes
    equal quant_ref's laid out by to_layout_bytes, and `tool_quant deq` equals quant_ref's
    dequantization bit for bit;
  * dequantization of random bytes (every nibble, sign extension, random fp16 scales including
    subnormals, random absmax2 / offset) bit for bit;
  * the reference itself against slow independent formulations on small matrices, so this file
    cannot pass by construction: THUDM's formula per element with numpy float16 scalars and
    Python's round; cpm_kernels' packing per byte; NF4 codes as the nearest code value (float64)
    away from ties; the double quantization's offset by math.fsum and its codes as the nearest
    dynamic-map value away from ties; dequantization with numpy float32 scalars.

Prints PASS/FAIL/SKIP lines (tests/run.sh counts them). Needs $GLM_BUILD/tests/tool_quant,
torch and numpy; SKIP when they are missing."""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

TOOL = harness.tool("tool_quant")
c = harness.Checks()
KINDS = ("int8", "int4", "nf4")


def run_tool(*args):
    p = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, errors="replace", timeout=120)
    if p.returncode != 0:
        raise RuntimeError("tool_quant %s failed (%d): %s" % (" ".join(map(str, args)), p.returncode, p.stderr[-400:]))
    return p.stdout


class Tool:
    """tool_quant on files in a temporary folder."""

    def __init__(self, d):
        self.d = d

    def quant(self, kind, w):
        import numpy as np
        OC, C = w.shape
        src, dst = os.path.join(self.d, "w.f32"), os.path.join(self.d, "q.bin")
        np.ascontiguousarray(w.detach().numpy(), dtype="<f4").tofile(src)
        run_tool("quant", kind, OC, C, src, dst)
        with open(dst, "rb") as f:
            return f.read()

    def deq(self, kind, OC, C, data):
        import numpy as np
        src, dst = os.path.join(self.d, "in.bin"), os.path.join(self.d, "out.f32")
        with open(src, "wb") as f:
            f.write(data)
        run_tool("deq", kind, OC, C, src, dst)
        return np.fromfile(dst, dtype="<f4").reshape(OC, C)

    def layout(self, kind, OC, C):
        return json.loads(run_tool("layout", kind, OC, C))


def first_byte_diff(a, b, kind, OC, C):
    """Where two layouts differ first, named by part."""
    import quant_ref as qr
    if len(a) != len(b):
        return "lengths %d vs %d" % (len(a), len(b))
    i = next((k for k in range(len(a)) if a[k] != b[k]), None)
    if i is None:
        return "equal"
    L = qr.qlayout_of(kind, OC, C)
    names = ("q", "qa", "absmax2", "offset") if kind == "nf4" else ("q", "scale")
    parts = sorted((L[p], p) for p in names)
    part = [p for off, p in parts if off <= i][-1]
    ndiff = sum(1 for x, y in zip(a, b) if x != y)
    return "%d bytes differ; first at byte %d (part %s, +%d): C %02x, ref %02x" % (ndiff, i, part, i - L[part], a[i], b[i])


def same_bits(got, want):
    """float32 arrays equal bit for bit (NaN equals NaN)."""
    import numpy as np
    got = np.ascontiguousarray(got, dtype=np.float32).reshape(-1)
    want = np.ascontiguousarray(want, dtype=np.float32).reshape(-1)
    if got.shape != want.shape:
        return False, "shapes %s vs %s" % (got.shape, want.shape)
    eq = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if eq.all():
        return True, ""
    i = int(np.argmin(eq))
    return False, "%d of %d differ; first at %d: C %r (0x%08x), ref %r (0x%08x)" % (
        int((~eq).sum()), eq.size, i, float(got[i]), int(got.view(np.uint32)[i]), float(want[i]), int(want.view(np.uint32)[i]))


# ---------------------------------------------------------------------------------------------
# The matrices

def random_matrices(torch, np):
    rng = np.random.default_rng(17)
    out = {}
    out["normal_37x192"] = torch.from_numpy(rng.standard_normal((37, 192)).astype(np.float32) * 0.02)
    out["uniform_256x64"] = torch.from_numpy(rng.uniform(-1, 1, (256, 64)).astype(np.float32))
    t = rng.standard_t(2.0, (1024, 4096)).astype(np.float32) * 0.02
    outl = rng.random((1024, 4096)) < 1e-3
    t[outl] *= 60.0  # outliers, as LLM weights have
    out["heavy_tailed_1024x4096"] = torch.from_numpy(t)
    return out


OVERFLOW_ROW = {}


def int_structured(torch, np, bits):
    """[R, 64] rows, each one structured case."""
    rng = np.random.default_rng(4 + bits)
    qmax = 2 ** (bits - 1) - 1
    C = 64
    rows = []

    def f16(x):
        return np.asarray(x, np.float32).astype(np.float16)
    # .5 boundaries: scale exactly s (amax = qmax * s, s a power of two), values (k + 0.5) s,
    # which w / s gives exactly: torch.round's half to even decides
    for s in (2.0 ** -7, 2.0 ** -3, 1.0):
        ks = np.arange(-qmax, qmax) + 0.5
        v = np.resize(ks * s, C).astype(np.float32)
        v[0], v[1] = qmax * s, -qmax * s
        rows.append(v)
        # one fp16 ulp either side of every tie
        h = f16(v)
        rows.append(np.nextafter(h, np.float16(np.inf)).astype(np.float32))
        rows[-1][0] = qmax * s
        rows.append(np.nextafter(h, np.float16(-np.inf)).astype(np.float32))
        rows[-1][0] = qmax * s
    # random values whose fp16 quotient lands on k + 0.5 although the fp32 one does not
    # (double rounding): a non-power-of-two scale
    v = rng.uniform(-1, 1, C).astype(np.float32)
    v[0] = 1.0
    rows.append(v)
    # float32 values exactly halfway between two fp16 (the .half() rounding's ties, to even),
    # normal and subnormal
    v = (1.0 + (2 * np.arange(C) + 1) * 2.0 ** -11).astype(np.float32)
    v[::3] *= -1
    rows.append(v)
    rows.append(((2 * np.arange(C) + 1) * 2.0 ** -25 * np.where(np.arange(C) % 2, 1, -1)).astype(np.float32))
    # fp16 subnormals only (amax subnormal), and a mix with values that flush to 0 in fp16
    rows.append((rng.integers(-1023, 1024, C) * 2.0 ** -24).astype(np.float32))
    rows.append((rng.integers(-40, 41, C) * 2.0 ** -24).astype(np.float32))
    v = (rng.uniform(-1, 1, C) * 2.0 ** -26).astype(np.float32)  # all below half the smallest subnormal
    v[5] = 3e-5
    rows.append(v)
    # a row whose max |w| / qmax underflows to an fp16 0 scale: q 0 (THUDM: NaN)
    rows.append(np.full(C, 2.0 ** -25 * (qmax / 2), np.float32))
    # a subnormal scale that makes q overflow: INT8 amax 8416 * 2^-24 -> scale 66 * 2^-24,
    # 8416 / 66 = 127.5 in fp16 -> q 128 (clamped to 127); INT4 amax 10 * 2^-24 -> scale 1 * 2^-24, q 10 (7)
    over = (8416 if bits == 8 else 10) * 2.0 ** -24
    OVERFLOW_ROW[bits] = len(rows)
    v = (rng.uniform(-1, 1, C) * over * 0.5).astype(np.float32)
    v[3] = over
    v[4] = -over
    rows.append(v)
    # near the fp16 maximum (65504; a float32 just below 65520 still rounds to it)
    v = rng.uniform(-65504, 65504, C).astype(np.float32)
    v[0], v[1], v[2] = 65504.0, -65504.0, 65519.0
    rows.append(v)
    v = rng.uniform(60000, 65504, C).astype(np.float32)
    rows.append(v)
    # constant, single non-zero, all negative, all zero
    rows.append(np.full(C, 0.3, np.float32))
    rows.append(np.full(C, -7.25, np.float32))
    v = np.zeros(C, np.float32)
    v[17] = -0.05
    rows.append(v)
    v = np.zeros(C, np.float32)
    v[C - 1] = 1234.5
    rows.append(v)
    rows.append(-np.abs(rng.standard_normal(C)).astype(np.float32))
    rows.append(np.zeros(C, np.float32))
    rows.append(np.float32(-0.0) * np.ones(C, np.float32))
    return torch.from_numpy(np.stack(rows))


def nf4_structured(torch, np):
    """{name: [R, 64] matrix}: with C = 64 every row is one NF4 block."""
    import quant_ref as qr
    rng = np.random.default_rng(44)
    out = {}
    t = qr.NF4_THRESHOLDS.numpy()
    blocks = []
    for a in (1.0, 2.0, 0.5, 3.0):  # x * (1 / a) is x / a exactly for powers of two
        v = np.concatenate([[a, -a, 0.0], t * a, np.nextafter(t * a, np.float32(np.inf)), np.nextafter(t * a, np.float32(-np.inf))])
        v = np.concatenate([v, rng.uniform(-a, a, 64 - v.size)]).astype(np.float32)
        blocks.append(v)
    blocks.append(np.zeros(64, np.float32))                    # a zero block: NaN -> code 0
    blocks.append(np.full(64, 0.7, np.float32))                 # constant
    blocks.append(np.full(64, -2.5, np.float32))
    v = np.zeros(64, np.float32)
    v[9] = -0.125
    blocks.append(v)                                            # single non-zero
    blocks.append(-np.abs(rng.standard_normal(64)).astype(np.float32))  # all negative
    v = rng.standard_normal(64).astype(np.float32) * 1e-3
    v[0] = 40.0
    blocks.append(v)                                            # an outlier
    blocks += [rng.standard_normal(64).astype(np.float32) * s for s in (1e-6, 1e-2, 1.0, 1e3)]
    out["structured_blocks"] = torch.from_numpy(np.stack(blocks))
    # dQuantize's ties: block absmax a_b = 1 + d_b with d_b the dynamic map's midpoints that are
    # multiples of 2^-23 (then 1 + d is exact), their negatives, d = +-1 (absmax2 = 1) and 0
    # pads: the mean is exactly 1, a - offset = d and (a - offset) * (1 / absmax2) = d exactly
    dyn = qr.DYN_CODE.numpy()
    mids = ((dyn[1:] + dyn[:-1]) * np.float32(0.5)).astype(np.float32)
    mids = mids[(mids.astype(np.float64) * 2 ** 23) == np.round(mids.astype(np.float64) * 2 ** 23)]
    e = np.float32(2.0 ** -23)
    g1 = np.concatenate([[1.0, -1.0], mids, -mids])
    g1 = np.concatenate([g1, np.zeros(256 - g1.size)])
    near = np.concatenate([mids + e, mids - e])
    near = near[np.abs(near) < 1]
    g2 = np.concatenate([[1.0, -1.0], near, -near])
    g2 = np.concatenate([g2, np.zeros(256 - g2.size)]) if g2.size <= 256 else g2[:256]
    d = np.concatenate([g1, g2]).astype(np.float32)
    a = (np.float32(1.0) + d).astype(np.float32)
    assert np.all(a - np.float32(1.0) == d)
    body = rng.uniform(-1, 1, (a.size, 64)).astype(np.float32) * a[:, None]
    body[:, 0] = a
    out["dyn_midpoint_ties"] = torch.from_numpy(body.astype(np.float32))
    # every block the same absmax: absmax2 = 0, (a - offset) * inf = NaN -> qa 0
    v = rng.uniform(-1, 1, (8, 64)).astype(np.float32)
    v[:, 5] = 1.5
    out["equal_absmax"] = torch.from_numpy(v)
    return out


# ---------------------------------------------------------------------------------------------
# Independent slow formulations (small matrices)

def slow_thudm(np, w, bits):
    """q [OC, C] int and scale (fp16 bits) per element: numpy float16 scalars, Python's round;
    None where the reference documents its own choice (scale 0: q 0; overflow: clamped to qmax)."""
    qmax = 2 ** (bits - 1) - 1
    Q, S = [], []
    for row in w.tolist():
        h = [np.float16(np.float32(x)) for x in row]
        amax = max(abs(float(x)) for x in h)
        s = np.float16(np.float32(amax) / np.float32(qmax))
        qs = []
        for x in h:
            if float(s) == 0:
                qs.append(0)
                continue
            r = round(float(np.float16(np.float32(x) / np.float32(s))))  # round half to even
            qmax_ = 127 if bits == 8 else 7
            qs.append(max(-qmax_, min(qmax_, r)))
        Q.append(qs)
        S.append(int(np.array(s, np.float16).view(np.uint16)))
    return Q, S


def slow_pack_int4(q_rows):
    """cpm_kernels' int4WeightCompression per byte: (in[2i] << 4) | (in[2i+1] & 0x0f)."""
    out = []
    for r in q_rows:
        out.append([(((r[2 * i] << 4) | (r[2 * i + 1] & 0x0F)) & 0xFF) for i in range(len(r) // 2)])
    return out


def check_reference_independent(torch, np):
    import quant_ref as qr
    rng = np.random.default_rng(99)
    # THUDM's formula per element, and the packing per byte
    for bits in (8, 4):
        w = torch.cat([int_structured(torch, np, bits),
                       torch.from_numpy(rng.standard_normal((12, 64)).astype(np.float32) * 0.05)])
        q, scale = qr.thudm_quantize(w, bits)
        Q, S = slow_thudm(np, w.numpy(), bits)
        got_s = scale.view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist()
        qu = (qr.thudm_unpack_int4(q) if bits == 4 else q).to(torch.int32).tolist()
        bad = [(r, j) for r in range(len(Q)) for j in range(len(Q[r])) if Q[r][j] != qu[r][j]]
        c.check("ref_int%d_equals_scalar_thudm_formula" % bits, got_s == S and not bad,
                "scales differ in rows %s; q differ at %s" % ([r for r in range(len(S)) if S[r] != got_s[r]][:5], bad[:5]))
        if bits == 4:
            want = slow_pack_int4([[x for x in r] for r in Q])
            got = q.view(torch.uint8).to(torch.int32).tolist()
            c.check("ref_int4_packing_equals_cpm_kernels", got == want, "first rows %s vs %s" % (got[:1], want[:1]))
        # dequantization with numpy float32 scalars
        deq = qr.thudm_dequantize(q, scale, bits).numpy()
        slow = np.array([[np.float32(Q[r][j]) * np.float32(np.float16(np.uint16(S[r]).view(np.float16)))
                          for j in range(len(Q[r]))] for r in range(len(Q))], np.float32)
        ok, why = same_bits(deq, slow)
        c.check("ref_int%d_dequant_equals_scalar" % bits, ok, why)

    # NF4: nearest code value away from ties, per element in float64
    w = torch.cat([nf4_structured(torch, np)["structured_blocks"],
                   torch.from_numpy(rng.standard_normal((24, 64)).astype(np.float32))]).reshape(-1)
    codes, qa, absmax2, offset = qr.nf4_quantize(w)
    flat = torch.stack((codes.to(torch.int32) >> 4, codes.to(torch.int32) & 15), -1).reshape(-1).tolist()
    code64 = [float(x) for x in qr.NF4_CODE.tolist()]
    thr = [(code64[i] + code64[i + 1]) / 2 for i in range(15)]
    wl = w.tolist()
    bad, compared = [], 0
    for b in range(len(wl) // 64):
        blk = wl[b * 64:(b + 1) * 64]
        a = max(abs(x) for x in blk)
        for j, x in enumerate(blk):
            if a == 0:
                want = 0  # a NaN in bitsandbytes' tree
            else:
                xn = x / a
                if min(abs(xn - t) for t in thr) < 1e-6:
                    continue  # a tie: the float32 tree decides (checked against the C code)
                want = min(range(16), key=lambda k: abs(code64[k] - xn))
            compared += 1
            if flat[b * 64 + j] != want:
                bad.append((b, j, x, flat[b * 64 + j], want))
    c.check("ref_nf4_codes_are_nearest_values", not bad and compared > 0.9 * len(wl),
            "%d of %d compared differ: %s" % (len(bad), compared, bad[:4]))
    # the double quantization: offset = fsum / nb; qa = the nearest dynamic-map value away from ties
    blocks = w.view(-1, 64).abs().amax(1)
    al = blocks.tolist()
    c.check("ref_nf4_offset_is_float64_mean", float(offset) == float(np.float32(math.fsum(al) / len(al))),
            "offset %r, fsum mean %r" % (float(offset), math.fsum(al) / len(al)))
    dyn = [float(x) for x in qr.DYN_CODE.tolist()]
    off32 = np.float32(offset)
    bad, compared = [], 0
    for g in range(0, len(al), 256):
        dg = [float(np.float32(x) - off32) for x in al[g:g + 256]]
        a2 = max(abs(x) for x in dg)
        if float(absmax2[g // 256]) != float(np.float32(a2)):
            bad.append(("absmax2", g // 256, float(absmax2[g // 256]), a2))
        for k, x in enumerate(dg):
            xn = x / a2
            dist = sorted(abs(v - xn) for v in dyn)
            if dist[1] - dist[0] < 1e-6:
                continue
            compared += 1
            want = min(range(256), key=lambda i: abs(dyn[i] - xn))
            if int(qa[g + k]) != want:
                bad.append((g + k, xn, int(qa[g + k]), want))
    c.check("ref_nf4_double_quant_nearest_dyn_values", not bad and compared >= 0.9 * len(al),
            "%d of %d compared differ: %s" % (len(bad), compared, bad[:4]))
    # NF4 dequantization with numpy float32 scalars
    deq = qr.nf4_dequantize(codes, qa, absmax2, offset).numpy()
    qal = qa.tolist()
    slow = np.array([np.float32(code64[flat[i]]) * (np.float32(dyn[qal[i // 64]]) * np.float32(absmax2[i // 64 // 256]) + off32)
                     for i in range(len(flat))], np.float32)
    ok, why = same_bits(deq, slow)
    c.check("ref_nf4_dequant_equals_scalar", ok, why)
    # the code tables: the NF4 thresholds are the float32 midpoints of the code values, the
    # dynamic map is increasing with 0 and 1 and no -1
    # the literals as a C compiler reads them are not all float32(float(literal)) (see f32_of_decimal)
    twice = [i for i, t in enumerate(qr.NF4_THRESHOLD_LITERALS) if float(np.float32(float(t))) != float(qr.NF4_THRESHOLDS[i])]
    print("# NF4 thresholds where float32(float(literal)) is not the C literal's value: %s" % twice)
    c.check("ref_nf4_thresholds_are_midpoints", max(abs(t - float(u)) for t, u in zip(thr, qr.NF4_THRESHOLDS.tolist())) < 1e-7,
            "thresholds %s" % qr.NF4_THRESHOLDS.tolist())
    c.check("ref_dynamic_map_shape", len(dyn) == 256 and all(dyn[i] < dyn[i + 1] for i in range(255)) and dyn[255] == 1.0
            and 0.0 in dyn and dyn[0] > -1.0, "%s ... %s" % (dyn[:3], dyn[-3:]))


# ---------------------------------------------------------------------------------------------
# C against the reference

def check_tables(tool, torch, np):
    """C's NF4 and dynamic-map tables, read back through deq of hand-made NF4 bytes."""
    import quant_ref as qr
    # 16 blocks (the codes 0..15 of NF4 in block b's 64 elements), qa = 255 (dyn 1.0), absmax2 1, offset 0
    OC, C = 4, 256
    L = qr.qlayout_of("nf4", OC, C)
    codes = torch.arange(16, dtype=torch.uint8).repeat_interleave(32)      # bytes: hi = lo = k
    codes = (codes << 4) | codes
    parts = (codes, torch.full((L["nb"],), 255, dtype=torch.uint8), torch.ones(L["nb2"]), torch.tensor(0.0))
    got = tool.deq("nf4", OC, C, qr.to_layout_bytes("nf4", OC, C, parts)).reshape(-1)
    ok, why = same_bits(got[::64], qr.NF4_CODE.numpy())
    c.check("c_nf4_table_is_bitsandbytes", ok, why)
    # 256 blocks: code 15 (1.0) everywhere, qa = b -> dyn[b] * 1 + 0
    OC, C = 256, 64
    L = qr.qlayout_of("nf4", OC, C)
    parts = (torch.full((OC * C // 2,), 0xFF, dtype=torch.uint8), torch.arange(256, dtype=torch.uint8),
             torch.ones(L["nb2"]), torch.tensor(0.0))
    got = tool.deq("nf4", OC, C, qr.to_layout_bytes("nf4", OC, C, parts))
    ok, why = same_bits(got[:, 0], qr.DYN_CODE.numpy())
    c.check("c_dynamic_map_is_create_dynamic_map", ok, why)


def check_layouts(tool):
    import quant_ref as qr
    bad = []
    for kind in KINDS:
        for OC, C in ((1, 64), (37, 192), (256, 64), (3, 2), (4096, 4096), (12288, 4096), (16384, 4096), (4096, 16384),
                      (130528, 4096), (1, 16448), (5, 128), (1000, 64)):
            if kind == "nf4" and (OC * C) % 64:
                continue
            got, want = tool.layout(kind, OC, C), qr.qlayout_of(kind, OC, C)
            if got != want:
                bad.append("%s %dx%d: C %s, ref %s" % (kind, OC, C, got, want))
    c.check("layouts_equal_glm_qlayout_of", not bad, "; ".join(bad[:3]))


def compare_one(tool, kind, name, w):
    import quant_ref as qr
    OC, C = w.shape
    parts = qr.quantize(kind, w)
    want = qr.to_layout_bytes(kind, OC, C, parts)
    got = tool.quant(kind, w)
    c.check("%s_bytes_%s" % (kind, name), got == want, first_byte_diff(got, want, kind, OC, C))
    deq = tool.deq(kind, OC, C, got)
    ok, why = same_bits(deq, qr.dequantize(kind, OC, C, parts if got != want else qr.from_layout_bytes(kind, OC, C, got)).numpy())
    c.check("%s_deq_%s" % (kind, name), ok, why)
    return parts


def check_random_bytes(tool, torch, np):
    """deq of random bytes (every nibble and sign; random fp16 scales, subnormals included)."""
    import quant_ref as qr
    rng = np.random.default_rng(5)
    for kind in KINDS:
        OC, C = 96, 128
        L = qr.qlayout_of(kind, OC, C)
        data = bytearray(rng.integers(0, 256, L["bytes"], dtype=np.uint8).tobytes())
        if kind == "nf4":
            a2 = rng.uniform(0, 2, L["nb2"]).astype("<f4")
            data[L["absmax2"]:L["absmax2"] + 4 * L["nb2"]] = a2.tobytes()
            data[L["offset"]:L["offset"] + 4] = np.float32(rng.uniform(0, 1)).tobytes()
        else:
            s = rng.integers(0, 0x7C00, OC).astype(np.uint16)  # finite, positive, subnormals included
            s[:4] = [0, 1, 0x3FF, 0x7BFF]
            s[4:8] |= 0x8000                                 # and negative ones
            data[L["scale"]:L["scale"] + 2 * OC] = s.astype("<u2").tobytes()
        data = bytes(data)
        got = tool.deq(kind, OC, C, data)
        want = qr.dequantize(kind, OC, C, qr.from_layout_bytes(kind, OC, C, data)).numpy()
        ok, why = same_bits(got, want)
        c.check("%s_deq_random_bytes" % kind, ok, why)


def check_properties(torch, kind, name, w, parts):
    """What the structured cases are for: the edge cases documented in quant_ref hold."""
    import quant_ref as qr
    bits = 8 if kind == "int8" else 4
    q, scale = parts
    qu = (qr.thudm_unpack_int4(q) if bits == 4 else q).to(torch.int32)
    zero_rows = (w == 0).all(dim=1)
    ok = bool((scale[zero_rows].float() == 0).all()) and bool((qu[zero_rows] == 0).all())
    c.check("%s_%s_zero_row_scale_0_q_0" % (kind, name), ok, "zero rows: scales %s" % scale[zero_rows].tolist())


def main():
    try:
        import numpy as np
        import torch
    except ImportError as e:
        c.skip("quant_ref", "torch/numpy missing: %s" % e)
        return
    if not os.path.exists(TOOL):
        c.skip("quant_ref", "%s not built (make tests)" % TOOL)
        return
    import quant_ref as qr
    t0 = time.time()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    check_reference_independent(torch, np)
    with tempfile.TemporaryDirectory(prefix="glm-quant-") as d:
        tool = Tool(d)
        check_layouts(tool)
        check_tables(tool, torch, np)
        check_random_bytes(tool, torch, np)
        mats = random_matrices(torch, np)
        for kind in KINDS:
            for name, w in mats.items():
                compare_one(tool, kind, name, w)
        for bits in (8, 4):
            kind = "int%d" % bits
            w = int_structured(torch, np, bits)
            parts = compare_one(tool, kind, "structured", w)
            check_properties(torch, kind, "structured", w, parts)
            # the row whose subnormal fp16 scale makes q overflow (see quant_ref's doc): its q as
            # stored, for whoever reads the log (clamped: THUDM's .to(int8) would wrap it)
            q = (parts[0] if bits == 8 else qr.thudm_unpack_int4(parts[0])).to(torch.int32)
            r = OVERFLOW_ROW[bits]
            print("# %s: the overflow row (max |w| %.4g, scale %.4g) stores q %s at its +-max" % (
                kind, float(w[r].abs().max()), float(parts[1][r]), q[r, 3:5].tolist()))
        # NF4's structured cases, and its edge cases read back
        for name, w in nf4_structured(torch, np).items():
            parts = compare_one(tool, "nf4", name, w)
            if name == "structured_blocks":
                codes = parts[0]
                c.check("nf4_zero_block_is_code_0", bool((codes[4 * 32:5 * 32] == 0).all()),
                        "zero block's code bytes %s" % codes[4 * 32:5 * 32].tolist()[:8])
            if name == "equal_absmax":
                c.check("nf4_equal_absmax_absmax2_0_qa_0", float(parts[2][0]) == 0 and bool((parts[1] == 0).all()),
                        "absmax2 %s, qa %s" % (parts[2].tolist(), parts[1].tolist()))
            if name == "dyn_midpoint_ties":
                c.check("nf4_dyn_ties_setup_exact", float(parts[3]) == 1.0 and parts[2].tolist() == [1.0, 1.0],
                        "offset %r, absmax2 %s (the tie construction needs 1.0 and [1, 1])" % (float(parts[3]), parts[2].tolist()))
        # the glmtrain use: the largest ChatGLM-6B matrix through the reference, in seconds
        big = torch.randn(16384, 4096) * 0.02
        t1 = time.time()
        for kind in KINDS:
            qr.quantize(kind, big)
        dt = time.time() - t1
        c.check("ref_speed_16384x4096", dt < 60, "the three kinds took %.1f s" % dt)
        print("# reference on [16384, 4096]: %.1f s for int8 + int4 + nf4; whole file %.1f s" % (dt, time.time() - t0))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL test_quant_ref: %s" % e)
        sys.exit(1)
    sys.exit(c.status())
