#!/usr/bin/env bash
# The layering rule of docs/ARCHITECTURE.md: a folder of src/ includes only folders below it.
# The order, from the top: cli serve train infer parallel ckpt optim model backend data tokenizer io core.
# Prints one PASS/FAIL line per folder.
cd "$(dirname "$0")/../.." || exit 1
order=(cli serve train infer parallel ckpt optim model backend data tokenizer io core)
rank() { local i; for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && echo "$i" && return; done; echo -1; }
fail=0
for d in src/*/; do
    d=$(basename "$d")
    r=$(rank "$d")
    if [ "$r" -lt 0 ]; then echo "FAIL layers_$d: src/$d is not in the order of tests/sh/test_layers.sh (docs/ARCHITECTURE.md)"; fail=1; continue; fi
    bad=""
    for inc in $(grep -rhoE '#include "[a-z_]+/' "src/$d" | sed 's/#include "//; s/\///' | sort -u); do
        [ "$inc" = "$d" ] && continue
        ri=$(rank "$inc")
        if [ "$ri" -le "$r" ]; then bad="$bad $inc"; fi
    done
    if [ -n "$bad" ]; then
        echo "FAIL layers_$d: includes from a layer above or beside it:$bad ($(grep -rlE "#include \"($(echo $bad | tr ' ' '|'))/" "src/$d" | head -3 | tr '\n' ' '))"
        fail=1
    else
        echo "PASS layers_$d"
    fi
done
exit $fail
