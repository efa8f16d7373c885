#!/usr/bin/env bash
# One device call on one H200 for the ChatGLM2 family (issue 18), ChatGLM2-6B's shapes: each run
# its own process under a timeout inside one budget (BUDGET s, default 540); what does not fit
# is skipped and named. Modes (several may be given, in order):
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers, <= TESTS_CAP s)
#   ours    bench_train --family chatglm2: full fine-tuning 512x8 and 2048x2, LoRA r=8 512x8
#           (query_key_value), one profiled step each (--detail)
#   decode  bench_decode --family chatglm2: batch 1, 1024-token prompt, 1024 decoded tokens
#   torch   bench/pytorch_glm2.py, the PyTorch baseline of the same runs
#   v1      bench_train 512x8 on ChatGLM-6B (that the seam changed nothing of v1's speed)
#   ptuning ChatGLM-6B P-Tuning v2 W1 (pre_seq_len 128): the PyTorch baseline's self-check, ours, PyTorch
# Records go to $OUT/glm2.jsonl, console lines to $OUT/glm2.txt, logs to $OUT/logs.
# Build here first (docs/GPU-TESTS.md), then a device call with carry ["build/gpu/bench_train",
# "build/gpu/bench_decode", "build/gpu/tests/cuda", "build/lib", "build/shared"]:
#   bash bench/gpu_glm2_session.sh tests ours decode torch
set -u
. "$(dirname "$0")/lib.sh"
session_setup glm2
KEEP='^(bf16|fp16|fp32) |decode |^RESULT|^SELFCHECK|AssertionError|^torch|tokens/s|per-op|^    [a-z_]+ .* ms '
for mode in "${@:-ours decode}"; do
    case $mode in
    tests) run_gpu_tests 240 ;;
    ours)
        run_capped "glm2-full" 120 40 "$B/bench_train" --family chatglm2 --runs 512x8,2048x2,512x8c --detail --out "$J"
        run_capped "glm2-lora" 70 30 "$B/bench_train" --family chatglm2 --lora 8 --runs 512x8 --out "$J" ;;
    decode)
        run_capped "glm2-decode" 60 25 "$B/bench_decode" --family chatglm2 --prompt 1024 --total 2048 --detail --out "$J" ;;
    torch)
        # k/v expanded to the query heads (--gqa expand: ~1 ms a step at W1; skips the enable_gqa probe)
        run_capped "torch-glm2-full" 260 90 env PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
            $PY bench/pytorch_glm2.py --gqa expand --runs 512x8,2048x2,512x8c --out "$J"
        run_capped "torch-glm2-lora" 170 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_glm2.py --gqa expand --runs 512x8 --lora 8 --out "$J" ;;
    v1)
        run_capped "v1-full" 70 30 "$B/bench_train" --runs 512x8 --out "$J" ;;
    ptuning) # issue 16's P-Tuning v2 comparison at W1 (ChatGLM-6B, pre_seq_len 128), the baseline's self-check first
        run_capped "torch-ptuning-check" 150 60 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --tiny --selfcheck --ptuning 8
        run_capped "ours-ptuning" 60 25 "$B/bench_train" --ptuning 128 --runs 512x8 --out "$J"
        run_capped "torch-ptuning" 170 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --ptuning 128 --runs 512x8 --out "$J" ;;
    *) echo "unknown mode $mode" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "done after $((SECONDS - T0))s"
