#!/usr/bin/env python3
"""PyTorch reference of ChatGLM-6B (GLM v1), written from docs/chatglm-spec.md sections 1-5.

It re-implements the semantics of THUDM's modeling_chatglm.py ChatGLMForConditionalGeneration
(the model run in fp32, i.e. after `.float()`), for tests only:

  * layout [s, b, H] inside, like the original; inputs/outputs [b, s, ...];
  * QKV interleaved per head: view [s, b, NH, 3*HD], split into q | k | v of HD each;
  * 2D rotary: first half of each head rotated with position_ids, second half with
    block_position_ids; rotate-half pairing; inverse frequencies computed in fp32 then ROUNDED TO
    FP16 (the original buffer is half), tables t*inv_freq then cos/sin in the compute dtype;
  * query_key_layer_scaling: q / (sqrt(HD) * (l+1)), scores masked with -10000 BEFORE the
    rescale by (l+1), softmax in fp32 (or the compute dtype when it is wider);
    the mask fill is skipped when the mask has no True entry (like the original);
  * alpha = sqrt(56) for every model size (GLMBlock's num_layers default 28 is never overridden);
    the residual is the LayerNorm OUTPUT: h1 = alpha*LN_in(h) + attn, out = alpha*LN_post(h1) + mlp;
  * tanh GELU; final LayerNorm; lm_head (tied to word_embeddings unless tie_word_embeddings is
    false); shifted cross-entropy, ignore_index -100, mean over supervised targets of the batch;
  * masks and 2D positions derived from input_ids per row exactly as the original:
    ctx = index of the first <sop> (bos_token_id), mask_pos = first [gMASK] if the row has one,
    else first [MASK]; position_ids = i (< ctx) else mask_pos; block = 0 (< ctx) else i-ctx+1;
    allowed(i, j) = j < ctx or j <= i;
  * KV cache (past_key_values, keys cached after rotation) for decode steps.
  * P-Tuning v2 (spec section 10): THUDM's PrefixEncoder (with and without prefix_projection) and
    get_prompt's past key/values (prefix keys not rotated, visible to every query; dropout 0).

Everything is functional over a dict {HF parameter name: tensor}, so the same code runs in
float32 (comparisons with the C model) and float64 (gradcheck).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

ALPHA = math.sqrt(56.0)  # sqrt(2 * 28), whatever num_layers is (spec section 3)
MASK_FILL = -10000.0

# ChatGLM-6B v1.1 config.json values; used for fields a config leaves out.
DEFAULT_CONFIG = {
    "vocab_size": 130528,
    "hidden_size": 4096,
    "num_layers": 28,
    "num_attention_heads": 32,
    "inner_hidden_size": None,  # None -> 4 * hidden_size
    "layernorm_epsilon": 1e-5,
    "max_sequence_length": 2048,
    "bos_token_id": 130004,
    "eos_token_id": 130005,
    "mask_token_id": 130000,
    "gmask_token_id": 130001,
    "pad_token_id": 3,
    "tie_word_embeddings": True,
    "position_encoding_2d": True,
}


def load_config(src):
    """Config dict from a config.json path, a folder holding one, or a dict (HF field names)."""
    if isinstance(src, dict):
        raw = dict(src)
    else:
        path = os.path.join(src, "config.json") if os.path.isdir(src) else src
        with open(path) as f:
            raw = json.load(f)
    cfg = dict(DEFAULT_CONFIG)
    cfg.update({k: v for k, v in raw.items() if v is not None or k not in cfg})
    if cfg["inner_hidden_size"] is None:
        cfg["inner_hidden_size"] = 4 * cfg["hidden_size"]
    cfg["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", True))
    if not cfg.get("position_encoding_2d", True):
        raise ValueError("glm_ref implements position_encoding_2d=true only (ChatGLM-6B)")
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    if H % NH or (H // NH) % 4:
        raise ValueError("hidden_size / num_attention_heads must be a multiple of 4")
    return cfg


def config_json(cfg):
    """HF-style config.json text for cfg."""
    keys = ["vocab_size", "hidden_size", "num_layers", "num_attention_heads", "inner_hidden_size",
            "layernorm_epsilon", "max_sequence_length", "position_encoding_2d", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "mask_token_id", "gmask_token_id", "pad_token_id"]
    out = {"architectures": ["ChatGLMModel"], "model_type": "chatglm"}
    out.update({k: cfg[k] for k in keys})
    out["torch_dtype"] = "float32"
    out["use_cache"] = True
    return json.dumps(out, indent=2) + "\n"


def param_shapes(cfg):
    """[(HF name, shape)] in state-dict order; lm_head.weight only when the head is untied."""
    V, H, F4 = cfg["vocab_size"], cfg["hidden_size"], cfg["inner_hidden_size"]
    out = [("transformer.word_embeddings.weight", (V, H))]
    for l in range(cfg["num_layers"]):
        p = "transformer.layers.%d." % l
        out += [(p + "input_layernorm.weight", (H,)), (p + "input_layernorm.bias", (H,)),
                (p + "attention.query_key_value.weight", (3 * H, H)),
                (p + "attention.query_key_value.bias", (3 * H,)),
                (p + "attention.dense.weight", (H, H)), (p + "attention.dense.bias", (H,)),
                (p + "post_attention_layernorm.weight", (H,)), (p + "post_attention_layernorm.bias", (H,)),
                (p + "mlp.dense_h_to_4h.weight", (F4, H)), (p + "mlp.dense_h_to_4h.bias", (F4,)),
                (p + "mlp.dense_4h_to_h.weight", (H, F4)), (p + "mlp.dense_4h_to_h.bias", (H,))]
    out += [("transformer.final_layernorm.weight", (H,)), ("transformer.final_layernorm.bias", (H,))]
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, H)))
    return out


def init_params(cfg, seed=0, std=0.02, dtype=torch.float32):
    """Non-trivial random parameters: matrices N(0, std), LayerNorm weights 1 + N(0, 0.1),
    LayerNorm biases and linear biases N(0, 0.02). Deterministic for a seed."""
    return random_params(param_shapes(cfg), seed, std, dtype)


def random_params(shapes, seed=0, std=0.02, dtype=torch.float32):
    """init_params over any [(name, shape)] list (the ChatGLM2 reference uses it too): a norm
    weight is a 1-D tensor whose name holds "layernorm" and ends in .weight."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in shapes:
        if len(shape) >= 2:
            t = torch.randn(shape, generator=g, dtype=torch.float64) * std
        elif "layernorm" in name and name.endswith(".weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            t = 0.02 * torch.randn(shape, generator=g, dtype=torch.float64)
        params[name] = t.to(dtype)
    return params


def save_model_dir(path, cfg, params):
    """Writes path/config.json and path/model.safetensors (float32, HF names)."""
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(config_json(cfg))
    save_file({k: v.detach().to(torch.float32).contiguous() for k, v in params.items()},
              os.path.join(path, "model.safetensors"))


# --------------------------------------------------------------------------------------------
# Inputs: masks and 2D positions derived from input_ids (spec 5.1-5.3)

def context_length(row, cfg):
    """Index of the first <sop> (bos_token_id) in a row (list of ints)."""
    try:
        return row.index(cfg["bos_token_id"])
    except ValueError:
        raise ValueError("row has no <sop> (bos_token_id %d): %r" % (cfg["bos_token_id"], row))


def mask_position(row, cfg):
    """First [gMASK] if the row has one, else the first [MASK] (the model's priority)."""
    tok = cfg["gmask_token_id"] if cfg["gmask_token_id"] in row else cfg["mask_token_id"]
    try:
        return row.index(tok)
    except ValueError:
        raise ValueError("row has neither [gMASK] nor [MASK]: %r" % (row,))


def get_masks(input_ids, cfg):
    """Bool [b, 1, s, s], True = not allowed: allowed(i, j) = j < ctx or j <= i."""
    b, s = input_ids.shape
    m = torch.ones((b, s, s)).tril_()
    for i, row in enumerate(input_ids.tolist()):
        m[i, :, :context_length(row, cfg)] = 1
    return (m.unsqueeze(1) < 0.5)


def get_position_ids(input_ids, cfg):
    """Long [b, 2, s]: row 0 position_ids, row 1 block_position_ids."""
    b, s = input_ids.shape
    pos = torch.arange(s, dtype=torch.long).unsqueeze(0).repeat(b, 1)
    block = torch.zeros((b, s), dtype=torch.long)
    for i, row in enumerate(input_ids.tolist()):
        ctx, mp = context_length(row, cfg), mask_position(row, cfg)
        pos[i, ctx:] = mp
        block[i, ctx:] = torch.arange(s - ctx, dtype=torch.long) + 1
    return torch.stack((pos, block), dim=1)


def decode_position_ids(input_ids, cfg):
    """Long [b, 2, 1] for a decode step (HF prepare_inputs_for_generation): input_ids [b, n] is
    the whole sequence INCLUDING the new last token; returns (mask_pos, n - ctx)."""
    rows = input_ids.tolist()
    return torch.tensor([[[mask_position(r, cfg)], [len(r) - context_length(r, cfg)]] for r in rows],
                        dtype=torch.long)


def pad_batch(ids_rows, label_rows, pad_id):
    """Right-pads ragged rows to the longest: ids with pad_id, labels with -100."""
    T = max(len(r) for r in ids_rows)
    ids = torch.tensor([list(r) + [pad_id] * (T - len(r)) for r in ids_rows], dtype=torch.long)
    labels = None
    if label_rows is not None:
        labels = torch.tensor([list(r) + [-100] * (T - len(r)) for r in label_rows], dtype=torch.long)
    return ids, labels


def make_example(a, b, cfg):
    """ptuning/main.py training example: ids = a + [gMASK, sop] + b + [eop],
    labels = [-100]*ctx + ids[ctx:] with ctx = index of <sop>."""
    ids = list(a) + [cfg["gmask_token_id"], cfg["bos_token_id"]] + list(b) + [cfg["eos_token_id"]]
    ctx = len(a) + 1
    labels = [-100] * ctx + ids[ctx:]
    return ids, labels


# --------------------------------------------------------------------------------------------
# Model

def gelu(x):
    """OpenAI tanh GELU, constants of the original."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def rotary_tables(rot_dim, n, dtype):
    """cos, sin [n, rot_dim] for positions 0..n-1. inv_freq in fp32 then rounded to fp16 (the
    original buffer is half), then used in `dtype` (the module after .float())."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    inv_freq = inv_freq.half().to(dtype)
    t = torch.arange(n, dtype=dtype)
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin, pos):
    """x [s, b, nh, d]; pos [s, b] integer positions; cos/sin [n, d]."""
    c = F.embedding(pos, cos).unsqueeze(2)
    s = F.embedding(pos, sin).unsqueeze(2)
    return x * c + rotate_half(x) * s


