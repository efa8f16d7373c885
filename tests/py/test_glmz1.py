#!/usr/bin/env python3
"""GLM-Z1's reasoning template (`--template glmz1`, LLaMA-Factory's glmz1: its glm4 template with
the ReasoningTemplate class), on a GLM-4-style tokenizer.json whose added tokens go on with
<think> and </think> as text tokens ("special": false, as later GLM releases have them):

  - decoding keeps those added tokens (Hugging Face's skip_special_tokens drops only the special
    ones), equal to the tokenizers library's decode;
  - training examples equal a Python re-implementation of LLaMA-Factory's encode_multiturn +
    supervised processing (written here from its definition, on the tokenizers library's encode,
    which splits added tokens out of text): an answer without thought words gets the empty thought
    "<think>\\n\\n</think>\\n\\n" as targets before it (--enable_thinking true), or every answer's
    thoughts removed and the empty thought put in the source (false); --cutoff_len cuts the
    (source, target) pairs by LLaMA-Factory's infer_seqlen, so the empty thought counts with the
    source when thinking is off;
  - `train --template glmz1` runs; generate, the evaluation prompts of --input_file records and
    serve send earlier answers back without their thoughts, and with thinking off end the prompt
    in the empty thought (serve: per request by chat_template_kwargs.enable_thinking too);
  - --template glmz1 on a tokenizer that is not GLM-4's is refused.
Prints PASS/FAIL/SKIP lines."""
import json, os, re, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mpi_runs import ENV, GLM, report, run  # noqa: E402

BUILD = os.environ.get("GLM_BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_chatglm23")
THINK = "<think>\n\n</think>\n\n"


def remove_thought(s):
    """LLaMA-Factory's remove_thought."""
    return re.sub(r"<think>(.*?)</think>", "", s, flags=re.DOTALL).lstrip("\n")


def has_words(s):
    return "<think>" in s or "</think>" in s


def infer_seqlen(source_len, target_len, cutoff_len):
    import chatglm3_data_ref as D
    return D.infer_seqlen(source_len, target_len, cutoff_len)


def lf_example(conv, encode, eos, enable_thinking, cutoff=0, mask_history=False):
    """LLaMA-Factory's glmz1 (format_prefix "[gMASK]<sop>", system "<|system|>\\n{c}", user
    "<|user|>\\n{c}<|assistant|>", assistant "\\n{c}", observation "<|observation|>\\n{c}<|assistant|>",
    each slot encoded on its own) through ReasoningTemplate.encode_multiturn and its supervised
    processor with efficient_eos: each pair's source labelled eos at its first token (the token
    after the answer before it) and -100 elsewhere, the target labelled, eos appended and labelled.
    Two departures, both glmtrain's: the first token's label is -100 (the shift never reads it), and
    eos is GLM-4's closing <|user|> (finetune.py's "EOS for chat", what glmtrain's GLM-4 examples end in)."""
    msgs = [dict(m) for m in conv]
    system = msgs.pop(0)["content"] if msgs[0]["role"] == "system" else ""
    if not enable_thinking:
        for i in range(1, len(msgs), 2):
            msgs[i]["content"] = remove_thought(msgs[i]["content"])
    enc = []
    for i, m in enumerate(msgs):
        slots = (["[gMASK]<sop>"] + (["<|system|>\n" + system] if system else [])) if i == 0 else []
        slots.append({"user": "<|user|>\n%s<|assistant|>", "assistant": "\n%s",
                      "observation": "<|observation|>\n%s<|assistant|>"}[m["role"]] % m["content"])
        enc.append(sum((encode(s) for s in slots), []))
    for i in range(0, len(msgs), 2):
        if not has_words(msgs[i + 1]["content"]):
            if enable_thinking:
                enc[i + 1] = encode(THINK) + enc[i + 1]
            else:
                enc[i] = enc[i] + encode(THINK)
    pairs = [(enc[k], enc[k + 1]) for k in range(0, len(enc), 2)]
    if mask_history:  # the last pair first, each put in front of those after it; its answer alone trains
        pairs = pairs[::-1]
    ids, labels, total = [], [], 1
    for k, (src, tgt) in enumerate(pairs):
        if cutoff:
            if total >= cutoff:
                break
            s, t = infer_seqlen(len(src), len(tgt), cutoff - total)
            src, tgt = src[:s], tgt[:t]
            total += s + t
        sl, tl = [eos] + [-100] * (len(src) - 1), ([-100] * len(tgt) if mask_history and k else tgt)
        ids, labels = (src + tgt + ids, sl + tl + labels) if mask_history else (ids + src + tgt, labels + sl + tl)
    labels[0] = -100
    return ids + [eos], labels + [eos]


