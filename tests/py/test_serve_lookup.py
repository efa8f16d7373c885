#!/usr/bin/env python3
"""`glmtrain serve --prompt_lookup_num_tokens` (serve/draft.c): each decoding stream feeds a draft
copied from where its prompt and answer repeat their last tokens, all streams in one forward, and
keeps its choices while they equal the draft. On tiny random models (CPU), every answer is bit for
bit a server's without drafts (--prompt_lookup_num_tokens 0), with the streams decoding side by
side in 4 slots:

  * greedy answers with logprobs 2 (tokens, log-probabilities, top entries) to 4 prompts that
    repeat themselves, in one request and as 4 concurrent ones; and the drafts did work
    (/metrics spec_decode_num_accepted_tokens_total > 0, at most the draft tokens);
  * sampled answers with a seed, n = 2; frequency/presence penalties and logit_bias; min_tokens;
  * max_tokens that ends inside a draft (1, 2, 7, 13); a stop string inside the answer;
  * a streamed answer (the chunks' text); a chat completion (the model's template);
  * the next turn of a conversation with prefix caching (the same cached_tokens);
  * a model split over 2 pipeline stages; ChatGLM-6B (GLM v1);
  * --prompt_lookup_num_tokens 64 refused at the start, naming the flag.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()


def post(S, body, path="/v1/completions"):
    return sc.http(S.port, "POST", path, body, timeout=120)


def scrape(S, name):
    st, text = sc.http(S.port, "GET", "/metrics")
    m = re.search(r"^glmtrain:%s\{[^}]*\} (\S+)$" % name, text if st == 200 else "", re.M)
    return float(m.group(1)) if m else None


def strip(body):
    """What must match: the choices and usage, not ids or times."""
    if not isinstance(body, dict):
        return body
    return {"choices": body.get("choices"), "usage": body.get("usage")}


def repeating(rng, vocab):
    a = [rng.randrange(10, vocab) for _ in range(6)]
    b = [rng.randrange(10, vocab) for _ in range(5)]
    return a + b + a + b + a[:3]


def same(name, S, S0, body, path="/v1/completions"):
    st, b = post(S, body, path)
    st0, b0 = post(S0, body, path)
    ok = st == st0 == 200 and strip(b) == strip(b0)
    T.check(name, ok, "%s %s: %s vs %s" % (st, st0, json.dumps(strip(b))[:300], json.dumps(strip(b0))[:300]))
    return b if ok else None


def concurrent(S, bodies):
    out = [None] * len(bodies)

    def one(i):
        out[i] = strip(post(S, bodies[i])[1])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def cases(S, S0, vocab, tag, texts=False):
    rng = random.Random(21)
    P = [repeating(rng, vocab) for _ in range(4)]
    if texts:  # GLM v1's prompts end in [gMASK] <sop>: text the server encodes
        P = ["春风又绿江南岸明月何时照我还春风又绿", "白日依山尽黄河入海流白日依山尽", "床前明月光疑是地上霜床前明月光",
             "你好你好你好你好"]
    d0, a0 = scrape(S, "spec_decode_num_draft_tokens_total"), scrape(S, "spec_decode_num_accepted_tokens_total")
    same("lookup_%s_greedy_logprobs" % tag, S, S0, {"prompt": P, "max_tokens": 40, "temperature": 0, "logprobs": 2,
                                                    "ignore_eos": True})
    d1, a1 = scrape(S, "spec_decode_num_draft_tokens_total"), scrape(S, "spec_decode_num_accepted_tokens_total")
    T.check("lookup_%s_drafts_taken" % tag, d1 is not None and a1 - a0 > 0 and a1 - a0 <= d1 - d0,
            "drafted %s -> %s, taken %s -> %s" % (d0, d1, a0, a1))
    bodies = [{"prompt": p, "max_tokens": 30, "temperature": 0, "ignore_eos": True} for p in P]
    T.check("lookup_%s_concurrent_greedy" % tag, concurrent(S, bodies) == concurrent(S0, bodies), "answers differ")
    if tag != "glm2":
        return
    same("lookup_sampled_seed_n2", S, S0, {"prompt": P[:2], "max_tokens": 30, "temperature": 0.8, "top_p": 0.9,
                                           "seed": 5, "n": 2, "logprobs": 1, "ignore_eos": True})
    same("lookup_penalties_and_bias", S, S0, {"prompt": P[:3], "max_tokens": 30, "temperature": 0, "ignore_eos": True,
                                              "frequency_penalty": 0.5, "presence_penalty": 0.3,
                                              "logit_bias": {str(P[0][6]): 3.0, str(P[1][2]): -2.0}})
    same("lookup_min_tokens", S, S0, {"prompt": P[:2], "max_tokens": 20, "temperature": 0, "min_tokens": 10})
    for n in (1, 2, 7, 13):
        same("lookup_max_tokens_%d" % n, S, S0, {"prompt": P, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    st0, b0 = post(S0, {"prompt": P[0], "max_tokens": 40, "temperature": 0, "ignore_eos": True})
    text = b0["choices"][0]["text"] if st0 == 200 else ""
    stop = text[len(text) // 2:len(text) // 2 + 2] if len(text) > 6 else "x"
    b = same("lookup_stop_string", S, S0, {"prompt": P[0], "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                                           "stop": [stop]})
    T.check("lookup_stop_string_stopped", b is not None and b["choices"][0]["finish_reason"] == "stop", str(b)[:200])
    streams = []
    for srv in (S, S0):
        st, raw = sc.http(srv.port, "POST", "/v1/completions", {"prompt": P[1], "max_tokens": 30, "temperature": 0,
                                                                "stream": True, "ignore_eos": True}, timeout=120)
        ev = [json.loads(x[6:]) for x in (raw if isinstance(raw, str) else "").split("\n\n") if x.startswith("data: {")]
        streams.append("".join(e["choices"][0]["text"] for e in ev if e.get("choices")))
    T.check("lookup_streamed_text", streams[0] == streams[1] and streams[0] != "", "%r vs %r" % tuple(streams))
    same("lookup_chat_completion", S, S0, {"messages": [{"role": "user", "content": "春风春风春风又绿江南岸春风"}],
                                           "max_tokens": 30, "temperature": 0}, path="/v1/chat/completions")
    turn = P[2] + [7, 8, 9]
    post(S, {"prompt": P[2], "max_tokens": 1, "temperature": 0})
    post(S0, {"prompt": P[2], "max_tokens": 1, "temperature": 0})
    b = same("lookup_next_turn_with_prefix_cache", S, S0, {"prompt": turn, "max_tokens": 25, "temperature": 0,
                                                           "ignore_eos": True})
    T.check("lookup_next_turn_cached", b is not None and b["usage"].get("prompt_tokens_details", {}).get(
        "cached_tokens", 0) >= len(P[2]) - 1, str(b and b["usage"]))


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_lookup: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-lookup-")
    servers = []
    try:
        model, cfg, _ = make_glm2(tmp)
        vocab = cfg["padded_vocab_size"] if "padded_vocab_size" in cfg else cfg["vocab_size"]
        vocab = min(vocab, 2000)
        S = sc.Server(model, "--max_batch_size", "4", "--prompt_lookup_num_tokens", "10")
        S0 = sc.Server(model, "--max_batch_size", "4")
        servers += [S, S0]
        T.check("lookup_start_line", any("drafts of up to 10 tokens" in ln for ln in S.log), "".join(S.log)[-300:])
        cases(S, S0, vocab, "glm2")
        S.stop()
        S0.stop()
        split = ["--max_batch_size", "4", "--device_map", "auto", "--pipeline_parallel_size", "2"]
        P2 = sc.Server(model, *split, "--prompt_lookup_num_tokens", "10")
        P0 = sc.Server(model, *split)
        servers += [P2, P0]
        cases(P2, P0, vocab, "2_stages")
        P2.stop()
        P0.stop()
        os.makedirs(os.path.join(tmp, "v1"))
        v1, v1cfg, _ = sc.make_model(os.path.join(tmp, "v1"))
        V1 = sc.Server(v1, "--max_batch_size", "4", "--prompt_lookup_num_tokens", "8")
        V0 = sc.Server(v1, "--max_batch_size", "4")
        servers += [V1, V0]
        cases(V1, V0, v1cfg["vocab_size"], "glm1", texts=True)
        p = subprocess.run([sc.GLM, "serve", "--model_name_or_path", model, "--device", "cpu", "--port", "0",
                            "--prompt_lookup_num_tokens", "64"], capture_output=True, text=True, timeout=60, env=sc.ENV)
        T.check("lookup_serve_refuses_64", p.returncode != 0 and "--prompt_lookup_num_tokens must be in [0, 63]" in p.stderr,
                p.stderr[-300:])
    finally:
        for s in servers:
            try:
                s.stop()
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
