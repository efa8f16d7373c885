#!/usr/bin/env bash
# Pipeline-parallel throughput and memory on 2 GPUs: workload W1 (docs/DESIGN.md: ChatGLM-6B
# shapes with an untied head, random init, full fine-tune AdamW, bf16, 512-token rows = 256
# prompt + 256 answer, micro-batch 4) through `glmtrain train` itself, next to one GPU and to
# data parallel on the same 2 GPUs:
#   p1       one GPU, no pipeline                          (baseline: tokens/s, memory)
#   dp2      2 GPUs data parallel, ZeRO-1                  (bench_dp.sh's setup)
#   pp2-mM   2 GPUs, --pipeline_parallel_size 2 (auto map), M micro-batches per step (1F1B)
#   pp2-thudm-m8   the same with THUDM's layer ranges (13 / 15 layers)
#   cap-p1 / cap-p2   --max_memory_per_gpu CAP (default 80GiB): the memory plan refuses one GPU
#            (about 101 GiB planned) and lets 2 stages (about 51 GiB each) train
# and two correctness checks first (fp32, a small model; a few seconds each):
#   check-train   one GPU vs 2 stages on 2 GPUs through glmtrain train: the loss curves (NCCL
#                 send/receive, the tied head's sum, the global norm) agree to ~1e-6
#   check-infer   tests/c/tool_pp_infer: generation split over the 2 GPUs equals the whole
#                 model on GPU 0 (fp32 bit for bit, bf16 within 1e-2), greedy tokens agree
# Reports per run: tokens/s (whole job, median after the warm-up steps) and per GPU, each GPU's
# memory (NVML, at the logging steps), the pipeline's bubble (share of the step a stage waits,
# measured; 1F1B's ideal (P-1)/(M+P-1) beside it) and the memory plan (glmtrain info).
#
#   bash bench/bench_pp.sh                      # all runs; RUNS="p1 dp2 pp2-m8 pp2-m16 pp2-thudm-m8 cap-p1 cap-p2"
#   RUNS="pp2-m8 cap-p1 cap-p2" STEPS=6 bash bench/bench_pp.sh
# Environment: GLM (default build/glmtrain, with the CUDA backend; MPI not needed), TOKENIZER
# (ChatGLM-6B's ice_text.model folder; default ../shared/tokenizers/chatglm-6b, else
# build/shared/tokenizers/chatglm-6b), OUT (default ./pp-out: logs, summary, bench_pp.jsonl),
# STEPS (default 8), WARM (default 2), CAP (default 80GiB), B (micro-batch, default 4).
# Each run is bounded by `timeout 600`; NCCL_NVLS_ENABLE=0 is kept (lent machines).
set -u
export NCCL_NVLS_ENABLE=0
GLM=${GLM:-build/glmtrain}
OUT=${OUT:-pp-out}
RUNS=${RUNS:-check-train check-infer p1 dp2 pp2-m8 pp2-m16 pp2-thudm-m8 cap-p1 cap-p2}
TOOL=${TOOL:-$(dirname "$GLM")/tests/tool_pp_infer}
STEPS=${STEPS:-8}
WARM=${WARM:-2}
CAP=${CAP:-80GiB}
B=${B:-4}
. "$(dirname "$0")/lib.sh"
find_tokenizer bench_pp
if [ ! -x "$GLM" ]; then echo "bench_pp: $GLM not built"; exit 1; fi
mkdir -p "$OUT/work"
W="$OUT/work"

# W1: ChatGLM-6B shapes (untied head) and rows that truncate to 256 + 256 tokens
python3 "$(dirname "$0")/w1_data.py" "$W"

