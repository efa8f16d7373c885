#!/usr/bin/env python3
"""Prompt lookup (`--prompt_lookup_num_tokens`, Hugging Face generate's prompt lookup decoding) in
`glmtrain generate` and `glmtrain chat`:

  * the draft (infer/generate.h glm_prompt_lookup, through tests/c/tool_lookup) equals the one
    of transformers' own PromptLookupCandidateGenerator (4.46, scripts/install-deps.sh) on 3,000
    random token sequences: n-gram sizes 1-4, drafts of 1-12 tokens, with and without an end token
    in the text (HF cuts the draft before it);
  * on tiny random models (ChatGLM2 family and GLM v1, CPU) the tokens are bit for bit those
    without it: greedy, sampled with a seed (each choice draws the same random number as one token
    a pass would), with a repetition penalty, at a --max_new_tokens that ends inside a draft, over
    --input_file records, split over 2 pipeline stages, and in a chat of three turns with the kept
    KV cache; and the drafts did work: tokens taken, fewer passes than tokens;
  * refused, naming the flag: --prompt_lookup_num_tokens above 63 or below 0,
    --max_matching_ngram_size 0.
Prints PASS/FAIL/SKIP lines."""
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
from harness import Checks, tool  # noqa: E402

T = Checks()
TF_DIR = "/usr/local/lib/glmtrain-transformers-4.46"
PROMPT = "春天来了春天来了春天来了，花开了花开了，春天来了"
STATS = re.compile(r"prompt lookup: (\d+) of (\d+) draft tokens taken, [0-9.]+ tokens a pass \((\d+) passes\)")


