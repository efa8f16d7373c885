#!/usr/bin/env python3
"""n choices of one long prompt against n different prompts of the same length, on `glmtrain serve`
(session 38: a prompt's choices share one prefill). Over raw HTTP, greedy completions of
--max_tokens tokens (ignore_eos), timed from the request to the whole answer:

  choices   one request, `n` = N, of one prompt of about --prompt_tokens tokens
  distinct  N requests at once, each a different prompt of that length (each its own prefill,
            batched as the engine's work buffers allow)

Each case --rounds times (after one untimed round), with the engine's forward seconds from /health.

  python3 bench/serve_n_bench.py --glmtrain build/gpu/glmtrain --model /tmp/chatglm-6b --n 8 \\
      --prompt_tokens 1000 --server_args "--max_batch_size 16 --max_model_len 2048 --dtype bfloat16"
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import append_records, get, post_json, stop, wait_up  # noqa: E402

WORDS = "春风又绿江南岸明月何时照我还山高水长云淡风轻花开花落"


def post(port, body):
    return post_json(port, "/v1/completions", body)


def prompt_of(port, k, want):
    """A text of about `want` tokens, different for each k (its first characters)."""
    text = WORDS[k % len(WORDS)] * 3 + WORDS * 2
    while True:
        n = post(port, {"prompt": text, "max_tokens": 1})["usage"]["prompt_tokens"]
        if n >= want:
            return text
        text += WORDS * max(1, (want - n) // 20)


def timed(port, fn):
    h0 = get("127.0.0.1", port, "/health")[1]
    t0 = time.time()
    fn()
    dt = time.time() - t0
    h1 = get("127.0.0.1", port, "/health")[1]
    return dt, h1["forward_seconds"] - h0["forward_seconds"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glmtrain", default="build/glmtrain")
    ap.add_argument("--model", required=True)
    ap.add_argument("--server_args", default="")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt_tokens", type=int, default=1000)
    ap.add_argument("--max_tokens", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    port = 19000 + os.getpid() % 1000
    cmd = [a.glmtrain, "serve", "--model_name_or_path", a.model, "--port", str(port)] + shlex.split(a.server_args)
    print("starting:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stderr=sys.stderr)
    records = []
    try:
        wait_up(proc, "127.0.0.1", port)
        prompts = [prompt_of(port, k, a.prompt_tokens) for k in range(a.n)]
        gen = {"max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}

        def choices():
            out = post(port, dict(gen, prompt=prompts[0], n=a.n))
            assert len(out["choices"]) == a.n

        def distinct():
            ts = [threading.Thread(target=post, args=(port, dict(gen, prompt=p))) for p in prompts]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        ntok = post(port, dict(gen, prompt=prompts[0]))["usage"]["prompt_tokens"]
        for name, fn in (("choices", choices), ("distinct", distinct)):
            fn()  # untimed
            runs = [timed(port, fn) for _ in range(a.rounds)]
            rec = {"what": name, "n": a.n, "prompt_tokens": ntok, "max_tokens": a.max_tokens,
                   "seconds": [r[0] for r in runs], "forward_seconds": [r[1] for r in runs],
                   "median_s": statistics.median(r[0] for r in runs)}
            records.append(rec)
            print("%-8s n %d x %d prompt tokens, %d new: %.3f s median (%s), forward %s" % (
                name, a.n, ntok, a.max_tokens, rec["median_s"], ", ".join("%.3f" % r[0] for r in runs),
                ", ".join("%.3f" % r[1] for r in runs)), flush=True)
        print("distinct / choices: %.2fx" % (records[1]["median_s"] / records[0]["median_s"]))
    finally:
        stop(proc)
        append_records(a.out, records)


if __name__ == "__main__":
    main()
