#!/usr/bin/env python3
"""A model folder with THUDM/chatglm2-6b's block and random weights, for the serving benchmarks
(the real download cannot be fetched on the GPU machines): ChatGLM2-6B's config (28 layers,
hidden 4096, 32 heads of 128, 2 key/value groups, SwiGLU 13696, RMSNorm, qkv bias, causal) with
ChatGLM-6B's tokenizer (ice_text.model, the one here) and so its vocabulary (130,528 padded to
130,560, where ChatGLM2's own is 65,024: the head is twice as wide), the original tensor names
(transformer.embedding.word_embeddings, transformer.encoder.layers.N.self_attention...,
transformer.output_layer) in pytorch_model-0000K-of-0000S.bin shards (torch.save, bfloat16) with
pytorch_model.bin.index.json. Matrices N(0, 0.02), norm weights 1, biases 0.

  python3 bench/make_chatglm2_folder.py --out /tmp/chatglm2-6b [--tokenizer build/shared/tokenizers/chatglm-6b]
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
    ap.add_argument("--tokenizer", default="build/shared/tokenizers/chatglm-6b")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--shards", type=int, default=7)
    a = ap.parse_args()
    t0 = time.time()
    V, H, L, FF, NH, G, HD = 130560, 4096, a.layers, 13696, 32, 2, 128
    cfg = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "padded_vocab_size": V, "hidden_size": H,
           "num_layers": L, "num_attention_heads": NH, "kv_channels": HD, "multi_query_attention": True,
           "multi_query_group_num": G, "ffn_hidden_size": FF, "layernorm_epsilon": 1e-5, "rmsnorm": True,
           "add_qkv_bias": True, "add_bias_linear": False, "apply_residual_connection_post_layernorm": False,
           "post_layer_norm": True, "original_rope": True, "seq_length": 32768, "tie_word_embeddings": False,
           "eos_token_id": 130005, "pad_token_id": 3, "torch_dtype": "bfloat16"}
    os.makedirs(a.out, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for f in os.listdir(a.tokenizer):
        if f.endswith(".model") or f == "tokenizer_config.json":
            shutil.copy(os.path.join(a.tokenizer, f), a.out)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(1234)
    Q = NH * HD + 2 * G * HD

    def mat(*shape):
        return (torch.randn(*shape, generator=g, device=dev) * 0.02).to(torch.bfloat16).cpu()

    tensors = [("transformer.embedding.word_embeddings.weight", lambda: mat(V, H))]
    for l in range(L):
        p = "transformer.encoder.layers.%d." % l
        tensors += [(p + "input_layernorm.weight", lambda: torch.ones(H, dtype=torch.bfloat16)),
                    (p + "self_attention.query_key_value.weight", lambda: mat(Q, H)),
                    (p + "self_attention.query_key_value.bias", lambda: torch.zeros(Q, dtype=torch.bfloat16)),
                    (p + "self_attention.dense.weight", lambda: mat(H, NH * HD)),
                    (p + "post_attention_layernorm.weight", lambda: torch.ones(H, dtype=torch.bfloat16)),
                    (p + "mlp.dense_h_to_4h.weight", lambda: mat(2 * FF, H)),
                    (p + "mlp.dense_4h_to_h.weight", lambda: mat(H, FF))]
    tensors += [("transformer.encoder.final_layernorm.weight", lambda: torch.ones(H, dtype=torch.bfloat16)),
                ("transformer.output_layer.weight", lambda: mat(V, H))]
    per = (len(tensors) + a.shards - 1) // a.shards
    index = {}
    for k in range(a.shards):
        name = "pytorch_model-%05d-of-%05d.bin" % (k + 1, a.shards)
        part = {n: make() for n, make in tensors[k * per:(k + 1) * per]}
        torch.save(part, os.path.join(a.out, name))
        index.update({n: name for n in part})
    json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(a.out, "pytorch_model.bin.index.json"), "w"), indent=2)
    print("wrote %s (%d tensors, %d layers) in %.1f s" % (a.out, len(tensors), L, time.time() - t0))


if __name__ == "__main__":
    main()
