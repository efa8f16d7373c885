#!/usr/bin/env bash
# fp16 on a GPU with a --deepspeed file (docs/DEEPSPEED.md): what the CPU cannot run. A small
# model with ChatGLM-6B's vocabulary trained in fp16 from a loss scale of 2^32, so the first
# steps overflow:
#   - with an fp16 section (hysteresis 2, window 6): the scale each skipped step leaves, and the
#     scale at the end, follow DeepSpeed's rule (build/gpu/tests/tool_schedules, which the CPU
#     tests hold to DeepSpeed's own DynamicLossScaler, fed the overflows the run logged);
#   - the learning rate logged at every step is the WarmupDecayLR rate of the updates applied
#     before it (a skipped step does not advance the schedule: tool_schedules lr);
#   - without a file, GradScaler's rule (each overflow halves) and the same schedule rule for
#     --lr_scheduler_type linear; the loss falls in both.
# Prints PASS/FAIL lines. Build here: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain
# build/gpu/tests/tool_schedules; carry them, build/lib and build/shared.
set -u
. "$(dirname "$0")/lib.sh"
find_tokenizer deepspeed_check
export LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
GLM=${GLM:-build/gpu/glmtrain}
TOOL=${TOOL:-build/gpu/tests/tool_schedules}
W=${WORK:-/tmp/ds-check}
w1_workdir "$W" 2
cat >"$W/ds.json" <<'EOF'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
 "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 32, "loss_scale_window": 6, "hysteresis": 2,
          "min_loss_scale": 1},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
               "warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_type": "linear"}},
 "zero_optimization": {"stage": 1}}
EOF
train() { # output dir, flags...
    local out=$1
    shift
    timeout 300 "$GLM" train --tokenizer_name "$TOKENIZER" --init_from_config "$W/tiny.json" --train_file "$W/w1.jsonl" \
        --output_dir "$W/$out" --overwrite_output_dir --per_device_train_batch_size 4 --max_source_length 64 \
        --max_target_length 64 --max_steps 40 --warmup_steps 5 --learning_rate 1e-3 --logging_steps 1 --save_steps 40 \
        --report_to none --disable_tqdm --fp16 "$@" >"$W/$out.log" 2>&1 ||
        { echo "FAIL deepspeed_check_train_$out"; tail -4 "$W/$out.log"; }
}
train ds --deepspeed "$W/ds.json"
train plain --fp16_initial_scale 4294967296
python3 - "$W" "$TOOL" <<'PY'
import json, re, subprocess, sys
w, tool = sys.argv[1], sys.argv[2]
for run, rule in (("ds", ["ds", str(2.0 ** 32), "6", "2", "0", "1"]), ("plain", ["torch", str(2.0 ** 32), "2000", "1", "0", "0"])):
    log = open("%s/%s.log" % (w, run)).read()
    skipped = {int(m.group(1)): float(m.group(2))
               for m in re.finditer(r"step (\d+): inf/nan gradients, step skipped, loss scale now (\d+)", log)}
    hist = json.load(open("%s/%s/checkpoint-40/trainer_state.json" % (w, run)))
    state, steps = hist, [r for r in hist["log_history"] if "learning_rate" in r]
    flags = "".join("1" if s in skipped else "0" for s in range(1, 41))
    out = subprocess.run([tool, "scaler"] + rule + [flags], capture_output=True, text=True).stdout.split("\n")
    scales = [float(l.split()[1]) for l in out if l]
    ok_scale = bool(skipped) and all(scales[s - 1] == v for s, v in skipped.items()) and \
        abs(scales[-1] - state.get("loss_scale", scales[-1])) <= 0
    kind = "WarmupDecayLR" if run == "ds" else "linear"
    rates = [float(x) for x in subprocess.run([tool, "lr", kind, "1e-3", "5", "40", "0", "0", "0", "0", "41"],
                                              capture_output=True, text=True).stdout.split()]
    want, before = [], 0
    for s in range(1, 41):
        want.append(rates[s - 1 - before])
        before += s in skipped
    got = [r["learning_rate"] for r in steps]
    ok_lr = len(got) == 40 and all(abs(g - x) <= 1e-6 * max(abs(x), 1e-9) for g, x in zip(got, want))
    losses = [r["loss"] for r in steps if r["loss"] == r["loss"]]
    print("%s deepspeed_check_%s_scaler: %d skipped at %s, scales %s" % ("PASS" if ok_scale else "FAIL", run, len(skipped),
                                                                          sorted(skipped), [skipped[s] for s in sorted(skipped)]))
    print("%s deepspeed_check_%s_lr_skips_skipped_steps: %s vs %s" % ("PASS" if ok_lr else "FAIL", run, got[:8], want[:8]))
    print("%s deepspeed_check_%s_loss_falls: %.3f -> %.3f" % ("PASS" if losses and losses[-1] < losses[0] else "FAIL", run,
                                                              losses[0] if losses else 0, losses[-1] if losses else 0))
PY
