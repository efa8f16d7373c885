#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz (one per parser: safetensors, torch .bin, JSON data
# records, config.json, --config files and flags, SentencePiece .model or GLM-4 rank file, tokenizer input text,
# ChatGLM3's tool-call texts, the bodies `serve` takes (completions and scores), adapter folders' settings, LLaMA-Factory's
# dataset_info.json, a tokenizer folder's tokenizer_config.json)
# with clang (fuzzer + ASan + UBSan, leaks count as crashes) and runs each for FUZZ_SECONDS
# (default 15; `make fuzz` runs 60) from the seed corpus committed in tests/fuzz/seeds/<target>/
# plus seeds made here (Python's safetensors/torch.save files when installed, small tokenizer
# models from spm_train). Prints one PASS/FAIL/SKIP line per target; a crash leaves its input in
# FUZZ_ARTIFACTS (default /tmp).
# Settings: FUZZ_TARGETS (a subset, e.g. "config spm_model"), FUZZ_BUILD (keep the binaries and
# the generated seeds in this folder instead of a temporary one), FUZZ_BUILD_ONLY=1 (build and
# make seeds, run nothing; for long campaigns, docs/RELIABILITY.md).
set -u
cd "$(dirname "$0")/../.."
SECS=${FUZZ_SECONDS:-15}
ART=${FUZZ_ARTIFACTS:-/tmp}
PY=${GLM_PYTHON:-/usr/bin/python3}
ALL="safetensors torchbin json_records config args_config spm_model tokenizer_text tool_calls serve_request serve_score adapter_config dataset_info tokenizer_folder tokenizer_json constraints"
TARGETS=${FUZZ_TARGETS:-$ALL}
if ! command -v clang >/dev/null 2>&1; then
    for t in $TARGETS; do echo "SKIP fuzz_$t: clang is not installed (apt-get install clang)"; done
    exit 0
fi
if [ -n "${FUZZ_BUILD:-}" ]; then
    work=$FUZZ_BUILD
    rm -rf "$work/obj" "$work/gen"
