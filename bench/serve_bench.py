#!/usr/bin/env python3
"""Decode throughput of `glmtrain serve` at several numbers of concurrent streams (issue 21's
H200 figures: ChatGLM-6B at 1, 8, 32 and 64 streams), over raw HTTP (no client library needed on
the GPU machine).

For each concurrency N it starts N streaming chat completions at once (greedy, ignore_eos so
every stream decodes exactly --max_tokens tokens, usage from stream_options.include_usage) and
prints one line and one JSON record:
  tokens/s total   = all completion tokens / (last stream's end - first request's start)
  tokens/s/stream  = mean over streams of (tokens - 1) / (end - first token)  (decode rate)
  TTFT             = time from a stream's request to its first content chunk (mean, p50, max)
With --model it first starts the server itself and reports `start_to_first_token`: seconds from
launching the process to the first streamed token of one request (the issue's <= 5 s with the
folder in the page cache); --url uses a server that is already running.

  python3 bench/serve_bench.py --glmtrain build/gpu/glmtrain --model /data/chatglm-6b \\
      --streams 1,8,32,64 --max_tokens 256 --server_args "--max_batch_size 64 --max_model_len 1024"
"""
import argparse
import http.client
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPTS = ["写一首关于春天的诗", "你好，请介绍一下你自己", "用三句话解释什么是机器学习", "给我讲一个关于月亮的故事",
           "How do I fine-tune a language model on my own data?", "列出五种常见的水果并说明它们的营养价值",
           "What is the capital of France, and why is it famous?", "如何提高写作水平？"]


EXTRA = {}  # --extra: more fields of every request (a decoding constraint drops ignore_eos)


