#!/usr/bin/env bash
# --stage dpo, rm and kto on ChatGLM-6B's shapes (one GPU, docs/DPO.md): LoRA r=8 on query_key_value from a random
# base (--init_from_config), bf16, the guide's data (build/shared/guide-data) as SFT with micro-batch 8
# and as preference pairs with micro-batch 4 (8 rows: each record's answer chosen, the next record's
# answer rejected) under --stage dpo and --stage rm (the value head), and as KTO examples (every other
# one desirable; each beside its KL example: 8 rows), steps 1-12 logged, so the
# steps' tokens/s stand side by side; the reference
# pass's time is in the DPO log. Needs build/gpu/glmtrain, build/lib, build/shared/{cfg6b,guide-data,
# tokenizers/chatglm-6b}, python3. Logs in $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=build/gpu/glmtrain S=build/shared
python3 - "$S/guide-data/train.json" /tmp/pairs.json <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = [{"instruction": r.get("instruction", r.get("content", "")), "input": r.get("input", ""),
        "chosen": r.get("output", r.get("summary", "")),
        "rejected": recs[(i + 1) % len(recs)].get("output", recs[(i + 1) % len(recs)].get("summary", ""))}
       for i, r in enumerate(recs)]
json.dump(out, open(sys.argv[2], "w"), ensure_ascii=False)
kto = [{"instruction": r.get("instruction", r.get("content", "")), "input": r.get("input", ""),
        "output": r.get("output", r.get("summary", "")), "kto_tag": i % 2 == 0} for i, r in enumerate(recs)]
json.dump(kto, open("/tmp/kto.json", "w"), ensure_ascii=False)
PY
COMMON="--init_from_config $S/cfg6b/config.json --tokenizer_name $S/tokenizers/chatglm-6b --max_source_length 64
 --max_target_length 192 --disable_tqdm --report_to none --bf16 --finetuning_type lora --lora_rank 8
 --lora_target query_key_value --max_steps ${STEPS:-12} --logging_steps 1 --save_strategy no --learning_rate 1e-4
 --max_train_samples 256 --overwrite_output_dir --seed 3"
timeout 300 $G train $COMMON --train_file $S/guide-data/train.json --output_dir /tmp/sft6b --per_device_train_batch_size 8 \
    >"$OUT/sft6b.txt" 2>&1
echo "sft: exit $?"
timeout 300 $G train $COMMON --stage dpo --train_file /tmp/pairs.json --output_dir /tmp/dpo6b --per_device_train_batch_size 4 \
    >"$OUT/dpo6b.txt" 2>&1
echo "dpo: exit $?"
timeout 300 $G train $COMMON --stage rm --train_file /tmp/pairs.json --output_dir /tmp/rm6b --per_device_train_batch_size 4 \
    >"$OUT/rm6b.txt" 2>&1
echo "rm: exit $?"
timeout 300 $G train $COMMON --stage kto --train_file /tmp/kto.json --output_dir /tmp/kto6b --per_device_train_batch_size 4 \
    >"$OUT/kto6b.txt" 2>&1
echo "kto: exit $?"
for f in sft6b dpo6b rm6b kto6b; do
    echo "== $f"
    grep -E "reference|error|hint" "$OUT/$f.txt" | head -5
    grep -oE "'loss': [0-9.]+|'tokens_per_second': [0-9]+|'rewards/accuracies': [0-9.]+" "$OUT/$f.txt" | paste -sd' ' | cut -c1-1500
done
