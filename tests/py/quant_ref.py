"""PyTorch references of the quantized base weights of issue 17 (what src/backend/quant.c
implements), for tests only. Everything is vectorised: a [16384, 4096] matrix takes seconds.

INT8 / INT4: THUDM's chatglm-6b quantization.py QuantizedLinear, on the fp16 weight
(model.half().quantize(bits)) as CUDA computes it: every fp16 elementwise op in fp32, the result
rounded to fp16 (round to nearest even).
    scale = fp16(max_j |w16[r, j]| / (2^(bits-1) - 1))       one fp16 per output row
    q     = round(fp16(w16 / scale))                          torch.round: half to even
INT4 packs two per byte as cpm_kernels' int4WeightCompression: byte = (q[2i] << 4) | (q[2i+1] &
0x0f), the even column in the high nibble, [OC, C/2] int8. Reading back: high = byte >> 4
(arithmetic), low = (int8)(byte << 4) >> 4.
Where THUDM divides by zero, we (and glmtrain's C code) do not:
  * a row whose scale is 0 (an all-zero row, or one whose max |w| / qmax underflows fp16) gets
    scale 0 and q 0 everywhere (THUDM computes 0/0 = NaN there and casts NaN to int8: undefined);
  * a row whose scale is an fp16 subnormal (max |w| below ~1e-3 for INT8, ~3e-6 for INT4) can
    give |w / scale| >= qmax + 0.5 (the coarse subnormal scale rounds down): q = 128 or more.
    THUDM's .to(torch.int8) of such a value is a C++ out-of-range conversion (undefined; torch
    on x86 and CUDA wraps modulo 256 in practice, flipping the sign of the row's largest weight);
    we clamp q to [-qmax, qmax] instead, as quant.c does.
The dequantized weight is (float)q * float(scale) exactly, in fp32. THUDM's W8A16Linear rounds
that product to fp16 (its matmul runs in fp16); glmtrain and this reference keep the fp32
product, and so does our THUDM-style stand-in (tests/py/thudm_standin/quantization.py).

NF4: bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True) on
the float32 matrix flattened: per block of 64 its absmax a (fp32), x * (1.0f / a) (reciprocal,
then multiply), the code from dQuantizeNF4's decision tree (x > t against float32 thresholds;
equivalent to counting the thresholds below x; a NaN, from an all-zero block, is code 0), two
codes per byte, the first element in the high nibble. Double quantization: offset = mean of the
absmax, OUR documented choice being the float64 mean (a left-to-right float64 sum, as quant.c
adds them, divided by nb) rounded to float32 (torch's float32 mean may differ by an ulp);
absmax - offset in blocks of 256 over create_dynamic_map(signed=True) with one fp32 absmax2 per
block (max |absmax - offset|), normalised by (absmax - offset) * (1.0f / absmax2) and coded by
bitsandbytes' dQuantize<0> (its binary search and midpoint comparisons, ties included; an
absmax2 of 0 gives NaN, which that search maps to code 0). Reading back:
    w = nf4[code] * (dyn[qa] * absmax2 + offset)    fp32, no fused multiply-add.

to_layout_bytes lays any of these out as glm_qlayout_of does (src/backend/quant.h), so they
compare byte for byte with `tool_quant quant`."""
import glob
import json
import os
import shutil

import numpy as np
import torch

ALIGN = 256
NF4_BLOCK = 64
NF4_BLOCK2 = 256

# bitsandbytes' NF4 code book (functional.get_4bit_type("nf4"))
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=torch.float32)


def f32_of_decimal(text):
    """The float32 nearest to a decimal literal, as a C compiler reads `<text>f` (correct
    rounding, ties to even). Not float32(float(text)): that rounds twice, and several of
    dQuantizeNF4's literals lie within a double's precision of a float32 midpoint (they are
    midpoints of float32 code values printed to 16 digits), where the two differ."""
    from decimal import Decimal
    d = Decimal(text)
    f = np.float32(float(text))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = min(cands, key=lambda x: (abs(Decimal(float(x)) - d), int(np.array(x).view(np.uint32)) & 1))
    return float(best)


# dQuantizeNF4's thresholds (the float literals of its decision tree, as written there), ascending
NF4_THRESHOLD_LITERALS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011",
]
NF4_THRESHOLDS = torch.tensor([f32_of_decimal(t) for t in NF4_THRESHOLD_LITERALS], dtype=torch.float32)

