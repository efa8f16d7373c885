#!/usr/bin/env bash
# Pipeline parallelism on CPU ranks under mpirun, through tests/c/tool_pp_train (a tiny GLM,
# synthetic micro-batches, 20 optimizer steps):
#   - P=2, P=5 (thudm map), untied head with gradient checkpointing (bit for bit), and one
#     micro-batch per step reproduce the single-process loss curve within 1e-6 relative;
#   - checkpoints resume across layouts: P=2 -> 1 process, P=2 -> P=3, continuing the
#     uninterrupted curve;
# (P=3 and P=2 x D=2 through glmtrain train itself: tests/py/test_pipeline.py)
#   - a rank that stops answering makes its neighbour fail within the timeout naming both ranks.
# SKIP when mpirun or the MPI build is missing.
set -u
cd "$(dirname "$0")/../.."
BUILD=${GLM_BUILD:-build}
PY=${GLM_PYTHON:-/usr/bin/python3}
T=$BUILD/tests/tool_pp_train
if ! command -v mpirun >/dev/null 2>&1; then echo "SKIP pipeline: mpirun is not installed"; exit 0; fi
if [ ! -x "$T" ]; then echo "SKIP pipeline: $T is not built"; exit 0; fi
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
M="mpirun --oversubscribe --allow-run-as-root --bind-to none"
if ! $M -np 1 "$T" --steps 1 >/dev/null 2>&1 || $M -np 1 "$T" --steps 1 2>&1 | grep -q '^SKIP'; then
    echo "SKIP pipeline: $T cannot run under mpirun (built without MPI?)"; exit 0
fi
w=$(mktemp -d /tmp/glm_pp.XXXXXX)
trap 'rm -rf "$w"' EXIT

# compare NAME RUN REF: RUN's steps (the last ones of REF when RUN resumed) within 1e-6
compare() {
    "$PY" - "$1" "$2" "$3" <<'EOF'
import sys
name, run, ref = sys.argv[1:]
try:
    a = [l.split() for l in open(run) if l.startswith("step ")]
    b = [l.split() for l in open(ref) if l.startswith("step ")]
    b = b[len(b) - len(a):]
    ok = len(a) > 0 and [x[1] for x in a] == [x[1] for x in b]
    worst = max(abs(float(x[3]) - float(y[3])) / abs(float(y[3])) for x, y in zip(a, b)) if ok else float("inf")
    ok = ok and worst <= 1e-6
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": %d steps, worst relative difference %.3g" % (len(a), worst)))
except Exception as e:
    print("FAIL %s: %s" % (name, e))
EOF
}

# run NAME NP ARGS...: output in $w/NAME.txt; a failure prints its log
run() {
    local name=$1 np=$2; shift 2
    if [ "$np" = 0 ]; then "$T" "$@" >"$w/$name.txt" 2>"$w/$name.err"; else $M -np "$np" "$T" "$@" >"$w/$name.txt" 2>"$w/$name.err"; fi
    local rc=$?
    [ $rc -ne 0 ] && { echo "  $name exited $rc:"; tail -5 "$w/$name.err" | sed 's/^/    /'; }
    return 0
}

run ref 0
run ref_untied 0 --tie 0 --ckpt 1
run ref_m1 0 --micro 1
run p2 2 --pp 2;                      compare pipeline_p2_matches_single "$w/p2.txt" "$w/ref.txt"
run p5 5 --pp 5 --map thudm;          compare pipeline_p5_thudm_matches_single "$w/p5.txt" "$w/ref.txt"
run p2u 2 --pp 2 --tie 0 --ckpt 1;    compare pipeline_p2_untied_checkpointing "$w/p2u.txt" "$w/ref_untied.txt"
run p2s 2 --pp 2 --tie 0 --ckpt 2;    compare pipeline_p2_untied_selective_checkpointing "$w/p2s.txt" "$w/ref_untied.txt"
run p2m1 2 --pp 2 --micro 1;          compare pipeline_p2_one_microbatch "$w/p2m1.txt" "$w/ref_m1.txt"

# resume across layouts from step 10
run save2 2 --pp 2 --steps 10 --save_at 10 --out "$w/ck2"
if [ -f "$w/ck2/checkpoint-10/model.safetensors.index.json" ] && [ -f "$w/ck2/checkpoint-10/trainer_state.json" ]; then
    echo "PASS pipeline_checkpoint_is_one_hf_folder"
else
    echo "FAIL pipeline_checkpoint_is_one_hf_folder: $(ls "$w/ck2/checkpoint-10" 2>&1 | tr '\n' ' ')"
fi
run r21 0 --resume "$w/ck2/checkpoint-10";        compare pipeline_resume_p2_on_one_process "$w/r21.txt" "$w/ref.txt"
run r23 3 --pp 3 --resume "$w/ck2/checkpoint-10"; compare pipeline_resume_p2_on_p3 "$w/r23.txt" "$w/ref.txt"

# a stage that stops answering: its neighbour gives up within the timeout, naming both ranks
t0=$SECONDS
timeout 60 $M -np 2 "$T" --pp 2 --timeout 1 --hang_rank 1 >"$w/hang.txt" 2>"$w/hang.err"
rc=$?
if [ $rc -ne 0 ] && [ $((SECONDS - t0)) -lt 30 ] && grep -q "rank 0: pipeline .*rank 1.* at step 2 timed out" "$w/hang.err"; then
    echo "PASS pipeline_stuck_neighbour_times_out"
else
    echo "FAIL pipeline_stuck_neighbour_times_out: rc $rc after $((SECONDS - t0)) s: $(grep -m2 -i 'error\|timed' "$w/hang.err")"
fi
