#!/usr/bin/env bash
# Installs everything glmtrain's build, tests and demo need on a fresh Debian machine.
# Idempotent: skips what is already there. Run as root (CI and the dev machines are root).
set -euo pipefail
# (python3-pandas: tests/py/test_mcq_eval.py reads benchmark CSV files as LLaMA-Factory's loading scripts do;
# python3-jsonschema: tests/py/test_serve_constrained.py checks structured outputs against the schemas)
APT_PKGS="build-essential libcjson-dev libpcre2-dev libyaml-dev python3 python3-numpy python3-torch python3-sentencepiece
          sentencepiece fortunes-zh libopenmpi-dev openmpi-bin python3-pip clang
          python3-requests python3-yaml python3-typing-extensions python3-psutil python3-jinja2
          libmicrohttpd-dev chromium fonts-wqy-microhei python3-httpx python3-pydantic python3-anyio python3-sniffio python3-distro
          python3-pandas python3-jsonschema"
PIP_PKGS="safetensors tensorboard"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "install-deps: apt-get install$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends $missing
fi
for p in $PIP_PKGS; do
    if ! /usr/bin/python3 -c "import $p" >/dev/null 2>&1; then
        echo "install-deps: pip install $p"
        /usr/bin/python3 -m pip install -q --break-system-packages "$p"
    fi
done
# transformers (tests/py/test_folder_interop.py loads glmtrain's folders with AutoModel and
# trust_remote_code) beside Debian's torch 1.13: pinned versions installed with --no-deps so pip
# never replaces Debian's torch or numpy (requests, yaml and typing_extensions come from Debian
# above; the ones below need nothing else). "module=package==version"; a module that already
# imports is left alone. peft and accelerate (tests/py/test_lora_ref.py: LoRA against peft's
# own LoraLayer, and glmtrain's adapters loaded by PeftModel.from_pretrained) need psutil and
# yaml from Debian above; peft's save_pretrained writes a model card through jinja2 (Debian too).
# tiktoken (tests/py/test_tokenizer_glm4.py: GLM-4's byte-level BPE against the library THUDM's
# tokenizer wraps) needs regex (above) and requests (Debian); 0.8.0 has a CPython 3.11 wheel.
# openai (tests/py/test_serve.py: `glmtrain serve` through the real client) runs on Debian's
# httpx 0.23, pydantic 1.10, anyio 3.6, sniffio, distro and typing-extensions 4.4 (apt above) and
# tqdm (here); 1.35.15 needs nothing newer (later 1.x import jiter). chromium (apt above) drives
# tests/py/test_serve_page.py (fonts-wqy-microhei: CJK text in its screenshot); libmicrohttpd-dev
# is the HTTP server library serve opens. badam (tests/py/test_badam.py: --use_badam against its
# BlockOptimizer, as LLaMA-Factory wraps torch's AdamW in it) imports torch and transformers only.
# prometheus_client (no dependencies) parses serve's GET /metrics in tests/py/test_serve_echo.py.
PIP_NODEPS="tqdm=tqdm==4.66.1 filelock=filelock==3.12.4 regex=regex==2023.8.8 fsspec=fsspec==2023.9.2
            packaging=packaging==23.2 huggingface_hub=huggingface_hub==0.17.3 tokenizers=tokenizers==0.13.3
            transformers=transformers==4.33.3 accelerate=accelerate==0.24.1 peft=peft==0.6.2
            tiktoken=tiktoken==0.8.0 openai=openai==1.35.15 badam=badam==1.4
            prometheus_client=prometheus-client==0.17.1"
for mp in $PIP_NODEPS; do
    m=${mp%%=*}; spec=${mp#*=}
    if ! /usr/bin/python3 -c "import $m" >/dev/null 2>&1; then
        echo "install-deps: pip install --no-deps $spec"
        /usr/bin/python3 -m pip install -q --no-deps --break-system-packages "$spec"
    fi
done
# galore-torch (tests/py/test_galore.py: --use_galore against its GaLoreAdamW and GaLoreProjector,
# as LLaMA-Factory builds them) needs torch and transformers; its package __init__ also imports
# bitsandbytes for the 8-bit variant, so the test loads the two modules it needs by path and
# this checks the package is present without importing it.
if ! /usr/bin/python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('galore_torch') is None)" \
        >/dev/null 2>&1; then
    echo "install-deps: pip install --no-deps galore-torch==1.0"
    /usr/bin/python3 -m pip install -q --no-deps --break-system-packages galore-torch==1.0
fi
# peft 0.10 (tests/py/test_dora.py: DoRA, use_dora, which peft 0.6.2 above predates) in a folder
# of its own, put on sys.path by that test's peft part only; it imports beside transformers 4.33.3
# and accelerate 0.24.1 (later peft needs a newer huggingface_hub).
PEFT10_DIR=/usr/local/lib/glmtrain-peft-0.10
if [ ! -f "$PEFT10_DIR/peft/tuners/lora/layer.py" ]; then
    echo "install-deps: pip install --no-deps --target $PEFT10_DIR peft==0.10.0"
    /usr/bin/python3 -m pip install -q --no-deps --target "$PEFT10_DIR" peft==0.10.0
fi
# transformers 4.46 (tests/py/test_glm_hf.py: GLM-4 in transformers' own layout against its
# GlmForCausalLM, which 4.33.3 above predates, and tokenizer.json through the tokenizers library
# and transformers' TikTokenConverter) in a folder of its own with the huggingface_hub, tokenizers
# and safetensors it needs, put on sys.path by that test only; it imports beside Debian's torch 1.13.
TF446_DIR=/usr/local/lib/glmtrain-transformers-4.46
if [ ! -f "$TF446_DIR/transformers/models/glm/modeling_glm.py" ]; then
    echo "install-deps: pip install --no-deps --target $TF446_DIR transformers==4.46.3 (+ tokenizers, huggingface_hub, safetensors)"
    /usr/bin/python3 -m pip install -q --no-deps --target "$TF446_DIR" transformers==4.46.3 tokenizers==0.20.3 \
        huggingface_hub==0.26.2 safetensors==0.4.5
fi
# DeepSpeed (tests/py/test_deepspeed_config.py: --deepspeed files against transformers' own
# HfTrainerDeepSpeedConfig, DeepSpeed's DynamicLossScaler and its LR schedulers) in a folder of
# its own, put on sys.path by that test only: importable everywhere, it would change how
# accelerate and peft behave in the other tests. The sdist builds without its CUDA ops
# (DS_BUILD_OPS=0) against Debian's torch; py-cpuinfo and hjson are what it imports besides.
DS_DIR=/usr/local/lib/glmtrain-deepspeed
if [ ! -f "$DS_DIR/deepspeed/runtime/lr_schedules.py" ]; then
    echo "install-deps: pip install --no-deps --target $DS_DIR deepspeed==0.12.6 py-cpuinfo==9.0.0 hjson==3.1.0"
    DS_BUILD_OPS=0 /usr/bin/python3 -m pip install -q --no-deps --no-build-isolation --target "$DS_DIR" \
        deepspeed==0.12.6 py-cpuinfo==9.0.0 hjson==3.1.0
fi