def _softmax_dtype(dtype):
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def self_attention(cfg, p, x, position_ids, mask, layer_id, layer_past, lora=None):
    """x [s, b, H]; position_ids [b, 2, s]; mask bool broadcastable to [b, nh, s, s_k] or None.
    Returns (out [s, b, H], present (K, V) each [s_k, b, nh, hd], post-rotary keys)."""
    s, b, H = x.shape
    nh = cfg["num_attention_heads"]
    hd = H // nh
    qkv = linear(p, "attention.query_key_value", x, lora)
    qkv = qkv.view(s, b, nh, 3 * hd)
    q, k, v = torch.split(qkv, hd, dim=-1)  # interleaved per head
    q1, q2 = q.chunk(2, dim=-1)
    k1, k2 = k.chunk(2, dim=-1)
    n = int(position_ids.max()) + 1
    cos, sin = rotary_tables(hd // 2, n, x.dtype)
    pos = position_ids[:, 0, :].transpose(0, 1).contiguous()
    bpos = position_ids[:, 1, :].transpose(0, 1).contiguous()
    q1, k1 = apply_rotary(q1, cos, sin, pos), apply_rotary(k1, cos, sin, pos)
    q2, k2 = apply_rotary(q2, cos, sin, bpos), apply_rotary(k2, cos, sin, bpos)
    q = torch.cat([q1, q2], dim=-1)
    k = torch.cat([k1, k2], dim=-1)
    if layer_past is not None:
        k = torch.cat((layer_past[0], k), dim=0)
        v = torch.cat((layer_past[1], v), dim=0)
    present = (k, v)
    sk = k.shape[0]

    coeff = float(layer_id + 1)
    q = q / (math.sqrt(hd) * coeff)
    qb = q.reshape(s, b * nh, hd).transpose(0, 1)          # [b*nh, s, hd]
    kb = k.reshape(sk, b * nh, hd).transpose(0, 1)         # [b*nh, sk, hd]
    scores = torch.bmm(qb, kb.transpose(1, 2)).view(b, nh, s, sk)
    if mask is not None and bool(mask.any()):
        scores = scores.masked_fill(mask, MASK_FILL)
    dtype = scores.dtype
    scores = scores.to(_softmax_dtype(dtype)) * coeff
    probs = F.softmax(scores, dim=-1).to(dtype)
    vb = v.reshape(sk, b * nh, hd).transpose(0, 1)         # [b*nh, sk, hd]
    ctx = torch.bmm(probs.view(b * nh, s, sk), vb).view(b, nh, s, hd)
    ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, H)        # head-major columns
    out = linear(p, "attention.dense", ctx, lora)
    return out, present


