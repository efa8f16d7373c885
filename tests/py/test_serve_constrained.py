#!/usr/bin/env python3
"""Constrained decoding in `glmtrain serve`: JSON mode (OpenAI's response_format {"type":
"json_object"}; infer/json_mode.h) and vLLM's guided_choice (infer/choice_mode.h).

JSON mode:

  * the recognizer (tests/c/tool_json_mode) against Python's json module on 3,000 random JSON
    objects (nested objects and arrays, strings with escapes, \\u escapes and CJK, numbers with
    signs, fractions and exponents, literals; json.dumps with and without spaces and indents) and
    6,000 mutations of them: "done" exactly where json.loads(strict, no NaN/Infinity) gives a dict
    (texts without trailing whitespace), and every proper prefix of a valid text taken;
  * served on tiny random models (ChatGLM2 family and GLM v1, CPU), sampled answers in JSON mode
    that stop parse as JSON objects, and those cut by max_tokens are prefixes the recognizer takes,
    while the same requests without it are not JSON (so the check can fail); greedy, chat
    completions, streamed chunks, n = 2, and a server with prompt lookup's drafts all keep to it;
  * refused with 400, naming the field: json_schema, an unknown type, a response_format that is
    not an object, ignore_eos and min_tokens with json_object.
Structured outputs (response_format json_schema, vLLM's guided_json; infer/schema_mode.h):
  * the recognizer (tests/c/tool_schema_mode) against the jsonschema package (Debian's) on 4
    schemas (types and type lists, required and optional properties, nested objects, arrays with
    minItems/maxItems, enums of mixed values): 2,000 random instances written in the schema's
    property order are "done", 8,000 mutations taken as "done" only where jsonschema validates;
  * served answers that stop validate against their schema (with the structure's tokens made
    likely, so strings close), those cut are prefixes; guided_json the same; the refusals (a
    keyword it does not support names itself, a root that is not an object, no schema).
guided_choice, on the same models: every sampled answer is one of the choices (CJK, ASCII, one
the start of another, one of many tokens), more than one of them comes up, the same requests
without it answer otherwise; chat completions, n = 3, prompt lookup's drafts; the refusals (not a
list, empty, a non-string or empty choice, over 64, with json_object, ignore_eos or min_tokens).
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks, tool  # noqa: E402

T = Checks()
JSON_OBJ = {"type": "json_object"}


def no_constant(x):
    raise ValueError("not JSON: " + x)


def py_object(text):
    """Python's verdict: a JSON object, with no whitespace after it (JSON mode ends at the '}')."""
    if not text or text[-1] in " \t\r\n":
        return False
    try:
        return isinstance(json.loads(text, parse_constant=no_constant), dict)
    except (ValueError, RecursionError):
        return False


def rand_string(rng):
    parts = ["a", "b", "Z", " ", "中文", "é", "\n", "\"", "\\", "/", "\t", "\u0001", "x y", "{}", "[1]"]
    return "".join(rng.choice(parts) for _ in range(rng.randint(0, 5)))


def rand_value(rng, depth):
    k = rng.randint(0, 9 if depth < 4 else 5)
    if k == 0:
        return rng.randint(-1000, 1000)
    if k == 1:
        return rng.choice([0.5, -2.25, 1e-5, 3.5e20, -0.0, 123.456])
    if k == 2:
        return rng.choice([True, False, None])
    if k <= 5:
        return rand_string(rng)
    if k <= 7:
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rand_object(rng, depth + 1)


def rand_object(rng, depth=0):
    return {rand_string(rng): rand_value(rng, depth) for _ in range(rng.randint(0, 4))}


def mutate(rng, text, alphabet):
    """text with 1 or 2 random edits: a character deleted, inserted or replaced from alphabet."""
    d = list(text)
    for _ in range(rng.randint(1, 2)):
        i = rng.randrange(len(d) + 1)
        op = rng.randint(0, 2)
        if op == 0 and i < len(d):
            del d[i]
        elif op == 1:
            d.insert(i, rng.choice(alphabet))
        elif i < len(d):
            d[i] = rng.choice(alphabet)
    return "".join(d)