{
    date -u
    git log -1 --format='commit %H' 2>/dev/null
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1
    echo "memory plans (glmtrain info, W1 micro-batch $B):"
    for P in 1 2; do
        "$GLM" info --init_from_config "$W/config.json" --bf16 --per_device_train_batch_size "$B" \
            --max_source_length 256 --max_target_length 256 --gradient_accumulation_steps 8 \
            --pipeline_parallel_size "$P" --max_memory_per_gpu "$CAP" 2>&1 | sed -n '/^pipeline:/,$p'
    done
} | tee "$OUT/env.txt"

common_flags() {
    echo --init_from_config "$W/config.json" --tokenizer_name "$TOKENIZER" --train_file "$W/w1.jsonl" \
        --overwrite_output_dir --bf16 --per_device_train_batch_size "$B" --max_source_length 256 \
        --max_target_length 256 --learning_rate 1e-5 --logging_steps 1 --save_strategy no --save_final_model false --report_to none --disable_tqdm
}

# check-train: the same small model (tied head, ChatGLM's vocabulary) on 1 GPU and as 2 stages
python3 - "$W" <<'EOF'
import json, sys
json.dump({"model_type": "chatglm", "vocab_size": 130528, "hidden_size": 256, "num_layers": 4,
           "num_attention_heads": 4, "inner_hidden_size": 1024, "max_sequence_length": 2048,
           "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "tie_word_embeddings": True,
           "bos_token_id": 130004, "eos_token_id": 130005, "mask_token_id": 130000,
           "gmask_token_id": 130001, "pad_token_id": 3}, open(sys.argv[1] + "/small.json", "w"))
EOF
check_train() {
    local ok=1
    for P in 1 2; do
        rm -rf "$W/check-p$P"
        timeout 300 "$GLM" train --init_from_config "$W/small.json" --tokenizer_name "$TOKENIZER" --train_file "$W/w1.jsonl" \
            --output_dir "$W/check-p$P" --overwrite_output_dir --fp32 --per_device_train_batch_size 2 \
            --max_source_length 64 --max_target_length 64 --gradient_accumulation_steps 4 --learning_rate 1e-3 \
            --max_steps 12 --save_steps 12 --logging_steps 1 --report_to none --disable_tqdm --seed 3 \
            --nproc_per_node "$P" --pipeline_parallel_size "$P" >"$OUT/check-train-p$P.log" 2>&1 || ok=0
    done
    python3 - "$W" "$ok" <<'EOF'
import json, sys
w, ok = sys.argv[1], sys.argv[2] == "1"
try:
    L = [{r["step"]: r["loss"] for r in json.load(open("%s/check-p%d/checkpoint-12/trainer_state.json" % (w, p)))["log_history"]
          if "loss" in r} for p in (1, 2)]
    worst = max(abs(L[1][s] - L[0][s]) / abs(L[0][s]) for s in L[0])
    ok = ok and len(L[0]) == 12 and len(L[1]) == 12
except Exception as e:
    worst, ok = float("inf"), False
print("%s check_train_p2_matches_one_gpu: 12 steps, max relative loss difference %.3g" %
      ("PASS" if ok and worst < 1e-5 else "FAIL", worst))
EOF
}

