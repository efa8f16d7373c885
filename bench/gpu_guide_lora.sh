#!/usr/bin/env bash
# The guide's scenario on one GPU (issue 16): a ChatGLM-6B-shaped base (random weights: no real
# checkpoint can be fetched here; written once by a zero-learning-rate step), then LoRA under
# --max_memory_per_gpu 24GiB on instruction data (scripts/make_demo_data.py) for 220 steps, then
# chat --adapter on the result. Needs build/gpu/glmtrain, build/lib, build/shared/{cfg6b,
# guide-data,tokenizers/chatglm-6b}. Logs in $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=build/gpu/glmtrain S=build/shared W=/tmp/guide
TOK="--tokenizer_name $S/tokenizers/chatglm-6b"
DATA="--train_file $S/guide-data/train.json --max_source_length 64 --max_target_length 192 --disable_tqdm --report_to none"
t0=$SECONDS
timeout 200 $G train --init_from_config $S/cfg6b/config.json $TOK $DATA --output_dir $W/base --bf16 --max_steps 1 \
    --learning_rate 0 --per_device_train_batch_size 1 --save_strategy no --save_dtype bfloat16 >"$OUT/base.txt" 2>&1
echo "base: exit $? in $((SECONDS - t0)) s; $(du -sh $W/base 2>/dev/null | cut -f1)"
t0=$SECONDS
timeout 300 $G train --model_name_or_path $W/base $TOK $DATA --output_dir $W/lora --bf16 --finetuning_type lora \
    --lora_rank 8 --lora_target query_key_value --max_memory_per_gpu 24GiB --per_device_train_batch_size 4 \
    --gradient_checkpointing --max_steps 220 --learning_rate 2e-3 --warmup_steps 10 --logging_steps 20 --save_steps 100 \
    >"$OUT/lora.txt" 2>&1
echo "lora: exit $? in $((SECONDS - t0)) s"
grep -E "memory plan|fits|trainable|^\{'loss'|GiB|saved|error|hint" "$OUT/lora.txt" | grep -v "^\s*\"" | head -40
ls -la $W/lora | head -20
printf '背诵杜甫的《佳人》\nexit\n' | timeout 120 $G chat --model_name_or_path $W/base --adapter $W/lora $TOK --do_sample false \
    --max_new_tokens 48 >"$OUT/chat.txt" 2>&1
echo "chat: exit $?"; tail -6 "$OUT/chat.txt"
