#!/usr/bin/env python3
"""Structured outputs' schema keywords beyond the basic ones (infer/schema_compile.c,
infer/schema_mode.c): $ref / $defs / definitions (recursion included), allOf of one, anyOf and oneOf
of different types (Optional[X]), maps (additionalProperties without properties), any values (true,
{}), discriminated unions (anyOf / oneOf of objects told apart by their first property), uniqueItems
over enums, maps' minProperties / maxProperties, OpenAPI's nullable, prefixItems
and items false, minLength / maxLength, minimum / maximum / exclusiveMinimum /
exclusiveMaximum on integers and numbers, pattern and format (date-time, date, time, uuid, email, ipv4).

  * the recognizer (tests/c/tool_schema_mode) against the jsonschema package (Draft 2020-12) on 9
    schemas that use them all (patterns and formats also against re.fullmatch and Python's own
    parsers: datetime's fromisoformat, uuid.UUID, ipaddress): 2,500 random instances (json.dumps with and without \\u escapes,
    so a surrogate pair counts as one character, spaces and indents) are "done", 10,000 mutations
    are "done" only where jsonschema validates;
  * the recognizer's own texts: 300 random walks a schema, each byte picked among those it takes,
    never reach a state that is not done and takes no byte (the masks would leave nothing), and the
    walks that finish validate (the bounded numbers' edges included: walks are made with bounds
    that a few digits reach);
  * schemas from Debian's pydantic (1.10: definitions, $ref, allOf around a $ref, enums, confloat /
    conint bounds, max_length, Dict[str, int]): pydantic's own .json() of random models is "done",
    the walks that finish parse with Model.parse_raw;
  * served on a tiny random ChatGLM2 (CPU): answers under a pydantic schema that stop parse with
    parse_raw and validate, those cut by max_tokens are prefixes;
  * every token mask at 24 places (JSON mode's and a schema's: strings with and without a length
    limit, at it, after a high surrogate, in the middle of a character, bounded numbers, keys,
    finished answers) keeps exactly the tokens whose bytes the recognizer takes, over the tiny
    model's vocabulary and ChatGLM-6B's real one (skipped when ../shared lacks it);
  * served, vLLM's guided_regex: answers match whole (re.fullmatch); refusals name the field; vLLM's
    structured_outputs (json, regex, choice, json_object) the same, its grammar refused by name;
  * 30 schemas refused, each naming the keyword or the reason (two alternatives of one type, a $ref
    to nowhere or outside, $ref beside other keywords, allOf of two, a pattern with a lookahead or
    too many states, a format not known, pattern with format or with a length, empty ranges,
    draft 4's boolean exclusiveMaximum, items as a list, keywords without a type, a $ref circle,
    maxLength below minLength, a negative count, an enum with no value of its type, false).
Prints PASS/FAIL/SKIP lines."""
import base64
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
import test_serve_constrained as tc  # noqa: E402
from harness import Checks, tool  # noqa: E402

T = Checks()

STEP = {"type": "object", "properties": {"explanation": {"type": "string", "maxLength": 6},
                                         "output": {"type": "string", "minLength": 2, "maxLength": 4}},
        "required": ["explanation", "output"], "additionalProperties": False}
