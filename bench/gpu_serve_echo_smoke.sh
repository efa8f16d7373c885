#!/usr/bin/env bash
# `serve`'s echo on a GPU (session 37): a tiny ChatGLM2-family model (random, two CPU training steps)
# with the real ChatGLM-6B tokenizer, served on the CPU (fp32) and on CUDA (fp32, bf16). The same
# requests to each: a list of id prompts of 40-200 tokens (more than one 64-row block of prompt
# logits) with echo and max_tokens 1, with logprobs 2 (the rows' logits to the host) and with
# logprobs 1 (lm-evaluation-harness's way: cross entropy and argmax on the device); a text prompt
# with max_tokens 0. CUDA fp32's prompt log-probabilities must equal the CPU's (relative 1e-3) and
# bf16's stay near them (absolute 0.1); the greedy generated tokens of fp32 must agree. Prints
# PASS/FAIL. Then 3 greedy choices of one 200-token prompt (one prefill, the cache rows copied into
# the other slots on the device) against the prompt alone on each device; then that prompt kept by
# one request and extended by 8 tokens in the next (prefix caching: 200 tokens cached) on each
# device, against CUDA fp32 without caching; and that prompt prefilled in parts of 64 tokens
# (--max_num_batched_tokens) against whole on CUDA fp32; generate's prompt lookup against plain
# decoding (CUDA fp32: the same tokens).
# Needs build/gpu/glmtrain (MPI=0), build/lib with libmicrohttpd's chain (SERVE=1 bash
# bench/prepare_carry.sh), build/shared (tokenizers/chatglm-6b), python3.
# usage: bash bench/gpu_serve_echo_smoke.sh [BUILD_DIR]
set -u
. "$(dirname "$0")/lib.sh"
smoke_setup echo "${1:-}"
ok() { smoke_ok "$@"; }
cat >"$W/config.json" <<'J'
{"model_type": "chatglm", "architectures": ["ChatGLMModel"], "padded_vocab_size": 130560, "hidden_size": 256,
 "num_layers": 2, "num_attention_heads": 4, "kv_channels": 64, "multi_query_attention": true, "multi_query_group_num": 2,
 "ffn_hidden_size": 512, "layernorm_epsilon": 1e-5, "rmsnorm": true, "add_qkv_bias": true, "add_bias_linear": false,
 "apply_residual_connection_post_layernorm": false, "post_layer_norm": true, "original_rope": true, "seq_length": 1024,
 "tie_word_embeddings": false, "eos_token_id": 130005, "pad_token_id": 3}
J
python3 - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
words = ["春", "风", "山", "水", "明月", "江南", "问题", "答案"]
json.dump([{"instruction": "写一句关于%s的诗" % x, "output": x * 3} for x in words * 4], open(os.path.join(w, "sft.json"), "w"),
          ensure_ascii=False)
PY
"$B/glmtrain" train --init_from_config "$W/config.json" --tokenizer_name "$TOK" --train_file "$W/sft.json" \
    --output_dir "$W/base" --max_steps 2 --per_device_train_batch_size 8 --disable_tqdm --device cpu >"$W/log" 2>&1
ok $? "base_model"
for how in "cpu float32" "cuda float32" "cuda bfloat16"; do
    set -- $how
    serve_start "$W/serve_$1_$2.log" --model_name_or_path "$W/base" --device "$1" --dtype "$2"
    python3 - "$SERVE_PORT" "$W/echo_$1_$2.json" <<'PY' >"$W/log" 2>&1
import json, random, sys, urllib.request
port, out = sys.argv[1:3]
def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), headers={"Content-Type": "application/json"},
                                 data=json.dumps(body, ensure_ascii=False).encode())
    return json.load(urllib.request.urlopen(req, timeout=300))