def verdicts(texts):
    lines = "".join(json.dumps(t) + "\n" for t in texts)
    p = subprocess.run([tool("tool_json_mode")], input=lines, capture_output=True, text=True, timeout=120)
    return p.stdout.split("\n")[:len(texts)] if p.returncode == 0 else None


def recognizer_checks():
    rng = random.Random(5)
    docs = []
    for _ in range(3000):
        o = rand_object(rng)
        docs.append(json.dumps(o, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1, 2]),
                               separators=rng.choice([(",", ":"), (", ", ": ")])))
    got = verdicts(docs)
    T.check("json_mode_valid_objects_done", got is not None and all(g == "done" for g in got),
            str([(d, g) for d, g in zip(docs, got or []) if g != "done"][:2]))
    prefixes = [d[:rng.randint(0, len(d) - 1)] for d in docs]
    got = verdicts(prefixes)
    T.check("json_mode_prefixes_taken", got is not None and all(g == "prefix" for g in got),
            str([(d, g) for d, g in zip(prefixes, got or []) if g != "prefix"][:2]))
    alphabet = "{}[]\":,.-+eE0123456789 tfnrula\\/\nx"
    muts = [mutate(rng, rng.choice(docs), alphabet) for _ in range(6000)]
    muts += ["{\"a\": NaN}", "{\"a\": Infinity}", "{\"a\": 01}", "{\"a\": 1.}", "{\"a\": .5}", "{\"a\": -}",
             "{\"a\": 1e}", "{\"a\": tru}", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12G4\"}", "{\"a\" 1}", "{\"a\": 1,}",
             "[1, 2]", "\"s\"", "{} ", " {}", "{\"a\": [1, 2,]}", "{\"a\": \"b\t\"}"]
    got = verdicts(muts)
    bad = [(m, g) for m, g in zip(muts, got or []) if (g == "done") != py_object(m)]
    valid = sum(1 for m in muts if py_object(m))
    T.check("json_mode_mutations_agree_with_python", got is not None and not bad and 500 < valid < len(muts) - 500,
            "%d disagree, e.g. %s (%d valid)" % (len(bad), bad[:3], valid))


def post(S, body, path="/v1/completions"):
    return sc.http(S.port, "POST", path, body, timeout=180)


def answers(S, prompt, n_req, json_mode, extra=None, path="/v1/completions"):
    out = []
    for i in range(n_req):
        body = {"max_tokens": 100, "temperature": 1.0, "top_p": 1.0, "seed": 100 + i}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if json_mode:
            body["response_format"] = JSON_OBJ
        body.update(extra or {})
        st, b = post(S, body, path)
        if st != 200:
            return None
        for c in b["choices"]:
            out.append((c["message"]["content"] if "message" in c else c["text"], c["finish_reason"]))
    return out


def json_answers_ok(name, outs, min_stop=3):
    if outs is None:
        return T.check(name, False, "a request failed")
    stops = [t for t, f in outs if f == "stop"]
    cut = [t for t, f in outs if f == "length"]
    pv = verdicts(cut) if cut else []
    ok = len(stops) >= min_stop and all(py_object(t) for t in stops) and all(v == "prefix" for v in pv)
    return T.check(name, ok, "%d stopped (%s), %d cut (%s)" % (len(stops), [t[:60] for t in stops if not py_object(t)][:2],
                                                              len(cut), [(t[:60], v) for t, v in zip(cut, pv) if v != "prefix"][:2]))


