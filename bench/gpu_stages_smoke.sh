#!/usr/bin/env bash
# Session 35's command-line paths on a GPU, end to end on a tiny ChatGLM-6B-shaped model with the real
# tokenizer: `glmtrain eval` (an MMLU-layout task) on CUDA in fp32 gives the CPU's predictions;
# --stage rm in bf16 with LoRA trains and scores the test pairs (--do_predict); --stage kto in bf16
# starts at loss 0.5 and trains; `serve` scores the rm output's pairs on CUDA as on the CPU (fp32) and
# near --do_predict (bf16). Each step prints PASS/FAIL. Needs build/gpu/glmtrain (MPI=0), build/lib
# (with libmicrohttpd's chain: SERVE=1 bash bench/prepare_carry.sh), build/shared (tokenizers/chatglm-6b), python3.
# usage: bash bench/gpu_stages_smoke.sh [BUILD_DIR]
set -u
. "$(dirname "$0")/lib.sh"
smoke_setup stages "${1:-}"
ok() { smoke_ok "$@"; }
cat >"$W/config.json" <<'J'
{"model_type": "chatglm", "vocab_size": 130528, "hidden_size": 256, "num_layers": 2, "num_attention_heads": 4,
 "inner_hidden_size": 1024, "max_sequence_length": 1024, "layernorm_epsilon": 1e-5, "position_encoding_2d": true,
 "mask_token_id": 130000, "gmask_token_id": 130001, "bos_token_id": 130004, "eos_token_id": 130005, "pad_token_id": 3}
J
python3 - "$W" <<'PY'
import csv, json, os, random, sys
w = sys.argv[1]
g = random.Random(5)
words = ["春", "风", "山", "水", "明月", "江南", "问题", "答案"]
pairs = [{"instruction": "写一句关于%s的诗" % x, "chosen": x * 3, "rejected": words[(i + 1) % 8] * 2} for i, x in enumerate(words * 4)]
json.dump(pairs, open(os.path.join(w, "pairs.json"), "w"), ensure_ascii=False)
kto = [{"instruction": p["instruction"], "output": p["chosen"] if i % 2 else p["rejected"], "kto_tag": bool(i % 2)}
       for i, p in enumerate(pairs)]
json.dump(kto, open(os.path.join(w, "kto.json"), "w"), ensure_ascii=False)
json.dump([{"instruction": p["instruction"], "output": p["chosen"]} for p in pairs], open(os.path.join(w, "sft.json"), "w"),
          ensure_ascii=False)
d = os.path.join(w, "evaluation", "mmlu")
json.dump({"s1": {"name": "subject one", "category": "STEM"}, "s2": {"name": "subject two", "category": "Other"}},
          open(os.path.join(os.makedirs(d) or d, "mapping.json"), "w"))
for s in ("s1", "s2"):
    for split, n in (("dev", 3), ("test", 12)):
        os.makedirs(os.path.join(d, "data", split), exist_ok=True)
        with open(os.path.join(d, "data", split, "%s_%s.csv" % (s, split)), "w", newline="") as f:
            wr = csv.writer(f)
            for i in range(n):
                wr.writerow(["".join(g.choice(words) for _ in range(5))] + ["".join(g.choice(words) for _ in range(2))
                                                                           for _ in range(4)] + ["ABCD"[g.randint(0, 3)]])
PY
"$B/glmtrain" train --init_from_config "$W/config.json" --tokenizer_name "$TOK" --train_file "$W/sft.json" \
    --output_dir "$W/base" --max_steps 2 --per_device_train_batch_size 8 --disable_tqdm --device cpu >"$W/log" 2>&1
ok $? "base_model"
for dev in cpu cuda; do
    "$B/glmtrain" eval --model_name_or_path "$W/base" --task mmlu_test --task_dir "$W/evaluation" --n_shot 2 \
        --batch_size 5 --device "$dev" --dtype float32 --save_dir "$W/eval_$dev" >"$W/log" 2>&1
    ok $? "eval_$dev"
