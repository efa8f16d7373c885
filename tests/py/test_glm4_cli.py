#!/usr/bin/env python3
"""GLM-4-9B's architecture end to end on the CPU, with a GLM-4-style tokenizer built here (a
byte-level BPE trained on a small corpus, in the tiktoken rank-file format of GLM-4's
tokenizer.model, its 14 special tokens after the ranks):
  - training examples from conversation records equal a Python re-implementation of GLM-4's
    finetune_demo/finetune.py process_batch on PyPI tiktoken: [gMASK] <sop>, each turn
    <|role|> + encode(metadata + "\\n" + content) as its chat template tokenizes it (no turn for
    an empty content; a system turn's tools as the template's tools block, rendered the way
    transformers renders it: trim_blocks takes the first line end after each tool's block tag,
    tojson is json.dumps(ensure_ascii=False, indent=4); process_message's null properties
    dropped), <|user|> closing the conversation ("EOS for chat"), the loss marks of assistant
    turns shifted right by one;
  - `glmtrain train` on those records with a GLM-4 config.json (the ChatGLM2 block, its eos
    list): the loss falls;
  - `generate --prompt` builds the chat template's input ([gMASK] <sop> <|user|> "\\n" + query
    <|assistant|>).
The real GLM-4 tokenizer is not here; tests/py/test_tokenizer_glm4.py checks the encoder itself
against tiktoken. Prints PASS/FAIL/SKIP lines."""
import json, os, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T
from mpi_runs import ENV, GLM, losses, report, run
from test_generate import debug_ids

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
            "<|end_of_video|>"]


TOOLS_HEADER = ("你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，"
                "你的任务是针对用户的问题和要求提供适当的答复和支持。")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "查询城市的天气",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "description": "城市名"},
                                                "unit": None, "days": {"type": "integer", "maximum": 7.0}},
                                                "required": ["city"]}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


def write_config(d, vocab, sid, seq_length=1024):
    """A tiny GLM-4 config.json (THUDM's layout: the ChatGLM2 block, its eos list) in d; its path."""
    cfg = {"model_type": "chatglm", "padded_vocab_size": vocab, "hidden_size": 32, "num_layers": 2,
           "num_attention_heads": 4, "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2,
           "ffn_hidden_size": 48, "layernorm_epsilon": 1.5625e-07, "rmsnorm": True, "add_qkv_bias": True,
           "add_bias_linear": False, "apply_residual_connection_post_layernorm": False, "post_layer_norm": True,
           "original_rope": True, "rope_ratio": 500, "seq_length": seq_length, "tie_word_embeddings": False,
           "eos_token_id": [sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]],
           "pad_token_id": sid["<|endoftext|>"]}
    path = os.path.join(d, "config.json")
    json.dump(cfg, open(path, "w"))
    return path


def process_message(message):
    """finetune.py's process_message: a system turn's tools lose their null properties."""
    message = json.loads(json.dumps(message))
    if "tools" in message and message["role"] == "system":
        for tool in message["tools"]:
            props = tool["function"]["parameters"]["properties"]
            tool["function"]["parameters"]["properties"] = {k: v for k, v in props.items() if v is not None}
    elif "tools" in message:
        del message["tools"]
    return message


def template_turns(message):
    """glm-4-9b-chat's chat template for [message], after [gMASK] <sop>: (role token, text) pairs."""
    out = []
    if "tools" in message:
        text = "\n" + TOOLS_HEADER + "\n\n# 可用工具"
        for tool in message["tools"]:
            if tool["type"] == "function":
                fn = tool["function"]
                text += "\n## %s\n\n%s\n在调用上述函数时，请使用 Json 格式表示调用的参数。" % (
                    fn["name"], json.dumps(fn, ensure_ascii=False, indent=4))
        out.append(("<|system|>", text))
    if message.get("content"):
        out.append(("<|%s|>" % message["role"], message.get("metadata", "") + "\n" + message["content"]))
    return out


TOOL = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_chatglm23")


def test_tokenizer(skip_name):
    """Whether this test can run (else False after the SKIP line): tiktoken, regex, glmtrain and
    tool_chatglm23 are there."""
    try:
        import tiktoken  # noqa: F401
        import test_tokenizer_glm4  # noqa: F401
    except ImportError as e:
        print("SKIP %s: %s (scripts/install-deps.sh installs tiktoken and regex)" % (skip_name, e))
        return False
    if not os.path.exists(GLM) or not os.access(TOOL, os.X_OK):
        print("SKIP %s: glmtrain or tool_chatglm23 not built" % skip_name)
        return False
    return True


