#!/usr/bin/env python3
"""`glmtrain serve` end to end on a tiny random GLM (tests/py/serve_common.py), through the real
`openai` Python client (PyPI, pinned in scripts/install-deps.sh) and raw HTTP:

  * chat completions (one turn, a history, a system message), text completions, sampling with a
    seed and a LoRA adapter chosen by `model` equal `glmtrain generate` with the same settings;
  * streamed chunks join to the same text; /v1/models lists the base and both adapters;
  * 32 concurrent streaming clients (base and adapters mixed, different lengths) get exactly
    their one-at-a-time outputs, and the engine batched them (fewer steps than tokens);
  * while long streams run: malformed JSON, wrong types, a huge body, a prompt past
    max_model_len, a wrong and a missing key, unknown paths and models, slowloris-style partial
    requests (closed by the idle timeout), a client closing mid-stream (its slot freed at once),
    a full queue (429) each get their answer, and the streams finish with their right outputs;
  * SIGTERM: running streams finish, new connections are refused, exit status 0.
Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402
import serve_common as sc  # noqa: E402

T = Checks()
PROMPTS = ["你好", "写一首关于春天的诗", "明月", "今天天气很好", "白日依山尽", "the quick brown fox", "春风", "我们去公园"]


def chat(c, model, text, n, stream=False, **kw):
    """Greedy chat completion text (joined chunks when streaming) and its finish reason."""
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], temperature=0, max_tokens=n,
                                  stream=stream, **kw)
    if not stream:
        return r.choices[0].message.content, r.choices[0].finish_reason
    parts, finish = [], None
    for ch in r:
        d = ch.choices[0].delta.content if ch.choices else None
        if d:
            parts.append(d)
        if ch.choices and ch.choices[0].finish_reason:
            finish = ch.choices[0].finish_reason
    return "".join(parts), finish, len(parts)


def generate_mismatches(c, model, prompts, n):
    """(prompt, served, generated) for each prompt whose greedy chat completion differs from
    `glmtrain generate` of the same model."""
    bad = []
    for p in prompts:
        got, _ = chat(c, "model", p, n)
        want = sc.generate(model, p, "--do_sample", "false", "--max_new_tokens", str(n))
        if got != want:
            bad.append((p, got, want))
    return bad


def streams_at_once(c, jobs):
    """Each (model, prompt, max_tokens) job as a streaming chat completion, all started together
    (a barrier): their (text, finish, chunks), or ("error", why, 0)."""
    res = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i):
        m, p, n = jobs[i]
        try:
            start.wait()
            res[i] = chat(c, m, p, n, stream=True)
        except Exception as e:  # noqa: BLE001
            res[i] = ("error", repr(e), 0)
    th = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in th:
        t.start()
    for t in th:
        t.join(timeout=120)
    return res


def parity(S, model, ad1, ad2):
    c = S.client()
    # 1. chat completion = generate (greedy), several prompts
    bad = generate_mismatches(c, model, PROMPTS[:3], 16)
    T.check("chat_completion_equals_generate_greedy", not bad, str(bad)[:600])
    # history: the same prompt text generate builds from "[Round i]" rounds (ChatGLM-6B's model.chat)
    msgs = [{"role": "user", "content": "明月"}, {"role": "assistant", "content": "床前明月光"},
            {"role": "user", "content": "白日"}]
    got = c.chat.completions.create(model="model", messages=msgs, temperature=0, max_tokens=12).choices[0].message.content
    want = sc.generate(model, "[Round 0]\n问：明月\n答：床前明月光\n[Round 1]\n问：白日\n答：", "--do_sample", "false",
                       "--max_new_tokens", "12")
    T.check("chat_history_uses_the_models_template", got == want, "%r vs %r" % (got, want))
    msgs = [{"role": "system", "content": "你是一个诗人"}, {"role": "user", "content": "春风"}]
    got = c.chat.completions.create(model="model", messages=msgs, temperature=0, max_tokens=12).choices[0].message.content
    want = sc.generate(model, "春风", "--system", "你是一个诗人", "--do_sample", "false", "--max_new_tokens", "12")
    T.check("chat_system_message_as_generate_system", got == want, "%r vs %r" % (got, want))
    # text completion = generate without post-processing
    r = c.completions.create(model="model", prompt="白日依山尽", temperature=0, max_tokens=12)
    want = sc.generate(model, "白日依山尽", "--do_sample", "false", "--max_new_tokens", "12", "--postprocess", "false")
    T.check("completion_equals_generate_greedy", r.choices[0].text == want and r.object == "text_completion" and
            r.usage.completion_tokens >= 1, "%r vs %r" % (r.choices[0].text, want))
    # sampling with a seed: the same stream as generate --seed
    got = c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], temperature=0.9,
                                    top_p=0.7, seed=5, max_tokens=16).choices[0].message.content
    want = sc.generate(model, "你好", "--temperature", "0.9", "--top_p", "0.7", "--seed", "5", "--max_new_tokens", "16")
    T.check("sampling_with_seed_equals_generate", got == want, "%r vs %r" % (got, want))
    # 2. streaming joins to the same text
    bad, chunks = [], 0
    for p in PROMPTS[:3]:
        whole, f1 = chat(c, "model", p, 24)
        joined, f2, n = chat(c, "model", p, 24, stream=True)
        chunks = max(chunks, n)
        if whole != joined or f1 != f2:
            bad.append((p, whole, joined, f1, f2))
    T.check("stream_chunks_join_to_the_same_text", not bad and chunks >= 1, str(bad)[:600])
    sse = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": [{"role": "user", "content": "你好"}],
                                                           "temperature": 0, "max_tokens": 4, "stream": True})
    T.check("stream_is_sse_ending_with_done", sse[0] == 200 and isinstance(sse[1], str) and
            sse[1].rstrip().endswith("data: [DONE]") and '"role":"assistant"' in sse[1], str(sse)[:300])
    # 3. models: the base and each adapter
    ids = [m.id for m in c.models.list().data]
    T.check("models_lists_base_and_adapters", ids == ["model", "ad1", "ad2"], str(ids))
    # 4. adapters chosen by `model` = generate --adapter
    bad = []
    for name, d in (("ad1", ad1), ("ad2", ad2)):
        got, _ = chat(c, name, "你好", 16)
        want = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "16", "--adapter", d)
        if got != want:
            bad.append((name, got, want))
    base, _ = chat(c, "model", "你好", 16)
    T.check("adapter_by_model_field_equals_generate_adapter", not bad and base != chat(c, "ad1", "你好", 16)[0],
            str(bad)[:600])


def concurrent(S):
    """32 streaming clients at once = their one-at-a-time outputs."""
    c = S.client()
    jobs = [(["model", "ad1", "ad2"][i % 3], PROMPTS[i % len(PROMPTS)], 8 + (i * 5) % 40) for i in range(32)]
    alone = [chat(c, m, p, n) for m, p, n in jobs]
    h0 = sc.http(S.port, "GET", "/health")[1]
    res = streams_at_once(c, jobs)
    h1 = sc.http(S.port, "GET", "/health")[1]
    bad = [(i, jobs[i], alone[i], res[i]) for i in range(len(jobs)) if not res[i] or res[i][:2] != alone[i]]
    T.check("32_concurrent_streams_equal_one_at_a_time", not bad, "%d differ: %s" % (len(bad), str(bad[:3])[:800]))
    steps, tokens = h1["steps"] - h0["steps"], h1["tokens"] - h0["tokens"]
    T.check("concurrent_streams_share_decode_steps", tokens > 0 and steps < tokens / 1.5 and h1["peak_running"] >= 8,
            "%d steps for %d tokens, at most %d rows at once" % (steps, tokens, h1["peak_running"]))


def raw_stream(port, body, key):
    """A streaming request on a raw socket; returns the socket after the response headers."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    buf = b""
    while b"data: {" not in buf:
        k = s.recv(4096)
        if not k:
            break
        buf += k
    return s, buf


