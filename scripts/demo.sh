#!/usr/bin/env bash
# make demo: the main job on an embedded default. Builds an instruction set from the Tang and
# Song poems of Debian's fortunes-zh, trains a small SentencePiece tokenizer, trains a small GLM
# from scratch for a few minutes (all CPU cores, or the GPU when there is one), saves it and
# prints generations for a few prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${DEMO_OUT:-demo-out}
SECONDS_TO_TRAIN=${DEMO_SECONDS:-180}
bash scripts/install-deps.sh
make -j"$(nproc)" build/glmtrain
/usr/bin/python3 scripts/make_demo_data.py "$OUT/data"
# a small GLM sized to the tokenizer: 4 layers, hidden 192, 6 heads
/usr/bin/python3 - "$OUT" <<'PY'
import json, sys, sentencepiece as spm
out = sys.argv[1]
sp = spm.SentencePieceProcessor(model_file=out + "/data/tokenizer/ice_text.model")
ids = {p: sp.piece_to_id(p) for p in ["[MASK]", "[gMASK]", "<sop>", "<eop>", "<pad>"]}
cfg = {"model_type": "chatglm", "vocab_size": (sp.get_piece_size() + 63) // 64 * 64, "hidden_size": 192,
       "num_layers": 4, "num_attention_heads": 6, "inner_hidden_size": 768, "max_sequence_length": 512,
       "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "tie_word_embeddings": True,
       "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"], "bos_token_id": ids["<sop>"],
       "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]}
json.dump(cfg, open(out + "/config.json", "w"), indent=2)
PY
build/glmtrain train --init_from_config "$OUT/config.json" --tokenizer_name "$OUT/data/tokenizer" \
    --train_file "$OUT/data/train.json" --validation_file "$OUT/data/val.json" \
    --output_dir "$OUT/model" --overwrite_output_dir \
    --num_train_epochs 200 --max_train_seconds "$SECONDS_TO_TRAIN" \
    --per_device_train_batch_size 16 --learning_rate 2e-3 --warmup_steps 30 --lr_scheduler_type constant_with_warmup \
    --weight_decay 0.01 --max_source_length 48 --max_target_length 128 \
    --logging_steps 20 --eval_strategy steps --eval_steps 100 --save_steps 200 --save_total_limit 2
echo
# ChatGLM's own sampling (top_p 0.7, temperature 0.95) with a repetition penalty: a model this
# small repeats itself under greedy decoding
echo "=== generations from $OUT/model (sampling, seed 1, repetition penalty 1.3) ==="
for p in "写一首王维的诗，题目是《送别》" "背诵李白的《静夜思》" "《春晓》的作者是谁？"; do
    echo "用户: $p"
    printf 'ChatGLM: '
    build/glmtrain generate --model_name_or_path "$OUT/model" --prompt "$p" --seed 1 --repetition_penalty 1.3 \
        --max_new_tokens 96 2>/dev/null
    echo
done