def dropout_keep(seed, n, p):
    """backend/mask_hash.h's mask: element i of a mask_scale call seeded `seed` is kept when the
    16-bit slice (i mod 4) of splitmix64(seed + (i / 4 + 1) * golden) is >= p * 2^16 (p as float32)."""
    import numpy as np
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint64)
        z = np.uint64(seed) + (i // np.uint64(4) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        bits = (z >> (np.uint64(16) * (i & np.uint64(3)))) & np.uint64(0xFFFF)
    thr = int(float(np.float32(p)) * 65536.0)
    return torch.from_numpy((bits >= np.uint64(thr)).astype(np.float32))


def lora_dropped(x, drop, module):
    """x [s, b, C] through LoRA's dropout as glmtrain draws it: drop = (p, run seed, layer); the
    seed of (layer, module) as model/peft.c's lora_seed, the mask over the [b, s, C] tokens."""
    p, seed, l = drop
    i = LORA_MODULES.index(module)
    s_ = (seed + (l * 4 + i + 1) * 0x100000001B3) % (1 << 64)
    S, B, C = x.shape
    keep = dropout_keep(s_, S * B * C, p).view(B, S, C).transpose(0, 1).to(x.dtype)
    return x * keep / (1 - float(__import__("numpy").float32(p)))


def linear(p, module, x, lora=None):
    """One of the layer's four linear modules (module: "attention.query_key_value", ...).
    lora = (adapters of this layer {"<module>.lora_A.weight": A [r, in], ".lora_B.weight":
    B [out, r]}, scaling): a module with an adapter adds scaling * B A x, in peft's LoraLayer
    order (lora_B(lora_A(dropout(x))) * scaling). With "<module>.lora_magnitude_vector" m [out]
    too, DoRA as peft's (0.10's LoraLayer._apply_dora, 0.13's DoraLinearLayer): c = m / ||W + s B A||
    per output row (the norm detached), out = base + (c - 1) W u + c s B A u, u = dropout(x).
    A third element of lora, (p, run seed, layer), is glmtrain's dropout (lora_dropped); else none."""
    W = p[module + ".weight"]
    out = F.linear(x, W, p[module + ".bias"])
    if lora is not None and module + ".lora_A.weight" in lora[0]:
        ad, scaling = lora[0], lora[1]
        if len(lora) > 2:
            x = lora_dropped(x, lora[2], module)
        A, B = ad[module + ".lora_A.weight"], ad[module + ".lora_B.weight"]
        lora_out = F.linear(F.linear(x, A), B)
        mag = ad.get(module + ".lora_magnitude_vector")
        if mag is None:
            return out + lora_out * scaling
        norm = torch.linalg.norm(W + scaling * (B @ A), dim=1).detach()
        c = (mag / norm).view(1, -1)
        out = out + (c - 1) * F.linear(x, W) + c * lora_out * scaling
    return out


def glm_block(cfg, p, h, position_ids, mask, layer_id, layer_past, alpha, lora=None):
    H = cfg["hidden_size"]
    eps = cfg["layernorm_epsilon"]
    x = F.layer_norm(h, (H,), p["input_layernorm.weight"], p["input_layernorm.bias"], eps)
    a, present = self_attention(cfg, p, x, position_ids, mask, layer_id, layer_past, lora)
    h1 = x * alpha + a
    y = F.layer_norm(h1, (H,), p["post_attention_layernorm.weight"], p["post_attention_layernorm.bias"], eps)
    m = linear(p, "mlp.dense_4h_to_h", gelu(linear(p, "mlp.dense_h_to_4h", y, lora)), lora)
    return y * alpha + m, present


def layer_params(params, l):
    pre = "transformer.layers.%d." % l
    return {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}


def forward(cfg, params, input_ids, labels=None, position_ids=None, attention_mask=None,
            past_key_values=None, use_cache=False, alpha=ALPHA, checkpoint=False, lora=None, prefix=None):
    """ChatGLMForConditionalGeneration.forward.

    input_ids long [b, s]. Without past_key_values, attention_mask (bool [b,1,s,s], True = masked)
    and position_ids ([b,2,s]) are derived from input_ids when not given. With past_key_values
    (tuple per layer of (K, V) [s_past, b, nh, hd]), position_ids must be given and the mask
    defaults to none (all allowed), as in the original decode path.
    Returns dict: hidden [b,s,H] (after final_layernorm), logits [b,s,V], loss (or None),
    presents (tuple per layer) when use_cache.
    lora = (adapters {"transformer.layers.N.<module>.lora_A.weight": A, ...lora_B...: B}, scaling)
    adds peft's LoRA branches to the modules that have adapters (see linear, lora_scaling).
    prefix = P-Tuning v2's past key/values (prefix_past: per layer (K, V) [P, b or 1, nh, hd]),
    used as THUDM's first forward uses get_prompt: the prefix is the layer past (keys NOT
    rotated), P visible columns are prepended to the mask ([b, 1, s, P+s]) and the positions are
    unchanged (real tokens start at 0). Not with past_key_values (the decode past holds it)."""
    H = cfg["hidden_size"]
    L = cfg["num_layers"]
    if prefix is not None and past_key_values is not None:
        raise ValueError("prefix is for the first forward; the decode past already holds it")
    if past_key_values is None:
        past_key_values = (None,) * L
        if attention_mask is None:
            attention_mask = get_masks(input_ids, cfg)
        if position_ids is None:
            position_ids = get_position_ids(input_ids, cfg)
        if prefix is not None:
            b, s = input_ids.shape
            P = prefix[0][0].shape[0]
            past_key_values = tuple((k.expand(P, b, *k.shape[2:]), v.expand(P, b, *v.shape[2:])) for k, v in prefix)
            attention_mask = attention_mask.expand(b, 1, s, s)
            attention_mask = torch.cat((torch.zeros((b, 1, s, P), dtype=torch.bool), attention_mask), dim=3)
    elif position_ids is None:
        raise ValueError("decode steps need explicit position_ids")
    emb = params["transformer.word_embeddings.weight"]
    h = F.embedding(input_ids, emb).transpose(0, 1)       # [s, b, H]
    presents = []
    for l in range(L):
        lp = layer_params(params, l)
        ll = None if lora is None else (layer_params(lora[0], l), lora[1]) + ((lora[2] + (l,),) if len(lora) > 2 else ())
        if checkpoint and (past_key_values[l] is None or prefix is not None):
            import torch.utils.checkpoint as ckpt

            def run(hh, _lp=lp, _l=l, _ll=ll, _past=past_key_values[l]):
                return glm_block(cfg, _lp, hh, position_ids, attention_mask, _l, _past, alpha, _ll)[0]
            h = ckpt.checkpoint(run, h, use_reentrant=False)
            present = None
        else:
            h, present = glm_block(cfg, lp, h, position_ids, attention_mask, l, past_key_values[l], alpha, ll)
        presents.append(present)
    h = F.layer_norm(h, (H,), params["transformer.final_layernorm.weight"],
                     params["transformer.final_layernorm.bias"], cfg["layernorm_epsilon"])
    head = emb if cfg["tie_word_embeddings"] else params["lm_head.weight"]
    logits = F.linear(h, head).permute(1, 0, 2).contiguous()  # [b, s, V]
    loss = None
    if labels is not None:
        lg = logits.to(_softmax_dtype(logits.dtype))
        shift_logits = lg[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1),
                               ignore_index=-100)
    return {"hidden": h.transpose(0, 1), "logits": logits, "loss": loss,
            "presents": tuple(presents) if use_cache else None}


