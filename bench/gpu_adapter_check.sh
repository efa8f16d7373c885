#!/usr/bin/env bash
# Adapters on a GPU through the paths the CPU tests prove (tests/sh/test_generate_device_map.sh,
# tests/py/test_serve.py): a small model with ChatGLM-6B's vocabulary trained here in bf16, a LoRA
# adapter and a P-Tuning v2 prefix trained on it, then
#   - generate --adapter on the whole model and through --device_map (one stage per GPU) agree;
#   - serve --ptuning_checkpoint and serve --adapter NAME=DIR --device_map answer what
#     generate --adapter gives (greedy), with logprobs whose first alternative is the token;
#   - a quantized base (INT4, INT8, NF4) gives the same text whole and through --device_map.
# Prints PASS/FAIL lines. Build here: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain; carry
# build/gpu/glmtrain, build/lib and build/shared (with tokenizers/chatglm-6b/ice_text.model copied in).
set -u
. "$(dirname "$0")/lib.sh"
find_tokenizer adapter_check
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
GLM=${GLM:-build/gpu/glmtrain}
W=${WORK:-/tmp/adapter-check}
w1_workdir "$W" 4
train() { # output dir, flags...
    local out=$1
    shift
    timeout 300 "$GLM" train --tokenizer_name "$TOKENIZER" --train_file "$W/w1.jsonl" --output_dir "$W/$out" \
        --overwrite_output_dir --per_device_train_batch_size 4 --max_source_length 64 --max_target_length 64 \
        --max_steps 20 --save_strategy no --report_to none --disable_tqdm "$@" >"$W/$out.log" 2>&1 ||
        { echo "FAIL adapter_check_train_$out"; tail -4 "$W/$out.log"; }
}
train base --init_from_config "$W/tiny.json" --learning_rate 1e-3
cp "$TOKENIZER"/* "$W/base/" 2>/dev/null
train lora --model_name_or_path "$W/base" --finetuning_type lora --lora_rank 8 --lora_target all --learning_rate 2e-3
train pt --model_name_or_path "$W/base" --finetuning_type ptuning --pre_seq_len 8 --learning_rate 2e-2
gen() { timeout 120 "$GLM" generate --model_name_or_path "$W/base" --prompt "你好" --do_sample false --max_new_tokens 12 "$@" 2>"$W/gen.err"; }
fail=0
base=$(gen)
for ad in lora pt; do
    whole=$(gen --adapter "$W/$ad")
    split=$(gen --adapter "$W/$ad" --device_map auto --pipeline_parallel_size 1)
    note=""; [ "$whole" = "$base" ] && note=" (the base's greedy text too)"
    if [ -n "$whole" ] && [ "$whole" = "$split" ]; then echo "PASS generate_device_map_adapter_$ad: $whole$note"
    else echo "FAIL generate_device_map_adapter_$ad: '$split' vs '$whole'"; tail -3 "$W/gen.err"; fail=1; fi
done
# a quantized base through the pipeline's code (session 19: it used to load float weights there)
for q in "--quantization_bit 4" "--quantization_bit 8" "--quantization_bit 4 --quantization_type nf4"; do
    # shellcheck disable=SC2086
    whole=$(gen $q); split=$(gen $q --device_map auto --pipeline_parallel_size 1)
    if [ -n "$whole" ] && [ "$whole" = "$split" ]; then echo "PASS generate_device_map_quantized ($q): $whole"
    else echo "FAIL generate_device_map_quantized ($q): '$split' vs '$whole'"; tail -3 "$W/gen.err"; fail=1; fi
done
serve_check() { # name, model field, what generate --adapter gave, serve flags...
    local name=$1 field=$2 want=$3
    shift 3
    "$GLM" serve --model_name_or_path "$W/base" --port 18777 "$@" >"$W/$name.log" 2>&1 &
    local pid=$! got
    for _ in $(seq 120); do grep -q "serving" "$W/$name.log" && break; sleep 0.5; done
    got=$(python3 - "$field" <<'PY'
import json, sys, urllib.request
body = {"model": sys.argv[1], "messages": [{"role": "user", "content": "你好"}], "temperature": 0, "max_tokens": 12,
        "logprobs": True, "top_logprobs": 2}
req = urllib.request.Request("http://127.0.0.1:18777/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
ch = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]
lp = ch["logprobs"]["content"]  # greedy: every token the first of its alternatives, log-probabilities <= 0
ok = lp and all(e["top_logprobs"][0]["token"] == e["token"] and e["logprob"] <= 1e-6 for e in lp)
print(ch["message"]["content"] if ok else "logprobs wrong: %s" % lp)
PY
)
    kill -TERM $pid; wait $pid
    if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "PASS $name: $got"
    else echo "FAIL $name: '$got' vs generate '$want'"; tail -4 "$W/$name.log"; fail=1; fi
}
serve_check serve_ptuning_checkpoint base "$(gen --adapter "$W/pt")" --ptuning_checkpoint "$W/pt"
serve_check serve_ptuning_device_map base "$(gen --adapter "$W/pt")" --ptuning_checkpoint "$W/pt" --device_map auto --pipeline_parallel_size 1
serve_check serve_lora_device_map l "$(gen --adapter "$W/lora")" --adapter "l=$W/lora" --device_map auto --pipeline_parallel_size 1
exit $fail
