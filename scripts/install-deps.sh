#!/usr/bin/env bash
# Installs everything glmtrain's build, tests and demo need on a fresh Debian machine.
# Idempotent: skips what is already there. Run as root (CI and the dev machines are root).
set -euo pipefail
APT_PKGS="build-essential libcjson-dev python3 python3-numpy python3-torch python3-sentencepiece
          sentencepiece fortunes-zh libopenmpi-dev openmpi-bin python3-pip clang"
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
