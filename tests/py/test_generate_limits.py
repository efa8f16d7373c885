#!/usr/bin/env python3
"""`glmtrain generate` / `glmtrain chat` against the model's length limit (issue 14), on a tiny
random GLM whose config.json says max_sequence_length 64:

  * --max_new_tokens out of range (0, 1e9, more than the prompt leaves) is refused naming the
    flag, the value and the limit, before any generation;
  * an explicit --max_length above the model's limit is capped with a warning;
  * a --prompt longer than the model is refused at once (before the weights load) with the flag
    that truncates it; --max_source_length truncates --prompt, warning how many tokens went;
  * --prompt streams on a terminal (text between the per-token debug lines) and prints only the
    finished response when redirected;
  * chat trims the history to fit --max_new_tokens within the model's limit, with a note, and a
    message too long on its own fails that turn only;
  * --input_file is checked whole before the first prediction: a cut JSON array, a bad JSONL
    line or a prompt that cannot fit fails with file:line and no output file is written.
Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, Checks  # noqa: E402

GLM = os.path.join(BUILD, "glmtrain")
MAXSEQ = 64
LONG = " ".join("the quick brown fox jumps over the lazy dog %d" % i for i in range(12))
t = Checks()


def run(args, **kw):
    """A run that hangs (generating far past the limit, say) is a failed check, not a crash."""
    try:
        return subprocess.run([GLM] + args, capture_output=True, text=True, errors="replace", timeout=30,
                              env=dict(os.environ, OMP_NUM_THREADS="1"), **kw)
    except subprocess.TimeoutExpired as e:
        out = lambda b: (b or b"").decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")
        return subprocess.CompletedProcess(e.cmd, -9, out(e.stdout), out(e.stderr) + "\n(timed out after 30 s)")


def debug_ids(stderr, what):
    m = re.search(r"^\[debug\] %s ids \(row 0\):([ \d]*)$" % what, stderr, re.M)
    return [int(x) for x in m.group(1).split()] if m else None


def make_model(tmp):
    import glm_ref
    from test_generate import make_tokenizer
    tok, ids, vocab = make_tokenizer(tmp)
    cfg = glm_ref.load_config({"vocab_size": vocab, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4,
                               "inner_hidden_size": 64, "tie_word_embeddings": False, "max_sequence_length": MAXSEQ,
                               "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"],
                               "bos_token_id": ids["<sop>"], "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]})
    glm_ref.save_model_dir(tok, cfg, glm_ref.init_params(cfg, seed=2, std=0.5))
    return tok


def pty_run(args, timeout=60):
    """Runs glmtrain with stdout and stderr on one pseudo-terminal; returns (rc, text)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([GLM] + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(slave)
    buf, end = b"", time.time() + timeout
    try:
        while time.time() < end:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    return rc, buf.decode("utf-8", "replace").replace("\r\n", "\n")


def test_max_new_tokens(model):
    base = ["generate", "--model_name_or_path", model, "--prompt", "你好", "--do_sample", "false"]
    p = run(base + ["--max_new_tokens", "1e9"])
    t.check("max_new_tokens_1e9_refused", p.returncode == 1 and "--max_new_tokens 1000000000" in p.stderr and
            "max_sequence_length %d" % MAXSEQ in p.stderr and "at most %d new tokens" % (MAXSEQ - 2) in p.stderr and
            "loaded" not in p.stderr and p.stdout == "", "rc %d: %s" % (p.returncode, p.stderr[-400:]))
    p = run(base + ["--max_new_tokens", "0"])
    t.check("max_new_tokens_0_refused", p.returncode == 1 and "--max_new_tokens must be >= 1 (got 0)" in p.stderr,
            "rc %d: %s" % (p.returncode, p.stderr[-300:]))
    p = run(["chat", "--model_name_or_path", model, "--max_new_tokens", "100"], input="你好\n")
    t.check("chat_max_new_tokens_over_limit_refused", p.returncode == 1 and "--max_new_tokens 100" in p.stderr and
            "at most %d" % (MAXSEQ - 2) in p.stderr, "rc %d: %s" % (p.returncode, p.stderr[-300:]))
    # fits alone (<= 62) but not with this prompt: the prompt is what is refused, with the sum named
    p = run(base[:4] + [LONG[:60], "--max_new_tokens", "58", "--do_sample", "false", "--debug"])
    t.check("max_new_tokens_plus_prompt_refused", p.returncode == 1 and "at most 6 fit (the model's max_sequence_length "
            "%d less --max_new_tokens 58)" % MAXSEQ in p.stderr and p.stdout == "", "rc %d: %s" % (p.returncode, p.stderr[-400:]))
    p = run(base + ["--max_new_tokens", "20", "--debug"])
    pin, pout = debug_ids(p.stderr, "prompt"), debug_ids(p.stderr, "response")
    t.check("max_new_tokens_in_range_runs", p.returncode == 0 and pin and pout is not None and len(pout) <= 20,
            "rc %d: %s" % (p.returncode, p.stderr[-300:]))


def test_max_length(model):
    base = ["generate", "--model_name_or_path", model, "--prompt", "你好", "--do_sample", "false", "--debug"]
    p = run(base + ["--max_length", "4096"])
    pin, pout = debug_ids(p.stderr, "prompt"), debug_ids(p.stderr, "response")
    t.check("max_length_above_model_capped_with_warning", p.returncode == 0 and "--max_length 4096 is above the model's "
            "max_sequence_length %d" % MAXSEQ in p.stderr and pin and pout is not None and len(pin) + len(pout) <= MAXSEQ,
            "rc %d, %s + %s tokens: %s" % (p.returncode, pin and len(pin), pout and len(pout), p.stderr[-300:]))
    p = run(base)  # the default 2048 is capped quietly
    pin, pout = debug_ids(p.stderr, "prompt"), debug_ids(p.stderr, "response")
    t.check("default_max_length_capped_quietly", p.returncode == 0 and "above the model" not in p.stderr and
            pin and pout is not None and len(pin) + len(pout) <= MAXSEQ, p.stderr[-300:])


def test_long_prompt(model):
    base = ["generate", "--model_name_or_path", model, "--prompt", LONG, "--do_sample", "false"]
    t0 = time.time()
    p = run(base)
    m = re.search(r"--prompt is (\d+) tokens", p.stderr)
    t.check("long_prompt_refused_before_loading", p.returncode == 1 and m and int(m.group(1)) > MAXSEQ and
            "at most %d fit" % (MAXSEQ - 1) in p.stderr and "--max_source_length %d" % (MAXSEQ - 1) in p.stderr and
            "loaded" not in p.stderr and p.stdout == "" and time.time() - t0 < 20,
            "rc %d: %s" % (p.returncode, p.stderr[-400:]))
    cut = {}
    for n in (20, 30):
        p = run(base + ["--max_source_length", str(n), "--max_new_tokens", "8", "--debug"])
        w = re.search(r"--max_source_length %d: the prompt's (\d+) text tokens were cut to the first %d \((\d+) dropped\)"
                      % (n, n - 2), p.stderr)
        cut[n] = (p.returncode, debug_ids(p.stderr, "prompt"), w and int(w.group(1)), w and int(w.group(2)), p.stderr)
    (rc20, in20, tot20, d20, e20), (rc30, in30, tot30, d30, _) = cut[20], cut[30]
    ok = rc20 == 0 and rc30 == 0 and in20 and in30 and len(in20) == 20 and len(in30) == 30
    t.check("max_source_length_truncates_prompt_with_count", ok and tot20 == tot30 and tot20 > MAXSEQ and
            d20 == tot20 - 18 and d30 == d20 - 10 and in20[:18] == in30[:18] and in20[-2:] == in30[-2:],
            "rc %s/%s, ids %s/%s, total %s/%s, dropped %s/%s: %s" % (rc20, rc30, in20 and len(in20), in30 and len(in30),
                                                                    tot20, tot30, d20, d30, e20[-300:]))
    p = run(base + ["--max_source_length", "200"])  # still too long for the model: the flag to lower is named
    t.check("max_source_length_too_big_for_model_refused", p.returncode == 1 and "lower --max_source_length to 63" in p.stderr,
            "rc %d: %s" % (p.returncode, p.stderr[-300:]))


def test_streaming(model):
    args = ["generate", "--model_name_or_path", model, "--prompt", "写一首关于春天的诗", "--do_sample", "false",
            "--max_new_tokens", "12", "--repetition_penalty", "1.3", "--debug"]
    rc, text = pty_run(args)
    toks = [m.start() for m in re.finditer(r"\[debug\] token \d+\n", text)]
    start = text.index("[debug] prompt ids")
    start = text.index("\n", start) + 1
    between = re.sub(r"\[debug\] token \d+\n", "", text[start:toks[-1]] if toks else "")
    t.check("prompt_streams_on_terminal", rc == 0 and len(toks) >= 3 and between.strip() != "",
            "rc %s, %d tokens, text before the last token: %r in %r" % (rc, len(toks), between, text[-600:]))
    p = run(args)
    shown = re.sub(r"\[debug\] [^\n]*\n|\[glmtrain\][^\n]*\n", "", text[start:])
    t.check("prompt_redirected_prints_response_once", p.returncode == 0 and p.stdout.count("\n") == 1 and
            "[debug] token" in p.stderr and p.stdout.strip() == shown.strip() and p.stdout.strip() != "",
            "piped %r vs terminal %r" % (p.stdout, shown))


def test_chat_trim(model):
    msgs = ["明月", "白日", "春风", "你好", "床前", "写诗", "天气", "公园"] + ["exit"]
    p = run(["chat", "--model_name_or_path", model, "--do_sample", "false", "--max_new_tokens", "8", "--debug"],
            input="\n".join(msgs) + "\n")
    sizes = [int(x) for x in re.findall(r"\[debug\] prompt \((\d+) tokens\)", p.stderr)]
    hist = re.findall(r"\[debug\] prompt \(\d+ tokens\): ([^\n]*)", p.stderr)
    t.check("chat_history_trimmed_under_max_new_tokens", p.returncode == 0 and len(sizes) == 8 and
            max(sizes) <= MAXSEQ - 8 and "oldest round" in p.stderr and
            "the model's max_sequence_length %d less --max_new_tokens 8" % MAXSEQ in p.stderr and
            any(h.startswith("[Round 0]") for h in hist[1:]),
            "rc %d, prompt sizes %s: %s" % (p.returncode, sizes, p.stderr[-500:]))
    p = run(["chat", "--model_name_or_path", model, "--do_sample", "false", "--max_new_tokens", "8", "--debug"],
            input=LONG + "\n你好\nexit\n")
    t.check("chat_message_too_long_fails_turn_only", p.returncode == 0 and "at most %d fit" % (MAXSEQ - 8) in p.stderr and
            p.stdout.count("ChatGLM: ") == 1, "rc %d: %s / %s" % (p.returncode, p.stdout[-200:], p.stderr[-300:]))


def test_input_file(model, tmp):
    base = ["generate", "--model_name_or_path", model, "--do_sample", "false", "--max_new_tokens", "4",
            "--per_device_eval_batch_size", "2"]
    recs = [{"prompt": "你好 %d" % i, "response": "我是一个语言模型"} for i in range(20)]
    cutf = os.path.join(tmp, "eval_cut.json")
    text = json.dumps(recs, ensure_ascii=False, indent=1)
    with open(cutf, "w", encoding="utf-8") as f:
        f.write(text[:int(len(text) * 0.8)])
    out = os.path.join(tmp, "pred_cut.jsonl")
    p = run(base + ["--input_file", cutf, "--output_file", out])
    t.check("cut_array_fails_before_any_prediction", p.returncode == 1 and re.search(r"eval_cut\.json:\d+", p.stderr) and
            not os.path.exists(out) and "loaded" not in p.stderr, "rc %d, output written: %s: %s"
            % (p.returncode, os.path.exists(out), p.stderr[-300:]))
    bad = os.path.join(tmp, "bare_bad.jsonl")
    with open(bad, "w", encoding="utf-8") as f:
        f.write('"你好"\n"明月"\n"白日"\n{"prompt": "春风"\n"床前"\n')
    p = run(base + ["--input_file", bad])
    t.check("bad_jsonl_line_fails_with_line_no_output", p.returncode == 1 and "bare_bad.jsonl:4" in p.stderr and
            p.stdout == "", "rc %d, stdout %r: %s" % (p.returncode, p.stdout[:200], p.stderr[-300:]))
    longf = os.path.join(tmp, "long.jsonl")
    with open(longf, "w", encoding="utf-8") as f:
        for q in ["你好", "明月", LONG]:
            f.write(json.dumps({"prompt": q, "response": "好"}, ensure_ascii=False) + "\n")
    out = os.path.join(tmp, "pred_long.jsonl")
    p = run(base + ["--input_file", longf, "--output_file", out])
    t.check("too_long_record_fails_with_line_no_output", p.returncode == 1 and "long.jsonl:3: record 2's prompt is" in p.stderr
            and "--max_source_length %d" % (MAXSEQ - 4) in p.stderr and not os.path.exists(out),
            "rc %d: %s" % (p.returncode, p.stderr[-400:]))
    p = run(base + ["--input_file", longf, "--output_file", out, "--max_source_length", "20"])
    lines = [json.loads(l) for l in open(out, encoding="utf-8")] if os.path.exists(out) else []
    t.check("input_file_max_source_length_cuts_with_warning", p.returncode == 0 and len(lines) == 3 and
            re.search(r"--max_source_length 20: 1 of 3 prompts were cut to their first 18 tokens \(\d+ tokens dropped", p.stderr),
            "rc %d, %d lines: %s" % (p.returncode, len(lines), p.stderr[-300:]))
    os.remove(out) if os.path.exists(out) else None
    p = run(base + ["--input_file", longf, "--output_file", out, "--skip_bad_samples", "true"])
    lines = [json.loads(l) for l in open(out, encoding="utf-8")] if os.path.exists(out) else []
    t.check("skip_bad_samples_gives_empty_prediction", p.returncode == 0 and len(lines) == 3 and lines[2]["predict"] == ""
            and "long.jsonl:3" in p.stderr, "rc %d, %s: %s" % (p.returncode, lines, p.stderr[-300:]))


def main():
    if not os.path.exists(GLM):
        t.skip("generate_limits", "%s not built" % GLM)
        return 0
    if not shutil.which("spm_train"):
        t.skip("generate_limits", "spm_train (Debian sentencepiece) not installed")
        return 0
    tmp = tempfile.mkdtemp(prefix="glm-genlim-")
    try:
        model = make_model(tmp)
        test_max_new_tokens(model)
        test_max_length(model)
        test_long_prompt(model)
        test_streaming(model)
        test_chat_trim(model)
        test_input_file(model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return t.status()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL generate_limits: %s" % e)
        sys.exit(1)
