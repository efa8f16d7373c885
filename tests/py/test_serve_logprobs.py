#!/usr/bin/env python3
"""`glmtrain serve`'s logprobs, through the `openai` client, on a tiny random ChatGLM-6B model
(serve_common.make_model) against the PyTorch reference (glm_ref.forward, fp32):

  * completions with logprobs k: each token's logprob is log_softmax of the reference's logits
    at its place (1e-4), top_logprobs the k largest there, the token the first of them (greedy),
    text_offset the characters before each token;
  * chat with logprobs and top_logprobs: the same numbers for the chat prompt, one entry per
    completion token, each entry's bytes its token's text, the top alternatives in order;
    streamed, the chunks' entries together are the whole response's;
  * sampling (temperature 1): the raw model's log-probabilities of the sampled tokens;
  * bad values (top_logprobs without logprobs, above 20; completions' logprobs above 5) are 400s.
Prints PASS/FAIL/SKIP lines."""
import json
import math
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()


prompt_ids = sc.prompt_ids  # waits for the logged line (serve_common)


def ref_steps(cfg, params, prompt, n):
    """Greedy decoding by the reference: per step the log-softmax row and the picked id."""
    import torch
    import glm_ref
    ids, rows = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = glm_ref.forward(cfg, params, torch.tensor([ids]))["logits"][0, -1].double()
        lp = torch.log_softmax(logits, -1)
        nxt = int(torch.argmax(logits))
        rows.append((lp, nxt))
        if nxt == cfg["eos_token_id"]:
            break
        ids.append(nxt)
    return rows


def close(a, b, tol=1e-4):
    return abs(a - b) <= tol * max(1.0, abs(b))


def check_completion(cfg, params, S, c):
    n0 = len(S.log)
    r = c.completions.create(model="model", prompt="你好", max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    rows = ref_steps(cfg, params, prompt_ids(S, n0), r.usage.completion_tokens + 1)
    n = r.usage.completion_tokens
    ok = lp is not None and len(lp.tokens) == n == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    detail = r.model_dump_json()[:600]
    for i in range(n if ok else 0):
        ref_lp, nxt = rows[i]
        top = torch_topk(ref_lp, 3)
        got_top = sorted(lp.top_logprobs[i].values(), reverse=True)
        if not (close(lp.token_logprobs[i], float(ref_lp[nxt])) and len(got_top) == 3 and
                all(close(a, b) for a, b in zip(got_top, top)) and
                max(lp.top_logprobs[i], key=lp.top_logprobs[i].get) == lp.tokens[i]):
            ok, detail = False, "token %d: %s vs reference %.6f, top %s vs %s" % (i, lp.token_logprobs[i], float(ref_lp[nxt]),
                                                                                  got_top, top)
            break
    def chars(t):  # a token's characters: "bytes:\\xNN..." is a piece of one
        b = bytes(int(h, 16) for h in t[6:].split("\\x")[1:]) if t.startswith("bytes:") else t.encode()
        return sum((x & 0xC0) != 0x80 for x in b)
    offsets = [sum(chars(t) for t in lp.tokens[:i]) for i in range(n)] if lp else None
    T.check("completions_logprobs_equal_reference", ok, detail)
    T.check("completions_text_offset_counts_characters", lp is not None and lp.text_offset == offsets,
            "%s vs %s" % (lp and lp.text_offset, offsets))


def torch_topk(row, k):
    import torch
    return [float(x) for x in torch.topk(row, k).values]


def check_chat(cfg, params, S, c):
    q = [{"role": "user", "content": "你好"}]
    n0 = len(S.log)
    r = c.chat.completions.create(model="model", messages=q, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    n = r.usage.completion_tokens
    rows = ref_steps(cfg, params, prompt_ids(S, n0), n + 1)
    ok = content is not None and len(content) == n
    detail = r.model_dump_json()[:600]
    for i in range(n if ok else 0):
        e, (ref_lp, nxt) = content[i], rows[i]
        top = torch_topk(ref_lp, 2)
        text_ok = e.token == bytes(e.bytes).decode("utf-8") if not e.token.startswith("bytes:") else True
        if not (close(e.logprob, float(ref_lp[nxt])) and len(e.top_logprobs) == 2 and text_ok and
                all(close(a.logprob, b) for a, b in zip(e.top_logprobs, top)) and e.top_logprobs[0].token == e.token):
            ok, detail = False, "token %d: %s vs reference %.6f top %s" % (i, e, float(ref_lp[nxt]), top)
            break
    T.check("chat_logprobs_equal_reference", ok, detail)
    parts = []
    for ck in c.chat.completions.create(model="model", messages=q, max_tokens=8, temperature=0, logprobs=True,
                                        top_logprobs=2, stream=True):
        if ck.choices and ck.choices[0].logprobs and ck.choices[0].logprobs.content:
            parts += ck.choices[0].logprobs.content
    same = content is not None and [(e.token, e.logprob) for e in parts] == [(e.token, e.logprob) for e in content]
    T.check("chat_streamed_logprobs_are_the_whole_responses", same,
            "%s vs %s" % ([(e.token, e.logprob) for e in parts], content and [(e.token, e.logprob) for e in content]))
    # sampling: the raw model's log-probabilities of what was sampled (finite, <= 0, and the
    # token's entry among the alternatives when it is one of the 20 most likely)
    r = c.chat.completions.create(model="model", messages=q, max_tokens=8, temperature=1.0, seed=3, logprobs=True,
                                  top_logprobs=20)
    content = r.choices[0].logprobs.content
    bad = [e for e in content if not (
        math.isfinite(e.logprob) and e.logprob <= 1e-6 and len(e.top_logprobs) == 20 and
        all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])))]
    T.check("sampled_tokens_have_raw_logprobs", len(content) == r.usage.completion_tokens and not bad,
            "%d entries for %d tokens; %s" % (len(content), r.usage.completion_tokens, bad[:1]))


