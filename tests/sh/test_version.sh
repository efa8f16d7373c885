#!/usr/bin/env bash
# `glmtrain --version` (and `version`): exits 0 and names the commit the binary was built from,
# the one `git describe` gives for this tree (unknown outside a git checkout), and the build's
# CUDA and MPI. Prints PASS/FAIL lines.
cd "$(dirname "$0")/../.." || exit 1
GLM=${BUILD:-build}/glmtrain
[ -x "$GLM" ] || { echo "SKIP version: $GLM not built"; exit 0; }
out=$("$GLM" --version 2>&1); rc=$?
want=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
first=$(printf '%s\n' "$out" | head -1)
# the binary may predate uncommitted edits made since it was built: compare the commit part
if [ $rc -eq 0 ] && [ "${first%-dirty}" = "glmtrain ${want%-dirty}" ]; then echo "PASS version_names_the_commit"
else echo "FAIL version_names_the_commit: rc $rc, '$first', git says '$want'"; fi
if printf '%s\n' "$out" | grep -q '^CUDA: \(yes\|no\)' && printf '%s\n' "$out" | grep -q '^MPI: \(yes\|no\)'; then
    echo "PASS version_names_cuda_and_mpi"
else echo "FAIL version_names_cuda_and_mpi: $out"; fi
out2=$("$GLM" version 2>&1)
[ "$out2" = "$out" ] && echo "PASS version_command_same" || echo "FAIL version_command_same: $out2"
