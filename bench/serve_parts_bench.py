#!/usr/bin/env python3
"""Streams decoding while one long prompt arrives, on `glmtrain serve` with the prompt prefilled
whole and in parts (session 39, --max_num_batched_tokens). Over raw HTTP, token-id prompts:

  --streams greedy ignore_eos streams of --max_tokens tokens start together; after --delay s one
  request with a prompt of --long_tokens random ids and max_tokens 1 arrives.

Per server setting (each --parts value: the server's --max_num_batched_tokens; 0 = its default):
the streams' largest gap between two tokens and their mean gap, the long prompt's time to its
token, the streams' tokens/s. One server per setting, --server_args beside it.

  python3 bench/serve_parts_bench.py --glmtrain build/gpu/glmtrain --model /tmp/chatglm2-6b \\
      --long_tokens 16000 --parts 16384,2048 --server_args "--max_batch_size 16 --max_model_len 16384 --dtype bfloat16"
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
from serve_bench import append_records, stop, stream_events, wait_up  # noqa: E402


def stream_times(port, ids, max_tokens, out, k):
    """One streamed completion: out[k] = (send time, [arrival time of each text chunk])."""
    t0 = time.time()
    body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    out[k] = (t0, [t for t, ev in stream_events(port, "/v1/completions", body)
                   if any(ch.get("text") for ch in ev.get("choices") or [])])


def run(a, parts):
    cmd = [a.glmtrain, "serve", "--model_name_or_path", a.model, "--port", str(a.port)] + shlex.split(a.server_args)
    if parts:
        cmd += ["--max_num_batched_tokens", str(parts)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open("%s.%d" % (a.log, parts), "w"))
    try:
        wait_up(proc, "127.0.0.1", a.port)
        g = random.Random(5)
        warm = {}
        stream_times(a.port, [g.randrange(5, a.vocab) for _ in range(a.long_tokens)], 1, warm, 0)  # the long shapes once
        out, th = {}, []
        for k in range(a.streams):
            ids = [g.randrange(5, a.vocab) for _ in range(32)]
            th.append(threading.Thread(target=stream_times, args=(a.port, ids, a.max_tokens, out, k)))
            th[-1].start()
        time.sleep(a.delay)
        stream_times(a.port, [g.randrange(5, a.vocab) for _ in range(a.long_tokens)], 1, out, "long")
        for x in th:
            x.join()
    finally:
        stop(proc)
    t_long, long_times = out["long"]
    gaps = [b - x for k in range(a.streams) for x, b in zip(out[k][1], out[k][1][1:])]
    t_end = max(out[k][1][-1] for k in range(a.streams))
    t_go = min(out[k][0] for k in range(a.streams))
    rec = {"max_num_batched_tokens": parts or "default", "streams": a.streams, "long_tokens": a.long_tokens,
           "long_first_token_s": round(long_times[0] - t_long, 4) if long_times else None,
           "gap_max_s": round(max(gaps), 4), "gap_mean_s": round(statistics.mean(gaps), 4),
           "gaps_over_0.1s": sum(1 for x in gaps if x > 0.1),
           "stream_tokens_per_s": round(sum(len(out[k][1]) for k in range(a.streams)) / (t_end - t_go), 1)}
    print(json.dumps(rec), flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--glmtrain", default="build/gpu/glmtrain")
    ap.add_argument("--model", required=True)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max_tokens", type=int, default=300)
    ap.add_argument("--long_tokens", type=int, default=16000)
    ap.add_argument("--delay", type=float, default=1.0)
    ap.add_argument("--parts", default="0,2048", help="comma list of --max_num_batched_tokens (0: the server's default)")
    ap.add_argument("--vocab", type=int, default=130000)
    ap.add_argument("--server_args", default="")
    ap.add_argument("--port", type=int, default=18124)
    ap.add_argument("--log", default="/tmp/serve_parts_bench.log")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    recs = [run(a, int(p)) for p in a.parts.split(",")]
    if a.out:
        append_records(a.out, recs)


if __name__ == "__main__":
    main()
