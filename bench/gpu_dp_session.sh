#!/usr/bin/env bash
# One device call on a 2-GPU machine for data-parallel scaling (issue 6): W1 on 1 GPU, then on
# 2 GPUs with ZeRO 0 and 1 under each variant in VARIANTS (a label and its environment,
# comma-separated), all through bench/bench_dp.sh in the same call, so every scaling figure has
# its 1-GPU baseline beside it. Each record carries rank 0's step phases (fwd+bwd / gradient
# reduction tail / norm / update, ms). $OUT gets all.jsonl, logs.tgz (every run's log), env.txt.
# Build here first: make -j2 MPI=0 BUILD=build/gpu build/gpu/glmtrain; carry build/gpu/glmtrain,
# build/lib (libcjson, libgomp) and build/shared (the ChatGLM-6B tokenizer).
# TWO_NODES=1 adds W1 as "two nodes" (two processes, NCCL over TCP sockets on loopback);
# DDP=512x8c adds PyTorch DDP (bench/pytorch_ddp.py) on 2 GPUs and on 1.
#   VARIANTS="base: ctas8:NCCL_MAX_CTAS=8 z2@2: z0ag@0:GLMTRAIN_DP_Z0_AG_BACKWARD=1" bash bench/gpu_dp_session.sh
set -u
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/build/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
GLM=${GLM:-$PWD/build/gpu/glmtrain}
VARIANTS=${VARIANTS:-base:}
ZERO=${ZERO:-0 1}
STEPS=${STEPS:-12}
WORK=${WORK:-/tmp/dpwork} # data and per-run logs
mkdir -p "$OUT" "$WORK"
for t in ../shared/tokenizers/chatglm-6b build/shared/tokenizers/chatglm-6b; do [ -f "$t/ice_text.model" ] && ln -sfn "$PWD/$t" "$WORK/tok" && break; done
{ nvidia-smi topo -m; NCCL_DEBUG=VERSION timeout 30 "$GLM" env; } >"$OUT/env.txt" 2>&1
grep -iE "NCCL version|GPU 1 " "$OUT/env.txt" | head -3
bench() { # tag, gpus, zero stages, env...
    local tag=$1 n=$2 z=$3; shift 3
    echo "=== $tag on $n GPU(s) ($*) $(date -u +%H:%M:%S)"
    env "$@" GLM=$GLM OUT=$WORK GPUS=$n BATCHES=8 ZERO="$z" STEPS=$STEPS WARM=3 TAG=$tag RUN_TIMEOUT=${RUN_TIMEOUT:-120} \
        timeout 300 bash bench/bench_dp.sh >"$WORK/session-$tag.log" 2>&1
    pkill -f "$GLM train" 2>/dev/null; sleep 1 # nothing left holding the GPUs
    cat "$WORK/summary.txt" >>"$OUT/all.jsonl"
}
bench 1gpu 1 0
# BASE1=1: the 1-GPU run again on the second GPU (the GPUs of a pair differ in speed under
# their power cap; the reference stays the first GPU's)
[ "${BASE1:-0}" = 1 ] && bench 1gpu-dev1 1 0 CUDA_VISIBLE_DEVICES=1
for v in $VARIANTS; do # tag[@stages]:ENV=v,ENV2=v; stages joined by '+' replace ZERO for that variant
    envs=${v#*:} tag=${v%%:*} z=$ZERO
    case $tag in *@*) z=${tag#*@}; z=${z//+/ }; tag=${tag%%@*} ;; esac
    bench "$tag" 2 "$z" ${envs//,/ }
done
if [ "${TWO_NODES:-0}" = 1 ]; then # the multi-node path: 2 processes on NCCL's socket transport over loopback
    echo "=== two nodes over sockets $(date -u +%H:%M:%S)"
    for r in 0 1; do
        CUDA_VISIBLE_DEVICES=$r NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
        timeout 120 "$GLM" train --init_from_config "$WORK/work/config.json" --tokenizer_name "$WORK/tok" \
            --train_file "$WORK/work/w1.jsonl" --output_dir "$WORK/2node-r$r" --overwrite_output_dir --bf16 \
            --per_device_train_batch_size 8 --max_source_length 256 --max_target_length 256 --learning_rate 1e-5 \
            --max_steps 6 --logging_steps 1 --save_strategy no --save_final_model false --report_to none --disable_tqdm \
            --nnodes 2 --node_rank $r --nproc_per_node 1 --master_addr 127.0.0.1 --master_port 29533 \
            >"$WORK/two-nodes-r$r.log" 2>&1 &
    done
    wait
    grep -h "^{'loss'" "$WORK/two-nodes-r0.log" | tail -2
fi
if [ -n "${DDP:-}" ]; then # PyTorch DistributedDataParallel on 2 GPUs and on 1, same script, same call
    for n in 2 1; do
        echo "=== PyTorch DDP on $n GPU(s) $(date -u +%H:%M:%S)"
        timeout 280 python3 -m torch.distributed.run --standalone --nproc_per_node $n bench/pytorch_ddp.py --runs "$DDP" \
            --no-static-graph --bucket_cap_mb 100 >"$WORK/ddp-n$n.log" 2>&1
        grep -h '"impl"' "$WORK/ddp-n$n.log" | tee -a "$OUT/ddp.jsonl"
    done
fi
tar czf "$OUT/logs.tgz" -C "$WORK" $(cd "$WORK" && ls *.log) 2>/dev/null
python3 - "$OUT/all.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["tokens_per_s_per_gpu"] for r in recs if r["gpus"] == 1), 0)
for r in recs:
    print("%-6s gpus %d zero %d  %6d tok/s/GPU  %5.1f%%  phases %s  exit %d" % (r["tag"], r["gpus"], r["zero"],
          r["tokens_per_s_per_gpu"], 100.0 * r["tokens_per_s_per_gpu"] / base if base else 0,
          r["rank0_ms_fwdbwd_tail_norm_update"], r["exit"]))
EOF
