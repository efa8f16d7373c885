# Shared by the bench scripts (sourced): where the real ChatGLM-6B tokenizer is, and the capped
# runs of the one-call GPU sessions.
# find_tokenizer NAME: sets TOKENIZER to the first folder holding ice_text.model among $TOKENIZER,
# ../shared/tokenizers/chatglm-6b and build/shared/tokenizers/chatglm-6b (what the GPU runs carry),
# or exits naming the script.
find_tokenizer() {
    local t
    for t in "${TOKENIZER:-}" ../shared/tokenizers/chatglm-6b build/shared/tokenizers/chatglm-6b; do
        if [ -n "$t" ] && [ -f "$t/ice_text.model" ]; then TOKENIZER=$t; return 0; fi
    done
    echo "$1: no ChatGLM-6B tokenizer (set TOKENIZER)"
    exit 1
}

# w1_workdir DIR LAYERS: DIR made afresh with W1's data and config.json (bench/w1_data.py) and
# tiny.json, the same config at hidden 256, LAYERS layers, 4 heads and inner 1024 (ChatGLM-6B's
# vocabulary kept): the small model the end-to-end checks train.
w1_workdir() {
    rm -rf "$1" && mkdir -p "$1"
    python3 "$(dirname "${BASH_SOURCE[0]}")/w1_data.py" "$1"
    python3 - "$1" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
c.update(hidden_size=256, num_layers=int(sys.argv[2]), num_attention_heads=4, inner_hidden_size=1024)
json.dump(c, open(sys.argv[1] + "/tiny.json", "w"))
PY
}

# run_capped NAME CAP MIN CMD...: CMD's output into $OUT/logs/NAME.txt under a timeout of at most
# CAP seconds, or what is left of $BUDGET (counted from $T0) less 15 s; skipped (and named in
# $SKIPPED) when fewer than MIN seconds are left. The result lines (those matching $KEEP) go to
# stdout and are appended to $SUMMARY.
run_capped() {
    local name=$1 cap=$2 min=$3 t rc
    shift 3
    t=$((BUDGET - (SECONDS - T0) - 15))
    [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt "$min" ]; then echo "=== $name: SKIPPED (${t}s left)"; SKIPPED="$SKIPPED $name"; return 0; fi
    echo "=== $name ($((SECONDS - T0))s into the call)"
    timeout -k 5 "$t" "$@" >"$OUT/logs/$name.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && echo "    $name: exit $rc" && tail -n 8 "$OUT/logs/$name.txt" | sed 's/^/    /'
    grep -hE "$KEEP" "$OUT/logs/$name.txt" | grep -v "^    .* 0\.[0-4][0-9] ms" | head -40 | tee -a "$SUMMARY"
    return 0
}

# session_setup NAME: what a one-call GPU session sets up first: NCCL without multicast, $OUT/logs,
# the carried libraries and oracles, B (the build), PY, BUDGET (default 540 s) from T0 = now,
# J = $OUT/NAME.jsonl and SUMMARY = $OUT/NAME.txt, and the machine in $OUT/env.txt.
session_setup() {
    export NCCL_NVLS_ENABLE=0
    OUT=${OUT:-gpu-out}
    mkdir -p "$OUT/logs"
    export LD_LIBRARY_PATH="$PWD/build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export GLM_SHARED="$PWD/build/shared"
    B=${BUILD:-build/gpu}
    PY=${PY:-python3}
    BUDGET=${BUDGET:-540}
    T0=$SECONDS
    J="$OUT/$1.jsonl"
    SUMMARY="$OUT/$1.txt"
    SKIPPED=""
    { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      # the device's copy of the tree may carry an older .git (2026-12-04: it named the commit of
      # the session before), so the caller passes the hash it built: GLM_COMMIT=$(git rev-parse HEAD)
      if [ -n "${GLM_COMMIT:-}" ]; then echo "commit $GLM_COMMIT"
      else echo "commit $(git log -1 --format=%H 2>/dev/null) (the device copy's git: may lag; set GLM_COMMIT)"; fi
    } >"$OUT/env.txt" 2>&1
}

