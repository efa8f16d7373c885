#!/usr/bin/env python3
"""Decoding constraints in `glmtrain generate` and `glmtrain chat` (--guided_choice,
--guided_json, --guided_json_object: vLLM's guided decoding names; infer/constrain.h through
glm_gen_cfg.constraint), on tiny random models (ChatGLM2 family and GLM v1, CPU):

  * --guided_choice (a JSON list, or a file of one choice a line): every sampled answer is one of
    the choices, more than one comes up, the same runs without it answer otherwise; in chat too;
  * --guided_json (a schema's text or a .json file): --input_file's predictions, 4 rows a batch,
    that end are JSON the schema allows (the jsonschema package), those cut by --max_new_tokens
    are prefixes the recognizer takes; JSON mode's answers parse as objects and hold no
    replacement character (strings are well-formed UTF-8);
  * --guided_regex: every sampled answer matches whole (Python's re.fullmatch), several differ;
  * with prompt lookup's drafts the answers are the same tokens (bit for bit on the CPU);
  * ChatGLM-6B's punctuation widening is not applied to a constrained answer (a choice with an
    ASCII comma after a CJK character comes back as it is);
  * refused, naming the flag: two constraints, a schema that is not JSON (its line), a keyword
    the recognizer does not support, an empty choices file, a list with a non-string.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks, tool  # noqa: E402

T = Checks()
REGEX = r"(\d{3}-[a-c]{2}|[中文]{1,3}x?)"
CHOICES = ["正面", "负面", "yes", "yes please", "这是一个由许多个词组成的很长的选择"]
SCHEMA = {"type": "object", "properties": {
    "label": {"enum": ["正面", "负面"]}, "score": {"type": "number", "minimum": 0, "maximum": 1},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    "note": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}},
    "required": ["label", "score", "tags", "note"]}


def gen(model, *flags, prompt="这句话的情感是"):
    args = [sc.GLM, "generate", "--model_name_or_path", model, "--device", "cpu"] + list(flags)
    if prompt is not None:
        args += ["--prompt", prompt]
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=180, env=sc.ENV)


def answers(model, flags, seeds=range(12)):
    out = []
    for s in seeds:
        p = gen(model, "--do_sample", "true", "--temperature", "1.0", "--top_p", "1.0", "--seed", str(s),
                "--max_new_tokens", "60", *flags)
        if p.returncode != 0:
            return None, p.stderr[-300:]
        out.append(p.stdout.rstrip("\n"))
    return out, ""


def schema_verdicts(s, texts):
    lines = "".join(json.dumps([s, t]) + "\n" for t in texts)
    p = subprocess.run([tool("tool_schema_mode")], input=lines, capture_output=True, text=True, timeout=60)
    return p.stdout.split("\n")[:len(texts)]


def valid(s, text):
    try:
        import jsonschema
        jsonschema.Draft202012Validator(s).validate(json.loads(text))
        return True
    except Exception:  # noqa: BLE001 (not JSON, or not valid)
        return False


def choice_checks(model, tag, tmp):
    got, why = answers(model, ["--guided_choice", json.dumps(CHOICES, ensure_ascii=False)])
    T.check("guided_choice_%s_answers_are_choices" % tag, got is not None and all(t in CHOICES for t in got) and
            len(set(got)) >= 2, str(got or why))
    plain, why = answers(model, [])
    T.check("guided_choice_%s_without_it_otherwise" % tag, plain is not None and
            sum(1 for t in plain if t not in CHOICES) >= 10, str(plain and plain[:2] or why))
    f = os.path.join(tmp, "choices_%s.txt" % tag)
    with open(f, "w") as fh:
        fh.write("好\n\n不好\n")
    got, why = answers(model, ["--guided_choice", f], seeds=range(6))
    T.check("guided_choice_%s_file" % tag, got is not None and all(t in ("好", "不好") for t in got), str(got or why))
    msgs = "你好\n这句话的情感是\n"
    p = subprocess.run([sc.GLM, "chat", "--model_name_or_path", model, "--device", "cpu", "--max_new_tokens", "30",
                        "--guided_choice", json.dumps(["好的", "不行"], ensure_ascii=False)], input=msgs,
                       capture_output=True, text=True, errors="replace", timeout=180, env=sc.ENV)
    said = [ln.split("ChatGLM:", 1)[1].strip() for ln in p.stdout.split("\n") if "ChatGLM:" in ln]
    T.check("guided_choice_%s_chat" % tag, p.returncode == 0 and len(said) == 2 and all(t in ("好的", "不行") for t in said),
            "%s %s" % (said, p.stderr[-300:]))


def json_checks(model, tag, tmp):
    data = os.path.join(tmp, "in_%s.json" % tag)
    with open(data, "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": "写一个JSON对象%d" % i, "response": "{}"}, ensure_ascii=False) + "\n")
    sf = os.path.join(tmp, "schema.json")
    with open(sf, "w") as f:
        json.dump(SCHEMA, f)
    preds = {}
    for name, flags in (("plain", []), ("lookup", ["--prompt_lookup_num_tokens", "6"])):
        out = os.path.join(tmp, "pred_%s_%s.jsonl" % (tag, name))
        p = gen(model, "--input_file", data, "--output_file", out, "--do_sample", "true", "--seed", "9",
                "--temperature", "1.0", "--top_p", "1.0", "--max_new_tokens", "220", "--per_device_eval_batch_size", "4",
                "--guided_json", sf, *flags, prompt=None)
        preds[name] = ([json.loads(ln)["predict"] for ln in open(out)] if p.returncode == 0 else None, p.stderr[-300:])
    got, why = preds["plain"]
    ok = got is not None and len(got) == 8
    verdicts = schema_verdicts(SCHEMA, got) if ok else []
    whole = [t for t, v in zip(got or [], verdicts) if v == "done"]
    T.check("guided_json_%s_input_file_predictions" % tag, ok and all(v in ("done", "prefix") for v in verdicts) and
            all(valid(SCHEMA, t) for t in whole) and (len(whole) >= 2 or tag != "glm2"),
            "%s %s %s" % (verdicts, [t[:60] for t in (got or [])][:3], why))
    T.check("guided_json_%s_prompt_lookup_same" % tag, preds["lookup"][0] == got and got is not None,
            "%s vs %s" % (preds["lookup"][0] and preds["lookup"][0][:2], got and got[:2]))
    obj, why = answers(model, ["--guided_json_object", "--max_new_tokens", "120"])
    parsed = []
    for t in obj or []:
        try:
            parsed.append(isinstance(json.loads(t), dict))
        except ValueError:
            parsed.append(None)  # cut by the limit
    T.check("guided_json_object_%s_objects_no_replacement_chars" % tag, obj is not None and all(x is not False for x in parsed)
            and not any("\ufffd" in t.rstrip("\ufffd") for t in obj)  # (an answer cut inside a character ends in one)
            and (parsed.count(True) >= 1 or tag != "glm2"), str(obj and obj[:2] or why))


def refusal_checks(model, tmp):
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"type": "object",\n "properties": {"a": }}')
    for flags, want in ((["--guided_choice", '["a"]', "--guided_json_object"], "more than one of --guided_json"),
                        (["--guided_json", bad], "line 2"),
                        (["--guided_json", '{"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}'],
                         "\"format\" uri is not supported"),
                        (["--guided_json", '[1]'], "the schema must be a JSON object"),
                        (["--guided_choice", empty], "--guided_choice"),
                        (["--guided_choice", '["a", 1]'], "non-empty strings"),
                        (["--guided_choice", os.path.join(tmp, "missing.txt")], "missing.txt"),
                        (["--guided_regex", "a(?=b)"], "lookarounds"),
                        (["--guided_regex", "a", "--guided_choice", '["a"]'], "--guided_regex")):
        p = gen(model, *flags)
        T.check("guided_refuses_%s" % want.replace(" ", "_").replace("\"", "").replace("-", ""),
                p.returncode != 0 and want in p.stderr, p.stderr[-300:])


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP generate_guided: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-guided-")
    try:
        g2, _, _ = make_glm2(tmp)
        os.makedirs(os.path.join(tmp, "v1"))
        v1, _, _ = sc.make_model(os.path.join(tmp, "v1"))
        choice_checks(g2, "glm2", tmp)
        choice_checks(v1, "glm1", tmp)
        json_checks(g2, "glm2", tmp)
        json_checks(v1, "glm1", tmp)
        got, why = answers(v1, ["--guided_choice", json.dumps(["好,不好", "中:"], ensure_ascii=False)], seeds=range(4))
        T.check("guided_choice_glm1_no_punctuation_widening", got is not None and all(t in ("好,不好", "中:") for t in got),
                str(got or why))
        for model, tag in ((g2, "glm2"), (v1, "glm1")):
            got, why = answers(model, ["--guided_regex", REGEX])
            T.check("guided_regex_%s_answers_match" % tag, got is not None and all(re.fullmatch(REGEX, t) for t in got) and
                    len(set(got)) >= 3, str(got or why))
        refusal_checks(g2, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
