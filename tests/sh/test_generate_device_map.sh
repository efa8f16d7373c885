#!/usr/bin/env bash
# `glmtrain generate` / `chat` with --device_map: a small model trained here, split into 2 and 3
# stages (auto, thudm, a JSON map), must sample the single model's tokens (same seed, so any logit difference shows); a bad map is
# refused naming the module; with --adapter (a LoRA adapter and a P-Tuning v2 prefix trained here) the
# stages sample the single model's tokens with the same adapter. Prints PASS/FAIL/SKIP lines.
set -u
GLM=${GLM_BUILD:-build}/glmtrain
PY=${GLM_PYTHON:-/usr/bin/python3}
[ -x "$GLM" ] || { echo "SKIP generate_device_map: $GLM not built"; exit 0; }
[ -f /usr/share/games/fortunes/tang300 ] && command -v spm_train >/dev/null || { echo "SKIP generate_device_map: fortunes-zh or spm_train missing"; exit 0; }
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
"$PY" scripts/make_demo_data.py "$D/data" >/dev/null 2>&1 || { echo "FAIL generate_device_map: make_demo_data.py failed"; exit 1; }
"$PY" - "$D" <<'PY'
import json, sys, sentencepiece as spm
d = sys.argv[1]
sp = spm.SentencePieceProcessor(model_file=d + "/data/tokenizer/ice_text.model")
ids = {p: sp.piece_to_id(p) for p in ["[MASK]", "[gMASK]", "<sop>", "<eop>", "<pad>"]}
json.dump({"model_type": "chatglm", "vocab_size": (sp.get_piece_size() + 63) // 64 * 64, "hidden_size": 64,
           "num_layers": 3, "num_attention_heads": 4, "inner_hidden_size": 256, "max_sequence_length": 512,
           "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "tie_word_embeddings": True,
           "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"], "bos_token_id": ids["<sop>"],
           "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]}, open(d + "/config.json", "w"))
json.dump({"transformer.word_embeddings": 0, "transformer.layers.0": 0, "transformer.layers.1": 1,
           "transformer.layers.2": 1, "transformer.final_layernorm": 1, "lm_head": 1}, open(d + "/map.json", "w"))
json.dump({"transformer.word_embeddings": 0, "transformer.layers.0": 0, "transformer.layers.2": 1,
           "transformer.final_layernorm": 1, "lm_head": 1}, open(d + "/bad_map.json", "w"))
PY
OMP_NUM_THREADS=1 "$GLM" train --init_from_config "$D/config.json" --tokenizer_name "$D/data/tokenizer" \
    --train_file "$D/data/train.json" --output_dir "$D/model" --max_steps 30 --per_device_train_batch_size 8 \
    --learning_rate 3e-3 --save_strategy no --report_to none --disable_tqdm --device cpu \
    --max_source_length 32 --max_target_length 48 >"$D/train.log" 2>&1 || { echo "FAIL generate_device_map: training failed"; tail -5 "$D/train.log"; exit 1; }
gen() { "$GLM" generate --model_name_or_path "$D/model" --prompt "背诵李白的《静夜思》" --do_sample true --seed 7 --top_k 0 --top_p 1.0 --temperature 1.0 \
        --max_new_tokens 16 --device cpu --debug "$@" 2>&1 | grep "response ids"; }
ref=$(gen)
fail=0
for spec in "--device_map auto --pipeline_parallel_size 2" "--device_map thudm --pipeline_parallel_size 3" "--device_map $D/map.json"; do
    got=$(gen $spec)
    name="generate_device_map_$(echo "$spec" | awk '{print $2}' | sed 's|.*/||')"
    if [ -n "$ref" ] && [ "$got" = "$ref" ]; then echo "PASS $name: $got"; else echo "FAIL $name: '$got' vs single model '$ref'"; fail=1; fi
done
for ft in "lora --lora_rank 4 --lora_target all" "ptuning --pre_seq_len 4 --prefix_projection"; do
    kind=${ft%% *}
    OMP_NUM_THREADS=1 "$GLM" train --model_name_or_path "$D/model" --train_file "$D/data/train.json" --output_dir "$D/$kind" \
        --finetuning_type $ft --max_steps 8 --per_device_train_batch_size 8 --learning_rate 2e-2 --save_strategy no \
        --report_to none --disable_tqdm --device cpu --max_source_length 32 --max_target_length 48 >"$D/$kind.log" 2>&1 ||
        { echo "FAIL generate_device_map_$kind: adapter training failed"; tail -5 "$D/$kind.log"; fail=1; continue; }
    ref_a=$(gen --adapter "$D/$kind")
    [ -n "$ref_a" ] && [ "$ref_a" != "$ref" ] || { echo "FAIL generate_device_map_${kind}_changes_output: '$ref_a'"; fail=1; }
    for spec in "--device_map auto --pipeline_parallel_size 2" "--device_map thudm --pipeline_parallel_size 3"; do
        got=$(gen --adapter "$D/$kind" $spec)
        name="generate_device_map_adapter_${kind}_$(echo "$spec" | awk '{print $2 "_" $4}')"
        if [ -n "$ref_a" ] && [ "$got" = "$ref_a" ]; then echo "PASS $name: $got"; else echo "FAIL $name: '$got' vs single model '$ref_a'"; fail=1; fi
    done
done
# THUDM's flag name for a P-Tuning checkpoint: the same tokens; a LoRA folder or both flags refused
if [ -d "$D/ptuning" ] && [ "$(gen --ptuning_checkpoint "$D/ptuning")" = "$(gen --adapter "$D/ptuning")" ]; then
    echo "PASS generate_ptuning_checkpoint_flag"; else echo "FAIL generate_ptuning_checkpoint_flag"; fail=1; fi
# LLaMA-Factory's flag name for an adapter: the same tokens as --adapter; two adapter flags refused
if [ -d "$D/lora" ] && [ "$(gen --adapter_name_or_path "$D/lora")" = "$(gen --adapter "$D/lora")" ] &&
    [ "$(gen --adapter_name_or_path "$D/lora")" != "$ref" ]; then
    echo "PASS generate_adapter_name_or_path_flag"; else echo "FAIL generate_adapter_name_or_path_flag"; fail=1; fi
# LLaMA-Factory's inference config (examples/inference/*_lora_sft.yaml) through --config: the same tokens
printf 'model_name_or_path: %s\nadapter_name_or_path: %s\ntemplate: chatglm\nfinetuning_type: lora\ninfer_backend: huggingface\n' \
    "$D/model" "$D/lora" >"$D/infer.yaml"
if [ -d "$D/lora" ] && [ "$(gen --config "$D/infer.yaml")" = "$(gen --adapter "$D/lora")" ]; then
    echo "PASS generate_llama_factory_inference_config"; else echo "FAIL generate_llama_factory_inference_config"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --template chatglm3 2>&1)
