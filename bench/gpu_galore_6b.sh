#!/usr/bin/env bash
# GaLore on ChatGLM-6B's shapes (one GPU): full fine-tuning with --use_galore (rank 16, every
# linear module) from a random base (--init_from_config), bf16, micro-batch 4 x 256 with
# checkpointing, a new projection every 4 steps, each log line stamped with the time, so the
# steps that take the SVDs (1, 5, 9) show their cost beside the others; nvidia-smi's peak memory
# beside the run, the plan before it; LAYERWISE=1 adds --galore_layerwise (the update inside
# backward, no whole-model gradient buffer). Needs build/gpu/glmtrain, build/lib,
# build/shared/{cfg6b,guide-data,tokenizers/chatglm-6b}. Logs in $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=build/gpu/glmtrain S=build/shared
TOK="--tokenizer_name $S/tokenizers/chatglm-6b"
DATA="--train_file $S/guide-data/train.json --max_source_length 64 --max_target_length 192 --disable_tqdm --report_to none"
$G info --init_from_config $S/cfg6b/config.json --bf16 --use_galore --per_device_train_batch_size 4 \
    --max_source_length 64 --max_target_length 192 --gradient_checkpointing ${LAYERWISE:+--galore_layerwise} |
    grep -E "GaLore|total|moments|^  0 "
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/galore_mem.txt" &
SMI=$!
t0=$SECONDS
timeout ${LIMIT:-400} $G train --init_from_config $S/cfg6b/config.json $TOK $DATA --output_dir /tmp/galore6b --bf16 \
    --use_galore --galore_rank 16 --galore_update_interval 4 --per_device_train_batch_size 4 --gradient_checkpointing \
    --overwrite_output_dir \
    --max_steps ${STEPS:-10} --learning_rate 1e-5 --logging_steps 1 --save_strategy no --seed 3 \
    ${LAYERWISE:+--galore_layerwise} 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$line"; done >"$OUT/galore6b.txt"
echo "galore 6B: exit ${PIPESTATUS[0]} in $((SECONDS - t0)) s"
kill $SMI 2>/dev/null
echo "nvidia-smi peak during the run: $(sort -n "$OUT/galore_mem.txt" | tail -1) MiB (the CUDA context included)"
grep -E "GaLore|memory plan|total|'loss'|error|hint|trained" "$OUT/galore6b.txt" | head -30
