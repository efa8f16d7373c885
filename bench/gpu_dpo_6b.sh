#!/usr/bin/env bash
# --stage dpo, rm and kto on ChatGLM-6B's shapes (one GPU, docs/DPO.md): LoRA r=8 on query_key_value from a random
# base (--init_from_config), bf16, the guide's data (build/shared/guide-data) as SFT with micro-batch 8
# and as preference pairs with micro-batch 4 (8 rows: each record's answer chosen, the next record's
# answer rejected) under --stage dpo and --stage rm (the value head), and as KTO examples (every other
# one desirable; each beside its KL example: 8 rows), steps 1-12 logged, so the
# steps' tokens/s stand side by side; the reference
# pass's time is in the DPO log. Needs build/gpu/glmtrain, build/lib, build/shared/{cfg6b,guide-data,
# tokenizers/chatglm-6b}, python3. Logs in $OUT. STAGES: a subset, in order (default "sft dpo rm kto");
# G: another glmtrain (an older build, for an A/B in one call).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=${G:-build/gpu/glmtrain} S=build/shared
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
run() { # stage, data, extra flags
    timeout 300 $G train $COMMON ${3:-} --train_file "$2" --output_dir /tmp/${1}6b >"$OUT/${1}6b.txt" 2>&1
    echo "$1: exit $?"
}
for st in ${STAGES:-sft dpo rm kto}; do
    case $st in
    sft) run sft $S/guide-data/train.json "--per_device_train_batch_size 8" ;;
    dpo) run dpo /tmp/pairs.json "--stage dpo --per_device_train_batch_size 4" ;;
    rm) run rm /tmp/pairs.json "--stage rm --per_device_train_batch_size 4" ;;
    kto) run kto /tmp/kto.json "--stage kto --per_device_train_batch_size 4" ;;
    esac
done
for st in ${STAGES:-sft dpo rm kto}; do
    f=${st}6b
    echo "== $f"
    grep -E "reference|error|hint" "$OUT/$f.txt" | head -5
    grep -oE "'loss': [0-9.]+|'tokens_per_second': [0-9]+|'rewards/accuracies': [0-9.]+" "$OUT/$f.txt" | paste -sd' ' | cut -c1-1500
done
