#!/usr/bin/env bash
# One device call on one H200 for the quantized-base benchmarks of issue 17, all runs on the
# chatglm-6b shapes: each its own process under a timeout inside one budget (BUDGET s, default
# 540); what does not fit is skipped and named. Modes (several may be given, in order):
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers, <= TESTS_CAP s)
#   train   bench_train: P-Tuning v2 with THUDM's INT4 train.sh shape (pre_seq_len 128, 64 + 64
#           tokens, batch 1, checkpointing; tied head as the download) on bf16 / INT8 / INT4 /
#           NF4, then LoRA r=8 W1 512x4 with checkpointing on the same four bases (--detail)
#   decode  bench_decode: batch 1, a 1024-token prompt then 1024 decoded tokens (2048 in all) on
#           bf16 / INT8 / INT4 / NF4
#   kernels the quantized ops alone (test_cuda_ops --quant with GLM_QUANT_BENCH=1: GB/s)
#   torch   bench/pytorch_lora.py W1 512x4c r=8 on a bf16 base and on an INT4 / INT8 base
#           (dequantize-then-matmul), the PyTorch baselines of the same call
# Records go to $OUT/quant.jsonl, the console lines to $OUT/quant.txt, logs to $OUT/logs.
# Build here first (docs/GPU-TESTS.md):
#   make -j2 MPI=0 BUILD=build/gpu build/gpu/bench_train build/gpu/bench_decode build/gpu/tests/cuda/test_cuda_ops build/gpu/tests/cuda/test_cuda_model
#   mkdir -p build/lib && cp -P /usr/lib/x86_64-linux-gnu/libcjson.so* /usr/lib/x86_64-linux-gnu/libgomp.so* build/lib/
# device call, carry ["build/gpu/bench_train", "build/gpu/bench_decode", "build/gpu/tests/cuda", "build/lib", "build/shared"]:
#   bash bench/gpu_quant_session.sh train decode
set -u
. "$(dirname "$0")/lib.sh"
session_setup quant
KEEP='^(bf16|fp16|fp32) |^decode |^RESULT|per-op|^    [a-z_]+ .* ms '
for mode in "${@:-train decode}"; do
    case $mode in
    tests) run_gpu_tests 200 ;;
    train)
        for q in none int8 int4 nf4; do
            qa=(); [ $q != none ] && qa=(--quant $q)
            run_capped "ptuning-$q" 60 25 "$B/bench_train" --ptuning 128 --tied "${qa[@]}" --runs 128x1c --steps 6 --warmup 2 --out "$J"
        done
        for q in none int4 int8 nf4; do
            qa=(); [ $q != none ] && qa=(--quant $q)
            run_capped "lora-$q" 70 30 "$B/bench_train" --lora 8 "${qa[@]}" --runs 512x4c --detail --out "$J"
        done ;;
    kernels)
        run_capped "kernels" 90 30 env GLM_QUANT_BENCH=1 "$B/tests/cuda/test_cuda_ops" --quant
        grep -iE "GB/s|us " "$OUT/logs/kernels.txt" | head -40 >>"$OUT/quant.txt" ;;
    decode)
        for q in none int4 int8 nf4; do
            qa=(); [ $q != none ] && qa=(--quant $q)
            run_capped "decode-$q" 60 25 "$B/bench_decode" "${qa[@]}" --prompt 1024 --total 2048 --detail --out "$J"
            grep -A14 "per-op" "$OUT/logs/decode-$q.txt" >>"$OUT/quant.txt"
        done ;;
    ptuning4) # THUDM's INT4 train.sh shape alone
        run_capped "ptuning-int4" 60 25 "$B/bench_train" --ptuning 128 --tied --quant int4 --runs 128x1c --steps 6 --warmup 2 --out "$J" ;;
    lora3) # ours beside the PyTorch runs of the same call
        for q in none int4 int8; do
            qa=(); [ $q != none ] && qa=(--quant $q)
            run_capped "lora-$q" 70 30 "$B/bench_train" --lora 8 "${qa[@]}" --runs 512x4c --out "$J"
        done ;;
    torch)
        for q in none int4 int8; do
            run_capped "torch-$q" 150 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x4c --lora 8 --base_quant $q --out "$J"
        done ;;
    *) echo "unknown mode $mode" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "done after $((SECONDS - T0))s"
