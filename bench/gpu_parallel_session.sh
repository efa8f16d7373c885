#!/usr/bin/env bash
# One device call on a 2-GPU machine for the parallel issues: the environment check, the train
# command end to end on the demo data (1 GPU, 2 GPUs data parallel, 2 pipeline stages), W1 data
# parallel against one GPU and a "two nodes" run (two processes forced onto NCCL's socket
# transport over loopback), both through bench/gpu_dp_session.sh, and the pipeline runs
# (bench_pp.sh). Logs go to $OUT.
# Build here first: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain build/gpu/tests/tool_pp_infer
# and carry build/gpu/glmtrain, build/gpu/tests/tool_pp_infer, build/lib (libcjson, libgomp),
# build/shared (the ChatGLM-6B tokenizer), build/demo (scripts/make_demo_data.py build/demo).
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
GLM=$PWD/build/gpu/glmtrain
mkdir -p "$OUT"
log() { echo "=== $* ($(date -u +%H:%M:%S))" | tee -a "$OUT/summary.txt"; }

log env
timeout 30 "$GLM" env 2>&1 | tee "$OUT/env.txt" | tail -12

demo_cfg() {
python3 - <<'PY'
import json
cfg = {"model_type": "chatglm", "vocab_size": 4032, "hidden_size": 512, "num_layers": 4, "num_attention_heads": 8,
       "inner_hidden_size": 2048, "max_sequence_length": 512, "layernorm_epsilon": 1e-5, "position_encoding_2d": True,
       "tie_word_embeddings": True, "mask_token_id": 4, "gmask_token_id": 5, "bos_token_id": 8, "eos_token_id": 9,
       "pad_token_id": 3}
json.dump(cfg, open("build/demo/config.json", "w"))
PY
}
demo_cfg
for n in 1 2; do
    log "train demo data on $n GPU(s)"
    timeout 60 "$GLM" train --init_from_config build/demo/config.json --tokenizer_name build/demo/tokenizer \
        --train_file build/demo/train.json --validation_file build/demo/val.json --output_dir "/tmp/demo-n$n" \
        --overwrite_output_dir --bf16 --nproc_per_node $n --max_steps 60 --per_device_train_batch_size 16 \
        --learning_rate 2e-3 --warmup_steps 10 --logging_steps 20 --eval_strategy steps --eval_steps 60 \
        --save_steps 30 --max_source_length 48 --max_target_length 128 --disable_tqdm >"$OUT/demo-n$n.log" 2>&1
    echo "rc $?" | tee -a "$OUT/summary.txt"; grep -E "^\{|error|hint" "$OUT/demo-n$n.log" | tail -5 | tee -a "$OUT/summary.txt"
done
log "generate on GPU from the 2-GPU model"
timeout 30 "$GLM" generate --model_name_or_path /tmp/demo-n2 --prompt "写一首王维的诗，题目是《送别》" --do_sample false \
    --max_new_tokens 48 --device cuda 2>&1 | tail -3 | tee -a "$OUT/summary.txt"

log "W1 data parallel (bench_dp.sh)"
GLM=$GLM OUT=$OUT/dp ZERO="0 1" STEPS=10 VARIANTS="dflt:" TWO_NODES=1 timeout 300 bash bench/gpu_dp_session.sh >"$OUT/dp.log" 2>&1
tail -8 "$OUT/dp.log" | tee -a "$OUT/summary.txt"

log "pipeline (bench_pp.sh)"
GLM=$GLM OUT=$OUT/pp RUNS="check-train check-infer pp2-m8 cap-p1 cap-p2" STEPS=6 WARM=2 timeout 170 bash bench/bench_pp.sh >"$OUT/pp.log" 2>&1
tail -25 "$OUT/pp.log" | tee -a "$OUT/summary.txt"
log done
