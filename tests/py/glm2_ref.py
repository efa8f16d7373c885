#!/usr/bin/env python3
"""PyTorch reference of the ChatGLM2-6B / ChatGLM3-6B architecture, written from
docs/chatglm-spec.md sections 11-12 and the facts of THUDM's chatglm2-6b / chatglm3-6b
modeling_chatglm.py (ChatGLMForConditionalGeneration run in fp32, eval, dropout 0), for tests.

  * layout [s, b, H] inside, like the original; inputs/outputs [b, s, ...];
  * RMSNorm (rmsnorm true): w * x / sqrt(mean(x^2) + eps), no mean, no bias; the mean of
    squares in fp32 for half inputs, in the compute dtype otherwise (THUDM always upcasts to
    fp32, which is the same for fp32 and only narrower for float64). rmsnorm false: LayerNorm;
  * QKV with multi_query_attention: one Linear of NH*KC + 2*G*KC outputs (KC = kv_channels,
    G = multi_query_group_num), NOT interleaved: q | k | v, head-major; query head h reads KV
    group h // (NH / G). Without multi_query_attention: interleaved per head as in v1
    (view [s, b, NH, 3*KC], split q | k | v of KC each);
  * rotary (THUDM RotaryEmbedding(rotary_dim // 2), rotary_dim = kv_channels): only the first
    KC/2 dims of each head of q and k are rotated, the rest passes through; pairs are
    INTERLEAVED (2i, 2i+1); theta_i = (10000 * rope_ratio)^(-2i / (KC/2)), i < KC/4 (rope_ratio
    as ChatGLM3's later revisions / chatglm3-6b-32k use it: it scales the BASE; default 1, which
    is the 6B models. chatglm2-6b-32k used the same key for position interpolation instead,
    position / rope_ratio; not implemented); table [seq_length, KC/4, 2] (cos, sin) of position * theta in the
    compute dtype, gathered by position_ids [b, s]; original_rope selects nothing in THUDM's
    code (forward never reads original_impl);
  * attention: scores q.k / sqrt(KC), masked_fill -inf where blocked, softmax in fp32 (or the
    compute dtype when wider), probs . v; apply_query_key_layer_scaling (the 1/(l+1) folded in,
    then *(l+1) after the upcast) is an identity up to rounding and followed as the torch < 2
    path does it;
  * masks as ChatGLMModel.forward: a full bool mask (True = blocked) only when the padding
    mask (attention_mask [b, past + s], 1 = keep) has a 0 or when a past exists and s > 1:
    causal over the new tokens, past columns visible, pad keys blocked, and (without a past)
    rows of pad QUERIES fully unblocked. Otherwise: causal when s_q == s_k, nothing for a
    single-token decode step;
  * block: pre-norm; residual = the block input, or the norm output with
    apply_residual_connection_post_layernorm; SwiGLU MLP: dense_h_to_4h has 2*ffn outputs,
    chunked in two, silu(first) * second, dense_4h_to_h; biases only where add_bias_linear
    (query_key_value also with add_qkv_bias);
  * final_layernorm (post_layer_norm), output_layer (untied, no bias); loss as THUDM's:
    logits upcast to fp32 (float64 kept), shift by one, cross-entropy ignore_index -100, mean
    over the supervised targets of the batch;
  * KV cache per layer: (K, V) each [s_k, b, G, KC] (post-rotary keys, BEFORE expansion to NH
    heads), concatenated along dim 0 at each step.

Functional over a dict {HF parameter name: tensor}; the compute dtype is the dtype of the
parameters (float32 for comparisons with the C model, float64 for higher-precision checks);
gradients by autograd.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm_ref  # noqa: E402  (random_params)

# ChatGLM2-6B config.json values (spec section 11); used for fields a config leaves out.
# ChatGLM3-6B differs only in seq_length 8192.
DEFAULT_CONFIG = {
    "padded_vocab_size": 65024,
    "hidden_size": 4096,
    "num_layers": 28,
    "num_attention_heads": 32,
    "kv_channels": 128,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "ffn_hidden_size": 13696,
    "layernorm_epsilon": 1e-5,
    "rmsnorm": True,
    "add_qkv_bias": True,
    "add_bias_linear": False,
    "apply_residual_connection_post_layernorm": False,
    "post_layer_norm": True,
    "apply_query_key_layer_scaling": True,
    "original_rope": True,
    "rope_ratio": 1,
    "seq_length": 32768,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

ROPE_BASE = 10000.0


def load_config(src):
    """Config dict from a dict (HF field names), a config.json path or a folder holding one.
    Missing fields take ChatGLM2-6B's values; kv_channels None -> hidden_size / heads;
    multi_query_attention false -> one KV group per head."""
    if isinstance(src, dict):
        raw = dict(src)
    else:
        path = os.path.join(src, "config.json") if os.path.isdir(src) else src
        with open(path) as f:
            raw = json.load(f)
    cfg = dict(DEFAULT_CONFIG)
    cfg.update({k: v for k, v in raw.items() if v is not None or k not in cfg})
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg["kv_channels"] is None:
        if H % NH:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        cfg["kv_channels"] = H // NH
    if cfg.get("rope_ratio") is None:
        cfg["rope_ratio"] = 1
    for k in ("multi_query_attention", "rmsnorm", "add_qkv_bias", "add_bias_linear",
              "apply_residual_connection_post_layernorm", "post_layer_norm", "original_rope"):
        cfg[k] = bool(cfg[k])
    G = cfg["multi_query_group_num"] if cfg["multi_query_attention"] else NH
    if G < 1 or NH % G:
        raise ValueError("num_attention_heads (%d) must be a multiple of multi_query_group_num (%d)" % (NH, G))
    cfg["kv_groups"] = G  # derived: number of K/V heads
    if cfg["kv_channels"] % 4:
        raise ValueError("kv_channels must be a multiple of 4 (rotary on half the head, in pairs)")
    return cfg


def qkv_size(cfg):
    NH, KC, G = cfg["num_attention_heads"], cfg["kv_channels"], cfg["kv_groups"]
    return NH * KC + 2 * G * KC


def param_shapes(cfg):
    """[(HF name, shape)] in state-dict order (ChatGLMForConditionalGeneration), parameters
    only: the buffer transformer.rotary_pos_emb.inv_freq, which follows the embedding in a
    state dict, is left out (see buffers)."""
    V, H, L = cfg["padded_vocab_size"], cfg["hidden_size"], cfg["num_layers"]
    NH, KC, FF = cfg["num_attention_heads"], cfg["kv_channels"], cfg["ffn_hidden_size"]
    bias = cfg["add_bias_linear"]

    def norm(name):
        out = [(name + ".weight", (H,))]
        if not cfg["rmsnorm"]:
            out.append((name + ".bias", (H,)))
        return out

    out = [("transformer.embedding.word_embeddings.weight", (V, H))]
    for l in range(L):
        p = "transformer.encoder.layers.%d." % l
        out += norm(p + "input_layernorm")
        out.append((p + "self_attention.query_key_value.weight", (qkv_size(cfg), H)))
        if bias or cfg["add_qkv_bias"]:
            out.append((p + "self_attention.query_key_value.bias", (qkv_size(cfg),)))
        out.append((p + "self_attention.dense.weight", (H, NH * KC)))
        if bias:
            out.append((p + "self_attention.dense.bias", (H,)))
        out += norm(p + "post_attention_layernorm")
        out.append((p + "mlp.dense_h_to_4h.weight", (2 * FF, H)))
        if bias:
            out.append((p + "mlp.dense_h_to_4h.bias", (2 * FF,)))
        out.append((p + "mlp.dense_4h_to_h.weight", (H, FF)))
        if bias:
            out.append((p + "mlp.dense_4h_to_h.bias", (H,)))
    if cfg["post_layer_norm"]:
        out += norm("transformer.encoder.final_layernorm")
    out.append(("transformer.output_layer.weight", (V, H)))
    return out


def buffers(cfg, dtype=torch.float32):
    """The state dict's non-parameter entry: transformer.rotary_pos_emb.inv_freq
    [kv_channels / 4] = 1 / 10000^(2i / (kv_channels/2)) (no rope_ratio; unused by forward)."""
    n = cfg["kv_channels"] // 2
    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, n, 2, dtype=torch.float32) / n))
    return {"transformer.rotary_pos_emb.inv_freq": inv.to(dtype)}


def init_params(cfg, seed=0, std=0.02, dtype=torch.float32):
    """Non-trivial random parameters: matrices N(0, std), norm weights 1 + N(0, 0.1), biases
    N(0, 0.02). Deterministic for a seed (glm_ref's recipe)."""
    return glm_ref.random_params(param_shapes(cfg), seed, std, dtype)


# --------------------------------------------------------------------------------------------
# Pieces

def _wide(dtype):
    """fp32 for half types, else the dtype itself (float32 / float64)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def norm(cfg, p, name, x):
    """input_layernorm / post_attention_layernorm / final_layernorm of x [.., H]."""
    eps = cfg["layernorm_epsilon"]
    w = p[name + ".weight"]
    if not cfg["rmsnorm"]:
        return F.layer_norm(x, (x.shape[-1],), w, p[name + ".bias"], eps)
    var = x.to(_wide(x.dtype)).pow(2).mean(-1, keepdim=True)
    return (w * (x * torch.rsqrt(var + eps))).to(x.dtype)


def rope_cache(cfg, n, dtype):
    """[n, KC/4, 2] (cos, sin) for positions 0..n-1, RotaryEmbedding.forward_impl with
    n_elem = KC/2 and base 10000 * rope_ratio, all in `dtype` (fp32 in the fp32 model)."""
    n_elem = cfg["kv_channels"] // 2
    base = ROPE_BASE * cfg["rope_ratio"]
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2, dtype=dtype) / n_elem))
    idx_theta = torch.outer(torch.arange(n, dtype=dtype), theta)
    return torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1)


def apply_rotary(x, rope):
    """x [s, b, nh, KC]; rope [s, b, KC/4, 2] (gathered per position). Rotates dims
    [0, KC/2) in interleaved pairs (2i, 2i+1); dims [KC/2, KC) pass through."""
    s, b, nh, hd = x.shape
    rot = rope.shape[-2] * 2
    xr, xp = x[..., :rot], x[..., rot:]
    xs = xr.reshape(s, b, nh, rot // 2, 2)
    c = rope[..., 0].unsqueeze(2)  # [s, b, 1, rot/2]
    si = rope[..., 1].unsqueeze(2)
    x0, x1 = xs[..., 0], xs[..., 1]
    out = torch.stack([x0 * c - x1 * si, x1 * c + x0 * si], dim=-1).flatten(3)
    return torch.cat([out, xp], dim=-1)


def expand_groups(t, nh):
    """[s, b, G, KC] -> [s, b, nh, KC]: query head h reads group h // (nh / G)."""
    s, b, g, hd = t.shape
    return t.unsqueeze(3).expand(s, b, g, nh // g, hd).reshape(s, b, nh, hd)


def linear(p, module, x):
    return F.linear(x, p[module + ".weight"], p.get(module + ".bias"))


def self_attention(cfg, p, x, rope, mask, layer_number, layer_past):
    """x [s, b, H]; rope [s, b, KC/4, 2]; mask bool [b, 1, s, s_k] (True = blocked) or None
    (then causal when s == s_k). Returns (out [s, b, H], (K, V) each [s_k, b, G, KC])."""
    s, b, _ = x.shape
    NH, KC, G = cfg["num_attention_heads"], cfg["kv_channels"], cfg["kv_groups"]
    mixed = linear(p, "self_attention.query_key_value", x)
    if cfg["multi_query_attention"]:
        q, k, v = mixed.split([NH * KC, G * KC, G * KC], dim=-1)
        q = q.reshape(s, b, NH, KC)
        k = k.reshape(s, b, G, KC)
        v = v.reshape(s, b, G, KC)
    else:
        q, k, v = mixed.view(s, b, NH, 3 * KC).split(KC, dim=-1)
    q = apply_rotary(q, rope)
    k = apply_rotary(k, rope)
    if layer_past is not None:
        k = torch.cat((layer_past[0], k), dim=0)
        v = torch.cat((layer_past[1], v), dim=0)
    present = (k, v)
    sk = k.shape[0]
    ke, ve = expand_groups(k, NH), expand_groups(v, NH)

    coeff = float(max(1, layer_number)) if cfg["apply_query_key_layer_scaling"] else 1.0
    qb = q.permute(1, 2, 0, 3).reshape(b * NH, s, KC)
    kb = ke.permute(1, 2, 0, 3).reshape(b * NH, sk, KC)
    vb = ve.permute(1, 2, 0, 3).reshape(b * NH, sk, KC)
    scores = torch.bmm(qb, kb.transpose(1, 2)) * (1.0 / (math.sqrt(KC) * coeff))
    scores = scores.view(b, NH, s, sk).to(_wide(scores.dtype)) * coeff
    if mask is None and s == sk:
        mask = ~torch.ones((s, sk), dtype=torch.bool).tril_()
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    probs = F.softmax(scores, dim=-1).to(v.dtype)
    ctx = torch.bmm(probs.reshape(b * NH, s, sk), vb).view(b, NH, s, KC)
    ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, NH * KC)  # head-major columns
    return linear(p, "self_attention.dense", ctx), present


def glm_block(cfg, p, h, rope, mask, layer_number, layer_past):
    x = norm(cfg, p, "input_layernorm", h)
    a, present = self_attention(cfg, p, x, rope, mask, layer_number, layer_past)
    residual = x if cfg["apply_residual_connection_post_layernorm"] else h
    h1 = residual + a
    y = norm(cfg, p, "post_attention_layernorm", h1)
    z = linear(p, "mlp.dense_h_to_4h", y)
    gate, up = z.chunk(2, dim=-1)
    m = linear(p, "mlp.dense_4h_to_h", F.silu(gate) * up)
    residual = y if cfg["apply_residual_connection_post_layernorm"] else h1
    return residual + m, present


def layer_params(params, l):
    pre = "transformer.encoder.layers.%d." % l
    return {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}


def get_masks(input_ids, past_length, padding_mask=None):
    """ChatGLMPreTrainedModel.get_masks: bool [b, 1, s, past + s], True = blocked. Causal over
    the s new tokens, the past columns visible; padding_mask [b, past + s] (1 = keep) blocks
    pad keys; without a past, rows of pad queries are fully unblocked."""
    b, s = input_ids.shape
    m = torch.ones((b, s, s)).tril_()
    if past_length:
        m = torch.cat((torch.ones((b, s, past_length)), m), dim=-1)
    if padding_mask is not None:
        pm = padding_mask.to(m.dtype)
        m = m * pm.unsqueeze(1)
        if not past_length:
            m = m - (pm.unsqueeze(-1) - 1)
    return (m < 0.5).unsqueeze(1)


def get_position_ids(input_ids):
    """0..s-1 for every row (THUDM's default; the tokenizer's left-padded position_ids start
    real tokens at 0 instead)."""
    b, s = input_ids.shape
    return torch.arange(s, dtype=torch.long).unsqueeze(0).repeat(b, 1)


def forward(cfg, params, input_ids, labels=None, position_ids=None, attention_mask=None,
            past_key_values=None, use_cache=False, full_attention_mask=None):
    """ChatGLMForConditionalGeneration.forward (eval, dropout 0).

    input_ids long [b, s]; position_ids long [b, s] (default 0..s-1 without a past; a decode
    step needs them: THUDM would restart at 0); attention_mask [b, past + s] the padding mask
    (1 = keep, 0 = pad) or None; past_key_values a tuple per layer of (K, V) [s_past, b, G, KC]
    as returned in presents; full_attention_mask an explicit bool [b, 1, s, past + s]
    (True = blocked) that overrides the derived one.
    Returns dict: hidden [b, s, H] (after final_layernorm when post_layer_norm), logits
    [b, s, V], loss (or None), presents (tuple per layer of (K, V)) when use_cache else None."""
    L = cfg["num_layers"]
    b, s = input_ids.shape
    past_length = 0 if past_key_values is None else past_key_values[0][0].shape[0]
    if position_ids is None:
        if past_length:
            raise ValueError("decode steps need explicit position_ids")
        position_ids = get_position_ids(input_ids)
    if attention_mask is not None and attention_mask.shape != (b, past_length + s):
        raise ValueError("attention_mask must be [b, past + s] = [%d, %d], got %s"
                         % (b, past_length + s, tuple(attention_mask.shape)))
    if full_attention_mask is None:
        if (attention_mask is not None and not bool(attention_mask.bool().all())) or (past_length and s != 1):
            full_attention_mask = get_masks(input_ids, past_length, attention_mask)

    emb = params["transformer.embedding.word_embeddings.weight"]
    dtype = emb.dtype
    n = int(position_ids.max()) + 1
    if n > cfg["seq_length"]:
        raise ValueError("position %d beyond seq_length %d (the rope table's length)" % (n - 1, cfg["seq_length"]))
    rope = rope_cache(cfg, n, dtype)[position_ids].transpose(0, 1)  # [s, b, KC/4, 2]

    h = F.embedding(input_ids, emb).transpose(0, 1)  # [s, b, H]
    presents = []
    for l in range(L):
        past = None if past_key_values is None else past_key_values[l]
        h, present = glm_block(cfg, layer_params(params, l), h, rope, full_attention_mask, l + 1, past)
        presents.append(present)
    if cfg["post_layer_norm"]:
        h = norm(cfg, params, "transformer.encoder.final_layernorm", h)
    logits = F.linear(h, params["transformer.output_layer.weight"]).transpose(0, 1).contiguous()  # [b, s, V]
    loss = None
    if labels is not None:
        lg = logits.to(_wide(logits.dtype))
        shift_logits = lg[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1),
                               ignore_index=-100)
    return {"hidden": h.transpose(0, 1), "logits": logits, "loss": loss,
            "presents": tuple(presents) if use_cache else None}
