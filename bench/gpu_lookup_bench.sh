#!/usr/bin/env bash
# Prompt lookup (`--prompt_lookup_num_tokens`, infer/generate.c) on a GPU, batch 1:
#  1. what a pass of k tokens costs against a one-token step (bench_decode --verify), ChatGLM2-6B and
#     ChatGLM-6B shapes, a 1,024-token prompt;
#  2. `glmtrain generate --input_file` on a ChatGLM2-6B-shaped folder of random weights
#     (bench/make_chatglm2_folder.py; MODEL to reuse one), greedy, 256 new tokens for each of 4
#     prompts, without and with drafts of 10 (tokens/s as generate reports it, without the load; the
#     drafts' counts). Random weights repeat themselves, so most drafts are taken: this is the upper
#     end of what the drafts give, not a real model's speed on real text;
#  3. serve at 1 and 8 streams, without and with drafts (bench/serve_bench.py).
# Needs build/gpu/{glmtrain,bench_decode}, build/lib, build/shared (the tokenizer), python3 with torch.
# usage: bash bench/gpu_lookup_bench.sh [BUILD_DIR]
set -u
B=${1:-build/gpu}
for fam in chatglm2 chatglm; do
    "$B/bench_decode" --family $fam --prompt 1024 --total 1280 --verify 1,2,4,8,11,16,32 | grep -E "decode|verify"
done
M=${MODEL:-/tmp/chatglm2-6b}
[ -f "$M/config.json" ] || python3 "$(dirname "$0")/make_chatglm2_folder.py" --out "$M" >/dev/null || exit 1
W=$(mktemp -d)
python3 - "$W/in.json" <<'PY'
import json, sys
qs = ["请把下面这段话重复三遍：春风又绿江南岸，明月何时照我还。",
      "总结：今天天气很好，我们去公园散步，公园里有很多花，花很香，我们很开心。",
      "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n# 写一个 mul 函数",
      "你好"]
with open(sys.argv[1], "w") as f:
    for q in qs:
        f.write(json.dumps({"prompt": q, "response": ""}, ensure_ascii=False) + "\n")
PY
for k in 0 10 0 10; do
    "$B/glmtrain" generate --model_name_or_path "$M" --device cuda --dtype bfloat16 --input_file "$W/in.json" \
        --output_file "$W/out$k.jsonl" --do_sample false --max_new_tokens 256 --per_device_eval_batch_size 1 \
        --prompt_lookup_num_tokens $k 2>&1 | grep -E "tokens/s|prompt lookup|error" | sed "s/^/lookup $k: /"
done
cmp -s "$W/out0.jsonl" "$W/out10.jsonl" && echo "bf16 predictions identical with and without lookup" ||
    echo "bf16 predictions differ with and without lookup"
rm -rf "$W"
# 3. serve at 1 and 8 streams (bench/serve_bench.py: greedy chat completions of 256 tokens), without
#    and with drafts of 10
for k in 0 10; do
    python3 "$(dirname "$0")/serve_bench.py" --glmtrain "$B/glmtrain" --model "$M" --streams 1,8 --max_tokens 256 \
        --server_args "--max_batch_size 8 --max_model_len 2048 --dtype bfloat16 --prompt_lookup_num_tokens $k" 2>&1 |
        grep -vE "^starting" | sed "s/^/serve lookup $k: /"
done
