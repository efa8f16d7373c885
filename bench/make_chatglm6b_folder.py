#!/usr/bin/env python3
"""A model folder with THUDM/chatglm-6b's layout and random weights, for the serving benchmarks on
machines where the real download cannot be fetched: config.json (build/shared/cfg6b), the
tokenizer files (ice_text.model + tokenizer_config.json from the real tokenizer folder), and
pytorch_model-0000K-of-00008.bin shards written by torch.save with pytorch_model.bin.index.json,
float16, the original tensor names (transformer.word_embeddings.weight,
transformer.layers.N.{input_layernorm,attention.query_key_value,attention.dense,
post_attention_layernorm,mlp.dense_h_to_4h,mlp.dense_4h_to_h}.{weight,bias},
attention.rotary_emb.inv_freq, transformer.final_layernorm, lm_head.weight as a copy of the
embedding) — 13.4 GB, as the download. Matrices N(0, 0.02), LayerNorm weights 1, biases 0.

  python3 bench/make_chatglm6b_folder.py --out /tmp/chatglm-6b [--config build/shared/cfg6b/config.json]
      [--tokenizer build/shared/tokenizers/chatglm-6b] [--layers 28]
"""
import argparse
import json
import os
import shutil
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="build/shared/cfg6b/config.json")
    ap.add_argument("--tokenizer", default="build/shared/tokenizers/chatglm-6b")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the config's (0: as the config)")
    ap.add_argument("--shards", type=int, default=8)
    a = ap.parse_args()
    t0 = time.time()
    cfg = json.load(open(a.config))
    if a.layers:
        cfg["num_layers"] = a.layers
    V, H, L, FF, NH = cfg["vocab_size"], cfg["hidden_size"], cfg["num_layers"], cfg["inner_hidden_size"], cfg["num_attention_heads"]
    HD = H // NH
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(1234)

    def normal(*shape):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02).half().cpu()

    # the values the original stores: fp16-rounded 1 / 10000^(2j / (HD/2)) for j < HD/4
    inv_freq = (1.0 / (10000 ** (torch.arange(0, HD // 2, 2).float() / (HD // 2)))).half()
    def embedding():
        # ChatGLM-6B's first 20000 ids are image tokens and its last ones special: with their rows
        # zero a random model's greedy choice is a text token, so streams carry text as a trained
        # model's do (an image token decodes to nothing)
        w = normal(V, H)
        w[:20000] = 0
        w[130000:] = 0
        return w
    order = [("transformer.word_embeddings.weight", embedding)]
    for l in range(L):
        p = "transformer.layers.%d." % l
        order += [(p + "input_layernorm.weight", lambda: torch.ones(H, dtype=torch.half)),
                  (p + "input_layernorm.bias", lambda: torch.zeros(H, dtype=torch.half)),
                  (p + "attention.rotary_emb.inv_freq", lambda: inv_freq.clone()),
                  (p + "attention.query_key_value.weight", lambda: normal(3 * H, H)),
                  (p + "attention.query_key_value.bias", lambda: torch.zeros(3 * H, dtype=torch.half)),
                  (p + "attention.dense.weight", lambda: normal(H, H)),
                  (p + "attention.dense.bias", lambda: torch.zeros(H, dtype=torch.half)),
                  (p + "post_attention_layernorm.weight", lambda: torch.ones(H, dtype=torch.half)),
                  (p + "post_attention_layernorm.bias", lambda: torch.zeros(H, dtype=torch.half)),
                  (p + "mlp.dense_h_to_4h.weight", lambda: normal(FF, H)),
                  (p + "mlp.dense_h_to_4h.bias", lambda: torch.zeros(FF, dtype=torch.half)),
                  (p + "mlp.dense_4h_to_h.weight", lambda: normal(H, FF)),
                  (p + "mlp.dense_4h_to_h.bias", lambda: torch.zeros(H, dtype=torch.half))]
    order += [("transformer.final_layernorm.weight", lambda: torch.ones(H, dtype=torch.half)),
              ("transformer.final_layernorm.bias", lambda: torch.zeros(H, dtype=torch.half)),
              ("lm_head.weight", None)]
    os.makedirs(a.out, exist_ok=True)
    total = 0
    per_layer = 2 * (3 * H * H + H * H + 2 * FF * H)
    target = (V * H * 2 * 2 + L * per_layer) / a.shards
    shard, size, k, weight_map, wte = {}, 0, 1, {}, None
    names = []

    def flush(last=False):
        nonlocal shard, size, k
        fn = "pytorch_model-%05d-of-%05d.bin" % (k, a.shards)
        torch.save(shard, os.path.join(a.out, fn))
        for n in shard:
            weight_map[n] = fn
        names.append(fn)
        shard, size, k = {}, 0, k + 1

    for n, f in order:
        t = wte.clone() if f is None else f()
        if n == "transformer.word_embeddings.weight":
            wte = t
        shard[n] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= target and k < a.shards:
            flush()
    if shard:
        flush()
    # the file names say "of 00008": rename if fewer shards came out
    if len(names) != a.shards:
        for i, fn in enumerate(names):
            new = "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(names))
            os.rename(os.path.join(a.out, fn), os.path.join(a.out, new))
            for n in weight_map:
                if weight_map[n] == fn:
                    weight_map[n] = new
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(a.out, "pytorch_model.bin.index.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for fn in os.listdir(a.tokenizer):
        if fn.endswith((".model", ".json")) and fn != "config.json":
            shutil.copy(os.path.join(a.tokenizer, fn), a.out)
    print("wrote %s: %d tensors, %.2f GB in %d shards, %.1f s" % (a.out, len(weight_map), total / 1e9, len(names),
                                                               time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