def closed_within(s, seconds):
    """Whether the server closes the socket within `seconds` (reads until EOF / reset)."""
    s.settimeout(0.5)
    end = time.time() + seconds
    while time.time() < end:
        try:
            if not s.recv(4096):
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def robustness(model, ref):
    """Bad requests against a server whose streams are slowed (--step_delay_ms) so they overlap."""
    key = "sekret-key"
    S = sc.Server(model, "--api_key", key, "--max_batch_size", "5", "--max_queue", "1", "--timeout", "2",
                  "--step_delay_ms", "60", "--max_body_bytes", "65536", "--max_model_len", "128")
    try:
        c = S.client(key)
        body = {"model": "model", "messages": [{"role": "user", "content": "你好"}], "temperature": 0, "max_tokens": 120,
                "ignore_eos": True}
        kw = dict({k: v for k, v in body.items() if k != "ignore_eos"}, extra_body={"ignore_eos": True})
        want = ref.chat.completions.create(**kw).choices[0].message.content
        long_res, times = [None] * 3, [[] for _ in range(3)]

        def longrun(i):
            try:
                parts = []
                for ch in c.chat.completions.create(stream=True, **kw):
                    d = ch.choices[0].delta.content if ch.choices else None
                    if d:
                        parts.append(d)
                    times[i].append(time.time())
                long_res[i] = "".join(parts)
            except Exception as e:  # noqa: BLE001
                long_res[i] = "error: %r" % e
        th = [threading.Thread(target=longrun, args=(i,)) for i in range(3)]
        for t in th:
            t.start()
        t0 = time.time()
        while sc.http(S.port, "GET", "/health")[1]["running"] < 3 and time.time() - t0 < 20:
            time.sleep(0.02)
            if any(long_res):
                raise RuntimeError("a long stream ended early: %s" % long_res)
        t_err0 = time.time()
        # slowloris: headers cut off, and a body that stops short (checked below: closed by the idle timeout)
        s1 = socket.create_connection(("127.0.0.1", S.port))
        s1.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthor")
        s2 = socket.create_connection(("127.0.0.1", S.port))
        s2.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"model\": ")
        t_slow = time.time()
        auth = {"Authorization": "Bearer " + key}
        url = "/v1/chat/completions"
        st, b = sc.http(S.port, "POST", url, b'{"model": "model", "messages": [', dict(auth, **{"Content-Type": "application/json"}))
        T.check("malformed_json_400", st == 400 and b["error"]["code"] == "invalid_json" and
                b["error"]["type"] == "invalid_request_error" and set(b["error"]) == {"message", "type", "param", "code"}, str(b))
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, auth)
        T.check("wrong_type_400_names_field", st == 400 and b["error"]["param"] == "temperature", str(b))
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": "hello"}, auth)
        T.check("messages_not_a_list_400", st == 400 and b["error"]["param"] == "messages", str(b))
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, auth)
        T.check("max_tokens_not_integer_400", st == 400 and b["error"]["param"] == "max_tokens", str(b))
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": [{"role": "bot", "content": "x"}]}, auth)
        T.check("unknown_role_400", st == 400 and "messages[0].role" in b["error"]["message"], str(b))
        st, b = sc.http(S.port, "POST", url, b"x" * (3 << 20), dict(auth, **{"Content-Type": "application/json"}))
        T.check("huge_body_413", st == 413 and b["error"]["code"] == "request_too_large", str(b)[:300])
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": [{"role": "user", "content": "春风又绿江南岸" * 40}]}, auth)
        T.check("prompt_past_max_model_len_413", st == 413 and b["error"]["code"] == "context_length_exceeded", str(b)[:300])
        st, b = sc.http(S.port, "POST", url, {"model": "model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 500}, auth)
        T.check("max_tokens_past_max_model_len_400", st == 400 and b["error"]["param"] == "max_tokens", str(b)[:300])
        import openai
        try:
            S.client("wrong-key").chat.completions.create(model="model", messages=[{"role": "user", "content": "x"}])
            T.check("wrong_key_401", False, "no error")
        except openai.AuthenticationError as e:
            T.check("wrong_key_401", e.status_code == 401 and e.code == "invalid_api_key", repr(e))
        st, b = sc.http(S.port, "GET", "/v1/models")
        T.check("missing_key_401", st == 401 and b["error"]["code"] == "invalid_api_key", str(b))
        st, b = sc.http(S.port, "GET", "/health")
        T.check("health_needs_no_key", st == 200 and b["status"] == "ok", str(b))
        st0, b0 = sc.http(S.port, "GET", "/metrics")
        st1, b1 = sc.http(S.port, "GET", "/metrics", headers=auth)
        T.check("metrics_need_the_key", st0 == 401 and st1 == 200 and "# TYPE glmtrain:num_requests_running gauge" in b1,
                "%s %s / %s %s" % (st0, str(b0)[:100], st1, str(b1)[:100]))
        st, b = sc.http(S.port, "GET", "/v1/nothing", headers=auth)
        T.check("unknown_path_404", st == 404 and b["error"]["code"] == "not_found", str(b))
        # an error that quotes the request cuts a long name at a length: never inside a character
        # (the body must stay UTF-8 JSON; strict decoding here, where sc.http replaces bad bytes)
        import http.client
        hc = http.client.HTTPConnection("127.0.0.1", S.port, timeout=30)
        hc.request("POST", url, body=json.dumps({"model": "模" * 120, "messages": [{"role": "user", "content": "x"}]}).encode(),
                   headers=dict(auth, **{"Content-Type": "application/json"}))
        r = hc.getresponse()
        raw = r.read()
        hc.close()
        try:
            msg = json.loads(raw.decode("utf-8"))["error"]["message"]
        except (UnicodeDecodeError, ValueError, KeyError) as e:
            msg = "undecodable: %r (%r)" % (e, raw[:120])
        T.check("error_quoting_a_long_name_is_utf8", r.status == 404 and "模" * 60 in msg, msg[:200])
        try:
            c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
            T.check("unknown_model_404", False, "no error")
        except openai.NotFoundError as e:
            T.check("unknown_model_404", e.status_code == 404 and e.code == "model_not_found", repr(e))
        # a client that closes mid-stream frees its slot at the next step
        s, first = raw_stream(S.port, dict(body, stream=True), key)
        t0 = time.time()
        while sc.http(S.port, "GET", "/health")[1]["running"] < 4 and time.time() - t0 < 3:
            time.sleep(0.01)
        running = sc.http(S.port, "GET", "/health")[1]["running"]
        s.close()
        t0 = time.time()
        while sc.http(S.port, "GET", "/health")[1]["running"] >= running and time.time() - t0 < 3:
            time.sleep(0.01)
        freed = time.time() - t0
        T.check("closed_stream_frees_its_slot", b"data: {" in first and running == 4 and freed < 1.0,
                "running %d, freed after %.2f s" % (running, freed))
        # full: 5 slots busy (3 streams + 2 more), 1 waiting, the next one 429
        extra = [raw_stream(S.port, dict(body, stream=True), key)[0] for _ in range(2)]
        q = threading.Thread(target=lambda: sc.http(S.port, "POST", url, dict(body, max_tokens=2), auth))
        q.start()
        while sc.http(S.port, "GET", "/health")[1]["queued"] < 1:
            time.sleep(0.01)
        try:
            c.chat.completions.create(model="model", messages=[{"role": "user", "content": "x"}], max_tokens=2)
            T.check("full_queue_429", False, "accepted")
        except openai.RateLimitError as e:
            T.check("full_queue_429", e.status_code == 429 and e.code == "queue_full", repr(e))
        for x in extra:
            x.close()
        ok1, ok2 = closed_within(s1, 6), closed_within(s2, 6)
        T.check("slowloris_partial_requests_closed_by_timeout", ok1 and ok2 and time.time() - t_slow < 6,
                "headers closed %s, body closed %s after %.1f s" % (ok1, ok2, time.time() - t_slow))
        s1.close()
        s2.close()
        t_err1 = time.time()
        for t in th:
            t.join(timeout=60)
        q.join(timeout=30)
        # each stream was under way while the bad requests came (its first chunk can land a moment
        # after they begin: the engine admits an idle pool's requests at once, the client's threads parse late)
        overlap = all(ts and ts[0] < t_err1 and ts[-1] > t_err1 for ts in times)
        T.check("streams_keep_streaming_through_bad_requests", all(r == want for r in long_res) and overlap,
                "overlap %s (bad requests from %.2f s to %.2f s; streams %s), %s vs %r" % (
                    overlap, t_err0 - t_slow, t_err1 - t_slow, [(round(ts[0] - t_slow, 2), round(ts[-1] - t_slow, 2)) if ts else None
                                                                for ts in times], [r[:40] if r else r for r in long_res], want[:40]))
        # SIGTERM: running streams finish, then exit 0
        res = [None] * 2

        def short(i):
            try:
                res[i] = chat(c, "model", "你好", 40, stream=True, extra_body={"ignore_eos": True})
            except Exception as e:  # noqa: BLE001
                res[i] = ("error", repr(e))
        th = [threading.Thread(target=short, args=(i,)) for i in range(2)]
        for t in th:
            t.start()
        while sc.http(S.port, "GET", "/health")[1]["running"] < 2:
            time.sleep(0.01)
        time.sleep(0.2)
        S.p.send_signal(15)
        refused, t0 = False, time.time()
        while not refused and time.time() - t0 < 3:  # the listening socket closes at once; a loaded machine may lag
            time.sleep(0.1)
            try:
                socket.create_connection(("127.0.0.1", S.port), timeout=2).close()
            except OSError:
                refused = True
        rc = S.stop()
        for t in th:
            t.join(timeout=30)
        want40 = ref.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], temperature=0,
                                             max_tokens=40, extra_body={"ignore_eos": True}).choices[0].message.content
        T.check("sigterm_finishes_streams_and_exits_0", rc == 0 and refused and all(r and r[:2] == (want40, "length") for r in res)
                and "serve: stopped" in S.text(), "rc %s refused %s %s %s" % (rc, refused, str(res)[:200], S.text()[-300:]))
    finally:
        if S.p.poll() is None:
            S.stop(9)


