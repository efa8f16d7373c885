#!/usr/bin/env python3
"""scripts/make_demo_data.py: builds the poem instruction set and its tokenizer quickly, and the C
data layer (tool_data_examples, C tokenizer on the trained model) builds the same examples as the
Python ptuning re-implementation (test_data_examples.py) with sentencepiece on that model.
SKIP when fortunes-zh, spm_train, python3-sentencepiece or the tool are missing."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_data_examples as ref  # noqa: E402

SCRIPT = os.path.join(ref.ROOT, "scripts", "make_demo_data.py")


def main():
    if not os.path.exists("/usr/share/games/fortunes/tang300") or not shutil.which("spm_train"):
        print("SKIP data_demo: needs fortunes-zh and spm_train (Debian packages fortunes-zh, sentencepiece)")
        return 0
    with tempfile.TemporaryDirectory(prefix="glm_data_demo_") as tmp:
        t0 = time.time()
        p = subprocess.run(["/usr/bin/python3", SCRIPT, tmp], capture_output=True, text=True, timeout=120)
        dt = time.time() - t0
        ref.report(p.returncode == 0 and dt < 30, "demo_script_runs", f"exit {p.returncode} in {dt:.1f} s: {p.stderr[-500:]}")
        if p.returncode != 0:
            return 1
        train = json.load(open(os.path.join(tmp, "train.json"), encoding="utf-8"))
        val = json.load(open(os.path.join(tmp, "val.json"), encoding="utf-8"))
        kinds = {k: sum(k in r["instruction"] for r in train) for k in ("写一首", "背诵", "的作者是谁？", "的第一句是什么？")}
        ok = len(train) > 1000 and len(val) == 64 and all(
            set(r) == {"instruction", "output"} and r["instruction"] and r["output"] and "\x1b" not in r["output"]
            for r in train + val) and min(kinds.values()) > 200
        sample = next(r for r in train if r["instruction"] == "写一首王维的诗，题目是《送别》")
        ok = ok and sample["output"].startswith("下马饮君酒，问君何所之。\n")
        ref.report(ok, "demo_records", f"{len(train)} train, {len(val)} val, kinds {kinds}")
        try:
            import sentencepiece as spm
        except ImportError:
            print("SKIP demo_tokenizer: python3-sentencepiece is not installed")
            return 1 if ref.failed else 0
        tokdir = os.path.join(tmp, "tokenizer")
        sp = spm.SentencePieceProcessor()
        sp.Load(os.path.join(tokdir, "ice_text.model"))
        cfgj = json.load(open(os.path.join(tokdir, "tokenizer_config.json")))
        pieces = {sp.IdToPiece(i) for i in range(sp.GetPieceSize())}
        need = {"<unk>", "<s>", "</s>", "<pad>", "[MASK]", "[gMASK]", "<sop>", "<eop>", "<n>", "<|tab|>", "<|blank_80|>", "<0xF0>"}
        ok = need <= pieces and sp.PieceToId("<pad>") == 3 and sp.PieceToId("<unk>") == 0 and \
            3000 <= sp.GetPieceSize() <= 8000 and cfgj["num_image_tokens"] == 0 and sp.IsControl(sp.PieceToId("[gMASK]"))
        ref.report(ok, "demo_tokenizer", f"size {sp.GetPieceSize()}, missing {need - pieces}")
        if not os.path.exists(ref.TOOL):
            print(f"SKIP demo_examples: {ref.TOOL} not built")
            return 1 if ref.failed else 0
        recs = [{"query": r["instruction"], "answer": r["output"], "has_history": False} for r in train]
        cfg = {"max_source_length": 64, "max_target_length": 256}
        ref.check_ids("demo", os.path.join(tmp, "train.json"), recs, cfg, tokdir, sp, os.path.join(tmp, "cache"))
    return 1 if ref.failed else 0


if __name__ == "__main__":
    sys.exit(main())
