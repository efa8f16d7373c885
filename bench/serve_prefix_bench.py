#!/usr/bin/env python3
"""Multi-turn conversations on `glmtrain serve` with prefix caching on and off (session 39). Over
raw HTTP, token-id prompts to /v1/completions, streamed, greedy, ignore_eos:

  C conversations at once, each T turns. Turn 1's prompt: a system block of --system_tokens random
  ids + --user_tokens more; each next turn's prompt: the last prompt, the last answer (its text
  through /tokenize, as a client that keeps the history as text sends it again) and
  --user_tokens new ids. Each answer --max_tokens tokens.

Per mode: the time to the first token of turns 2..T (mean, max), the wall time of the whole run,
the prompt tokens the cache held (usage.prompt_tokens_details.cached_tokens). One server per mode,
started with --enable_prefix_caching true / false and --server_args.

  python3 bench/serve_prefix_bench.py --glmtrain build/gpu/glmtrain --model /tmp/chatglm2-6b \\
      --conversations 8 --turns 6 --server_args "--max_batch_size 16 --max_model_len 4096 --dtype bfloat16"
"""
import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import append_records, post_json, stop, stream_events, wait_up  # noqa: E402


def turn(port, ids, max_tokens):
    """One streamed completion: (seconds to the first token, seconds in all, text, cached tokens)."""
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.time()
    first, text, cached = None, [], None
    for t, ev in stream_events(port, "/v1/completions", body):
        if ev.get("error"):
            raise RuntimeError(ev["error"])
        if ev.get("usage"):
            cached = ev["usage"]["prompt_tokens_details"]["cached_tokens"]
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                first = first or t
                text.append(ch["text"])
    return (first or time.time()) - t0, time.time() - t0, "".join(text), cached


def conversation(port, k, a, out):
    g = random.Random(1000 + k)
    ids = [g.randrange(5, a.vocab) for _ in range(a.system_tokens + a.user_tokens)]
    for t in range(a.turns):
        ttft, total, text, cached = turn(port, ids, a.max_tokens)
        out.append({"conv": k, "turn": t, "prompt": len(ids), "ttft": ttft, "total": total, "cached": cached})
        ans = post_json(port, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
        ids = ids + ans + [g.randrange(5, a.vocab) for _ in range(a.user_tokens)]


def run_mode(a, on):
    cmd = [a.glmtrain, "serve", "--model_name_or_path", a.model, "--port", str(a.port), "--enable_prefix_caching",
           "true" if on else "false"] + shlex.split(a.server_args)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(a.log + (".on" if on else ".off"), "w"))
    try:
        wait_up(proc, "127.0.0.1", a.port)
        turn(a.port, [7] * 64, 4)  # warm-up
        out, th = [], []
        t0 = time.time()
        for k in range(a.conversations):
            th.append(threading.Thread(target=conversation, args=(a.port, k, a, out)))
            th[-1].start()
        for x in th:
            x.join()
        wall = time.time() - t0
    finally:
        stop(proc)
    later = [r for r in out if r["turn"] > 0]
    rec = {"mode": "prefix caching " + ("on" if on else "off"), "conversations": a.conversations, "turns": a.turns,
           "system_tokens": a.system_tokens, "user_tokens": a.user_tokens, "max_tokens": a.max_tokens,
           "wall_s": round(wall, 3), "ttft_turn1_mean_s": round(statistics.mean(r["ttft"] for r in out if r["turn"] == 0), 4),
           "ttft_later_mean_s": round(statistics.mean(r["ttft"] for r in later), 4),
           "ttft_later_max_s": round(max(r["ttft"] for r in later), 4),
           "prompt_tokens_later": sum(r["prompt"] for r in later), "cached_tokens_later": sum(r["cached"] or 0 for r in later),
           "last_prompt_mean": round(statistics.mean(r["prompt"] for r in out if r["turn"] == a.turns - 1)),
           "generated_tokens_per_s": round(len(out) * a.max_tokens / wall, 1)}
    print(json.dumps(rec), flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glmtrain", default="build/gpu/glmtrain")
    ap.add_argument("--model", required=True)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system_tokens", type=int, default=1000)
    ap.add_argument("--user_tokens", type=int, default=60)
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=130000, help="ids drawn from [5, vocab)")
    ap.add_argument("--server_args", default="")
    ap.add_argument("--port", type=int, default=18123)
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--log", default="/tmp/serve_prefix_bench.log")
    ap.add_argument("--out", default=None, help="append the records (JSON lines) here")
    a = ap.parse_args()
    recs = [run_mode(a, m == "on") for m in a.modes.split(",")]
    if a.out:
        append_records(a.out, recs)


if __name__ == "__main__":
    main()