def device_map(model, ad1, ad2):
    """--device_map: the model split into 2 stages (on the CPU here, GPU k for stage k on a
    machine with GPUs) serves what the whole model generates, concurrent streams included; split
    with two LoRA adapters too, what generate --adapter gives."""
    S = sc.Server(model, "--device_map", "auto", "--pipeline_parallel_size", "2", "--step_delay_ms", "4")
    try:
        c = S.client()
        bad = generate_mismatches(c, model, PROMPTS[:2], 12)
        T.check("device_map_2_stages_equals_generate", not bad and "split over 2 stages" in S.text(),
                str(bad)[:400] + S.text()[-300:])
        jobs = [("model", p, 10) for p in PROMPTS[:6]]
        alone = [chat(c, m, p, n) for m, p, n in jobs]
        res = streams_at_once(c, jobs)
        peak = sc.http(S.port, "GET", "/health")[1].get("peak_running", 0)
        bad = [(a, b) for a, b in zip(res, alone) if not a or a[:2] != b]
        T.check("device_map_concurrent_streams_equal_alone", not bad and peak >= 2, "peak %s: %s" % (peak, str(bad)[:400]))
    finally:
        rc = S.stop()
    T.check("device_map_clean_exit", rc == 0, S.text()[-300:])
    # adapters across the stages: each stage holds its layers' rows of every adapter, chosen per
    # request as on one device; the base, ad1 and ad2 interleaved at once
    S = sc.Server(model, "--device_map", "auto", "--pipeline_parallel_size", "2", "--adapter", "ad1=" + ad1,
                  "--adapter", "ad2=" + ad2, "--step_delay_ms", "4")
    try:
        c = S.client()
        bad = []
        for name, d in (("ad1", ad1), ("ad2", ad2)):
            got, _ = chat(c, name, "你好", 12)
            want = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "12", "--adapter", d)
            if got != want:
                bad.append((name, got, want))
        T.check("device_map_adapter_equals_generate_adapter", not bad and "split over 2 stages" in S.text(),
                str(bad)[:400] + S.text()[-300:])
        jobs = [(["model", "ad1", "ad2"][i % 3], PROMPTS[i % len(PROMPTS)], 6 + i % 5) for i in range(6)]
        alone = [chat(c, m, p, n) for m, p, n in jobs]
        res = streams_at_once(c, jobs)
        bad = [(j, a, b) for j, a, b in zip(jobs, res, alone) if not a or a[:2] != b]
        T.check("device_map_adapters_interleaved_equal_alone", not bad and len(set(a[0] for a in alone[:3])) == 3,
                str(bad)[:400])
    finally:
        rc = S.stop()
    T.check("device_map_adapter_clean_exit", rc == 0, S.text()[-300:])


