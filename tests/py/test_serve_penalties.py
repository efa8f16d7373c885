#!/usr/bin/env python3
"""`glmtrain serve`'s OpenAI logit adjustments: `logit_bias`, `frequency_penalty`,
`presence_penalty`, and vLLM's `stop_token_ids` and `min_tokens` (docs/SERVE.md), on a tiny random ChatGLM2-family model over token-id prompts,
against the PyTorch reference (glm2_ref.forward, fp32) with OpenAI's rule written out here:
logits[t] += bias[t]; logits[t] -= frequency x c[t] + presence x (c[t] > 0), c[t] the times t was
generated so far; then the greedy pick. The returned log-probabilities are the model's own (before
the adjustments), so a greedy answer's entries equal the reference's log_softmax at the tokens the
adjusted rule picks:

  * frequency + presence penalties: the reference's penalised greedy tokens (1e-4), which differ
    from the plain greedy answer (the penalties matter here);
  * negative penalties (allowed, -2..2) likewise;
  * logit_bias +100 on one token: every generated token is it; -100 on the plain answer's first
    token: the reference's best other token instead;
  * stop_token_ids end the answer (the stop token left out); min_tokens holds them back (the
    reference with them masked before it), also without logprobs;
  * n = 3 (the first token of the copies taken from a shared prefill) and the official openai
    client give the same tokens;
  * refusals naming the field: logit_bias not an object, a key that is not an id, an id outside
    the vocabulary, a bias outside [-100, 100], more than 300 entries, penalties outside [-2, 2].
Prints PASS/FAIL/SKIP lines."""
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


def post(S, body):
    return sc.http(S.port, "POST", "/v1/completions", body)


def ref_adjusted(cfg, params, ids, n, bias=None, freq=0.0, pres=0.0, stop_ids=(), min_tokens=0):
    """The reference's greedy tokens under OpenAI's rule and vLLM's stop_token_ids / min_tokens (the
    stop ids masked before min_tokens; a stop id picked ends the answer, not part of it):
    (ids, raw log-probabilities)."""
    import torch
    import glm2_ref
    out, lps, cur = [], [], list(ids)
    with torch.no_grad():
        for _ in range(n):
            lg = glm2_ref.forward(cfg, params, torch.tensor([cur]))["logits"][0, -1].double()
            raw = torch.log_softmax(lg, -1)
            adj = lg.clone()
            for t, b in (bias or {}).items():
                adj[t] += b
            for t in set(out):
                adj[t] -= freq * out.count(t) + pres
            if len(out) < min_tokens:
                for t in stop_ids:
                    adj[t] = float("-inf")
            t = int(adj.argmax())
            if t in stop_ids:
                break
            out.append(t)
            lps.append(float(raw[t]))
            cur.append(t)
    return out, lps


def answer(S, ids, n_tok, **kw):
    body = dict({"prompt": ids, "max_tokens": n_tok, "temperature": 0, "logprobs": 1, "ignore_eos": True}, **kw)
    st, b = post(S, body)
    if st != 200:
        return st, b, None, None
    lp = b["choices"][0]["logprobs"]
    return st, b, lp["token_logprobs"], lp["tokens"]


def close_all(a, b):
    return a is not None and len(a) == len(b) and all(abs(x - y) <= TOL * max(1.0, abs(y)) for x, y in zip(a, b))


