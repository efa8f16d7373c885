#!/usr/bin/env python3
"""`glmtrain serve`'s prompt log-probabilities and the tokenizer endpoints, which
lm-evaluation-harness's `local-completions` model needs for its log-likelihood tasks, on a tiny
random ChatGLM2-family model (a causal LM) against the PyTorch reference (glm2_ref.forward, fp32):

  * /v1/completions with `echo` and `logprobs` over token ids: every prompt token's logprob is
    log_softmax of the reference's logits one row before it (1e-4), the first token's null, the
    alternatives the reference's best, and the one generated token the reference's greedy pick;
  * lm-eval's request and parsing (its LocalCompletionsAPI: a list of context + continuation id
    lists, max_tokens 1, logprobs 1, echo; sum(token_logprobs[ctxlen:-1]) and the greedy test over
    top_logprobs) give the reference's log-likelihood and greediness of each continuation;
  * `max_tokens: 0` with echo (the prompt alone), echo of a text prompt, a list of prompts (a choice
    each, each as its own request), streamed echo (the same text and entries as whole), and the same
    numbers from a model split over 2 pipeline stages;
  * `n` choices (completions, a list of prompts, chat): choice j samples with seed + j, the n
    choices of a prompt prefilled once (greedy and echo's entries too; 2 pipeline stages); streamed,
    each choice's chunks (text, log-probabilities, finish) put together equal the whole answer's,
    with the official openai client too; a client that leaves a streamed group cancels all of it;
  * GET /metrics, parsed by prometheus_client: counters and histograms move by exactly what two
    requests used; the choices a leaving client cancelled are counted;
  * a slow whole answer carries a few keep-alive bytes, not a stream of them;
  * POST /tokenize (with and without special tokens; messages), /detokenize, GET /tokenizer_info;
  * refusals: echo with logprobs on ChatGLM-6B (a prefix LM), max_tokens 0 without echo, bad ids,
    ChatGLM-6B ids without [gMASK]/<sop>, too many prompts, too long.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()
TOL = 1e-4


def close(a, b, tol=TOL):
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


def make_glm2(d):
    """A 2-layer ChatGLM2-family model (random, one training step) with a ChatGLM-6B-style
    tokenizer: (folder, reference config, fp32 params)."""
    import test_train as TT
    import glm2_ref
    from test_glm2_cli import write_glm2_config
    from mpi_runs import run
    from safetensors.torch import load_file
    tok = TT.make_tokenizer(d)
    ids, vocab = TT.piece_ids(tok)
    cfg = write_glm2_config(d, ids, vocab)
    train_file, _ = TT.write_data(d)
    out = os.path.join(d, "glm2")
    run(["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--max_steps", "1", "--seed", "3",
         "--disable_tqdm", "--report_to", "none", "--output_dir", out, "--per_device_train_batch_size", "4",
         "--max_source_length", "32", "--max_target_length", "16"], timeout=300)
    st = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            st.update(load_file(os.path.join(out, f)))
    rcfg = glm2_ref.load_config(json.load(open(os.path.join(out, "config.json"))))
    return out, rcfg, {k: v.float() for k, v in st.items() if "inv_freq" not in k}


def ref_rows(cfg, params, ids):
    """log_softmax of the reference's logits at every position of ids (double)."""
    import torch
    import glm2_ref
    with torch.no_grad():
        logits = glm2_ref.forward(cfg, params, torch.tensor([ids]))["logits"][0].double()
    return torch.log_softmax(logits, -1)


def post(S, path, body):
    return sc.http(S.port, "POST", path, body)