# --------------------------------------------------------------------------------------------
# Optimizer, as glmtrain intends it

def decay_groups(named_params, weight_decay, lr=None, loraplus_lr_ratio=0.0):
    """Two AdamW groups: weight_decay for tensors with ndim >= 2 and DoRA's magnitudes (the
    Trainer spares biases and norms by name, not by shape), 0.0 for biases / LayerNorm. With
    loraplus_lr_ratio, LLaMA-Factory's LoRA+ groups (_create_loraplus_optimizer): the lora_B
    tensors in a group of their own at lr * ratio."""
    plus = loraplus_lr_ratio > 0

    def decays(n, p):
        return p.ndim >= 2 or "lora_magnitude_vector" in n
    b = [p for n, p in named_params if plus and "lora_B" in n]
    decay = [p for n, p in named_params if decays(n, p) and not (plus and "lora_B" in n)]
    no_decay = [p for n, p in named_params if not decays(n, p)]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if plus:
        groups.append({"params": b, "weight_decay": weight_decay, "lr": lr * loraplus_lr_ratio})
    return groups


def make_adamw(named_params, lr, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, loraplus_lr_ratio=0.0):
    """torch.optim.AdamW over those groups (constant learning rate)."""
    return torch.optim.AdamW(decay_groups(named_params, weight_decay, lr, loraplus_lr_ratio), lr=lr, betas=betas, eps=eps)


