#!/usr/bin/env bash
# Tokenizer throughput: glmtrain against spm_encode on the same corpus (>= 5 MB: Chinese poems and
# fortunes from fortunes-zh, English licence texts, C/Python source) with the real ChatGLM-6B
# ice_text.model, single-threaded, in one run. Prints a small table; each row is the best of
# $REPS runs of the whole process (model load included) plus the load time alone (empty input).
# glmtrain --spm is the like-for-like row (SentencePiece level, output checked identical to
# spm_encode's); the ChatGLM row adds the <n>/<|tab|>/<|blank_N|> layer and [gMASK] <sop>.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MODEL=${GLM_TOKENIZER_MODEL:-../shared/tokenizers/chatglm-6b/ice_text.model}
REPS=${REPS:-3}
MIN_MB=${MIN_MB:-8}
if [ ! -f "$MODEL" ]; then echo "bench_tokenizer: $MODEL not found (the real ChatGLM-6B tokenizer is needed)"; exit 1; fi
command -v spm_encode >/dev/null || { echo "bench_tokenizer: spm_encode not found (apt-get install sentencepiece)"; exit 1; }
# The main CLI when it has the tokenize command, else the same code as a standalone tool.
GLM=("$BUILD/glmtrain" tokenize)
"${GLM[@]}" --help >/dev/null 2>&1 || GLM=("$BUILD/tests/tool_tokenizer")
[ -x "${GLM[0]}" ] || { echo "bench_tokenizer: ${GLM[0]} not built (run make)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
corpus=$tmp/corpus.txt
: >"$corpus"
while [ "$(stat -c %s "$corpus")" -lt $((MIN_MB * 1000000)) ]; do
    for f in /usr/share/games/fortunes/chinese /usr/share/games/fortunes/tang300 /usr/share/games/fortunes/song100 \
             /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0; do
        [ -f "$f" ] && cat "$f" >>"$corpus"
    done
    find src -name '*.c' -o -name '*.h' | sort | head -40 | xargs cat >>"$corpus"
done
bytes=$(stat -c %s "$corpus")
lines=$(wc -l <"$corpus")

now() { date +%s.%N; }
# best wall time of REPS runs: best CMD... (stdin from $2, stdout to $3)
best() {
    local in=$1 out=$2; shift 2
    local b=999999 t0 t1 d
    for _ in $(seq "$REPS"); do
        t0=$(now); "$@" <"$in" >"$out"; t1=$(now)
        b=$(awk -v a="$t0" -v z="$t1" -v b="$b" 'BEGIN { d = z - a; print (d < b ? d : b) }')
    done
    echo "$b"
}
empty=$tmp/empty.txt; : >"$empty"

declare -a names times loads toks
run() { # name, output file, command...
    local name=$1 out=$2; shift 2
    names+=("$name")
    times+=("$(best "$corpus" "$out" "$@")")
    loads+=("$(best "$empty" /dev/null "$@")")
    toks+=("$(wc -w <"$out")")
}
run "spm_encode (SentencePiece 0.1.97)" "$tmp/spm.ids" spm_encode --model="$MODEL" --output_format=id
run "glmtrain --spm, 1 thread" "$tmp/glm_spm.ids" "${GLM[@]}" --tokenizer "$MODEL" --spm --threads 1
run "glmtrain ChatGLM ids, 1 thread" "$tmp/glm.ids" "${GLM[@]}" --tokenizer "$MODEL" --threads 1
ncpu=$(nproc)
run "glmtrain ChatGLM ids, $ncpu threads" "$tmp/glm_mt.ids" "${GLM[@]}" --tokenizer "$MODEL" --threads "$ncpu"

same=no; cmp -s "$tmp/spm.ids" "$tmp/glm_spm.ids" && same=yes
printf '\ncorpus: %d bytes (%.1f MB), %d lines; model %s; best of %d runs\n' "$bytes" "$(awk -v b="$bytes" 'BEGIN { print b / 1e6 }')" "$lines" "$MODEL" "$REPS"
printf '%-36s %8s %8s %9s %11s %14s %8s\n' "tokenizer" "wall s" "load s" "MB/s" "Mtokens/s" "MB/s w/o load" "speedup"
for i in "${!names[@]}"; do
    awk -v n="${names[$i]}" -v t="${times[$i]}" -v l="${loads[$i]}" -v k="${toks[$i]}" -v b="$bytes" -v t0="${times[0]}" \
        'BEGIN { e = t - l; if (e < 0.001) e = 0.001;
                 printf "%-36s %8.3f %8.3f %9.2f %11.2f %14.2f %7.2fx\n", n, t, l, b / t / 1e6, k / t / 1e6, b / e / 1e6, t0 / t }'
done
echo "glmtrain --spm output identical to spm_encode: $same (${toks[0]} ids)"
[ "$same" = yes ]