def check_errors(S):
    q = [{"role": "user", "content": "你好"}]
    st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "top_logprobs": 2})
    T.check("top_logprobs_without_logprobs_refused", st == 400 and body["error"]["param"] == "top_logprobs", body)
    st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "logprobs": True,
                                                                "top_logprobs": 21})
    T.check("top_logprobs_above_20_refused", st == 400 and body["error"]["param"] == "top_logprobs", body)
    st, body = sc.http(S.port, "POST", "/v1/completions", {"model": "model", "prompt": "x", "logprobs": 6})
    T.check("completions_logprobs_above_5_refused", st == 400 and body["error"]["param"] == "logprobs", body)
    st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "max_tokens": 2})
    T.check("no_logprobs_is_null", st == 200 and body["choices"][0]["logprobs"] is None, body)


def main():
    if not os.path.exists(sc.GLM):
        T.skip("serve_logprobs", "%s not built" % sc.GLM)
        return
    try:
        import openai  # noqa: F401
    except ImportError:
        T.skip("serve_logprobs", "the openai Python client is not installed (scripts/install-deps.sh)")
        return
    if not shutil.which("spm_train"):
        T.skip("serve_logprobs", "spm_train (Debian sentencepiece) not installed")
        return
    tmp = tempfile.mkdtemp(prefix="glm-serve-lp-")
    S = None
    try:
        model, cfg, params = sc.make_model(tmp)
        S = sc.Server(model, "--debug", "--served_model_name", "model")
        c = S.client()
        check_completion(cfg, params, S, c)
        check_chat(cfg, params, S, c)
        check_errors(S)
        rc = S.stop()
        T.check("clean_exit", rc == 0, S.text()[-300:])
        # the model split over 2 stages (the last stage's logits): the whole model's numbers
        q = [{"role": "user", "content": "你好"}]
        S = sc.Server(model, "--served_model_name", "model")
        r1 = S.client().chat.completions.create(model="model", messages=q, max_tokens=6, temperature=0, logprobs=True,
                                                top_logprobs=3)
        S.stop()
        S = sc.Server(model, "--served_model_name", "model", "--device_map", "auto", "--pipeline_parallel_size", "2")
        r2 = S.client().chat.completions.create(model="model", messages=q, max_tokens=6, temperature=0, logprobs=True,
                                                top_logprobs=3)
        a = [(e.token, e.logprob, [(x.token, x.logprob) for x in e.top_logprobs]) for e in r1.choices[0].logprobs.content]
        b = [(e.token, e.logprob, [(x.token, x.logprob) for x in e.top_logprobs]) for e in r2.choices[0].logprobs.content]
        T.check("device_map_logprobs_equal_whole", a == b and len(a) > 0 and "split over 2 stages" in S.text(), "%s vs %s" % (a, b))
        rc = S.stop()
    finally:
        if S and S.p.poll() is None:
            S.stop(9)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(T.status())
