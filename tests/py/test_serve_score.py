#!/usr/bin/env python3
"""`glmtrain serve`'s POST /v1/score/evaluation (LLaMA-Factory's API for a reward model) against PyTorch
fp32 references, on the CPU:

  * ChatGLM-6B (test_lora_cli's tiny model): a reward model trained here with `--stage rm` (LoRA + value
    head), served as an adapter beside the base, scores {"prompt", "response"} messages as --do_predict
    scored the same pairs (its two decimals), and as glm_ref.py's forward with the adapter and TRL's
    ValueHead at the last token (1e-4); the ids serve logged are the rm example's
    (encode(prompt) + [gMASK, <sop>] + encode(response) + [<eop>]); the base with its own
    value_head.safetensors scores with the base alone; a batch of messages (scored several a forward,
    through the free slots beside the request's) gives each one's score alone, bit for bit; max_length cuts from the end; the answer has LLaMA-Factory's fields; a score
    request beside a decoding completion leaves both as they are alone; the model split over 2
    pipeline stages (--device_map) scores the same;
  * the errors: a plain text on ChatGLM-6B (no [gMASK] / <sop>), a model without a value head, an
    unknown model, no or empty messages, a message of another type, a pair without a response or with
    an empty one, a bad max_length, a text beyond max_model_len (413), or beyond
    --max_num_batched_tokens (413; cut by max_length it scores), a body that is not JSON, GET;
  * ChatGLM3 (the ChatGLM2 block, a tokenizer in the real file's layout): a plain text is encoded as
    the Python reference tokenizer encodes it without special tokens (LLaMA-Factory's
    tokenizer(text, add_special_tokens=False)) and a pair as ChatGLM3's turns ([gMASK] sop, a system
    turn, <|user|>, <|assistant|>, eos); both scored as glm2_ref.py's forward.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from mpi_runs import report  # noqa: E402

TOL = 1e-4


def close(a, b, tol=TOL):
    return abs(a - b) <= tol * max(1.0, abs(b))


def value(hidden_last, vh):
    """TRL's ValueHead without dropout: Linear(H, 1) on the final norm's output."""
    import torch
    return float(torch.nn.functional.linear(hidden_last.double(), vh["v_head.summary.weight"].double(),
                                            vh["v_head.summary.bias"].double()))


def write_vhead(path, H, seed):
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    vh = {"v_head.summary.weight": torch.randn(1, H, generator=g), "v_head.summary.bias": torch.randn(1, generator=g)}
    save_file(vh, os.path.join(path, "value_head.safetensors"))
    return vh


def score(S, body):
    return sc.http(S.port, "POST", "/v1/score/evaluation", body)


def id_lines(S):
    return [l for l in list(S.log) if "serve: score ids " in l]


def logged_ids(S, before, k, wait=10.0):
    """The ids serve logged (--debug) for message k of a score request, `before` being how many such
    lines the log held from the earlier requests. The log is read by a thread, so lines may land a
    moment after their answer (an earlier request's too): they are counted, not taken from a place."""
    import time
    t0 = time.time()
    while time.time() - t0 < wait:
        lines = id_lines(S)
        if len(lines) > before + k:
            tag = "serve: score ids %d: " % k
            line = lines[before + k]
            return [int(x) for x in line.split(tag)[1].split()] if tag in line else None
        time.sleep(0.05)
    return None


def settled(S, n, wait=10.0):
    """How many id lines the log holds once the n expected so far have all landed."""
    import time
    t0 = time.time()
    while len(id_lines(S)) < n and time.time() - t0 < wait:
        time.sleep(0.05)
    return len(id_lines(S))


def encode(tok, text):
    p = subprocess.run([sc.GLM, "tokenize", "--tokenizer", tok, "--no_special_tokens", "--json", "--json_input"],
                       input=json.dumps(text) + "\n", capture_output=True, text=True, env=sc.ENV, timeout=60)
    return json.loads(p.stdout)["ids"]


def glm1_cases(tmp):
    import torch
    import glm_ref
    import test_dpo as D
    import test_lora_cli as C
    made = D.poem_pairs(tmp, "serve_score")
    if not made:
        return
    tok, cfg, params, pairs, data = made
    ids = {k: cfg[k] for k in ("gmask_token_id", "bos_token_id", "eos_token_id")}
    # the reward model: LoRA + value head, trained until it prefers the chosen answers, and its predictions
    rm = os.path.join(tmp, "rm")
    p = C.run(["train", "--model_name_or_path", tok, "--train_file", data, "--output_dir", rm, "--stage", "rm",
               "--finetuning_type", "lora", "--lora_target", "all", "--lora_dropout", "0", "--lora_rank", "4",
               "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--max_steps", "12", "--save_strategy", "no",
               "--disable_tqdm", "--seed", "5", "--report_to", "none", "--do_predict", "--test_file", data,
               "--lr_scheduler_type", "constant"])
    report("serve_score_rm_trains", p.returncode == 0, p.stderr[-600:])
    if p.returncode:
        return
    preds = [json.loads(l) for l in open(os.path.join(rm, "generated_predictions.jsonl"))]
    # the base, with a value head of its own, in another folder (the rm run read none from the model's)
    base = os.path.join(tmp, "base")
    shutil.copytree(tok, base)
    base_vh = write_vhead(base, cfg["hidden_size"], seed=11)
    plain = sc.make_adapter(os.path.join(tmp, "plain"), cfg, 4, ["query_key_value"], seed=3)
    from safetensors.torch import load_file
    ad = {k[len("base_model.model."):]: v.float() for k, v in load_file(os.path.join(rm, "adapter_model.safetensors")).items()}
    ac = json.load(open(os.path.join(rm, "adapter_config.json")))
    rm_vh = load_file(os.path.join(rm, "value_head.safetensors"))
    S = sc.Server(base, "--adapter", "rm=" + rm, "--adapter", "plain=" + plain, "--debug", "--max_model_len", "128")
    try:
        report("serve_score_logs_the_value_heads", "value head: base scores" in S.text() and "value head: rm scores" in S.text()
               and "value head: plain" not in S.text(), S.text()[-800:])
        msgs = [{"prompt": r["instruction"], "response": r[k]} for r in pairs for k in ("chosen", "rejected")]
        seen = {}
        expected = [0]  # the id lines the requests so far make
        for model, lora, vh in (("rm", (ad, ac["lora_alpha"] / ac["r"]), rm_vh), ("base", None, base_vh)):
            n0 = settled(S, expected[0])
            st, body = score(S, {"model": model, "messages": msgs})
            expected[0] = n0 + len(msgs)
            got = body.get("scores") if st == 200 else None
            ok = st == 200 and len(got or []) == len(msgs) and body.get("object") == "score.evaluation" and \
                body.get("model") == model and str(body.get("id", "")).startswith("scoreval-")
            worst, detail, layout_ok = 0.0, "%s %s" % (st, str(body)[:300]), True
            for k, m in enumerate(msgs if ok else []):
                sent = logged_ids(S, n0, k)
                want_ids = encode(tok, m["prompt"]) + [ids["gmask_token_id"], ids["bos_token_id"]] + \
                    encode(tok, m["response"]) + [ids["eos_token_id"]]
                layout_ok = layout_ok and sent == want_ids
                with torch.no_grad():
                    h = glm_ref.forward(cfg, params, torch.tensor([sent]), lora=lora)["hidden"][0, -1]
                want = value(h, vh)
                worst = max(worst, abs(got[k] - want) / max(1.0, abs(want)))
                if not close(got[k], want):
                    ok, detail = False, "message %d: %r vs reference %r" % (k, got[k], want)
            report("serve_score_%s_pairs_equal_reference" % model, ok, "%s (worst relative %.1e)" % (detail, worst))
            seen[model] = got
            report("serve_score_%s_pairs_are_the_rm_examples" % model, ok and layout_ok, "ids as logged vs the rm layout")
            if model == "rm" and ok:
                pred_ok = all(abs(got[2 * i] - pr["chosen"]) <= 0.005 + 1e-6 and abs(got[2 * i + 1] - pr["rejected"]) <= 0.005 + 1e-6
                              for i, pr in enumerate(preds)) and len(preds) == len(pairs)
                report("serve_score_rm_equals_do_predict", pred_ok, "serve %s, --do_predict %s" % (got[:4], preds[:2]))
                report("serve_score_rm_prefers_the_chosen", all(got[2 * i] > got[2 * i + 1] for i in range(len(pairs))),
                       str(got))
                alone = [score(S, {"model": "rm", "messages": [m]})[1].get("scores", [None])[0] for m in msgs[:3]]
                expected[0] += 3
                report("serve_score_batch_equals_each_alone", alone == got[:3], "%s vs %s" % (alone, got[:3]))
                report("serve_score_texts_scored_together", sc.logged(S, "texts scored together"),
                       "the batch's texts through free slots beside the request's, one forward")
        # max_length: the first tokens only (as truncation=True): the prompt, [gMASK] <sop> and two more
        cut = len(encode(tok, msgs[0]["prompt"])) + 4
        n0 = settled(S, expected[0])
        st, body = score(S, {"model": "base", "messages": [msgs[0]], "max_length": cut})
        sent = logged_ids(S, n0, 0)
        ok = st == 200 and sent is not None and len(sent) == cut
        if ok:
            with torch.no_grad():
                want = value(glm_ref.forward(cfg, params, torch.tensor([sent]))["hidden"][0, -1], base_vh)
            ok = close(body["scores"][0], want)
        report("serve_score_max_length_cuts_the_end", ok, "%s %s ids %s" % (st, body, sent))
        # the errors (a response of many tokens against max_model_len 128)
        long_text = {"prompt": "写诗", "response": "春风又绿江南岸 " * 80}
        bad = [("plain_text_on_chatglm6b", {"model": "base", "messages": ["写一句关于春的诗"]}, 400, "[gMASK]"),
               ("no_value_head", {"model": "plain", "messages": [msgs[0]]}, 400, "no value head"),
               ("unknown_model", {"model": "nope", "messages": [msgs[0]]}, 404, "does not exist"),
               ("no_messages", {"model": "base"}, 400, "messages"),
               ("empty_messages", {"model": "base", "messages": []}, 400, "non-empty"),
               ("message_of_another_type", {"model": "base", "messages": [3]}, 400, "messages[0]"),
               ("pair_without_response", {"model": "base", "messages": [msgs[0], {"prompt": "x"}]}, 400, "messages[1]"),
               ("empty_response", {"model": "base", "messages": [{"prompt": "x", "response": ""}]}, 400, "empty"),
               ("max_length_zero", {"model": "base", "messages": [msgs[0]], "max_length": 0}, 400, "max_length"),
               ("max_length_text", {"model": "base", "messages": [msgs[0]], "max_length": "9"}, 400, "max_length"),
               ("too_long", {"model": "base", "messages": [long_text]}, 413, "max_model_len"),
               ("not_json", b"{", 400, "JSON")]
        for name, body, want_st, word in bad:
            st, got = score(S, body)
            msg = got.get("error", {}).get("message", "") if isinstance(got, dict) else str(got)
            report("serve_score_refuses_%s" % name, st == want_st and word in msg, "%s %s" % (st, msg))
        st, got = sc.http(S.port, "GET", "/v1/score/evaluation")
        report("serve_score_refuses_get", st == 405, "%s %s" % (st, got))
        st, got = score(S, {"model": "rm", "messages": [msgs[0]]})
        report("serve_score_still_serves_after_errors", st == 200, "%s %s" % (st, got))
    finally:
        S.stop()
    # beside a completion that decodes (slowed, so they overlap): the completion's text as alone, the
    # scores as before, both running at once (/health's peak)
    S = sc.Server(base, "--adapter", "rm=" + rm, "--step_delay_ms", "5")
    try:
        import threading
        comp = {"model": "base", "prompt": "写一句关于春的诗", "max_tokens": 120, "temperature": 0, "ignore_eos": True}
        alone = sc.http(S.port, "POST", "/v1/completions", comp)[1]
        out = {}
        th = threading.Thread(target=lambda: out.update(r=sc.http(S.port, "POST", "/v1/completions", comp)[1]))
        th.start()
        import time
        time.sleep(0.1)
        st, body = score(S, {"model": "rm", "messages": msgs[:4]})
        th.join()
        peak = sc.http(S.port, "GET", "/health")[1].get("peak_running")
        text = lambda r: r.get("choices", [{}])[0].get("text") if isinstance(r, dict) else None
        report("serve_score_beside_a_decoding_completion", st == 200 and body.get("scores") == seen["rm"][:4] and
               text(out.get("r")) == text(alone) and text(alone) and peak >= 2,
               "score %s %s, completion equal %s, peak %s" % (st, str(body)[:200], text(out.get("r")) == text(alone), peak))
    finally:
        S.stop()
    # split over 2 pipeline stages (--device_map; CPU stages here): the same scores
    S = sc.Server(base, "--adapter", "rm=" + rm, "--device_map", "auto", "--pipeline_parallel_size", "2")
    try:
        got = {m: score(S, {"model": m, "messages": msgs})[1].get("scores") for m in ("rm", "base")}
        ok = all(got[m] and seen.get(m) and all(close(a, b, 1e-5) for a, b in zip(got[m], seen[m])) for m in got)
        report("serve_score_device_map_2_stages_equal_whole", ok and "split over 2 stages" in S.text(),
               "%s vs %s" % ({m: (v or [])[:2] for m, v in got.items()}, {m: v[:2] for m, v in seen.items()}))
    finally:
        S.stop()


def glm3_cases(tmp):
    import torch
    import chatglm23_tok_ref as R
    import glm2_ref
    import tokenizer_corpus as tc
    from test_glm2_cli import write_glm2_config
    from mpi_runs import run
    from safetensors.torch import load_file
    if not shutil.which("spm_train"):
        print("SKIP serve_score_glm3: spm_train (Debian sentencepiece) not installed")
        return
    model = R.train_model(tmp, tc.corpus(seed=2023))
    ref3 = R.ChatGLM3Tokenizer(model)
    tok = R.write_folder(os.path.join(tmp, "chatglm3-tok"), model, R.CONFIG_V3)
    vocab = (ref3.vocab_size + 63) // 64 * 64
    cfg_path = write_glm2_config(tmp, {"<eop>": ref3.eos_token_id, "<pad>": 0}, vocab)
    data = os.path.join(tmp, "conv.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(8):
            f.write(json.dumps({"conversations": [{"role": "user", "content": "你好 %d" % i},
                                                  {"role": "assistant", "content": "你好，我是助手。"}]}, ensure_ascii=False) + "\n")
    out = os.path.join(tmp, "glm3")
    run(["--init_from_config", cfg_path, "--tokenizer_name", tok, "--train_file", data, "--max_steps", "1", "--seed", "3",
         "--disable_tqdm", "--report_to", "none", "--output_dir", out, "--per_device_train_batch_size", "8"], timeout=300)
    for f in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, f), out)
    st = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            st.update(load_file(os.path.join(out, f)))
    cfg = glm2_ref.load_config(json.load(open(os.path.join(out, "config.json"))))
    params = {k: v.float() for k, v in st.items() if "inv_freq" not in k}
    vh = write_vhead(out, cfg["hidden_size"], seed=5)
    text = "[gMASK]sop<|user|>\n 北京天气怎么样<|assistant|>\n 晴，20 度。"
    pair = {"system": "Be brief.", "prompt": "你好", "response": "你好，我是助手。"}
    want_ids = [list(ref3.encode(text, add_special_tokens=False)),
                ref3.get_prefix_tokens() + ref3.build_single_message("system", "", pair["system"]) +
                ref3.build_single_message("user", "", pair["prompt"]) +
                ref3.build_single_message("assistant", "", pair["response"]) + [ref3.eos_token_id]]
    S = sc.Server(out, "--debug")
    try:
        n0 = settled(S, 0)
        code, body = score(S, {"model": "glm3", "messages": [text, pair]})
        ok, detail = code == 200 and len(body.get("scores", [])) == 2, "%s %s" % (code, str(body)[:300])
        for k in range(2 if ok else 0):
            sent = logged_ids(S, n0, k)
            with torch.no_grad():
                want = value(glm2_ref.forward(cfg, params, torch.tensor([want_ids[k]]))["hidden"][0, -1], vh)
            if sent != want_ids[k] or not close(body["scores"][k], want):
                ok, detail = False, "message %d: ids %s vs %s, score %r vs %r" % (k, sent, want_ids[k], body["scores"][k], want)
        report("serve_score_glm3_text_and_pair_equal_reference", ok, detail)
    finally:
        S.stop()
    # a text is scored by one forward: longer than the work buffers (prompts would prefill in parts), a 413
    S = sc.Server(out, "--max_batch_size", "2", "--max_num_batched_tokens", "8")
    try:
        code, body = score(S, {"model": "glm3", "messages": [text]})
        msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        report("serve_score_text_beyond_batched_tokens_413", code == 413 and "--max_num_batched_tokens" in msg,
               "%s %s" % (code, body))
        code, body = score(S, {"model": "glm3", "messages": [text], "max_length": 8})
        report("serve_score_text_cut_to_batched_tokens", code == 200 and len(body.get("scores", [])) == 1, "%s %s" % (code, body))
    finally:
        S.stop()


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_score: %s not built" % sc.GLM)
        return 0
    tmp = tempfile.mkdtemp(prefix="glmtrain-serve-score-")
    try:
        glm1_cases(tmp)
        os.makedirs(os.path.join(tmp, "glm3"))
        glm3_cases(os.path.join(tmp, "glm3"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
