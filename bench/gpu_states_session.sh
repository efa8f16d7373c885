#!/usr/bin/env bash
# One device call on one H200 for issue 19 (full fine-tuning of ChatGLM-6B under a 24 GiB cap):
# each run its own process under a timeout inside one budget (BUDGET s, default 540). Modes, in
# the order given:
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers, <= TESTS_CAP s)
#   uncapped bench_train W1 (512x8) full fine-tuning with AdamW on the device: the capped run's reference
#   layouts bench_train W1 (seq 512) full fine-tuning: the uncapped run (512x8, fp32 AdamW on the
#           device) and the layouts that fit 24 GiB (the optimizer offloaded to the host and
#           updated inside backward, checkpointing) at the runs in $RUNS; 8-bit moments on the
#           host at $RUNS8, on the device (uncapped) at $RUNS_DEV8
#   check   glmtrain train on a 2-layer model with ChatGLM-6B's vocabulary, 8 steps per layout
#           (offload with and without accumulation, inside backward, 8-bit on the device and the
#           host): the losses side by side
#   capped  glmtrain train on W1 data (bench/w1_data.py, ChatGLM-6B shapes from random init)
#           under --max_memory_per_gpu 24GiB with $CAPPED_FLAGS for $CAPPED_STEPS steps; GPU
#           memory sampled by nvidia-smi every 200 ms (the peak of the whole process)
# Records go to $OUT/states.jsonl, the console lines to $OUT/states.txt, logs to $OUT/logs.
# Build here first (docs/GPU-TESTS.md):
#   make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain build/gpu/bench_train build/gpu/tests/cuda/test_cuda_ops build/gpu/tests/cuda/test_cuda_model
#   mkdir -p build/lib && cp -P /usr/lib/x86_64-linux-gnu/{libcjson,libgomp,libpcre2-8,libmicrohttpd}.so* build/lib/
# device call, carry ["build/gpu/glmtrain", "build/gpu/bench_train", "build/gpu/tests/cuda", "build/lib", "build/shared"]:
#   bash bench/gpu_states_session.sh layouts capped
set -u
. "$(dirname "$0")/lib.sh"
session_setup states
KEEP='^(bf16|fp16|fp32) |^RESULT|^\{.loss|memory plan|host memory|fits|offloaded|in backward|peak'
RUNS=${RUNS:-512x8c 512x16c 512x24c}
for mode in "${@:-layouts capped}"; do
    case $mode in
    tests) run_gpu_tests 200 ;;
    uncapped) run_capped uncapped 60 30 "$B/bench_train" --runs 512x8 --steps 4 --warmup 1 --out "$J" ;;
    layouts)
        run_capped uncapped 60 30 "$B/bench_train" --runs 512x8 --steps 4 --warmup 1 --out "$J"
        for r in $RUNS; do
            run_capped "off-ib-$r" 70 30 "$B/bench_train" --offload --in_backward --runs "$r" --steps 3 --warmup 1 --out "$J"
        done
        for r in ${RUNS8:-}; do
            run_capped "off-8bit-ib-$r" 90 30 "$B/bench_train" --offload --optim adamw_8bit --in_backward --runs "$r" --steps 2 --warmup 1 --out "$J"
        done
        for r in ${RUNS_DEV8:-}; do # 8-bit moments on the device (no offload): they need the master copy there too
            run_capped "dev-8bit-$r" 60 30 "$B/bench_train" --optim adamw_8bit --runs "$r" --steps 3 --warmup 1 --out "$J"
        done ;;
    check)
        # the layouts on a small model of ChatGLM-6B's vocabulary (seconds each): losses side by side
        W=/tmp/w1s
        mkdir -p $W
        $PY bench/w1_data.py $W
        $PY -c "import json,sys; c=json.load(open('$W/config.json')); c.update(hidden_size=256, num_layers=2, num_attention_heads=4, inner_hidden_size=1024); json.dump(c, open('$W/config.json','w'))"
        find_tokenizer gpu_states_session.sh
        for v in "base|" "offload|--offload_optimizer cpu" "offload_acc2|--offload_optimizer cpu --gradient_accumulation_steps 2" \
                 "acc2|--gradient_accumulation_steps 2" "in_backward|--optimizer_in_backward --max_grad_norm 0" \
                 "noclip|--max_grad_norm 0" "in_backward_off|--optimizer_in_backward --max_grad_norm 0 --offload_optimizer cpu" \
                 "8bit|--optim adamw_8bit" "8bit_off|--optim adamw_8bit --offload_optimizer cpu"; do
            name=${v%%|*}; flags=${v#*|}
            run_capped "check-$name" 40 15 "$B/glmtrain" train --init_from_config $W/config.json --tokenizer_name "$TOKENIZER" \
                --train_file $W/w1.jsonl --max_source_length 64 --max_target_length 64 --output_dir $W/$name --bf16 \
                --per_device_train_batch_size 4 --max_steps 8 --learning_rate 1e-3 --logging_steps 2 --save_strategy no \
                --save_final_model false --disable_tqdm --report_to none $flags
        done ;;
    capped)
        W=/tmp/w1
        mkdir -p $W
        $PY bench/w1_data.py $W
        find_tokenizer gpu_states_session.sh
        # what the GPU holds before the run (an earlier process's memory still being released shows here)
        echo "RESULT GPU memory in use before the capped run: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) MiB" | tee -a "$SUMMARY"
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/logs/capped-mem.csv" 2>/dev/null &
        smi=$!
        run_capped capped "${CAPPED_CAP:-420}" 120 "$B/glmtrain" train --init_from_config $W/config.json \
            --tokenizer_name "$TOKENIZER" --train_file $W/w1.jsonl --max_source_length 256 --max_target_length 256 \
            --output_dir $W/out --bf16 --max_memory_per_gpu 24GiB ${CAPPED_FLAGS:---offload_optimizer cpu --optimizer_in_backward --max_grad_norm 0 --gradient_checkpointing --per_device_train_batch_size 16} \
            --max_steps "${CAPPED_STEPS:-100}" --learning_rate 1e-5 --warmup_steps 5 --logging_steps 10 --save_strategy no \
            --save_final_model false --disable_tqdm --report_to none
        kill $smi 2>/dev/null
        echo "RESULT capped peak GPU memory $(sort -n "$OUT/logs/capped-mem.csv" | tail -1) MiB (nvidia-smi, whole GPU)" | tee -a "$SUMMARY"
        echo "RESULT capped peak GPU memory from 5 s on $(tail -n +26 "$OUT/logs/capped-mem.csv" | sort -n | tail -1) MiB" | tee -a "$SUMMARY" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "session: $((SECONDS - T0)) s"