def echo_cases(S, cfg, params, vocab):
    import torch
    rng = random.Random(5)
    ids = [rng.randrange(10, vocab) for _ in range(11)]
    st, body = post(S, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0})
    ch = (body.get("choices") or [{}])[0] if st == 200 else {}
    lp = ch.get("logprobs") or {}
    rows = ref_rows(cfg, params, ids)
    toks, tlp, top = lp.get("token_logprobs", []), lp.get("token_logprobs", []), lp.get("top_logprobs", [])
    ok = st == 200 and len(tlp) == len(ids) + 1 and tlp[0] is None and top[0] is None
    detail = "%s %s" % (st, json.dumps(body)[:400])
    for i in range(1, len(ids)) if ok else ():
        want = float(rows[i - 1][ids[i]])
        best = torch.topk(rows[i - 1], 2).values.tolist()
        got_best = sorted(top[i].values(), reverse=True)
        if not (close(tlp[i], want) and len(got_best) == 2 and all(close(a, b) for a, b in zip(got_best, best))):
            ok, detail = False, "prompt token %d: %r vs reference %.6f, top %s vs %s" % (i, tlp[i], want, got_best, best)
            break
    greedy = int(rows[-1].argmax())
    ok_gen = ok and close(tlp[-1], float(rows[-1][greedy])) and close(max(top[-1].values()), tlp[-1])
    T.report("echo_prompt_logprobs_equal_reference", ok, detail if not ok else "%d prompt tokens" % len(ids))
    T.report("echo_generated_token_is_reference_greedy", ok_gen, "%r vs %.6f" % (tlp[-1] if tlp else None,
                                                                              float(rows[-1][greedy])))
    st2, dt = post(S, "/detokenize", {"tokens": ids})
    T.check("echo_text_is_decoded_prompt_then_response", st == 200 and st2 == 200 and
            ch.get("text", "").startswith(dt.get("prompt", "\0")) and len(ch["text"]) > len(dt["prompt"]),
            "%r vs %r" % (ch.get("text"), dt))

    # max_tokens 0: the prompt alone, the same entries
    st0, b0 = post(S, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 0})
    c0 = (b0.get("choices") or [{}])[0] if st0 == 200 else {}
    l0 = c0.get("logprobs") or {}
    T.check("echo_max_tokens_0_is_the_prompt_alone", st0 == 200 and c0.get("finish_reason") == "length" and
            c0.get("text") == dt.get("prompt") and l0.get("token_logprobs") == tlp[:len(ids)] and
            b0["usage"]["completion_tokens"] == 0 and b0["usage"]["prompt_tokens"] == len(ids),
            "%s %s" % (st0, json.dumps(b0)[:400]))

    # a text prompt: its ids as /tokenize gives them with special tokens; text = prompt + response
    text = "写一句关于春的诗"
    stt, tk = post(S, "/tokenize", {"prompt": text})
    ste, be = post(S, "/v1/completions", {"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 3, "temperature": 0})
    stn, bn = post(S, "/v1/completions", {"prompt": text, "max_tokens": 3, "temperature": 0})
    ce, cn = (be.get("choices") or [{}])[0], (bn.get("choices") or [{}])[0]
    want_lp = ref_rows(cfg, params, tk.get("tokens", [0]))
    tl = (ce.get("logprobs") or {}).get("token_logprobs", [])
    ok = (stt == ste == stn == 200 and ce.get("text") == text + cn.get("text", "\0") and
          len(tl) == tk["count"] + be["usage"]["completion_tokens"] and
          all(close(tl[i], float(want_lp[i - 1][tk["tokens"][i]])) for i in range(1, tk["count"])))
    T.check("echo_text_prompt", ok, "%s %s / %s" % (ste, json.dumps(be)[:300], json.dumps(bn)[:200]))
    return ids


def lm_eval_cases(S, cfg, params):
    """lm-evaluation-harness's local-completions log-likelihood request and parsing."""
    import torch
    pairs = [("春眠不觉晓，", "处处闻啼鸟"), ("床前明月光", "，疑是地上霜"), ("你好", "世界")]
    enc = lambda s: post(S, "/tokenize", {"prompt": s, "add_special_tokens": False})[1]["tokens"]
    reqs, ctxlens = [], []
    for ctx, cont in pairs:
        c = enc(ctx)
        reqs.append(c + enc(cont))
        ctxlens.append(len(c))
    # a continuation the model would pick greedily: the reference's own next tokens
    c = enc("秋风")
    seq = list(c)
    for _ in range(3):
        seq.append(int(ref_rows(cfg, params, seq)[-1].argmax()))
    reqs.append(seq)
    ctxlens.append(len(c))
    st, out = post(S, "/v1/completions", {"model": "glm2", "prompt": reqs, "temperature": 0, "max_tokens": 1, "logprobs": 1,
                                          "seed": 1234, "echo": True})
    got = []
    for choice, ctxlen in zip(sorted(out.get("choices", []), key=lambda x: x["index"]), ctxlens):  # lm-eval's parse_logprobs
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        got.append((sum(lps), all(t == max(top.values()) for t, top in zip(lps, tops))))
    want = []
    for ids, ctxlen in zip(reqs, ctxlens):
        rows = ref_rows(cfg, params, ids)
        want.append((sum(float(rows[j - 1][ids[j]]) for j in range(ctxlen, len(ids))),
                     all(int(rows[j - 1].argmax()) == ids[j] for j in range(ctxlen, len(ids)))))
    ok = st == 200 and len(got) == len(want) and all(close(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, want))
    T.report("lm_eval_loglikelihood_equals_reference", ok and want[-1][1], "%s: %s vs reference %s" % (st, got, want))
    return reqs


def batch_cases(S, ids):
    prompts = ["写一句关于春的诗", ids, "你好"]
    one = lambda p: post(S, "/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0, "logprobs": 1})[1]
    alone = [one(p) for p in prompts]
    st, b = post(S, "/v1/completions", {"prompt": prompts, "max_tokens": 4, "temperature": 0, "logprobs": 1})
    chs = b.get("choices", []) if st == 200 else []
    ok = len(chs) == 3 and [c["index"] for c in chs] == [0, 1, 2]
    for c, a in zip(chs, alone):
        ca = a["choices"][0]
        ok = ok and c["text"] == ca["text"] and c["logprobs"]["token_logprobs"] == ca["logprobs"]["token_logprobs"]
    pt = sum(a["usage"]["prompt_tokens"] for a in alone)
    T.check("batch_of_prompts_equals_each_alone", ok and b["usage"]["prompt_tokens"] == pt,
            "%s %s vs %s" % (st, json.dumps(b)[:400], [a["choices"][0]["text"] for a in alone]))
    T.check("batch_prompts_prefilled_together", sc.logged(S, "serve: 3 prompts prefilled together"), S.text()[-600:])
    # the same prompt twice among others: one prefill for both, the other prompts still together
    n0 = len(S.log)
    prompts = ["写一句关于春的诗", "写一句关于春的诗", ids, "你好"]
    st, b = post(S, "/v1/completions", {"prompt": prompts, "max_tokens": 4, "temperature": 0, "logprobs": 1})
    chs = b.get("choices", []) if st == 200 else []
    ok = len(chs) == 4 and all(c["text"] == alone[k]["choices"][0]["text"] and c["logprobs"]["token_logprobs"] ==
                               alone[k]["choices"][0]["logprobs"]["token_logprobs"] for c, k in zip(chs, (0, 0, 1, 2)))
    def logged_since(text):
        import time
        t0 = time.time()
        while text not in "\n".join(S.log[n0:]) and time.time() - t0 < 10:
            time.sleep(0.02)
        return text in "\n".join(S.log[n0:])
    T.check("repeated_prompt_shares_its_prefill", ok and logged_since("prefilled once for 2 requests") and
            logged_since("serve: 3 prompts prefilled together"), "%s %s\n%s" % (st, json.dumps(b)[:300], S.log[n0:]))


def n_cases(S):
    """n choices: choice j samples with seed + j (so it is that request alone); a list of prompts
    with n gives prompt-major choices; a prompt's tokens count once."""
    base = {"max_tokens": 5, "temperature": 1.0, "seed": 11}
    one = lambda p, seed: post(S, "/v1/completions", dict(base, prompt=p, seed=seed))[1]["choices"][0]["text"]
    st, b = post(S, "/v1/completions", dict(base, prompt=["写一句关于春的诗", "你好"], n=2))
    want = [one(p, 11 + j) for p in ("写一句关于春的诗", "你好") for j in range(2)]
    got = [c["text"] for c in b.get("choices", [])]
    pt = sum(post(S, "/v1/completions", {"prompt": p, "max_tokens": 1})[1]["usage"]["prompt_tokens"]
             for p in ("写一句关于春的诗", "你好"))
    T.check("completions_n_choices_are_seed_plus_j", st == 200 and got == want and len(set(got)) > 1 and
            [c["index"] for c in b["choices"]] == [0, 1, 2, 3] and b["usage"]["prompt_tokens"] == pt,
            "%s %s vs %s (prompt tokens %s vs %s)" % (st, got, want, b.get("usage"), pt))
    T.check("n_choices_prefilled_once", sc.logged(S, "prefilled once for 2 requests"), S.text()[-600:])
    # greedy choices of one prompt take the device's pick of the shared row; echo's prompt entries are copied
    body = {"prompt": "写一句关于春的诗", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2}
    st1, one = post(S, "/v1/completions", body)
    st, b = post(S, "/v1/completions", dict(body, n=3))
    c1 = one["choices"][0] if st1 == 200 else {}
    T.check("n_greedy_echo_choices_equal_one", st == st1 == 200 and len(b["choices"]) == 3 and all(
        c["text"] == c1["text"] and c["logprobs"] == c1["logprobs"] for c in b["choices"]),
        "%s %s vs %s" % (st, json.dumps(b)[:300], json.dumps(one)[:300]))
    msgs = [{"role": "user", "content": "你好"}]
    st, b = post(S, "/v1/chat/completions", dict(base, messages=msgs, n=3))
    alone = [post(S, "/v1/chat/completions", dict(base, messages=msgs, seed=11 + j))[1] for j in range(3)]
    got = [c["message"]["content"] for c in b.get("choices", [])]
    want = [a["choices"][0]["message"]["content"] for a in alone]
    T.check("chat_n_choices_prefilled_once", sc.logged(S, "prefilled once for 3 requests"), S.text()[-600:])
    T.check("chat_n_choices_are_seed_plus_j", st == 200 and got == want and b["object"] == "chat.completion" and
            b["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"] and
            b["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone),
            "%s %s vs %s" % (st, json.dumps(b)[:300], want))


def sse_events(raw):
    """The data events of a raw SSE body: (parsed JSON events, whether it ended with [DONE])."""
    ev = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: {")]
    return ev, raw.rstrip().endswith("data: [DONE]")


def stream_raw(S, path, body, timeout=60):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", S.port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    return r.status, r.getheader("Content-Type"), raw


def stream_n_cases(S):
    """Several choices streamed (a list of prompts with n, chat with n): each choice's chunks,
    put together, are its choice of the whole answer (text, log-probabilities, finish), each
    choice ends once, the usage chunk sums them, [DONE] last."""
    prompts = ["写一句关于春的诗", "你好"]
    base = {"prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 11, "logprobs": 1}
    st, whole = post(S, "/v1/completions", base)
    st2, ctype, raw = stream_raw(S, "/v1/completions", dict(base, stream=True, stream_options={"include_usage": True}))
    ev, done = sse_events(raw)
    text, lps, fin = {}, {}, {}
    ok = st == st2 == 200 and ctype == "text/event-stream" and done and len(ev) > 5
    for e in ev[:-1]:
        ok = ok and len(e["choices"]) == 1 and e["id"] == ev[0]["id"] and e["object"] == "text_completion"
        c = e["choices"][0]
        i = c["index"]
        ok = ok and i not in fin  # nothing after a choice's finish
        text[i] = text.get(i, "") + c["text"]
        lps[i] = lps.get(i, []) + c["logprobs"]["token_logprobs"]
        if c["finish_reason"]:
            fin[i] = c["finish_reason"]
    want = whole.get("choices", [])
    ok = ok and sorted(text) == [0, 1, 2, 3] and len(want) == 4 and len(set(text.values())) > 1
    for c in want:
        i = c["index"]
        ok = ok and text.get(i) == c["text"] and lps.get(i) == c["logprobs"]["token_logprobs"] and fin.get(i) == c["finish_reason"]
    ok = ok and ev[-1]["choices"] == [] and ev[-1]["usage"] == whole["usage"]
    T.check("stream_prompts_times_n_equals_whole", ok,
            "%s %s %s\nstreamed %s %s\nwhole %s" % (st, st2, ctype, text, fin, json.dumps(whole)[:400]))
    # chat through the official client: a role chunk for each choice, then its content
    msgs = [{"role": "user", "content": "你好"}]
    cl = S.client()
    name = sc.http(S.port, "GET", "/v1/models")[1]["data"][0]["id"]
    args = dict(model=name, messages=msgs, n=3, max_tokens=6, temperature=1.0, seed=11)
    whole = cl.chat.completions.create(**args)
    got, roles, fin = {}, {}, {}
    for ch in cl.chat.completions.create(stream=True, **args):
        for c in ch.choices:
            if c.delta.role:
                roles[c.index] = roles.get(c.index, 0) + 1
            got[c.index] = got.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                fin[c.index] = c.finish_reason
    want = {c.index: c.message.content for c in whole.choices}
    T.check("stream_chat_n_equals_whole_openai_client", got == want and roles == {0: 1, 1: 1, 2: 1} and
            fin == {c.index: c.finish_reason for c in whole.choices} and len(set(want.values())) > 1,
            "%s %s %s vs %s" % (got, roles, fin, want))


def scrape(S):
    """GET /metrics parsed by prometheus_client's own parser: {(name, labels without model_name): value}
    and the families' types."""
    from prometheus_client.parser import text_string_to_metric_families
    st, text = sc.http(S.port, "GET", "/metrics")
    assert st == 200, (st, text)
    name = sc.http(S.port, "GET", "/v1/models")[1]["data"][0]["id"]
    vals, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for smp in fam.samples:
            labels = tuple(sorted((k, v) for k, v in smp.labels.items() if k != "model_name"))
            assert smp.labels.get("model_name") == name, smp
            vals[(smp.name, labels)] = smp.value
    return vals, types


def metrics_cases(S):
    """GET /metrics (Prometheus's text format, parsed by prometheus_client): the counters move by
    exactly what two finished requests used (tokens from their usage, two ends by length, two
    first tokens, two latencies and four gaps between tokens in the histograms, cumulative buckets
    up to +Inf)."""
    before, types = scrape(S)
    us = [post(S, "/v1/completions", {"prompt": p, "max_tokens": 3, "ignore_eos": True})[1]["usage"] for p in ("你好", "写一句")]
    after, types = scrape(S)
    d = lambda k, *lab: after.get(("glmtrain:" + k, tuple(lab)), 0) - before.get(("glmtrain:" + k, tuple(lab)), 0)
    ttft = "time_to_first_token_seconds"
    buckets = sorted(((float(dict(lab)["le"]), v) for (n, lab), v in after.items() if n == "glmtrain:%s_bucket" % ttft))
    ok = (d("prompt_tokens_total") == sum(u["prompt_tokens"] for u in us) and d("generation_tokens_total") == 6 and
          d("request_success_total", ("finished_reason", "length")) == 2 and d(ttft + "_count") == 2 and
          d("e2e_request_latency_seconds_count") == 2 and d(ttft + "_sum") > 0 and
          d("time_per_output_token_seconds_count") == 4 and d("time_per_output_token_seconds_sum") > 0 and
          after[("glmtrain:num_requests_running", ())] == 0 and after[("glmtrain:kv_slots", ())] >= 1 and
          types.get("glmtrain:" + ttft) == "histogram" and types.get("glmtrain:prompt_tokens") == "counter" and
          types.get("glmtrain:num_requests_running") == "gauge" and buckets[-1][0] == float("inf") and
          buckets[-1][1] == after[("glmtrain:%s_count" % ttft, ())] and
          all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])))
    T.check("metrics_count_two_requests", ok, "usage %s; deltas: prompt %s gen %s length %s ttft %s; types %s" % (
        us, d("prompt_tokens_total"), d("generation_tokens_total"), d("request_success_total", ("finished_reason", "length")),
        d(ttft + "_count"), types))


def keepalive_case(model):
    """A whole (not streamed) answer that takes a second: a few keep-alive bytes before it, not a
    stream of them (one a interval, whatever the text released meanwhile)."""
    import http.client
    import time
    S = sc.Server(model, "--step_delay_ms", "20", "--max_batch_size", "2", "--max_queue", "2")
    try:
        st, b = post(S, "/v1/completions", {"prompt": ["a"] * 5, "max_tokens": 1})
        st2, b2 = post(S, "/v1/completions", {"prompt": "a", "n": 5, "max_tokens": 1, "stream": True})
        T.check("refuses_more_choices_than_the_server_holds", st == st2 == 400 and "at most 4" in b["error"]["message"] and
                "at most 4" in b2["error"]["message"], "%s %s / %s %s" % (st, b, st2, b2))
        c = http.client.HTTPConnection("127.0.0.1", S.port, timeout=60)
        t0 = time.time()
        c.request("POST", "/v1/completions", json.dumps({"prompt": "你好", "max_tokens": 60, "ignore_eos": True}),
                  {"Content-Type": "application/json"})
        raw = c.getresponse().read().decode()
        dt = time.time() - t0
        c.close()
        lead = len(raw) - len(raw.lstrip())
        T.check("whole_answer_few_keepalive_bytes", json.loads(raw)["usage"]["completion_tokens"] == 60 and lead <= 4 * dt + 4,
                "%d leading bytes in %.2f s" % (lead, dt))
        # a client that leaves a streamed group of choices cancels all of them
        import socket
        s = socket.create_connection(("127.0.0.1", S.port), timeout=10)
        data = json.dumps({"prompt": "你好", "n": 2, "stream": True, "max_tokens": 200, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                  str(len(data)).encode() + b"\r\n\r\n" + data)
        buf = b""
        while buf.count(b"data: {") < 2:
            k = s.recv(4096)
            if not k:
                break
            buf += k
        running = sc.http(S.port, "GET", "/health")[1]["running"]
        s.close()
        t0 = time.time()
        while sc.http(S.port, "GET", "/health")[1]["running"] > 0 and time.time() - t0 < 3:
            time.sleep(0.01)
        T.check("closed_stream_of_n_cancels_every_choice", running == 2 and time.time() - t0 < 1.0,
                "running %d, %.2f s to none" % (running, time.time() - t0))
        vals, _ = scrape(S)
        T.check("metrics_count_the_cancelled_choices",
                vals.get(("glmtrain:request_aborted_total", (("reason", "cancelled"),))) == 2, vals)
    finally:
        S.stop()


def stream_case(S, ids):
    import http.client
    body = {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    whole = post(S, "/v1/completions", body)[1]["choices"][0]
    c = http.client.HTTPConnection("127.0.0.1", S.port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    raw = c.getresponse().read().decode()
    c.close()
    text, lps = "", []
    for line in raw.split("\n"):
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"][0]
            text += ch["text"]
            lps += ch["logprobs"]["token_logprobs"]
    T.check("stream_echo_equals_whole", text == whole["text"] and lps == whole["logprobs"]["token_logprobs"],
            "%r %s vs %r %s" % (text, lps[:4], whole["text"], whole["logprobs"]["token_logprobs"][:4]))


def tokenizer_cases(S, eos_id):
    text = "写一句关于春的诗"
    n0 = len(S.log)
    st, b = post(S, "/v1/completions", {"prompt": text, "max_tokens": 1})
    logged = sc.prompt_ids(S, n0)
    s1, with_sp = post(S, "/tokenize", {"prompt": text})
    s2, without = post(S, "/tokenize", {"prompt": text, "add_special_tokens": False})
    T.check("tokenize_with_special_tokens_is_the_completion_prompt", st == s1 == s2 == 200 and
            with_sp.get("tokens") == logged and with_sp.get("count") == len(logged) and with_sp.get("max_model_len") == 256 and
            with_sp["tokens"][:without["count"]] == without["tokens"] and without["count"] < with_sp["count"],
            "%s / %s / logged %s" % (with_sp, without, logged))
    s3, dt = post(S, "/detokenize", {"tokens": without.get("tokens")})
    T.check("detokenize_round_trip", s3 == 200 and dt.get("prompt") == text, "%s %s" % (s3, dt))
    n0 = len(S.log)
    msgs = [{"role": "user", "content": "你好"}]
    post(S, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    logged = sc.prompt_ids(S, n0)
    s4, ch = post(S, "/tokenize", {"messages": msgs})
    T.check("tokenize_messages_is_the_chat_prompt", s4 == 200 and ch.get("tokens") == logged, "%s %s vs %s" % (s4, ch, logged))
    s5, info = sc.http(S.port, "GET", "/tokenizer_info")
    T.check("tokenizer_info", s5 == 200 and info.get("eos_token") == "<eop>" and info.get("pad_token") == "<pad>" and
            info.get("model_max_length") == 256 and info.get("tokenizer_class") == "ChatGLMTokenizer", "%s %s" % (s5, info))
    # lm-eval's end-of-text id: its RemoteTokenizer encodes eos_token without special tokens
    s6, eot = post(S, "/tokenize", {"prompt": info.get("eos_token", ""), "add_special_tokens": False})
    s7, lt = post(S, "/tokenize", {"prompt": "<eop>x", "add_special_tokens": False})
    T.check("tokenize_special_token_text_is_its_id", s6 == 200 and eot.get("tokens") == [eos_id] and
            s7 == 200 and len(lt.get("tokens", [])) > 1, "%s %s / %s" % (s6, eot, lt))


def refusals(S, vocab):
    cases = [
        ("max_tokens_0_without_echo", {"prompt": "你好", "max_tokens": 0}, 400, "echo"),
        ("chat_max_tokens_0", {"messages": [{"role": "user", "content": "你好"}], "max_tokens": 0}, 400, "max_tokens"),
        ("n_0", {"prompt": "a", "n": 0}, 400, "n must be in [1, 256]"),
        ("prompts_times_n", {"prompt": ["a"] * 3, "n": 100}, 400, "3 prompts x n 100"),
        ("id_outside_vocabulary", {"prompt": [5, 8, vocab]}, 400, "prompt[2] must be a token id"),
        ("id_not_integer", {"prompt": [[5, 8], [5, 1.5]]}, 400, "prompt[1][1]"),
        ("text_then_id", {"prompt": ["a", 5]}, 400, "prompt[1] must be a string or a non-empty list of token ids"),
        ("empty_list", {"prompt": []}, 400, "empty list"),
        ("empty_ids", {"prompt": [[5], []]}, 400, "prompt[1]"),
        ("too_many_prompts", {"prompt": ["a"] * 257}, 400, "at most 256"),
        ("echo_not_bool", {"prompt": "a", "echo": 1}, 400, "echo must be a boolean"),
        ("ids_over_max_model_len", {"prompt": [5] * 256}, 413, "max_model_len"),
        ("echo_only_over_max_model_len", {"prompt": [5] * 257, "echo": True, "max_tokens": 0}, 413, "max_model_len"),
        ("tokenize_both", {"prompt": "a", "messages": []}, 400, "either"),
        ("detokenize_bad_id", {"tokens": [1, -1]}, 400, "tokens[1]"),
    ]
    for name, body, code, words in cases:
        path = "/v1/chat/completions" if "messages" in body and "tokenize" not in name else \
               "/tokenize" if name.startswith("tokenize") else "/detokenize" if name.startswith("detokenize") else "/v1/completions"
        st, b = post(S, path, body)
        msg = b.get("error", {}).get("message", "") if isinstance(b, dict) else str(b)
        T.check("refuses_" + name, st == code and words in msg, "%s %s" % (st, msg))
    st, b = post(S, "/v1/completions", {"prompt": [5, 8], "echo": True, "max_tokens": 0})  # still serving; 2 ids fit
    T.check("echo_exactly_max_model_len_fits", st == 200 and post(S, "/v1/completions", {"prompt": [5] * 256, "echo": True,
                                                                                         "max_tokens": 0})[0] == 200, str(b)[:200])


def glm1_cases(tmp):
    """ChatGLM-6B (a prefix LM): echo with logprobs refused, echo alone and ids with [gMASK] <sop> served."""
    tok, cfg, params = sc.make_model(tmp)
    S = sc.Server(tok)
    try:
        st, b = post(S, "/v1/completions", {"prompt": "你好", "echo": True, "logprobs": 1, "max_tokens": 2})
        T.check("glm1_refuses_echo_with_logprobs", st == 400 and "prefix LM" in b["error"]["message"], "%s %s" % (st, b))
        st, b = post(S, "/v1/completions", {"prompt": "你好", "echo": True, "max_tokens": 2, "temperature": 0})
        st2, b2 = post(S, "/v1/completions", {"prompt": "你好", "max_tokens": 2, "temperature": 0})
        T.check("glm1_echo_without_logprobs", st == st2 == 200 and
                b["choices"][0]["text"] == "你好" + b2["choices"][0]["text"], "%s %s / %s" % (st, b, b2))
        with_sp = post(S, "/tokenize", {"prompt": "你好"})[1]["tokens"]
        st, b = post(S, "/v1/completions", {"prompt": with_sp[:-2], "max_tokens": 2})
        T.check("glm1_refuses_ids_without_gmask_sop", st == 400 and "[gMASK]" in b["error"]["message"], "%s %s" % (st, b))
        st, b3 = post(S, "/v1/completions", {"prompt": with_sp, "max_tokens": 2, "temperature": 0})
        T.check("glm1_ids_with_gmask_sop_equal_text", st == 200 and b3["choices"][0]["text"] == b2["choices"][0]["text"],
                "%s %s vs %s" % (st, b3, b2))
    finally:
        S.stop()


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_echo: %s not built" % sc.GLM)
        return 0
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-echo-")
    try:
        model, cfg, params = make_glm2(tmp)
        vocab = cfg["padded_vocab_size"]
        S = sc.Server(model, "--debug")
        try:
            ids = echo_cases(S, cfg, params, vocab)
            reqs = lm_eval_cases(S, cfg, params)
            batch_cases(S, ids)
            stream_case(S, ids)
            n_cases(S)
            stream_n_cases(S)
            metrics_cases(S)
            tokenizer_cases(S, json.load(open(os.path.join(model, "config.json")))["eos_token_id"])
            refusals(S, vocab)
            body = {"prompt": reqs, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
            whole = post(S, "/v1/completions", body)[1]
            nbody = {"prompt": "写一句关于春的诗", "n": 2, "logprobs": 1, "max_tokens": 4, "temperature": 0}
            whole_n = post(S, "/v1/completions", nbody)[1]
        finally:
            S.stop()
        # split over 2 pipeline stages (CPU stages): the same numbers
        S = sc.Server(model, "--device_map", "auto", "--pipeline_parallel_size", "2")
        try:
            st, split = post(S, "/v1/completions", body)
            ok = st == 200 and len(split["choices"]) == len(whole["choices"])
            for a, b in zip(split.get("choices", []), whole["choices"]):
                la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
                ok = ok and len(la) == len(lb) and all((x is None and y is None) or close(x, y, 1e-5) for x, y in zip(la, lb))
            T.check("echo_device_map_2_stages_equal_whole", ok and "split over 2 stages" in S.text(),
                    "%s %s" % (st, json.dumps(split)[:300]))
            st, split_n = post(S, "/v1/completions", nbody)  # choices sharing a prefill: each stage's rows copied
            ok = st == 200 and len(split_n["choices"]) == 2
            for a, b in zip(split_n.get("choices", []), whole_n["choices"]):
                la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
                ok = ok and a["text"] == b["text"] and len(la) == len(lb) and all(close(x, y, 1e-5) for x, y in zip(la, lb))
            T.check("n_choices_device_map_2_stages_equal_whole", ok, "%s %s vs %s" % (st, json.dumps(split_n)[:300],
                                                                                      json.dumps(whole_n)[:300]))
        finally:
            S.stop()
        keepalive_case(model)
        os.makedirs(os.path.join(tmp, "v1"))
        glm1_cases(os.path.join(tmp, "v1"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
