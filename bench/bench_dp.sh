#!/usr/bin/env bash
# Data-parallel throughput: workload W1 (docs/DESIGN.md: ChatGLM-6B shapes with an untied head,
# random init, full fine-tune AdamW, bf16, rows of 512 tokens = half prompt / half answer,
# micro-batch 4 and 8) through `glmtrain train` itself on 1 and 2 GPUs of one machine
# (--nproc_per_node N: NCCL, gradient buckets reduced during backward). Reports tokens/s per GPU
# (median over the steps after the warm-up; every overhead of the real loop included: data,
# reduction, clipping, AdamW, the parameter all-gather with ZeRO) and the scaling efficiency
# against one GPU.
#
#   bash bench/bench_dp.sh                          # GPUS="1 2" BATCHES="4 8" ZERO="0 1"
#   GPUS="2" BATCHES=8 ZERO=2 STEPS=16 bash bench/bench_dp.sh
# Environment: GLM (default build/glmtrain, built with the CUDA backend; MPI is not needed),
# TOKENIZER (a folder with ChatGLM-6B's ice_text.model; default ../shared/tokenizers/chatglm-6b,
# else build/shared/tokenizers/chatglm-6b), OUT (logs and bench_dp.jsonl; default ./dp-out),
# BUCKET_MB (default 400), RUN_TIMEOUT (seconds per run, default 900), TAG (a label for the run names and records, e.g. for NCCL_* variants),
# EXTRA (more train flags for every run, e.g. "--max_memory_per_gpu 24GiB --optim adamw_8bit --gradient_checkpointing"). Keep NCCL_NVLS_ENABLE=0 on the lent machines (set here).
set -u
export NCCL_NVLS_ENABLE=0
GLM=${GLM:-build/glmtrain}
OUT=${OUT:-dp-out}
GPUS=${GPUS:-1 2}
BATCHES=${BATCHES:-4 8}
ZERO=${ZERO:-0 1}
STEPS=${STEPS:-12}
WARM=${WARM:-3}
BUCKET_MB=${BUCKET_MB:-400}
. "$(dirname "$0")/lib.sh"
find_tokenizer bench_dp
if [ ! -x "$GLM" ]; then echo "bench_dp: $GLM not built"; exit 1; fi
mkdir -p "$OUT"
W="$OUT/work"
mkdir -p "$W"

# W1: ChatGLM-6B shapes (untied head) and rows that truncate to 256 + 256 tokens
python3 "$(dirname "$0")/w1_data.py" "$W"

{
    date -u
    git log -1 --format='commit %H' 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1
} | tee "$OUT/env.txt"

summary="$OUT/summary.txt"
: >"$summary"
for B in $BATCHES; do
    for N in $GPUS; do
        for Z in $ZERO; do
            [ "$N" = 1 ] && [ "$Z" != "$(echo $ZERO | cut -d' ' -f1)" ] && continue # one 1-GPU run per batch size
            name="w1-b${B}-n${N}-z${Z}${TAG:+-$TAG}"
            rm -rf "$W/$name"
            t0=$SECONDS
            timeout "${RUN_TIMEOUT:-900}" "$GLM" train --init_from_config "$W/config.json" --tokenizer_name "$TOKENIZER" \
                --train_file "$W/w1.jsonl" --output_dir "$W/$name" --overwrite_output_dir --bf16 \
                --per_device_train_batch_size "$B" --max_source_length 256 --max_target_length 256 \
                --learning_rate 1e-5 --max_steps "$STEPS" --logging_steps 1 --save_strategy no --save_final_model false --report_to none \
                --disable_tqdm --nproc_per_node "$N" --zero_stage "$Z" --bucket_size_mb "$BUCKET_MB" ${EXTRA:-} \
                >"$OUT/$name.log" 2>&1
            rc=$?
            python3 - "$OUT/$name.log" "$N" "$B" "$Z" "$WARM" "$rc" "$((SECONDS - t0))" "${TAG:-}" >>"$summary" <<'EOF'
import ast, json, statistics, sys
log, n, b, z, warm, rc, wall, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8]
tps, ranks, step, phases = [], "", 0, []
for line in open(log, errors="replace"):
    if line.startswith("{'loss'"):
        r = ast.literal_eval(line.strip())
        step = r["step"]
        if step > warm: tps.append(r["tokens_per_second"])
    elif "ranks (fwd+bwd" in line:
        ranks = line.strip()
    elif "step ms (" in line and step > warm:
        # rank 0's phases: fwd+bwd / gradient reduction tail / norm / update
        phases.append([float(x) for x in line.split("):", 1)[1].split("|")[0].split(":", 1)[1].split("/")])
med = statistics.median(tps) if tps else 0.0
ph = [round(statistics.median(p[i] for p in phases), 1) for i in range(4)] if phases else []
rec = {"workload": "W1", "tag": tag, "gpus": n, "micro_batch": int(b), "zero": int(z), "exit": rc, "wall_s": int(wall),
       "tokens_per_s": round(med), "tokens_per_s_per_gpu": round(med / n), "steps_timed": len(tps),
       "rank0_ms_fwdbwd_tail_norm_update": ph, "ranks": ranks}
print(json.dumps(rec))
EOF
            tail -1 "$summary"
        done
    done
done
cp "$summary" "$OUT/bench_dp.jsonl"
# per-GPU throughput and scaling against the 1-GPU run of the same micro-batch
python3 - "$summary" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
one = {r["micro_batch"]: r["tokens_per_s_per_gpu"] for r in rows if r["gpus"] == 1}
print("%-6s %4s %4s %12s %14s %10s" % ("batch", "gpus", "zero", "tok/s", "tok/s/GPU", "scaling"))
for r in rows:
    base = one.get(r["micro_batch"])
    eff = "%.0f%%" % (100.0 * r["tokens_per_s_per_gpu"] / base) if base else "-"
    print("%-6d %4d %4d %12d %14d %10s%s" % (r["micro_batch"], r["gpus"], r["zero"], r["tokens_per_s"],
          r["tokens_per_s_per_gpu"], eff, "" if r["exit"] == 0 else "  (exit %d)" % r["exit"]))
EOF