g = random.Random(7)
prompts = [[g.randrange(5, 130000) for _ in range(n)] for n in (40, 64, 65, 129, 200)]
a = post("/v1/completions", {"prompt": prompts, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0})
b = post("/v1/completions", {"prompt": "写一句关于春的诗，要有山和水", "echo": True, "logprobs": 0, "max_tokens": 0})
c = post("/v1/completions", {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0})
json.dump([x["logprobs"] for x in a["choices"] + b["choices"] + c["choices"]], open(out, "w"))
# n choices of one prompt share a prefill (the first one's cache rows copied on the device)
one = post("/v1/completions", {"prompt": prompts[4], "echo": True, "logprobs": 1, "max_tokens": 6, "temperature": 0,
                               "ignore_eos": True})
three = post("/v1/completions", {"prompt": prompts[4], "echo": True, "logprobs": 1, "max_tokens": 6, "temperature": 0,
                                 "ignore_eos": True, "n": 3})
json.dump([x["logprobs"] for x in one["choices"] + three["choices"]], open(out.replace("echo_", "echo_n_"), "w"))
# prefix caching: the 200-token prompt kept by a request, then extended by 8 tokens (200 cached);
# the same extended prompt on a server without caching
ext = prompts[4] + [g.randrange(5, 130000) for _ in range(8)]
gen = {"max_tokens": 6, "temperature": 0, "logprobs": 1, "ignore_eos": True}
post("/v1/completions", dict(gen, prompt=prompts[4], max_tokens=1))
hit = post("/v1/completions", dict(gen, prompt=ext))
json.dump({"cached": hit["usage"]["prompt_tokens_details"]["cached_tokens"], "logprobs": hit["choices"][0]["logprobs"]},
          open(out.replace("echo_", "echo_p_"), "w"))
PY
    ok $? "serve_echo_$1_$2"
    serve_stop
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
cpu, cu32, cu16 = (json.load(open("%s/echo_%s.json" % (w, k))) for k in ("cpu_float32", "cuda_float32", "cuda_bfloat16"))
def worst(x, y, rel):
    e = 0.0
    for a, b in zip(x, y):
        for p, q in zip(a["token_logprobs"], b["token_logprobs"]):
            if (p is None) != (q is None): return float("inf")
            if p is not None: e = max(e, abs(p - q) / (max(1.0, abs(q)) if rel else 1.0))
    return e
n = sum(len(a["token_logprobs"]) for a in cpu)
same_len = [len(a["token_logprobs"]) for a in cpu] == [len(a["token_logprobs"]) for a in cu32] == [len(a["token_logprobs"]) for a in cu16]
e32, e16 = worst(cu32, cpu, True), worst(cu16, cpu, False)
tok32 = all(a["tokens"] == b["tokens"] for a, b in zip(cu32, cpu))
print("serve echo: %d log-probabilities; cuda fp32 vs cpu worst relative %.2e (tokens equal: %s); cuda bf16 vs cpu worst %.4f"
      % (n, e32, tok32, e16))
sys.exit(0 if same_len and e32 < 1e-3 and e16 < 0.1 and tok32 else 1)
PY
ok $? "serve_echo_cuda_equals_cpu"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
bad = []
for k, tol in (("cpu_float32", 1e-6), ("cuda_float32", 1e-4), ("cuda_bfloat16", None)):
    one, *three = json.load(open("%s/echo_n_%s.json" % (w, k)))
    for c in three:  # the prompt's 200 entries come from the shared prefill: the same numbers
        same_prompt = c["token_logprobs"][:200] == one["token_logprobs"][:200]
        e = max(abs(p - q) for p, q in zip(c["token_logprobs"][200:], one["token_logprobs"][200:]))
        print("serve n choices %s: prompt entries equal %s, tokens equal %s, worst generated logprob difference %.2e"
              % (k, same_prompt, c["tokens"] == one["tokens"], e))
        # bf16's decode of 3 rows may round otherwise than of 1: its generated tokens are reported only
        if not same_prompt or (tol is not None and (c["tokens"] != one["tokens"] or e > tol)): bad.append(k)