done
cmp -s "$W/eval_cpu/results.json" "$W/eval_cuda/results.json"
ok $? "eval_cuda_predictions_equal_the_cpu"
cat "$W/eval_cuda/results.log"; echo
"$B/glmtrain" train --model_name_or_path "$W/base" --train_file "$W/pairs.json" --stage rm --finetuning_type lora \
    --lora_target all --bf16 --max_steps 6 --per_device_train_batch_size 4 --learning_rate 5e-3 --logging_steps 1 \
    --disable_tqdm --output_dir "$W/rm" --do_predict --test_file "$W/pairs.json" >"$W/log" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$W/rm/generated_predictions.jsonl")" -eq 32 ] && [ -s "$W/rm/value_head.safetensors" ]
ok $? "rm_bf16_trains_and_scores"
grep -o "'predict_[a-z]*': [0-9.]*" "$W/log" | paste -sd' '
"$B/glmtrain" train --model_name_or_path "$W/base" --train_file "$W/kto.json" --stage kto --finetuning_type lora \
    --lora_target all --bf16 --max_steps 6 --per_device_train_batch_size 4 --learning_rate 5e-3 --logging_steps 1 \
    --disable_tqdm --output_dir "$W/kto" >"$W/log" 2>&1
rc=$?
first=$(grep -o "'loss': [0-9.]*" "$W/log" | head -1 | cut -d' ' -f2)
[ $rc -eq 0 ] && [ "$first" = "0.5000" ]
ok $? "kto_bf16_first_loss_half"
grep -o "'loss': [0-9.]*" "$W/log" | paste -sd' '
# the rm output served (POST /v1/score/evaluation): its scores on CUDA in fp32 equal the CPU's, and in bf16
# stay near --do_predict's (bf16, two decimals). serve needs libmicrohttpd's chain in build/lib
# (SERVE=1 bash bench/prepare_carry.sh).
for how in "cpu float32" "cuda float32" "cuda bfloat16"; do
    set -- $how
    serve_start "$W/serve_$1_$2.log" --model_name_or_path "$W/base" --adapter rm="$W/rm" --device "$1" --dtype "$2"
    python3 - "$W" "$SERVE_PORT" "$W/scores_$1_$2.json" <<'PY'
import json, sys, urllib.request
w, port, out = sys.argv[1:4]
pairs = json.load(open(w + "/pairs.json"))
msgs = [{"prompt": p["instruction"], "response": p[k]} for p in pairs for k in ("chosen", "rejected")]
req = urllib.request.Request("http://127.0.0.1:%s/v1/score/evaluation" % port, headers={"Content-Type": "application/json"},
                             data=json.dumps({"model": "rm", "messages": msgs}, ensure_ascii=False).encode())
json.dump(json.load(urllib.request.urlopen(req, timeout=120))["scores"], open(out, "w"))
PY
    ok $? "serve_score_$1_$2"
    serve_stop
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
cpu, cu32, cu16 = (json.load(open("%s/scores_%s.json" % (w, k))) for k in ("cpu_float32", "cuda_float32", "cuda_bfloat16"))
preds = [json.loads(l) for l in open(w + "/rm/generated_predictions.jsonl")]
e32 = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(cu32, cpu))
pred = [v for p in preds for v in (p["chosen"], p["rejected"])]
e16 = max(abs(a - b) for a, b in zip(cu16, pred))
print("serve scores: cuda fp32 vs cpu worst relative %.2e; cuda bf16 vs --do_predict (bf16) worst %.4f; %d scores" % (e32, e16, len(cpu)))
sys.exit(0 if len(cpu) == len(cu32) == len(cu16) == len(pred) and e32 < 1e-3 and e16 < 0.1 else 1)
PY
ok $? "serve_score_cuda_equals_cpu_and_do_predict"
rm -rf "$W"
