#!/usr/bin/env python3
"""glmtrain's ChatGLM2/3 training examples (tool_chatglm23 examples: reader -> example rules ->
tokenizer -> parallel encode -> cache) against chatglm3_data_ref.py on the tokenizers of
chatglm23_tok_ref.py (a SentencePiece model trained here):

- ChatGLM3 conversation records (finetune_demo's format: system with tools, user, assistant,
  observation turns, multi-turn, empty contents, "messages"/"from"/"value" spellings, a record-level
  system) with THUDM's and the EOS label convention, cut short by small lengths, with a
  source_prefix and train_on_prompt; alpaca/columns/sharegpt records as ChatGLM3 turns;
- ChatGLM2 ptuning examples from alpaca/columns/sharegpt records with history, systems, inputs,
  a source_prefix, small lengths, train_on_prompt;
- bad conversation records named by file:line; the cache key (labels convention); the tools dump
  (json.dumps(indent=4, ensure_ascii=False)) on raw JSON texts Python reads differently from cJSON.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import tokenizer_corpus as tc  # noqa: E402

C = harness.Checks()
TOOL23 = os.path.join(tc.REPO, harness.tool("tool_chatglm23")) if not os.path.isabs(harness.BUILD) else harness.tool("tool_chatglm23")

WORDS = ["你好", "晚上睡不着应该怎么办", "Hello world", "the weather", "  两个空格", "tab\there", "line\nbreak", "👋🏽", "sop", "eop",
         "数字 2023 年", "x", "", "“引号”", "<|user|>", "[gMASK]", "C'est la vie.", "\n", "3.14", "Привет"]


def text(rng, lo=0, hi=6):
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", "，", ". ", "\n"]) for _ in range(rng.randint(lo, hi)))


def json_value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.35:
        return rng.choice([0, 1, -7, 12345678901234567890, 1.0, -0.0, 0.1, 1e-7, 2.5e16, 123456.789, 1e100, True, False, None,
                           "温度", "a\"quote\\slash\n\t\u0001", "😀 emoji", "", "ünïcödé"])
    if r < 0.6:
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["name", "description", "parameters", "type", "required", "单位", "enum"]) + str(i): json_value(rng, depth + 1)
            for i in range(rng.randint(0, 4))}


def tools(rng):
    return [{"name": "get_weather_%d" % i, "description": text(rng, 1, 3),
             "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "城市"}, "extra": json_value(rng)},
                            "required": ["city"]}} for i in range(rng.randint(1, 2))]


def conversations(rng, n):
    recs = []
    for k in range(n):
        conv = []
        if rng.random() < 0.5:
            m = {"role": "system", "content": text(rng, 0, 3)}
            if rng.random() < 0.5:
                m["tools"] = tools(rng)
            conv.append(m)
        for _ in range(rng.randint(0, 4)):
            conv.append({"role": "user", "content": text(rng)})
            conv.append({"role": "assistant", "content": text(rng)})
            if rng.random() < 0.3:
                conv.append({"role": "observation", "content": json.dumps({"temp": rng.randint(-5, 30)}, ensure_ascii=False)})
                conv.append({"role": "assistant", "content": text(rng)})
        if rng.random() < 0.1:
            conv.append({"role": "user", "content": text(rng)})  # ends with a user turn
        recs.append({"conversations": conv})
    return recs


def instructions(rng, n):
    """{system?, query, input?, answer, history} records and their alpaca / columns / sharegpt files."""
    recs = []
    for _ in range(n):
        r = {"query": text(rng, 1, 4), "answer": text(rng, 1, 5), "history": [[text(rng, 1, 3), text(rng, 1, 3)] for _ in range(rng.randint(0, 2))]}
        if rng.random() < 0.3:
            r["system"] = text(rng, 1, 2)
        if rng.random() < 0.3:
            r["input"] = text(rng, 1, 2)
        if rng.random() < 0.05:
            r["answer"] = ""  # dropped: "if prompt and answer"
        recs.append(r)
    return recs


def as_alpaca(r):
    o = {"instruction": r["query"], "input": r.get("input", ""), "output": r["answer"], "history": r["history"]}
    if "system" in r:
        o["system"] = r["system"]
    return o


def as_sharegpt(r):
    conv = [{"from": "human", "value": q} if i % 2 == 0 else {"from": "gpt", "value": a}
            for q, a in r["history"] for i in (0, 1)]
    conv += [{"from": "human", "value": r["query"]}, {"from": "gpt", "value": r["answer"]}]
    o = {"conversations": conv}
    if "system" in r:
        o["system"] = r["system"]
    return o


def write_jsonl(path, recs, raw=()):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        for line in raw:
            f.write(line + "\n")
    return path


def run(args):
    p = subprocess.run([TOOL23, "examples"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")
    out = [json.loads(l) for l in p.stdout.decode().splitlines()]
    return out[:-1], out[-1]["summary"]


def compare(name, args, want):
    got, summary = run(args)
    if got is None:
        return C.check(name, False, summary[-400:])
    got = [(g["ids"], g["labels"]) for g in got]
    if len(got) != len(want):
        return C.check(name, False, "%d examples, reference %d (summary %s)" % (len(got), len(want), summary))
    for i, (a, b) in enumerate(zip(want, got)):
        if a != (list(b[0]), list(b[1])):
            j = next((k for k in range(min(len(a[0]), len(b[0]))) if a[0][k] != b[0][k] or a[1][k] != b[1][k]), None)
            return C.check(name, False, "example %d differs at token %s: reference ids %s labels %s, glmtrain ids %s labels %s"
                           % (i, j, a[0][:80], a[1][:80], b[0][:80], b[1][:80]))
    return C.check(name + " (%d examples)" % len(want), True)


def raw_tools_records():
    """Tools Python reads otherwise than cJSON: a repeated key, 1.0 vs 1, big ints, -0, 1E5, escapes."""
    return ['{"conversations": [{"role": "system", "content": "可用工具", "tools": [{"name": "f", "name": "g", "n": 1.0, '
            '"m": 1, "big": 123456789012345678901234567890, "z": -0, "e": 1E5, "s": "\\u00e9\\ud83d\\ude00\\/\\u0007", '
            '"d": {"k": 1, "k": [], "j": {}}}]}, {"role": "user", "content": "天气"}, {"role": "assistant", "content": "晴"}]}']


def check_conversations(tmp, f3, ref3, D):
    rng = random.Random(3)
    recs = conversations(rng, 150)
    recs.append({"messages": [{"role": "user", "content": "用 messages 写的"}, {"role": "assistant", "content": "好"}]})
    recs.append({"system": "记录级的系统提示", "conversations": [{"from": "human", "value": "sharegpt 写法"}, {"from": "gpt", "value": "是"}]})
    recs.append({"conversations": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]})  # empty contents
    recs.append({"conversations": []})  # dropped: empty
    raw = raw_tools_records()
    path = write_jsonl(os.path.join(tmp, "conv.jsonl"), recs, raw)
    convs = []
    for r in recs + [json.loads(x) for x in raw]:
        conv = r.get("conversations", r.get("messages"))
        conv = [{"role": {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("role")),
                 "content": m.get("value", m.get("content")), **({"tools": m["tools"]} if "tools" in m else {})} for m in conv]
        if r.get("system"):
            conv = [{"role": "system", "content": r["system"]}] + conv
        convs.append(conv)

    def want(S, T, labels="thudm", prefix="", top=False):
        out = []
        for conv in convs:
            conv = [dict(m) for m in conv]
            first = next((m for m in conv if m["role"] == "user"), None)
            if first is not None:
                first["content"] = prefix + first["content"]
            e = D.glm3_example(conv, ref3, S, T, labels, top)
            if e is not None:
                out.append(e)
        return out

    base = ["--tokenizer", f3, "--train_file", path, "--threads", "2"]
    compare("chatglm3_conversations_thudm", base, want(1024, 128))
    compare("chatglm3_conversations_eos", base + ["--conversation_labels", "eos"], want(1024, 128, "eos"))
    compare("chatglm3_conversations_truncated", base + ["--max_source_length", "20", "--max_target_length", "10"], want(20, 10))
    compare("chatglm3_conversations_truncated_eos", base + ["--max_source_length", "20", "--max_target_length", "10",
                                                           "--conversation_labels", "eos"], want(20, 10, "eos"))
    compare("chatglm3_conversations_prefix", base + ["--source_prefix", "前缀："], want(1024, 128, prefix="前缀："))
    compare("chatglm3_conversations_train_on_prompt", base + ["--train_on_prompt"], want(1024, 128, top=True))
    # --cutoff_len: LLaMA-Factory's pair-by-pair cut of the whole example, both label conventions
    for cut in (24, 61):
        for lab in ("thudm", "eos"):
            w = [e for e in (D.cut_conversation(D.glm3_example(c, ref3, 10 ** 6, 10 ** 6, lab), ref3, cut) for c in convs) if e]
            compare("chatglm3_conversations_cutoff_%d_%s" % (cut, lab), base + ["--cutoff_len", str(cut), "--conversation_labels", lab], w)
            w = [e for e in (D.cut_conversation(D.glm3_example(c, ref3, 10 ** 6, 10 ** 6, lab), ref3, cut, True,
                                                eos_marks=lab == "eos") for c in convs) if e]
            compare("chatglm3_conversations_mask_history_%d_%s" % (cut, lab),
                    base + ["--cutoff_len", str(cut), "--conversation_labels", lab, "--mask_history"], w)
    _, e = run(base + ["--mask_history"])
    C.check("mask_history_needs_cutoff_len", _ is None and "--cutoff_len" in e, e[-200:])
    # --default_system: a system turn first where a conversation has none (LLaMA-Factory's default_system)
    kept = list(convs)
    convs[:] = [c if c and c[0]["role"] == "system" else [{"role": "system", "content": "默认的系统提示"}] + c for c in kept]
    compare("chatglm3_conversations_default_system", base + ["--default_system", "默认的系统提示"], want(1024, 128))
    convs[:] = kept
    _, s = run(base)
    n_empty = sum(1 for c in convs if not c)
    n_none = sum(1 for c in convs if c and D.glm3_example(c, ref3, 1024, 128) is None)
    C.check("chatglm3_conversations_summary", s["records"] == len(convs) and s["empty"] == n_empty and s["no_answer_tokens"] == n_none,
            "summary %s, want %d records, %d empty, %d without targets" % (s, len(convs), n_empty, n_none))
    has_obs = any(m["role"] == "observation" for c in convs for m in c)
    has_tools = any("tools" in m for c in convs for m in c)
    C.check("chatglm3_conversations_cover", has_obs and has_tools and n_none > 0, "observation %s tools %s dropped %d" % (has_obs, has_tools, n_none))
    # the cache: a hit the second time, rebuilt when the label convention changes
    cache = ["--cache_dir", os.path.join(tmp, "cache")]
    a, s1 = run(base + cache)
    b, s2 = run(base + cache)
    c, s3 = run(base + cache + ["--conversation_labels", "eos"])
    # (the settings are in the cache file's name: another convention is another file)
    C.check("chatglm3_cache_key_has_labels", s1["cache"] == "built" and s2["cache"] == "hit" and s3["cache"] == "built"
            and a == b and c == [{"ids": i, "labels": l} for i, l in want(1024, 128, "eos")], "cache notes %s / %s / %s" % (s1["cache"], s2["cache"], s3["cache"]))


def check_instruction_records(tmp, f2, f3, ref2, ref3, D):
    rng = random.Random(9)
    recs = instructions(rng, 120)
    files = {"alpaca": [as_alpaca(r) for r in recs],
             "columns": [dict({"prompt": r["query"], "response": r["answer"], "history": r["history"]},
                              **({"system": r["system"]} if "system" in r else {})) for r in recs],
             "sharegpt": [as_sharegpt(r) for r in recs]}
    for fmt, rows in files.items():
        path = write_jsonl(os.path.join(tmp, fmt + ".jsonl"), rows)
        rs = recs if fmt == "alpaca" else [{k: v for k, v in r.items() if k != "input"} for r in recs]
        if fmt == "sharegpt":
            rs = [r for r in rs if r["answer"]]  # a sharegpt record keeps its turns; empty answers stay (as turns)
        base = ["--tokenizer", f2, "--train_file", path, "--format", fmt, "--threads", "2"]
        want = [e for e in (D.glm2_example(r, ref2, 1024, 128) for r in rs) if e]
        compare("chatglm2_%s_examples" % fmt, base, want)
        want = [e for e in (D.glm2_example(r, ref2, 24, 6, "提示：") for r in rs) if e]
        compare("chatglm2_%s_truncated_prefix" % fmt, base + ["--max_source_length", "24", "--max_target_length", "6",
                                                              "--source_prefix", "提示："], want)
        if fmt == "sharegpt":
            continue  # in ChatGLM3's conversation mode a sharegpt record is a conversation (checked above)
        want = [e for e in (D.glm3_example(D.record_turns(r), ref3, 1024, 128) for r in rs if (r["query"] or r.get("input")) and r["answer"]) if e]
        compare("chatglm3_%s_as_turns" % fmt, ["--tokenizer", f3, "--train_file", path, "--format", fmt], want)
    path = os.path.join(tmp, "alpaca.jsonl")
    want = [e for e in (D.glm2_example(r, ref2, 1024, 128, train_on_prompt=True) for r in recs) if e]
    compare("chatglm2_train_on_prompt", ["--tokenizer", f2, "--train_file", path, "--train_on_prompt"], want)
    want = [e for e in (D.glm3_example(D.record_turns(r, "P:"), ref3, 1024, 128, "eos") for r in recs
                        if (r["query"] or r.get("input")) and r["answer"]) if e]
    compare("chatglm3_alpaca_as_turns_eos_prefix", ["--tokenizer", f3, "--train_file", path, "--conversation_labels", "eos",
                                                    "--source_prefix", "P:"], want)
    for cut in (12, 40):  # --cutoff_len on ChatGLM2's prompt and answer
        want = [e for e in (D.glm2_example_cutoff(r, ref2, cut) for r in recs) if e]
        compare("chatglm2_alpaca_cutoff_%d" % cut, ["--tokenizer", f2, "--train_file", path, "--cutoff_len", str(cut)], want)
    ds = [dict(r, system=r.get("system") or "默认：") for r in recs]  # --default_system where a record has none
    want = [e for e in (D.glm2_example(r, ref2, 1024, 128) for r in ds) if e]
    compare("chatglm2_alpaca_default_system", ["--tokenizer", f2, "--train_file", path, "--default_system", "默认："], want)
    want = [e for e in (D.glm3_example(D.record_turns(r), ref3, 1024, 128) for r in ds
                        if (r["query"] or r.get("input")) and r["answer"]) if e]
    compare("chatglm3_alpaca_as_turns_default_system", ["--tokenizer", f3, "--train_file", path, "--default_system", "默认："], want)
    C.check("default_system_covers_records_with_and_without", any(r.get("system") for r in recs) and
            any(not r.get("system") for r in recs))
    got, err = run(["--tokenizer", f3, "--train_file", path, "--prompt_template", "{instruction}"])
    C.check("chatglm3_prompt_template_refused", got is None and "--prompt_template" in err and "ChatGLM3" in err, err[-300:])


def check_bad_records(tmp, f2, f3):
    good = '{"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
    cases = [("unknown_role", '{"conversations": [{"role": "tool", "content": "x"}]}', "conversations[0]: unknown role 'tool'"),
             ("missing_content", '{"conversations": [{"role": "user"}]}', "conversations[0] has no 'content'"),
             ("null_content", '{"conversations": [{"role": "user", "content": null}]}', "'content' is null"),
             ("not_a_list", '{"conversations": {"role": "user", "content": "x"}}', "field 'conversations' is an object, not a list"),
             ("turn_not_object", '{"conversations": ["hi"]}', "conversations[0] is a string, not an object"),
             ("tools_on_user", '{"conversations": [{"role": "user", "content": "x", "tools": []}]}', "conversations[0]: 'tools' on a turn"),
             ("top_level_tools", '{"tools": [], "conversations": [{"role": "user", "content": "x"}]}', "a top-level 'tools'")]
    # raw bytes that are not UTF-8 inside a system turn's tools (found by fuzz_json_records)
    cases.append(("tools_not_utf8", b'{"conversations": [{"role": "system", "content": "s", "tools": [{"name": "ge\x8c\x9fw"}]}, '
                  b'{"role": "user", "content": "q"}]}', "'tools' holds a string that is not valid UTF-8"))
    for name, line, why in cases:
        path = os.path.join(tmp, "bad_%s.jsonl" % name)
        with open(path, "wb") as f:
            f.write((good + "\n" + good + "\n").encode() + (line if isinstance(line, bytes) else line.encode()) + b"\n")
        got, err = run(["--tokenizer", f3, "--train_file", path])
        err = str(err)  # a summary (dict) when it wrongly read the file
        C.check("chatglm3_bad_" + name, got is None and ("%s:3:1:" % path) in err and why in err, err[-300:])
    # ChatGLM2 reads sharegpt as pairs: an observation turn is no role there
    path = os.path.join(tmp, "bad_glm2_observation.jsonl")
    with open(path, "w") as f:
        f.write('{"conversations": [{"role": "user", "content": "q"}, {"role": "observation", "content": "o"}]}\n')
    got, err = run(["--tokenizer", f2, "--train_file", path])
    C.check("chatglm2_bad_observation_role", got is None and ("%s:1:1:" % path) in err and "unknown role 'observation'" in err, err[-300:])


def check_pyjson():
    rng = random.Random(11)
    values = [json_value(rng) for _ in range(400)] + [tools(rng) for _ in range(50)]
    texts = [json.dumps(v, ensure_ascii=rng.random() < 0.5) for v in values]
    texts += ['{"a": 1, "a": 2, "b": {"c": 1.5e-7, "c": -0}}', '[1E5, 1e400, -1e-400, 0.00001, 0.0001, 1e16, 1e15, 123456789012345678]',
              '"\\ud83d\\ude00\\u00e9\\/\\b\\f\\u001f\\u007f"', '  [ ]  ', '{ }', '[[[]], {"x": [{}]}]', '-0.0', '12345678901234567890123']
    want = [json.dumps(json.loads(t), indent=4, ensure_ascii=False) for t in texts]
    p = subprocess.run([TOOL23, "pyjson"], input="".join(t + "\n" for t in texts).encode(), stdout=subprocess.PIPE, timeout=60)
    got = [json.loads(l).get("dump") for l in p.stdout.decode().splitlines()]
    bad = next((i for i in range(len(texts)) if i >= len(got) or got[i] != want[i]), None)
    C.check("chatglm3_tools_dump_is_pythons (%d values)" % len(texts), bad is None,
            "" if bad is None else "%r: python %r, glmtrain %r" % (texts[bad], want[bad], got[bad] if bad < len(got) else None))
    # what Python reads but no UTF-8 prompt can hold, and what Python's json refuses
    bad = ['["\\ud800"]', '[01]', '{"a": 1,}', '[1] 2', '"tab\there"']
    p = subprocess.run([TOOL23, "pyjson"], input="".join(t + "\n" for t in bad).encode(), stdout=subprocess.PIPE, timeout=60)
    got = [json.loads(l) for l in p.stdout.decode().splitlines()]
    C.check("chatglm3_tools_dump_refuses", len(got) == len(bad) and all("error" in g for g in got) and "surrogate" in got[0]["error"],
            "got %s" % got)


def main():
    try:
        import chatglm23_tok_ref as R
        import chatglm3_data_ref as D
    except ImportError:
        C.skip("chatglm23_data", "python3-sentencepiece is not installed")
        return 0
    if not shutil.which("spm_train"):
        C.skip("chatglm23_data", "spm_train not found (Debian package sentencepiece)")
        return 0
    if not os.access(TOOL23, os.X_OK):
        C.check("chatglm23_data_tool", False, "%s is missing (run make)" % TOOL23)
        return 1
    tmp = tempfile.mkdtemp(prefix="glm_data23_")
    try:
        model = R.train_model(tmp, tc.corpus(seed=2023))
        ref2, ref3 = R.ChatGLM2Tokenizer(model), R.ChatGLM3Tokenizer(model)
        f2 = R.write_folder(os.path.join(tmp, "chatglm2"), model, R.CONFIG_V2)
        f3 = R.write_folder(os.path.join(tmp, "chatglm3"), model, R.CONFIG_V3)
        check_pyjson()
        check_conversations(tmp, f3, ref3, D)
        check_instruction_records(tmp, f2, f3, ref2, ref3, D)
        check_bad_records(tmp, f2, f3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return C.status()


if __name__ == "__main__":
    sys.exit(main())