sys.exit(1 if bad else 0)
PY
ok $? "serve_n_choices_share_a_prefill"
serve_start "$W/serve_nocache.log" --model_name_or_path "$W/base" --device cuda --dtype float32 --enable_prefix_caching false
python3 - "$SERVE_PORT" "$W" <<'PY' >"$W/log" 2>&1
import json, random, sys, urllib.request
port, w = sys.argv[1:3]
g = random.Random(7)
prompts = [[g.randrange(5, 130000) for _ in range(n)] for n in (40, 64, 65, 129, 200)]
ext = prompts[4] + [g.randrange(5, 130000) for _ in range(8)]
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": ext, "max_tokens": 6, "temperature": 0, "logprobs": 1,
                                              "ignore_eos": True}).encode())
cold = json.load(urllib.request.urlopen(req, timeout=300))
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": prompts[4], "max_tokens": 6, "temperature": 0, "logprobs": 1,
                                              "ignore_eos": True}).encode())
json.dump(json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["logprobs"], open(w + "/whole200.json", "w"))
bad = []
for k, tol in (("cpu_float32", 1e-3), ("cuda_float32", 1e-3), ("cuda_bfloat16", None)):
    hit = json.load(open("%s/echo_p_%s.json" % (w, k)))
    a, b = hit["logprobs"], cold["choices"][0]["logprobs"]
    e = max(abs(p - q) / max(1.0, abs(q)) for p, q in zip(a["token_logprobs"], b["token_logprobs"]))
    print("serve prefix cache %s: %d cached, tokens equal %s, worst relative logprob difference %.2e against CUDA fp32 uncached"
          % (k, hit["cached"], a["tokens"] == b["tokens"], e))
    if hit["cached"] != 200 or (tol is not None and (a["tokens"] != b["tokens"] or e > tol)): bad.append(k)
sys.exit(1 if bad else 0)
PY
rc=$?
cat "$W/log"
ok $rc "serve_prefix_cache_equals_uncached"
serve_stop
# the 200-token prompt prefilled in parts of 64 (--max_num_batched_tokens) against whole, CUDA fp32
serve_start "$W/serve_parts.log" --model_name_or_path "$W/base" --device cuda --dtype float32 --enable_prefix_caching false \
    --max_num_batched_tokens 64
python3 - "$SERVE_PORT" "$W" <<'PY' >"$W/log" 2>&1
import json, random, sys, urllib.request
port, w = sys.argv[1:3]
g = random.Random(7)
prompts = [[g.randrange(5, 130000) for _ in range(n)] for n in (40, 64, 65, 129, 200)]
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": prompts[4], "max_tokens": 6, "temperature": 0, "logprobs": 1,
                                              "ignore_eos": True}).encode())
a = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]["logprobs"]
b = json.load(open(w + "/whole200.json"))
e = max(abs(p - q) / max(1.0, abs(q)) for p, q in zip(a["token_logprobs"], b["token_logprobs"]))
print("serve prompt in parts of 64, CUDA fp32: tokens equal %s, worst relative logprob difference %.2e against whole"
      % (a["tokens"] == b["tokens"], e))
sys.exit(0 if a["tokens"] == b["tokens"] and e < 1e-3 else 1)
PY
rc=$?
cat "$W/log"
ok $rc "serve_prompt_in_parts_equals_whole"
serve_stop
# generate's prompt lookup (--prompt_lookup_num_tokens) against plain decoding, greedy: the same
# tokens on CUDA fp32 (each draft's rows from one product of k + 1 rows, where plain decoding has
# one row a pass); bf16 reported (a product of other shape may round a near tie the other way)
P="春风又绿江南岸，明月何时照我还。春风又绿江南岸，明月何时照我还。春风又绿"
for dt in float32 bfloat16; do
    for k in 0 10; do
        "$B/glmtrain" generate --model_name_or_path "$W/base" --device cuda --dtype $dt --do_sample false \
            --max_new_tokens 80 --prompt "$P" --prompt_lookup_num_tokens $k --debug >"$W/gen_${dt}_$k.out" 2>"$W/gen_${dt}_$k.err"
        echo "    generate $dt lookup $k: rc $? $(grep -h 'prompt lookup' "$W/gen_${dt}_$k.err")"
    done
    if [ "$(grep '^\[debug\] response' "$W/gen_${dt}_0.err")" = "$(grep '^\[debug\] response' "$W/gen_${dt}_10.err")" ] &&
        [ -s "$W/gen_${dt}_0.out" ]; then same=0; else same=1; fi
    if [ $dt = float32 ]; then ok $same "generate_prompt_lookup_equals_plain_fp32"
    else echo "    bf16: same tokens with and without prompt lookup: $([ $same = 0 ] && echo yes || echo no)"; fi