def cases(S, cfg, params, vocab):
    rng = random.Random(21)
    P = [rng.randrange(10, vocab) for _ in range(12)]
    N = 12
    plain_ids, plain_lp = ref_adjusted(cfg, params, P, N)
    st, _, lp, _ = answer(S, P, N)
    T.check("plain_greedy_equals_reference", st == 200 and close_all(lp, plain_lp), "%s %s vs %s" % (st, lp, plain_lp))

    # a token favoured by a bias of 3 (the random model's logits lie within ~0.2) repeats without
    # penalties; with them it gives way after a few and comes back
    fav = rng.randrange(10, vocab)
    bias = {str(fav): 3}
    pen_ids, pen_lp = ref_adjusted(cfg, params, P, N, bias={fav: 3.0}, freq=1.0)
    st_f, bf, lp, _ = answer(S, P, N, logit_bias=bias, frequency_penalty=1.0)
    T.check("frequency_penalty_equals_reference", st_f == 200 and close_all(lp, pen_lp) and 2 <= pen_ids.count(fav) < N,
            "%s %s vs %s (penalised %s)" % (st, lp, pen_lp, pen_ids))
    once = {str(fav): 1.5}  # taken once, then 1.5 - 2 puts it below the rest for good
    pr_ids, pr_lp = ref_adjusted(cfg, params, P, N, bias={fav: 1.5}, pres=2.0)
    st, _, lp, _ = answer(S, P, N, logit_bias=once, presence_penalty=2.0)
    T.check("presence_penalty_equals_reference", st == 200 and close_all(lp, pr_lp) and pr_ids.count(fav) == 1,
            "%s %s vs %s (penalised %s)" % (st, lp, pr_lp, pr_ids))
    st1, b1 = post(S, {"prompt": P, "max_tokens": N, "temperature": 0, "ignore_eos": True, "logit_bias": bias,
                       "frequency_penalty": 1.0})
    T.check("adjusted_without_logprobs_same_text", st1 == 200 and st_f == 200 and
            b1["choices"][0]["text"] == bf["choices"][0]["text"], "%s %r vs %r" % (st1, b1, bf))
    neg_ids, neg_lp = ref_adjusted(cfg, params, P, N, freq=-0.7, pres=-1.2)
    st, bn, lp, _ = answer(S, P, N, frequency_penalty=-0.7, presence_penalty=-1.2)
    T.check("negative_penalties_equal_reference", st == 200 and close_all(lp, neg_lp) and
            len(set(neg_ids)) < len(set(plain_ids)), "%s %s vs %s (%s, plain %s)" % (st, lp, neg_lp, neg_ids, plain_ids))
    st2, b2 = post(S, {"prompt": P, "max_tokens": N, "temperature": 0, "ignore_eos": True, "frequency_penalty": -0.7,
                       "presence_penalty": -1.2})  # no logprobs: the device would pick greedily unless told
    T.check("penalties_without_logprobs_same_text", st == st2 == 200 and b2["choices"][0]["text"] == bn["choices"][0]["text"],
            "%s %r vs %r" % (st2, b2, bn))

    t = rng.randrange(10, vocab)
    st, _, lp, toks = answer(S, P, 6, logit_bias={str(t): 100})
    want = ref_adjusted(cfg, params, P, 6, bias={t: 100.0})
    T.check("logit_bias_plus_100_forces_the_token", st == 200 and want[0] == [t] * 6 and close_all(lp, want[1]) and
            len(set(toks)) == 1, "%s %s %s vs %s" % (st, toks, lp, want))
    first = plain_ids[0]
    want = ref_adjusted(cfg, params, P, 4, bias={first: -100.0})
    st, _, lp, _ = answer(S, P, 4, logit_bias={str(first): -100})
    T.check("logit_bias_minus_100_bans_the_token", st == 200 and want[0][0] != first and first not in want[0] and
            close_all(lp, want[1]), "%s %s vs %s" % (st, lp, want))

    # vLLM's stop_token_ids and min_tokens: the plain answer's third token as a stop id ends it after
    # two tokens; with min_tokens 4 it cannot come before the fifth
    x = plain_ids[2]
    st, bs, lp, _ = answer(S, P, N, stop_token_ids=[x], ignore_eos=False)
    T.check("stop_token_ids_end_the_answer", st == 200 and close_all(lp, plain_lp[:2]) and
            bs["choices"][0]["finish_reason"] == "stop", "%s %s" % (st, str(bs)[:300]))
    want = ref_adjusted(cfg, params, P, N, stop_ids=(x,), min_tokens=4)
    st, bm, lp, _ = answer(S, P, N, stop_token_ids=[x], min_tokens=4, ignore_eos=False)
    T.check("min_tokens_hold_back_the_stop_ids", st == 200 and close_all(lp, want[1]) and len(want[0]) >= 4 and
            x not in want[0][:4], "%s %s vs %s" % (st, lp, want))
    st2, b2 = post(S, {"prompt": P, "max_tokens": N, "temperature": 0, "stop_token_ids": [x], "min_tokens": 4})
    T.check("min_tokens_without_logprobs_same_text", st == st2 == 200 and b2["choices"][0]["text"] == bm["choices"][0]["text"],
            "%s %r vs %r" % (st2, b2, bm))

    st, b, _, _ = answer(S, P, N, logit_bias=bias, frequency_penalty=1.0, n=3)
    ok = st == 200 and len(b["choices"]) == 3 and all(close_all(c["logprobs"]["token_logprobs"], pen_lp) for c in b["choices"])
    T.check("penalties_n_choices_each_as_alone", ok, "%s %s" % (st, str(b)[:300]))
    c = S.client()
    r = c.completions.create(model=b.get("model", "glm2") if st == 200 else "glm2", prompt=P, max_tokens=N, temperature=0,
                             logprobs=1, logit_bias=bias, frequency_penalty=1.0,
                             extra_body={"ignore_eos": True})
    T.check("penalties_through_openai_client", close_all(r.choices[0].logprobs.token_logprobs, pen_lp),
            str(r.choices[0].logprobs.token_logprobs))


def refusals(S, vocab):
    for name, extra in (("logit_bias_not_object", {"logit_bias": [1, 2]}),
                        ("logit_bias_key_not_id", {"logit_bias": {"abc": 1}}),
                        ("logit_bias_id_outside_vocab", {"logit_bias": {str(vocab + 5): 1}}),
                        ("logit_bias_negative_id", {"logit_bias": {"-3": 1}}),
                        ("logit_bias_value_too_large", {"logit_bias": {"5": 101}}),
                        ("logit_bias_value_not_number", {"logit_bias": {"5": "x"}}),
                        ("logit_bias_301_entries", {"logit_bias": {str(i): 1 for i in range(301)}}),
                        ("frequency_penalty_above_2", {"frequency_penalty": 2.5}),
                        ("stop_token_ids_not_list", {"stop_token_ids": 5}),
                        ("stop_token_ids_outside_vocab", {"stop_token_ids": [vocab]}),
                        ("stop_token_ids_17", {"stop_token_ids": list(range(5, 22))}),
                        ("min_tokens_negative", {"min_tokens": -1}),
                        ("min_tokens_above_max_tokens", {"min_tokens": 3}),
                        ("presence_penalty_below_minus_2", {"presence_penalty": -3})):
        st, b = post(S, dict({"prompt": [5, 6, 7], "max_tokens": 2}, **extra))
        param = next(iter(extra))
        err = b.get("error", {}) if isinstance(b, dict) else {}
        T.check("refuses_" + name, st == 400 and err.get("param") == param and param in err.get("message", ""),
                "%s %s" % (st, b))


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_penalties: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-penalties-")
    try:
        model, cfg, params = make_glm2(tmp)
        S = sc.Server(model, "--served_model_name", "glm2")
        try:
            cases(S, cfg, params, cfg["padded_vocab_size"])
            refusals(S, cfg["padded_vocab_size"])
        finally:
            S.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
