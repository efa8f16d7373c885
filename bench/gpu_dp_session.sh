#!/usr/bin/env bash
# One device call on a 2-GPU machine for data-parallel scaling (issue 6): W1 on 1 GPU, then on
# 2 GPUs with ZeRO 0 and 1 under each NCCL variant in VARIANTS (a label and its environment,
# comma-separated), all through bench/bench_dp.sh in the same call, so every scaling figure has
# its 1-GPU baseline beside it. Each record carries rank 0's step phases (fwd+bwd / gradient
# reduction tail / norm / update, ms).
# Build here first: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain; carry build/gpu/glmtrain,
# build/lib (libcjson, libgomp) and build/shared (the ChatGLM-6B tokenizer).
#   VARIANTS="base: ctas8:NCCL_MAX_CTAS=8" bash bench/gpu_dp_session.sh
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
GLM=${GLM:-$PWD/build/gpu/glmtrain}
VARIANTS=${VARIANTS:-base:}
ZERO=${ZERO:-0 1}
STEPS=${STEPS:-12}
mkdir -p "$OUT"
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
NCCL_DEBUG=VERSION timeout 30 "$GLM" env 2>&1 | grep -iE "nccl|gpu" | head -8 | tee "$OUT/env.txt"

GLM=$GLM OUT=$OUT/dp GPUS=1 BATCHES=8 ZERO=0 STEPS=$STEPS WARM=3 TAG=1gpu timeout 120 bash bench/bench_dp.sh >"$OUT/dp-1gpu.log" 2>&1
cat "$OUT/dp/summary.txt" >>"$OUT/all.jsonl"
for v in $VARIANTS; do
    tag=${v%%:*}
    envs=${v#*:}
    echo "=== $tag ($envs) $(date -u +%H:%M:%S)"
    env ${envs//,/ } GLM=$GLM OUT=$OUT/dp GPUS=2 BATCHES=8 ZERO="$ZERO" STEPS=$STEPS WARM=3 TAG=$tag \
        timeout 200 bash bench/bench_dp.sh >"$OUT/dp-$tag.log" 2>&1
    cat "$OUT/dp/summary.txt" >>"$OUT/all.jsonl"
done
python3 - "$OUT/all.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["tokens_per_s_per_gpu"] for r in recs if r["gpus"] == 1), 0)
for r in recs:
    print("%-6s gpus %d zero %d  %6d tok/s/GPU  %5.1f%%  phases %s  exit %d" % (r["tag"], r["gpus"], r["zero"],
          r["tokens_per_s_per_gpu"], 100.0 * r["tokens_per_s_per_gpu"] / base if base else 0,
          r["rank0_ms_fwdbwd_tail_norm_update"], r["exit"]))
EOF
df -h /tmp | tail -1