def server_checks(model, tag, lookup=False):
    flags = ["--max_batch_size", "4"] + (["--prompt_lookup_num_tokens", "8"] if lookup else [])
    S = sc.Server(model, *flags)
    try:
        # structural tokens made likely so that sampled objects close within max_tokens
        json_answers_ok("json_mode_%s_sampled_objects" % tag, answers(S, "写一个JSON对象", 16, True))
        if lookup:
            return
        # objects with members: the tokens of '"a":1,"b":2}' made likely
        st, tk = post(S, {"prompt": "\"a\":1,\"b\":2}", "add_special_tokens": False}, "/tokenize")
        bias = {str(t): 4.0 for t in (tk["tokens"] if st == 200 else [])}
        rich = answers(S, "写一个JSON对象", 16, True, {"logit_bias": bias})
        json_answers_ok("json_mode_%s_biased_objects" % tag, rich)
        full = [json.loads(t) for t, f in (rich or []) if f == "stop" and py_object(t)]
        if tag == "glm2":  # (GLM v1's tiny tokenizer joins '"' into longer pieces: its objects stay empty)
            T.check("json_mode_objects_with_members", sum(1 for o in full if o) >= 3,
                    "%d stopped, members %s" % (len(full), [len(o) for o in full]))
        plain = answers(S, "写一个JSON对象", 16, False)
        T.check("json_mode_%s_without_it_not_json" % tag, plain is not None and
                sum(1 for t, _ in plain if not py_object(t)) >= 12, str(plain and plain[:2]))
        st, b = post(S, {"prompt": "写一个JSON对象", "max_tokens": 60, "temperature": 0, "response_format": JSON_OBJ})
        t = b["choices"][0]["text"] if st == 200 else ""
        T.check("json_mode_%s_greedy" % tag, st == 200 and (py_object(t) if b["choices"][0]["finish_reason"] == "stop"
                                                            else verdicts([t]) == ["prefix"]), str(b)[:300])
        json_answers_ok("json_mode_%s_chat_completions" % tag,
                        answers(S, "用JSON回答", 12, True, path="/v1/chat/completions"), min_stop=2)
        json_answers_ok("json_mode_%s_n2" % tag, answers(S, "写一个JSON对象", 6, True, {"n": 2}), min_stop=2)
        st, raw = sc.http(S.port, "POST", "/v1/completions", {"prompt": "写一个JSON对象", "max_tokens": 100, "temperature": 1.0,
                                                              "top_p": 1.0, "seed": 101, "stream": True,
                                                              "response_format": JSON_OBJ}, timeout=180)
        ev = [json.loads(x[6:]) for x in (raw if isinstance(raw, str) else "").split("\n\n") if x.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in ev if e.get("choices"))
        one = answers(S, "写一个JSON对象", 2, True)
        T.check("json_mode_%s_stream_joins_to_the_answer" % tag, st == 200 and one is not None and text == one[1][0],
                "%r vs %r" % (text[:80], one and one[1][0][:80]))
        if tag != "glm2":
            return
        for body, field in (({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
                            ({"response_format": {"type": "yaml"}}, "response_format"),
                            ({"response_format": "json_object"}, "response_format"),
                            ({"response_format": JSON_OBJ, "ignore_eos": True}, "ignore_eos"),
                            ({"response_format": JSON_OBJ, "min_tokens": 3}, "min_tokens")):
            st, b = post(S, dict(body, prompt="x", max_tokens=4))
            T.check("json_mode_refuses_%s_%s" % (field, json.dumps(body)[20:44].replace(" ", "").replace("\"", "")),
                    st == 400 and b["error"]["param"] == field, "%s %s" % (st, b))
    finally:
        S.stop()


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                      "ok": {"type": "boolean"}, "score": {"type": ["number", "null"]},
                                      "kind": {"enum": ["a", "b", 3, None, True]}},
     "required": ["name", "age"]},
    {"type": "object", "title": "t", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "nick": {"type": ["string", "null"]}},
                 "required": ["id"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 2,
                  "items": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}},
     "required": ["user", "items"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"const": "固定"}, "b": {"type": "array", "items": {"type": "integer"}}}},
    {"type": "object", "properties": {"q": {"type": "boolean"}, "r": {"type": "null"}, "s": {"type": "string"}},
     "required": ["s"]},
]


def instance(rng, s, depth=0):
    """A random value of schema s, objects' properties in the schema's order."""
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    t = s["type"]
    t = rng.choice(t) if isinstance(t, list) else t
    if t == "object":
        return {k: instance(rng, v, depth + 1) for k, v in s["properties"].items()
                if k in s.get("required", []) or rng.random() < 0.5}
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", 3)
        return [instance(rng, s["items"], depth + 1) for _ in range(rng.randint(lo, hi))]
    return {"string": lambda: rand_string(rng), "integer": lambda: rng.randint(-50, 50000),
            "number": lambda: rng.choice([0.5, -2, 1e-3, 7, 3.25e8]), "boolean": lambda: rng.random() < 0.5,
            "null": lambda: None}[t]()