# The quantized linears of every layer (THUDM's quantize(); embeddings and lm_head stay fp16).
QUANT_MODULES = ["attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]


def create_dynamic_map():
    """bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), as it
    computes it (float32 linspace and products, sorted python floats, then torch.tensor)."""
    data = []
    for i in range(7):
        boundaries = torch.linspace(0.1, 1, 2 ** i + 1)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += (10 ** (-6 + i) * means).tolist()
        data += (-10 ** (-6 + i) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 256
    data.sort()
    return torch.tensor(data)


DYN_CODE = create_dynamic_map()


def is_quantized_name(name):
    """`transformer.layers.N.<one of QUANT_MODULES>.weight`."""
    if not (name.startswith("transformer.layers.") and name.endswith(".weight")):
        return False
    mod = name.split(".", 3)[3][:-len(".weight")]
    return mod in QUANT_MODULES


# ---------------------------------------------------------------------------------------------
# INT8 / INT4 (THUDM)

def thudm_quantize(w, bits):
    """w: float [OC, C] (rounded to fp16 first, as THUDM's .half() model). Returns (q, scale):
    q int8 [OC, C] (bits 8) or packed [OC, C/2] (bits 4); scale float16 [OC]."""
    assert bits in (4, 8)
    w16 = w.detach().to(torch.float32).to(torch.float16)
    qmax = float(2 ** (bits - 1) - 1)
    amax = w16.abs().amax(dim=-1).to(torch.float32)
    scale = (amax / qmax).to(torch.float16)
    s = scale.to(torch.float32)
    ok = s > 0
    h = (w16.to(torch.float32) / torch.where(ok, s, torch.ones_like(s))[:, None]).to(torch.float16)
    q = torch.round(h.to(torch.float32))  # exact integers; half to even
    q = torch.where(ok[:, None], q, torch.zeros_like(q)).clamp(-qmax, qmax).to(torch.int32)
    if bits == 8:
        return q.to(torch.int8), scale
    if q.shape[-1] % 2:
        raise ValueError("INT4 needs an even number of columns")
    qq = q & 0x0F
    packed = (qq[:, 0::2] << 4) | qq[:, 1::2]
    return packed.to(torch.uint8).view(torch.int8), scale


def thudm_unpack_int4(packed):
    """int8 [OC, C/2] -> int8 [OC, C]: high nibble first, both sign-extended."""
    b = packed.view(torch.int8).to(torch.int32)
    hi = b >> 4
    lo = ((b << 4) & 0xFF)
    lo = torch.where(lo >= 128, lo - 256, lo) >> 4
    return torch.stack((hi, lo), dim=-1).reshape(b.shape[0], -1).to(torch.int8)


def thudm_dequantize(q, scale, bits):
    """float32 [OC, C] = float(q) * float(scale) (fp32, exact product)."""
    if bits == 4:
        q = thudm_unpack_int4(q)
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


# ---------------------------------------------------------------------------------------------
# NF4 (bitsandbytes)

def nf4_codes_of(xn):
    """dQuantizeNF4 on normalised float32 values: uint8 codes 0..15 (NaN -> 0)."""
    codes = torch.bucketize(xn, NF4_THRESHOLDS, out_int32=True, right=False)  # = #{t < x}: the tree's x > t
    return torch.where(torch.isnan(xn), torch.zeros_like(codes), codes).to(torch.uint8)


def dyn_codes_of(x):
    """bitsandbytes' dQuantize<0> over DYN_CODE (its binary search and midpoints), vectorised."""
    code = DYN_CODE
    n = x.shape
    pivot = torch.full(n, 127, dtype=torch.long)
    upper_pivot = torch.full(n, 255, dtype=torch.long)
    lower_pivot = torch.zeros(n, dtype=torch.long)
    lower = torch.full(n, -1.0)
    upper = torch.full(n, 1.0)
    val = code[pivot]
    i = 64
    while i > 0:
        gt = x > val
        lower_pivot = torch.where(gt, pivot, lower_pivot)
        lower = torch.where(gt, val, lower)
        upper_pivot = torch.where(gt, upper_pivot, pivot)
        upper = torch.where(gt, upper, val)
        pivot = torch.where(gt, pivot + i, pivot - i)
        val = code[pivot]
        i >>= 1
    upper = torch.where(upper_pivot == 255, code[255].expand(n), upper)
    lower = torch.where(lower_pivot == 0, code[0].expand(n), lower)
    gt = x > val
    up = torch.where(x > (upper + val) * 0.5, upper_pivot, pivot)
    down = torch.where(x < (lower + val) * 0.5, lower_pivot, pivot)
    return torch.where(gt, up, down).to(torch.uint8)


def nf4_offset(absmax):
    """The double quantization's offset: the float64 mean of the float32 absmax (summed left to
    right, as quant.c does), rounded to float32."""
    a = absmax.to(torch.float64).numpy()
    total = np.cumsum(a)[-1] if a.size else 0.0  # a sequential float64 sum
    return torch.tensor(float(total) / a.size, dtype=torch.float64).to(torch.float32)


def nf4_quantize(w):
    """w: float32 tensor (flattened; numel a multiple of 64). Returns (codes uint8 [n/2],
    qa uint8 [nb], absmax2 float32 [nb2], offset float32 0-dim)."""
    x = w.detach().to(torch.float32).reshape(-1)
    if x.numel() % NF4_BLOCK:
        raise ValueError("NF4 needs a multiple of %d elements" % NF4_BLOCK)
    xb = x.view(-1, NF4_BLOCK)
    absmax = xb.abs().amax(dim=1)
    inv = torch.reciprocal(absmax)           # 1.0f / a (inf for an all-zero block)
    codes = nf4_codes_of(xb * inv[:, None]).reshape(-1)
    packed = (codes[0::2] << 4) | codes[1::2]
    nb = absmax.numel()
    nb2 = (nb + NF4_BLOCK2 - 1) // NF4_BLOCK2
    offset = nf4_offset(absmax)
    d = absmax - offset
    dp = torch.zeros(nb2 * NF4_BLOCK2, dtype=torch.float32)
    dp[:nb] = d
    absmax2 = dp.view(nb2, NF4_BLOCK2).abs().amax(dim=1)  # padding zeros never raise a max
    inv2 = torch.reciprocal(absmax2)
    dn = d * inv2.repeat_interleave(NF4_BLOCK2)[:nb]
    qa = dyn_codes_of(dn)
    return packed, qa, absmax2, offset


def nf4_block_absmax(qa, absmax2, offset):
    """The absmax each block reads back: dyn[qa] * absmax2 + offset (two roundings, no FMA)."""
    a2 = absmax2.to(torch.float32).repeat_interleave(NF4_BLOCK2)[:qa.numel()]
    return DYN_CODE[qa.to(torch.long)] * a2 + offset.to(torch.float32)


def nf4_dequantize(codes, qa, absmax2, offset, shape=None):
    """float32 of the given shape (default flat) = nf4[code] * block absmax."""
    c = codes.to(torch.long)
    flat = torch.stack((c >> 4, c & 15), dim=-1).reshape(-1)
    a = nf4_block_absmax(qa, absmax2, offset)
    out = (NF4_CODE[flat].view(-1, NF4_BLOCK) * a[:, None]).reshape(-1)
    return out.view(*shape) if shape is not None else out


# ---------------------------------------------------------------------------------------------
# glm_qlayout_of (src/backend/quant.h) and the bytes of tool_quant

def q_round(b):
    return (b + ALIGN - 1) // ALIGN * ALIGN


def qlayout_of(kind, OC, C):
    """The byte offsets of glm_qlayout_of, as the dict `tool_quant layout` prints."""
    n = OC * C
    L = {"q": 0, "q_bytes": 0, "scale": 0, "qa": 0, "absmax2": 0, "offset": 0, "nb": 0, "nb2": 0, "bytes": 0}
    if kind == "nf4":
        L["q_bytes"] = n // 2
        L["nb"] = n // NF4_BLOCK
        L["nb2"] = (L["nb"] + NF4_BLOCK2 - 1) // NF4_BLOCK2
        L["qa"] = q_round(L["q_bytes"])
        L["absmax2"] = L["qa"] + q_round(L["nb"])
        L["offset"] = L["absmax2"] + q_round(L["nb2"] * 4)
        L["bytes"] = L["offset"] + ALIGN
    else:
        L["q_bytes"] = n // 2 if kind == "int4" else n
        L["scale"] = q_round(L["q_bytes"])
        L["bytes"] = L["scale"] + q_round(OC * 2)
    return L


def _raw(t):
    return t.detach().contiguous().reshape(-1).numpy().tobytes()


def to_layout_bytes(kind, OC, C, parts):
    """bytes of one quantized [OC, C] matrix laid out as glm_qlayout_of (zero padding).
    parts: (q, scale) for int8/int4, (codes, qa, absmax2, offset) for nf4."""
    L = qlayout_of(kind, OC, C)
    buf = bytearray(L["bytes"])

    def put(off, data):
        buf[off:off + len(data)] = data
    if kind == "nf4":
        codes, qa, absmax2, offset = parts
        put(0, _raw(codes.to(torch.uint8)))
        put(L["qa"], _raw(qa.to(torch.uint8)))
        put(L["absmax2"], _raw(absmax2.to(torch.float32)))
        put(L["offset"], _raw(offset.to(torch.float32).reshape(1)))
    else:
        q, scale = parts
        put(0, _raw(q.view(torch.int8)))
        put(L["scale"], _raw(scale.to(torch.float16)))
    return bytes(buf)


def from_layout_bytes(kind, OC, C, data):
    """The inverse of to_layout_bytes: the parts read from a byte string."""
    L = qlayout_of(kind, OC, C)

    def get(off, n, dtype):
        return torch.from_numpy(np.frombuffer(data, dtype=dtype, count=n, offset=off).copy())
    if kind == "nf4":
        return (get(0, L["q_bytes"], np.uint8), get(L["qa"], L["nb"], np.uint8),
                get(L["absmax2"], L["nb2"], np.float32), get(L["offset"], 1, np.float32)[0])
    qc = C // 2 if kind == "int4" else C
    return get(0, OC * qc, np.int8).view(OC, qc), get(L["scale"], OC, np.float16)


def quantize(kind, w):
    """The parts of w [OC, C] quantized as kind ("int8", "int4", "nf4")."""
    if kind == "nf4":
        return nf4_quantize(w)
    return thudm_quantize(w, 8 if kind == "int8" else 4)


def dequantize(kind, OC, C, parts):
    """float32 [OC, C] from the parts of quantize()."""
    if kind == "nf4":
        return nf4_dequantize(*parts, shape=(OC, C))
    q, scale = parts
    return thudm_dequantize(q, scale, 8 if kind == "int8" else 4)


# ---------------------------------------------------------------------------------------------
# A THUDM chatglm-6b-int4/int8-shaped folder

def read_float_folder(folder):
    """{name: tensor} of a model folder's weights: *.safetensors, else pytorch_model*.bin."""
    st = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    sd = {}
    if st:
        from safetensors.torch import load_file
        for fn in st:
            sd.update(load_file(fn))
        return sd
    for fn in sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin"))):
        sd.update(torch.load(fn, map_location="cpu"))
    if not sd:
        raise FileNotFoundError("no *.safetensors or pytorch_model*.bin in %s" % folder)
    return sd


def quantize_state_dict(sd, bits):
    """THUDM's quantized state dict of a float one: each quantized linear as `.weight` int8 and
    `.weight_scale` fp16 (inserted after the weight), every other floating tensor fp16."""
    out = {}
    for name, t in sd.items():
        if is_quantized_name(name):
            q, scale = thudm_quantize(t.float(), bits)
            out[name] = q
            out[name[:-len("weight")] + "weight_scale"] = scale
        elif t.is_floating_point():
            out[name] = t.to(torch.float16)
        else:
            out[name] = t
    return out


def dequantized_params(qsd, bits):
    """float32 {name: tensor} of a quantized state dict: the quantized linears dequantized,
    weight_scale dropped, the rest as stored (the weights glmtrain computes with)."""
    out = {}
    for name, t in qsd.items():
        if name.endswith(".weight_scale"):
            continue
        sc = name[:-len("weight")] + "weight_scale"
        out[name] = thudm_dequantize(t, qsd[sc], bits) if is_quantized_name(name) and sc in qsd else t.float()
    return out


def write_thudm_quantized_folder(src_folder, dst_folder, bits):
    """dst: THUDM's chatglm-6b-int4/int8 layout of the float model in src: config.json = the
    source's with "quantization_bit": bits added (key order kept), pytorch_model.bin (one
    torch.save) with quantize_state_dict's tensors, and the source's *.py and tokenizer files
    (ice_text.model, tokenizer_config.json, special_tokens_map.json, generation_config.json).
    Returns the state dict written."""
    os.makedirs(dst_folder, exist_ok=True)
    with open(os.path.join(src_folder, "config.json")) as f:
        cfg = json.load(f)  # dicts keep the file's key order
    cfg["quantization_bit"] = bits
    with open(os.path.join(dst_folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    qsd = quantize_state_dict(read_float_folder(src_folder), bits)
    torch.save(qsd, os.path.join(dst_folder, "pytorch_model.bin"))
    keep = [p for p in glob.glob(os.path.join(src_folder, "*.py"))]
    keep += [os.path.join(src_folder, n) for n in ("ice_text.model", "tokenizer_config.json", "special_tokens_map.json",
                                                   "generation_config.json", "tokenizer.model")]
    for p in keep:
        if os.path.isfile(p):
            shutil.copyfile(p, os.path.join(dst_folder, os.path.basename(p)))
    return qsd
