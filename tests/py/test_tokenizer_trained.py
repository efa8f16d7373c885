#!/usr/bin/env python3
"""glmtrain's SentencePiece engine against SentencePiece itself on models trained here with
spm_train (small vocabularies, seconds to train): unigram and BPE, with and without byte_fallback,
nmt_nfkc / nfkc / *_cf / identity / a custom TSV normaliser with a denormaliser, user-defined and
control symbols, no dummy prefix, kept extra whitespace, whitespace as suffix, split digits, WORD
and CHAR models, plus variants edited at the protobuf level (escape_whitespaces off, a custom
unk_surface, UNUSED pieces). For each: ids, pieces and decoded text on the >= 10,000-line corpus
of tokenizer_corpus.py. Any mismatch fails and prints the first differing line."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus as tc  # noqa: E402

BASE = ["--vocab_size=2500", "--character_coverage=0.98", "--num_threads=2", "--minloglevel=2"]
MODELS = {  # the full grid {unigram, bpe} x {nmt_nfkc, identity} x {byte_fallback, not}, then the rest
    "unigram_nfkc": [],
    "unigram_nfkc_bytefallback": ["--byte_fallback=true"],
    "unigram_identity": ["--normalization_rule_name=identity"],
    "unigram_identity_bytefallback": ["--normalization_rule_name=identity", "--byte_fallback=true"],
    "bpe_nfkc": ["--model_type=bpe"],
    "bpe_nfkc_bytefallback": ["--model_type=bpe", "--byte_fallback=true"],
    "bpe_identity": ["--model_type=bpe", "--normalization_rule_name=identity"],
    "bpe_identity_bytefallback": ["--model_type=bpe", "--normalization_rule_name=identity", "--byte_fallback=true"],
    "unigram_nfkccf_userdefined": ["--normalization_rule_name=nmt_nfkc_cf", "--user_defined_symbols=<n>,<sep>,@@,ab,▁▁",
                                   "--control_symbols=<ctrl>,[X]", "--add_dummy_prefix=false"],
    "bpe_nfkc_userdefined_keepspace": ["--model_type=bpe", "--normalization_rule_name=nfkc", "--byte_fallback=true",
                                       "--user_defined_symbols=<n>,<|tab|>,ab,的", "--remove_extra_whitespaces=false"],
    "unigram_suffix_nfkccf": ["--treat_whitespace_as_suffix=true", "--normalization_rule_name=nfkc_cf"],
    "bpe_suffix_wsonly_digits": ["--model_type=bpe", "--treat_whitespace_as_suffix=true", "--split_digits=true",
                                 "--allow_whitespace_only_pieces=true", "--remove_extra_whitespaces=false"],
    "unigram_tsv_denorm": ["--normalization_rule_tsv={tsv}", "--denormalization_rule_tsv={dtsv}", "--byte_fallback=true"],
    "char_identity": ["--model_type=char", "--normalization_rule_name=identity", "--vocab_size=2000",
                      "--hard_vocab_limit=false"],
    "word_nfkc": ["--model_type=word", "--vocab_size=3000", "--hard_vocab_limit=false"],
}
# Custom normalisation rules (source code points -> target code points), including multi-character keys.
TSV = "41\t61 62\n61 62 63\t78\n4E2D 6587\t4E2D\nFF0C\t2C\n20 20\t20\n3000\t20\n"
DTSV = "78\t58 58\n"


# ---- a minimal protobuf codec, enough to edit fields of a ModelProto ----
def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _fields(buf):
    i, out = 0, []
    while i < len(buf):
        k, s = 0, 0
        while True:
            b = buf[i]; i += 1; k |= (b & 0x7F) << s; s += 7
            if not b & 0x80:
                break
        f, wt = k >> 3, k & 7
        if wt == 0:
            v, s = 0, 0
            while True:
                b = buf[i]; i += 1; v |= (b & 0x7F) << s; s += 7
                if not b & 0x80:
                    break
            out.append((f, wt, v))
        elif wt == 2:
            n, s = 0, 0
            while True:
                b = buf[i]; i += 1; n |= (b & 0x7F) << s; s += 7
                if not b & 0x80:
                    break
            out.append((f, wt, buf[i:i + n])); i += n
        elif wt == 5:
            out.append((f, wt, buf[i:i + 4])); i += 4
        elif wt == 1:
            out.append((f, wt, buf[i:i + 8])); i += 8
        else:
            raise ValueError("wire type %d" % wt)
    return out


def _encode(fields):
    out = bytearray()
    for f, wt, v in fields:
        out += _varint(f << 3 | wt)
        if wt == 0:
            out += _varint(v)
        elif wt == 2:
            out += _varint(len(v)) + v
        else:
            out += v
    return bytes(out)


def msg(field, sub):
    return _encode([(field, 2, _encode(sub))])


def mark_unused(model_bytes, every=7):
    """Marks every `every`-th NORMAL piece (longer than one character) as UNUSED."""
    out, k = [], 0
    for f, wt, v in _fields(model_bytes):
        if f == 1:
            sub = _fields(v)
            typ = next((x for ff, _, x in sub if ff == 3), 1)
            piece = next((x for ff, _, x in sub if ff == 1), b"")
            if typ == 1 and len(piece.decode("utf-8", "replace")) > 1:
                k += 1
                if k % every == 0:
                    sub = [s for s in sub if s[0] != 3] + [(3, 0, 5)]
                    v = _encode(sub)
        out.append((f, wt, v))
    return _encode(out)


def main():
    if not shutil.which("spm_train"):
        print("SKIP tokenizer_trained: spm_train not found (Debian package sentencepiece)")
        return 0
    try:
        import sentencepiece as spm
    except ImportError:
        print("SKIP tokenizer_trained: python3-sentencepiece is not installed")
        return 0
    if not os.access(tc.TOOL, os.X_OK):
        print("FAIL tokenizer_trained: %s is missing (run make)" % tc.TOOL)
        return 1
    lines = tc.corpus(seed=4321)
    tmp = tempfile.mkdtemp(prefix="glm_tok_")
    ok = True
    try:
        train = os.path.join(tmp, "train.txt")
        with open(train, "wb") as f:  # some of everything, small enough to train in well under a second
            f.write(b"\n".join(l for i, l in enumerate(lines) if i % 5 == 0 and len(l) < 2000))
        with open(os.path.join(tmp, "n.tsv"), "w") as f:
            f.write(TSV)
        with open(os.path.join(tmp, "d.tsv"), "w") as f:
            f.write(DTSV)
        paths = {}
        for name, extra in MODELS.items():
            prefix = os.path.join(tmp, name)
            args = ["spm_train", "--input=" + train, "--model_prefix=" + prefix] + BASE + \
                   [a.format(tsv=os.path.join(tmp, "n.tsv"), dtsv=os.path.join(tmp, "d.tsv")) for a in extra]
            p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if p.returncode != 0:
                ok &= tc.report("tokenizer_trained_%s_train" % name, False, p.stderr.decode(errors="replace")[-400:])
                continue
            paths[name] = prefix + ".model"
        # Variants edited at the protobuf level (merged into the existing messages, last value wins).
        base = paths.get("unigram_nfkc_bytefallback")
        if base:
            data = open(base, "rb").read()
            edits = {
                "unigram_noescape": msg(3, [(5, 0, 0)]),
                "unigram_unk_surface": msg(2, [(44, 2, b"<?>"), (35, 0, 0)]),
            }
            for name, extra in edits.items():
                src = data
                if name == "unigram_unk_surface":  # byte_fallback off needs the byte pieces gone
                    src = _encode([x for x in _fields(data) if not (x[0] == 1 and any(
                        ff == 3 and v == 6 for ff, _, v in _fields(x[2])))])
                paths[name] = os.path.join(tmp, name + ".model")
                open(paths[name], "wb").write(src + extra)
        for name in ("bpe_nfkc", "unigram_identity"):
            if name in paths:
                out = os.path.join(tmp, name + "_unused.model")
                open(out, "wb").write(mark_unused(open(paths[name], "rb").read()))
                paths[name + "_unused"] = out

        for name, path in paths.items():
            sp = spm.SentencePieceProcessor(model_file=path)
            ref_ids = [sp.encode(l) for l in lines]
            mine = tc.tool_ids(["--tokenizer", path, "--spm", "--threads", "2"], lines)
            ok &= tc.first_diff("tokenizer_trained_%s_ids (%d lines)" % (name, len(lines)), lines, ref_ids, mine)
            ref_p = [[p.decode("utf-8", "replace") for p in sp.encode_as_pieces(l)] for l in lines[::3]]
            mine_p = [j["pieces"] for j in tc.tool_json(["--tokenizer", path, "--spm", "--pieces"], lines[::3])]
            ok &= tc.first_diff("tokenizer_trained_%s_pieces" % name, lines[::3], ref_p, mine_p)
            ref_t = [sp.decode(x) for x in ref_ids]
            id_lines = [" ".join(map(str, x)).encode() for x in ref_ids]
            mine_t = [j["text"] for j in tc.tool_json(["--tokenizer", path, "--spm", "--decode_lines"], id_lines)]
            ok &= tc.first_diff("tokenizer_trained_%s_decode" % name, lines, ref_t, mine_t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
