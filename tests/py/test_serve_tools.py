#!/usr/bin/env python3
"""`glmtrain serve` with ChatGLM3 tool calling, through the `openai` client: a tiny ChatGLM3 model
(the ChatGLM2 block, a tokenizer in the real file's layout trained with spm_train) trained here
until it answers one question with a tool call and another with text, then

  * the prompt of a request with tools is build_chat_input's with the demo's system turn
    (preamble + json.dumps(tools, indent=4), a float 1.0 kept as Python keeps it), by the Python
    reference tokenizer (--debug ids);
  * the tool call comes back as tool_calls (finish_reason "tool_calls"), content null, its
    arguments json.dumps of the call's keyword arguments; the older `functions` get function_call;
  * streamed (one choice, or n of them), the call arrives as one tool_calls delta each (nothing
    of its text as content), while a text answer streams as content;
  * the next request, with the assistant's tool_calls and the tool's result (role tool), builds
    the turns the demo builds (<|assistant|>NAME, then <|observation|>), also when the
    assistant's message carries the model's own text (the demo's way);
  * tool_choice "none" drops the tools; a named tool (or "required" with one tool, or the older
    function_call {"name"}) ends the prompt with the call's first line, sp("NAME\\n"), so the
    response is the rest of that call; "required" of several tools, an unknown name and tools on
    a ChatGLM-6B model are refused.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402

PREAMBLE = "Answer the following questions as best as you can. You have access to the following tools:"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "查询城市的天气",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "description": "城市名"},
                                                "days": {"type": "integer", "minimum": 1.0, "maximum": 7}},
                                                "required": ["city"]}}}]
CALL = "get_weather\n```python\ntool_call(city='北京')\n```"
ANSWER = "你好，我是助手。"
failed = 0


def check(name, ok, detail=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + str(detail)[:1500]))
    failed += not ok


def stream(c, **kw):
    """A streamed chat completion: (its tool_calls deltas, its content, its finish_reason)."""
    deltas, finish = [], None
    for chunk in c.chat.completions.create(model="model", stream=True, **kw):
        if chunk.choices:
            deltas.append(chunk.choices[0].delta)
            finish = chunk.choices[0].finish_reason or finish
    return [t for dl in deltas for t in (dl.tool_calls or [])], "".join(dl.content or "" for dl in deltas), finish


prompt_ids = sc.prompt_ids  # waits for the logged line (serve_common)


def corpus(tc):
    """The tokenizer's training lines: poems, prose and this test's own texts, none of them from the
    repository's source (tokenizer_corpus.corpus samples src/, so any code change would change the
    tokenizer and with it what the tiny model manages to learn here)."""
    lines = []
    for name in ("tang300", "song100", "chinese"):
        lines += tc._read_lines(os.path.join(tc.FORTUNES, name), 3000)
    for lic in ("GPL-3", "Apache-2.0"):
        lines += tc._read_lines(os.path.join("/usr/share/common-licenses", lic), 600)
    own = [PREAMBLE, CALL, ANSWER, json.dumps(TOOLS, indent=4, ensure_ascii=False), "北京天气怎么样", "你好"]
    for text in own:
        lines += [line.encode() for line in text.split("\n")] * 40
    return lines


def train_tools_model(d, cfg, tok, recs, name, steps):
    """The tiny model trained on recs (a tokenizer folder tok, a config.json cfg), with the
    tokenizer copied in: the folder serve loads."""
    from mpi_runs import run
    data = os.path.join(d, name + ".jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    out = os.path.join(d, name)
    run(["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", data, "--learning_rate", "1e-2",
         "--seed", "7", "--max_source_length", "768", "--max_target_length", "64", "--disable_tqdm", "--report_to", "none",
         "--max_steps", str(steps), "--save_strategy", "no", "--output_dir", out, "--per_device_train_batch_size", "16",
         "--device", "cpu"], timeout=600)
    shutil.copytree(tok, out, dirs_exist_ok=True)
    return out


def build(d):
    """Tokenizer folder, reference tokenizer and the trained model folder."""
    import chatglm23_tok_ref as R
    import tokenizer_corpus as tc
    from test_glm2_cli import write_glm2_config
    model = R.train_model(d, corpus(tc))
    ref = R.ChatGLM3Tokenizer(model)
    tok = R.write_folder(os.path.join(d, "tok"), model, R.CONFIG_V3)
    cfg = write_glm2_config(d, {"<eop>": ref.eos_token_id, "<pad>": 0}, (ref.vocab_size + 63) // 64 * 64)
    c = json.load(open(cfg))
    c["seq_length"] = 1024  # the tools' system turn is a few hundred tokens
    json.dump(c, open(cfg, "w"))
    system = {"role": "system", "content": PREAMBLE, "tools": TOOLS}
    legacy = {"role": "system", "content": PREAMBLE, "tools": [TOOLS[0]["function"]]}  # the functions field's turn
    recs = [{"conversations": [system, {"role": "user", "content": "北京天气怎么样"}, {"role": "assistant", "content": CALL}]},
            {"conversations": [system, {"role": "user", "content": "你好"}, {"role": "assistant", "content": ANSWER}]},
            {"conversations": [legacy, {"role": "user", "content": "北京天气怎么样"}, {"role": "assistant", "content": CALL}]},
            {"conversations": [system, {"role": "user", "content": "北京天气怎么样"}, {"role": "assistant", "content": CALL}]}] * 4
    return ref, train_tools_model(d, cfg, tok, recs, "glm3", 150)


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_tools: %s not built" % sc.GLM)
        return 0
    try:
        import openai  # noqa: F401
    except ImportError:
        print("SKIP serve_tools: the openai Python client is not installed (scripts/install-deps.sh)")
        return 0
    if not shutil.which("spm_train"):
        print("SKIP serve_tools: spm_train (Debian sentencepiece) not installed")
        return 0
    d = tempfile.mkdtemp(prefix="glm-serve-tools-")
    S = None
    try:
        ref, model = build(d)
        S = sc.Server(model, "--debug", "--max_model_len", "1024", "--served_model_name", "model")
        c = S.client()
        q = [{"role": "user", "content": "北京天气怎么样"}]
        n0 = len(S.log)
        r = c.chat.completions.create(model="model", messages=q, tools=TOOLS, temperature=0, max_tokens=40)
        want_ids = ref.build_chat_input("北京天气怎么样", history=[{"role": "system", "content": PREAMBLE, "tools": TOOLS}])
        check("tools_prompt_is_the_demos", prompt_ids(S, n0) == list(want_ids), "%s vs %s" % (prompt_ids(S, n0), want_ids))
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        check("tool_call_as_tool_calls", ch.finish_reason == "tool_calls" and ch.message.content is None and len(calls) == 1
              and calls[0].type == "function" and calls[0].function.name == "get_weather"
              and json.loads(calls[0].function.arguments) == {"city": "北京"} and calls[0].id.startswith("call_"),
              r.model_dump_json())
        r2 = c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                       temperature=0, max_tokens=40)
        check("text_answer_with_tools_is_content", r2.choices[0].message.content == ANSWER and
              r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls, r2.model_dump_json())
        # the older functions field
        r3 = c.chat.completions.create(model="model", messages=q, functions=[TOOLS[0]["function"]], temperature=0,
                                       max_tokens=40)
        fc = r3.choices[0].message.function_call
        check("functions_get_function_call", r3.choices[0].finish_reason == "function_call" and fc is not None and
              fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "北京"}, r3.model_dump_json())
        # streamed
        tcs, text, finish = stream(c, messages=q, tools=TOOLS, temperature=0, max_tokens=40)
        check("streamed_tool_call_is_one_delta", finish == "tool_calls" and text == "" and len(tcs) == 1 and
              tcs[0].index == 0 and tcs[0].function.name == "get_weather" and
              json.loads(tcs[0].function.arguments) == {"city": "北京"}, "%s %r %s" % (finish, text, tcs))
        parts = [ck.choices[0].delta.content for ck in c.chat.completions.create(
            model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS, temperature=0, max_tokens=40,
            stream=True) if ck.choices and ck.choices[0].delta.content]
        check("streamed_text_answer_with_tools", "".join(parts) == ANSWER, parts)
        # n choices streamed: each choice held back on its own, each a call in one delta
        per = {}
        for ck in c.chat.completions.create(model="model", messages=q, tools=TOOLS, temperature=0, max_tokens=40,
                                            n=2, stream=True):
            for ch in ck.choices:
                p = per.setdefault(ch.index, {"calls": [], "text": "", "finish": None})
                p["calls"] += ch.delta.tool_calls or []
                p["text"] += ch.delta.content or ""
                p["finish"] = ch.finish_reason or p["finish"]
        check("streamed_n_2_tool_calls_one_delta_each", sorted(per) == [0, 1] and all(
            p["finish"] == "tool_calls" and p["text"] == "" and len(p["calls"]) == 1 and
            p["calls"][0].function.name == "get_weather" and json.loads(p["calls"][0].function.arguments) == {"city": "北京"}
            for p in per.values()), per)
        # the next turn: the call and the tool's result
        hist = [{"role": "system", "content": PREAMBLE, "tools": TOOLS}, {"role": "user", "content": "北京天气怎么样"},
                {"role": "assistant", "metadata": "get_weather", "content": "```python\ntool_call(city='北京')\n```"}]
        result = json.dumps({"temperature": 20}, ensure_ascii=False)
        want_ids = list(ref.build_chat_input(result, history=hist, role="observation"))
        msgs = q + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
                    {"role": "tool", "tool_call_id": calls[0].id, "content": result}]
        n0 = len(S.log)
        r4 = c.chat.completions.create(model="model", messages=msgs, tools=TOOLS, temperature=0, max_tokens=8)
        check("tool_result_turns_are_the_demos", prompt_ids(S, n0) == want_ids and r4.choices[0].finish_reason,
              "%s vs %s" % (prompt_ids(S, n0), want_ids))
        msgs[1] = {"role": "assistant", "content": CALL, "function_call": {"name": "get_weather", "arguments": "{}"}}
        msgs[2] = {"role": "function", "name": "get_weather", "content": result}
        n0 = len(S.log)
        c.chat.completions.create(model="model", messages=msgs, functions=[TOOLS[0]["function"]], temperature=0, max_tokens=8)
        want2 = list(ref.build_chat_input(result, history=[{"role": "system", "content": PREAMBLE,
                                                             "tools": [TOOLS[0]["function"]]}] + hist[1:], role="observation"))
        check("demo_style_history_same_turns", prompt_ids(S, n0) == want2, "%s vs %s" % (prompt_ids(S, n0), want2))
        # tool_choice
        n0 = len(S.log)
        c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                  tool_choice="none", temperature=0, max_tokens=4)
        check("tool_choice_none_drops_the_tools", prompt_ids(S, n0) == list(ref.build_chat_input("你好")), prompt_ids(S, n0))
        # tool_choice naming the tool: the prompt ends with the call's first line as ChatGLM3-6B writes
        # it, build_single_message's sp("get_weather\n"). This model learned finetune_hf.py's form
        # instead (metadata "", the name in the content: sp("\n") + sp("get_weather\n```...")), so
        # what it makes of the rest is not asserted: a call, or the text as content
        def forced(r):
            m = r.choices[0].message
            calls = m.tool_calls or ([m.function_call] if m.function_call else [])
            return (len(calls) == 1 and getattr(calls[0], "function", calls[0]).name == "get_weather" and
                    r.choices[0].finish_reason in ("tool_calls", "function_call")) or \
                (not calls and (m.content or "").startswith("get_weather\n") and r.choices[0].finish_reason in ("stop", "length"))
        n0 = len(S.log)
        r5 = c.chat.completions.create(model="model", messages=q, tools=TOOLS, temperature=0, max_tokens=40,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
        want = list(ref.build_chat_input("北京天气怎么样", history=[{"role": "system", "content": PREAMBLE, "tools": TOOLS}]))
        want += ref.sp_encode("get_weather\n")
        check("tool_choice_named_forces_the_call", prompt_ids(S, n0) == want and forced(r5),
              "%s vs %s: %s" % (prompt_ids(S, n0), want, r5.model_dump_json()))
        n0 = len(S.log)
        r6 = c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                       temperature=0, max_tokens=40, tool_choice="required")
        want = list(ref.build_chat_input("你好", history=[{"role": "system", "content": PREAMBLE, "tools": TOOLS}]))
        check("tool_choice_required_one_tool_forces_it", prompt_ids(S, n0) == want + ref.sp_encode("get_weather\n") and
              forced(r6), r6.model_dump_json())
        n0 = len(S.log)
        r7 = c.chat.completions.create(model="model", messages=q, functions=[TOOLS[0]["function"]], temperature=0,
                                       max_tokens=40, function_call={"name": "get_weather"})
        want = list(ref.build_chat_input("北京天气怎么样", history=[{"role": "system", "content": PREAMBLE,
                                                                   "tools": [TOOLS[0]["function"]]}]))
        check("function_call_named_forces_the_call", prompt_ids(S, n0) == want + ref.sp_encode("get_weather\n") and
              forced(r7), r7.model_dump_json())
        two = TOOLS + [{"type": "function", "function": {"name": "now", "parameters": {}}}]
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "tools": two,
                                                                     "tool_choice": "required"})
        check("tool_choice_required_of_two_refused", st == 400 and body["error"]["param"] == "tool_choice", body)
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "tools": TOOLS,
                                                                     "tool_choice": {"type": "function", "function": {"name": "x"}}})
        check("tool_choice_unknown_tool_refused", st == 400 and body["error"]["param"] == "tool_choice" and
              '"x"' in body["error"]["message"], body)
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "tools": [{"type": "function"}]})
        check("tool_without_a_name_refused", st == 400 and body["error"]["param"] == "tools", body)
        rc = S.stop()
        check("clean_exit", rc == 0, S.text()[-300:])
        # a model without a tool format
        os.makedirs(os.path.join(d, "v1"))
        v1, _, _ = sc.make_model(os.path.join(d, "v1"))
        S = sc.Server(v1, "--served_model_name", "model")
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q, "tools": TOOLS})
        check("tools_on_chatglm6b_refused", st == 400 and "ChatGLM3" in body["error"]["message"], body)
        st, body = sc.http(S.port, "POST", "/v1/chat/completions",
                           {"model": "model", "messages": q + [{"role": "tool", "content": "x"}]})
        check("tool_turns_on_chatglm6b_refused", st == 400 and "ChatGLM3" in body["error"]["message"], body)
        S.stop()
    finally:
        if S and S.p.poll() is None:
            S.stop(9)
        shutil.rmtree(d, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
