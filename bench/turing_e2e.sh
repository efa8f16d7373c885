#!/usr/bin/env bash
# Turing's paths through `glmtrain` itself, on a newer GPU sent down them by GLM_CUDA_TURING=1
# (no bf16; fp16 tensor-core kernels on m16n8k8, single-buffered in 64 KiB): a run without a precision flag
# stops with the message instead of training on the CPU, as does --tf32; a ChatGLM-6B-shaped LoRA run in fp16
# (loss scaling) trains, loss falling; generate on a saved model picks float16 by itself.
# Build here: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain; carry build/gpu/glmtrain,
# build/lib and build/shared (with tokenizers/chatglm-6b/ice_text.model copied in).
set -u
. "$(dirname "$0")/lib.sh"
find_tokenizer turing_e2e
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 GLM_CUDA_TURING=1
GLM=${GLM:-build/gpu/glmtrain}
W=${WORK:-/tmp/turing-e2e}
w1_workdir "$W" 2
run() { # config, output dir, steps, flags...
    local cfg=$1 out=$2 steps=$3
    shift 3
    timeout 600 "$GLM" train --init_from_config "$W/$cfg" --tokenizer_name "$TOKENIZER" --train_file "$W/w1.jsonl" \
        --output_dir "$W/$out" --overwrite_output_dir --per_device_train_batch_size 4 --max_source_length 256 \
        --max_target_length 256 --learning_rate 1e-4 --max_steps "$steps" --logging_steps 5 --save_strategy no \
        --report_to none --disable_tqdm "$@" 2>&1
}
echo "== 1. no precision flag (bf16) on Turing: stops, names --fp16"
run tiny.json a 2 | grep -iE "error|hint|training on the CPU" | head -4
echo "== 1b. --fp32 --tf32 on Turing: stops (no TF32 before Ampere), as Hugging Face's Trainer"
run tiny.json a 2 --fp32 --tf32 | grep -iE "error|hint" | head -2
echo "== 2. ChatGLM-6B shapes, --fp16 LoRA r8 on query_key_value, 30 steps"
run config.json b 30 --fp16 --finetuning_type lora --lora_rank 8 --lora_target query_key_value --save_final_model false |
    grep -E "'loss'|loss|tok/s|tokens/s|error|warn" | tail -n 9
echo "== 3. a tiny model in fp32, saved; generate without --dtype picks float16"
run tiny.json c 4 --fp32 | grep -iE "error|saved" | head -3
timeout 120 "$GLM" generate --model_name_or_path "$W/c" --tokenizer_name "$TOKENIZER" --prompt "你好" --max_new_tokens 8 2>&1 |
    grep -iE "float16|error|loaded" | head -4
