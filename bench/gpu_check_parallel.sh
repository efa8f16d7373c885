#!/usr/bin/env bash
# Correctness of the parallel paths on GPUs (fp32, a small model on the demo data): one GPU
# against 2 GPUs data parallel (ZeRO 0, ZeRO 1 with small buckets: many pieces; each by copy
# engines (the default on one node), through NCCL only, and with only the reduce-scatter by copies;
# ZeRO 2: gradients staged per unit, with accumulation 4; ZeRO-3, ZeRO-2/3 with the optimizer offloaded, one GPU offloaded;
# LoRA on 1 and 2 GPUs, with ZeRO-3) and 2 pipeline stages, tied and untied heads; prints the loss of
# every step side by side and the largest relative difference to one GPU.
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
GLM=${GLM:-$PWD/build/gpu/glmtrain}
OUT=${OUT:-/tmp/out}
W=/tmp/gpucheck
mkdir -p "$OUT" "$W"
for tie in true false; do
python3 - "$W" "$tie" <<'PY'
import json, sys
w, tie = sys.argv[1], sys.argv[2] == "true"
json.dump({"model_type": "chatglm", "vocab_size": 4032, "hidden_size": 256, "num_layers": 4, "num_attention_heads": 4,
           "inner_hidden_size": 1024, "max_sequence_length": 512, "layernorm_epsilon": 1e-5, "position_encoding_2d": True,
           "tie_word_embeddings": tie, "mask_token_id": 4, "gmask_token_id": 5, "bos_token_id": 8, "eos_token_id": 9,
           "pad_token_id": 3}, open("%s/cfg-%s.json" % (w, "tied" if tie else "untied"), "w"))
PY
done
run() { # name, head, extra flags
    local name=$1 head=$2; shift 2
    rm -rf "$W/$name"
    timeout "${RUN_TIMEOUT:-90}" "$GLM" train --init_from_config "$W/cfg-$head.json" --tokenizer_name build/demo/tokenizer \
        --train_file build/demo/train.json --output_dir "$W/$name" --overwrite_output_dir --fp32 \
        --per_device_train_batch_size 4 --gradient_accumulation_steps 4 --max_source_length 48 --max_target_length 64 \
        --learning_rate 1e-3 --max_steps 8 --save_steps 8 --logging_steps 1 --report_to none --disable_tqdm --seed 3 \
        "$@" >"$OUT/$name.log" 2>&1
    echo "$name rc $?"
}
for head in tied untied; do
    run "p1-$head" $head --nproc_per_node 1
    run "dp2-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2
    run "dp2z1-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 1 --bucket_size_mb 0.5
    # the same two through NCCL only, and with only the reduce-scatter by copies (parallel/dp/dp_peer.c)
    GLMTRAIN_DP_PEER=0 run "dp2nccl-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2
    GLMTRAIN_DP_PEER=0 run "dp2z1nccl-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 1 --bucket_size_mb 0.5
    GLMTRAIN_DP_PEER_AG=0 run "dp2rs-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2
    GLMTRAIN_DP_PEER_AG=0 run "dp2z1rs-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 1 --bucket_size_mb 0.5
    run "dp2z2-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 2
    # the model states off the device and sharded further (docs/OPTIMIZER.md)
    run "dp2z3-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 3
    run "dp2z2off-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 2 --offload_optimizer cpu
    run "dp2z3off-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 3 --offload_optimizer cpu
    run "p1off-$head" $head --nproc_per_node 1 --offload_optimizer cpu
    run "p1lora-$head" $head --nproc_per_node 1 --finetuning_type lora --lora_target all --lora_dropout 0
    run "dp2lora-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --finetuning_type lora --lora_target all --lora_dropout 0
    run "dp2z3lora-$head" $head --nproc_per_node 2 --per_device_train_batch_size 2 --zero_stage 3 --finetuning_type lora --lora_target all --lora_dropout 0
    run "pp2-$head" $head --nproc_per_node 2 --pipeline_parallel_size 2
done
# a rank killed mid-run under the copy-engine exchange: the survivor must stop within
# --ddp_timeout (10 s) naming the rank and the exchange (torchrun-style environment, 2 ranks on
# this node)
fault() {
    local pids=() r t0
    rm -rf "$W/fault"
    for r in 0 1; do
        RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29547 \
        timeout 120 "$GLM" train --init_from_config "$W/cfg-tied.json" --tokenizer_name build/demo/tokenizer \
            --train_file build/demo/train.json --output_dir "$W/fault" --overwrite_output_dir --fp32 \
            --per_device_train_batch_size 2 --max_source_length 48 --max_target_length 64 --max_steps 1000000 \
            --logging_steps 50 --save_strategy no --save_final_model false --report_to none --disable_tqdm --ddp_timeout 10 \
            >"$OUT/fault-r$r.log" 2>&1 &
        pids+=($!)
    done
    sleep 12
    t0=$SECONDS
    pkill -9 -P "${pids[1]}" # glmtrain itself, not the timeout wrapping it
    wait "${pids[0]}"
    echo "fault: rank 0 exit $? $((SECONDS - t0)) s after rank 1 was killed: $(grep -h -m1 -E 'timed out|error' "$OUT/fault-r0.log")" | tee "$OUT/fault.txt"
    grep -h -m1 "copy engines\|through NCCL" "$OUT/fault-r0.log"
}
fault
python3 - "$W" <<'PY' | tee "$OUT/check.txt"
import json, sys, os
w = sys.argv[1]
def losses(name):
    p = "%s/%s/checkpoint-8/trainer_state.json" % (w, name)
    if not os.path.exists(p): return None
    return [r["loss"] for r in json.load(open(p))["log_history"] if "loss" in r]
for head in ("tied", "untied"):
    for v in ("dp2", "dp2z1", "dp2nccl", "dp2z1nccl", "dp2rs", "dp2z1rs", "dp2z2", "pp2", "dp2z3", "dp2z2off", "dp2z3off",
              "p1off", "dp2lora", "dp2z3lora"):
        ref = losses(("p1lora-" if "lora" in v else "p1-") + head)
        got = losses("%s-%s" % (v, head))
        if ref is None or got is None:
            print("%s-%s: missing (see logs)" % (v, head)); continue
        worst = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
        print("%s-%s: max rel diff %.3g; first steps 1gpu %s vs %s" % (v, head, worst, ["%.6f" % x for x in ref[:3]], ["%.6f" % x for x in got[:3]]))
PY
grep -h -E "error|hint" "$OUT"/*.log | head -10
