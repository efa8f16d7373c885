"""ChatGLM-6B (GLM v1) model: glmtrain's own small stand-in for THUDM's modeling_chatglm.py,
written for tests/py/test_folder_interop.py from docs/chatglm-spec.md sections 3-5 (the same
math as tests/py/glm_ref.py, here as nn.Modules whose parameter names are the checkpoint's;
not THUDM's file). fp32 semantics; no KV cache.

Quantization as the original (chatglm-6b-int4/int8): config.quantization_bit (4 or 8) makes
ChatGLMForConditionalGeneration.__init__ call self.quantize(bits, empty_init=True) before the
state dict loads, so the folder's int8 `weight` / fp16 `weight_scale` tensors load into
quantization.py's QuantizedLinear; model.quantize(bits) quantizes a float model in place (see
quantization.py: THUDM's formula, dequantized in fp32).

P-Tuning v2 as the original has it (docs/chatglm-spec.md section 10): config.pre_seq_len /
prefix_projection add a PrefixEncoder at transformer.prefix_encoder (`embedding`, and `trans`
= Linear-Tanh-Linear with the projection), every other parameter frozen; the first forward
makes each layer's past keys/values from it (get_prompt, dropout 0.1 while training), which
go in front of the layer's own keys/values (not rotated) and are visible to every query.

Like the original it imports `.configuration_chatglm` and `.quantization` relatively, so
transformers' remote-code loader needs both files beside it. Attention scores use torch.bmm,
never baddbmm with beta=0 (Debian's torch 1.13 can return NaN from the uninitialised input
tensor of that call on small sizes)."""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel

from .configuration_chatglm import ChatGLMConfig
from .quantization import quantize

ALPHA = math.sqrt(2 * 28)  # GLMBlock's num_layers default, never overridden by the original


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotary_tables(dim, n, dtype):
    inv_freq = (1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))).half().to(dtype)
    freqs = torch.outer(torch.arange(n, dtype=dtype), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin, pos):
    """x [s, b, nh, d]; pos [s, b]."""
    return x * F.embedding(pos, cos).unsqueeze(2) + rotate_half(x) * F.embedding(pos, sin).unsqueeze(2)


class PrefixEncoder(nn.Module):
    """THUDM's PrefixEncoder: prefix ids [b, P] -> [b, P, 2 * num_layers * hidden_size]."""

    def __init__(self, config):
        super().__init__()
        self.prefix_projection = config.prefix_projection
        kv = config.num_layers * config.hidden_size * 2
        if self.prefix_projection:
            self.embedding = nn.Embedding(config.pre_seq_len, config.hidden_size)
            self.trans = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.Tanh(),
                                       nn.Linear(config.hidden_size, kv))
        else:
            self.embedding = nn.Embedding(config.pre_seq_len, kv)

    def forward(self, prefix):
        e = self.embedding(prefix)
        return self.trans(e) if self.prefix_projection else e