def hf_drafts(cases):
    """The drafts of transformers' PromptLookupCandidateGenerator, or None where it does not import."""
    code = r"""
import json, sys, torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator as P
out = []
for ng, k, end, ids in json.load(sys.stdin):
    g = P(eos_token_id=torch.tensor([end]) if end >= 0 else torch.tensor([-7]), num_output_tokens=k,
          max_matching_ngram_size=ng, max_length=10 ** 6)
    x = torch.tensor([ids], dtype=torch.long)
    c, _ = g.get_candidates(x)
    out.append(c[0, len(ids):].tolist())
json.dump(out, sys.stdout)
"""
    env = dict(os.environ, PYTHONPATH=TF_DIR)
    p = subprocess.run(["/usr/bin/python3", "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                       env=env, timeout=300)
    if p.returncode != 0:
        return None, p.stderr[-300:]
    return json.loads(p.stdout), ""


def check_drafts():
    rnd = random.Random(7)
    cases = []
    for _ in range(3000):
        n = rnd.randint(1, 40)
        ids = [rnd.randint(0, rnd.choice([2, 3, 5, 8])) for _ in range(n)]
        end = rnd.choice([-1, -1, 0, 1, 2])
        cases.append([rnd.randint(1, 4), rnd.randint(1, 12), end, ids])
    want, why = hf_drafts(cases)
    if want is None:
        T.skip("prompt_lookup_draft_equals_transformers", "transformers 4.46 does not import (%s)" % why)
        return
    lines = "".join("%d %d %d %s\n" % (ng, k, end, " ".join(map(str, ids))) for ng, k, end, ids in cases)
    p = subprocess.run([tool("tool_lookup")], input=lines, capture_output=True, text=True, timeout=60)
    got = [[int(t) for t in ln.split()] for ln in p.stdout.split("\n")[:len(cases)]]
    bad = [(c, g, w) for c, g, w in zip(cases, got, want) if g != w]
    drafted = sum(1 for w in want if w)
    T.check("prompt_lookup_draft_equals_transformers", p.returncode == 0 and len(got) == len(cases) and not bad and
            drafted > 1000, "%d of %d differ, e.g. %s" % (len(bad), len(cases), bad[:2]))


def gen(model, *flags, inp=None):
    args = [sc.GLM, "generate", "--model_name_or_path", model, "--device", "cpu"] + list(flags)
    if inp is None:
        args += ["--prompt", PROMPT]
    return subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=180, env=sc.ENV)


def stats(p):
    m = STATS.search(p.stderr)
    return tuple(int(x) for x in m.groups()) if m else None


def same(name, model, flags, inp=None, need_taken=True, need_stats=True):
    a = gen(model, *flags, inp=inp)
    b = gen(model, *(flags + ["--prompt_lookup_num_tokens", "10"]), inp=inp)
    s = stats(b)
    ok = a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.strip() != ""
    ok = ok and (s is not None or not need_stats)
    if ok and need_taken:
        ok = s[0] > 0 and s[2] < s[0] + s[2]  # some draft tokens taken: fewer passes than tokens
    T.check(name, ok, "stats %s; %r / %r %s" % (s, a.stdout[-120:], b.stdout[-120:], b.stderr[-300:]))
    return a, b


def debug_ids(p):
    return [ln for ln in p.stderr.split("\n") if ln.startswith("[debug] response")]


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP prompt_lookup: %s not built" % sc.GLM)
        return 0
    check_drafts()
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-lookup-")
    try:
        g2, _, _ = make_glm2(tmp)
        os.makedirs(os.path.join(tmp, "v1"))
        v1, _, _ = sc.make_model(os.path.join(tmp, "v1"))
        greedy = ["--do_sample", "false", "--max_new_tokens", "60", "--debug"]
        a, b = same("prompt_lookup_glm2_greedy_same_tokens", g2, greedy)
        T.check("prompt_lookup_debug_ids_same", debug_ids(a) == debug_ids(b) and debug_ids(a), b.stderr[-300:])
        same("prompt_lookup_glm1_greedy_same_tokens", v1, greedy)
        sampled = ["--do_sample", "true", "--seed", "5", "--temperature", "0.7", "--top_p", "0.9", "--max_new_tokens",
                   "60", "--debug"]
        same("prompt_lookup_glm2_sampled_same_tokens", g2, sampled, need_taken=False)
        same("prompt_lookup_glm1_sampled_same_tokens", v1, sampled, need_taken=False)
        same("prompt_lookup_repetition_penalty_same_tokens", g2, greedy[:2] + ["--repetition_penalty", "1.2",
                                                                                 "--max_new_tokens", "60"], need_taken=False)
        taken = 0
        for n in (1, 2, 13, 37, 45, 59):  # limits inside drafts: no more tokens than asked for
            _, b = same("prompt_lookup_max_new_tokens_%d" % n, g2, ["--do_sample", "false", "--max_new_tokens", str(n)],
                        need_taken=False, need_stats=n > 1)
            taken += (stats(b) or (0,))[0]
        T.check("prompt_lookup_limits_with_drafts_taken", taken > 0, "no draft token taken under any limit")
        same("prompt_lookup_2_stages_same_tokens", g2, greedy + ["--device_map", "auto", "--pipeline_parallel_size", "2"])
        data = os.path.join(tmp, "in.json")
        with open(data, "w") as f:
            for q in ("花开了花开了花开了", "春天来了春天", "明月明月明月几时有", "你好"):
                f.write(json.dumps({"prompt": q, "response": "花开"}, ensure_ascii=False) + "\n")
        outs = []
        for flags in ([], ["--prompt_lookup_num_tokens", "8"]):
            out = os.path.join(tmp, "pred%d.jsonl" % len(outs))
            p = gen(g2, "--input_file", data, "--output_file", out, "--do_sample", "false", "--max_new_tokens", "40",
                    "--per_device_eval_batch_size", "1", *flags, inp=data)
            outs.append((p, open(out).read() if p.returncode == 0 else ""))
        T.check("prompt_lookup_input_file_same_predictions", outs[0][1] == outs[1][1] and outs[0][1].count("\n") == 4 and
                stats(outs[1][0]) is not None and "one at a time" not in outs[1][0].stderr, outs[1][0].stderr[-300:])
        p = gen(g2, "--input_file", data, "--output_file", os.path.join(tmp, "pred8.jsonl"), "--do_sample", "false",
                "--max_new_tokens", "40", "--prompt_lookup_num_tokens", "8", inp=data)
        T.check("prompt_lookup_input_file_batch_note", p.returncode == 0 and "one at a time" in p.stderr and
                open(os.path.join(tmp, "pred8.jsonl")).read() == outs[1][1], p.stderr[-300:])
        msgs = "春天来了春天来了\n再说一遍春天来了\n明月\n"
        chats = []
        for flags in ([], ["--prompt_lookup_num_tokens", "10"]):
            chats.append(subprocess.run([sc.GLM, "chat", "--model_name_or_path", g2, "--device", "cpu", "--do_sample", "false",
                                         "--max_new_tokens", "30"] + flags, input=msgs, capture_output=True, text=True,
                                        errors="replace", timeout=180, env=sc.ENV))
        s = stats(chats[1])
        T.check("prompt_lookup_chat_same_transcript", chats[0].returncode == chats[1].returncode == 0 and
                chats[0].stdout == chats[1].stdout and chats[0].stdout.count("ChatGLM:") == 3 and s and s[0] > 0,
                "%s %s" % (s, chats[1].stderr[-300:]))
        for flags, want in ((["--prompt_lookup_num_tokens", "64"], "--prompt_lookup_num_tokens must be in [0, 63]"),
                            (["--prompt_lookup_num_tokens", "-1"], "--prompt_lookup_num_tokens must be in [0, 63]"),
                            (["--prompt_lookup_num_tokens", "4", "--max_matching_ngram_size", "0"],
                             "--max_matching_ngram_size must be >= 1")):
            p = gen(g2, *flags)
            T.check("prompt_lookup_refuses_%s_%s" % (flags[-2].strip("-"), flags[-1].replace("-", "neg")),
                    p.returncode != 0 and want in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
