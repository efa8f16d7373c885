#!/usr/bin/env python3
"""Workload W1 (docs/DESIGN.md) for the benchmark scripts: WORKDIR/config.json with ChatGLM-6B's
shapes and an untied head, and WORKDIR/w1.jsonl, 2048 records long enough that truncation to
256 prompt + 256 answer tokens gives every row the same 512-token shape."""
import json
import random
import sys

w = sys.argv[1]
json.dump({"model_type": "chatglm", "vocab_size": 130528, "hidden_size": 4096, "num_layers": 28,
           "num_attention_heads": 32, "inner_hidden_size": 16384, "max_sequence_length": 2048,
           "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "tie_word_embeddings": False,
           "bos_token_id": 130004, "eos_token_id": 130005, "mask_token_id": 130000,
           "gmask_token_id": 130001, "pad_token_id": 3}, open(w + "/config.json", "w"))
rng = random.Random(0)
common = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
with open(w + "/w1.jsonl", "w", encoding="utf-8") as f:
    for i in range(2048):
        q = "".join(rng.choice(common) for _ in range(700))
        a = "".join(rng.choice(common) for _ in range(700))
        f.write(json.dumps({"instruction": q, "output": a}, ensure_ascii=False) + "\n")
