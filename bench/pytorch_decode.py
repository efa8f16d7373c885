#!/usr/bin/env python3
"""PyTorch baseline for `glmtrain serve` decoding (issue 21): ChatGLM-6B at batch 1, greedy, the
way Hugging Face generate runs THUDM's modeling_chatglm.py — one eager forward per new token with
past_key_values grown by torch.cat — but in bf16 with SDPA attention (faster than the original's
matmul + softmax attention, so the baseline is on the generous side). Loads the same folder
glmtrain serves (pytorch_model-*.bin shards or model*.safetensors, THUDM's names) and reports the
load time, the prompt's forward and the ms per decoded token (median and mean).

  python3 bench/pytorch_decode.py --model /tmp/chatglm-6b --new 256 [--prompt_tokens 32] [--out FILE.jsonl]
"""
import argparse
import glob
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F


def load_state(folder, dev, dtype):
    sd = {}
    files = sorted(glob.glob(os.path.join(folder, "pytorch_model*.bin")))
    if files:
        for f in files:
            part = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
            sd.update({k: v.to(dev, dtype) for k, v in part.items() if not k.endswith("inv_freq")})
    else:
        from safetensors.torch import load_file
        for f in sorted(glob.glob(os.path.join(folder, "model*.safetensors"))):
            sd.update({k: v.to(dev, dtype) for k, v in load_file(f).items() if not k.endswith("inv_freq")})
    return sd


class GLM6B:
    """THUDM's ChatGLM-6B forward (GLM v1): LayerNorm, fused qkv per head [NH, 3, HD], 2D rotary
    (first half of each head by position, second by block position), alpha = sqrt(2 L) residuals
    on the normalised input, tanh GELU, final LayerNorm, tied head."""

    def __init__(self, sd, cfg):
        self.w, self.L, self.H, self.NH = sd, cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
        self.HD = self.H // self.NH
        self.alpha = math.sqrt(2 * self.L)
        self.head = sd.get("lm_head.weight", sd["transformer.word_embeddings.weight"])
        d = self.HD // 2
        self.inv = (1.0 / (10000 ** (torch.arange(0, d, 2, device=self.head.device).float() / d))).half().float()

    def tables(self, p):  # cos, sin [1, T, 1, d] for positions p, once per forward (the original caches them)
        ang = p.float()[:, None] * self.inv[None]
        ang = torch.cat([ang, ang], -1)
        return ang.cos()[None, :, None].to(torch.bfloat16), ang.sin()[None, :, None].to(torch.bfloat16)

    @staticmethod
    def rope(x, t1, t2):  # x [1, T, NH, HD]: first half by position, second by block position
        def rot(t, cs):
            a, b = t.chunk(2, -1)
            return t * cs[0] + torch.cat([-b, a], -1) * cs[1]
        x1, x2 = x.chunk(2, -1)
        return torch.cat([rot(x1, t1), rot(x2, t2)], -1)

    def forward(self, ids, pos, bpos, past):
        w, H, NH, HD = self.w, self.H, self.NH, self.HD
        T = ids.shape[1]
        h = F.embedding(ids, w["transformer.word_embeddings.weight"])
        t1, t2 = self.tables(pos), self.tables(bpos)
        new = []
        for l in range(self.L):
            p = "transformer.layers.%d." % l
            x = F.layer_norm(h, (H,), w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], 1e-5)
            qkv = F.linear(x, w[p + "attention.query_key_value.weight"], w[p + "attention.query_key_value.bias"])
            q, k, v = qkv.view(1, T, NH, 3 * HD).split(HD, -1)
            q, k = self.rope(q, t1, t2), self.rope(k, t1, t2)
            if past is not None:  # as modeling_chatglm.py: the cache grows by concatenation
                k, v = torch.cat([past[l][0], k], 1), torch.cat([past[l][1], v], 1)
            new.append((k, v))
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            a = F.linear(a.transpose(1, 2).reshape(1, T, H), w[p + "attention.dense.weight"], w[p + "attention.dense.bias"])
            h = self.alpha * x + a
            y = F.layer_norm(h, (H,), w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"], 1e-5)
            m = F.gelu(F.linear(y, w[p + "mlp.dense_h_to_4h.weight"], w[p + "mlp.dense_h_to_4h.bias"]), approximate="tanh")
            h = self.alpha * y + F.linear(m, w[p + "mlp.dense_4h_to_h.weight"], w[p + "mlp.dense_4h_to_h.bias"])
        h = F.layer_norm(h[:, -1:], (H,), w["transformer.final_layernorm.weight"], w["transformer.final_layernorm.bias"], 1e-5)
        return F.linear(h, self.head).float(), new


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--new", type=int, default=256, help="tokens to decode")
    ap.add_argument("--prompt_tokens", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = "cuda"
    t0 = time.time()
    torch.zeros(1, device=dev)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    sd = load_state(a.model, dev, torch.bfloat16)
    torch.cuda.synchronize()
    t_load = time.time() - t0
    model = GLM6B(sd, cfg)
    gmask, sop = cfg.get("gmask_token_id", 130001), cfg.get("bos_token_id", 130004)
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(5, 20000, (1, a.prompt_tokens), generator=g)
    prompt[0, -2], prompt[0, -1] = gmask, sop
    ids = prompt.to(dev)
    n = a.prompt_tokens
    pos = torch.arange(n, device=dev)
    pos[-1] = n - 2  # <sop> takes the [gMASK]'s position, block position 1
    bpos = torch.zeros(n, dtype=torch.long, device=dev)
    bpos[-1] = 1
    times, out = [], []
    with torch.inference_mode():
        for rep in range(2):  # the first pass warms up the kernels
            torch.cuda.synchronize()
            t = time.time()
            logits, past = model.forward(ids, pos, bpos, None)
            nxt = int(logits[0, -1].argmax())
            torch.cuda.synchronize()
            t_prompt = time.time() - t
            times, out = [], [nxt]
            for i in range(a.new if rep else 8):
                t = time.time()
                logits, past = model.forward(torch.tensor([[nxt]], device=dev), torch.tensor([n - 2], device=dev),
                                             torch.tensor([2 + i], device=dev), past)
                nxt = int(logits[0, -1].argmax())  # .item() syncs, as generate's stopping check does
                times.append(time.time() - t)
                out.append(nxt)
    med, mean = statistics.median(times) * 1e3, statistics.mean(times) * 1e3
    rec = {"what": "pytorch_decode_b1", "load_s": t_load, "prompt_tokens": n, "prompt_s": t_prompt, "new": a.new,
           "ms_per_token_median": med, "ms_per_token_mean": mean, "tokens_per_s": 1000 / mean,
           "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30, "first_ids": out[:8], "torch": torch.__version__}
    print("pytorch decode b=1: load %.1f s, prompt %d tokens %.1f ms, %.2f ms/token median (%.2f mean) = %.1f tokens/s"
          % (t_load, n, t_prompt * 1e3, med, mean, 1000 / mean), flush=True)
    print(json.dumps(rec))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
