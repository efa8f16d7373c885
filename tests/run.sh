#!/usr/bin/env bash
# Runs every test binary (build/tests/test_*) and script (tests/py/test_*.py, tests/sh/test_*.sh)
# and counts their PASS/FAIL/SKIP lines. A program that exits non-zero without printing a FAIL
# line (a crash, a timeout) counts as one failure. Ends with "N passed, N failed, N skipped".
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
TIMEOUT=${TEST_TIMEOUT:-600}
export GLM_BUILD=$BUILD GLM_PYTHON=$PYTHON
# spinning OpenMP threads starve each other when the machine is shared; sleeping costs little here
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
pass=0; fail=0; skip=0
log=$(mktemp)
run_one() {
    local name=$1; shift
    local t0=$SECONDS
    timeout "$TIMEOUT" "$@" >"$log" 2>&1
    local rc=$?
    local p f s
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    grep -E '^(FAIL|SKIP) ' "$log" | sed "s|^|  $name: |"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "  $name: FAIL exit code $rc (crash or timeout); last lines:"; tail -n 15 "$log" | sed 's/^/    /'
        f=1
    fi
    if [ "$f" -gt 0 ]; then grep -B3 -A12 '^FAIL ' "$log" | grep -v '^PASS ' | head -40 | sed 's/^/    | /'; fi
    printf '%-40s %3d passed %3d failed %3d skipped  (%ds)\n' "$name" "$p" "$f" "$s" $((SECONDS - t0))
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
if [ -z "${ONLY_C:-}" ]; then
    for t in tests/py/test_*.py; do [ -f "$t" ] && run_one "$(basename "$t")" "$PYTHON" "$t"; done
    for t in tests/sh/test_*.sh; do [ -f "$t" ] && run_one "$(basename "$t")" bash "$t"; done
fi
# ASAN_PY: scripts that also run with ONLY_C (the sanitizer build's servers: threads and request
# lifetimes the C tests do not reach). Every process's sanitizer report goes to a file; a script
# that leaves one counts as a failure, whatever its own lines say.
if [ -n "${ONLY_C:-}" ] && [ -n "${ASAN_PY:-}" ]; then
    adir=$(mktemp -d)
    for t in $ASAN_PY; do
        export ASAN_OPTIONS="log_path=$adir/asan:detect_leaks=1" UBSAN_OPTIONS="log_path=$adir/ubsan:print_stacktrace=1"
        run_one "$(basename "$t")" "$PYTHON" "$t"
        unset ASAN_OPTIONS UBSAN_OPTIONS
        if ls "$adir"/* >/dev/null 2>&1; then
            echo "  $(basename "$t"): FAIL sanitizer report:"; head -n 40 "$adir"/* | sed 's/^/    /'
            fail=$((fail + 1)); rm -f "$adir"/*
        fi
    done
    rm -rf "$adir"
fi
rm -f "$log"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
