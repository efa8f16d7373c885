#!/usr/bin/env bash
# One device call on the GPU machine, with binaries built on the CPU machine (see
# docs/GPU-TESTS.md): `make MPI=0 BUILD=build/gpu ...`, then carry build/gpu/tests/cuda,
# build/gpu/bench_train, build/lib (libcjson, libgomp) and build/shared (the oracle).
# Logs land in $OUT (or ./gpu-out).
#   bash bench/gpu_session.sh first|tests|bench|torch|all  [bench_train runs]
# "first" runs each op-test variant on its own with GLM_CUDA_SYNC=1 (a crash names its op and
# spares the other variants), the model tests and one bf16 benchmark, no sanitizer, no torch.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export GLM_SHARED="$PWD/build/shared"
B=${BUILD:-build/gpu}
mode=${1:-all}
runs=${2:-512x4,512x8,512x8c,2048x2}
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
    ldd $B/tests/cuda/test_cuda_ops | grep -i "not found"
    git log -1 --format='commit %H' 2>/dev/null
} 2>&1 | tee "$OUT/env.txt"
if [ "$mode" = first ]; then
    for v in f32 bf16 f16 bf16simt; do
        GLM_CUDA_SYNC=1 timeout 200 $B/tests/cuda/test_cuda_ops --only $v >"$OUT/ops_$v.txt" 2>&1
        echo "ops $v: exit $? $(tail -1 "$OUT/ops_$v.txt")"; grep -E "^FAIL|error" "$OUT/ops_$v.txt" | head -8
    done
    timeout 300 $B/tests/cuda/test_cuda_model >"$OUT/model.txt" 2>&1
    echo "model: exit $?"; grep -vE "^PASS|^  err" "$OUT/model.txt" | tail -40
    timeout 150 $B/bench_train --runs 512x8,2048x2 --warmup 2 --steps 4 --out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.txt" ||
        GLM_CUDA_ATTN=simt timeout 150 $B/bench_train --runs 512x8 --warmup 1 --steps 2 2>&1 | tee -a "$OUT/bench.txt"
fi
if [ "$mode" = tests ] || [ "$mode" = all ]; then
    LOGDIR="$OUT/tests" BUILD=$B bash tests/run_cuda.sh 2>&1 | tee "$OUT/test-cuda.txt"
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
    timeout 300 $B/bench_train --runs "$runs" ${DETAIL:+--detail} --out "$OUT/bench.jsonl" 2>&1 | tee "$OUT/bench.txt"
    timeout 120 $B/bench_train --fp16 --runs 512x8 --out "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.txt"
    timeout 120 $B/bench_train --fp32 --runs 512x4 --warmup 1 --steps 2 --out "$OUT/bench.jsonl" 2>&1 | tee -a "$OUT/bench.txt"
fi
if [ "$mode" = torch ] || [ "$mode" = all ]; then
    PYTHONUNBUFFERED=1 timeout 400 python3 bench/pytorch_baseline.py --runs "${TORCH_RUNS:-512x8c,512x4}" \
        --out "$OUT/bench.jsonl" 2>&1 | grep -v Warning | tee "$OUT/torch.txt"
fi
# at most 8 files come back: pack everything but the summaries
tar czf /tmp/logs.tgz -C "$OUT" . 2>/dev/null
(cd "$OUT" && find . -mindepth 1 ! -name bench.txt ! -name test-cuda.txt ! -name torch.txt ! -name bench.jsonl -delete)
mv /tmp/logs.tgz "$OUT/logs.tgz"