def stream_once(host, port, key, model, prompt, max_tokens, t_go):
    """One streaming chat completion; returns dict(start, first, end, tokens, error)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    body.update(EXTRA)
    if any(k in EXTRA for k in ("response_format", "guided_json", "guided_choice")):
        del body["ignore_eos"]
    body = json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    while time.time() < t_go:
        time.sleep(0.0005)
    res = {"start": time.time(), "first": None, "end": None, "tokens": 0, "error": None}
    try:
        c = http.client.HTTPConnection(host, port, timeout=600)
        c.request("POST", "/v1/chat/completions", body=body, headers=h)
        r = c.getresponse()
        if r.status != 200:
            res["error"] = "HTTP %d %s" % (r.status, r.read()[:200])
            return res
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: "):
                    continue
                data = ev[6:]
                if data == b"[DONE]":
                    res["end"] = time.time()
                    c.close()
                    if res["first"] is None:
                        res["error"] = "%d tokens but no text streamed (tokens that decode to nothing?)" % res["tokens"]
                    return res
                j = json.loads(data)
                if j.get("error"):
                    res["error"] = j["error"].get("message")
                    return res
                if j.get("usage"):
                    res["tokens"] = j["usage"]["completion_tokens"]
                ch = j.get("choices") or []
                if ch and ch[0].get("delta", {}).get("content") and res["first"] is None:
                    res["first"] = time.time()
        res["end"] = time.time()
    except Exception as e:  # noqa: BLE001
        res["error"] = repr(e)
    return res


def get(host, port, path, key=None):
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", path, headers={"Authorization": "Bearer " + key} if key else {})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"{}")


def run_level(host, port, key, model, n, max_tokens):
    res = [None] * n
    t_go = time.time() + 0.2

    def one(i):
        res[i] = stream_once(host, port, key, model, PROMPTS[i % len(PROMPTS)], max_tokens, t_go)
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    errors = [r["error"] for r in res if r["error"]]
    ok = [r for r in res if not r["error"] and r["first"] and r["end"]]
    if not ok:
        return {"streams": n, "errors": errors}
    t0, t1 = min(r["start"] for r in ok), max(r["end"] for r in ok)
    tokens = sum(r["tokens"] for r in ok)
    per = [(r["tokens"] - 1) / (r["end"] - r["first"]) for r in ok if r["tokens"] > 1 and r["end"] > r["first"]]
    ttft = sorted(r["first"] - r["start"] for r in ok)
    return {"streams": n, "ok": len(ok), "errors": errors[:3], "tokens": tokens, "seconds": t1 - t0,
            "tokens_per_s_total": tokens / (t1 - t0), "tokens_per_s_per_stream": statistics.mean(per) if per else 0,
            "ttft_mean_s": statistics.mean(ttft), "ttft_p50_s": ttft[len(ttft) // 2], "ttft_max_s": ttft[-1],
            "ms_per_token_per_stream": 1000 / statistics.mean(per) if per else 0}


def stop(proc):
    """Ends a server started here: SIGTERM (it drains), then a kill after a minute."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def post_json(port, path, body):
    """A POST of JSON to the server on 127.0.0.1:port; the parsed answer (an exception unless 200)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, out))
    return out


def stream_events(port, path, body):
    """A streamed request to the server on 127.0.0.1:port: yields (arrival time, event) for each
    `data: {...}` event, parsed (an exception unless 200)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    buf = b""
    try:
        while True:
            chunk = r.read1(65536)
            if not chunk:
                return
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: {"):
                    yield time.time(), json.loads(ev[6:])
    finally:
        c.close()


def append_records(path, records):
    """The JSON records, one a line, appended to path (nothing without one)."""
    if path:
        with open(path, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


def wait_up(proc, host, port):
    """Waits until the server answers /health (exits when it died first)."""
    while True:
        if proc.poll() is not None:
            sys.exit("serve exited with %s" % proc.returncode)
        try:
            if get(host, port, "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (http://127.0.0.1:8000)")
    ap.add_argument("--glmtrain", default="build/glmtrain", help="the binary, to start a server with --model")
    ap.add_argument("--model", help="model folder: start `glmtrain serve` on it")
    ap.add_argument("--server_args", default="", help="more serve flags (--max_batch_size 64 --max_model_len 1024 ...)")
    ap.add_argument("--api_key", default=os.environ.get("GLMTRAIN_API_KEY"))
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--max_tokens", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs at the highest concurrency first")
    ap.add_argument("--out", help="append the JSON records to this file")
    ap.add_argument("--extra", default="", help="JSON object merged into every request's body (response_format, "
                    "guided_json ...); with a decoding constraint the answers may end before --max_tokens")
    a = ap.parse_args()
    if a.extra:
        EXTRA.update(json.loads(a.extra))
    proc, records = None, []
    try:
        if a.model:
            port = 18000 + os.getpid() % 1000
            t_launch = time.time()
            cmd = [a.glmtrain, "serve", "--model_name_or_path", a.model, "--port", str(port)] + shlex.split(a.server_args)
            print("starting:", " ".join(cmd), flush=True)
            proc = subprocess.Popen(cmd, stderr=sys.stderr)
            host = "127.0.0.1"
            wait_up(proc, host, port)
            t_up = time.time()
            st, models = get(host, port, "/v1/models", a.api_key)
            model = models["data"][0]["id"]
            r = stream_once(host, port, a.api_key, model, PROMPTS[0], 8, 0)
            rec = {"what": "start_to_first_token", "listening_s": t_up - t_launch,
                   "first_token_s": (r["first"] or time.time()) - t_launch, "error": r["error"]}
            print("start: listening after %.2f s, first token %.2f s after launch" % (rec["listening_s"], rec["first_token_s"]))
            records.append(rec)
        else:
            u = urllib.parse.urlparse(a.url or "http://127.0.0.1:8000")
            host, port = u.hostname, u.port or 80
            model = get(host, port, "/v1/models", a.api_key)[1]["data"][0]["id"]
        levels = [int(x) for x in a.streams.split(",")]
        for _ in range(a.warmup):
            run_level(host, port, a.api_key, model, max(levels), min(a.max_tokens, 32))
        print("%8s %12s %16s %10s %10s %10s %8s" % ("streams", "tok/s total", "tok/s per stream", "ms/token", "TTFT mean",
                                                   "TTFT max", "errors"))
        for n in levels:
            h0 = get(host, port, "/health")[1]
            r = run_level(host, port, a.api_key, model, n, a.max_tokens)
            h1 = get(host, port, "/health")[1]
            steps = h1.get("steps", 0) - h0.get("steps", 0)
            r.update({"what": "streams", "max_tokens": a.max_tokens, "engine_steps": steps,
                      "peak_running": h1.get("peak_running"),
                      "step_ms": 1e3 * (h1.get("step_seconds", 0) - h0.get("step_seconds", 0)) / max(steps, 1),
                      "forward_ms": 1e3 * (h1.get("forward_seconds", 0) - h0.get("forward_seconds", 0)) / max(steps, 1),
                      "text_ms": 1e3 * (h1.get("text_seconds", 0) - h0.get("text_seconds", 0)) / max(steps, 1)})
            records.append(r)
            if "tokens" not in r:
                print("%8d  all failed: %s" % (n, r["errors"][:2]))
                continue
            print("%8d %12.1f %16.1f %10.2f %9.3fs %9.3fs %8d" % (n, r["tokens_per_s_total"], r["tokens_per_s_per_stream"],
                                                               r["ms_per_token_per_stream"], r["ttft_mean_s"],
                                                               r["ttft_max_s"], len(r["errors"])), flush=True)
            print("         engine: %d steps, %.2f ms a step, %.2f ms of it in the forward, %.2f in text" % (
                r["engine_steps"], r["step_ms"], r["forward_ms"], r["text_ms"]), flush=True)
        one = next((r for r in records if r.get("streams") == 1 and "tokens" in r), None)
        for r in records:
            if one and r.get("streams", 1) > 1 and "tokens" in r:
                print("  %d streams: %.1fx the single-stream rate" % (r["streams"], r["tokens_per_s_total"] / one["tokens_per_s_total"]))
    finally:
        stop(proc)
        append_records(a.out, records)
        for r in records:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