SCHEMAS = [
    # pydantic v2's shapes: $defs, Optional as anyOf with null, an enum by $ref, allOf around a $ref
    {"$defs": {"Step": STEP, "Color": {"enum": ["red", "green", 7], "type": "string", "title": "Color"}},
     "type": "object", "title": "Math",
     "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}, "maxItems": 3},
                    "final": {"type": "string", "maxLength": 3},
                    "note": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}], "default": None},
                    "color": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "c"}},
     "required": ["steps", "final", "note"]},
    # recursion through "#", integer bounds
    {"type": "object", "properties": {"value": {"type": "integer", "minimum": -5, "exclusiveMaximum": 100},
                                      "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
     "required": ["value"]},
    # maps, any values, prefixItems, number bounds, an empty object, oneOf of three types
    {"type": "object", "properties": {
        "m": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}},
        "free": {},
        "t": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False, "minItems": 1},
        "any": True,
        "p": {"type": "number", "exclusiveMinimum": -2.5, "maximum": 0.3},
        "e": {"type": "object", "properties": {}, "additionalProperties": False},
        "u": {"oneOf": [{"type": "integer", "maximum": 9}, {"type": "array", "items": {"type": "boolean"}},
                        {"const": "x"}]}},
     "required": ["m", "t", "p"]},
    # definitions (draft 7's name), a linked list by Optional $ref, bounds that meet, a map of arrays
    {"definitions": {"Node": {"type": "object", "properties": {
        "v": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.75},
        "next": {"anyOf": [{"$ref": "#/definitions/Node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
     "type": "object", "properties": {"head": {"$ref": "#/definitions/Node"},
                                      "k": {"type": "integer", "minimum": 7, "maximum": 7},
                                      "tags": {"type": "object", "additionalProperties": {
                                          "type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 1}}},
                                      "neg": {"type": ["integer", "null"], "maximum": -10}},
     "required": ["head", "k"]},
    # a tuple with more items after it, numbers near zero and of many digits
    {"type": "object", "properties": {
        "tup": {"type": "array", "prefixItems": [{"const": "a"}, {"type": "boolean"}],
                "items": {"type": "number", "minimum": -0.001, "maximum": 123456.789}, "maxItems": 5},
        "s": {"type": "string", "minLength": 3},
        "q": {"type": "number", "minimum": -1, "maximum": -0.5}, "r": {"type": "number", "exclusiveMinimum": 0.25,
                                                                          "exclusiveMaximum": 0.5}},
     "required": ["tup", "s", "q", "r"]},
]
SCHEMAS.append(  # patterns and formats (matched whole; escapes fed as the characters they write)
    {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"}, "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "time"}, "id": {"type": "string", "format": "uuid"},
        "mail": {"type": "string", "format": "email"}, "ip": {"type": "string", "format": "ipv4"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        "zh": {"type": "string", "pattern": "[一-龥]{1,3}(,[一-龥]+)?"}, "q": {"type": "string", "pattern": "a\"?\\\\b"}},
     "required": ["when", "code", "zh"]})
SCHEMAS.append(  # discriminated unions (objects told apart by a required const/enum first property), recursive too
    {"$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"},
                                                         "lives": {"type": "integer", "minimum": 0, "maximum": 9}},
                       "required": ["kind", "lives"]},
               "Dog": {"type": "object", "properties": {"kind": {"enum": ["dog", "puppy"]}, "name": {"type": "string", "maxLength": 4}},
                       "required": ["kind"]},
               "Expr": {"anyOf": [{"type": "object", "properties": {"op": {"const": "num"}, "v": {"type": "integer"}},
                                   "required": ["op", "v"]},
                                  {"type": "object", "properties": {"op": {"const": "add"}, "a": {"$ref": "#/$defs/Expr"},
                                                                    "b": {"$ref": "#/$defs/Expr"}}, "required": ["op", "a", "b"]}]}},
     "type": "object", "properties": {
         "pet": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]},
         "pets": {"type": "array", "items": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}, "maxItems": 3},
         "e": {"$ref": "#/$defs/Expr"}},
     "required": ["pet", "e"]})
SCHEMAS.append(  # a list that nests as deep as the recognizer allows: only null has room at the bottom
    {"$defs": {"N": {"type": ["object", "null"], "properties": {"n": {"$ref": "#/$defs/N"}, "v": {"type": "integer"}},
                     "required": ["n"]}},
     "type": "object", "properties": {"list": {"$ref": "#/$defs/N"}}, "required": ["list"]})
SCHEMAS.append(  # uniqueItems over an enum, a map's key counts, OpenAPI's nullable
    {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["a", "b", "ab", 1, True]}, "uniqueItems": True, "minItems": 1},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
        "n": {"type": "string", "nullable": True, "maxLength": 3}},
     "required": ["tags", "m", "n"]})