done
# serve's prompt lookup against plain decoding, CUDA fp32: 4 greedy streams side by side
for k in 0 10; do
    serve_start "$W/serve_lookup_$k.log" --model_name_or_path "$W/base" --device cuda --dtype float32 \
        --prompt_lookup_num_tokens $k --max_batch_size 4
    python3 - "$SERVE_PORT" "$W/lookup_$k.json" <<'PY' >"$W/log" 2>&1
import json, random, re, sys, urllib.request
port, out = sys.argv[1:3]
g = random.Random(9)
def rep():
    a, b = [g.randrange(5, 130000) for _ in range(6)], [g.randrange(5, 130000) for _ in range(5)]
    return a + b + a + b + a[:3]
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": [rep() for _ in range(4)], "max_tokens": 60, "temperature": 0,
                                              "logprobs": 1, "ignore_eos": True}).encode())
r = json.load(urllib.request.urlopen(req, timeout=300))
m = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port).read().decode()
acc = re.search(r"spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)", m)
json.dump({"tokens": [c["logprobs"]["tokens"] for c in r["choices"]],
           "lps": [c["logprobs"]["token_logprobs"] for c in r["choices"]], "accepted": float(acc.group(1))}, open(out, "w"))
PY
    serve_stop
done
python3 - "$W" <<'PY'
import json, sys
a, b = (json.load(open(sys.argv[1] + "/lookup_%d.json" % k)) for k in (0, 10))
e = max(abs(p - q) / max(1.0, abs(q)) for x, y in zip(b["lps"], a["lps"]) for p, q in zip(x, y))
print("    serve prompt lookup, CUDA fp32: tokens equal %s, %d draft tokens taken, worst relative logprob difference %.2e"
      % (a["tokens"] == b["tokens"], b["accepted"], e))
sys.exit(0 if a["tokens"] == b["tokens"] and e < 1e-3 and b["accepted"] > 0 else 1)
PY
ok $? "serve_prompt_lookup_equals_plain_fp32"
# JSON mode and guided choices on CUDA bf16 (the masks run on the host over the logits brought back)
serve_start "$W/serve_constrained.log" --model_name_or_path "$W/base" --device cuda --dtype bfloat16 --max_batch_size 4
python3 - "$SERVE_PORT" <<'PY' >"$W/log" 2>&1
import json, sys, urllib.request
port = sys.argv[1]
def post(body):
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, headers={"Content-Type": "application/json"},
                                 data=json.dumps(body).encode())
    return json.load(urllib.request.urlopen(req, timeout=300))["choices"]
objs = post({"prompt": ["写一个JSON对象"] * 4, "max_tokens": 120, "temperature": 1.0, "top_p": 1.0, "seed": 3,
             "response_format": {"type": "json_object"}})
good = 0
for c in objs:
    if c["finish_reason"] == "stop":
        good += isinstance(json.loads(c["text"]), dict)
picks = post({"prompt": ["这句话的情感是"] * 4, "max_tokens": 40, "temperature": 1.0, "seed": 4,
              "guided_choice": ["正面", "负面", "中性"]})
ok_choice = all(c["text"] in ("正面", "负面", "中性") for c in picks)
print("    JSON mode on CUDA bf16: %d of 4 answers closed as JSON objects (%s); guided choices %s"
      % (good, [c["finish_reason"] for c in objs], [c["text"] for c in picks]))
sys.exit(0 if ok_choice and all(c["finish_reason"] == "length" or isinstance(json.loads(c["text"]), dict) for c in objs) else 1)
PY
rc=$?
cat "$W/log"
ok $rc "serve_json_mode_and_guided_choice_bf16"
serve_stop
rm -rf "$W"