else
    work=$(mktemp -d /tmp/glm_fuzz.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/obj" "$work/gen"
gen=$work/gen
for t in $ALL; do mkdir -p "$gen/$t"; done

# ---- seeds made at run time (failures here only mean fewer seeds) ----
"$PY" - "$gen" <<'EOF' 2>/dev/null || true
import io, os, sys, zipfile
gen = sys.argv[1]
import numpy as np
try:
    import safetensors.numpy as stn
    stn.save_file({"x": np.arange(6, dtype=np.float32).reshape(2, 3), "h": np.ones(3, np.float16), "i": np.arange(2)},
                  os.path.join(gen, "safetensors", "py"))
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
    open(os.path.join(gen, "torchbin", name + "_zip"), "wb").write(b"\x01" + raw)
    z = zipfile.ZipFile(io.BytesIO(raw))
    pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
    # pickle mode: storage keys are "0", "1" with 64 bytes each in the wrapper
    open(os.path.join(gen, "torchbin", name + "_pkl"), "wb").write(b"\x00" + z.read(pkl))
EOF

# Small tokenizers for fuzz_tokenizer_text: a unigram model with ChatGLM-6B's special and
# whitespace pieces (so the ChatGLM layer is on) and a byte-fallback BPE one, trained on the
# docs; ChatGLM-6B's own model joins them when ../shared has it (it is never committed).
toks=""
if command -v spm_train >/dev/null 2>&1; then
    cat docs/*.md README.md 2>/dev/null | head -c 200000 >"$gen/corpus.txt"
    printf '你好，世界。训练一个模型。\n数据\t制表符  两个空格\n' >>"$gen/corpus.txt"
    blanks=$(for i in $(seq 2 80); do printf ',<|blank_%d|>' "$i"; done)
    if spm_train --input="$gen/corpus.txt" --model_prefix="$gen/uni" --vocab_size=400 --model_type=unigram \
        --character_coverage=0.9995 --user_defined_symbols="<n>,<|tab|>$blanks" \
        --control_symbols="[MASK],[gMASK],<sop>,<eop>" --pad_id=3 --pad_piece="<pad>" \
        --normalization_rule_name=nmt_nfkc >"$gen/spm.log" 2>&1; then
        mkdir -p "$gen/chatglm" && cp "$gen/uni.model" "$gen/chatglm/ice_text.model" && toks="$gen/chatglm/ice_text.model"
    fi
    if spm_train --input="$gen/corpus.txt" --model_prefix="$gen/bpe" --vocab_size=500 --model_type=bpe \
        --byte_fallback=true --character_coverage=0.999 --normalization_rule_name=identity >>"$gen/spm.log" 2>&1; then
        toks="$toks${toks:+:}$gen/bpe.model"
    fi
fi
# and a GLM-4-style rank file (the 256 bytes and a few merges), for the byte-level BPE's encoder
mkdir -p "$gen/glm4" && cp tests/fuzz/seeds/spm_model/ranks_merges "$gen/glm4/tokenizer.model" &&
    toks="$toks${toks:+:}$gen/glm4/tokenizer.model"
# fuzz_serve_request and fuzz_serve_score: a ChatGLM-6B-style tokenizer, a ChatGLM3-style one (a tokenizer.model
# folder whose tokenizer_config.json names chatglm3: role tokens, tool turns), GLM-4's and a plain
# SentencePiece model
serve_toks=""
case ":$toks:" in *":$gen/chatglm/ice_text.model:"*) serve_toks="$gen/chatglm/ice_text.model" ;; esac
if [ -f "$gen/bpe.model" ]; then
    mkdir -p "$gen/glm3" && cp "$gen/bpe.model" "$gen/glm3/tokenizer.model" &&
        echo '{"tokenizer_class": "ChatGLMTokenizer", "name_or_path": "THUDM/chatglm3-6b"}' >"$gen/glm3/tokenizer_config.json" &&
        serve_toks="$serve_toks${serve_toks:+:}$gen/glm3"
fi
serve_toks="$serve_toks${serve_toks:+:}$gen/glm4/tokenizer.model"
[ -f "$gen/bpe.model" ] && serve_toks="$serve_toks:$gen/bpe.model" # a plain SentencePiece model: no special tokens
export GLM_FUZZ_SERVE_TOKENIZERS="$serve_toks"
echo "$serve_toks" >"$work/serve_tokenizers.txt"
shared_tok=../shared/tokenizers/chatglm-6b/ice_text.model
[ -f "$shared_tok" ] && toks="$toks${toks:+:}$(realpath "$shared_tok")"
export GLM_FUZZ_TOKENIZERS="$toks"
echo "$toks" >"$work/tokenizers.txt"

# ---- build: the library parts under test into one archive (objects two at a time), so each
# target links only what it uses ----
CFLAGS="-std=c11 -D_GNU_SOURCE -g -O1 -fno-sanitize-recover=all -Isrc -I/usr/include/cjson -Itests/c -Itests/fuzz"
SAN="address,undefined"
LIBSRC="$(ls src/core/*.c src/io/*.c src/tokenizer/*.c | grep -v 'src/tokenizer/batch.c')
src/data/reader_json.c src/data/reader_csv.c src/data/schema.c src/data/thought.c src/data/schema_conv.c src/data/pyjson.c src/data/pyliteral.c src/data/glm4_tools.c src/infer/tools.c src/model/config.c src/backend/quant.c src/train/train_flags.c
src/train/deepspeed.c src/optim/schedule.c
src/serve/request.c src/serve/messages.c src/serve/thudm_api.c src/serve/score.c src/serve/tokenize.c src/infer/chat.c src/infer/gen_settings.c
src/infer/json_mode.c src/infer/choice_mode.c src/infer/text_vocab.c src/infer/schema_mode.c src/infer/schema_compile.c src/infer/regex.c src/infer/regex_mask.c src/infer/constrain.c
src/data/encoder_tok.c src/data/hash.c
src/model/adapter_config.c src/model/ckpt.c src/model/hf_layout.c src/data/dataset_info.c src/data/examples.c src/data/examples_glm3.c"
: >"$work/build.log"
i=0
for src in $LIBSRC; do
    clang $CFLAGS -fsanitize=fuzzer-no-link,$SAN -c "$src" -o "$work/obj/$(echo "$src" | tr / _).o" 2>>"$work/build.log" &
    i=$((i + 1)); [ $((i % 2)) -eq 0 ] && wait
done
wait
rm -f "$work/libfuzzglm.a"
llvm-ar rcs "$work/libfuzzglm.a" "$work"/obj/*.o 2>>"$work/build.log" || ar rcs "$work/libfuzzglm.a" "$work"/obj/*.o

for t in $TARGETS; do
    if ! clang $CFLAGS -fsanitize=fuzzer,$SAN "tests/fuzz/fuzz_$t.c" "$work/libfuzzglm.a" -lcjson -lpcre2-8 -lyaml -lm -lpthread \
        -o "$work/fuzz_$t" >>"$work/build.log" 2>&1; then
        echo "FAIL fuzz_$t: clang build failed"; tail -20 "$work/build.log"
        continue
    fi
    [ -n "${FUZZ_BUILD_ONLY:-}" ] && continue
    if { [ "$t" = tokenizer_text ] || [ "$t" = tokenizer_folder ]; } && [ -z "$toks" ]; then
        echo "SKIP fuzz_$t: no tokenizer (spm_train is not installed and ../shared has no ice_text.model)"
        continue
    fi
    corpus=$work/corpus_$t
    rm -rf "$corpus" && mkdir -p "$corpus"
    seeds="tests/fuzz/seeds/$t"
    nseed=$(ls "$seeds" "$gen/$t" 2>/dev/null | grep -vc ':$\|^$')
    "$work/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
        -artifact_prefix="$ART/glm_fuzz_${t}_" "$corpus" "$seeds" "$gen/$t" >"$work/run_$t.log" 2>&1
    rc=$?
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/run_$t.log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/run_$t.log" | tail -1)
    if [ "$rc" -eq 0 ]; then
        echo "PASS fuzz_$t (${runs:-?} inputs in ${SECS}s from $nseed seeds, $cov)"
    else
        echo "FAIL fuzz_$t: fuzzer exit $rc; crashing input saved under $ART/glm_fuzz_${t}_*"
        grep -E 'ERROR|SUMMARY|runtime error|invariant|#[0-9]+ 0x' "$work/run_$t.log" | head -25
    fi
done