def global_grad_norm(tensors):
    return torch.norm(torch.stack([t.grad.detach().norm(2) for t in tensors if t.grad is not None]), 2)


def train(cfg, params, input_ids, labels, steps=0, lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.999,
          eps=1e-8, max_grad_norm=0.0, checkpoint=False):
    """What tool_model_driver reports, computed with torch: returns dict with
    loss (float, step 0), grad_norm (float, step 0, before clipping), grads {name: tensor} at
    step 0, losses [K] (loss before each AdamW step), params {name: tensor} after K steps.
    `params` is copied, not modified."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    out = _train_leaves(leaves, {}, lambda: forward(cfg, leaves, input_ids, labels, checkpoint=checkpoint)["loss"],
                        steps, lr, weight_decay, beta1, beta2, eps, max_grad_norm)
    del out["frozen"]
    return out


# --------------------------------------------------------------------------------------------
# Parameter-efficient fine-tuning: LoRA (peft's LoraLayer) and freeze (the last layers train)

LORA_MODULES = ["attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]


def lora_scaling(alpha, r, rslora=False):
    """peft's scaling: alpha / r, or alpha / sqrt(r) for rank-stabilised LoRA (peft >= 0.7)."""
    return alpha / math.sqrt(r) if rslora else alpha / r


def lora_shapes(cfg, r, targets):
    """[(name, shape)] of the adapters, targets the HF module names ("query_key_value", ...;
    peft's target_modules), A [r, in] and B [out, r], layer by layer in module order."""
    H, F4 = cfg["hidden_size"], cfg["inner_hidden_size"]
    dims = {"attention.query_key_value": (H, 3 * H), "attention.dense": (H, H),
            "mlp.dense_h_to_4h": (H, F4), "mlp.dense_4h_to_h": (F4, H)}
    out = []
    for l in range(cfg["num_layers"]):
        for mod in LORA_MODULES:
            if mod.split(".")[1] in targets:
                i, o = dims[mod]
                pre = "transformer.layers.%d.%s." % (l, mod)
                out += [(pre + "lora_A.weight", (r, i)), (pre + "lora_B.weight", (o, r))]
    return out


