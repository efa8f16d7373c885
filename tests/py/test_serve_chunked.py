#!/usr/bin/env python3
"""`glmtrain serve`'s prompts prefilled in parts (docs/SERVE.md, --max_num_batched_tokens): a
ChatGLM2/3 or GLM-4 prompt longer than the work buffers runs through its slot a part a step,
between the other requests' decode steps. On a tiny random ChatGLM2-family model with work buffers
of 16 tokens, over token-id prompts, against the PyTorch reference (glm2_ref.forward, fp32) and a
server whose buffers hold the whole prompt:

  * a 50-token prompt (parts of 16, 16, 16, then 2 with the first token): the greedy answer and
    its log-probabilities are the reference's (1e-4) and bit for bit the whole prefill's; the log
    names the parts;
  * echo with logprobs 2: every prompt entry, alternatives too, bit for bit the whole prefill's;
  * n = 2 of such a prompt (each prefills its own) and 2 pipeline stages: the same answer;
  * a prompt extending a kept one (prefix caching): the rest in parts, the reference's answer;
  * a stream running while a long prompt prefills keeps getting tokens between the parts
    (--step_delay_ms 40: at least 2 of its tokens arrive after the long one was sent and before
    its first token), and its answer is bit for bit the one it gives alone;
  * refusals: below --max_batch_size, negative, and below --max_model_len on ChatGLM-6B (whose
    prompts see themselves whole), each naming the flag.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402
from test_serve_prefix import close_all, complete, ref_greedy  # noqa: E402

T = Checks()
SMALL = ["--max_batch_size", "4", "--max_num_batched_tokens", "16", "--max_model_len", "256"]


def timed_stream(S, ids, n_tok, out, key):
    import http.client
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", S.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": ids, "max_tokens": n_tok, "temperature": 0,
                                                          "ignore_eos": True, "stream": True}).encode(),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    got, buf = [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {"):
                j = json.loads(ev[6:])
                for ch in j.get("choices") or []:
                    if ch.get("text"):
                        got.append((time.time(), ch["text"]))
    c.close()
    out[key] = (t0, got, "".join(t for _, t in got))


def cases(S, W, cfg, params, vocab):
    rng = random.Random(31)
    P = [rng.randrange(10, vocab) for _ in range(50)]
    before = len(S.log)
    st, b, c, lp = complete(S, P, 5)
    st0, b0, _, lp0 = complete(W, P, 5)
    ref = ref_greedy(cfg, params, P, 5)[1]
    parts = [x for x in S.log[before:] if "of a prompt's 50 tokens prefilled (16 a step)" in x]
    T.check("chunked_prompt_equals_reference", st == 200 and close_all(lp, ref), "%s %s vs %s" % (st, lp, ref))
    T.check("chunked_prompt_bit_identical_to_whole", st0 == 200 and lp == lp0 and
            b["choices"][0]["text"] == b0["choices"][0]["text"], "%s vs %s" % (lp, lp0))
    T.check("chunked_prompt_logged_in_parts", len(parts) == 3, "".join(S.log[before:])[-600:])

    body = {"prompt": P, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0}
    st1, e1 = sc.http(S.port, "POST", "/v1/completions", body)
    st2, e2 = sc.http(W.port, "POST", "/v1/completions", body)
    l1, l2 = ((x.get("choices") or [{}])[0].get("logprobs") if s == 200 else None for s, x in ((st1, e1), (st2, e2)))
    T.check("chunked_echo_prompt_logprobs_bit_identical", st1 == st2 == 200 and l1 is not None and l1 == l2 and
            len(l1["token_logprobs"]) == 51 and l1["token_logprobs"][0] is None, "%s %s" % (st1, str(e1)[:300]))

    stn, bn = sc.http(S.port, "POST", "/v1/completions", {"prompt": P, "max_tokens": 5, "temperature": 0, "logprobs": 1,
                                                          "ignore_eos": True, "n": 2})
    T.check("chunked_n_choices_each_as_alone", stn == 200 and all(ch["logprobs"]["token_logprobs"] == lp
                                                                  for ch in bn["choices"]), "%s %s" % (stn, str(bn)[:300]))

    Q = P + [rng.randrange(10, vocab) for _ in range(30)]  # P kept (by the n = 2 answer): 30 more in parts
    before = len(S.log)
    stq, _, cq, lq = complete(S, Q, 3)
    T.check("chunked_rest_after_prefix_cache", stq == 200 and cq is not None and cq >= 50 and
            close_all(lq, ref_greedy(cfg, params, Q, 3)[1]) and any("prefilled (16 a step)" in x for x in S.log[before:]),
            "%s cached %s %s" % (stq, cq, lq))

    # a stream decoding while a 60-token prompt prefills in 4 steps
    A = [rng.randrange(10, vocab) for _ in range(6)]
    B = [rng.randrange(10, vocab) for _ in range(60)]
    out = {}
    ta = threading.Thread(target=timed_stream, args=(S, A, 40, out, "a"))
    ta.start()
    time.sleep(0.4)
    tb = threading.Thread(target=timed_stream, args=(S, B, 3, out, "b"))
    tb.start()
    ta.join()
    tb.join()
    alone = {}
    timed_stream(W, A, 40, alone, "a")
    tb0, gb, text_b = out["b"]
    b_first = gb[0][0] if gb else None
    between = sum(1 for t, _ in out["a"][1] if b_first and tb0 < t < b_first)
    T.check("stream_goes_on_between_parts", b_first is not None and between >= 2,
            "%d of the stream's tokens between the long prompt's send and its first token" % between)
    T.check("stream_beside_parts_bit_identical_to_alone", out["a"][2] == alone["a"][2] and len(out["a"][1]) > 0,
            "%r vs %r" % (out["a"][2], alone["a"][2]))
    stb, bb, _, _ = complete(W, B, 3)
    T.check("long_prompt_beside_stream_equals_whole", stb == 200 and len(gb) > 0 and text_b == bb["choices"][0]["text"],
            "%r vs %r" % (text_b, bb))


def refusals(model, v1_model):
    for name, m, flags, want in (("below_max_batch_size", model, ["--max_batch_size", "8", "--max_num_batched_tokens", "4"],
                                  "below --max_batch_size"),
                                 ("negative", model, ["--max_num_batched_tokens", "-1"], "--max_num_batched_tokens"),
                                 ("glm1_below_max_model_len", v1_model, ["--max_num_batched_tokens", "64",
                                                                         "--max_model_len", "128"], "sees itself whole")):
        p = subprocess.run([sc.GLM, "serve", "--model_name_or_path", m, "--port", "0", "--device", "cpu"] + flags,
                           capture_output=True, text=True, timeout=60, env=sc.ENV)
        T.check("refuses_" + name, p.returncode != 0 and want in p.stderr and "--max_num_batched_tokens" in p.stderr,
                p.stderr[-400:])


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_chunked: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-chunked-")
    try:
        model, cfg, params = make_glm2(tmp)
        vocab = cfg["padded_vocab_size"]
        S = sc.Server(model, "--debug", "--step_delay_ms", "40", *SMALL)
        W = sc.Server(model, "--max_batch_size", "4", "--max_model_len", "256")
        try:
            cases(S, W, cfg, params, vocab)
        finally:
            S.stop()
            W.stop()
        S = sc.Server(model, "--device_map", "auto", "--pipeline_parallel_size", "2", *SMALL)
        try:
            rng = random.Random(32)
            P = [rng.randrange(10, vocab) for _ in range(50)]
            st, _, _, lp = complete(S, P, 5)
            T.check("chunked_device_map_2_stages", st == 200 and close_all(lp, ref_greedy(cfg, params, P, 5)[1]), str(lp))
        finally:
            S.stop()
        os.makedirs(os.path.join(tmp, "v1"))
        v1, _, _ = sc.make_model(os.path.join(tmp, "v1"))
        refusals(model, v1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
