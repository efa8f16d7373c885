#!/usr/bin/python3
"""Builds glmtrain's demo instruction set and a small tokenizer from the Tang and Song poems in
Debian's fortunes-zh (/usr/share/games/fortunes/tang300, song100).

  /usr/bin/python3 scripts/make_demo_data.py OUTDIR [--vocab-size 4000] [--seed 1] [--val 64]

writes
  OUTDIR/train.json, OUTDIR/val.json   alpaca records {"instruction", "output"}:
      写一首王维的诗，题目是《送别》   -> the poem
      背诵王维的《送别》               -> the poem
      《送别》的作者是谁？             -> 《送别》的作者是唐代诗人王维。
      《送别》的第一句是什么？         -> its first line up to the first punctuation mark
  OUTDIR/tokenizer/ice_text.model       a SentencePiece unigram model trained with spm_train on the
      poems and prompts, pre-processed as ChatGLM-6B does ("\\n" -> "<n>"), with ChatGLM's pieces:
      <unk> 0, <s> 1, </s> 2, <pad> 3, control [MASK] [gMASK] [sMASK] <unused_0> <sop> <eop> <ENC>
      <dBLOCK>, user-defined <n> <|tab|> <|blank_2|>..<|blank_80|>, byte fallback
  OUTDIR/tokenizer/tokenizer_config.json  as THUDM/chatglm-6b's (num_image_tokens 0)

Standard library only (plus the spm_train program, Debian package sentencepiece); deterministic
for a seed; a few seconds."""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

SOURCES = [("/usr/share/games/fortunes/tang300", "唐"), ("/usr/share/games/fortunes/song100", "宋")]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITLE = re.compile(r"^(?:题目[:：])?\s*《(.+?)》")
AUTHOR = re.compile(r"^作者[:：]\s*([^（(\s]+)")


def read_poems(path, dynasty):
    """Records are separated by lines of "%"; each has a title line 《...》 (song100 prefixes
    "题目:"), an author line "作者：name" (song100 adds the years in full-width digits), then the
    poem, sometimes with indented sub-headings (其一) and blank lines. Colours are ANSI escapes.
    A title line also starts a new poem, so a missing "%" does not merge two poems."""
    poems, cur = [], None
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = ANSI.sub("", raw).strip()
            m = TITLE.match(line)
            if line == "%" or m:
                if cur and cur["author"] and cur["lines"]:
                    poems.append(cur)
                cur = {"title": m.group(1), "author": None, "lines": [], "dynasty": dynasty} if m else None
                continue
            if cur is None or not line:
                continue
            a = AUTHOR.match(line)
            if a and cur["author"] is None and not cur["lines"]:
                cur["author"] = a.group(1)
            else:
                cur["lines"].append(line)
    if cur and cur["author"] and cur["lines"]:
        poems.append(cur)
    return poems


def records_for(p):
    title, author, poem = p["title"], p["author"], "\n".join(p["lines"])
    verse = [l for l in p["lines"] if re.search(r"[，。？！；]", l)]  # skips sub-headings like 其一
    first = re.split(r"[，。？！；：]", verse[0])[0] if verse else ""
    recs = [
        {"instruction": f"写一首{author}的诗，题目是《{title}》", "output": poem},
        {"instruction": f"背诵{author}的《{title}》", "output": poem},
        {"instruction": f"《{title}》的作者是谁？", "output": f"《{title}》的作者是{p['dynasty']}代诗人{author}。"},
    ]
    if first and first != poem:
        recs.append({"instruction": f"《{title}》的第一句是什么？", "output": first})
    return recs


def chatglm_preprocess(text):
    """What ChatGLM-6B's tokenizer does before SentencePiece (spec 6.3)."""
    text = text.replace("\n", "<n>").replace("\t", "<|tab|>")
    for n in range(80, 1, -1):
        text = text.replace(" " * n, f"<|blank_{n}|>")
    return text


def train_tokenizer(records, outdir, vocab_size):
    tokdir = os.path.join(outdir, "tokenizer")
    os.makedirs(tokdir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="glm_demo_spm_") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for r in records:
                f.write(chatglm_preprocess(r["instruction"]) + "\n")
                f.write(chatglm_preprocess(r["output"]) + "\n")
        blanks = ",".join(f"<|blank_{n}|>" for n in range(2, 81))
        args = ["spm_train", f"--input={corpus}", f"--model_prefix={os.path.join(tmp, 'ice_text')}",
                f"--vocab_size={vocab_size}", "--hard_vocab_limit=false", "--model_type=unigram",
                "--character_coverage=0.9995", "--byte_fallback=true", "--split_digits=true",
                "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=3",
                "--control_symbols=[MASK],[gMASK],[sMASK],<unused_0>,<sop>,<eop>,<ENC>,<dBLOCK>",
                "--user_defined_symbols=<n>,<|tab|>," + blanks, "--num_threads=2", "--minloglevel=2"]
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("error: spm_train failed:\n" + p.stderr[-2000:])
        shutil.copy(os.path.join(tmp, "ice_text.model"), os.path.join(tokdir, "ice_text.model"))
    config = {"name_or_path": "glmtrain-demo", "tokenizer_class": "ChatGLMTokenizer", "bos_token": "<sop>",
              "eos_token": "<eop>", "end_token": "</s>", "gmask_token": "[gMASK]", "mask_token": "[MASK]",
              "pad_token": "<pad>", "unk_token": "<unk>", "remove_space": False, "do_lower_case": False,
              "num_image_tokens": 0, "padding_side": "left"}
    with open(os.path.join(tokdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    return tokdir


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--vocab-size", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--val", type=int, default=64, help="validation records")
    ap.add_argument("--no-tokenizer", action="store_true", help="only write the data")
    a = ap.parse_args()
    poems = []
    for path, dynasty in SOURCES:
        if not os.path.exists(path):
            sys.exit(f"error: {path} not found\nhint: apt-get install fortunes-zh")
        poems += read_poems(path, dynasty)
    records = [r for p in poems for r in records_for(p)]
    random.Random(a.seed).shuffle(records)
    val, train = records[:a.val], records[a.val:]
    os.makedirs(a.outdir, exist_ok=True)
    for name, recs in (("train.json", train), ("val.json", val)):
        with open(os.path.join(a.outdir, name), "w", encoding="utf-8") as f:
            json.dump(recs, f, ensure_ascii=False, indent=1)
            f.write("\n")
    msg = f"{len(poems)} poems -> {len(train)} train + {len(val)} validation records in {a.outdir}"
    if not a.no_tokenizer:
        if not shutil.which("spm_train"):
            sys.exit(msg + "\nerror: spm_train not found\nhint: apt-get install sentencepiece (or pass --no-tokenizer)")
        tokdir = train_tokenizer(train + val, a.outdir, a.vocab_size)
        msg += f"; tokenizer in {tokdir}"
    print(msg)


if __name__ == "__main__":
    main()
