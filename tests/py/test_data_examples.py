#!/usr/bin/env python3
"""Training examples built by the C data layer (tool_data_examples: reader -> prompt rules ->
glm_tokenizer -> parallel encode -> cache) against a Python re-implementation of THUDM
ChatGLM-6B ptuning/main.py preprocess_function_train on top of sentencepiece with ChatGLM's
pre-processing (spec 5.5, 6.3), on a few hundred generated records with history, in the alpaca,
ptuning-columns and sharegpt formats.

Prompt rendering is checked on its own first (--prompts, no tokenizer needed); the token ids
need the real tokenizer file (../shared/tokenizers/chatglm-6b/ice_text.model) and the C
tokenizer, and SKIP when either is missing. Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("GLM_BUILD", os.path.join(ROOT, "build"))
TOOL = os.path.join(ROOT, BUILD, "tests", "tool_data_examples") if not os.path.isabs(BUILD) else \
    os.path.join(BUILD, "tests", "tool_data_examples")
failed = 0


def report(ok, name, why=""):
    global failed
    if ok:
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {why}")
    sys.stdout.flush()


def find_tokenizer():
    cands = [os.environ.get("GLM_TOKENIZER_DIR", ""),
             os.path.join(ROOT, "..", "shared", "tokenizers", "chatglm-6b"),
             os.path.join(ROOT, "shared", "tokenizers", "chatglm-6b")]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "ice_text.model")):
            return os.path.abspath(c)
    return None


# ---------------------------------------------------------------- the Python reference rules
def chatglm_preprocess(text):
    """ChatGLM-6B SPTokenizer._preprocess: newline, tab, then blank runs 80 down to 2."""
    text = text.replace("\n", "<n>").replace("\t", "<|tab|>")
    for i in range(80, 1, -1):
        text = text.replace(" " * i, f"<|blank_{i}|>")
    return text


def make_encoder(sp):
    def encode(text):  # tokenizer.encode(text, add_special_tokens=False)
        return [sp.PieceToId(p) for p in sp.EncodeAsPieces(chatglm_preprocess(text))]
    return encode


def render_prompt(rec, cfg):
    """ptuning/main.py prompt + the documented extensions (input, system, template, rounds rule)."""
    query, inp = rec["query"], rec.get("input") or ""
    hist, has_hist = rec.get("history") or [], rec["has_history"]
    tpl = cfg.get("prompt_template")
    htpl = cfg.get("history_template") or "[Round {i}]\n问：{q}\n答：{r}\n"
    hist_text = "".join(htpl.format(i=i, i1=i + 1, q=q, r=r) for i, (q, r) in enumerate(hist))
    full_query = query + ("\n" + inp if inp else "")
    system = rec.get("system") or ""
    out = cfg.get("source_prefix", "")
    if system and not (tpl and "{system}" in tpl):
        out += system + "\n"
    if tpl:
        instr = query if "{input}" in tpl else full_query
        out += tpl.format(instruction=instr, query=instr, input=inp, system=system, history=hist_text,
                          round=len(hist), round1=len(hist) + 1)
    elif (len(hist) > 0) if cfg.get("rounds") == "nonempty" else (has_hist or len(hist) > 0):
        out += hist_text + "[Round {}]\n问：{}\n答：".format(len(hist), full_query)
    else:
        out += full_query
    return out


def infer_seqlen(source_len, target_len, cutoff_len):
    """LLaMA-Factory's truncation rule, as chatglm3_data_ref.infer_seqlen (one definition)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import chatglm3_data_ref
    return chatglm3_data_ref.infer_seqlen(source_len, target_len, cutoff_len)


def build_example(rec, cfg, encode, sp_ids):
    """preprocess_function_train for one record; None when dropped."""
    if not (rec["query"] or rec.get("input")) or not rec["answer"]:
        return None  # `if examples[prompt_column][i] and examples[response_column][i]`
    S, T = cfg["max_source_length"], cfg["max_target_length"]
    a, b = encode(render_prompt(rec, cfg)), encode(rec["answer"])
    if cfg.get("cutoff_len"):  # LLaMA-Factory's rule over the prompt and the answer, the three specials counted
        s, t = infer_seqlen(len(a), len(b), cfg["cutoff_len"] - 3)
        a, b = a[:s], b[:t]
    else:
        a, b = a[: S - 1], b[: T - 2]
    if not b:
        return None  # glmtrain drops answers that encode to nothing (documented in examples.h)
    gmask, sop, eop = sp_ids
    ids = a + [gmask, sop] + b + [eop]
    ctx = ids.index(sop)
    labels = ids[:] if cfg.get("train_on_prompt") else [-100] * ctx + ids[ctx:]
    return ids, labels


