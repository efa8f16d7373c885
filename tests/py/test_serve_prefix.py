#!/usr/bin/env python3
"""`glmtrain serve`'s prefix caching (docs/SERVE.md): a free KV-cache slot keeps the rows of the
tokens its last request fed, and a prompt that begins with them prefills only the rest. On a tiny
random ChatGLM2-family model (causal), over token-id prompts, against the PyTorch reference
(glm2_ref.forward, fp32) and against a server with --enable_prefix_caching false:

  * a prompt extending an earlier one (40 tokens kept): usage.prompt_tokens_details.cached_tokens
    is 40, the greedy answer and its log-probabilities are the reference's (1e-4) and bit for bit
    the uncached server's;
  * a chat's next turn (the prompt, the answer, more): the answer's tokens but the last are kept
    too (cached = prompt + answer - 1);
  * the same prompt again: all of it but the last token;
  * fresh prompts take empty slots first, then the slot kept longest ago: after 3 unrelated
    requests in 4 slots the history still hits; after 4 more it is gone (cached 0), never a wrong
    reuse;
  * a model split over 2 pipeline stages: each stage's slot keeps its rows;
  * a LoRA adapter never reuses the base model's rows (nor the base an adapter's); its own next
    turn does;
  * a kept slot between two decoding ones (an idle row of their decode) keeps its rows;
  * fewer than 16 tokens in common: a fresh slot (cached 0);
  * GET /metrics: prefix_cache_queries_total and prefix_cache_hits_total move by the tokens;
  * ChatGLM-6B (GLM v1, whose prompt sees itself whole): caching off, cached 0, answers unchanged;
  * a streamed answer's usage chunk carries cached_tokens too.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()
TOL = 1e-4


def post(S, body, path="/v1/completions"):
    return sc.http(S.port, "POST", path, body)


def complete(S, ids, n_tok, model=None):
    """A greedy answer of n_tok tokens to prompt ids: (status, body, cached tokens, token logprobs)."""
    body = {"prompt": ids, "max_tokens": n_tok, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    if model:
        body["model"] = model
    st, b = post(S, body)
    if st != 200:
        return st, b, None, None
    cached = b["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    return st, b, cached, b["choices"][0]["logprobs"]["token_logprobs"]


def ref_greedy(cfg, params, ids, n_tok):
    """The reference's greedy continuation: (ids, log-probabilities)."""
    import torch
    import glm2_ref
    out, lps, cur = [], [], list(ids)
    with torch.no_grad():
        for _ in range(n_tok):
            lg = glm2_ref.forward(cfg, params, torch.tensor([cur]))["logits"][0, -1].double()
            lp = torch.log_softmax(lg, -1)
            t = int(lp.argmax())
            out.append(t)
            lps.append(float(lp[t]))
            cur.append(t)
    return out, lps


def close_all(a, b):
    return a is not None and len(a) == len(b) and all(abs(x - y) <= TOL * max(1.0, abs(y)) for x, y in zip(a, b))


def scrape(S, name):
    st, text = sc.http(S.port, "GET", "/metrics")
    m = re.search(r"^glmtrain:%s\{[^}]*\} (\S+)$" % name, text if st == 200 else "", re.M)
    return float(m.group(1)) if m else None


def make_glm2_adapter(path, cfg, r=4, seed=7):
    """A peft-format LoRA folder on query_key_value of the ChatGLM2 model, B != 0."""
    import torch
    import glm2_ref
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    H, Q = cfg["hidden_size"], glm2_ref.qkv_size(cfg)
    t = {}
    for layer in range(cfg["num_layers"]):
        pre = "base_model.model.transformer.encoder.layers.%d.self_attention.query_key_value." % layer
        t[pre + "lora_A.weight"] = 0.5 * torch.randn(r, H, generator=g)
        t[pre + "lora_B.weight"] = 0.5 * torch.randn(Q, r, generator=g)
    save_file(t, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0, "bias": "none",
                   "target_modules": ["query_key_value"], "task_type": "CAUSAL_LM"}, f)
    return path