def ptuning(model, cfg, ad1, tmp):
    """--ptuning_checkpoint: the base with a P-Tuning v2 prefix served as the model (THUDM's
    ptuning deployment): what generate --adapter gives, whole and split over 2 stages, concurrent
    streams included; LoRA adapters beside it and a LoRA folder given as the checkpoint are refused."""
    pt = sc.make_ptuning(os.path.join(tmp, "pt"), cfg, 4, seed=3)
    for spec in ([], ["--device_map", "auto", "--pipeline_parallel_size", "2"]):
        S = sc.Server(model, "--ptuning_checkpoint", pt, "--step_delay_ms", "4", *spec)
        tag = "ptuning" + ("_device_map" if spec else "")
        try:
            c = S.client()
            bad = []
            for p in PROMPTS[:3]:
                got, _ = chat(c, "model", p, 12)
                want = sc.generate(model, p, "--do_sample", "false", "--max_new_tokens", "12", "--adapter", pt)
                if got != want:
                    bad.append((p, got, want))
            base = sc.generate(model, PROMPTS[0], "--do_sample", "false", "--max_new_tokens", "12")
            T.check(tag + "_equals_generate_adapter", not bad and base != chat(c, "model", PROMPTS[0], 12)[0] and
                    "P-Tuning v2 prefix" in S.text(), str(bad)[:400] + S.text()[-300:])
            jobs = [("model", PROMPTS[i % len(PROMPTS)], 6 + i % 5) for i in range(6)]
            alone = [chat(c, m, p, n) for m, p, n in jobs]
            res = streams_at_once(c, jobs)
            bad = [(j, a, b) for j, a, b in zip(jobs, res, alone) if not a or a[:2] != b]
            T.check(tag + "_concurrent_streams_equal_alone", not bad, str(bad)[:400])
        finally:
            rc = S.stop()
        T.check(tag + "_clean_exit", rc == 0, S.text()[-300:])
    # adapters whose settings would have to swap with more than A and B per request: refused, naming merge
    variants = {}
    for tag, edit in (("dora", {"use_dora": True}), ("mts", {"modules_to_save": ["final_layernorm"]})):
        d = variants[tag] = os.path.join(os.path.dirname(ad1), "ad1_" + tag)
        shutil.copytree(ad1, d, dirs_exist_ok=True)
        conf = json.load(open(os.path.join(d, "adapter_config.json")))
        conf.update(edit)
        json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
    for flags, want, name in (
            (["--adapter", "d=" + variants["dora"]], "is a DoRA adapter", "adapter_dora_refused"),
            (["--adapter", "m=" + variants["mts"]], "modules_to_save", "adapter_modules_to_save_refused"),
            (["--ptuning_checkpoint", pt, "--adapter", "ad1=" + ad1], "over a P-Tuning v2 model", "ptuning_with_lora_refused"),
            (["--ptuning_checkpoint", ad1], "is a LoRA adapter", "ptuning_checkpoint_lora_refused"),
            (["--adapter", "p=" + pt], "--ptuning_checkpoint", "adapter_ptuning_names_ptuning_checkpoint")):
        p = subprocess.run([sc.GLM, "serve", "--model_name_or_path", model, "--device", "cpu", "--port", "0"] + flags,
                           capture_output=True, text=True, timeout=60, env=sc.ENV)
        T.check(name, p.returncode != 0 and want in p.stderr, p.stderr[-300:])


