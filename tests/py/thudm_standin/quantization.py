"""Stand-in for the quantization.py a THUDM ChatGLM-6B download ships (glmtrain's own code for
the tests, written from the published facts of THUDM's QuantizedLinear; not THUDM's file, and
no cpm_kernels: plain torch on any device). modeling_chatglm.py imports it relatively, as the
original does, so transformers' remote-code loader refuses a folder that lacks this file.

Weight-only INT8 / INT4 as THUDM's chatglm-6b(-int4/int8):
  * QuantizedLinear holds `weight` int8 [OC, C * bits // 8] (INT4: two per byte, the even column
    in the high nibble, as cpm_kernels' int4WeightCompression), `weight_scale` half [OC] and
    `bias`, all frozen Parameters, so a chatglm-6b-int4/int8 state dict loads into it;
  * quantizing (quantize(..., empty_init=False)) is THUDM's formula on the fp16 weight, each fp16
    op computed in fp32 and rounded to fp16 as on CUDA: scale = fp16(max|w| / (2^(bits-1) - 1)),
    q = round(fp16(w / scale)); where the scale is 0 (an all-zero row) q is 0 (THUDM divides by
    zero there);
  * forward dequantizes in fp32, weight = float(q) * float(scale) (THUDM's W8A16Linear rounds
    that to fp16 and multiplies in fp16; we keep fp32, as glmtrain and tests/py/quant_ref.py do),
    then output = x W^T + bias in the input's dtype.
quantize(model, bits, empty_init) replaces the four linears of every layer of a ChatGLMModel
(attention.query_key_value, attention.dense, mlp.dense_h_to_4h, mlp.dense_4h_to_h), as the
original; word_embeddings and lm_head stay as they are."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import Parameter


def compress_int4_weight(q):
    """int8 [OC, C] in [-8, 7] -> int8 [OC, C / 2]: (q[2i] << 4) | (q[2i+1] & 0x0f)."""
    q = q.to(torch.int32)
    packed = ((q[:, 0::2] & 0x0F) << 4) | (q[:, 1::2] & 0x0F)
    return packed.to(torch.uint8).view(torch.int8)


def extract_weight_to_float(weight, scale, bits):
    """float32 [OC, C] = float(q) * float(scale); INT4's nibbles sign-extended (high first)."""
    if bits == 8:
        q = weight.to(torch.float32)
    else:
        b = weight.to(torch.int32)
        hi = b >> 4
        lo = ((b << 4) & 0xFF)
        lo = torch.where(lo >= 128, lo - 256, lo) >> 4
        q = torch.stack((hi, lo), dim=-1).reshape(weight.shape[0], -1).to(torch.float32)
    return q * scale.to(torch.float32)[:, None]


class QuantizedLinear(nn.Module):
    def __init__(self, weight_bit_width, weight_tensor=None, bias_tensor=None, in_features=None, out_features=None,
                 bias=True, dtype=torch.half, device=None, empty_init=False):
        super().__init__()
        self.weight_bit_width = weight_bit_width
        self.in_features, self.out_features = in_features, out_features
        shape = (out_features, in_features)
        if weight_tensor is None or empty_init:
            weight = torch.empty(shape[0], shape[1] * weight_bit_width // 8, dtype=torch.int8, device=device)
            weight_scale = torch.empty(shape[0], dtype=dtype, device=device)
        else:
            w16 = weight_tensor.detach().half()
            qmax = 2 ** (weight_bit_width - 1) - 1
            weight_scale = (w16.abs().max(dim=-1).values.float() / qmax).half()
            s = weight_scale.float()
            safe = torch.where(s > 0, s, torch.ones_like(s))
            q = torch.round((w16.float() / safe[:, None]).half().float())
            q = torch.where(s[:, None] > 0, q, torch.zeros_like(q)).to(torch.int32).to(torch.int8)
            weight = compress_int4_weight(q) if weight_bit_width == 4 else q
        self.weight = Parameter(weight.to(device), requires_grad=False)
        self.weight_scale = Parameter(weight_scale.to(device=device, dtype=dtype), requires_grad=False)
        if bias_tensor is not None:
            self.bias = Parameter(bias_tensor.detach().to(device), requires_grad=False)
        elif bias:
            self.bias = Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.bias = None

    def forward(self, input):
        w = extract_weight_to_float(self.weight, self.weight_scale, self.weight_bit_width)
        b = None if self.bias is None else self.bias.to(torch.float32)
        return F.linear(input.to(torch.float32), w, b).to(input.dtype)

    def extra_repr(self):
        return "in_features=%s, out_features=%s, bits=%d" % (self.in_features, self.out_features, self.weight_bit_width)


def quantize(model, weight_bit_width, empty_init=False, **kwargs):
    """Replace the fp16/fp32 linears of every layer of model (a ChatGLMModel) with QuantizedLinear."""
    if weight_bit_width not in (4, 8):
        raise ValueError("quantization_bit must be 4 or 8, not %r" % (weight_bit_width,))

    def make(lin):
        return QuantizedLinear(weight_bit_width=weight_bit_width, weight_tensor=lin.weight, bias_tensor=lin.bias,
                               in_features=lin.in_features, out_features=lin.out_features, bias=True, dtype=torch.half,
                               device=lin.weight.device, empty_init=empty_init)
    for layer in model.layers:
        layer.attention.query_key_value = make(layer.attention.query_key_value)
        layer.attention.dense = make(layer.attention.dense)
        layer.mlp.dense_h_to_4h = make(layer.mlp.dense_h_to_4h)
        layer.mlp.dense_4h_to_h = make(layer.mlp.dense_4h_to_h)
    return model