def init_lora(cfg, r, targets, seed=0, std_a=0.1, std_b=0.05, dtype=torch.float32):
    """Random adapters with B != 0 too (peft starts from B = 0, where A gets no gradient)."""
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(s, generator=g, dtype=torch.float64) * (std_a if ".lora_A." in n else std_b)).to(dtype)
            for n, s in lora_shapes(cfg, r, targets)}


def freeze_trainable(cfg, n, modules=("all",), extra=(), names=None, llama_pro=False):
    """Names that train in freeze mode, by LLaMA-Factory's rule (its _setup_freeze_tuning): n > 0
    the last n layers, n < 0 the first -n; of those, the parameters whose names contain
    ".{layer}.{module}" for a module of `modules` ("all": ".{layer}."), and those whose names contain
    a module of `extra` (outside the layers: the second-to-last part of a name not inside a
    numbered layer). `names`: the model's parameter names (v1's param_shapes by default); a
    module that is not the model's raises ValueError, as LLaMA-Factory does. llama_pro: its
    use_llama_pro rule instead, every (L // n)-th layer from the (L // n - 1)-th."""
    import re
    names = names or [k for k, _ in param_shapes(cfg)]
    L = cfg["num_layers"]
    ids = range(max(0, L - n), L) if n > 0 else range(min(-n, L))
    if llama_pro:
        stride = L // n
        ids = range(stride - 1, L + stride - 1, stride)
    hidden = {k.split(".0.")[-1].split(".")[0] for k in names if ".0." in k}
    outside = {k.split(".")[-2] for k in names if re.search(r"\.\d+\.", k) is None}
    keys = []
    for m in modules:
        if m != "all" and m not in hidden:
            raise ValueError("Module %s is not found, please choose from %s" % (m, ", ".join(sorted(hidden))))
        keys += [".%d.%s" % (i, "" if m == "all" else m) for i in ids]
    for m in extra:
        if m not in outside:
            raise ValueError("Module %s is not found, please choose from %s" % (m, ", ".join(sorted(outside))))
        keys.append(m)
    return [k for k in names if any(t in k for t in keys)]


