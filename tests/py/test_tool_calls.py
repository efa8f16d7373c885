#!/usr/bin/env python3
"""ChatGLM3's tool calls as its openai_api_demo (utils.py) handles them, against Python itself
(build/tests/tool_pyliteral over src/data/pyliteral.c, src/data/pyjson.c, src/infer/tools.c):

  * a tool_call(...) text -> its keyword arguments as json.dumps(eval(text), ensure_ascii=False),
    for 400 random calls (nested lists, tuples, dicts, every kind of string escape, unicode,
    ints, floats, True/False/None, each value written by repr() or in other spellings Python
    reads) and for texts eval() refuses, which must be refused too;
  * repr(json.loads(text)) for 400 random JSON values;
  * a call written back from JSON arguments: the text evaluates to the same arguments and is
    "```python\\ntool_call(k=repr(v), ...)\\n```";
  * the tools' system turn: the demo's preamble + json.dumps(tools, indent=4, ensure_ascii=False);
  * process_response(text, use_tool=True) on tool calls and on answers.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import subprocess
import sys

TOOL = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_pyliteral")
PREAMBLE = "Answer the following questions as best as you can. You have access to the following tools:"
failed = 0


def check(name, ok, detail=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail[:1500]))
    failed += not ok


def run(mode, text):
    p = subprocess.run([TOOL, mode], input=text.encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().split("\n")[:-1]


def rand_str(rng):
    pool = ["a", "Z", "0", " ", "'", '"', "\\", "\n", "\t", "\r", "\x01", "\x7f", "中", "文", "é", "\u00a0", "😀",
            "\u2028", "{", "}", ",", "=", "(", ")", "tool_call"]
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 8)))


def rand_value(rng, depth=0):
    k = rng.randint(0, 9 if depth < 3 else 5)
    if k == 0:
        return rng.randint(-10**20, 10**20) if rng.random() < 0.2 else rng.randint(-1000, 1000)
    if k == 1:
        return rng.choice([0.0, -0.0, 1.0, 1e-5, 2.5, 1e16, 123456.789, -3.25e-7, 1e300, 0.1])
    if k == 2:
        return rng.choice([True, False, None])
    if k in (3, 4, 5):
        return rand_str(rng)
    if k in (6, 7):
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if k == 8:
        return tuple(rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return {(rand_str(rng) if rng.random() < 0.8 else rng.randint(-5, 5)): rand_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def spelled(rng, v):
    """v as Python source: repr(), or another spelling Python reads the same."""
    if isinstance(v, str) and rng.random() < 0.5:
        out = []
        for ch in v:
            c = ord(ch)
            r = rng.random()
            if ch in "\\\"":
                out.append("\\" + ch)
            elif r < 0.2 and c < 256:
                out.append("\\x%02x" % c)
            elif r < 0.35 and c < 0x10000:
                out.append("\\u%04x" % c)
            elif r < 0.45:
                out.append("\\U%08x" % c)
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\r":
                out.append("\\r")
            elif r < 0.5 and c < 8:
                out.append("\\%o" % c)
            else:
                out.append(ch)
        return ("u" if rng.random() < 0.1 else "") + '"' + "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(spelled(rng, x) for x in v) + ("," if v and rng.random() < 0.3 else "") + "]"
    if isinstance(v, tuple):
        inner = ", ".join(spelled(rng, x) for x in v)
        return "(" + inner + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, dict):
        return "{" + ",\n ".join(spelled(rng, k) + ": " + spelled(rng, x) for k, x in v.items()) + "}"
    if isinstance(v, int) and not isinstance(v, bool) and v < 0 and rng.random() < 0.3:
        return "- %d" % -v
    return repr(v)


def tool_call(**kw):
    return kw


def main():
    if not os.path.exists(TOOL):
        print("SKIP tool_calls: %s not built" % TOOL)
        return 0
    rng = random.Random(20261204)
    # 1. calls -> JSON arguments
    texts, want = [], []
    for i in range(400):
        kw = {"k%d" % j if rng.random() < 0.8 else "参数%d" % j: rand_value(rng) for j in range(rng.randint(0, 4))}
        sep = rng.choice([", ", ",", " ,\n  "])
        t = "tool_call(" + sep.join("%s=%s" % (k, spelled(rng, v)) for k, v in kw.items()) + \
            ("," if kw and rng.random() < 0.2 else "") + ")"
        if rng.random() < 0.2:
            t = "  " + t + " "
        texts.append(t)
        want.append(json.dumps(eval(t, {"tool_call": tool_call}), ensure_ascii=False))
    got = run("call", "\n".join(t.replace("\n", " ") for t in texts) + "\n")
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g == "ERR" or json.loads(g) != w]
    check("call_kwargs_as_json_dumps_of_eval", len(got) == 400 and not bad, "%d lines; %s" % (len(got), bad[:3]))
    refused = ["tool_call(1)", "tool_call(x=foo)", "tool_call(x={1, 2})", "other(x=1)", "tool_call(x=1", "tool_call(x=1) + 1",
               "tool_call(x=1, x=2)", "tool_call(x=1.5j)", "tool_call(x=007)", "tool_call(x=[1 2])", "tool_call(**[1])",
               "tool_call(None=1)", "tool_call(x=1, **{'x': 2})", "tool_call(**{1: 2})"]
    for t in refused:  # each one eval() or json.dumps refuses, as the demo's parse then fails
        try:
            json.dumps(eval(t, {"tool_call": tool_call}))
            raise AssertionError("Python reads " + t)
        except (SyntaxError, NameError, TypeError):
            pass
    got = run("call", "\n".join(refused) + "\n")
    check("call_texts_eval_refuses_are_refused", got == ["ERR"] * len(refused), str(list(zip(refused, got))))
    starred = ["tool_call(**{'a b': 1, 'c': [True]})", "tool_call(x=1, **{'y': None})", "tool_call(**{})",
               "tool_call(x={'k': 1, 'k': 2, 1: 3, '1': 4})", "tool_call(**{'a': 1, 'a': 2}, b=3)"]
    got = run("call", "\n".join(starred) + "\n")
    want = [json.dumps(eval(t, {"tool_call": tool_call}), ensure_ascii=False) for t in starred]
    check("call_with_a_starred_dict", [json.loads(g) if g != "ERR" else g for g in got] == want, "%s vs %s" % (got, want))
    # 2. repr(json.loads(text))
    vals = [rand_value(rng) for _ in range(400)]
    js = [json.dumps(v if not isinstance(v, tuple) else list(v), ensure_ascii=rng.random() < 0.3) for v in vals]
    got = run("repr", "\n".join(js) + "\n")
    bad = [(j, g) for j, g in zip(js, got) if g == "ERR" or json.loads(g) != repr(json.loads(j))]
    check("repr_of_json_loads", len(got) == 400 and not bad, str(bad[:3]))
    # 3. a call written back from its JSON arguments
    args = [json.dumps({"k%d" % j: json.loads(js[i * 3 + j]) for j in range(i % 4)}, ensure_ascii=False) for i in range(100)]
    args.append(json.dumps({"not an identifier": 1, "b": [1, "x"]}, ensure_ascii=False))
    args.append('{"a": 1, "b": 2, "a": [3]}')  # json.loads keeps a's last value in its first place
    got = run("write", "\n".join(args) + "\n")
    bad = []
    for a, g in zip(args, got):
        text = json.loads(g) if g != "ERR" else ""
        kw = json.loads(a)
        lines = text.split("\n")
        ok = len(lines) == 3 and lines[0] == "```python" and lines[2] == "```" and \
            eval(lines[1], {"tool_call": tool_call}) == kw
        if all(k.isidentifier() for k in kw):
            ok &= lines[1] == "tool_call(" + ", ".join("%s=%r" % (k, v) for k, v in kw.items()) + ")"
        if not ok:
            bad.append((a, text))
    check("call_written_back_evaluates_to_its_arguments", len(got) == 102 and not bad, str(bad[:3]))
    check("call_write_refuses_non_objects", run("write", "[1]\n\"x\"\n") == ["ERR", "ERR"])
    # 4. the tools' system turn
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "天气 \"now\"\n",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string", "description": "城市"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7.0}},
                                                    "required": ["city"]}}},
             {"name": "empty", "parameters": {}, "list": []}]
    got = run("tools", json.dumps(tools))
    want = PREAMBLE + "\n" + json.dumps(tools, indent=4, ensure_ascii=False)
    check("tools_system_turn_as_the_demo", len(got) == 1 and json.loads(got[0]) == want, "%r vs %r" % (got, want))
    # 5. process_response(text, use_tool=True)
    cases = [("get_weather\n```python\ntool_call(city='北京', days=3)\n```", ("get_weather", {"city": "北京", "days": 3})),
             (" track \n```python\ntool_call(symbol=\"AAPL\")\n```", ("track", {"symbol": "AAPL"})),
             ("x\n```python\ntool_call(a=1)\n```<|assistant|>search\n```python\ntool_call(q='glm')\n```",
              ("search", {"q": "glm"})),
             ("你好，我是 ChatGLM3。", None), ("第一行\n第二行\n第三行", None), ("get_weather\n```python\n```", None),
             ("\n```python\ntool_call(a=1)\n```", None), ("f\n```\ntool_call()\n```", ("f", {}))]
    bad = []
    for text, want in cases:
        got = run("read", text)
        g = None if got == ["NONE"] else (json.loads(got[0]), json.loads(json.loads(got[1])))
        if g != want:
            bad.append((text, got, want))
    check("response_read_as_process_response", not bad, str(bad))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