if echo "$out" | grep -q -- "--template chatglm3, but the tokenizer is ChatGLM-6B's"; then echo "PASS generate_template_other_family_refused"
else echo "FAIL generate_template_other_family_refused: $out"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --finetuning_type lora 2>&1)
if echo "$out" | grep -q -- "--finetuning_type lora without an adapter"; then echo "PASS generate_lora_without_adapter_refused"
else echo "FAIL generate_lora_without_adapter_refused: $out"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --adapter "$D/lora" --adapter_name_or_path "$D/lora" 2>&1)
if echo "$out" | grep -q "one adapter at a time"; then echo "PASS two_adapter_flags_refused"
else echo "FAIL two_adapter_flags_refused: $out"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --ptuning_checkpoint "$D/lora" 2>&1)
if echo "$out" | grep -q "is a LoRA adapter" && echo "$out" | grep -q -- "--adapter"; then echo "PASS ptuning_checkpoint_lora_refused"
else echo "FAIL ptuning_checkpoint_lora_refused: $out"; fail=1; fi
mkdir -p "$D/empty"
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --ptuning_checkpoint "$D/empty" 2>&1)
if echo "$out" | grep -q "holds neither adapter_config.json" && echo "$out" | grep -q "pre_seq_len"; then echo "PASS adapter_folder_without_configs_named"
else echo "FAIL adapter_folder_without_configs_named: $out"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --adapter "$D/lora" --ptuning_checkpoint "$D/ptuning" 2>&1)
if echo "$out" | grep -q "one adapter at a time"; then echo "PASS adapter_and_ptuning_checkpoint_refused"; else echo "FAIL adapter_and_ptuning_checkpoint_refused: $out"; fail=1; fi
out=$("$GLM" generate --model_name_or_path "$D/model" --prompt x --device cpu --device_map "$D/bad_map.json" 2>&1)
if echo "$out" | grep -q "transformer.layers.1"; then echo "PASS generate_bad_map_names_module"; else echo "FAIL generate_bad_map_names_module: $out"; fail=1; fi
chat=$(printf '背诵李白的《静夜思》\nexit\n' | "$GLM" chat --model_name_or_path "$D/model" --do_sample false --max_new_tokens 8 \
       --device cpu --device_map auto --pipeline_parallel_size 2 2>&1)
if [ $? -eq 0 ] && echo "$chat" | grep -q "split into 2 stages"; then echo "PASS chat_device_map"; else echo "FAIL chat_device_map: $chat"; fail=1; fi
exit $fail