# run_gpu_tests CAP: the GPU tests (tests/run_cuda.sh, no sanitizers) under a timeout of
# $TESTS_CAP or CAP seconds, the output in $OUT/test-cuda.txt and its result lines on stdout.
run_gpu_tests() {
    local cap=${TESTS_CAP:-$1}
    LOGDIR="$OUT/logs/tests" BUILD=$B NO_SANITIZER=1 TEST_TIMEOUT=$cap timeout -k 5 "$cap" bash tests/run_cuda.sh >"$OUT/test-cuda.txt" 2>&1
    echo "tests: exit $? after $((SECONDS - T0))s"
    grep -E "passed|FAIL" "$OUT/test-cuda.txt" | tail -14
}

# session_pack: the logs folder as one archive ($OUT/logs.tgz): a call brings back only a few
# files, and a folder of many logs came back empty ("count") on 2026-12-02
session_pack() {
    tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null && rm -rf "$OUT/logs"
}

# with_clocks NAME CMD...: CMD with nvidia-smi sampling the SM clock, power and throttle reasons
# every 50 ms into $OUT/logs/NAME.csv; then one line: the medians over the samples drawing over
# 300 W (the busy ones) and the throttle reasons seen there
with_clocks() {
    local name=$1 pid
    shift
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv,noheader,nounits -lms 50 >"$OUT/logs/$name.csv" 2>/dev/null &
    pid=$!
    "$@"
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    local busy="$OUT/logs/$name.busy"
    awk -F', *' '$3 > 300' "$OUT/logs/$name.csv" >"$busy"
    local k; k=$(wc -l <"$busy")
    if [ "$k" -eq 0 ]; then echo "$name: no busy samples" | tee -a "$SUMMARY"; return 0; fi
    col() { cut -d, -f"$1" "$busy" | tr -d ' ' | sort -n; } # column N of the busy samples, ascending
    echo "$name: $k busy samples, SM clock median $(col 2 | sed -n "$(((k + 1) / 2))p") MHz (min $(col 2 | head -1))," \
        "power median $(col 3 | sed -n "$(((k + 1) / 2))p") W, throttle reasons:" \
        "$(cut -d, -f5 "$busy" | sort | uniq -c | awk '{printf " %s x%s", $2, $1}')" | tee -a "$SUMMARY"
}

# smoke_setup NAME [BUILD_DIR]: a GPU smoke script's start: B (default build/gpu), the carried
# libraries on LD_LIBRARY_PATH, TOK (the carried ChatGLM-6B tokenizer), a fresh work folder W.
smoke_setup() {
    B=${2:-build/gpu}
    export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
    TOK=$PWD/build/shared/tokenizers/chatglm-6b/ice_text.model
    W=$(mktemp -d "/tmp/glm-$1.XXXXXX")
}

# The smoke scripts' PASS/FAIL line: smoke_ok STATUS NAME (a failure shows the end of $W/log).
smoke_ok() { if [ "$1" -eq 0 ]; then echo "PASS $2"; else echo "FAIL $2"; tail -5 "$W/log"; fi; }

# serve_start LOG ARGS...: `$B/glmtrain serve --port 0 ARGS` in the background, its stderr in LOG;
# waits up to 90 s for it to listen and sets SERVE_PID and SERVE_PORT (0 when it did not start).
serve_start() {
    local log=$1
    shift
    "$B/glmtrain" serve --port 0 "$@" 2>"$log" &
    SERVE_PID=$!
    for _ in $(seq 1 90); do grep -q "serving " "$log" && break; sleep 1; done
    SERVE_PORT=$(grep -o "http://127.0.0.1:[0-9]*" "$log" | head -1 | cut -d: -f3)
    SERVE_PORT=${SERVE_PORT:-0}
}
serve_stop() { kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; }