SAMPLES = {"date-time": ["2024-01-31T12:00:00Z", "1999-12-31T23:59:59.123456+05:30", "2023-06-30T00:00:00-08:00"],
           "date": ["2024-02-28", "1000-01-01", "2023-11-30"], "time": ["00:00:00Z", "23:59:59.5+01:00"],
           "uuid": ["123e4567-e89b-12d3-a456-426614174000"], "email": ["a.b+c@example.co.uk", "x@y.z"],
           "ipv4": ["192.168.0.1", "255.255.255.255", "0.0.0.0"], "^[A-Z]{2}-\\d{3}$": ["AB-123", "ZZ-000"],
           "[一-龥]{1,3}(,[一-龥]+)?": ["中文", "一,二三"], "a\"?\\\\b": ["a\\b", "a\"\\b"]}


def format_ok(fmt, v):
    """Python's own parsers: what a format's answer must be."""
    import datetime
    import ipaddress
    import uuid
    try:
        {"date-time": datetime.datetime.fromisoformat, "date": datetime.date.fromisoformat,
         "time": datetime.time.fromisoformat, "uuid": uuid.UUID, "ipv4": ipaddress.IPv4Address,
         "email": lambda x: x.index("@")}[fmt](v)
        return fmt != "date-time" or "T" in v
    except ValueError:
        return False


def formats_ok(s, doc):
    """Every string with a format in doc (as text) parses; every pattern matches whole."""
    try:
        d = json.loads(doc)
    except ValueError:
        return False
    for k, sub in s.get("properties", {}).items():
        if not isinstance(sub, dict) or not isinstance(d, dict) or not isinstance(d.get(k), str):
            continue
        if k in d and "format" in sub and not format_ok(sub["format"], d[k]):
            return False
        if k in d and "pattern" in sub and not re.fullmatch(sub["pattern"], d[k]):
            return False
    return True


CHARS = ["a", "Z", " ", "中", "é", "\n", "\"", "\\", "/", "\t", "\u0001", "😀", "\U0001F600"]


def resolve(root, ref):
    at = root
    for seg in (ref[2:].split("/") if ref != "#" else []):
        seg = seg.replace("~1", "/").replace("~0", "~")
        at = at[int(seg)] if isinstance(at, list) else at[seg]
    return at


def number_in(rng, s, integer):
    lo, hi = s.get("minimum"), s.get("maximum")
    xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    def ok(x):
        return ((lo is None or x >= lo) and (hi is None or x <= hi) and (xlo is None or x > xlo) and
                (xhi is None or x < xhi))
    a = max(v for v in (lo, xlo, -1000) if v is not None) if (lo is not None or xlo is not None) else -1000
    b = min(v for v in (hi, xhi) if v is not None) if (hi is not None or xhi is not None) else a + 2000
    for _ in range(1000):
        if integer:
            x = rng.choice([int(a), int(a) + 1, int(b), int(b) - 1, rng.randint(int(a) - 1, int(b) + 1)])
        else:
            x = rng.choice([a, b, round(rng.uniform(a, b), 3), round(rng.uniform(a, b), rng.randint(0, 6)), 0.0, -0.0])
            if x != 0 and abs(x) < 1e-3:
                continue  # (json.dumps writes those with an exponent, which a bounded number does not take)
        if ok(x):
            return x
    raise AssertionError("no number for %s" % s)


def text_of_length(rng, n):
    return "".join(rng.choice(CHARS) for _ in range(n))