def main():
    if not os.path.exists(sc.GLM):
        T.skip("serve_all", "%s not built" % sc.GLM)
        return
    try:
        import openai  # noqa: F401
    except ImportError:
        T.skip("serve_all", "the openai Python client is not installed (scripts/install-deps.sh)")
        return
    if not shutil.which("spm_train"):
        T.skip("serve_all", "spm_train (Debian sentencepiece) not installed")
        return
    tmp = tempfile.mkdtemp(prefix="glm-serve-")
    S = None
    try:
        model, cfg, _ = sc.make_model(tmp)
        ad1 = sc.make_adapter(os.path.join(tmp, "ad1"), cfg, 4, ["query_key_value", "dense_h_to_4h"], seed=1)
        ad2 = sc.make_adapter(os.path.join(tmp, "ad2"), cfg, 2, ["dense", "dense_4h_to_h", "query_key_value"], seed=7, alpha=4)
        S = sc.Server(model, "--adapter", "ad1=" + ad1, "--adapter", "ad2=" + ad2)
        parity(S, model, ad1, ad2)
        # the concurrent clients on a server whose steps take at least 8 ms, so that they overlap
        # however loaded the machine is (the outputs do not depend on it)
        S2 = sc.Server(model, "--adapter", "ad1=" + ad1, "--adapter", "ad2=" + ad2, "--step_delay_ms", "8")
        try:
            concurrent(S2)
        finally:
            S2.stop()
        device_map(model, ad1, ad2)
        ptuning(model, cfg, ad1, tmp)
        robustness(model, S.client())
        rc = S.stop()
        T.check("clean_exit", rc == 0, "rc %s: %s" % (rc, S.text()[-300:]))
    finally:
        if S and S.p.poll() is None:
            S.stop(9)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    t0 = time.time()
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL serve: %s" % e)
        sys.exit(1)
    print("  (%.1f s)" % (time.time() - t0))
    sys.exit(T.status())