def make_tokenizer(d):
    """The GLM-4-style test tokenizer in d/tok (1500 merges on the seed-7 corpus): (its folder, the
    number of ranks, the special tokens' ids, tiktoken's Encoding of it)."""
    import tiktoken
    import test_tokenizer_glm4 as G
    import tokenizer_corpus as tc
    lines = [l.decode("utf-8", "ignore") for l in tc.corpus(seed=7)[:3000]]
    ranks = G.train(lines, 1500)
    tok = G.write_model(os.path.join(d, "tok"), ranks)
    n = len(ranks)
    sid = {s: n + i for i, s in enumerate(SPECIALS)}
    return tok, n, sid, tiktoken.Encoding("glm4-test", pat_str=G.PAT, mergeable_ranks=ranks, special_tokens=sid)


def main():
    if not test_tokenizer("glm4_cli"):
        return 0
    tool = TOOL
    d = tempfile.mkdtemp(prefix="glmtrain-glm4-")
    try:
        tok, n, sid, enc = make_tokenizer(d)
        vocab = (n + len(SPECIALS) + 63) // 64 * 64
        cfg_path = write_config(d, vocab, sid)
        recs = []
        for i in range(32):
            conv = [{"role": "user", "content": "写一句关于%d的诗" % i}, {"role": "assistant", "content": "春风又绿江南岸 %d" % i}]
            if i % 3 == 0:
                conv = [{"role": "system", "content": "You are GLM-4."}] + conv + [
                    {"role": "user", "content": "  again\n"}, {"role": "assistant", "content": "明月  %d" % i}]
            recs.append({"conversations": conv})
        # tools on the system turn (with and without its own content), a call with metadata, the
        # tool's result, an empty turn
        call = {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京"}'}
        recs += [{"messages": [{"role": "system", "content": "", "tools": TOOLS}, {"role": "user", "content": "北京天气"},
                               call, {"role": "observation", "content": '{"temperature": 20}'},
                               {"role": "assistant", "content": "北京 20 度"}]},
                 {"messages": [{"role": "system", "content": "简短回答", "tools": TOOLS[:1]},
                               {"role": "user", "content": "现在几点"}, {"role": "assistant", "content": ""},
                               {"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}]}]
        data = os.path.join(d, "conv.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        # 1. examples = finetune.py's process_batch
        want = []
        for r in recs:
            ids, marks = [sid["[gMASK]"], sid["<sop>"]], [False, False]
            for m in r.get("conversations") or r["messages"]:
                m = process_message(m)
                for role, text in template_turns(m):
                    new = [sid[role]] + enc.encode(text, disallowed_special=())
                    ids += new
                    marks += [m["role"] not in ("system", "user", "observation")] * len(new)
            ids.append(sid["<|user|>"])
            marks = [False] + marks
            want.append((ids, [t if k else -100 for t, k in zip(ids, marks)]))
        p = subprocess.run([tool, "examples", "--tokenizer", tok, "--train_file", data, "--max_source_length", "1000",
                            "--max_target_length", "64"], capture_output=True, text=True, timeout=120)
        got = [json.loads(l) for l in p.stdout.splitlines()][:-1] if p.returncode == 0 else None
        ok = got is not None and [(g["ids"], g["labels"]) for g in got] == want
        detail = p.stderr[-300:] if got is None else "%d examples, the reference %d" % (len(got), len(want))
        if got is not None and not ok and len(got) == len(want):
            i = next(k for k in range(min(len(got), len(want))) if (got[k]["ids"], got[k]["labels"]) != want[k])
            detail = "example %d: glmtrain %s / %s, reference %s / %s" % (i, got[i]["ids"], got[i]["labels"], *want[i])
        report("glm4_examples_equal_finetune_process_batch", ok, detail)
        # --cutoff_len (and --mask_history): LLaMA-Factory's pair cut over the same examples
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import chatglm3_data_ref as D
        roles = {sid[r] for r in ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")}
        for cut, mask in ((14, False), (30, False), (14, True)):
            w = [e for e in (D.cut_conversation(x, None, cut, mask, roles, sid["<|assistant|>"]) for x in want) if e]
            p = subprocess.run([tool, "examples", "--tokenizer", tok, "--train_file", data, "--cutoff_len", str(cut)] +
                               (["--mask_history"] if mask else []), capture_output=True, text=True, timeout=120)
            got = [json.loads(l) for l in p.stdout.splitlines()][:-1] if p.returncode == 0 else None
            report("glm4_examples_cutoff_%d%s" % (cut, "_mask_history" if mask else ""),
                   got is not None and [(g["ids"], g["labels"]) for g in got] == w,
                   p.stderr[-300:] if got is None else "%d examples, reference %d" % (len(got), len(w)))
        # tools in the README's first sketch ({"name", "args"}, no type): the template writes
        # nothing for them and process_message fails; here a clear error names the record and tool
        bad = os.path.join(d, "bad.jsonl")
        with open(bad, "w", encoding="utf-8") as f:
            f.write(json.dumps({"messages": [{"role": "system", "content": "", "tools": [{"name": "x", "args": {}}]},
                                             {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n")
        p = subprocess.run([tool, "examples", "--tokenizer", tok, "--train_file", bad], capture_output=True, text=True,
                           timeout=120)
        report("glm4_untyped_tool_refused", p.returncode != 0 and "bad.jsonl:1" in p.stderr and "tools[0]" in p.stderr and
               '"type": "function"' in p.stderr, p.stderr[-400:])
        # 2. training
        out = os.path.join(d, "out")
        run(["--init_from_config", cfg_path, "--tokenizer_name", tok, "--train_file", data, "--learning_rate", "1e-2",
             "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7", "--max_source_length", "64",
             "--max_target_length", "64", "--disable_tqdm", "--report_to", "none", "--max_steps", "10",
             "--save_steps", "10", "--output_dir", out, "--per_device_train_batch_size", "8"], timeout=300)
        l = losses(out, 10)
        report("glm4_train_loss_falls", len(l) == 10 and l[10] < l[1], "loss %.4f -> %.4f" % (l[1], l[10]))
        # 3. generate's prompt: the chat template
        p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tok, "--prompt", "你好",
                            "--do_sample", "false", "--max_new_tokens", "4", "--debug"], capture_output=True, text=True,
                           timeout=120, env=ENV)
        tag = "[debug] prompt ids (row 0):"
        pid = next(([int(x) for x in ln[len(tag):].split()] for ln in p.stderr.splitlines() if ln.startswith(tag)), None)
        wantp = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + enc.encode("\n你好") + [sid["<|assistant|>"]]
        report("glm4_generate_prompt_is_chat_template", pid == wantp, "glmtrain %s, reference %s %s" % (pid, wantp,
               "" if p.returncode == 0 else p.stderr[-300:]))
        # 4. evaluation on conversations: a prompt per assistant turn, as finetune.py's
        # process_batch_eval (the tools block, metadata; --max_source_length cuts and stops)
        evals = recs[-2:]
        edata = os.path.join(d, "eval.jsonl")
        with open(edata, "w", encoding="utf-8") as f:
            for r in evals:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        for cut in (0, 640):  # 640: record 0's second answer is past it (its prefix is 678 tokens)
            want = []
            for i, r in enumerate(evals):
                ids = [sid["[gMASK]"], sid["<sop>"]]
                for k, m in enumerate(r["messages"]):
                    if cut and len(ids) >= cut:
                        break
                    m = process_message(m)
                    new = []
                    for role, text in template_turns(m):
                        new += [sid[role]] + enc.encode(text, disallowed_special=())
                    if m["role"] == "assistant" and new:
                        label = (m["metadata"] + "\n" if m.get("metadata") else "") + m["content"]
                        want.append((i, k, (ids[:cut] if cut else ids) + new[:1], label))
                    ids += new
            p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tok, "--input_file", edata,
                                "--do_sample", "false", "--max_new_tokens", "2", "--debug", "--per_device_eval_batch_size", "2"]
                               + (["--max_source_length", str(cut)] if cut else []), capture_output=True, text=True,
                               timeout=120, env=ENV)
            rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            pids = debug_ids(p.stderr, "prompt")
            # "turn" is the assistant message's place in the record's list (the tools block is none)
            got = [(r["index"], r["turn"], pids.get(j), r.get("labels")) for j, r in enumerate(rows)]
            report("glm4_eval_prompts_are_process_batch_eval%s" % ("_cut" if cut else ""),
                   p.returncode == 0 and got == want and len(want) == (2 if cut else 3),
                   "glmtrain %s, reference %s %s" % ([(g[0], g[1], g[3]) for g in got], [(w[0], w[1], w[3]) for w in want],
                                                     p.stderr[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