def instance(rng, root, s, depth=0):
    """A random value of schema s (inside root), objects' properties in the schema's order."""
    if s is True or (isinstance(s, dict) and not set(s) - {"title", "description", "default"}):
        return tc.rand_value(rng, 3)
    while "$ref" in s or "allOf" in s:
        s = resolve(root, s["$ref"]) if "$ref" in s else s["allOf"][0]
    alts = s.get("anyOf") or s.get("oneOf")
    if alts:
        if depth >= 3:  # (stop a recursion: an alternative without a $ref in it)
            alts = [a for a in alts if "$ref" not in json.dumps(a)] or alts
        return instance(rng, root, rng.choice(alts), depth + 1)
    if "const" in s:
        return s["const"]
    t = s.get("type")
    if s.get("nullable") and rng.random() < 0.3:
        return None
    if "enum" in s:
        return rng.choice([v for v in s["enum"] if t != "string" or isinstance(v, str)])
    t = rng.choice(t) if isinstance(t, list) else t
    if t == "object":
        props = s.get("properties")
        if props:
            return {k: instance(rng, root, v, depth + 1) for k, v in props.items()
                    if k in s.get("required", []) or (depth < 3 and rng.random() < 0.5)}
        ap = s.get("additionalProperties", True)
        if ap is False:
            return {}
        out = {}
        want = rng.randint(s.get("minProperties", 0), s.get("maxProperties", 3))
        while len(out) < want:
            out[text_of_length(rng, rng.randint(0, 3))] = (tc.rand_value(rng, 3) if ap is True else
                                                           instance(rng, root, ap, depth + 1))
        return out
    if t == "array":
        pre, items = s.get("prefixItems", []), s.get("items", True)
        hi = s.get("maxItems", len(pre) + 3)
        if items is False:
            hi = min(hi, len(pre))
        if depth >= 3:
            hi = min(hi, len(pre))
        if s.get("uniqueItems"):
            vals = list(items["enum"])
            rng.shuffle(vals)
            return vals[:rng.randint(s.get("minItems", 0), min(hi, len(vals)))]
        n = rng.randint(min(s.get("minItems", 0), hi), hi)
        return [instance(rng, root, pre[i] if i < len(pre) else items, depth + 1) for i in range(n)]
    if t == "string":
        if "format" in s or "pattern" in s:
            return rng.choice(SAMPLES[s.get("format") or s["pattern"]])
        return text_of_length(rng, rng.randint(s.get("minLength", 0), s.get("maxLength", 5)))
    if t in ("integer", "number"):
        return number_in(rng, s, t == "integer")
    if t == "boolean":
        return rng.random() < 0.5
    return None


def verdicts(pairs, *args):
    lines = "".join(json.dumps([s, t]) + "\n" for s, t in pairs)
    p = subprocess.run([tool("tool_schema_mode"), *args], input=lines, capture_output=True, text=True, timeout=300)
    return p.stdout.split("\n")[:-1] if p.returncode == 0 else None


