#!/usr/bin/env bash
# GPU test suite (`make test-cuda`, on a machine with an NVIDIA GPU): runs every binary in
# $BUILD/tests/cuda/, then the op tests again (--quick shapes) under compute-sanitizer memcheck
# and racecheck. Counts PASS/FAIL/SKIP lines like tests/run.sh and ends with
# "N passed, N failed, N skipped". Logs go to $LOGDIR (default: a temporary folder).
# Needs GLM_SHARED (the folder holding oracles/chatglm-cpp) for the oracle check.
set -u
BUILD=${BUILD:-build}
TIMEOUT=${TEST_TIMEOUT:-900}
LOGDIR=${LOGDIR:-$(mktemp -d)}
mkdir -p "$LOGDIR"
pass=0; fail=0; skip=0
count() { # name logfile rc
    local name=$1 log=$2 rc=$3 p f s
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    grep -E '^(FAIL|SKIP) ' "$log" | sed "s|^|  $name: |"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "  $name: FAIL exit code $rc (crash or timeout); last lines:"; tail -n 15 "$log" | sed 's/^/    /'
        f=1
    fi
    printf '%-40s %3d passed %3d failed %3d skipped\n' "$name" "$p" "$f" "$s"
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
if ! command -v nvidia-smi >/dev/null 2>&1 && [ ! -e /dev/nvidia0 ]; then
    echo "SKIP test-cuda: no NVIDIA GPU on this machine"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
for t in "$BUILD"/tests/cuda/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    t0=$SECONDS
    timeout "$TIMEOUT" "$t" >"$LOGDIR/$n.log" 2>&1
    count "$n ($((SECONDS - t0))s)" "$LOGDIR/$n.log" $?
done
# compute-sanitizer on the op tests (small shapes: the tools slow kernels 10-100x); the toolkit's
# bin folder is often not on PATH where the driver is
[ -d /usr/local/cuda/bin ] && PATH="$PATH:/usr/local/cuda/bin"
if command -v compute-sanitizer >/dev/null 2>&1 && [ -x "$BUILD/tests/cuda/test_cuda_ops" ] && [ -z "${NO_SANITIZER:-}" ]; then
    for tool in memcheck racecheck; do
        log="$LOGDIR/sanitizer_$tool.log"
        t0=$SECONDS
        timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/tests/cuda/test_cuda_ops" --quick >"$log" 2>&1
        rc=$?
        summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
        if [ "$rc" -eq 0 ] && ! grep -q '^FAIL ' "$log"; then
            echo "PASS sanitizer_$tool ($summary)" >"$log.result"
        else
            echo "FAIL sanitizer_$tool: exit $rc; $summary" >"$log.result"
            grep -E '^=========' "$log" | head -20 >>"$log.result"
        fi
        cat "$log.result"
        count "sanitizer_$tool ($((SECONDS - t0))s)" "$log.result" 0
    done
else
    echo "SKIP sanitizer: compute-sanitizer not found (or NO_SANITIZER set)"; skip=$((skip + 1))
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
