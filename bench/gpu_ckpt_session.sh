#!/usr/bin/env bash
# One device call on one H200 for issue 20's checkpointing levels and GELU epilogues, each run its
# own process under a timeout inside one budget (BUDGET s, default 540). Modes, in order given:
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers)
#   full    bench_train W1 (512x8) full fine-tuning without, with selective and with full
#           checkpointing (--detail: the per-op step profile of each)
#   lora    bench_train LoRA r=8 on query_key_value, W1 without and with selective checkpointing, and
#           micro-batch 4 with full and with selective checkpointing (issue 16's memory figure)
#   w2      bench_train W2 (2048x2) full fine-tuning and LoRA r=8
#   glm2    bench_train --family chatglm2 W1 full fine-tuning without and with selective checkpointing
#   torch   bench/pytorch_lora.py W1 LoRA r=8 on query_key_value (the PyTorch baseline of the same job)
#   attn    attention alone, forward and backward in TFLOP/s at seq 512 (b 8), 2048 (b 2) and 8192
#           (b 1), masks prefix/causal/full: bench_attn, then bench/pytorch_attn.py (SDPA's flash
#           backend; the memory-efficient one with a mask for prefix) in the same call
# Records go to $OUT/ckpt.jsonl, the console lines to $OUT/ckpt.txt, logs to $OUT/logs.
# Build here first (docs/GPU-TESTS.md):
#   make -j2 MPI=0 BUILD=build/gpu build/gpu/bench_train build/gpu/bench_attn build/gpu/tests/cuda/test_cuda_ops build/gpu/tests/cuda/test_cuda_model
# device call, carry ["build/gpu/bench_train", "build/gpu/tests/cuda", "build/lib", "build/shared"] (and
# "build/gpu/bench_attn" for attn):
#   bash bench/gpu_ckpt_session.sh tests full lora
set -u
. "$(dirname "$0")/lib.sh"
session_setup ckpt
KEEP='^RESULT|^(bf16|fp16|fp32|tf32) |^ +[0-9]+ +[0-9.]+ |^pytorch|tok/s|^[0-9]+x[0-9]+ |^run '
for mode in "${@:-tests full lora}"; do
    case $mode in
    tests) run_gpu_tests 200 ;;
    full)
        for r in 512x8 512x8s 512x8c; do
            run_capped "full-$r" 100 40 "$B/bench_train" --runs $r --detail --out "$J"
            grep -A40 "per-op" "$OUT/logs/full-$r.txt" | head -42 >>"$OUT/logs/profile-full-$r.txt"
        done ;;
    lora) run_capped "lora" 150 60 "$B/bench_train" --lora 8 --runs 512x8,512x8s,512x4c,512x4s --out "$J" ;;
    w2)
        run_capped "w2-full" 100 40 "$B/bench_train" --runs 2048x2 --out "$J"
        run_capped "w2-lora" 100 40 "$B/bench_train" --lora 8 --runs 2048x2 --out "$J" ;;
    glm2) run_capped "glm2" 150 60 "$B/bench_train" --family chatglm2 --runs 512x8,512x8s --out "$J" ;;
    attn)
        run_capped "attn" 120 30 "$B/bench_attn" --out "$J"
        run_capped "torch-attn" 150 30 env PYTHONUNBUFFERED=1 $PY bench/pytorch_attn.py --out "$J" ;;
    torch)
        run_capped "torch-lora-w1" 200 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x8 --lora 8 \
            --lora_target qkv --out "$J" ;;
    *) echo "unknown mode $mode" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "done after $((SECONDS - T0))s"