def _train_leaves(leaves, frozen, loss_of, steps, lr, weight_decay, beta1, beta2, eps, max_grad_norm, loraplus_lr_ratio=0.0):
    """The AdamW loop train_peft and train_ptuning share: `leaves` {name: tensor} train, loss_of()
    computes the loss from them. The dict train() returns, over the leaves, plus frozen."""
    named = list(leaves.items())
    opt = make_adamw(named, lr, weight_decay, (beta1, beta2), eps, loraplus_lr_ratio)
    tensors = [p for _, p in named]
    out = {"losses": []}
    for step in range(max(steps, 1)):
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        if step == 0:
            out["loss"] = loss.item()
            out["grad_norm"] = global_grad_norm(tensors).item()
            out["grads"] = {k: (v.grad if v.grad is not None else torch.zeros_like(v)).detach().clone() for k, v in named}
        if steps == 0:
            break
        out["losses"].append(loss.item())
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(tensors, max_grad_norm)
        opt.step()
    out["params"] = {k: v.detach().clone() for k, v in named}
    out["frozen"] = frozen
    return out


def train_peft(cfg, params, input_ids, labels, trainable, adapters=None, scaling=0.0, steps=0, lr=1e-3,
               weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8, max_grad_norm=0.0, loraplus_lr_ratio=0.0, drop=None):
    """train() for LoRA or freeze: only the tensors named in `trainable` (names of params or of
    adapters) get gradients and AdamW steps; the rest are constants. Returns the same dict as
    train(), grads and params over the trainable names only, plus frozen {name: tensor}.
    drop = (p, run seed): the adapters' dropout as glmtrain draws it (the same masks each step)."""
    every = dict(params, **(adapters or {}))
    leaves = {k: every[k].detach().clone().requires_grad_(True) for k in trainable}
    frozen = {k: v.detach().clone() for k, v in every.items() if k not in leaves}

    def loss_of():
        cur = dict(frozen, **leaves)
        lora = None if adapters is None else ({k: cur[k] for k in adapters}, scaling) + ((drop,) if drop else ())
        return forward(cfg, {k: cur[k] for k in params}, input_ids, labels, lora=lora)["loss"]
    return _train_leaves(leaves, frozen, loss_of, steps, lr, weight_decay, beta1, beta2, eps, max_grad_norm, loraplus_lr_ratio)


