#!/usr/bin/env bash
# What decoding constraints cost a server (serve's JSON mode and structured outputs: the masks run on
# the host over each row's logits, in parallel over rows): bench/serve_bench.py at 1 and 8 streams,
# greedy chat completions of up to 256 tokens on a ChatGLM2-6B-shaped folder of random weights
# (bench/make_chatglm2_folder.py; MODEL to reuse one), without a constraint, with
# response_format json_object and with a json_schema of the keywords pydantic writes ($defs, $ref,
# anyOf with null, bounds, lengths). Random weights seldom close a value, so the constrained answers
# mostly run to the limit, as the plain ones do (ignore_eos). The engine's line gives the step's
# time and the part of it outside the forward.
# usage: bash bench/gpu_constrained_bench.sh [BUILD_DIR]
set -u
B=${1:-build/gpu}
M=${MODEL:-/tmp/chatglm2-6b}
[ -f "$M/config.json" ] || python3 "$(dirname "$0")/make_chatglm2_folder.py" --out "$M" >/dev/null || exit 1
SCHEMA='{"response_format": {"type": "json_schema", "json_schema": {"name": "Answer", "schema": {"$defs": {"Step": {"type": "object", "properties": {"explanation": {"type": "string", "maxLength": 40}, "output": {"type": "string"}}, "required": ["explanation", "output"]}}, "type": "object", "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}}, "final": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}, "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["steps", "final", "confidence", "note"]}}}}'
for what in plain json_object json_schema; do
    case $what in
    plain) extra='' ;;
    json_object) extra='{"response_format": {"type": "json_object"}}' ;;
    json_schema) extra=$SCHEMA ;;
    esac
    python3 "$(dirname "$0")/serve_bench.py" --glmtrain "$B/glmtrain" --model "$M" --streams 1,8 --max_tokens 256 \
        --extra "$extra" --server_args "--max_batch_size 8 --max_model_len 2048 --dtype bfloat16" 2>&1 |
        grep -E "^ +[0-9]+ +[0-9.]+|engine:|errors\": \[[^]]" | sed "s/^/$what: /"
done
