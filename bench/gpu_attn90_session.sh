#!/usr/bin/env bash
# One device call on one H200 for issue 20's wgmma attention (k_flash90.cu), each run its own
# process under a timeout inside one budget (BUDGET s, default 540). Modes, in order given:
#   check   test_cuda_ops --attention: every attention case on every path (wgmma, mma.sync, SIMT)
#           against the CPU twin
#   tests   the GPU tests (tests/run_cuda.sh, no sanitizers)
#   attn    attention alone, fwd/bwd TFLOP/s at seq 512 (b 8), 2048 (b 2), 8192 (b 1), masks
#           prefix/causal/full: bench_attn on the wgmma path, on the mma.sync path
#           (GLM_CUDA_ATTN=mma), then bench/pytorch_attn.py (SDPA) in the same call
#   attn-wgmma  bench_attn on the wgmma path alone
#   attn-diag  each build/diag/bench_attn_NAME (a diagnostic variant, not the tree's kernels)
#   train   bench_train W1 (512x8) and W2 (2048x2) full fine-tuning with --detail (the per-op profile)
#   train-mma  the same two runs on the mma.sync attention (GLM_CUDA_ATTN=mma), without --detail
#   lora    bench_train LoRA r=8 W1 and W2 (wgmma)
#   dora, torch-dora   DoRA r=8 on query_key_value at W1: bench_train --dora, bench/pytorch_lora.py --dora
#   model   test_cuda_model alone (the model on CUDA against the CPU)
#   vary    W1 LoRA r=8 and W1 full with --vary_prompts (each step its own supervised count, as
#           real data), then W1 LoRA with fixed prompts; each also with $B/bench_train_before
#           first when that build is carried (an older tree's bench_train, for an A/B)
#   rows-ab W1 LoRA r=8, then W1 full and W1 b=4 LoRA with checkpointing, each with the top
#           layer's supervised rows alone (the default) and with every row (--all_rows) in turn
#   freeze  bench_train --freeze 2 W1 and bench/pytorch_lora.py --freeze 2 in the same call
#   freeze-ours  the first half of freeze alone
#   lora-detail, glm2-detail   the per-op profile of LoRA r=8 W1 / ChatGLM2 full W1
#   glm2    bench_train --family chatglm2: W1 and W2 full fine-tuning, W1 LoRA r=8
#   glm2-lora, torch-glm2-lora   the ChatGLM2 W1 LoRA r=8 run alone, ours and PyTorch's
#   torch, torch-lora, torch-glm2   the PyTorch baselines of train, lora and glm2 (same runs)
#   torch-w2  the PyTorch baseline of W2 full fine-tuning alone
#   torch-lora-prof  bench/pytorch_lora.py W1 LoRA r=8 with --profile (one step's kernels by time)
#   lora-torchblas  bench_train LoRA r=8 W1 --detail with the cuBLAS of the machine's torch
#           (LD_LIBRARY_PATH), which may be another release than the CUDA install's
#   gemm-names  the products' kernels by name and mean time (ncu, 2 layers of LoRA r=8 W1), tuned and
#           with the heuristic's first picks (GLM_CUDA_GEMM_TUNE=0); then the W1 LoRA profile untuned
#   tune-ab  LoRA r=8 W1 four times, the GEMM candidates timed and not (GLM_CUDA_GEMM_TUNE=0) in turn
#   clk-lora, clk-torch-lora  LoRA r=8 W1, ours / PyTorch's, with the GPU's clock, power and
#           throttle reasons sampled every 50 ms (logs/clk-*.csv; the summary line: medians while busy)
#   ops-full  bench_ops without dropout, then ncu's full set on one launch of each LoRA and
#           LayerNorm kernel (in the logs)
#   ops     bench_ops (LoRA's A and B sides, LayerNorm, rotary at W1's shapes against the copy
#           speed), then ncu's duration of each kernel of its LoRA ops (one pass each)
#   sanitize compute-sanitizer memcheck and racecheck over test_cuda_ops --quick --attention
#   sanitize-all  memcheck and racecheck over every op of test_cuda_ops --quick --only bf16
#   racecheck  racecheck alone over the bf16 attention cases (--quick --attention --only bf16)
#   turing  the GPU tests built as Turing PTX alone (build/ptx75: make BUILD=build/ptx75
#           NVCC_ARCH='-gencode arch=compute_75,code=compute_75'), so every kernel runs as compiled
#           for 7.5 (sm_80 instructions are traps there), with GLM_CUDA_TURING=1 sending the GPU
#           down Turing's paths (no bf16, 64 KiB of shared memory a block); then the native
#           build's tests under GLM_CUDA_TURING=1 too
#   ptx-jit  the GPU tests built as PTX alone (build/ptx: make BUILD=build/ptx
#           NVCC_ARCH='-gencode arch=compute_80,code=compute_80'), so the driver compiles every
#           kernel for this GPU as it must on GPUs newer than a build (Blackwell), with the
#           mma.sync attention those GPUs take (GLM_CUDA_ATTN=mma); cuBLAS keeps its own code.
#           A fresh CUDA_CACHE_PATH: the first binary's time includes the compilation
# Records: $OUT/attn90-*.jsonl; console lines $OUT/attn90.txt; logs in $OUT/logs.tgz.
# Build here first (docs/GPU-TESTS.md):
#   make -j2 MPI=0 BUILD=build/gpu build/gpu/bench_train build/gpu/bench_attn build/gpu/bench_ops build/gpu/tests/cuda/test_cuda_ops build/gpu/tests/cuda/test_cuda_model
# device call, carry ["build/gpu/bench_train", "build/gpu/bench_attn", "build/gpu/bench_ops", "build/gpu/tests/cuda", "build/lib", "build/shared"]:
#   bash bench/gpu_attn90_session.sh check attn
set -u
. "$(dirname "$0")/lib.sh"
session_setup attn90
KEEP='product plans|^RESULT|GB/s|gpu__time_duration|lora_|^(bf16|fp16|fp32|tf32) |^ +[0-9]+ +[0-9.]+ |^pytorch|tok/s|^[0-9]+x[0-9]+ |^run |passed|FAIL|TFLOP|ERROR SUMMARY|RACECHECK SUMMARY'
for mode in "${@:-check attn}"; do
    case $mode in
    check) run_capped "check" 150 20 "$B/tests/cuda/test_cuda_ops" --attention ;;
    tests) run_gpu_tests 240 ;;
    turing)
        P=${TURING_BUILD:-build/ptx75}
        rm -rf /tmp/glm-jit75
        run_capped "turing-model" 200 40 env CUDA_CACHE_PATH=/tmp/glm-jit75 GLM_CUDA_TURING=1 "$P/tests/cuda/test_cuda_model"
        run_capped "turing-ops" 240 40 env CUDA_CACHE_PATH=/tmp/glm-jit75 GLM_CUDA_TURING=1 "$P/tests/cuda/test_cuda_ops"
        run_capped "turing-native-model" 120 30 env GLM_CUDA_TURING=1 "$B/tests/cuda/test_cuda_model"
        grep -h "^SKIP" "$OUT/logs/turing-model.txt" "$OUT/logs/turing-ops.txt" | head -5 | sed 's/^/    /' ;;
    ptx-jit)
        P=${PTX_BUILD:-build/ptx}
        rm -rf /tmp/glm-jit-cache
        run_capped "ptx-jit-model" 200 40 env CUDA_CACHE_PATH=/tmp/glm-jit-cache GLM_CUDA_ATTN=mma "$P/tests/cuda/test_cuda_model"
        run_capped "ptx-jit-ops" 240 40 env CUDA_CACHE_PATH=/tmp/glm-jit-cache GLM_CUDA_ATTN=mma "$P/tests/cuda/test_cuda_ops"
        du -sh /tmp/glm-jit-cache 2>/dev/null | sed 's/^/    JIT cache: /'
        # the same binary with the driver's PTX compiler off: the start must say so, not launch
        env CUDA_DISABLE_PTX_JIT=1 "$P/tests/cuda/test_cuda_model" 2>&1 | grep -m1 -i "cannot run this build" | sed 's/^/    no-JIT start: /' ;;
    attn)
        run_capped "attn-wgmma" 90 20 "$B/bench_attn" --out "$OUT/attn90-wgmma.jsonl"
        run_capped "attn-mma" 90 20 env GLM_CUDA_ATTN=mma "$B/bench_attn" --out "$OUT/attn90-mma.jsonl"
        run_capped "attn-torch" 150 30 env PYTHONUNBUFFERED=1 $PY bench/pytorch_attn.py --out "$OUT/attn90-torch.jsonl" ;;
    attn-wgmma) run_capped "attn-wgmma" 90 20 "$B/bench_attn" --out "$OUT/attn90-wgmma.jsonl" ;;
    attn-diag) # bench_attn builds of diagnostic variants carried in build/diag (bench_attn_NAME), each alone
        for d in build/diag/bench_attn_*; do run_capped "attn-${d##*_}" 90 20 "$d"; done ;;
    train)
        run_capped "train-wgmma" 150 40 "$B/bench_train" --runs 512x8,2048x2 --detail --out "$OUT/attn90-train-wgmma.jsonl"
        grep -A45 "per-op" "$OUT/logs/train-wgmma.txt" >"$OUT/logs/profile-train-wgmma.txt" ;;
    train-mma) run_capped "train-mma" 120 40 env GLM_CUDA_ATTN=mma "$B/bench_train" --runs 512x8,2048x2 --out "$OUT/attn90-train-mma.jsonl" ;;
    lora) run_capped "lora" 120 40 "$B/bench_train" --lora 8 --runs 512x8,2048x2 --out "$OUT/attn90-lora.jsonl" ;;
    dora) run_capped "dora" 120 40 "$B/bench_train" --lora 8 --dora --runs 512x8 --out "$OUT/attn90-dora.jsonl" ;;
    torch-dora) run_capped "torch-dora" 240 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x8 --lora 8 --dora \
        --lora_dropout 0 --out "$OUT/attn90-torch-dora.jsonl" ;;
    model) run_capped "model" 200 30 "$B/tests/cuda/test_cuda_model" ;;
    vary)
        for v in "--lora 8 --vary_prompts" "--vary_prompts" "--lora 8"; do
            tag=$(echo "$v" | tr -d ' -')
            [ -x "$B/bench_train_before" ] && run_capped "vary-before-$tag" 150 40 "$B/bench_train_before" $v --runs 512x8 --steps 8
            run_capped "vary-$tag" 100 30 "$B/bench_train" $v --runs 512x8 --steps 12 --out "$OUT/attn90-vary.jsonl"
        done ;;
    rows-ab)
        for i in 1 2; do
            run_capped "rows-top-$i" 90 25 "$B/bench_train" --lora 8 --runs 512x8 --out "$OUT/attn90-rows.jsonl"
            run_capped "rows-all-$i" 90 25 "$B/bench_train" --lora 8 --runs 512x8 --all_rows --out "$OUT/attn90-rows.jsonl"
        done
        run_capped "rows-top-ckpt" 90 25 "$B/bench_train" --lora 8 --runs 512x4c --out "$OUT/attn90-rows.jsonl"
        run_capped "rows-all-ckpt" 90 25 "$B/bench_train" --lora 8 --runs 512x4c --all_rows --out "$OUT/attn90-rows.jsonl"
        run_capped "rows-top-full" 90 25 "$B/bench_train" --runs 512x8 --out "$OUT/attn90-rows.jsonl"
        run_capped "rows-all-full" 90 25 "$B/bench_train" --runs 512x8 --all_rows --out "$OUT/attn90-rows.jsonl" ;;
    freeze) # the last 2 layers train (LLaMA-Factory's freeze), ours then PyTorch's, W1
        run_capped "freeze" 90 20 "$B/bench_train" --freeze 2 --runs 512x8 --out "$OUT/attn90-freeze.jsonl"
        run_capped "torch-freeze" 150 60 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --freeze 2 --runs 512x8 \
            --out "$OUT/attn90-torch-freeze.jsonl" ;;
    freeze-ours) run_capped "freeze" 90 20 "$B/bench_train" --freeze 2 --runs 512x8 --out "$OUT/attn90-freeze.jsonl" ;;
    lora-detail)
        run_capped "lora-detail" 120 40 "$B/bench_train" --lora 8 --runs 512x8 --detail --out "$OUT/attn90-lora.jsonl"
        grep -A45 "per-op" "$OUT/logs/lora-detail.txt" >"$OUT/logs/profile-lora.txt" ;;
    glm2-detail)
        run_capped "glm2-detail" 120 40 "$B/bench_train" --family chatglm2 --runs 512x8 --detail --out "$OUT/attn90-glm2.jsonl"
        grep -A45 "per-op" "$OUT/logs/glm2-detail.txt" >"$OUT/logs/profile-glm2.txt" ;;
    glm2)
        run_capped "glm2" 120 40 "$B/bench_train" --family chatglm2 --runs 512x8,2048x2 --out "$OUT/attn90-glm2.jsonl"
        run_capped "glm2-lora" 120 40 "$B/bench_train" --family chatglm2 --lora 8 --runs 512x8 --out "$OUT/attn90-glm2.jsonl" ;;
    glm2-lora) run_capped "glm2-lora" 120 40 "$B/bench_train" --family chatglm2 --lora 8 --runs 512x8 --out "$OUT/attn90-glm2.jsonl" ;;
    torch-glm2-lora) run_capped "torch-glm2-lora" 200 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_glm2.py --gqa expand --runs 512x8 \
        --lora 8 --out "$OUT/attn90-torch-glm2.jsonl" ;;
    torch) # one process a run: W2 after W1 in one process ran out of memory (2026-12-02)
        for r in 512x8 2048x2; do
            run_capped "torch-$r" 200 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_baseline.py --runs $r --out "$OUT/attn90-torch-train.jsonl"
        done ;;
    torch-w2) run_capped "torch-2048x2" 200 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_baseline.py --runs 2048x2 --out "$OUT/attn90-torch-train.jsonl" ;;
    torch-lora) run_capped "torch-lora" 240 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x8,2048x2 --lora 8 \
        --lora_target qkv --out "$OUT/attn90-torch-lora.jsonl" ;;
    tune-ab)
        for r in 1 2; do
            for tune in 1 0; do
                run_capped "lora-tune$tune-$r" 60 15 env GLM_CUDA_GEMM_TUNE=$tune "$B/bench_train" --lora 8 --runs 512x8 \
                    --out "$OUT/attn90-lora.jsonl"
            done
        done ;;
    clk-lora) with_clocks clk-lora run_capped "clk-lora" 120 30 "$B/bench_train" --lora 8 --runs 512x8 \
        --out "$OUT/attn90-lora.jsonl" ;;
    clk-torch-lora) with_clocks clk-torch-lora run_capped "clk-torch-lora" 200 80 env PYTHONUNBUFFERED=1 $PY \
        bench/pytorch_lora.py --runs 512x8 --lora 8 --lora_target qkv --out "$OUT/attn90-torch-lora.jsonl" ;;
    torch-lora-prof) run_capped "torch-lora-prof" 200 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_lora.py --runs 512x8 --lora 8 \
        --lora_target qkv --profile --out "$OUT/attn90-torch-lora.jsonl" ;;
    lora-torchblas)
        TL=$($PY -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
        BL=$(dirname "$(find "$TL/nvidia" -name 'libcublasLt.so*' | head -1)")
        echo "torch's cuBLAS: $BL ($(ls "$BL" | tr '\n' ' ')); pip: $($PY -m pip list 2>/dev/null | grep -i cublas | tr -s ' ')" |
            tee -a "$SUMMARY"
        echo "the CUDA install's: $(ls -l /usr/local/cuda/lib64/libcublasLt.so* 2>/dev/null | awk '{print $NF}' | tr '\n' ' ')" |
            tee -a "$SUMMARY"
        env LD_LIBRARY_PATH="$BL:${LD_LIBRARY_PATH:-}" ldd "$B/bench_train" | grep -i cublas | tee -a "$SUMMARY"
        run_capped "lora-torchblas" 120 40 env LD_LIBRARY_PATH="$BL:${LD_LIBRARY_PATH:-}" "$B/bench_train" --lora 8 \
            --runs 512x8 --detail --out "$OUT/attn90-lora.jsonl"
        grep -A45 "per-op" "$OUT/logs/lora-torchblas.txt" >"$OUT/logs/profile-lora-torchblas.txt" ;;
    gemm-names)
        for tune in 1 0; do
            run_capped "gemm-ncu-tune$tune" 150 30 env GLM_CUDA_GEMM_TUNE=$tune ncu --clock-control none --cache-control none \
                --metrics gpu__time_duration.sum -k regex:'nvjet|gemm|cutlass|xmma' --print-summary per-kernel \
                "$B/bench_train" --lora 8 --runs 512x8 --layers 2 --steps 1 --warmup 1
        done
        run_capped "lora-notune" 120 40 env GLM_CUDA_GEMM_TUNE=0 "$B/bench_train" --lora 8 --runs 512x8 --detail \
            --out "$OUT/attn90-lora.jsonl"
        grep -A45 "per-op" "$OUT/logs/lora-notune.txt" >"$OUT/logs/profile-lora-notune.txt" ;;
    torch-glm2)
        run_capped "torch-glm2" 240 90 env PYTHONUNBUFFERED=1 $PY bench/pytorch_glm2.py --gqa expand --runs 512x8,2048x2 \
            --out "$OUT/attn90-torch-glm2.jsonl"
        run_capped "torch-glm2-lora" 200 80 env PYTHONUNBUFFERED=1 $PY bench/pytorch_glm2.py --gqa expand --runs 512x8 --lora 8 \
            --out "$OUT/attn90-torch-glm2.jsonl" ;;
    ops)
        run_capped "ops" 60 10 "$B/bench_ops" --out "$OUT/attn90-ops.jsonl"
        run_capped "ops-ncu" 120 20 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:lora \
            "$B/bench_ops" --reps 1 ;;
    ops-full) # ncu's full set on one launch of each small kernel (the logs hold the sections)
        run_capped "ops-p0" 60 10 "$B/bench_ops" --dropout 0
        for k in lora_down_tc lora_bwd_tc layernorm_fwd layernorm_bwd; do
            run_capped "ncu-$k" 90 20 ncu --clock-control none --set full -k regex:$k -c 1 "$B/bench_ops" --reps 1
        done ;;
    racecheck) run_capped "san-racecheck" 120 30 compute-sanitizer --tool racecheck "$B/tests/cuda/test_cuda_ops" --quick --attention --only bf16 ;;
    sanitize)
        for tool in memcheck racecheck; do
            run_capped "san-$tool" 150 30 compute-sanitizer --tool $tool "$B/tests/cuda/test_cuda_ops" --quick --attention
        done ;;
    sanitize-all) # every op's bf16 case (LoRA, rotary, norms, reductions, attention...), small shapes.
        # racecheck reports hazards inside cuBLAS's own split-K kernels (nvjet*); leaving them out
        # (--kernel-name-exclude kns=nvjet) made the sanitizer fail inside one (2026-12-02), so the
        # line below counts the reports naming any other kernel: this project's
        run_capped "san-all-memcheck" 200 40 compute-sanitizer --tool memcheck "$B/tests/cuda/test_cuda_ops" --quick --only bf16
        run_capped "san-all-racecheck" 200 40 compute-sanitizer --tool racecheck "$B/tests/cuda/test_cuda_ops" --quick --only bf16
        echo "racecheck reports outside cuBLAS: $(grep 'Race reported' "$OUT/logs/san-all-racecheck.txt" | grep -vc nvjet)" |
            tee -a "$SUMMARY" ;;
    *) echo "unknown mode $mode" ;;
    esac
done
[ -n "$SKIPPED" ] && echo "skipped:$SKIPPED"
echo "done after $((SECONDS - T0))s"
session_pack
