#!/usr/bin/env bash
# The long campaign behind docs/RELIABILITY.md's figures: each target in turn (one fuzzer
# process at a time, nice 19) for LONG_SECONDS (default 600) from the committed seeds, with
# its own fresh corpus. Usage: bash tests/fuzz/long_run.sh OUT_DIR [target...]
# OUT_DIR/summary.txt gets one line per target: seconds, executions, exec/s, corpus, cov, ft,
# crash files; OUT_DIR/long_<target>.log is libFuzzer's output.
set -u
cd "$(dirname "$0")/../.."
out=${1:?usage: long_run.sh OUT_DIR [target...]}
shift
secs=${LONG_SECONDS:-600}
targets=${*:-safetensors torchbin config args_config json_records spm_model tokenizer_text tool_calls serve_request serve_score adapter_config dataset_info tokenizer_folder}
mkdir -p "$out"
out=$(realpath "$out")
for t in $targets; do
    # rebuilt per target, so a fix made while earlier targets ran is in
    FUZZ_BUILD="$out/build" FUZZ_BUILD_ONLY=1 FUZZ_TARGETS=$t nice -n 19 bash tests/sh/test_fuzz.sh
    export GLM_FUZZ_TOKENIZERS="$(cat "$out/build/tokenizers.txt")"
    export GLM_FUZZ_SERVE_TOKENIZERS="$(cat "$out/build/serve_tokenizers.txt")"
    rm -rf "$out/corpus_$t" "$out/crash_$t" && mkdir -p "$out/corpus_$t" "$out/crash_$t"
    start=$(date +%s)
    nice -n 19 "$out/build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -print_final_stats=1 -artifact_prefix="$out/crash_$t/" "$out/corpus_$t" "tests/fuzz/seeds/$t" "$out/build/gen/$t" \
        >"$out/long_$t.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/long_$t.log" | grep -o '[0-9]*$')
    last=$(grep -E '^#[0-9]+' "$out/long_$t.log" | grep -E 'cov:' | tail -1)
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
    ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
    corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' | cut -d' ' -f2)
    crashes=$(ls "$out/crash_$t" | wc -l)
    echo "$t rc=$rc seconds=$took execs=${runs:-?} exec_per_s=$(( ${runs:-0} / (took > 0 ? took : 1) )) corpus=$corp cov=$cov ft=$ft crash_files=$crashes" >>"$out/summary.txt"
done