def to_jsonschema(s):
    """OpenAPI's nullable said as JSON Schema says it (jsonschema knows no nullable)."""
    if isinstance(s, list):
        return [to_jsonschema(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: to_jsonschema(v) for k, v in s.items() if k != "nullable"}
    if s.get("nullable") and isinstance(s.get("type"), str):
        out["type"] = [s["type"], "null"]
    return out


def valid(s, text):
    import jsonschema
    s = to_jsonschema(s)
    if not tc.py_object(text) or not formats_ok(s, text):
        return False
    try:
        jsonschema.Draft202012Validator(s).validate(json.loads(text))
        return True
    except jsonschema.ValidationError:
        return False


def dumps(rng, v):
    return json.dumps(v, ensure_ascii=rng.random() < 0.4, indent=rng.choice([None, None, 1]),
                      separators=rng.choice([(",", ":"), (", ", ": ")]))


def recognizer_checks():
    rng = random.Random(11)
    docs = [(s, dumps(rng, instance(rng, s, s))) for s in (rng.choice(SCHEMAS) for _ in range(2500))]
    bad = [d for d in docs if not valid(*d)]
    T.check("schema_keywords_instances_valid", not bad, str(bad[:1]))  # (the generator itself)
    got = verdicts(docs)
    bad = [(d, g) for d, g in zip(docs, got or []) if g != "done"]
    T.check("schema_keywords_instances_done", got is not None and len(got) == len(docs) and not bad, str(bad[:2]))
    alphabet = "{}[]\":,.-+eE0123456789 tfnrulax\\"
    muts = [(s, tc.mutate(rng, d, alphabet)) for s, d in (rng.choice(docs) for _ in range(10000))]
    got = verdicts(muts)
    bad = [(m, g) for m, g in zip(muts, got or []) if g == "done" and not valid(*m)]
    done = sum(1 for g in got or [] if g == "done")
    T.check("schema_keywords_mutations_done_only_when_valid", got is not None and not bad and done > 500,
            "%d taken but invalid, e.g. %s (%d done)" % (len(bad), bad[:2], done))
    deep = SCHEMAS[7]  # (the list: a value at frame 15 has no room for an object that needs one more)
    head = '{"list":' + '{"n":' * 14
    got = verdicts([(deep, head + "null" + "}" * 15), (deep, head + '{"n":null}' + "}" * 15), (deep, head[:-5] + '{"n":n')])
    T.check("schema_keywords_depth_room", got == ["done", "refused %d" % len(head), "prefix"], str(got))
    empty = obj(m={"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 0})
    got = verdicts([(empty, '{"m": {}}'), (empty, '{"m": {"a": 1}}')])
    T.check("schema_keywords_map_of_no_keys", got == ["done", "refused 7"], str(got))
    for i, s in enumerate(SCHEMAS):
        walk_checks("schema_keywords_walks_%d" % i, s, lambda t, s=s: valid(s, t), i)


def walk_checks(name, s, ok, seed, n=300):
    out = verdicts([(s, seed)], "--walk", str(n))
    rows = [json.loads(r) for r in out or []]
    stuck = [t for v, t in rows if v == "stuck"]
    done = [t for v, t in rows if v == "done"]
    bad = [t for t in done if not ok(t)]
    T.check(name, out is not None and len(rows) == n and not stuck and not bad and len(done) >= n // 5,
            "%d rows, %d stuck %s, %d done, %d invalid %s" % (len(rows), len(stuck), stuck[:1], len(done), len(bad),
                                                            bad[:1]))


def pydantic_models():
    from enum import Enum
    from typing import Dict, List, Optional
    from pydantic import BaseModel, Field, confloat, conint

    class Color(str, Enum):
        red = "red"
        green = "green"

    class Step(BaseModel):
        explanation: str = Field(..., max_length=8)
        output: str

    class Answer(BaseModel):
        steps: List[Step] = Field(..., max_items=3)
        final: str = Field(..., max_length=10)
        confidence: confloat(ge=0, le=1)
        count: conint(ge=1, lt=10)
        color: Optional[Color] = Field(None, description="the colour")
        extra: Dict[str, int] = {}

    def random_answer(rng):
        steps = [Step(explanation=text_of_length(rng, rng.randint(0, 8)), output=text_of_length(rng, 3))
                 for _ in range(rng.randint(0, 3))]
        kw = {}
        if rng.random() < 0.5:
            kw["color"] = rng.choice(list(Color))
        return Answer(steps=steps, final=text_of_length(rng, rng.randint(0, 10)), confidence=rng.choice([0, 1, 0.25, 0.5]),
                      count=rng.randint(1, 9), extra={text_of_length(rng, 2): rng.randint(-9, 9) for _ in range(2)}, **kw)
    return Answer, random_answer


def pydantic_checks():
    try:
        Answer, random_answer = pydantic_models()
    except ImportError:
        T.skip("schema_keywords_pydantic", "python3-pydantic is not installed (scripts/install-deps.sh)")
        return None
    rng = random.Random(5)
    s = Answer.schema()
    # (exclude_none: pydantic 1 writes a missing Optional[Color] as null, which its own schema's enum refuses)
    texts = [random_answer(rng).json(ensure_ascii=rng.random() < 0.5, exclude_none=True) for _ in range(300)]
    got = verdicts([(s, t) for t in texts])
    bad = [(t, g) for t, g in zip(texts, got or []) if g != "done"]
    T.check("schema_keywords_pydantic_json_done", got is not None and not bad, str(bad[:2]))

    def parses(t):
        try:
            Answer.parse_raw(t)
            return valid(s, t)
        except Exception:  # noqa: BLE001 (pydantic's ValidationError and json's ValueError alike)
            return False
    walk_checks("schema_keywords_pydantic_walks_parse", s, parses, 3)
    return Answer


REAL_TOKENIZER = os.environ.get("GLM_TOKENIZER_MODEL", os.path.join(HERE, "..", "..", "..", "shared", "tokenizers",
                                                                     "chatglm-6b", "ice_text.model"))


def mask_checks(name, tokenizer):
    """Every mask (JSON mode's and a schema's fast paths: plain tokens in strings, a length limit's
    room, first bytes) against the recognizer token by token (tests/c/tool_mask_time --check)."""
    p = subprocess.run([tool("tool_mask_time"), "--check", tokenizer], capture_output=True, text=True, timeout=600)
    T.check(name, p.returncode == 0 and "tokens differ" in p.stdout and " 0 tokens differ" in p.stdout,
            (p.stdout + p.stderr)[-400:])


def server_checks(Answer):
    tmp = tempfile.mkdtemp(prefix="glmtrain-schema-")
    from test_serve_echo import make_glm2
    try:
        model, _, _ = make_glm2(tmp)
        mask_checks("schema_keywords_masks_equal_recognizer_tiny_vocab", model)
        # a byte-level BPE (GLM-4's tokenizer.model of base64 tokens and ranks) whose tokens also
        # end and start inside characters: the masks' handling of characters cut between tokens
        ranks = [bytes([i]) for i in range(256)]
        ranks += [t.encode() if isinstance(t, str) else t for t in
                  ("中", "文", "中文", b"\xe4\xb8", b"\xb8\xad", b"\xe6\x96", b"\x87x", "ab", "yes", "no", ", ", "maybe",
                   "12", "-a", "\"a", "{\"", "\":", "é", b"\xa9\xe4", b"\xe4\xb9", b"\xe6\x97", b"x\xe4", b"\xe4\xb8\xad\xe6", "😀", b"\xf0\x9f", b"\x98\x80a")]
        g4 = os.path.join(tmp, "glm4tok")
        os.makedirs(g4)
        with open(os.path.join(g4, "tokenizer.model"), "w") as f:
            for r, t in enumerate(ranks):
                f.write("%s %d\n" % (base64.b64encode(t).decode(), r))
        mask_checks("schema_keywords_masks_equal_recognizer_byte_level_vocab", g4)
        if os.path.isfile(REAL_TOKENIZER):
            mask_checks("schema_keywords_masks_equal_recognizer_chatglm6b_vocab", REAL_TOKENIZER)
        else:
            T.skip("schema_keywords_masks_equal_recognizer_chatglm6b_vocab", "%s not found" % REAL_TOKENIZER)
        S = sc.Server(model, "--max_batch_size", "4")
        try:
            st, tk = tc.post(S, {"prompt": "\"a\":1,\"b\":2}", "add_special_tokens": False}, "/tokenize")
            bias = {str(t): 4.0 for t in (tk["tokens"] if st == 200 else [])}
            s = Answer.schema()
            outs = tc.answers(S, "写一个JSON对象", 8, False, {
                "logit_bias": bias, "max_tokens": 200,
                "response_format": {"type": "json_schema", "json_schema": {"name": "Answer", "schema": s}}})
            stops = [t for t, f in outs or [] if f == "stop"]
            cut = [t for t, f in outs or [] if f == "length"]
            pv = verdicts([(s, t) for t in cut]) if cut else []
            bad = []
            for t in stops:
                try:
                    Answer.parse_raw(t)
                except Exception:  # noqa: BLE001
                    bad.append(t)
            T.check("schema_keywords_served_pydantic", outs is not None and len(stops) >= 2 and not bad and
                    all(valid(s, t) for t in stops) and all(v == "prefix" for v in pv),
                    "%d stopped, %d do not parse %s, %d cut %s" % (len(stops), len(bad), bad[:1], len(cut), pv))
            rx = r"[0-9]{2,4}(-[a-z]{2})?|是|否"
            outs = tc.answers(S, "回答", 8, False, {"guided_regex": rx, "max_tokens": 40})
            T.check("served_guided_regex_answers_match", outs is not None and all(f == "stop" and re.fullmatch(rx, t)
                                                                                  for t, f in outs),
                    str(outs and [(t, f) for t, f in outs if f != "stop" or not re.fullmatch(rx, t)][:3]))
            for body, want in (({"guided_regex": "a\\1"}, "backreferences"), ({"guided_regex": 5}, "pattern"),
                               ({"guided_regex": "a", "guided_choice": ["a"]}, "one at a time"),
                               ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos")):
                st, b = tc.post(S, dict(body, prompt="x", max_tokens=4))
                T.check("served_guided_regex_refuses_%s" % want.replace(" ", "_"), st == 400 and
                        b["error"]["param"] in ("guided_regex", "ignore_eos") and want in b["error"]["message"] + b["error"]["param"],
                        "%s %s" % (st, b))
            # vLLM's structured_outputs (which replaced its guided_* fields)
            so = [({"choice": ["是", "否"]}, lambda t: t in ("是", "否")), ({"regex": rx}, lambda t: re.fullmatch(rx, t)),
                  ({"json": s}, lambda t: valid(s, t)), ({"json_object": True}, tc.py_object)]
            for body, ok in so:
                outs = tc.answers(S, "回答", 4, False, {"structured_outputs": body, "max_tokens": 200, "logit_bias": bias})
                stops = [t for t, f in outs or [] if f == "stop"]
                T.check("served_structured_outputs_%s" % list(body)[0], outs is not None and stops and all(ok(t) for t in stops),
                        str(outs and outs[:2]))
            for body, want in (({"structured_outputs": {"grammar": "root ::= x"}}, "grammar is not supported"),
                               ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "one of json"),
                               ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "a"}, "one constraint at a time"),
                               ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "string",
                                                                  "format": "uri"}}}}}, "uri is not supported"),
                               ({"structured_outputs": ["a"]}, "must be an object")):
                st, b = tc.post(S, dict(body, prompt="x", max_tokens=4))
                T.check("served_structured_outputs_refuses_%s" % want.replace(" ", "_"), st == 400 and
                        b["error"]["param"] == "structured_outputs" and want in b["error"]["message"], "%s %s" % (st, b))
            st, b = tc.post(S, {"prompt": "x", "max_tokens": 4, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": REFUSED[0][0]}}})
            T.check("schema_keywords_served_refusal_names_it", st == 400 and b["error"]["param"] == "response_format" and
                    REFUSED[0][1] in b["error"]["message"], "%s %s" % (st, b))
        finally:
            S.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def obj(**props):
    return {"type": "object", "properties": props}


REFUSED = [
    (obj(a={"anyOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}), "can both be a string"),
    (obj(a={"oneOf": [obj(x={"type": "integer"}), obj(y={"type": "integer"})]}), "has no required first property"),
    (obj(a={"anyOf": [dict(obj(k={"const": 1}), required=["k"]), dict(obj(k={"enum": [2, 1]}), required=["k"])]}),
     "can both be 1"),
    (obj(a={"anyOf": [dict(obj(k={"const": 1}), required=["k"]), dict(obj(j={"const": 2}), required=["j"])]}),
     "another first property"),
    (obj(a={"anyOf": [dict(obj(k={"type": "string"}), required=["k"]), dict(obj(k={"const": 2}), required=["k"])]}),
     "not a const or an enum"),
    (dict(obj(a={"$ref": "#/$defs/L"}), required=["a"], **{"$defs": {"L": dict(obj(n={"$ref": "#/$defs/L"}), required=["n"])}}),
     "never ends"),
    (obj(a={"anyOf": [{"type": "integer"}, {"type": "number"}]}), "can both be a number"),
    (obj(a={"$ref": "#/$defs/Missing"}), "names no place"),
    (obj(a={"$ref": "https://example.com/s.json"}), "must point inside"),
    (dict(obj(a={"$ref": "#/$defs/X", "type": "string"}), **{"$defs": {"X": {"type": "string"}}}), "beside other"),
    (obj(a={"allOf": [{"type": "string"}, {"maxLength": 2}]}), "allOf"),
    (obj(a={"type": "string", "pattern": "^x(?=y)"}), "\"pattern\": at 3: (? groups"),
    (obj(a={"type": "string", "format": "uri"}), "\"format\" uri is not supported"),
    (obj(a={"type": "string", "format": "date", "pattern": "x"}), "together are not supported"),
    (obj(a={"type": "string", "maxLength": 2, "pattern": "x{3}"}), "beside a pattern or format"),
    (obj(a={"type": "array", "items": {"type": "string"}, "uniqueItems": True}), "every item is an enum or const"),
    (obj(a={"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 3}), "below \"minItems\""),
    (obj(a={"type": "object", "properties": {"x": {"type": "string"}}, "minProperties": 1}), "supported on maps"),
    (obj(a={"type": "object", "additionalProperties": False, "minProperties": 1}), "no map has that many keys"),
    (obj(a={"type": "string", "pattern": "x{300}"}), "more than 256 states"),
    (obj(a={"type": "number", "minimum": 5, "maximum": 3}), "no number lies"),
    (obj(a={"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}), "no integer lies"),
    (obj(a={"type": "number", "maximum": 3, "exclusiveMaximum": True}), "exclusiveMaximum"),
    (obj(a={"type": "array", "items": [{"type": "string"}]}), "prefixItems"),
    (obj(a={"properties": {"x": {"type": "string"}}}), "without a \"type\""),
    (dict(obj(x={"$ref": "#/$defs/a"}), **{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
     "circle"),
    (obj(a={"type": "string", "minLength": 4, "maxLength": 2}), "below \"minLength\""),
    (obj(a={"type": "string", "minLength": -1}), "count"),
    (obj(a={"type": "integer", "enum": ["x", 1.5]}), "no value of"),
    (obj(a=False), "false allows no value"),
]


def utf8_checks():
    """Strings take well-formed UTF-8 only: a served string never holds a replacement character."""
    s = obj(a={"type": "string"}, b={"type": "string", "maxLength": 2})
    cases = [(b'{"a":"\xe4\xb8\xad\xf0\x9f\x98\x80"}', "done"), (b'{"a":"\xe4\xb8"}', "refused 8"),
             (b'{"a":"\x8f"}', "refused 6"), (b'{"a":"\xc0\x80"}', "refused 6"), (b'{"a":"\xed\xa0\x80"}', "refused 7"),
             (b'{"a":"\xf4\x90\x80\x80"}', "refused 7"), (b'{"a":"\xe0\x80\x80"}', "refused 7"),
             (b'{"b":"\xe4\xb8\xad\xe4\xb8\xad"}', "done"), (b'{"b":"\xe4\xb8\xad\xe4\xb8\xad\xe4"}', "refused 12"),
             (b'{"b":"\\ud83d\\ude00x"}', "done"), (b'{"b":"x\\ud83d\\ude00"}', "done"),
             (b'{"b":"xy\\ud83d"}', "refused 8"), (b'{"b":"x\\ud83d\\n"}', "refused 14"),
             (b'{"b":"x\\ud83d\\u0041"}', "refused 15")]
    lines = "".join(json.dumps([s, b.decode("latin-1"), "bytes"]) + "\n" for b, _ in cases)
    p = subprocess.run([tool("tool_schema_mode")], input=lines, capture_output=True, text=True, timeout=60)
    got = p.stdout.split("\n")[:len(cases)]
    bad = [(b, want, g) for (b, want), g in zip(cases, got) if g != want]
    T.check("schema_keywords_strings_utf8_and_lengths", len(got) == len(cases) and not bad, str(bad[:3]))


def refusal_checks():
    got = verdicts([(s, "{}") for s, _ in REFUSED])
    for (s, want), g in zip(REFUSED, got or [None] * len(REFUSED)):
        T.check("schema_keywords_refuses_%s" % want.replace(" ", "_").replace("\"", ""),
                g is not None and g.startswith("schema: ") and want in g, "%s -> %s" % (json.dumps(s)[:100], g))


def main():
    if not os.path.exists(tool("tool_schema_mode")):
        print("SKIP schema_keywords: %s not built" % tool("tool_schema_mode"))
        return 0
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        T.skip("schema_keywords", "python3-jsonschema is not installed (scripts/install-deps.sh)")
        return 0
    recognizer_checks()
    utf8_checks()
    refusal_checks()
    Answer = pydantic_checks()
    if Answer is not None and os.path.exists(sc.GLM):
        server_checks(Answer)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
