#!/usr/bin/env bash
# Quality of a quantized base, measured (issue 17): the same LoRA training on the `make demo`
# model (a small GLM trained from scratch on the Tang/Song poem set) stored as float32, INT8,
# INT4 and NF4, then the mean loss on the held-out set (demo-out/data/val.json). CPU only: the
# CPU computes in float32, so "float32" stands for the unquantized base. Prints one line per
# base: held-out loss of the base before training and after it. Writes docs-ready lines to
# $OUT/quant_quality.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=${DEMO_OUT:-demo-out}
OUT=${OUT:-/tmp/glm-quant-quality}
STEPS=${STEPS:-150}
G=${GLM:-build/glmtrain}
[ -f "$DEMO/model/config.json" ] || { echo "run make demo first (needs $DEMO/model)"; exit 1; }
mkdir -p "$OUT"
: > "$OUT/quant_quality.txt"
eval_loss() { grep -ao "'eval_loss': [0-9.]*" "$1" | tail -1 | awk '{print $2}'; }
for q in none 8 4 nf4; do
    case $q in
        none) flags=(); name=float32 ;;
        nf4) flags=(--quantization_type nf4); name=nf4 ;;
        *) flags=(--quantization_bit "$q"); name=int$q ;;
    esac
    common=(--model_name_or_path "$DEMO/model" --train_file "$DEMO/data/train.json" --validation_file "$DEMO/data/val.json"
            --finetuning_type lora --lora_rank 8 --lora_target all --lora_dropout 0.05 --per_device_train_batch_size 16
            --learning_rate 1e-3 --lr_scheduler_type constant --max_source_length 48 --max_target_length 128 --seed 7
            --disable_tqdm true --report_to none --save_strategy no --eval_strategy steps --logging_steps 50 "${flags[@]}")
    rm -rf "$OUT/$name"
    # the base as it is: one step at learning rate 0, evaluated
    "$G" train "${common[@]}" --output_dir "$OUT/$name-base" --overwrite_output_dir --max_steps 1 --learning_rate 0 \
        --eval_steps 1 --save_final_model false > "$OUT/$name-base.log" 2>&1
    "$G" train "${common[@]}" --output_dir "$OUT/$name" --max_steps "$STEPS" --eval_steps "$STEPS" > "$OUT/$name.log" 2>&1
    line="$name base: held-out loss $(eval_loss "$OUT/$name-base.log") before, $(eval_loss "$OUT/$name.log") after $STEPS LoRA steps"
    echo "$line" | tee -a "$OUT/quant_quality.txt"
done
