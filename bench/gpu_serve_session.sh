#!/usr/bin/env bash
# One device call on one H200 for issue 21's serving figures, each run its own process under a
# timeout inside one budget (BUDGET s, default 540). Modes (several may be given, in order):
#   folder  a random ChatGLM-6B folder in THUDM's layout (bench/make_chatglm6b_folder.py, fp16
#           .bin shards, 13.4 GB) at $MODEL (default /tmp/chatglm-6b), then read once so it is in
#           the page cache, as the issue's start-up figure assumes
#   serve   bench/serve_bench.py: launch to first token, then 1, 8, 32 and 64 concurrent greedy
#           streams of $TOKENS tokens (default 256), bf16, pool of 64 slots x 1024 tokens
#   torch   bench/pytorch_decode.py: the PyTorch batch-1 decode of the same folder
#   decode  bench_decode (the model alone): batch 1 at a 32-token prompt (+256, per-op profile) and at 1024 (+1024)
#   train   bench_train W1 (512x8): full fine-tuning and LoRA r=8
#   gemv    the decode-shaped products alone, GB/s (bf16 matmul_fwd beside the quantized ones)
#   tf32    bench_train --fp32 W1 512x4 without and with --tf32
#   lora    bench_train --lora 8 W1 512x8 and bench/pytorch_lora.py the same
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers)
# Records go to $OUT/serve.jsonl, the console lines to $OUT/serve.txt, logs to $OUT/logs.
# Build here first (docs/GPU-TESTS.md), with libmicrohttpd's chain in build/lib:
#   make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain build/gpu/tests/cuda/test_cuda_ops build/gpu/tests/cuda/test_cuda_model
# device call, carry ["build/gpu/glmtrain", "build/gpu/tests/cuda", "build/lib", "build/shared"]:
#   bash bench/gpu_serve_session.sh folder serve torch
set -u
. "$(dirname "$0")/lib.sh"
session_setup serve
MODEL=${MODEL:-/tmp/chatglm-6b}
TOKENS=${TOKENS:-256}
KEEP='^RESULT|^(bf16|fp16|fp32|tf32) |^decode |engine: |^start:|^ +[0-9]+ +[0-9.]+ |streams: [0-9.]+x|^pytorch decode|loaded .* in|KV cache pool|^wrote '
for mode in "${@:-folder serve torch}"; do
    case $mode in
    folder)
        [ -f "$MODEL/pytorch_model.bin.index.json" ] ||
            run_capped "folder" 240 60 $PY bench/make_chatglm6b_folder.py --out "$MODEL"
        t=$SECONDS; cat "$MODEL"/*.bin >/dev/null; echo "page cache: read $MODEL in $((SECONDS - t)) s" | tee -a "$SUMMARY" ;;
    serve)
        run_capped "serve" 300 60 $PY bench/serve_bench.py --glmtrain "$B/glmtrain" --model "$MODEL" --streams 1,8,32,64 \
            --max_tokens "$TOKENS" --server_args "--max_batch_size 64 --max_model_len 1024 --dtype bfloat16" --out "$J" ;;
    torch)
        run_capped "torch" 180 60 env PYTHONUNBUFFERED=1 $PY bench/pytorch_decode.py --model "$MODEL" --new "$TOKENS" --out "$J" ;;
    decode) # the model's own step, no server: bench_decode at batch 1 with a short and a long context
        run_capped "decode-short" 60 20 "$B/bench_decode" --prompt 32 --total 288 --detail --out "$J"
        grep -A16 "per-op" "$OUT/logs/decode-short.txt" >>"$SUMMARY"
        run_capped "decode-long" 60 20 "$B/bench_decode" --prompt 1024 --total 2048 --out "$J" ;;
    train) # full fine-tuning W1 and LoRA W1 (the products' residual epilogue is in training's forward too)
        run_capped "train-w1" 90 40 "$B/bench_train" --runs 512x8 --out "$J"
        run_capped "lora-w1" 90 40 "$B/bench_train" --lora 8 --runs 512x8 --out "$J" ;;
    gemv) # the decode-shaped products alone (test_cuda_ops --quant with GLM_QUANT_BENCH=1: GB/s; bf16 = matmul_fwd)
        run_capped "gemv" 90 30 env GLM_QUANT_BENCH=1 "$B/tests/cuda/test_cuda_ops" --quant
        grep -iE "GB/s|us " "$OUT/logs/gemv.txt" | head -40 >>"$SUMMARY" ;;
    tf32) # --fp32 W1 (micro-batch 4) with and without TF32 products
        run_capped "fp32-w1" 90 40 "$B/bench_train" --fp32 --runs 512x4 --out "$J"
        run_capped "tf32-w1" 90 40 "$B/bench_train" --fp32 --tf32 --runs 512x4 --out "$J" ;;
    lora) # issue 16's W1: LoRA r=8 on query_key_value, ours and the PyTorch + peft-style baseline in one call
        run_capped "lora-w1" 90 40 "$B/bench_train" --lora 8 --runs 512x8 --out "$J"
        run_capped "torch-lora-w1" 200 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x8 --lora 8 \
            --lora_target qkv --out "$J" ;;
    tests) run_gpu_tests 200 ;;
    *) echo "unknown mode $mode" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "done after $((SECONDS - T0))s"
