#!/usr/bin/env python3
"""`glmtrain generate` and `glmtrain chat` end to end on a tiny random GLM (saved as
safetensors) with a ChatGLM-style SentencePiece tokenizer trained here with spm_train:

  * greedy generation equals the PyTorch reference's greedy generation (tests/py/glm_ref.py,
    KV-cache path) token for token, for --prompt and for batched --input_file rows
    (left-padded, different lengths, a history record), with the model loaded from torch .bin too;
  * the JSONL output and the BLEU/ROUGE metrics file;
  * a chat session driven through a pseudo-terminal: tokens stream while they are generated,
    the second turn's prompt carries "[Round 0]" history, 'clear' forgets it, 'exit' ends
    with status 0;
  * flag errors.
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
BUILD = os.environ.get("GLM_BUILD", "build")
GLM = os.path.join(BUILD, "glmtrain")
fails = 0
PENALTY = 1.3  # exercises the repetition penalty against the reference


def check(name, cond, why=""):
    global fails
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
    fails += 0 if cond else 1


def make_tokenizer(d):
    """A small unigram model with ChatGLM's special pieces (as tests/py/test_train.py)."""
    text = os.path.join(d, "corpus.txt")
    lines = ["春风又绿江南岸，明月何时照我还。", "床前明月光，疑是地上霜。", "白日依山尽，黄河入海流。",
             "你好，我是一个语言模型。", "今天天气很好，我们去公园散步吧。", "写一首关于春天的诗。"]
    lines = [l for l in lines for _ in range(20)]
    lines += ["the quick brown fox jumps over the lazy dog %d" % i for i in range(100)]
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    blanks = ",".join("<|blank_%d|>" % n for n in range(2, 81))
    prefix = os.path.join(d, "model", "ice_text")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    r = subprocess.run(["spm_train", "--input=" + text, "--model_prefix=" + prefix, "--vocab_size=500", "--hard_vocab_limit=false",
                    "--model_type=unigram", "--character_coverage=1.0", "--byte_fallback=true",
                    "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=3",
                    "--user_defined_symbols=<n>,<|tab|>," + blanks,
                    "--control_symbols=[MASK],[gMASK],[sMASK],<unused_0>,<sop>,<eop>,<ENC>,<dBLOCK>",
                    "--minloglevel=2"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("spm_train failed: " + r.stderr[-500:])
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    ids = {p: sp.piece_to_id(p) for p in ["[MASK]", "[gMASK]", "<sop>", "<eop>", "<pad>"]}
    return os.path.dirname(prefix), ids, sp.get_piece_size()


def run(args, **kw):
    return subprocess.run([GLM] + args, capture_output=True, text=True, errors="replace", timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), **kw)


def tiny_config(ids, vocab, **more):
    """glm_ref's config of the 2-layer, hidden-32 ChatGLM-6B the CLI tests generate with, untied,
    its special ids from make_tokenizer's model; `more` sets other keys."""
    import glm_ref
    keys = {"vocab_size": vocab, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "inner_hidden_size": 64,
            "tie_word_embeddings": False, "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"],
            "bos_token_id": ids["<sop>"], "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]}
    keys.update(more)
    return glm_ref.load_config(keys)


def debug_ids(stderr, what):
    """{row: [ids]} from --debug lines '[debug] WHAT ids (row R): ...'."""
    out = {}
    for m in re.finditer(r"^\[debug\] %s ids \(row (\d+)\):([ \d]*)$" % what, stderr, re.M):
        out[int(m.group(1))] = [int(x) for x in m.group(2).split()]
    return out


def torch_greedy(cfg, params, prompt, max_new, penalty=PENALTY):
    """HF-style greedy generation with the reference's KV cache and HF's repetition penalty (over
    the prompt and the generated ids); also the smallest top-2 logit gap."""
    import torch
    import glm_ref
    out = glm_ref.forward(cfg, params, torch.tensor([prompt]), use_cache=True)
    past, logits = out["presents"], out["logits"][0, -1]
    gen, gap = [], float("inf")
    while len(gen) < max_new:
        seen = torch.tensor(sorted(set(prompt + gen)))
        score = logits[seen]
        logits = logits.clone()
        logits[seen] = torch.where(score < 0, score * penalty, score / penalty)
        top = torch.topk(logits, 2).values
        gap = min(gap, float(top[0] - top[1]))
        nxt = int(torch.argmax(logits))
        if nxt == cfg["eos_token_id"]:
            break
        gen.append(nxt)
        pos = glm_ref.decode_position_ids(torch.tensor([prompt + gen]), cfg)
        out = glm_ref.forward(cfg, params, torch.tensor([[nxt]]), position_ids=pos, past_key_values=past, use_cache=True)
        past, logits = out["presents"], out["logits"][0, -1]
    return gen, gap


def read_until(fd, pattern, timeout=60):
    """Reads the pty until pattern (bytes regex) matches the text read so far."""
    buf, end = b"", time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            if re.search(pattern, buf):
                return buf.decode("utf-8", "replace")
    raise RuntimeError("timed out waiting for %r; got %r" % (pattern, buf[-500:]))


def chat_session(model, tmp):
    """Drives `glmtrain chat` through a pseudo-terminal: stdout and stderr arrive in one stream, in
    the order they were written, so debug token lines interleaved with text show streaming."""
    master, slave = pty.openpty()
    p = subprocess.Popen([GLM, "chat", "--model_name_or_path", model, "--do_sample", "false", "--repetition_penalty", str(PENALTY), "--max_new_tokens", "8",
                          "--debug"], stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.close(slave)
    turns = []
    try:
        read_until(master, "用户: ".encode())
        for msg in ["写一首关于春天的诗", "明月", "clear", "你好"]:
            os.write(master, (msg + "\n").encode())
            turns.append(read_until(master, "用户: ".encode()))
        os.write(master, b"exit\n")
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    return turns, rc


def main():
    import torch
    import glm_ref
    if not os.path.exists(GLM):
        print("SKIP generate_all: %s not built" % GLM)
        return
    if not shutil.which("spm_train"):
        print("SKIP generate_all: spm_train (Debian sentencepiece) not installed")
        return
    tmp = tempfile.mkdtemp(prefix="glm-gen-")
    try:
        tok, ids, vocab = make_tokenizer(tmp)
        cfg = tiny_config(ids, vocab)
        # untied: with a random TIED head the residual stream makes "repeat the last input token"
        # win every step; a seed whose greedy choices are never near-ties (C and torch ~1e-6)
        prompts = ["写一首关于春天的诗", "你好", "[Round 0]\n问：明月\n答：床前明月光\n[Round 1]\n问：白日\n答："]
        params = glm_ref.init_params(cfg, seed=2, std=0.5)
        glm_ref.save_model_dir(tok, cfg, params)
        model = tok

        # 1. --prompt, greedy: token for token equal to the reference
        p = run(["generate", "--model_name_or_path", model, "--prompt", prompts[0], "--do_sample", "false", "--repetition_penalty", str(PENALTY),
                 "--max_new_tokens", "16", "--debug"])
        pin, pout = debug_ids(p.stderr, "prompt").get(0), debug_ids(p.stderr, "response").get(0)
        ok = p.returncode == 0 and pin is not None and pout is not None
        want, gap = torch_greedy(cfg, params, pin, 16) if ok else (None, 0)
        check("greedy_prompt_equals_torch_reference", ok and pout == want and gap > 1e-4,
              "rc %d: C %s vs torch %s (min gap %.2g) %s" % (p.returncode, pout, want, gap, p.stderr[-400:]))
        check("prompt_ends_with_gmask_sop", ok and pin[-2:] == [ids["[gMASK]"], ids["<sop>"]], str(pin))
        print("  response: %r" % p.stdout.strip())

        # 2. batched --input_file (left padding, different lengths, history): each row as the reference
        data = os.path.join(tmp, "eval.jsonl")
        recs = [{"prompt": "写一首关于春天的诗", "response": "春风又绿江南岸"},
                {"prompt": "你好", "response": "你好，我是一个语言模型。"},
                {"prompt": "白日", "response": "白日依山尽", "history": [["明月", "床前明月光"]]}]
        with open(data, "w", encoding="utf-8") as f:
            f.write("\n".join(json.dumps(r, ensure_ascii=False) for r in recs) + "\n")
        outf, metf = os.path.join(tmp, "pred.jsonl"), os.path.join(tmp, "metrics.json")
        p = run(["generate", "--model_name_or_path", model, "--input_file", data, "--output_file", outf,
                 "--metrics_file", metf, "--history_column", "history", "--do_sample", "false", "--repetition_penalty", str(PENALTY), "--max_new_tokens", "12",
                 "--per_device_eval_batch_size", "3", "--debug"])
        pins, pouts = debug_ids(p.stderr, "prompt"), debug_ids(p.stderr, "response")
        bad = []
        for r in range(3):
            want, gap = torch_greedy(cfg, params, pins.get(r, [ids["<sop>"]]), 12)
            if pouts.get(r) != want or gap <= 1e-4:
                bad.append((r, pouts.get(r), want, gap))
        check("greedy_batch_rows_equal_torch_reference", p.returncode == 0 and len(pins) == 3 and not bad,
              "rc %d %s %s" % (p.returncode, bad, p.stderr[-400:]))
        lines = [json.loads(l) for l in open(outf, encoding="utf-8")] if p.returncode == 0 else []
        check("batch_output_jsonl", len(lines) == 3 and [l["index"] for l in lines] == [0, 1, 2] and
              lines[2]["prompt"].startswith("[Round 0]\n问：明月\n答：床前明月光\n[Round 1]\n问：白日") and
              all("predict" in l and l["labels"] == r["response"] for l, r in zip(lines, recs)), str(lines)[:500])
        met = json.load(open(metf)) if os.path.exists(metf) else {}
        check("batch_metrics_file", set(met) == {"predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l",
                                                 "predict_samples"} and met["predict_samples"] == 3, str(met))
        # batch of 1 gives the same rows (a row does not depend on its neighbours)
        p1 = run(["generate", "--model_name_or_path", model, "--input_file", data, "--history_column", "history",
                  "--do_sample", "false", "--repetition_penalty", str(PENALTY), "--max_new_tokens", "12", "--per_device_eval_batch_size", "1", "--debug"])
        check("batch_size_does_not_change_rows", debug_ids(p1.stderr, "response") == pouts, "differs")
        # --system with --input_file: the system of the records without one, as training's --default_system
        sysf, expf = os.path.join(tmp, "sys.jsonl"), os.path.join(tmp, "sys_explicit.jsonl")
        with open(sysf, "w", encoding="utf-8") as f:
            f.write(json.dumps({"prompt": "你好", "response": "好", "system": "老师"}, ensure_ascii=False) + "\n" +
                    json.dumps({"prompt": "明月", "response": "光"}, ensure_ascii=False) + "\n")
        with open(expf, "w", encoding="utf-8") as f:
            f.write(json.dumps({"prompt": "你好", "response": "好", "system": "老师"}, ensure_ascii=False) + "\n" +
                    json.dumps({"prompt": "明月", "response": "光", "system": "学生"}, ensure_ascii=False) + "\n")
        outs = []
        for src, extra in ((sysf, ["--system", "学生"]), (expf, [])):
            o = os.path.join(tmp, "sys_pred_%d.jsonl" % len(outs))
            q = run(["generate", "--model_name_or_path", model, "--input_file", src, "--output_file", o, "--do_sample", "false",
                     "--max_new_tokens", "6"] + extra)
            outs.append([json.loads(l) for l in open(o, encoding="utf-8")] if q.returncode == 0 else [])
        check("input_file_system_fills_records_without_one", len(outs[0]) == 2 and outs[0] == outs[1] and
              outs[0][1]["prompt"].startswith("学生\n") and outs[0][0]["prompt"].startswith("老师\n"), str(outs)[:400])
        # bare prompts file, sampling with a seed: reproducible
        bare = os.path.join(tmp, "bare.jsonl")
        with open(bare, "w", encoding="utf-8") as f:
            f.write('"你好"\n{"prompt": "明月"}\n')
        s1 = run(["generate", "--model_name_or_path", model, "--input_file", bare, "--max_new_tokens", "10", "--seed", "3"])
        s2 = run(["generate", "--model_name_or_path", model, "--input_file", bare, "--max_new_tokens", "10", "--seed", "3"])
        check("bare_prompts_sampling_reproducible", s1.returncode == 0 and s1.stdout == s2.stdout and
              len(s1.stdout.splitlines()) == 2, s1.stderr[-300:])

        # 3. the same model from a torch .bin folder (fp32) generates the same tokens
        bind = os.path.join(tmp, "bin")
        os.makedirs(bind)
        for fn in ["config.json", "ice_text.model"]:
            shutil.copy(os.path.join(model, fn), bind)
        torch.save({k: v.clone() for k, v in params.items()}, os.path.join(bind, "pytorch_model.bin"))
        p = run(["generate", "--model_name_or_path", bind, "--prompt", prompts[0], "--do_sample", "false", "--repetition_penalty", str(PENALTY),
                 "--max_new_tokens", "16", "--debug"])
        check("greedy_from_torch_bin_same_tokens", debug_ids(p.stderr, "response").get(0) == pout, p.stderr[-300:])

        # 4. chat through a pseudo-terminal
        turns, rc = chat_session(model, tmp)
        t0 = turns[0]
        # streaming: response text appears between the per-token debug lines, not only after the last
        body = t0[t0.index("ChatGLM: ") + len("ChatGLM: "):] if "ChatGLM: " in t0 else ""
        toks = [m.start() for m in re.finditer(r"\[debug\] token \d+", body)]
        text_before_last = re.sub(r"\[debug\] token \d+\s*", "", body[:toks[-1]] if toks else "").strip()
        check("chat_streams_tokens", len(toks) >= 3 and text_before_last != "", "output: %r" % body[:400])
        prompts_dbg = [re.search(r"\[debug\] prompt \((\d+) tokens\): ([^\r\n]*)", t) for t in turns]
        first_resp = re.sub(r"\[debug\] token \d+\s*", "", body).replace("用户: ", "").strip()
        p2 = prompts_dbg[1].group(2) if prompts_dbg[1] else ""
        check("chat_history_in_second_prompt", p2.startswith("[Round 0]\\n问：写一首关于春天的诗\\n答：") and
              "[Round 1]\\n问：明月\\n答：" in p2 and int(prompts_dbg[1].group(1)) > int(prompts_dbg[0].group(1)),
              "prompt 2: %r (response 1 %r)" % (p2, first_resp))
        p4 = prompts_dbg[3].group(2) if prompts_dbg[3] else "?"
        check("chat_clear_forgets_history", "history cleared" in turns[2] and p4 == "你好", "prompt after clear: %r" % p4)
        check("chat_exit_status_0", rc == 0, "rc %s" % rc)

        # 5. flag errors
        p = run(["generate", "--model_name_or_path", model])
        check("generate_needs_prompt_or_file", p.returncode == 1 and "--prompt or --input_file" in p.stderr, p.stderr[-200:])
        p = run(["chat", "--model_name_or_path", model, "--temperature", "0"])
        check("temperature_zero_refused_with_hint", p.returncode == 1 and "temperature" in p.stderr and "greedy" in p.stderr,
              p.stderr[-200:])
        # --device_map splits the model (tests/sh/test_generate_device_map.sh checks the tokens);
        # a map that names no stages is refused with the offending value
        p = run(["chat", "--model_name_or_path", model, "--device_map", "/nonexistent/map.json"])
        check("device_map_bad_file_refused", p.returncode == 1 and "map.json" in p.stderr, p.stderr[-200:])
        p = run(["generate", "--model_name_or_path", model, "--prompt", "x", "--max_lenght", "5"])
        check("unknown_flag_suggests", p.returncode == 1 and "max_length" in p.stderr, p.stderr[-200:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL generate: %s" % e)
        sys.exit(1)
    sys.exit(1 if fails else 0)