# --------------------------------------------------------------------------------------------
# P-Tuning v2 (spec section 10): THUDM's PrefixEncoder and get_prompt (dropout 0)

PREFIX = "transformer.prefix_encoder."


def prefix_shapes(cfg, pre_seq_len, projection):
    """[(name, shape)] of the prefix encoder, THUDM's PrefixEncoder order: without projection
    embedding [P, 2LH]; with it embedding [P, H], trans.0 Linear(H -> H), trans.2 Linear(H -> 2LH)."""
    P, H, L = pre_seq_len, cfg["hidden_size"], cfg["num_layers"]
    KV = 2 * L * H
    if not projection:
        return [(PREFIX + "embedding.weight", (P, KV))]
    return [(PREFIX + "embedding.weight", (P, H)), (PREFIX + "trans.0.weight", (H, H)), (PREFIX + "trans.0.bias", (H,)),
            (PREFIX + "trans.2.weight", (KV, H)), (PREFIX + "trans.2.bias", (KV,))]


def init_prefix(cfg, pre_seq_len, projection, seed=0, std_emb=0.5, dtype=torch.float32):
    """Random prefix-encoder tensors: the embedding N(0, std_emb); Linear weights and biases as
    torch's default (U(+-1/sqrt(in)))."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, s in prefix_shapes(cfg, pre_seq_len, projection):
        if n.endswith("embedding.weight"):
            t = torch.randn(s, generator=g, dtype=torch.float64) * std_emb
        else:
            b = 1.0 / math.sqrt(cfg["hidden_size"])
            t = (torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1) * b
        out[n] = t.to(dtype)
    return out


def prefix_encoder(prefix_params, projection):
    """PrefixEncoder.forward over prefix ids 0..P-1 (the rows of the embedding, in order):
    [P, 2LH]. With projection: trans.2(tanh(trans.0(embedding)))."""
    e = prefix_params[PREFIX + "embedding.weight"]
    if not projection:
        return e
    t = torch.tanh(F.linear(e, prefix_params[PREFIX + "trans.0.weight"], prefix_params[PREFIX + "trans.0.bias"]))
    return F.linear(t, prefix_params[PREFIX + "trans.2.weight"], prefix_params[PREFIX + "trans.2.bias"])


def prefix_past(cfg, kv):
    """get_prompt after the encoder (dropout 0, batch 1: forward expands it): kv [P, 2LH] viewed
    [P, 2L, NH, HD], permuted to [2L, P, 1, NH, HD]; layer l's past is (slot 2l = keys, slot 2l+1
    = values), each [P, 1, NH, HD]."""
    L, NH = cfg["num_layers"], cfg["num_attention_heads"]
    HD = cfg["hidden_size"] // NH
    P = kv.shape[0]
    x = kv.view(P, 1, 2 * L, NH, HD).permute(2, 0, 1, 3, 4)
    return tuple((x[2 * l], x[2 * l + 1]) for l in range(L))


def ptuning_prefix(cfg, prefix_params, projection):
    """The prefix= argument of forward from the encoder's tensors."""
    return prefix_past(cfg, prefix_encoder(prefix_params, projection))


def train_ptuning(cfg, params, input_ids, labels, prefix_params, projection, steps=0, lr=1e-3, weight_decay=0.0,
                  beta1=0.9, beta2=0.999, eps=1e-8, max_grad_norm=0.0, checkpoint=False):
    """train_peft for P-Tuning v2: only the prefix encoder's tensors train (AdamW groups by ndim
    as always), every base tensor is a constant. Same dict as train_peft (grads/params over the
    prefix tensors, frozen = the base tensors)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in prefix_params.items()}
    frozen = {k: v.detach().clone() for k, v in params.items()}

    def loss_of():
        return forward(cfg, frozen, input_ids, labels, checkpoint=checkpoint,
                       prefix=ptuning_prefix(cfg, leaves, projection))["loss"]
    return _train_leaves(leaves, frozen, loss_of, steps, lr, weight_decay, beta1, beta2, eps, max_grad_norm)
