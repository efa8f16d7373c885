#!/usr/bin/env python3
"""--stage pt (LLaMA-Factory's pre-training stage) on a GLM-4-style tokenizer (test_glm4_cli's: a
byte-level BPE in GLM-4's tokenizer.model layout, checked against PyPI tiktoken):
  - the examples equal a re-implementation of LLaMA-Factory's preprocess_pretrain_dataset with
    packing: each record's text + eos_token tokenized without special tokens (HF splits the eos
    out: tiktoken's encode_ordinary(text) + <|endoftext|>), the texts of each datasets.map batch of
    --preprocessing_batch_size records joined, cut into --cutoff_len blocks, the batch's remainder
    dropped; every token a label;
  - `glmtrain train --stage pt` on a tiny GLM-4 config trains (the loss falls), from a JSONL file
    and from a dataset_info.json entry with columns {"prompt": "text"};
  - refused: no --cutoff_len, a ChatGLM-6B tokenizer (a prefix-LM), --packing.
Prints PASS/FAIL/SKIP lines."""
import json, os, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mpi_runs import ENV, GLM, losses, report, run  # noqa: E402
import test_glm4_cli as Q  # noqa: E402

TEXTS = ["春风又绿江南岸，明月何时照我还。", "The quick brown fox jumps over the lazy dog.", "", "数字 12345 和 'll 's",
         "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "a\nb\n\nc", "床前明月光，疑是地上霜。", "Hello  world!"] * 3


def lf_blocks(texts, encode, eos, block, group):
    """preprocess_pretrain_dataset (packing) over map batches of `group` records."""
    out = []
    for g in range(0, len(texts), group):
        ids = sum((encode(t) + [eos] for t in texts[g:g + group]), [])
        n = len(ids) // block * block
        out += [ids[i:i + block] for i in range(0, n, block)]
    return out


def main():
    if not Q.test_tokenizer("pretrain"):
        return 0
    tool = Q.TOOL
    d = tempfile.mkdtemp(prefix="glmtrain-pt-")
    try:
        tok, n, sid, enc = Q.make_tokenizer(d)
        data = os.path.join(d, "texts.jsonl")
        with open(data, "w", encoding="utf-8") as f:
            for t in TEXTS:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        eos = sid["<|endoftext|>"]
        for block, group in ((16, 1000), (7, 5), (40, 3)):
            want = lf_blocks(TEXTS, enc.encode_ordinary, eos, block, group)
            p = subprocess.run([tool, "examples", "--tokenizer", tok, "--train_file", data, "--pt_block", str(block),
                                "--pt_group", str(group)], capture_output=True, text=True, timeout=120)
            got = [json.loads(l) for l in p.stdout.splitlines()][:-1] if p.returncode == 0 else None
            ok = got is not None and [g["ids"] for g in got] == want and all(g["labels"] == g["ids"] for g in got)
            report("pt_blocks_equal_llamafactory_%d_by_%d" % (block, group), ok and len(want) > 1,
                   "%d blocks, reference %d %s" % (len(got or []), len(want), p.stderr[-300:]))
        cfg = Q.write_config(d, (n + len(Q.SPECIALS) + 63) // 64 * 64, sid)
        common = ["--init_from_config", cfg, "--tokenizer_name", tok, "--stage", "pt", "--cutoff_len", "16",
                  "--learning_rate", "1e-2", "--logging_steps", "1", "--seed", "7", "--disable_tqdm", "--report_to", "none",
                  "--max_steps", "12", "--save_steps", "12", "--per_device_train_batch_size", "4"]
        out = os.path.join(d, "pt")
        p = run(common + ["--train_file", data, "--output_dir", out], check=False, timeout=300)
        l = losses(out, 12) if p.returncode == 0 else {}
        report("pt_trains", len(l) == 12 and l[12] < l[1], "loss %s %s" % (l and (l[1], l[12]), p.stderr[-400:] if p.returncode else ""))
        json.dump({"mytexts": {"file_name": "texts.jsonl", "columns": {"prompt": "text"}}}, open(os.path.join(d, "dataset_info.json"), "w"))
        out2 = os.path.join(d, "pt2")
        p = run(common + ["--dataset", "mytexts", "--dataset_dir", d, "--output_dir", out2], check=False, timeout=300)
        l2 = losses(out2, 12) if p.returncode == 0 else {}
        report("pt_dataset_info_entry_trains_the_same", l2 == l and len(l2) == 12, "%s %s" % (l2 and l2[12], p.stderr[-300:]))
        p = run(["--init_from_config", cfg, "--tokenizer_name", tok, "--stage", "pt", "--train_file", data, "--output_dir",
                 os.path.join(d, "x"), "--max_steps", "1"], check=False)
        report("pt_needs_cutoff_len", p.returncode != 0 and "--cutoff_len" in p.stderr, p.stderr[-200:])
        p = run(common + ["--train_file", data, "--output_dir", os.path.join(d, "y"), "--packing"], check=False)
        report("pt_packing_refused", p.returncode != 0 and "--packing" in p.stderr, p.stderr[-200:])
        import test_lora_cli as C
        made = C.tiny_poem_run(os.path.join(d, "v1"), "pt_v1_refused") if os.makedirs(os.path.join(d, "v1")) is None else None
        if made:
            p = run(["--model_name_or_path", made[0], "--stage", "pt", "--cutoff_len", "16", "--train_file", data,
                     "--output_dir", os.path.join(d, "z"), "--max_steps", "1"], check=False)
            report("pt_chatglm6b_refused", p.returncode != 0 and "prefix-LM" in p.stderr, p.stderr[-200:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