def cached_cases(S, S0, cfg, params, vocab):
    rng = random.Random(11)
    P = [rng.randrange(10, vocab) for _ in range(40)]
    Q = [rng.randrange(10, vocab) for _ in range(10)]
    q0, h0 = scrape(S, "prefix_cache_queries_total"), scrape(S, "prefix_cache_hits_total")
    st, _, c_a, _ = complete(S, P, 1)
    st_b, b, c_b, lp_b = complete(S, P + Q, 6)
    want_ids, want_lp = ref_greedy(cfg, params, P + Q, 6)
    st0, b0, c0, lp0 = complete(S0, P + Q, 6)
    T.check("prefix_extends_earlier_prompt_cached_40", st == st_b == 200 and c_a == 0 and c_b == 40,
            "%s %s cached %s then %s" % (st, st_b, c_a, c_b))
    T.check("prefix_cached_answer_equals_reference", close_all(lp_b, want_lp), "%s vs %s" % (lp_b, want_lp))
    T.check("prefix_cached_answer_bit_identical_to_uncached_server",
            st0 == 200 and c0 == 0 and lp_b == lp0 and b["choices"][0]["text"] == b0["choices"][0]["text"],
            "cached %s: %s %r vs %s %r" % (c0, lp_b, b["choices"][0]["text"] if b else None, lp0,
                                           b0["choices"][0]["text"] if st0 == 200 else b0))
    q1, h1 = scrape(S, "prefix_cache_queries_total"), scrape(S, "prefix_cache_hits_total")
    T.check("prefix_metrics_count_tokens", q0 is not None and q1 - q0 == 40 + 50 and h1 - h0 == 40,
            "queries %s -> %s, hits %s -> %s" % (q0, q1, h0, h1))

    # the next turn: the prompt, the answer, more; the answer's last token was never fed
    R = [rng.randrange(10, vocab) for _ in range(8)]
    turn = P + Q + want_ids + R
    st_c, _, c_c, lp_c = complete(S, turn, 4)
    T.check("prefix_next_turn_keeps_the_answer", st_c == 200 and c_c == 50 + 5, "cached %s, want 55" % c_c)
    T.check("prefix_next_turn_equals_reference", close_all(lp_c, ref_greedy(cfg, params, turn, 4)[1]), str(lp_c))
    st_d, _, c_d, lp_d = complete(S, turn, 4)
    T.check("prefix_same_prompt_again_all_but_last", st_d == 200 and c_d == len(turn) - 1 and lp_d == lp_c,
            "cached %s of %d; %s vs %s" % (c_d, len(turn), lp_d, lp_c))

    # fewer than 16 in common: a fresh slot
    st_e, _, c_e, _ = complete(S, P[:12] + Q + R, 2)
    T.check("prefix_below_16_tokens_not_reused", st_e == 200 and c_e == 0, "cached %s" % c_e)

    # 4 slots: the history's slot, the short one's, and fresh prompts. Fresh ones take empty slots,
    # then the one kept longest ago: two more leave the history; five more evict it.
    turn2 = turn + [rng.randrange(10, vocab) for _ in range(3)]
    fresh = lambda: [rng.randrange(10, vocab) for _ in range(20)]  # noqa: E731
    oks = [complete(S, fresh(), 2)[0] == 200 for _ in range(2)]
    st_f, _, c_f, _ = complete(S, turn2, 2)
    T.check("prefix_fresh_prompts_leave_kept_slots", all(oks) and st_f == 200 and c_f == len(turn),
            "%s cached %s, want %d" % (oks, c_f, len(turn)))
    oks = [complete(S, fresh(), 2)[0] == 200 for _ in range(5)]
    st_g, _, c_g, lp_g = complete(S, turn2 + [5], 2)
    T.check("prefix_slot_kept_longest_ago_goes_first", all(oks) and st_g == 200 and c_g == 0 and
            close_all(lp_g, ref_greedy(cfg, params, turn2 + [5], 2)[1]), "%s cached %s" % (oks, c_g))

    # a streamed answer's usage
    st_s, raw = sc.http(S.port, "POST", "/v1/completions", {"prompt": turn2 + [5, 6], "max_tokens": 2, "temperature": 0,
                                                            "stream": True, "stream_options": {"include_usage": True}})
    ev = [json.loads(x[6:]) for x in (raw if isinstance(raw, str) else "").split("\n\n") if x.startswith("data: {")]
    u = ev[-1].get("usage") if ev else None
    T.check("prefix_streamed_usage_has_cached_tokens", st_s == 200 and u and
            u["prompt_tokens_details"]["cached_tokens"] == len(turn2) + 1, "%s %s" % (st_s, u))


