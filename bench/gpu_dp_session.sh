#!/usr/bin/env bash
# One device call on a 2-GPU machine for data-parallel scaling (issue 6): W1 on 1 GPU, then on
# 2 GPUs with ZeRO 0 and 1 under each variant in VARIANTS (a label and its environment,
# comma-separated), all through bench/bench_dp.sh in the same call, so every scaling figure has
# its 1-GPU baseline beside it. Each record carries rank 0's step phases (fwd+bwd / gradient
# reduction tail / norm / update, ms). $OUT gets all.jsonl, logs.tgz (every run's log), env.txt.
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
WORK=${WORK:-/tmp/dpwork} # data and per-run logs
mkdir -p "$OUT" "$WORK"
{ nvidia-smi topo -m; NCCL_DEBUG=VERSION timeout 30 "$GLM" env; } >"$OUT/env.txt" 2>&1
grep -iE "NCCL version|GPU 1 " "$OUT/env.txt" | head -3
bench() { # tag, gpus, zero stages, env...
    local tag=$1 n=$2 z=$3; shift 3
    echo "=== $tag on $n GPU(s) ($*) $(date -u +%H:%M:%S)"
    env "$@" GLM=$GLM OUT=$WORK GPUS=$n BATCHES=8 ZERO="$z" STEPS=$STEPS WARM=3 TAG=$tag RUN_TIMEOUT=120 \
        timeout 300 bash bench/bench_dp.sh >"$WORK/session-$tag.log" 2>&1
    pkill -f "$GLM train" 2>/dev/null; sleep 1 # nothing left holding the GPUs
    cat "$WORK/summary.txt" >>"$OUT/all.jsonl"
}
bench 1gpu 1 0
for v in $VARIANTS; do
    envs=${v#*:}
    bench "${v%%:*}" 2 "$ZERO" ${envs//,/ }
done
tar czf "$OUT/logs.tgz" -C "$WORK" $(cd "$WORK" && ls *.log) 2>/dev/null
python3 - "$OUT/all.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["tokens_per_s_per_gpu"] for r in recs if r["gpus"] == 1), 0)
for r in recs:
    print("%-6s gpus %d zero %d  %6d tok/s/GPU  %5.1f%%  phases %s  exit %d" % (r["tag"], r["gpus"], r["zero"],
          r["tokens_per_s_per_gpu"], 100.0 * r["tokens_per_s_per_gpu"] / base if base else 0,
          r["rank0_ms_fwdbwd_tail_norm_update"], r["exit"]))
EOF
