#!/usr/bin/env bash
# LoRA r=8 on GLM-4-9B's shapes (40 layers, vocab 151,552; random weights from --init_from_config),
# THUDM's layout (one adapter on query_key_value) against transformers' (peft's three on q_proj,
# k_proj, v_proj, run block by block by model/peft.c), with dropout and without (the split's
# down-products then run as one), and q_proj,v_proj alone: tokens/s of the last steps of each.
# bf16, micro-batch 8 of the guide's data. EXTRA: more train flags for every run (EXTRA=--use_dora:
# DoRA's, per row block on the split layout); VARIANTS: "layout targets dropout;..." instead of the
# five. Needs build/gpu/glmtrain, build/lib, build/shared/{tokenizers/chatglm-6b,guide-data}.
set -u
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=build/gpu/glmtrain S=build/shared C=$(mktemp -d /tmp/glm-split.XXXXXX)
mkdir -p "$C/thudm" "$C/hf"
cat >"$C/thudm/config.json" <<'J'
{"model_type": "chatglm", "padded_vocab_size": 151552, "hidden_size": 4096, "num_layers": 40, "num_attention_heads": 32,
 "kv_channels": 128, "multi_query_attention": true, "multi_query_group_num": 2, "ffn_hidden_size": 13696,
 "layernorm_epsilon": 1.5625e-07, "rmsnorm": true, "add_qkv_bias": true, "add_bias_linear": false,
 "apply_residual_connection_post_layernorm": false, "post_layer_norm": true, "original_rope": true, "rope_ratio": 500,
 "seq_length": 131072, "tie_word_embeddings": false, "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329}
J
cat >"$C/hf/config.json" <<'J'
{"architectures": ["GlmForCausalLM"], "model_type": "glm", "attention_bias": true, "eos_token_id": [151329, 151336, 151338],
 "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 13696, "max_position_embeddings": 131072,
 "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
 "rms_norm_eps": 1.5625e-07, "rope_theta": 5000000, "tie_word_embeddings": false, "vocab_size": 151552}
J
V=${VARIANTS:-thudm query_key_value 0.05;hf q_proj,k_proj,v_proj 0.05;thudm query_key_value 0;hf q_proj,k_proj,v_proj 0;hf q_proj,v_proj 0}
IFS=';' read -ra VS <<<"$V"
for v in "${VS[@]}"; do
    set -- $v
    printf '%-6s %-24s dropout %-5s tokens/s:' "$1" "$2" "$3"
    timeout ${LIMIT:-120} "$G" train --init_from_config "$C/$1/config.json" --tokenizer_name "$S/tokenizers/chatglm-6b" \
        --train_file "$S/guide-data/train.json" --max_source_length 64 --max_target_length 192 --finetuning_type lora \
        --lora_target "$2" --lora_dropout "$3" --bf16 --per_device_train_batch_size 8 --max_steps 12 --logging_steps 1 \
        --save_strategy no --output_dir "$C/out" --overwrite_output_dir --disable_tqdm --report_to none --seed 3 ${EXTRA:-} 2>&1 |
        grep -E "tokens_per_second|error" | sed -E "s/.*tokens_per_second.: ([0-9]+).*/\1/" | tail -6 | tr '\n' ' '
    echo
done
rm -rf "$C"