# ---------------------------------------------------------------- generated records
POOL = ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "你好", "我是人工智能助手 ChatGLM-6B，很高兴见到你！",
        "Hello, world!", "def main():\n    print('hello world')\t# greeting", "  leading spaces", "trailing  ",
        "数字 12345 和 3.14159", "emoji 👋🎉", "罕见字 𠀀𪚥", "ＡＢＣ全角：，！？", "a\n\nb", "tab\tseparated\tvalues",
        "spaces" + " " * 5 + "five", "very" + " " * 85 + "long blank", "Ünïcödé café", "《送别》王维", "问：答：",
        "[Round 0]", "{braces} {{x}}", "\\n literal backslash", "CRLF\r\nline", "多行\n文本\n测试"]


def rand_text(rng, lo=1, hi=6):
    return "".join(rng.choice(POOL) for _ in range(rng.randint(lo, hi)))


def gen_records(rng, n):
    recs = []
    for i in range(n):
        r = {"query": rand_text(rng, 1, 4), "answer": rand_text(rng, 1, 8)}
        if i % 17 == 5:
            r["answer"] = ""           # dropped: empty
        if i % 19 == 7:
            r["answer"] = " "          # dropped: encodes to nothing
        if i % 23 == 11:
            r["query"] = ""            # dropped: empty query
        if rng.random() < 0.3:
            r["input"] = rand_text(rng, 0, 2)
        if rng.random() < 0.2:
            r["system"] = rand_text(rng, 1, 1)
        k = rng.choice([None, 0, 1, 2, 3])
        if k is not None:
            r["history"] = [[rand_text(rng, 1, 3), rand_text(rng, 1, 3)] for _ in range(k)]
        recs.append(r)
    return recs


def write_alpaca(path, recs):
    out = []
    for r in recs:
        o = {"instruction": r["query"], "output": r["answer"]}
        for k in ("input", "system", "history"):
            if k in r:
                o[k] = r[k]
        out.append(o)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    for r in recs:
        r["has_history"] = "history" in r


def write_columns(path, recs):
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            o = {"content": r["query"], "summary": r["answer"]}
            if "history" in r:
                o["hist"] = r["history"]
            f.write(json.dumps(o, ensure_ascii=False) + "\n")
    for r in recs:
        r["has_history"] = True  # --history_column given: ptuning wraps every record
        r.pop("input", None)
        r.pop("system", None)