def schema_verdicts(pairs):
    lines = "".join(json.dumps([s, t]) + "\n" for s, t in pairs)
    p = subprocess.run([tool("tool_schema_mode")], input=lines, capture_output=True, text=True, timeout=120)
    return p.stdout.split("\n")[:len(pairs)] if p.returncode == 0 else None


def schema_valid(s, text):
    import jsonschema
    if not py_object(text):
        return False
    try:
        jsonschema.validate(json.loads(text), s)
        return True
    except jsonschema.ValidationError:
        return False


def schema_checks():
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        T.skip("schema_mode_recognizer", "python3-jsonschema is not installed (scripts/install-deps.sh)")
        return False
    rng = random.Random(8)
    docs = []
    for _ in range(2000):
        s = rng.choice(SCHEMAS)
        # (an enum's value is written as the schema spells it: UTF-8, not \\u escapes)
        docs.append((s, json.dumps(instance(rng, s), ensure_ascii=False, indent=rng.choice([None, None, 1]),
                                   separators=rng.choice([(",", ":"), (", ", ": ")]))))
    got = schema_verdicts(docs)
    bad = [(d, g) for d, g in zip(docs, got or []) if g != "done" or not schema_valid(*d)]
    T.check("schema_mode_instances_done", got is not None and not bad, str(bad[:2]))
    alphabet = "{}[]\":,.-+eE0123456789 tfnrulax\\"
    muts = []
    for _ in range(8000):
        s, d = rng.choice(docs)
        muts.append((s, mutate(rng, d, alphabet)))
    got = schema_verdicts(muts)
    bad = [(m, g) for m, g in zip(muts, got or []) if g == "done" and not schema_valid(*m)]
    done = sum(1 for g in got or [] if g == "done")
    T.check("schema_mode_mutations_done_only_when_valid", got is not None and not bad and done > 300,
            "%d taken but invalid, e.g. %s (%d done)" % (len(bad), bad[:2], done))
    return True


def schema_server_checks(model, tag):
    S = sc.Server(model, "--max_batch_size", "4")
    try:
        st, tk = post(S, {"prompt": "\"a\":1,\"b\":2}", "add_special_tokens": False}, "/tokenize")
        bias = {str(t): 4.0 for t in (tk["tokens"] if st == 200 else [])}
        for i, s in enumerate(SCHEMAS):
            for how in ("response_format", "guided_json"):
                if how == "guided_json" and i != 1:
                    continue
                extra = {"logit_bias": bias, "max_tokens": 160}
                if how == "response_format":
                    extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": s,
                                                                                       "strict": True}}
                else:
                    extra["guided_json"] = json.dumps(s)
                outs = answers(S, "写一个JSON对象", 8, False, extra)
                stops = [t for t, f in outs or [] if f == "stop"]
                cut = [t for t, f in outs or [] if f == "length"]
                pv = schema_verdicts([(s, t) for t in cut]) if cut else []
                # (GLM v1's tiny tokenizer seldom closes a string: its answers are checked, not counted)
                T.check("schema_%s_%s_%d" % (tag, how, i), outs is not None and (len(stops) >= 2 or tag != "glm2") and
                        all(schema_valid(s, t) for t in stops) and all(v == "prefix" for v in pv),
                        "%d stopped %s, %d cut %s" % (len(stops), [t[:80] for t in stops if not schema_valid(s, t)][:2],
                                                      len(cut), [(t[:60], v) for t, v in zip(cut, pv) if v != "prefix"][:2]))
        if tag != "glm2":
            return
        obj = {"type": "object", "properties": {"a": {"type": "string"}}}
        for body, field, want in (
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                    "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}}}, "response_format", "pattern"),
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
                                                                                                     "items": obj}}}},
                 "response_format", "root"),
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
                ({"guided_json": "{not json"}, "guided_json", "object"),
                ({"guided_json": obj, "response_format": {"type": "json_object"}}, "guided_json", "one of them"),
                ({"guided_json": obj, "ignore_eos": True}, "ignore_eos", "complete")):
            st, b = post(S, dict(body, prompt="x", max_tokens=4))
            T.check("schema_refuses_%s" % want.replace(" ", "_"), st == 400 and b["error"]["param"] == field and
                    want in b["error"]["message"], "%s %s" % (st, b))
    finally:
        S.stop()


