#!/usr/bin/env bash
# Issue 22: the guide's machine on GPUs. Needs a kind with several GPUs (nvidia-h200-x4 for the
# 4-GPU runs, -x2 for the 2-GPU ones); each group is one device call of <= 10 minutes. Build
# here first (docs/GPU-TESTS.md), carry build/gpu/glmtrain, build/lib, build/shared.
#   four   4 x H200 at --max_memory_per_gpu 24GiB: ChatGLM-6B full fine-tune in the layout the plan
#          picks (ZeRO-3 + 8-bit moments: 21.9 GiB planned; ZeRO-2 + offload: 19.9), 100 steps,
#          against 1 GPU offloaded in the same call; LoRA r=8 data parallel at the same cap, 4
#          GPUs against 1
#   two    2 x H200: ZeRO-3 at W1 (uncapped and at 24 GiB) against ZeRO-1 in the same call; LoRA
#          and P-Tuning v2 data-parallel scaling
#   check  bench/gpu_check_parallel.sh (fp32: 2 GPUs = 1 GPU for ZeRO 0-3, offload, LoRA)
#   bash bench/gpu_guide_machine.sh check two
set -u
OUT=${OUT:-gpu-out}
export GLM=${GLM:-build/gpu/glmtrain} NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TOKENIZER=${TOKENIZER:-build/shared/tokenizers/chatglm-6b}
CAP="--max_memory_per_gpu 24GiB --gradient_checkpointing"
for mode in "${@:-check}"; do
    case $mode in
    check) OUT=$OUT/check RUN_TIMEOUT=60 bash bench/gpu_check_parallel.sh ;;
    four)
        OUT=$OUT/four-z3 GPUS="4" ZERO=3 BATCHES=8 STEPS=100 WARM=5 RUN_TIMEOUT=420 TAG=cap24-z3-8bit \
            EXTRA="$CAP --optim adamw_8bit" bash bench/bench_dp.sh
        OUT=$OUT/four-off GPUS="1" ZERO=1 BATCHES=16 STEPS=20 WARM=3 RUN_TIMEOUT=240 TAG=cap24-off \
            EXTRA="$CAP --offload_optimizer cpu --gradient_accumulation_steps 4" bash bench/bench_dp.sh
        OUT=$OUT/four-lora GPUS="1 4" ZERO=1 BATCHES=4 STEPS=30 WARM=5 RUN_TIMEOUT=200 TAG=cap24-lora \
            EXTRA="$CAP --finetuning_type lora --lora_rank 8" bash bench/bench_dp.sh ;;
    two)
        OUT=$OUT/two-z GPUS="2" ZERO="1 3" BATCHES=8 STEPS=12 RUN_TIMEOUT=200 bash bench/bench_dp.sh
        OUT=$OUT/two-z3cap GPUS="2" ZERO=3 BATCHES=8 STEPS=12 RUN_TIMEOUT=200 TAG=cap24 EXTRA="$CAP --optim adamw_8bit" bash bench/bench_dp.sh
        OUT=$OUT/two-lora GPUS="1 2" ZERO=1 BATCHES=8 STEPS=20 RUN_TIMEOUT=150 TAG=lora EXTRA="--finetuning_type lora --lora_rank 8" bash bench/bench_dp.sh
        OUT=$OUT/two-ptuning GPUS="1 2" ZERO=1 BATCHES=8 STEPS=20 RUN_TIMEOUT=150 TAG=ptuning EXTRA="--finetuning_type ptuning --pre_seq_len 128" bash bench/bench_dp.sh ;;
    esac
done
