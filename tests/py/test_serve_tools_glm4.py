#!/usr/bin/env python3
"""`glmtrain serve` with GLM-4 tool calling, through the `openai` client: a tiny model of GLM-4's
architecture (the ChatGLM2 block, a byte-level BPE tokenizer in GLM-4's tokenizer.model layout
built here) trained here on GLM-4 finetune_demo records with tools until it answers one
question with a tool call and another with text, then

  * the prompt of a request with tools is glm-4-9b-chat's chat template for the messages THUDM's
    basic_demo/openai_api_server.py builds (a system message with the tools, its content None),
    tokenized as transformers does it (test_glm4_cli.template_turns: the tools block, each
    function as json.dumps(indent=4, ensure_ascii=False)); `functions` give the same block;
  * the model's "get_weather\\n{...}" comes back as tool_calls (finish_reason "tool_calls"),
    content null, arguments the JSON of the dict; `functions` get function_call;
  * streamed, the call arrives as one tool_calls delta, a text answer as content;
  * the next request, with the assistant's tool_calls and the tool's result, has the turns the
    template writes (<|assistant|>get_weather + "\\n" + the arguments, then <|observation|>), also
    when the assistant's message carries the model's own text (the demo's way);
  * a forced call's arguments (tool_choice naming a tool, or "required" with one) keep to the tool's
    parameters (structured outputs' recognizer): sampled calls of a tool the model never saw
    validate against its schema (the jsonschema package); "required" with two tools gives a call
    of one of them whose arguments validate against that one's parameters;
  * tool_choice "none" drops the tools; a named tool ends the prompt with encode("NAME\\n") and the
    (streamed) response is the rest of the call; a built-in tool type (python) is refused.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from test_glm4_cli import SPECIALS, template_turns  # noqa: E402
from test_serve_tools import check, prompt_ids  # noqa: E402
import test_serve_tools as T  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "查询城市的天气",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "description": "城市名"},
                                                "days": {"type": "integer", "minimum": 1.0, "maximum": 7}},
                                                "required": ["city"]}}}]
ARGS = '{"city": "北京"}'
ANSWER = "你好，我是助手。"
RESULT = '{"temperature": 20}'


def build(d):
    """Tokenizer (its ranks, the tiktoken encoding and special ids) and the trained model folder."""
    import tiktoken
    import test_tokenizer_glm4 as G
    import tokenizer_corpus as tc
    own = [template_turns({"role": "system", "content": None, "tools": TOOLS})[0][1], ARGS, ANSWER, RESULT,
           "北京天气怎么样", "你好", "北京 20 度"]
    lines = []
    for name in ("tang300", "chinese"):
        lines += [x.decode("utf-8", "ignore") for x in tc._read_lines(os.path.join(tc.FORTUNES, name), 1500)]
    lines += [t for t in own for _ in range(40)]
    ranks = G.train(lines, 1500)
    tok = G.write_model(os.path.join(d, "tok"), ranks)
    n = len(ranks)
    sid = {s: n + i for i, s in enumerate(SPECIALS)}
    enc = tiktoken.Encoding("glm4-test", pat_str=G.PAT, mergeable_ranks=ranks, special_tokens=sid)
    cfg = {"model_type": "chatglm", "padded_vocab_size": (n + len(SPECIALS) + 63) // 64 * 64, "hidden_size": 64,
           "num_layers": 2, "num_attention_heads": 4, "kv_channels": 16, "multi_query_attention": True,
           "multi_query_group_num": 2, "ffn_hidden_size": 128, "layernorm_epsilon": 1.5625e-07, "rmsnorm": True,
           "add_qkv_bias": True, "add_bias_linear": False, "apply_residual_connection_post_layernorm": False,
           "post_layer_norm": True, "original_rope": True, "rope_ratio": 500, "seq_length": 1024,
           "tie_word_embeddings": False, "eos_token_id": [sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]],
           "pad_token_id": sid["<|endoftext|>"]}
    cfg_path = os.path.join(d, "config.json")
    json.dump(cfg, open(cfg_path, "w"))
    system = {"role": "system", "content": "", "tools": TOOLS}
    call = [{"role": "user", "content": "北京天气怎么样"}, {"role": "assistant", "metadata": "get_weather", "content": ARGS},
            {"role": "observation", "content": RESULT}, {"role": "assistant", "content": "北京 20 度"}]
    recs = [{"messages": [system] + call}, {"messages": [system, {"role": "user", "content": "你好"},
                                                          {"role": "assistant", "content": ANSWER}]}] * 8
    return enc, sid, T.train_tools_model(d, cfg_path, tok, recs, "glm4", 120)


def ref_ids(enc, sid, messages):
    """[gMASK] <sop>, each message through the template, then <|assistant|>."""
    ids = [sid["[gMASK]"], sid["<sop>"]]
    for m in messages:
        for role, text in template_turns(m):
            ids += [sid[role]] + enc.encode(text, disallowed_special=())
    return ids + [sid["<|assistant|>"]]


def valid_args(text, schema):
    try:
        import jsonschema
        jsonschema.Draft202012Validator(schema).validate(json.loads(text))
        return True
    except Exception:  # noqa: BLE001 (not JSON, or not valid)
        return False


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP serve_tools_glm4: %s not built" % sc.GLM)
        return 0
    try:
        import openai  # noqa: F401
        import tiktoken  # noqa: F401
        import regex  # noqa: F401
    except ImportError as e:
        print("SKIP serve_tools_glm4: %s (scripts/install-deps.sh installs openai, tiktoken and regex)" % e)
        return 0
    d = tempfile.mkdtemp(prefix="glm-serve-tools4-")
    S = None
    try:
        enc, sid, model = build(d)
        S = sc.Server(model, "--debug", "--max_model_len", "1024", "--served_model_name", "model")
        c = S.client()
        q = [{"role": "user", "content": "北京天气怎么样"}]
        tools_turn = {"role": "system", "content": None, "tools": TOOLS}
        n0 = len(S.log)
        r = c.chat.completions.create(model="model", messages=q, tools=TOOLS, temperature=0, max_tokens=40)
        want = ref_ids(enc, sid, [tools_turn] + q)
        check("glm4_tools_prompt_is_the_template", prompt_ids(S, n0) == want, "%s vs %s" % (prompt_ids(S, n0), want))
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        check("glm4_tool_call_as_tool_calls", ch.finish_reason == "tool_calls" and ch.message.content is None and
              len(calls) == 1 and calls[0].function.name == "get_weather" and
              json.loads(calls[0].function.arguments) == {"city": "北京"}, r.model_dump_json())
        r2 = c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                       temperature=0, max_tokens=40)
        check("glm4_text_answer_with_tools_is_content", r2.choices[0].message.content == ANSWER and
              r2.choices[0].finish_reason == "stop" and not r2.choices[0].message.tool_calls, r2.model_dump_json())
        # logprobs: a BPE token's bytes are its rank's; together the response's text
        r2 = c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                       temperature=0, max_tokens=40, logprobs=True, top_logprobs=1)
        lps = r2.choices[0].logprobs.content
        joined = b"".join(bytes(e.bytes) for e in lps).decode("utf-8", "replace")
        check("glm4_logprobs_bytes_spell_the_response", joined.strip() == r2.choices[0].message.content == ANSWER and
              len(lps) == r2.usage.completion_tokens and all(e.top_logprobs[0].token == e.token for e in lps),
              "%r vs %r" % (joined, r2.choices[0].message.content))
        n0 = len(S.log)
        r3 = c.chat.completions.create(model="model", messages=q, functions=[TOOLS[0]["function"]], temperature=0,
                                       max_tokens=40)
        fc = r3.choices[0].message.function_call
        check("glm4_functions_same_prompt_get_function_call", prompt_ids(S, n0) == want and
              r3.choices[0].finish_reason == "function_call" and fc is not None and fc.name == "get_weather" and
              json.loads(fc.arguments) == {"city": "北京"}, r3.model_dump_json())
        tcs, text, finish = T.stream(c, messages=q, tools=TOOLS, temperature=0, max_tokens=40)
        check("glm4_streamed_tool_call_is_one_delta", finish == "tool_calls" and text == "" and len(tcs) == 1 and
              tcs[0].function.name == "get_weather" and json.loads(tcs[0].function.arguments) == {"city": "北京"},
              "%s %r %s" % (finish, text, tcs))
        parts = [ck.choices[0].delta.content for ck in c.chat.completions.create(
            model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS, temperature=0, max_tokens=40,
            stream=True) if ck.choices and ck.choices[0].delta.content]
        check("glm4_streamed_text_answer_with_tools", "".join(parts) == ANSWER, parts)
        # the next turn: the call and the tool's result
        hist = [tools_turn] + q + [{"role": "assistant", "metadata": "get_weather", "content": ARGS},
                                   {"role": "observation", "content": RESULT}]
        want = ref_ids(enc, sid, hist)
        msgs = q + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
                    {"role": "tool", "tool_call_id": calls[0].id, "content": RESULT}]
        n0 = len(S.log)
        r4 = c.chat.completions.create(model="model", messages=msgs, tools=TOOLS, temperature=0, max_tokens=8)
        check("glm4_tool_result_turns_are_the_templates", prompt_ids(S, n0) == want and r4.choices[0].finish_reason,
              "%s vs %s" % (prompt_ids(S, n0), want))
        msgs[1] = {"role": "assistant", "content": "get_weather\n" + ARGS, "function_call": {"name": "get_weather", "arguments": "{}"}}
        msgs[2] = {"role": "function", "name": "get_weather", "content": RESULT}
        n0 = len(S.log)
        c.chat.completions.create(model="model", messages=msgs, functions=[TOOLS[0]["function"]], temperature=0, max_tokens=8)
        check("glm4_demo_style_history_same_turns", prompt_ids(S, n0) == want, "%s vs %s" % (prompt_ids(S, n0), want))
        n0 = len(S.log)
        c.chat.completions.create(model="model", messages=[{"role": "user", "content": "你好"}], tools=TOOLS,
                                  tool_choice="none", temperature=0, max_tokens=4)
        want = ref_ids(enc, sid, [{"role": "user", "content": "你好"}])
        check("glm4_tool_choice_none_drops_the_tools", prompt_ids(S, n0) == want, "%s vs %s" % (prompt_ids(S, n0), want))
        # tool_choice naming the tool: the prompt ends with encode("get_weather\n"), the streamed
        # response is the rest of the call
        n0 = len(S.log)
        tcs, _, finish = T.stream(c, messages=q, tools=TOOLS, temperature=0, max_tokens=40,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
        want = ref_ids(enc, sid, [tools_turn] + q) + enc.encode("get_weather\n")
        check("glm4_tool_choice_named_forces_the_call", prompt_ids(S, n0) == want and finish == "tool_calls" and
              len(tcs) == 1 and json.loads(tcs[0].function.arguments) == {"city": "北京"},
              "%s vs %s: %s %s" % (prompt_ids(S, n0), want, finish, tcs))
        # a forced call's arguments keep to the tool's parameters: a tool the model never saw, sampled
        alarm = {"type": "function", "function": {"name": "set_alarm", "parameters": {
            "type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                             "label": {"enum": ["起床", "开会"]}}, "required": ["hour", "label"]}}}
        got = []
        for seed in range(6):
            r5 = c.chat.completions.create(model="model", messages=q, tools=TOOLS + [alarm], temperature=1.0, seed=seed,
                                           max_tokens=120, tool_choice={"type": "function", "function": {"name": "set_alarm"}})
            got.append((r5.choices[0].finish_reason, r5.choices[0].message.tool_calls, r5.choices[0].message.content))
        calls = [f == "tool_calls" and len(tc) == 1 and tc[0].function.name == "set_alarm" and
                 valid_args(tc[0].function.arguments, alarm["function"]["parameters"]) for f, tc, _ in got if f != "length"]
        # (one cut by max_tokens, the model's whitespace between values included, is the call's beginning as text)
        cut = [t for f, _, t in got if f == "length"]
        check("glm4_forced_call_arguments_keep_to_the_parameters", all(calls) and len(calls) >= 3 and
              all((t or "").startswith("set_alarm\n{") for t in cut), str(got[:2]))
        r6 = c.chat.completions.create(model="model", messages=q, tools=TOOLS, temperature=1.0, seed=3, max_tokens=60,
                                       tool_choice="required")
        tc6 = r6.choices[0].message.tool_calls or []
        check("glm4_required_call_with_one_tool_keeps_to_it", r6.choices[0].finish_reason == "tool_calls" and len(tc6) == 1 and
              valid_args(tc6[0].function.arguments, TOOLS[0]["function"]["parameters"]), r6.model_dump_json())
        # "required" with several tools: a call of one of them, its arguments kept to that tool's parameters
        got, names = [], set()
        for seed in range(8):
            r7 = c.chat.completions.create(model="model", messages=q, tools=TOOLS + [alarm], temperature=1.5, seed=seed,
                                           max_tokens=60, tool_choice="required")
            ch7 = r7.choices[0]
            tc7 = ch7.message.tool_calls or []
            params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS + [alarm]}
            if ch7.finish_reason == "length":  # (cut by max_tokens: the call's beginning, as text)
                got.append(any((ch7.message.content or "").startswith(k + "\n{") for k in params) or None)
            else:
                got.append(ch7.finish_reason == "tool_calls" and len(tc7) == 1 and tc7[0].function.name in params and
                           valid_args(tc7[0].function.arguments, params[tc7[0].function.name]))
            names |= {t.function.name for t in tc7}
        check("glm4_required_of_several_tools_is_a_call_of_one", all(got) and got.count(True) >= 5, "%s %s" % (got, names))
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": q,
                                                                     "tools": [{"type": "python"}]})
        check("glm4_builtin_tool_refused", st == 400 and body["error"]["param"] == "tools" and
              "python" in body["error"]["message"], body)
        rc = S.stop()
        check("glm4_clean_exit", rc == 0, S.text()[-300:])
    finally:
        if S and S.p.poll() is None:
            S.stop(9)
        shutil.rmtree(d, ignore_errors=True)
    return 1 if T.failed else 0


if __name__ == "__main__":
    sys.exit(main())