CHOICES = ["正面", "负面", "yes", "yes please", "这是一个由许多个词组成的很长的选择"]


def choice_checks(model, tag, lookup=False):
    S = sc.Server(model, "--max_batch_size", "4", *(["--prompt_lookup_num_tokens", "8"] if lookup else []))
    try:
        got = answers(S, "这句话的情感是", 14, False, {"guided_choice": CHOICES, "max_tokens": 100})
        T.check("guided_choice_%s_answers_are_choices" % tag, got is not None and
                all(t in CHOICES and f == "stop" for t, f in got) and len({t for t, _ in got}) >= 2,
                str(got and [(t, f) for t, f in got if t not in CHOICES or f != "stop"][:3] or got))
        if lookup:
            return
        plain = answers(S, "这句话的情感是", 14, False, {"max_tokens": 40})
        T.check("guided_choice_%s_without_it_otherwise" % tag, plain is not None and
                sum(1 for t, _ in plain if t not in CHOICES) >= 10, str(plain and plain[:2]))
        chat = answers(S, "好吗", 6, False, {"guided_choice": ["好", "不好"], "max_tokens": 20}, path="/v1/chat/completions")
        T.check("guided_choice_%s_chat" % tag, chat is not None and all(t in ("好", "不好") for t, _ in chat), str(chat))
        n3 = answers(S, "选择", 3, False, {"guided_choice": CHOICES, "n": 3, "max_tokens": 100})
        T.check("guided_choice_%s_n3" % tag, n3 is not None and len(n3) == 9 and all(t in CHOICES for t, _ in n3), str(n3))
        one = answers(S, "选择", 2, False, {"guided_choice": CHOICES[-1:], "max_tokens": 100})
        T.check("guided_choice_%s_long_choice" % tag, one is not None and all(t == CHOICES[-1] for t, _ in one), str(one))
        if tag != "glm2":
            return
        for bad, field in (("yes", "guided_choice"), ([], "guided_choice"), ([1], "guided_choice"), ([""], "guided_choice"),
                           (["c%d" % i for i in range(65)], "guided_choice")):
            st, b = post(S, {"prompt": "x", "max_tokens": 4, "guided_choice": bad})
            T.check("guided_choice_refuses_%s" % json.dumps(bad)[:12].replace(" ", "").replace("\"", ""),
                    st == 400 and b["error"]["param"] == field, "%s %s" % (st, b))
        for extra, field in (({"response_format": JSON_OBJ}, "guided_choice"), ({"ignore_eos": True}, "ignore_eos"),
                             ({"min_tokens": 2}, "min_tokens")):
            st, b = post(S, dict(extra, prompt="x", max_tokens=4, guided_choice=["a"]))
            T.check("guided_choice_refuses_with_%s" % list(extra)[0], st == 400 and b["error"]["param"] == field,
                    "%s %s" % (st, b))
    finally:
        S.stop()


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP json_mode: %s not built" % sc.GLM)
        return 0
    recognizer_checks()
    have_jsonschema = schema_checks()
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-json-")
    try:
        model, _, _ = make_glm2(tmp)
        server_checks(model, "glm2")
        server_checks(model, "glm2_lookup", lookup=True)
        choice_checks(model, "glm2")
        if have_jsonschema:
            schema_server_checks(model, "glm2")
        choice_checks(model, "glm2_lookup", lookup=True)
        os.makedirs(os.path.join(tmp, "v1"))
        v1, _, _ = sc.make_model(os.path.join(tmp, "v1"))
        server_checks(v1, "glm1")
        choice_checks(v1, "glm1")
        if have_jsonschema:
            schema_server_checks(v1, "glm1")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