summary="$OUT/summary.jsonl"
: >"$summary"
for run in $RUNS; do
    if [ "$run" = check-train ]; then check_train | tee "$OUT/check-train.txt"; continue; fi
    if [ "$run" = check-infer ]; then
        { timeout 300 "$TOOL" --device cuda --pp 2 --dtype f32; timeout 300 "$TOOL" --device cuda --pp 2 --dtype bf16 --map thudm; } \
            2>"$OUT/check-infer.err" | tee "$OUT/check-infer.txt"
        continue
    fi
    case $run in
        p1)           n=1; extra="--max_steps $STEPS" ;;
        dp2)          n=2; extra="--max_steps $STEPS --zero_stage 1" ;;
        pp2-thudm-m*) n=2; m=${run##*-m}; extra="--max_steps $STEPS --pipeline_parallel_size 2 --device_map thudm --gradient_accumulation_steps $m" ;;
        pp2-m*)       n=2; m=${run##*-m}; extra="--max_steps $STEPS --pipeline_parallel_size 2 --gradient_accumulation_steps $m" ;;
        cap-p1)       n=1; extra="--max_steps 2 --max_memory_per_gpu $CAP" ;;
        cap-p2)       n=2; extra="--max_steps 4 --max_memory_per_gpu $CAP --pipeline_parallel_size 2 --gradient_accumulation_steps 8" ;;
        *) echo "bench_pp: unknown run $run"; continue ;;
    esac
    rm -rf "$W/$run"
    t0=$SECONDS
    # shellcheck disable=SC2046
    timeout 600 "$GLM" train $(common_flags) --output_dir "$W/$run" --nproc_per_node "$n" $extra >"$OUT/$run.log" 2>&1
    rc=$?
    cp "$W/$run/logs/"rank-*.log "$OUT/" 2>/dev/null && for f in "$OUT"/rank-*.log; do mv "$f" "$OUT/$run.${f##*/}"; done
    python3 - "$OUT" "$run" "$n" "$WARM" "$rc" "$((SECONDS - t0))" >>"$summary" <<'EOF'
import ast, glob, json, re, statistics, sys
out, run, n, warm, rc, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
tps, bubble, ideal, mem, err = [], [], None, {}, ""
for path in [out + "/" + run + ".log"] + sorted(glob.glob(out + "/" + run + ".rank-*.log")):
    for line in open(path, errors="replace"):
        if line.startswith("{'loss'") and "rank-" not in path:
            r = ast.literal_eval(line.strip())
            if r["step"] > warm: tps.append(r["tokens_per_second"])
        m = re.search(r"bubble ([\d.]+)% \(1F1B ideal ([\d.]+)%\)", line)
        if m and "rank-" not in path:
            bubble.append(float(m.group(1))); ideal = float(m.group(2))
        if "ranks (fwd+bwd" in line:  # "r: 1.234 95% 60.1 GiB 650 W" per rank of a stage's replicas
            first = 1 if "rank-1" in path else 0  # stage 1's line sits in rank 1's log
            for r, g in re.findall(r"(\d+): [\d.]+ [\d.]+% ([\d.]+) GiB", line):
                k = "gpu%d" % (first + int(r))
                mem[k] = max(mem.get(k, 0.0), float(g))
        if line.startswith("error:"): err = line.strip()
med = statistics.median(tps) if tps else 0.0
rec = {"workload": "W1", "run": run, "gpus": n, "exit": rc, "wall_s": wall, "tokens_per_s": round(med),
       "tokens_per_s_per_gpu": round(med / n), "steps_timed": len(tps), "gpu_memory_gib": mem,
       "bubble_pct": round(statistics.median(bubble), 1) if bubble else None, "bubble_ideal_pct": ideal}
if err: rec["error"] = err[:300]
print(json.dumps(rec))
EOF
    tail -1 "$summary"
done
cp "$summary" "$OUT/bench_pp.jsonl"
python3 - "$summary" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%-14s %4s %10s %10s %18s %14s  %s" % ("run", "gpus", "tok/s", "tok/s/GPU", "GPU memory GiB", "bubble (ideal)", "exit"))
for r in rows:
    mem = " ".join("%.1f" % v for k, v in sorted(r["gpu_memory_gib"].items())) or "-"
    bub = "%.1f%% (%.1f%%)" % (r["bubble_pct"], r["bubble_ideal_pct"]) if r["bubble_pct"] is not None else "-"
    print("%-14s %4d %10d %10d %18s %14s  %d %s" % (r["run"], r["gpus"], r["tokens_per_s"], r["tokens_per_s_per_gpu"],
          mem, bub, r["exit"], r.get("error", "")))
EOF
echo "expected: cap-p1 exits non-zero with 'the model plans ... GiB' and a hint for --pipeline_parallel_size 2; cap-p2 exits 0"
