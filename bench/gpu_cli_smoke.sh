#!/usr/bin/env bash
# The CLI on a GPU, end to end on a tiny ChatGLM-6B-shaped model with the real tokenizer:
# CSV training data (checkpoints of the model alone), the model named as on the Hub from a Hugging Face cache laid out as
# huggingface_hub writes it, LoRA in bf16 with --eval_on_start (examples cut by --cutoff_len, with a --default_system), then generate with the adapter;
# DoRA on all four modules, generate with it and with its merged model; LoRA with the final norm
# whole beside it (--additional_target), the same; freeze with LLaMA-Factory's module flags; PiSSA
# and its converted form; a list of adapters and a new adapter on merged ones; BAdam; GaLore; LLaMA Pro.
# Each step prints PASS/FAIL. Needs build/gpu/glmtrain (MPI=0), build/lib, build/shared.
# usage: bash bench/gpu_cli_smoke.sh [BUILD_DIR]
set -u
B=${1:-build/gpu}
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
TOK=$PWD/build/shared/tokenizers/chatglm-6b/ice_text.model
W=$(mktemp -d /tmp/glm-smoke.XXXXXX)
"$B/glmtrain" --version
snap=$W/hf/hub/models--THUDM--tiny-glm/snapshots/0123abcd
mkdir -p "$snap" "$W/hf/hub/models--THUDM--tiny-glm/refs"
printf 0123abcd >"$W/hf/hub/models--THUDM--tiny-glm/refs/main"
cat >"$W/config.json" <<'J'
{"model_type": "chatglm", "vocab_size": 130528, "hidden_size": 256, "num_layers": 2, "num_attention_heads": 4,
 "inner_hidden_size": 1024, "max_sequence_length": 512, "layernorm_epsilon": 1e-5, "position_encoding_2d": true,
 "mask_token_id": 130000, "gmask_token_id": 130001, "bos_token_id": 130004, "eos_token_id": 130005, "pad_token_id": 3}
J
printf 'instruction,output\n' >"$W/train.csv"
for i in $(seq 1 64); do printf '"写一句诗, 第%d句","春风%d,""明月""\n照江南"\n' "$i" "$i" >>"$W/train.csv"; done
printf 'instruction,output\n"问题一","答案一"\n"问题二","答案二"\n' >"$W/val.csv"
ok() { if [ "$1" -eq 0 ]; then echo "PASS $2"; else echo "FAIL $2"; tail -5 "$W/log"; fi; }
# generate with the adapter $W/$1 and with the model merge writes from it: the same greedy answer
# (fp32 on the GPU); PASS/FAIL as ${2:-$1}_generate_equals_merged
generate_equals_merged() {
    local base=${3:-$W/base}
    "$B/glmtrain" generate --model_name_or_path "$base" --tokenizer_name "$TOK" --adapter "$W/$1" --prompt "写一句诗" \
        --dtype float32 --max_new_tokens 8 >"$W/out_$1" 2>"$W/log" &&
        "$B/glmtrain" merge --model_name_or_path "$base" --adapter "$W/$1" --output_dir "$W/merged_$1" --dtype float32 \
            >>"$W/log" 2>&1 &&
        "$B/glmtrain" generate --model_name_or_path "$W/merged_$1" --tokenizer_name "$TOK" --prompt "写一句诗" --dtype float32 \
            --max_new_tokens 8 >"$W/out_merged_$1" 2>>"$W/log"
    local rc=$?
    cat "$W/out_$1" "$W/out_merged_$1"
    cmp -s "$W/out_$1" "$W/out_merged_$1"
    ok $((rc + $?)) "${2:-$1}_generate_equals_merged"
}
"$B/glmtrain" train --init_from_config "$W/config.json" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --output_dir "$W/base" --max_steps 4 --bf16 --per_device_train_batch_size 8 --disable_tqdm \
    --save_steps 2 --save_only_model true >"$W/log" 2>&1