def make_tokenizer(d):
    import test_glm_hf as H
    tdir, tk, n, _ = H.make_tokenizer(d)
    j = json.load(open(os.path.join(tdir, "tokenizer.json")))
    extra = ["<|begin_of_audio|>", "<|end_of_audio|>", "<think>", "</think>"]
    j["added_tokens"] += [{"id": n + len(H.SPECIALS) + i, "content": t, "single_word": False, "lstrip": False,
                           "rstrip": False, "normalized": False, "special": t[0] != "<" or "|" in t}
                          for i, t in enumerate(extra)]
    z1 = os.path.join(d, "z1tok")
    os.makedirs(z1, exist_ok=True)
    json.dump(j, open(os.path.join(z1, "tokenizer.json"), "w"))
    # a chat template that handles thoughts, as GLM-Z1's does (a sketch of one, not its text)
    json.dump({"chat_template": "[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content.split('</think>')[-1] }}"
                                "{% endfor %}<|assistant|>"}, open(os.path.join(z1, "tokenizer_config.json"), "w"))
    from tokenizers import Tokenizer
    return z1, Tokenizer.from_file(os.path.join(z1, "tokenizer.json")), n, H.SPECIALS + extra


RECORDS = [
    [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！有什么可以帮你？"}],
    [{"role": "system", "content": "简短回答"}, {"role": "user", "content": "1+1=?"},
     {"role": "assistant", "content": "<think>\n一加一等于二。\n</think>\n\n2"}],
    [{"role": "user", "content": "第一问"}, {"role": "assistant", "content": "<think>想想</think>答一"},
     {"role": "user", "content": "第二问"}, {"role": "assistant", "content": "答二"}],
    [{"role": "user", "content": "北京天气"}, {"role": "assistant", "content": "{\"city\": \"北京\"}"},
     {"role": "observation", "content": "{\"temperature\": 20}"},
     {"role": "assistant", "content": "<think>20 度不冷</think>\n\n北京 20 度"}],
]


def check_decode(tdir, tk, n, specials):
    think, close = n + specials.index("<think>"), n + specials.index("</think>")
    ids = [n + specials.index("<|user|>")] + tk.encode("a", add_special_tokens=False).ids + [think] + \
        tk.encode("\n想\n", add_special_tokens=False).ids + [close, n + specials.index("<|endoftext|>")]
    p = subprocess.run([GLM, "tokenize", "--tokenizer", tdir, "--decode", " ".join(map(str, ids))], capture_output=True,
                       text=True, timeout=60, env=ENV)
    want = tk.decode(ids, skip_special_tokens=True)
    report("glmz1_decode_keeps_text_added_tokens", p.returncode == 0 and p.stdout.rstrip("\n") == want and "<think>" in want,
           "glmtrain %r, tokenizers %r %s" % (p.stdout, want, p.stderr[-200:]))


def check_examples(d, tdir, tk, n, specials):
    data = os.path.join(d, "z1.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps({"messages": r}, ensure_ascii=False) + "\n")
    encode = lambda s: tk.encode(s, add_special_tokens=False).ids  # noqa: E731
    eos = n + specials.index("<|user|>")
    for think in (True, False):
        for cut, mask in ((0, False), (24, False), (30, True)):
            want = [lf_example(r, encode, eos, think, cut, mask) for r in RECORDS]
            args = [TOOL, "examples", "--tokenizer", tdir, "--train_file", data, "--template", "glmz1",
                    "--enable_thinking", "true" if think else "false", "--conversation_labels", "eos",
                    "--max_source_length", "1000", "--max_target_length", "1000"] + (["--cutoff_len", str(cut)] if cut else []) + (
                   ["--mask_history"] if mask else [])
            p = subprocess.run(args, capture_output=True, text=True, timeout=120)
            got = [json.loads(l) for l in p.stdout.splitlines()][:-1] if p.returncode == 0 else None
            got = None if got is None else [(g["ids"], g["labels"]) for g in got]
            detail = p.stderr[-300:] if got is None else "%d examples, reference %d" % (len(got), len(want))
            if got is not None and got != want and len(got) == len(want):
                i = next(k for k in range(len(got)) if got[k] != want[k])
                detail = "record %d: glmtrain %s / %s, reference %s / %s" % (i, got[i][0], got[i][1], *want[i])
            report("glmz1_examples_equal_llamafactory_thinking_%s%s%s" % ("on" if think else "off", "_cutoff_%d" % cut if cut else "",
                                                                        "_mask_history" if mask else ""),
                   got == want, detail)
    # the empty thought is a target with thinking on and prompt with it off: the difference shows
    # in the labels alone, not in the ids (record 0 has no thought of its own)
    th = encode(THINK)
    on, off = (lf_example(RECORDS[0], encode, eos, t) for t in (True, False))
    k = next(i for i in range(len(on[0])) if on[0][i:i + len(th)] == th)
    report("glmz1_reference_places_the_thought", on[0] == off[0] and on[1][k:k + len(th)] == th and
           off[1][k:k + len(th)] == [-100] * len(th), "at %d" % k)
    return data, eos, th


def prompt_of(stderr):
    tag = "[debug] prompt ids (row 0):"
    return next(([int(x) for x in l[len(tag):].split()] for l in stderr.splitlines() if l.startswith(tag)), None)


def check_cli(d, tdir, tk, n, specials, data, th):
    sid = {s: n + i for i, s in enumerate(specials)}
    encode = lambda s: tk.encode(s, add_special_tokens=False).ids  # noqa: E731
    from test_glm4_cli import write_config
    cfg_path = write_config(d, (n + len(specials) + 63) // 64 * 64, sid, seq_length=512)
    out = os.path.join(d, "out")
    p = run(["--init_from_config", cfg_path, "--tokenizer_name", tdir, "--train_file", data, "--template", "glmz1",
             "--enable_thinking", "false", "--learning_rate", "1e-2", "--logging_steps", "1", "--seed", "7",
             "--disable_tqdm", "--report_to", "none", "--max_steps", "2", "--save_steps", "2", "--output_dir", out,
             "--per_device_train_batch_size", "2"], timeout=300, check=False)
    report("glmz1_train_runs", p.returncode == 0 and os.path.isfile(os.path.join(out, "config.json")), p.stderr[-300:])
    gen = [GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tdir, "--do_sample", "false",
           "--max_new_tokens", "2", "--debug", "--template", "glmz1"]
    base = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + encode("\n你好") + [sid["<|assistant|>"]]
    # the folder's chat template writes thoughts: a run without --template glmz1 says to give it
    said = []
    for extra in ([], ["--template", "glmz1"]):
        p = subprocess.run([g for g in gen if g not in ("--template", "glmz1")] + extra + ["--prompt", "你好"],
                           capture_output=True, text=True, timeout=120, env=ENV)
        said.append(p.returncode == 0 and "give --template glmz1" in p.stderr)
    report("glmz1_template_with_thoughts_noticed", said == [True, False], str(said))
    for think in ("true", "false"):
        p = subprocess.run(gen + ["--prompt", "你好", "--enable_thinking", think], capture_output=True, text=True, timeout=120, env=ENV)
        want = base + (th if think == "false" else [])
        report("glmz1_generate_prompt_thinking_%s" % ("on" if think == "true" else "off"), prompt_of(p.stderr) == want,
               "glmtrain %s, reference %s %s" % (prompt_of(p.stderr), want, p.stderr[-300:] if p.returncode else ""))
    # chat: the first turn's prompt, thinking off
    p = subprocess.run([GLM, "chat", "--model_name_or_path", out, "--tokenizer_name", tdir, "--do_sample", "false",
                        "--max_new_tokens", "2", "--debug", "--template", "glmz1", "--enable_thinking", "false"],
                       input="你好\nexit\n", capture_output=True, text=True, timeout=120, env=ENV)
    line = next((l for l in p.stderr.splitlines() if l.startswith("[debug] prompt (")), "")
    report("glmz1_chat_prompt_thinking_off", line.startswith("[debug] prompt (%d tokens)" % (len(base) + len(th))) and
           line.endswith("<think>\\n\\n</think>\\n\\n"), line + p.stderr[-200:])
    # --input_file: an alpaca record's history answer goes back without its thought; a conversation's
    # evaluation prompt (its earlier answer too), thinking off
    inp = os.path.join(d, "in.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"instruction": "再问", "output": "x", "history": [["先问", "<think>嗯</think>\n\n先答"]]},
                           ensure_ascii=False) + "\n")
    p = subprocess.run(gen + ["--input_file", inp, "--enable_thinking", "false", "--output_file", os.path.join(d, "o.jsonl")],
                       capture_output=True, text=True, timeout=120, env=ENV)
    want = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + encode("\n先问") + [sid["<|assistant|>"]] + encode("\n先答") + \
        [sid["<|user|>"]] + encode("\n再问") + [sid["<|assistant|>"]] + th
    report("glmz1_generate_history_without_thoughts", prompt_of(p.stderr) == want,
           "glmtrain %s, reference %s %s" % (prompt_of(p.stderr), want, p.stderr[-300:] if p.returncode else ""))
    conv = os.path.join(d, "conv.jsonl")
    with open(conv, "w", encoding="utf-8") as f:
        f.write(json.dumps({"messages": RECORDS[2]}, ensure_ascii=False) + "\n")
    p = subprocess.run(gen + ["--input_file", conv, "--enable_thinking", "false", "--output_file", os.path.join(d, "o2.jsonl")],
                       capture_output=True, text=True, timeout=120, env=ENV)
    tag = "[debug] prompt ids (row 1):"
    got = next(([int(x) for x in l[len(tag):].split()] for l in p.stderr.splitlines() if l.startswith(tag)), None)
    want = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + encode("\n第一问") + [sid["<|assistant|>"]] + encode("\n答一") + \
        [sid["<|user|>"]] + encode("\n第二问") + [sid["<|assistant|>"]] + th
    report("glmz1_eval_turn_prompt", got == want, "glmtrain %s, reference %s %s" % (got, want, p.stderr[-300:] if p.returncode else ""))
    # serve: an assistant message's thought is not sent back; chat_template_kwargs per request
    from serve_common import Server, http, prompt_ids
    s = Server(out, "--tokenizer_name", tdir, "--template", "glmz1", "--debug", "--max_new_tokens", "2")
    try:
        msgs = [{"role": "user", "content": "先问"}, {"role": "assistant", "content": "<think>嗯</think>\n\n先答"},
                {"role": "user", "content": "再问"}]
        hist = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + encode("\n先问") + [sid["<|assistant|>"]] + encode("\n先答") + \
            [sid["<|user|>"]] + encode("\n再问") + [sid["<|assistant|>"]]
        for kw, tail in ((None, []), ({"enable_thinking": False}, th)):
            before = len(s.log)
            body = {"messages": msgs, "max_tokens": 2, "temperature": 0}
            if kw:
                body["chat_template_kwargs"] = kw
            st, r = http(s.port, "POST", "/v1/chat/completions", body)
            got = prompt_ids(s, before)
            report("glmz1_serve_prompt%s" % ("_thinking_off" if kw else ""), st == 200 and got == hist + tail,
                   "status %s, glmtrain %s, reference %s" % (st, got, hist + tail))
        st, r = http(s.port, "POST", "/v1/chat/completions", dict(body, chat_template_kwargs={"enable_thinking": "no"}))
        report("glmz1_serve_bad_kwarg_refused", st == 400 and "enable_thinking" in json.dumps(r), "%s %s" % (st, r))
    finally:
        s.stop()


def check_reasoning_content(d, tdir, n, specials):
    """A tiny model taught one answer with a thought (its records all the same) answers with it;
    serve then sends the thought as reasoning_content and the rest as content, whole and streamed
    (the deltas of each joined), as vLLM's and DeepSeek's APIs do."""
    from test_glm4_cli import write_config
    sid = {s_: n + i for i, s_ in enumerate(specials)}
    data = os.path.join(d, "one.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(16):
            f.write(json.dumps({"messages": [{"role": "user", "content": "你好"},
                                             {"role": "assistant", "content": "<think>想</think>\n\n好"}]},
                               ensure_ascii=False) + "\n")
    os.makedirs(os.path.join(d, "one"), exist_ok=True)
    cfg_path = write_config(os.path.join(d, "one"), (n + len(specials) + 63) // 64 * 64, sid, seq_length=512)
    out = os.path.join(d, "taught")
    p = run(["--init_from_config", cfg_path, "--tokenizer_name", tdir, "--train_file", data, "--template", "glmz1",
             "--conversation_labels", "eos", "--learning_rate", "1e-2", "--seed", "7", "--disable_tqdm", "--report_to", "none",
             "--max_steps", "60", "--save_strategy", "no", "--output_dir", out, "--per_device_train_batch_size", "16",
             "--lr_scheduler_type", "constant"], timeout=300, check=False)
    g = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tdir, "--prompt", "你好",
                        "--do_sample", "false", "--max_new_tokens", "12", "--template", "glmz1"], capture_output=True, text=True,
                       timeout=120, env=ENV)
    taught = p.returncode == 0 and "<think>想</think>" in g.stdout and g.stdout.rstrip().endswith("好")
    report("glmz1_taught_model_answers_with_its_thought", taught, "%r %s" % (g.stdout, (p.stderr + g.stderr)[-300:]))
    if not taught:
        return
    from serve_common import Server, http
    s = Server(out, "--tokenizer_name", tdir, "--template", "glmz1", "--max_new_tokens", "12")
    try:
        body = {"messages": [{"role": "user", "content": "你好"}], "temperature": 0}
        st, r = http(s.port, "POST", "/v1/chat/completions", body)
        m = r["choices"][0]["message"] if st == 200 else {}
        report("glmz1_serve_reasoning_content", m.get("reasoning_content") == "想" and m.get("content") == "好",
               "%s %s" % (st, m))
        import openai
        c = s.client()
        parts = {"reasoning_content": "", "content": ""}
        for ch in c.chat.completions.create(model=r.get("model", "x"), messages=body["messages"], temperature=0, stream=True):
            delta = ch.choices[0].delta if ch.choices else None
            for k in parts:
                v = getattr(delta, k, None) if delta is not None else None
                if v is None and delta is not None and getattr(delta, "model_extra", None):
                    v = delta.model_extra.get(k)
                parts[k] += v or ""
        report("glmz1_serve_reasoning_content_streamed", parts == {"reasoning_content": "想", "content": "好"}, str(parts))
        # thinking off for one request: the prompt ends in the empty thought, so no thought comes back
        st, r = http(s.port, "POST", "/v1/chat/completions", dict(body, chat_template_kwargs={"enable_thinking": False}))
        m = r["choices"][0]["message"] if st == 200 else {}
        report("glmz1_serve_thinking_off_no_reasoning_content", st == 200 and "reasoning_content" not in m, "%s %s" % (st, m))
    finally:
        s.stop()


def check_refused(d):
    from serve_common import make_model
    os.makedirs(os.path.join(d, "v1"), exist_ok=True)
    model, _, _ = make_model(os.path.join(d, "v1"))
    p = subprocess.run([GLM, "generate", "--model_name_or_path", model, "--prompt", "q", "--template", "glmz1", "--device", "cpu"],
                       capture_output=True, text=True, timeout=60, env=ENV)
    report("glmz1_other_tokenizer_refused", p.returncode != 0 and "--template glmz1" in p.stderr and "ChatGLM-6B" in p.stderr,
           p.stderr[-300:])


def main():
    import test_glm_hf as H
    if not H.use_transformers_446("glmz1", [GLM, TOOL]):
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-glmz1-")
    try:
        tdir, tk, n, specials = make_tokenizer(d)
        check_decode(tdir, tk, n, specials)
        data, eos, th = check_examples(d, tdir, tk, n, specials)
        check_cli(d, tdir, tk, n, specials, data, th)
        check_reasoning_content(d, tdir, n, specials)
        check_refused(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
