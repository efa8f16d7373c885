#!/usr/bin/env bash
# fp16 dynamic loss scaling on a GPU: a small model on the demo data started from a loss scale
# far too large (2^40), so the first steps overflow: each must be skipped with the scale halved,
# then training must proceed and the loss fall. Prints PASS/FAIL lines.
set -u
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
GLM=${GLM:-$PWD/build/gpu/glmtrain}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 120 "$GLM" train --init_from_config build/demo/config.json --tokenizer_name build/demo/tokenizer \
    --train_file build/demo/train.json --output_dir /tmp/fp16-ovf --overwrite_output_dir --fp16 \
    --fp16_initial_scale 1099511627776 --max_steps 60 --per_device_train_batch_size 16 --learning_rate 2e-3 \
    --logging_steps 1 --save_strategy no --max_source_length 48 --max_target_length 128 --disable_tqdm \
    >"$OUT/fp16-overflow.log" 2>&1
rc=$?
skips=$(grep -c "step skipped" "$OUT/fp16-overflow.log")
grep -E "step skipped" "$OUT/fp16-overflow.log" | head -3
grep -E "step skipped" "$OUT/fp16-overflow.log" | tail -1
python3 - "$OUT/fp16-overflow.log" "$rc" "$skips" <<'PY'
import ast, math, sys
log, rc, skips = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# the log lines are Python dict literals; skipped steps log nan/inf
recs = [eval(l, {"__builtins__": {}, "nan": float("nan"), "inf": float("inf")}) for l in open(log) if l.startswith("{'loss'")]
fin = [r["loss"] for r in recs if math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])]
print("steps logged %d, overflow steps skipped %d, first finite loss %.4f, last %.4f" % (len(recs), skips, fin[0] if fin else float("nan"), fin[-1] if fin else float("nan")))
ok = rc == 0 and 5 <= skips < 40 and len(fin) > 10 and fin[-1] < fin[0] - 0.5
print("%s fp16_overflow_backs_off_skips_and_recovers" % ("PASS" if ok else "FAIL"))
PY
