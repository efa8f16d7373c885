#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz with clang (fuzzer + ASan + UBSan) and runs each
# for a bounded time (FUZZ_SECONDS, default 20) from a seed corpus made here: files written by
# Python's safetensors and torch.save when they are installed, plus hand-made ones. Prints one
# PASS/FAIL/SKIP line per target; a crash leaves its input in FUZZ_ARTIFACTS (default /tmp).
set -u
cd "$(dirname "$0")/../.."
SECS=${FUZZ_SECONDS:-20}
ART=${FUZZ_ARTIFACTS:-/tmp}
PY=${GLM_PYTHON:-/usr/bin/python3}
TARGETS="safetensors torchbin"
if ! command -v clang >/dev/null 2>&1; then
    for t in $TARGETS; do echo "SKIP fuzz_$t: clang is not installed (apt-get install clang)"; done
    exit 0
fi
work=$(mktemp -d /tmp/glm_fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/seed_safetensors" "$work/seed_torchbin"

# Hand-made seeds: valid, and a few near misses.
st_seed() { # name header
    local n=${#2}
    printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))" >"$work/seed_safetensors/$1"
    printf '%s' "$2" >>"$work/seed_safetensors/$1"
    head -c 64 /dev/zero >>"$work/seed_safetensors/$1"
}
st_seed ok '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F16","shape":[4],"data_offsets":[16,24]}}'
st_seed bf '{"w":{"dtype":"BF16","shape":[3,1],"data_offsets":[0,6]},"i":{"dtype":"I64","shape":[],"data_offsets":[6,14]}}'
st_seed overlap '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}'
printf '\x00\x80\x02}.' >"$work/seed_torchbin/empty_dict"

# Seeds from the real libraries, when present (failures here only mean fewer seeds).
"$PY" - "$work" <<'EOF' 2>/dev/null || true
import io, os, sys, zipfile
work = sys.argv[1]
import numpy as np
try:
    import safetensors.numpy as stn
    stn.save_file({"x": np.arange(6, dtype=np.float32).reshape(2, 3), "h": np.ones(3, np.float16), "i": np.arange(2)},
                  os.path.join(work, "seed_safetensors", "py"))
except Exception:
    pass
import torch
base = torch.arange(12.0)
objs = {"plain": {"w": torch.ones(2, 3).half(), "b": torch.zeros(3)},
        "views": {"a": base, "v": base[2:6], "t": base.view(3, 4).t(), "p": torch.nn.Parameter(torch.ones(2).bfloat16())},
        "module": torch.nn.Linear(3, 2).state_dict()}
for name, obj in objs.items():
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = buf.getvalue()
    open(os.path.join(work, "seed_torchbin", name + "_zip"), "wb").write(b"\x01" + raw)
    z = zipfile.ZipFile(io.BytesIO(raw))
    pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
    # pickle mode: storage keys are "0", "1" with 64 bytes each in the wrapper
    open(os.path.join(work, "seed_torchbin", name + "_pkl"), "wb").write(b"\x00" + z.read(pkl))
EOF

CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-sanitize-recover=all -Isrc -I/usr/include/cjson -Itests/c"
SAN="address,undefined"
# The library once (two at a time), then each target linked against it.
mkdir -p "$work/obj"
i=0
for src in src/io/*.c src/core/err.c src/core/fileutil.c; do
    clang $CFLAGS -fsanitize=fuzzer-no-link,$SAN -c "$src" -o "$work/obj/$(echo "$src" | tr / _).o" 2>>"$work/build.log" &
    i=$((i + 1)); [ $((i % 2)) -eq 0 ] && wait
done
wait
for t in $TARGETS; do
    if ! clang $CFLAGS -fsanitize=fuzzer,$SAN "tests/fuzz/fuzz_$t.c" "$work"/obj/*.o -lcjson -lm -o "$work/fuzz_$t" \
        >>"$work/build.log" 2>&1; then
        echo "FAIL fuzz_$t: clang build failed"; head -20 "$work/build.log"
        continue
    fi
    mkdir -p "$work/corpus_$t"
    "$work/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
        -artifact_prefix="$ART/glm_fuzz_${t}_" "$work/corpus_$t" "$work/seed_$t" >"$work/run_$t.log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/run_$t.log" | grep -o '[0-9]*$')
    if [ "$rc" -eq 0 ]; then
        echo "PASS fuzz_$t (${runs:-?} inputs in ${SECS}s, $(ls "$work/seed_$t" | wc -l) seeds)"
    else
        echo "FAIL fuzz_$t: fuzzer exit $rc; crashing input saved under $ART/glm_fuzz_${t}_*"
        grep -E 'ERROR|SUMMARY|runtime error|#[0-9]+ 0x' "$work/run_$t.log" | head -25
    fi
done
