#!/usr/bin/env python3
"""GLM-4-9B's architecture end to end on the CPU, with a GLM-4-style tokenizer built here (a
byte-level BPE trained on a small corpus, in the tiktoken rank-file format of GLM-4's
tokenizer.model, its 14 special tokens after the ranks):
  - training examples from conversation records equal a Python re-implementation of GLM-4's
    finetune_demo/finetune.py process_batch on PyPI tiktoken: [gMASK] <sop>, each turn
    <|role|> + encode("\\n" + content) as its chat template tokenizes it, <|user|> closing the
    conversation ("EOS for chat"), the loss marks of assistant turns shifted right by one;
  - `glmtrain train` on those records with a GLM-4 config.json (the ChatGLM2 block, its eos
    list): the loss falls;
  - `generate --prompt` builds the chat template's input ([gMASK] <sop> <|user|> "\\n" + query
    <|assistant|>).
The real GLM-4 tokenizer is not here; tests/py/test_tokenizer_glm4.py checks the encoder itself
against tiktoken. Prints PASS/FAIL/SKIP lines."""
import json, os, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T
from mpi_runs import ENV, GLM, losses, report, run

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
            "<|end_of_video|>"]


def main():
    try:
        import tiktoken
        import test_tokenizer_glm4 as G
        import tokenizer_corpus as tc
    except ImportError as e:
        print("SKIP glm4_cli: %s (scripts/install-deps.sh installs tiktoken and regex)" % e)
        return 0
    tool = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "tool_chatglm23")
    if not os.path.exists(GLM) or not os.access(tool, os.X_OK):
        print("SKIP glm4_cli: glmtrain or tool_chatglm23 not built")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-glm4-")
    try:
        lines = [l.decode("utf-8", "ignore") for l in tc.corpus(seed=7)[:3000]]
        ranks = G.train(lines, 1500)
        tok = G.write_model(os.path.join(d, "tok"), ranks)
        n = len(ranks)
        sid = {s: n + i for i, s in enumerate(SPECIALS)}
        enc = tiktoken.Encoding("glm4-test", pat_str=G.PAT, mergeable_ranks=ranks, special_tokens=sid)
        vocab = (n + len(SPECIALS) + 63) // 64 * 64
        cfg = {"model_type": "chatglm", "padded_vocab_size": vocab, "hidden_size": 32, "num_layers": 2,
               "num_attention_heads": 4, "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2,
               "ffn_hidden_size": 48, "layernorm_epsilon": 1.5625e-07, "rmsnorm": True, "add_qkv_bias": True,
               "add_bias_linear": False, "apply_residual_connection_post_layernorm": False, "post_layer_norm": True,
               "original_rope": True, "rope_ratio": 500, "seq_length": 256, "tie_word_embeddings": False,
               "eos_token_id": [sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]],
               "pad_token_id": sid["<|endoftext|>"]}
        cfg_path = os.path.join(d, "config.json")
        json.dump(cfg, open(cfg_path, "w"))
        recs = []
        for i in range(32):
            conv = [{"role": "user", "content": "写一句关于%d的诗" % i}, {"role": "assistant", "content": "春风又绿江南岸 %d" % i}]
            if i % 3 == 0:
                conv = [{"role": "system", "content": "You are GLM-4."}] + conv + [
                    {"role": "user", "content": "  again\n"}, {"role": "assistant", "content": "明月  %d" % i}]
            recs.append({"conversations": conv})
        data = os.path.join(d, "conv.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        # 1. examples = finetune.py's process_batch
        want = []
        for r in recs:
            ids, marks = [sid["[gMASK]"], sid["<sop>"]], [False, False]
            for m in r["conversations"]:
                new = [sid["<|%s|>" % m["role"]]] + enc.encode("\n" + m["content"], disallowed_special=())
                ids += new
                marks += [m["role"] not in ("system", "user", "observation")] * len(new)
            ids.append(sid["<|user|>"])
            marks = [False] + marks
            want.append((ids, [t if k else -100 for t, k in zip(ids, marks)]))
        p = subprocess.run([tool, "examples", "--tokenizer", tok, "--train_file", data, "--max_source_length", "64",
                            "--max_target_length", "64"], capture_output=True, text=True, timeout=120)
        got = [json.loads(l) for l in p.stdout.splitlines()][:-1] if p.returncode == 0 else None
        ok = got is not None and [(g["ids"], g["labels"]) for g in got] == want
        detail = p.stderr[-300:] if got is None else "%d examples" % len(got)
        if got is not None and not ok:
            i = next(k for k in range(min(len(got), len(want))) if (got[k]["ids"], got[k]["labels"]) != want[k])
            detail = "example %d: glmtrain %s / %s, reference %s / %s" % (i, got[i]["ids"], got[i]["labels"], *want[i])
        report("glm4_examples_equal_finetune_process_batch", ok, detail)
        # 2. training
        out = os.path.join(d, "out")
        run(["--init_from_config", cfg_path, "--tokenizer_name", tok, "--train_file", data, "--learning_rate", "1e-2",
             "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7", "--max_source_length", "64",
             "--max_target_length", "64", "--disable_tqdm", "--report_to", "none", "--max_steps", "10",
             "--save_steps", "10", "--output_dir", out, "--per_device_train_batch_size", "8"], timeout=300)
        l = losses(out, 10)
        report("glm4_train_loss_falls", len(l) == 10 and l[10] < l[1], "loss %.4f -> %.4f" % (l[1], l[10]))
        # 3. generate's prompt: the chat template
        p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tok, "--prompt", "你好",
                            "--do_sample", "false", "--max_new_tokens", "4", "--debug"], capture_output=True, text=True,
                           timeout=120, env=ENV)
        tag = "[debug] prompt ids (row 0):"
        pid = next(([int(x) for x in ln[len(tag):].split()] for ln in p.stderr.splitlines() if ln.startswith(tag)), None)
        wantp = [sid["[gMASK]"], sid["<sop>"], sid["<|user|>"]] + enc.encode("\n你好") + [sid["<|assistant|>"]]
        report("glm4_generate_prompt_is_chat_template", pid == wantp, "glmtrain %s, reference %s %s" % (pid, wantp,
               "" if p.returncode == 0 else p.stderr[-300:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
