#!/usr/bin/env python3
"""glmtrain's ChatGLM2-6B / ChatGLM3-6B tokenizers against chatglm23_tok_ref.py (THUDM's
tokenization_chatglm.py over python3-sentencepiece) on a SentencePiece model trained here in the
real file's layout: ids (Hugging Face's encode, SPTokenizer.encode, with and without [gMASK] sop),
pieces and decoded text on >= 10,000 lines and multi-line texts (Chinese, English, code, "\\n",
space runs, emoji, empty), pieces spelled like specials ("sop"), build_inputs of pairs, decoding of
id lists with the specials in them, ChatGLM3's specials from text only with encode_special_tokens,
how ChatGLM2 and ChatGLM3 folders are told apart, and the chat prompts (ChatGLM2's build_prompt,
ChatGLM3's build_chat_input with a system turn, round dropping), stop ids and response text.
The golden ids of spec 13 need the real tokenizer.model (GLM_CHATGLM2_TOKENIZER or
../shared/tokenizers/chatglm2-6b): those checks SKIP without it."""
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


def tool23(args, inputs=None):
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs).encode() if inputs is not None else None
    p = subprocess.run([TOOL23] + args, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("tool_chatglm23 %s: %s" % (" ".join(args), p.stderr.decode(errors="replace")[-500:]))
    return [json.loads(l) for l in p.stdout.decode().splitlines()]


def first_diff(name, inputs, ref, mine):
    if len(ref) != len(mine):
        return C.check(name, False, "%d reference outputs vs %d" % (len(ref), len(mine)))
    for i, (a, b) in enumerate(zip(ref, mine)):
        if a != b:
            return C.check(name, False, "input %d %r: reference %r, glmtrain %r" % (i, inputs[i], a, b))
    return C.check(name, True)


def texts(lines):
    """Single-line texts (valid UTF-8 only: the Python tokenizer takes str) and multi-line ones."""
    out = []
    for l in lines:
        try:
            out.append(l.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    rng = random.Random(23)
    multi = [tc.random_text(rng, rng.randint(0, 50), newlines=True).decode("utf-8", "replace") for _ in range(1500)]
    multi += ["", "\n", "\n\n", " ", "  ", "   x", "x   ", "a\n b", "你好", "[Round 1]\n\n问：你好\n\n答：", "👋", "👋🏽 emoji ✨",
              "def main():\n    print('hello world')\t# greeting", "zzsop qeop sopsop isop", "sop", "eop", " sop",
              "<|user|>", "[gMASK]sop", "<|assistant|>\nhi<|observation|>", "x<|system|>y", "<s></s><unk>", "\t\t"]
    return out, multi


def ids_of(args, xs):
    return tc.tool_ids(args + ["--json_input"], [json.dumps(x).encode() for x in xs])


def check_encode(name, folder, ref, xs, multi):
    """Hugging Face's encode (with and without [gMASK] sop), SPTokenizer.encode and the pieces."""
    first_diff(name + "_ids (%d lines)" % len(xs), xs, [ref.encode(x) for x in xs],
               tc.tool_ids(["--tokenizer", folder], [x.encode() for x in xs]))  # lines as they are: NUL, \r
    first_diff(name + "_ids_multiline", multi, [ref.encode(x) for x in multi], ids_of(["--tokenizer", folder], multi))
    first_diff(name + "_ids_no_special", multi, [ref.encode(x, add_special_tokens=False) for x in multi],
               ids_of(["--tokenizer", folder, "--no_special_tokens"], multi))
    first_diff(name + "_sp_encode", multi, [ref.sp_encode(x) for x in multi],
               ids_of(["--tokenizer", folder, "--spm", "--threads", "2"], multi))
    mine = [j["pieces"] for j in tc.tool_json(["--tokenizer", folder, "--pieces", "--no_special_tokens", "--json_input"],
                                              [json.dumps(x).encode() for x in multi])]
    first_diff(name + "_pieces", multi, [ref.tokenize(x) for x in multi], mine)


def check_decode(name, folder, ref, xs):
    """decode of encodings and of random id lists holding specials, pad/unk, bos, eos and bytes."""
    rng = random.Random(5)
    lists = [ref.encode(x) for x in xs]
    v = ref.vocab_size
    for _ in range(1500):
        lists.append([rng.choice([rng.randrange(v), rng.randrange(ref.sp.vocab_size(), v), rng.randrange(3), rng.randrange(3, 259),
                                  rng.randrange(259, ref.sp.vocab_size())]) for _ in range(rng.randint(0, 12))])
    got = [j["text"] for j in tc.tool_json(["--tokenizer", folder, "--decode_lines"], [" ".join(map(str, l)).encode() for l in lists])]
    first_diff(name + "_decode (%d id lists)" % len(lists), lists, [ref.decode(l) for l in lists], got)


def check_pairs(name, folder, ref, multi):
    pairs = [[multi[i], multi[-1 - i] if i % 3 else None] for i in range(0, len(multi), 7)]
    want = [{"ids": ref.build_inputs_with_special_tokens(ref.encode(a, False), None if b is None else ref.encode(b, False))}
            for a, b in pairs]
    first_diff(name + "_build_inputs", pairs, want, tool23(["pair", "--tokenizer", folder], pairs))


def check_detection(tmp, model, R):
    """What tells the two apart: tokenization_chatglm.py (its special list) first, else
    tokenizer_config.json's name_or_path or chat_template, else ChatGLM3."""
    py2 = 'special_tokens = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop"]\n'
    py3 = ('role_special_tokens = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]\n'
           'special_tokens = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop"] + role_special_tokens\n')
    bare = {k: v for k, v in R.CONFIG_V2.items() if k != "name_or_path"}
    cases = [("config_chatglm2", R.CONFIG_V2, None, 5), ("config_chatglm3", R.CONFIG_V3, None, 9),
             ("config_codegeex2", dict(R.CONFIG_V2, name_or_path="THUDM/codegeex2-6b"), None, 5),
             ("chat_template_only", dict(bare, chat_template="{% for message in messages %}<|{{ message['role'] }}|>{% endfor %}"), None, 9),
             ("no_name_default_chatglm3", bare, None, 9), ("py_v3_beats_name", R.CONFIG_V2, py3, 9),
             ("py_v2_beats_name", R.CONFIG_V3, py2, 5)]
    n = R.ChatGLM2Tokenizer(model).sp.vocab_size()
    for name, cfg, py, extra in cases:
        folder = R.write_folder(os.path.join(tmp, "det_" + name), model, cfg, py)
        info = tool23(["info", "--tokenizer", folder])[0]
        roles = [n + 5, n + 6, n + 7, n + 8] if extra == 9 else [-1] * 4
        C.check("chatglm23_detect_" + name, info["kind"] == 2 and info["vocab"] == n + extra and info["roles"] == roles
                and info["layout"] == ("ChatGLM3-6B" if extra == 9 else "ChatGLM2-6B"), "got %s" % info)
    # a tokenizer.model given as a file picks up the config (and .py) next to it
    f = os.path.join(tmp, "det_py_v3_beats_name", "tokenizer.model")
    info = tool23(["info", "--tokenizer", f])[0]
    C.check("chatglm23_detect_model_file", info["vocab"] == n + 9, "got %s" % info)


def check_chat(folder2, folder3, ref2, ref3):
    rng = random.Random(77)
    pool = ["你好", "晚上睡不着应该怎么办", "Hello, who are you?", "line one\nline two", "  spaced  ", "👋", "", "sop eop",
            "写一首关于春天的诗", "What is 2+2?"]
    cases = []
    for _ in range(60):
        h = [[rng.choice(pool), rng.choice(pool)] for _ in range(rng.randint(0, 3))]
        cases.append({"query": rng.choice(pool), "history": h})
    want2 = [{"ids": ref2.encode(ref2.build_prompt(c["query"], c["history"])), "dropped": 0,
              "prompt": ref2.build_prompt(c["query"], c["history"])} for c in cases]
    first_diff("chatglm2_chat_build_prompt", cases, want2, tool23(["chat", "--tokenizer", folder2], cases))
    for c in cases[::2]:
        c["system"] = rng.choice(["You are ChatGLM3.", "你是一个助手。", ""])
    def hist3(c):
        h = [{"role": "system", "content": c["system"]}] if "system" in c else []
        for q, r in c["history"]:
            h += [{"role": "user", "content": q}, {"role": "assistant", "metadata": "", "content": r}]
        return h
    want3 = [ref3.build_chat_input(c["query"], hist3(c)) for c in cases]
    got3 = tool23(["chat", "--tokenizer", folder3], cases)
    first_diff("chatglm3_chat_build_chat_input", cases, want3, [g.get("ids") for g in got3])
    C.check("chatglm3_chat_prompt_text", got3[0]["prompt"] == ref3.decode(want3[0]), "got %r" % got3[0]["prompt"])
    # the oldest rounds go first when the prompt is too long; ChatGLM3's system turn stays
    c = {"query": "最后的问题", "history": [["第一轮问题很长" * 5, "回答" * 5], ["第二轮", "回答二"], ["第三轮", "回答三"]],
         "system": "系统提示"}
    for skip in range(4):
        full = ref3.build_chat_input(c["query"], hist3(dict(c, history=c["history"][skip:])))
        if skip == 0:
            limit = len(full) - 1
        elif len(full) <= limit:
            break
    got = tool23(["chat", "--tokenizer", folder3], [dict(c, max_prompt=limit)])[0]
    C.check("chatglm3_chat_drops_oldest_rounds", got.get("ids") == full and got.get("dropped") == skip,
            "got %s, want %d rounds dropped" % (got, skip))
    got = tool23(["chat", "--tokenizer", folder3], [dict(c, max_prompt=5)])[0]
    C.check("chatglm3_chat_too_long_refused", "error" in got and "at most 5 fit" in got["error"], "got %s" % got)
    # stop ids: model.chat's eos_token_id list
    i2, i3 = tool23(["info", "--tokenizer", folder2])[0], tool23(["info", "--tokenizer", folder3])[0]
    C.check("chatglm23_stop_ids", i2["stop"] == [ref2.eos_token_id] and i3["stop"] == ref3.stop_ids(), "%s %s" % (i2, i3))
    # response text: strip + [[训练时间]], no ChatGLM-6B punctuation widening
    resp = ["  你好,世界!  ", "[[训练时间]]训练的", "\n答案: 是的?\n"]
    ids = [ref3.encode(r, add_special_tokens=False) for r in resp]
    want = [{"text": ref3.decode(i).strip().replace("[[训练时间]]", "2023年")} for i in ids]
    first_diff("chatglm3_response_text", resp, want, tool23(["response", "--tokenizer", folder3], ids))


def check_golden():
    """Spec 13's ids of the real tokenizer.model (not in this repository)."""
    cands = [os.environ.get("GLM_CHATGLM2_TOKENIZER", ""), os.path.join(tc.REPO, "..", "shared", "tokenizers", "chatglm2-6b"),
             os.path.join(tc.REPO, "..", "shared", "tokenizers", "chatglm3-6b")]
    path = next((c for c in cands if c and os.path.isfile(os.path.join(c, "tokenizer.model"))), None)
    names = ["chatglm2_golden_nihao", "chatglm2_golden_round1", "chatglm3_golden_chat_input"]
    if not path:
        for n in names:
            C.skip(n, "the real ChatGLM2/3 tokenizer.model is not here (set GLM_CHATGLM2_TOKENIZER to its folder)")
        return
    import chatglm23_tok_ref as R
    tmp = tempfile.mkdtemp(prefix="glm_gold_")
    try:
        model = os.path.join(path, "tokenizer.model")
        f2 = R.write_folder(os.path.join(tmp, "v2"), model, R.CONFIG_V2)
        f3 = R.write_folder(os.path.join(tmp, "v3"), model, R.CONFIG_V3)
        got = ids_of(["--tokenizer", f2], ["你好", "[Round 1]\n\n问：你好\n\n答："])
        C.check(names[0], got[0] == [64790, 64792, 36474, 54591], "got %s" % got[0])
        C.check(names[1], got[1] == [64790, 64792, 790, 30951, 517, 30910, 30939, 30996, 13, 13, 54761, 31211, 39701, 13, 13,
                                     55437, 31211], "got %s" % got[1])
        got = tool23(["chat", "--tokenizer", f3], [{"query": "你好", "history": []}])[0]
        C.check(names[2], got.get("ids") == [64790, 64792, 64795, 30910, 13, 36474, 54591, 64796], "got %s" % got)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    try:
        import chatglm23_tok_ref as R
    except ImportError:
        C.skip("chatglm23_tok", "python3-sentencepiece is not installed")
        return 0
    if not shutil.which("spm_train"):
        C.skip("chatglm23_tok", "spm_train not found (Debian package sentencepiece)")
        return 0
    for t in (tc.TOOL, TOOL23):
        if not os.access(t, os.X_OK):
            C.check("chatglm23_tok_tools", False, "%s is missing (run make)" % t)
            return 1
    tmp = tempfile.mkdtemp(prefix="glm_tok23_")
    try:
        lines = tc.corpus(seed=2023)
        model = R.train_model(tmp, lines)
        ref2, ref3 = R.ChatGLM2Tokenizer(model), R.ChatGLM3Tokenizer(model)
        ref3s = R.ChatGLM3Tokenizer(model, encode_special_tokens=True)
        f2 = R.write_folder(os.path.join(tmp, "chatglm2"), model, R.CONFIG_V2)
        f3 = R.write_folder(os.path.join(tmp, "chatglm3"), model, R.CONFIG_V3)
        f3s = R.write_folder(os.path.join(tmp, "chatglm3_special"), model, dict(R.CONFIG_V3, encode_special_tokens=True))
        f2s = R.write_folder(os.path.join(tmp, "chatglm2_special"), model, dict(R.CONFIG_V2, encode_special_tokens=True))
        sp = ref2.sp
        C.check("chatglm23_model_layout", sp.id_to_piece(0) == "<unk>" and sp.id_to_piece(1) == "<s>" and sp.id_to_piece(2) == "</s>"
                and sp.id_to_piece(3) == "<0x00>" and sp.id_to_piece(258) == "<0xFF>" and sp.encode("：") != sp.encode(":"),
                "pieces 0..3: %s" % [sp.id_to_piece(i) for i in range(4)])
        xs, multi = texts(lines)
        # the HF path maps a piece spelled like a special to it: make sure the texts exercise that
        aliased = [x for x in multi if any(i in (ref2.special_tokens["sop"], ref2.special_tokens["eop"]) for i in ref2.encode(x, False))]
        C.check("chatglm23_sop_piece_exercised", sp.piece_to_id("sop") > 2 and len(aliased) > 0,
                "the trained model has no piece 'sop' or no text encodes to it")
        check_encode("chatglm2", f2, ref2, xs, multi)
        check_encode("chatglm3", f3, ref3, xs, multi)
        check_encode("chatglm3_encode_special", f3s, ref3s, xs[::4], multi)
        # encode_special_tokens is ChatGLM3's alone: ChatGLM2's tokenizer ignores the key
        first_diff("chatglm2_ignores_encode_special", multi, [ref2.encode(x) for x in multi], ids_of(["--tokenizer", f2s], multi))
        roles = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
        plain, split = ids_of(["--tokenizer", f3], roles), ids_of(["--tokenizer", f3s], roles)
        C.check("chatglm3_role_tokens_only_with_encode_special",
                all(ref3.special_tokens[r] not in p for r, p in zip(roles, plain)) and
                [s[2:] for s in split] == [[ref3.special_tokens[r]] for r in roles], "plain %s, split %s" % (plain, split))
        check_decode("chatglm2", f2, ref2, multi)
        check_decode("chatglm3", f3, ref3, multi)
        check_pairs("chatglm2", f2, ref2, multi)
        check_pairs("chatglm3", f3, ref3, multi)
        check_detection(tmp, model, R)
        check_chat(f2, f3, ref2, ref3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check_golden()
    return C.status()


if __name__ == "__main__":
    sys.exit(main())
