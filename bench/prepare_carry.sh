#!/usr/bin/env bash
# Makes what a device call carries beside the binaries (docs/GPU-TESTS.md), from this machine:
#   build/lib     the shared libraries the device lacks (cJSON, libgomp, libyaml, PCRE2; with SERVE=1
#                 also libmicrohttpd and its chain, for `serve`)
#   build/shared  oracles/chatglm-cpp/glm_model.data (test_cuda_model), tokenizers/chatglm-6b (the
#                 real tokenizer, for the 6B-shape benches only: never committed), cfg6b/config.json
#                 (ChatGLM-6B's shapes, untied head) and guide-data/train.json (600 W1 records,
#                 bench/w1_data.py) for bench/gpu_galore_6b.sh, gpu_guide_badam.sh, gpu_guide_lora.sh
# and, with PACK=1, build/pack/gpu.tar.xz from the build/gpu binaries that exist. Needs ../shared.
set -eu
SHARED=${GLM_SHARED:-../shared}
PY=${PYTHON:-/usr/bin/python3}
mkdir -p build/lib build/shared/oracles/chatglm-cpp build/shared/tokenizers/chatglm-6b build/shared/cfg6b build/shared/guide-data
for l in libcjson.so libgomp.so libyaml-0.so libpcre2-8.so; do cp -P /usr/lib/x86_64-linux-gnu/$l* build/lib/; done
if [ -n "${SERVE:-}" ]; then # `serve` opens libmicrohttpd at its start (dlopen): it and its chain
    for l in libmicrohttpd.so.12 libgnutls.so.30 libp11-kit.so.0 libidn2.so.0 libunistring.so.2 libtasn1.so.6 libnettle.so.8 \
        libhogweed.so.6 libgmp.so.10 libffi.so.8; do cp -L /usr/lib/x86_64-linux-gnu/$l build/lib/; done
fi
cp "$SHARED/oracles/chatglm-cpp/glm_model.data" build/shared/oracles/chatglm-cpp/
[ -f "$SHARED/oracles/chatglm-cpp/glm2_model.data" ] && cp "$SHARED/oracles/chatglm-cpp/glm2_model.data" build/shared/oracles/chatglm-cpp/
cp "$SHARED/tokenizers/chatglm-6b/ice_text.model" build/shared/tokenizers/chatglm-6b/
tmp=$(mktemp -d)
"$PY" bench/w1_data.py "$tmp"
cp "$tmp/config.json" build/shared/cfg6b/config.json
head -600 "$tmp/w1.jsonl" >build/shared/guide-data/train.json
rm -rf "$tmp"
if [ -n "${PACK:-}" ]; then
    mkdir -p build/pack
    bins=""
    for b in bench_train glmtrain bench_attn bench_ops bench_svd tests/cuda/test_cuda_model tests/cuda/test_cuda_ops; do
        [ -x build/gpu/$b ] && bins="$bins build/gpu/$b"
    done
    tar -cf - $bins | xz -3 -T2 >build/pack/gpu.tar.xz
fi
du -sh build/lib build/shared ${PACK:+build/pack}