def write_sharegpt(path, recs):
    out = []
    for r in recs:
        conv = []
        for q, a in r.get("history") or []:
            conv += [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        conv += [{"from": "human", "value": r["query"]}, {"from": "gpt", "value": r["answer"]}]
        o = {"conversations": conv}
        if "system" in r:
            o["system"] = r["system"]
        out.append(o)
        r.pop("input", None)
        r["has_history"] = len(r.get("history") or []) > 0  # chat convention for sharegpt
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


def run_tool(args, timeout=120):
    try:
        p = subprocess.run([TOOL] + args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"
    return p.returncode, p.stdout, p.stderr


def tool_args(path, cfg):
    args = ["--train_file", path, "--max_source_length", str(cfg["max_source_length"]),
            "--max_target_length", str(cfg["max_target_length"])]
    for k in ("source_prefix", "prompt_template", "history_template", "prompt_column", "response_column",
              "history_column", "format"):
        if cfg.get(k) is not None:
            args += ["--" + k, cfg[k].replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
                     if "template" in k else cfg[k]]
    if cfg.get("rounds"):
        args += ["--rounds", cfg["rounds"]]
    if cfg.get("train_on_prompt"):
        args += ["--train_on_prompt"]
    if cfg.get("cutoff_len"):
        args += ["--cutoff_len", str(cfg["cutoff_len"])]
    return args


def check_prompts(name, path, recs, cfg):
    rc, out, err = run_tool(["--prompts"] + tool_args(path, cfg))
    if rc != 0:
        return report(False, f"data_prompts_{name}", f"tool exit {rc}: {err.strip()[-400:]}")
    lines = [json.loads(x) for x in out.splitlines()]
    bad = [(i, ln["prompt"], render_prompt(r, cfg)) for i, (ln, r) in enumerate(zip(lines, recs))
           if ln["prompt"] != render_prompt(r, cfg) or ln["answer"] != r["answer"]]
    why = f"{len(lines)} lines for {len(recs)} records"
    if bad:
        i, c, py = bad[0]
        why = f"{len(bad)} differ; record {i}: C {c!r} vs Python {py!r}"
    report(len(lines) == len(recs) and not bad, f"data_prompts_{name}", why)


def check_ids(name, path, recs, cfg, tok, sp, cache_dir):
    encode = make_encoder(sp)
    sp_ids = (sp.PieceToId("[gMASK]"), sp.PieceToId("<sop>"), sp.PieceToId("<eop>"))
    want = [e for e in (build_example(r, cfg, encode, sp_ids) for r in recs) if e is not None]
    for attempt in ("built", "hit"):
        rc, out, err = run_tool(["--tokenizer", tok, "--cache_dir", cache_dir] + tool_args(path, cfg))
        if rc == 3:
            print(f"SKIP data_examples_{name}: the C tokenizer cannot load ({err.strip().splitlines()[0] if err.strip() else 'exit 3'})")
            return
        if rc != 0:
            return report(False, f"data_examples_{name}_{attempt}", f"tool exit {rc}: {err.strip()[-400:]}")
        lines = [json.loads(x) for x in out.splitlines()]
        summary = lines.pop()["summary"]
        got = [(x["ids"], x["labels"]) for x in lines]
        why = f"{len(got)} examples, Python {len(want)}; summary {summary}"
        ok = got == want and summary["cache"] == attempt
        if got != want:
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    why = (f"example {i} differs:\n    C      {g[0]}\n    Python {w[0]}\n"
                           f"    labels equal: {g[1] == w[1]}")
                    break
        report(ok, f"data_examples_{name}_{attempt}", why)


def main():
    if not os.path.exists(TOOL):
        print(f"SKIP data_examples: {TOOL} not built")
        return 0
    rng = random.Random(20240601)
    with tempfile.TemporaryDirectory(prefix="glm_data_examples_") as tmp:
        runs = []
        recs = gen_records(rng, 220)
        p = os.path.join(tmp, "alpaca.json")
        write_alpaca(p, recs)
        runs.append(("alpaca", p, recs, {"max_source_length": 64, "max_target_length": 32}))
        runs.append(("alpaca_cutoff_len", p, recs, {"max_source_length": 64, "max_target_length": 32, "cutoff_len": 20}))
        runs.append(("alpaca_template", p, recs, {"max_source_length": 96, "max_target_length": 40,
                                                  "prompt_template": "{system}{history}[Round {round1}]\n\n问：{instruction}\n\n答：",
                                                  "history_template": "[Round {i1}]\n\n问：{q}\n\n答：{r}\n\n",
                                                  "train_on_prompt": True}))
        runs.append(("alpaca_chat_rule", p, recs, {"max_source_length": 1024, "max_target_length": 128,
                                                   "rounds": "nonempty", "source_prefix": "前缀 "}))
        recs2 = gen_records(rng, 150)
        p2 = os.path.join(tmp, "adgen.jsonl")
        write_columns(p2, recs2)
        runs.append(("columns", p2, recs2, {"max_source_length": 128, "max_target_length": 48, "source_prefix": "广告：",
                                            "prompt_column": "content", "response_column": "summary",
                                            "history_column": "hist"}))
        recs3 = gen_records(rng, 120)
        for r in recs3:
            if not r["query"]:
                r["query"] = "q"
        p3 = os.path.join(tmp, "sharegpt.json")
        write_sharegpt(p3, recs3)
        runs.append(("sharegpt", p3, recs3, {"max_source_length": 256, "max_target_length": 64}))
        for name, path, rs, cfg in runs:
            check_prompts(name, path, rs, cfg)
        tok = find_tokenizer()
        if tok is None:
            print("SKIP data_examples: tokenizer ../shared/tokenizers/chatglm-6b/ice_text.model not found")
            return 1 if failed else 0
        try:
            import sentencepiece as spm
        except ImportError:
            print("SKIP data_examples: python3-sentencepiece is not installed")
            return 1 if failed else 0
        sp = spm.SentencePieceProcessor()
        sp.Load(os.path.join(tok, "ice_text.model"))
        for name, path, rs, cfg in runs:
            check_ids(name, path, rs, cfg, tok, sp, os.path.join(tmp, "cache"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