ok $? "full_bf16_from_csv"
# --save_only_model: the checkpoint of the last step is the final model's bytes, with no optimizer state
cmp -s "$W/base/checkpoint-4/model.safetensors" "$W/base/model.safetensors" && [ ! -e "$W/base/checkpoint-4/optimizer.safetensors" ]
ok $? "save_only_model_checkpoint_is_the_final_model"
cp "$W"/base/*.json "$W"/base/*.safetensors "$snap"/ 2>/dev/null; cp "$TOK" "$snap"/
HF_HOME=$W/hf "$B/glmtrain" train --model_name_or_path THUDM/tiny-glm --train_file "$W/train.csv" --validation_file "$W/val.csv" \
    --finetuning_type lora --output_dir "$W/lora" --max_steps 6 --bf16 --per_device_train_batch_size 8 --eval_on_start \
    --logging_steps 2 --save_steps 6 --disable_tqdm --cutoff_len 16 --default_system "你是诗人" >"$W/log" 2>&1
rc=$?
grep -q "cache's snapshot $snap" "$W/log" && grep -q "'step': 0}" "$W/log" && grep -q "longest 16," "$W/log" && grep -q 'base_model_name_or_path":[[:space:]]*"THUDM/tiny-glm"' "$W/lora/adapter_config.json"
ok $((rc + $?)) "lora_bf16_hub_name_eval_on_start"
grep -E "eval_loss|'loss'" "$W/log" | head -4
HF_HOME=$W/hf "$B/glmtrain" generate --model_name_or_path THUDM/tiny-glm --adapter "$W/lora" --prompt "写一句诗" \
    --max_new_tokens 8 >"$W/out" 2>"$W/log"
ok $? "generate_with_adapter_on_gpu"
grep -E 'loaded|cuda' "$W/log" | head -2
# DoRA in bf16 on all four modules: the loss falls, the adapter loads in generate, and merge
# writes a model whose greedy answer is the adapter's
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type lora \
    --use_dora --lora_target all --learning_rate 2e-3 --output_dir "$W/dora" --max_steps 12 --bf16 \
    --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 --disable_tqdm >"$W/log" 2>&1
rc=$?
grep -E "'loss'" "$W/log" | head -3
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log"
ok $((rc + $?)) "dora_bf16_all_modules_loss_falls"
generate_equals_merged dora
# LoRA with peft's modules_to_save (--additional_target final_layernorm) in bf16: the loss falls,
# the folder names it, and generate with the adapter equals generate with its merged model
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type lora \
    --additional_target final_layernorm --learning_rate 2e-3 --output_dir "$W/mts" --max_steps 12 --bf16 \
    --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q '"final_layernorm"' "$W/mts/adapter_config.json"
ok $((rc + $?)) "lora_modules_to_save_bf16_loss_falls"
generate_equals_merged mts lora_modules_to_save
# freeze with LLaMA-Factory's flags in bf16: the first layer's MLP and the (tied) embedding train
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type freeze \
    --freeze_trainable_layers -1 --freeze_trainable_modules mlp --freeze_extra_modules word_embeddings --learning_rate 1e-3 \
    --output_dir "$W/freeze" --max_steps 12 --bf16 --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 \
    --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q "freeze: layer 0 (mlp) and word_embeddings train" "$W/log"
ok $((rc + $?)) "freeze_first_layer_mlp_and_embedding_bf16_loss_falls"
# PiSSA in bf16 (its SVD on the host, the residual written back into the GPU's bf16 base): the
# loss falls; the folder (with pissa_init/) generates as its merged model and as its converted form
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type lora \
    --pissa_init --pissa_convert --lora_dropout 0 --learning_rate 2e-3 --output_dir "$W/pissa" --max_steps 12 --bf16 \
    --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q "PiSSA: the adapters start from" "$W/log" && [ -f "$W/pissa/pissa_converted/adapter_model.safetensors" ]
ok $((rc + $?)) "pissa_bf16_loss_falls"
generate_equals_merged pissa
"$B/glmtrain" generate --model_name_or_path "$W/base" --tokenizer_name "$TOK" --adapter "$W/pissa/pissa_converted" \
    --prompt "写一句诗" --dtype float32 --max_new_tokens 8 >"$W/out_conv" 2>"$W/log"
rc=$?
cmp -s "$W/out_pissa" "$W/out_conv"
ok $((rc + $?)) "pissa_generate_equals_converted"
# PiSSA's start in bf16 evaluates as the base (the residual subtracts the adapter's own 16-bit
# values): its eval loss at rate 0 against plain LoRA's (B = 0), within 2e-4
for k in pissa lora; do
    "$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type lora \
        --lora_target all --lora_dropout 0 --learning_rate 0 --output_dir "$W/start_$k" --max_steps 1 --bf16 \
        --per_device_train_batch_size 8 --save_strategy no --disable_tqdm --validation_file "$W/train.csv" --do_eval \
        $([ $k = pissa ] && echo --pissa_init) >"$W/log_$k" 2>&1
done
python3 - "$W" <<'P'
import json, sys
e = [json.load(open("%s/start_%s/eval_results.json" % (sys.argv[1], k)))["eval_loss"] for k in ("pissa", "lora")]
print("start eval loss: PiSSA %.7f, plain LoRA %.7f, rel %.2g" % (e[0], e[1], abs(e[0] - e[1]) / e[1]))
sys.exit(0 if abs(e[0] - e[1]) <= 2e-4 * e[1] else 1)
P
ok $? "pissa_bf16_start_evaluates_as_base"
# QPiSSA: PiSSA on an INT4 base (the SVD of the float weights, the residual quantized): the loss falls
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --finetuning_type lora \
    --pissa_init --quantization_bit 4 --lora_target all --learning_rate 2e-3 --output_dir "$W/qpissa" --max_steps 12 --bf16 \
    --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    "$B/glmtrain" generate --model_name_or_path "$W/base" --tokenizer_name "$TOK" --adapter "$W/qpissa" --quantization_bit 4 \
        --prompt "写一句诗" --max_new_tokens 8 >"$W/out_q" 2>>"$W/log"
ok $((rc + $?)) "qpissa_int4_loss_falls_and_generates"
# LLaMA-Factory's adapter list: the DoRA adapter merged into the base as it loads, the LoRA one
# beside it, equals the LoRA one on the merged DoRA folder (fp32); a new adapter on top trains
"$B/glmtrain" generate --model_name_or_path "$W/base" --tokenizer_name "$TOK" --adapter_name_or_path "$W/dora,$W/lora" \
    --prompt "写一句诗" --dtype float32 --max_new_tokens 8 >"$W/out_list" 2>"$W/log" &&
    "$B/glmtrain" generate --model_name_or_path "$W/merged_dora" --tokenizer_name "$TOK" --adapter "$W/lora" \
        --prompt "写一句诗" --dtype float32 --max_new_tokens 8 >"$W/out_list_ref" 2>>"$W/log"
rc=$?
cat "$W/out_list" "$W/out_list_ref"
cmp -s "$W/out_list" "$W/out_list_ref"
ok $((rc + $?)) "adapter_list_generate_equals_merged_folder"
"$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --adapter_name_or_path "$W/dora" --create_new_adapter --finetuning_type lora --learning_rate 2e-3 --output_dir "$W/new" \
    --max_steps 12 --bf16 --per_device_train_batch_size 8 --logging_steps 4 --save_steps 12 --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q "merged into the base as it loads" "$W/log"
ok $((rc + $?)) "create_new_adapter_bf16_loss_falls"
# BAdam (--use_badam): one layer at a time; bf16 with a resume from inside a round bit-identical to
# the straight run (--full_determinism: products tuned by timing could pick other kernels in the
# resumed run), and CUDA fp32 against the CPU over the same steps (every trained weight within 1e-4)
badam() { # $1 output folder, then extra flags
    local out=$1; shift
    "$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --use_badam \
        --badam_switch_interval 3 --learning_rate 1e-3 --output_dir "$W/$out" --max_steps 8 --per_device_train_batch_size 8 \
        --logging_steps 2 --save_steps 4 --disable_tqdm --seed 3 "$@" >"$W/log_$out" 2>&1
}
# What the optimizer steps below share. $1: the function that runs one (badam, galore), with
# its output folder and extra flags.
# The straight bf16 run (its log kept as log_$1_straight), then a resume from checkpoint-4 with
# the same flags: bit-identical final weights (--full_determinism: products tuned by timing could
# pick other kernels in the resumed run).
resume_bit_identical() {
    local run=$1
    $run "${run}_bf16" --bf16 --full_determinism
    local rc=$?
    cp "$W/${run}_bf16/model.safetensors" "$W/${run}_straight.safetensors"
    cp "$W/log_${run}_bf16" "$W/log_${run}_straight"
    $run "${run}_bf16" --bf16 --full_determinism --resume_from_checkpoint "$W/${run}_bf16/checkpoint-4"
    rc=$((rc + $?))
    cmp -s "$W/${run}_bf16/model.safetensors" "$W/${run}_straight.safetensors"
    return $((rc + $?))
}
# fp32 on CUDA and on the CPU over the same steps: every weight (whose name holds $2, when given)
# within 1e-4. eps 1e-4: AdamW's m/sqrt(v) would turn the two float sums' rounding into update
# noise, as tests/py/test_model_vs_torch.py explains; near-linear updates compare the computations.
fp32_cuda_equals_cpu() {
    local run=$1
    $run "${run}_gpu32" --fp32 --adam_epsilon 1e-4 && $run "${run}_cpu32" --fp32 --adam_epsilon 1e-4 --device cpu
    local rc=$?
    python3 - "$W/${run}_gpu32/model.safetensors" "$W/${run}_cpu32/model.safetensors" "$run" "${2:-}" <<'P'
import json, struct, sys, array
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == "__metadata__" or v["dtype"] != "F32" or sys.argv[4] not in k: continue
        a = array.array("f"); a.frombytes(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]); out[k] = a
    return out
g, c = load(sys.argv[1]), load(sys.argv[2])
worst = max(max(abs(x - y) for x, y in zip(g[k], c[k])) / (max(abs(y) for y in c[k]) or 1) for k in c)
print("%s fp32 CUDA vs CPU, worst relative difference over %d tensors: %.3g" % (sys.argv[3], len(c), worst))
sys.exit(0 if sorted(g) == sorted(c) and worst < 1e-4 else 1)
P
    return $((rc + $?))
}
resume_bit_identical badam
rc=$?
grep -c "BAdam: after step" "$W/log_badam_bf16"
ok $rc "badam_bf16_resume_inside_a_round_bit_identical"
fp32_cuda_equals_cpu badam .layers. # the rest never trains
ok $? "badam_fp32_cuda_equals_cpu"
# GaLore (--use_galore): bf16 with a resume from between two projections bit-identical to the
# straight run (--full_determinism), the loss falling; CUDA fp32 against the CPU over the same
# steps, a new projection at steps 1, 4 and 7 (every weight within 1e-4; eps 1e-4 as for BAdam)
galore() { # $1 output folder, then extra flags
    local out=$1; shift
    "$B/glmtrain" train --model_name_or_path "$W/base" --tokenizer_name "$TOK" --train_file "$W/train.csv" --use_galore \
        --galore_rank 8 --galore_update_interval 3 --learning_rate 1e-3 --weight_decay 0.01 --output_dir "$W/$out" \
        --max_steps 8 --per_device_train_batch_size 8 --logging_steps 1 --save_steps 4 --disable_tqdm --seed 3 "$@" \
        >"$W/log_$out" 2>&1
}
resume_bit_identical galore
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log_galore_straight"
rc=$((rc + $?))
grep -m1 "GaLore:" "$W/log_galore_bf16"
ok $rc "galore_bf16_loss_falls_and_resume_bit_identical"
fp32_cuda_equals_cpu galore
ok $? "galore_fp32_cuda_equals_cpu"
# LLaMA Pro on a ChatGLM2-family model: the expanded folder generates what the original does
# (fp32), and its added blocks train alone in bf16 (the loss falls)
cat >"$W/config2.json" <<'J'
{"model_type": "chatglm", "padded_vocab_size": 130528, "hidden_size": 256, "num_layers": 4, "num_attention_heads": 4,
 "kv_channels": 64, "multi_query_attention": true, "multi_query_group_num": 2, "ffn_hidden_size": 512,
 "layernorm_epsilon": 1e-5, "rmsnorm": true, "add_qkv_bias": true, "add_bias_linear": false,
 "apply_residual_connection_post_layernorm": false, "post_layer_norm": true, "original_rope": true, "seq_length": 512,
 "tie_word_embeddings": false, "eos_token_id": 130005, "pad_token_id": 3}
J
"$B/glmtrain" train --init_from_config "$W/config2.json" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --output_dir "$W/glm2" --max_steps 4 --bf16 --learning_rate 1e-3 --per_device_train_batch_size 8 --disable_tqdm \
    --save_strategy no >"$W/log" 2>&1 &&
    "$B/glmtrain" expand --model_name_or_path "$W/glm2" --num_expand 2 --output_dir "$W/glm2pro" --dtype float32 >>"$W/log" 2>&1
rc=$?
for m in glm2 glm2pro; do
    "$B/glmtrain" generate --model_name_or_path "$W/$m" --tokenizer_name "$TOK" --prompt "写一句诗" --dtype float32 \
        --max_new_tokens 8 >"$W/out_$m" 2>>"$W/log"
    rc=$((rc + $?))
done
cat "$W/out_glm2" "$W/out_glm2pro"
cmp -s "$W/out_glm2" "$W/out_glm2pro"
ok $((rc + $?)) "llama_pro_expanded_generates_as_original"
"$B/glmtrain" train --model_name_or_path "$W/glm2pro" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --finetuning_type freeze --use_llama_pro --freeze_trainable_layers 2 --learning_rate 2e-3 --output_dir "$W/pro" \
    --max_steps 12 --bf16 --per_device_train_batch_size 8 --logging_steps 4 --save_strategy no --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q "LLaMA Pro's added layers 2, 5" "$W/log"
ok $((rc + $?)) "llama_pro_bf16_added_blocks_train"
# ... and LoRA on the added blocks alone (peft's layers_to_transform), generating as its merged model
"$B/glmtrain" train --model_name_or_path "$W/glm2pro" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --finetuning_type lora --use_llama_pro --freeze_trainable_layers 2 --lora_target all --learning_rate 2e-3 \
    --output_dir "$W/prolora" --max_steps 12 --bf16 --per_device_train_batch_size 8 --logging_steps 4 --save_strategy no \
    --disable_tqdm >"$W/log" 2>&1
rc=$?
awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
    grep -q '"layers_to_transform"' "$W/prolora/adapter_config.json"
ok $((rc + $?)) "lora_on_llama_pro_blocks_bf16_loss_falls"
"$B/glmtrain" generate --model_name_or_path "$W/glm2pro" --tokenizer_name "$TOK" --adapter "$W/prolora" --prompt "写一句诗" \
    --dtype float32 --max_new_tokens 8 >"$W/out_prolora" 2>"$W/log" &&
    "$B/glmtrain" merge --model_name_or_path "$W/glm2pro" --adapter "$W/prolora" --output_dir "$W/prolora_merged" \
        --dtype float32 >>"$W/log" 2>&1 &&
    "$B/glmtrain" generate --model_name_or_path "$W/prolora_merged" --tokenizer_name "$TOK" --prompt "写一句诗" \
        --dtype float32 --max_new_tokens 8 >"$W/out_prolora_merged" 2>>"$W/log"
rc=$?
cat "$W/out_prolora" "$W/out_prolora_merged"
cmp -s "$W/out_prolora" "$W/out_prolora_merged"
ok $((rc + $?)) "lora_on_some_layers_generate_equals_merged"
# transformers' GLM layout (GLM-4-9B-chat-hf's block, tiny): DoRA with dropout and PiSSA on peft's
# q_proj, k_proj, v_proj (each row block its own norms and mask, its own SVD), generating as
# their merged models (and PiSSA as its converted form)
cat >"$W/config_hf.json" <<'J'
{"architectures": ["GlmForCausalLM"], "model_type": "glm", "attention_bias": true, "eos_token_id": 130005,
 "head_dim": 64, "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 512,
 "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 3,
 "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": false, "vocab_size": 130528}
J
"$B/glmtrain" train --init_from_config "$W/config_hf.json" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
    --output_dir "$W/base_hf" --max_steps 4 --bf16 --learning_rate 1e-3 --per_device_train_batch_size 8 --disable_tqdm \
    --save_strategy no >"$W/log" 2>&1
ok $? "hf_layout_full_bf16"
for k in dora_hf pissa_hf; do
    "$B/glmtrain" train --model_name_or_path "$W/base_hf" --tokenizer_name "$TOK" --train_file "$W/train.csv" \
        --finetuning_type lora --lora_target all --learning_rate 2e-3 --output_dir "$W/$k" --max_steps 12 --bf16 \
        --per_device_train_batch_size 8 --logging_steps 4 --save_strategy no --disable_tqdm \
        $([ $k = dora_hf ] && echo --use_dora --lora_dropout 0.1 || echo --pissa_init --pissa_convert --lora_dropout 0) \
        >"$W/log" 2>&1
    rc=$?
    awk -F"'loss': " '/.loss.: /{split($2,a,","); v[n++]=a[1]} END{exit !(n>=2 && v[n-1] < v[0])}' "$W/log" &&
        grep -q "k_proj" "$W/$k/adapter_config.json"
    ok $((rc + $?)) "${k}_split_qkv_bf16_loss_falls"
    generate_equals_merged $k "" "$W/base_hf"
done
"$B/glmtrain" generate --model_name_or_path "$W/base_hf" --tokenizer_name "$TOK" --adapter "$W/pissa_hf/pissa_converted" \
    --prompt "写一句诗" --dtype float32 --max_new_tokens 8 >"$W/out_conv_hf" 2>"$W/log"
rc=$?
cmp -s "$W/out_pissa_hf" "$W/out_conv_hf"
ok $((rc + $?)) "pissa_hf_generate_equals_converted"
rm -rf "$W"
