#!/usr/bin/env bash
# BAdam on the guide's card size (one GPU): a ChatGLM-6B-shaped base (random weights, written once
# by a zero-learning-rate step, as bench/gpu_guide_lora.sh), then full fine-tuning of every layer
# in turn with --use_badam under --max_memory_per_gpu 24GiB on instruction data
# (scripts/make_demo_data.py), a checkpoint halfway and the final model in bf16, nvidia-smi's
# peak memory beside the run, then chat with the result. Needs build/gpu/glmtrain, build/lib,
# build/shared/{cfg6b,guide-data,tokenizers/chatglm-6b}. Logs in $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=build/gpu/glmtrain S=build/shared W=/tmp/guide
TOK="--tokenizer_name $S/tokenizers/chatglm-6b"
DATA="--train_file $S/guide-data/train.json --max_source_length 64 --max_target_length 192 --disable_tqdm --report_to none"
t0=$SECONDS
# (the base written by a BAdam step at rate 0: full fine-tuning's plan does not fit an 80 GB card)
[ -f $W/base/config.json ] || timeout 200 $G train --init_from_config $S/cfg6b/config.json $TOK $DATA --output_dir $W/base \
    --bf16 --use_badam --max_steps 1 --learning_rate 0 --per_device_train_batch_size 1 --save_strategy no \
    --save_dtype bfloat16 >"$OUT/base.txt" 2>&1
echo "base: exit $? in $((SECONDS - t0)) s; $(du -sh $W/base 2>/dev/null | cut -f1)"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/badam_mem.txt" &
SMI=$!
t0=$SECONDS
timeout 420 $G train --model_name_or_path $W/base $TOK $DATA --output_dir $W/badam --bf16 --use_badam \
    --badam_switch_interval 10 --max_memory_per_gpu 24GiB --per_device_train_batch_size 4 --gradient_checkpointing \
    --max_steps 120 --learning_rate 1e-4 --warmup_steps 10 --logging_steps 20 --save_steps 60 --save_dtype bfloat16 \
    >"$OUT/badam.txt" 2>&1
echo "badam: exit $? in $((SECONDS - t0)) s"
kill $SMI 2>/dev/null
echo "nvidia-smi peak during the run: $(sort -n "$OUT/badam_mem.txt" | tail -1) MiB (the CUDA context included)"
grep -E "memory plan|fits|BAdam|^\{'loss'|GiB|saved|trained|error|hint" "$OUT/badam.txt" | grep -v "^\s*\"" | head -40
du -sh $W/badam/checkpoint-60 $W/badam 2>/dev/null
printf '背诵杜甫的《佳人》\nexit\n' | timeout 120 $G chat --model_name_or_path $W/badam $TOK --do_sample false \
    --max_new_tokens 24 >"$OUT/chat.txt" 2>&1
echo "chat: exit $?"; tail -4 "$OUT/chat.txt"