class SelfAttention(nn.Module):
    def __init__(self, config, layer_id):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, position_ids, mask, layer_past=None):
        s, b, H = x.shape
        nh, hd = self.num_heads, self.head_dim
        q, k, v = torch.split(self.query_key_value(x).view(s, b, nh, 3 * hd), hd, dim=-1)  # per head q|k|v
        cos, sin = rotary_tables(hd // 2, int(position_ids.max()) + 1, x.dtype)
        pos = position_ids[:, 0, :].transpose(0, 1)
        block = position_ids[:, 1, :].transpose(0, 1)
        q1, q2 = q.chunk(2, dim=-1)
        k1, k2 = k.chunk(2, dim=-1)
        q = torch.cat([rotate(q1, cos, sin, pos), rotate(q2, cos, sin, block)], dim=-1)
        k = torch.cat([rotate(k1, cos, sin, pos), rotate(k2, cos, sin, block)], dim=-1)
        if layer_past is not None:  # the P-Tuning prefix: keys/values in front, not rotated
            k = torch.cat((layer_past[0], k), dim=0)
            v = torch.cat((layer_past[1], v), dim=0)
        sk = k.shape[0]
        coeff = float(self.layer_id + 1)
        q = q / (math.sqrt(hd) * coeff)
        scores = torch.bmm(q.reshape(s, b * nh, hd).transpose(0, 1),
                           k.reshape(sk, b * nh, hd).permute(1, 2, 0)).view(b, nh, s, sk)
        if bool(mask.any()):
            scores = scores.masked_fill(mask, -10000.0)
        probs = F.softmax(scores.float() * coeff, dim=-1).to(x.dtype)
        ctx = torch.bmm(probs.view(b * nh, s, sk), v.reshape(sk, b * nh, hd).transpose(0, 1))
        ctx = ctx.view(b, nh, s, hd).permute(2, 0, 1, 3).reshape(s, b, H)
        return self.dense(ctx)


class GLU(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner = config.inner_hidden_size or 4 * config.hidden_size
        self.dense_h_to_4h = nn.Linear(config.hidden_size, inner)
        self.dense_4h_to_h = nn.Linear(inner, config.hidden_size)

    def forward(self, x):
        return self.dense_4h_to_h(gelu(self.dense_h_to_4h(x)))


class GLMBlock(nn.Module):
    def __init__(self, config, layer_id):
        super().__init__()
        eps = config.layernorm_epsilon
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.attention = SelfAttention(config, layer_id)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.mlp = GLU(config)

    def forward(self, h, position_ids, mask, layer_past=None):
        x = self.input_layernorm(h)  # the residual branch is the LayerNorm output
        h1 = x * ALPHA + self.attention(x, position_ids, mask, layer_past)
        y = self.post_attention_layernorm(h1)
        return y * ALPHA + self.mlp(y)


class ChatGLMPreTrainedModel(PreTrainedModel):
    config_class = ChatGLMConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["GLMBlock"]
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.inv_freq"]  # recomputed, as the original does

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, 0.02)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()


class ChatGLMModel(ChatGLMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([GLMBlock(config, i) for i in range(config.num_layers)])
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.pre_seq_len = getattr(config, "pre_seq_len", None)
        if self.pre_seq_len is not None:  # P-Tuning v2: only the prefix encoder trains
            for param in self.parameters():
                param.requires_grad = False
            self.prefix_tokens = torch.arange(self.pre_seq_len).long()
            self.prefix_encoder = PrefixEncoder(config)
            self.dropout = nn.Dropout(0.1)
        self.post_init()

    def get_prompt(self, batch_size, device, dtype):
        """Per layer (keys, values) [P, b, nh, hd] from the prefix encoder, as the original."""
        cfg = self.config
        tokens = self.prefix_tokens.unsqueeze(0).expand(batch_size, -1).to(device)
        pkv = self.prefix_encoder(tokens).type(dtype)
        pkv = pkv.view(batch_size, self.pre_seq_len, cfg.num_layers * 2, cfg.num_attention_heads,
                       cfg.hidden_size // cfg.num_attention_heads)
        pkv = self.dropout(pkv)
        return pkv.permute([2, 1, 0, 3, 4]).split(2)

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def positions_and_mask(self, input_ids):
        """2D positions [b, 2, s] and the mask [b, 1, s, s] (True = not allowed) from the ids:
        ctx = first <sop>, mask position = first [gMASK] (else [MASK])."""
        cfg = self.config
        b, s = input_ids.shape
        pos = torch.arange(s).repeat(b, 1)
        block = torch.zeros(b, s, dtype=torch.long)
        allowed = torch.ones(b, s, s).tril()
        for i, row in enumerate(input_ids.tolist()):
            ctx = row.index(cfg.bos_token_id)
            mp = row.index(cfg.gmask_token_id if cfg.gmask_token_id in row else cfg.mask_token_id)
            pos[i, ctx:] = mp
            block[i, ctx:] = torch.arange(1, s - ctx + 1)
            allowed[i, :, :ctx] = 1
        return torch.stack((pos, block), dim=1), (allowed < 0.5).unsqueeze(1)

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        pos, mask = self.positions_and_mask(input_ids)
        position_ids = pos if position_ids is None else position_ids
        mask = mask if attention_mask is None else attention_mask
        h = self.word_embeddings(input_ids).transpose(0, 1)  # [s, b, H]
        past = [None] * len(self.layers)
        if self.pre_seq_len is not None:  # P visible prefix columns in front of the mask
            b, s = input_ids.shape
            past = self.get_prompt(b, input_ids.device, h.dtype)
            mask = torch.cat((torch.zeros(b, 1, s, self.pre_seq_len, dtype=torch.bool), mask.expand(b, 1, s, s)), dim=3)
        for layer, layer_past in zip(self.layers, past):
            h = layer(h, position_ids, mask, layer_past)
        return self.final_layernorm(h)


class ChatGLMForConditionalGeneration(ChatGLMPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.transformer = ChatGLMModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        self.quantized = False
        if getattr(self.config, "quantization_bit", 0):
            self.quantize(self.config.quantization_bit, empty_init=True)

    def quantize(self, bits, empty_init=False, **kwargs):
        """THUDM's ChatGLMForConditionalGeneration.quantize: the layers' linears to INT4/INT8."""
        if bits == 0:
            return
        if self.quantized:
            return self
        self.quantized = True
        self.config.quantization_bit = bits
        self.transformer = quantize(self.transformer, bits, empty_init=empty_init, **kwargs)
        return self

    def get_input_embeddings(self):
        return self.transformer.word_embeddings

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids, position_ids=None, attention_mask=None, labels=None, return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict  # peft passes None
        h = self.transformer(input_ids, position_ids=position_ids, attention_mask=attention_mask)
        logits = self.lm_head(h).permute(1, 0, 2).contiguous()  # [b, s, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        if not return_dict:
            return (loss, logits) if loss is not None else (logits,)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