def adapter_cases(model, cfg, params, vocab, ad):
    rng = random.Random(12)
    P = [rng.randrange(10, vocab) for _ in range(30)]
    S = sc.Server(model, "--adapter", "ad=" + ad, "--max_batch_size", "2")
    S0 = sc.Server(model, "--adapter", "ad=" + ad, "--max_batch_size", "2", "--enable_prefix_caching", "false")
    try:
        st, _, c1, _ = complete(S, P, 1)  # the base keeps P
        st2, _, c2, lp2 = complete(S, P + [7, 8], 3, model="ad")
        st0, _, _, lp0 = complete(S0, P + [7, 8], 3, model="ad")
        T.check("prefix_adapter_never_reuses_base_rows", st == st2 == st0 == 200 and c1 == 0 and c2 == 0 and lp2 == lp0,
                "cached %s %s; %s vs %s" % (c1, c2, lp2, lp0))
        st3, _, c3, lp3 = complete(S, P + [7, 8, 9], 3, model="ad")
        st03, _, _, lp03 = complete(S0, P + [7, 8, 9], 3, model="ad")
        T.check("prefix_adapter_reuses_its_own_rows", st3 == st03 == 200 and c3 == len(P) + 2 and lp3 == lp03,
                "cached %s; %s vs %s" % (c3, lp3, lp03))
        st4, _, c4, _ = complete(S, P + [7, 8, 9, 10], 2)  # the base: its own P (20 tokens), not the adapter's
        T.check("prefix_base_never_reuses_adapter_rows", st4 == 200 and c4 == len(P), "cached %s" % c4)
    finally:
        S.stop()
        S0.stop()


def idle_row_case(model, cfg, params, vocab):
    """A kept slot between two decoding ones: the decode's idle row for it writes past what it
    keeps, so the history it holds still answers as the reference."""
    rng = random.Random(13)
    ids = lambda n: [rng.randrange(10, vocab) for _ in range(n)]  # noqa: E731
    S = sc.Server(model, "--max_batch_size", "3")
    try:
        complete(S, ids(20), 1)  # slot 0
        H = ids(30)
        complete(S, H, 1)  # slot 1 keeps H
        st, b = post(S, {"prompt": [ids(20), ids(20)], "max_tokens": 12, "temperature": 0, "ignore_eos": True})  # slots 2, 0
        st2, _, c, lp = complete(S, H + [5, 6], 3)
        T.check("prefix_kept_slot_survives_idle_decode_rows", st == st2 == 200 and c == len(H) and
                close_all(lp, ref_greedy(cfg, params, H + [5, 6], 3)[1]), "%s %s cached %s %s" % (st, st2, c, lp))
    finally:
        S.stop()


def pipeline_case(model, cfg, params, vocab):
    """A model split over 2 stages (CPU): each stage's slot keeps its rows."""
    rng = random.Random(14)
    P = [rng.randrange(10, vocab) for _ in range(24)]
    S = sc.Server(model, "--device_map", "auto", "--pipeline_parallel_size", "2", "--max_batch_size", "2")
    try:
        complete(S, P, 1)
        st, _, c, lp = complete(S, P + [5, 6], 3)
        T.check("prefix_device_map_2_stages", st == 200 and c == len(P) and "split over 2 stages" in S.text() and
                close_all(lp, ref_greedy(cfg, params, P + [5, 6], 3)[1]), "%s cached %s %s" % (st, c, lp))
    finally:
        S.stop()


def glm1_case(tmp):
    model, _, _ = sc.make_model(tmp)
    S = sc.Server(model, "--max_batch_size", "2")
    try:
        a = "春天来了，花儿开了。" * 4
        r1 = post(S, {"prompt": a, "max_tokens": 2, "temperature": 0})
        r2 = post(S, {"prompt": a + "夏天", "max_tokens": 2, "temperature": 0})
        c = [r[1]["usage"]["prompt_tokens_details"]["cached_tokens"] if r[0] == 200 else None for r in (r1, r2)]
        T.check("prefix_glm1_caches_nothing", c == [0, 0] and "prefix caching off (GLM v1)" in S.text() and
                r2[1]["usage"]["prompt_tokens"] > 20, "%s %s" % (c, r2))
    finally:
        S.stop()


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_prefix: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-prefix-")
    try:
        model, cfg, params = make_glm2(tmp)
        vocab = cfg["padded_vocab_size"]
        S = sc.Server(model, "--max_batch_size", "4", "--debug")
        S0 = sc.Server(model, "--max_batch_size", "4", "--enable_prefix_caching", "false")
        try:
            cached_cases(S, S0, cfg, params, vocab)
            T.check("prefix_logged", "held by slot" in S.text() and "prefix caching on" in S.text(), S.text()[-800:])
        finally:
            S.stop()
            S0.stop()
        idle_row_case(model, cfg, params, vocab)
        pipeline_case(model, cfg, params, vocab)
        adapter_cases(model, cfg, params, vocab, make_glm2_adapter(os.path.join(tmp, "ad"), cfg))
        os.makedirs(os.path.join(tmp, "v1"))
        glm1_case(os.path.join(tmp, "v1"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
