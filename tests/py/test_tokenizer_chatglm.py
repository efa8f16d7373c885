#!/usr/bin/env python3
"""glmtrain's tokenizer against SentencePiece itself with the real ChatGLM-6B ice_text.model, on
>= 10,000 varied lines (tokenizer_corpus.corpus): ids and pieces at the SentencePiece level, ids
at the ChatGLM level (reference: tokenization_chatglm.py's pre-processing over python3-
sentencepiece), decoding at both levels, multi-line texts, and the decode(encode(x)) == x
property. Any mismatch fails and prints the first differing line. SKIP when the model is absent."""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_corpus as tc  # noqa: E402

CHECKS = ["spm_ids", "spm_pieces", "glm_ids", "glm_ids_threads", "spm_decode", "glm_decode", "glm_multiline_ids",
          "glm_multiline_decode", "roundtrip_property_spm", "roundtrip_property_glm"]


def main():
    if not os.path.isfile(tc.REAL_MODEL):
        for c in CHECKS:
            print("SKIP tokenizer_chatglm_%s: %s not found" % (c, tc.REAL_MODEL))
        return 0
    try:
        import sentencepiece as spm
    except ImportError:
        for c in CHECKS:
            print("SKIP tokenizer_chatglm_%s: python3-sentencepiece is not installed" % c)
        return 0
    if not os.access(tc.TOOL, os.X_OK):
        print("FAIL tokenizer_chatglm: %s is missing (run make)" % tc.TOOL)
        return 1
    M = tc.REAL_MODEL
    sp = spm.SentencePieceProcessor(model_file=M)
    ref = tc.GlmRef(sp)
    lines = tc.corpus()
    name = lambda c: "tokenizer_chatglm_" + c  # noqa: E731
    ok = True

    # SentencePiece level
    ref_ids = [sp.encode(l) for l in lines]
    mine = tc.tool_ids(["--tokenizer", M, "--spm", "--threads", "2"], lines)
    ok &= tc.first_diff(name("spm_ids") + " (%d lines)" % len(lines), lines, ref_ids, mine)
    ref_p = [[p.decode("utf-8", "replace") for p in sp.encode_as_pieces(l)] for l in lines]
    mine_p = [j["pieces"] for j in tc.tool_json(["--tokenizer", M, "--spm", "--pieces"], lines)]
    ok &= tc.first_diff(name("spm_pieces"), lines, ref_p, mine_p)

    # ChatGLM level (default: [gMASK] <sop> appended)
    glm_ids = [ref.encode(l) for l in lines]
    mine = tc.tool_ids(["--tokenizer", M, "--threads", "1"], lines)
    ok &= tc.first_diff(name("glm_ids") + " (%d lines)" % len(lines), lines, glm_ids, mine)
    mine2 = tc.tool_ids(["--tokenizer", M, "--threads", "2"], lines)
    ok &= tc.report(name("glm_ids_threads"), mine2 == mine, "2 threads give different ids than 1")

    # Decoding
    id_lines = [" ".join(map(str, x)).encode() for x in ref_ids]
    ref_t = [sp.decode(x) for x in ref_ids]
    mine_t = [j["text"] for j in tc.tool_json(["--tokenizer", M, "--spm", "--decode_lines"], id_lines)]
    ok &= tc.first_diff(name("spm_decode"), lines, ref_t, mine_t)
    id_lines = [" ".join(map(str, x)).encode() for x in glm_ids]
    ref_t = [ref.decode(x) for x in glm_ids]
    mine_t = [j["text"] for j in tc.tool_json(["--tokenizer", M, "--decode_lines"], id_lines)]
    ok &= tc.first_diff(name("glm_decode"), lines, ref_t, mine_t)

    # Multi-line texts (newlines become <n>) through --json_input
    rng = random.Random(7)
    texts = [tc.random_text(rng, rng.randint(0, 50), newlines=True).decode("utf-8") for _ in range(2000)]
    texts += ["你好", "[Round 0]\n问：你好\n答：", "def main():\n    print('hello world')\t# greeting", "\n\n\n", "a\n", "\n a",
              " \n \t\n  ", "x" + " " * 81 + "y", " " * 163]
    jl = [tc.json.dumps(t).encode() for t in texts]
    ref_m = [ref.encode(t) for t in texts]
    mine_m = tc.tool_ids(["--tokenizer", M, "--json_input"], jl)
    ok &= tc.first_diff(name("glm_multiline_ids"), texts, ref_m, mine_m, show=repr)
    ref_d = [ref.decode(x) for x in ref_m]
    mine_d = [j["text"] for j in tc.tool_json(["--tokenizer", M, "--decode_lines"],
                                              [" ".join(map(str, x)).encode() for x in ref_m])]
    ok &= tc.first_diff(name("glm_multiline_decode"), texts, ref_d, mine_d, show=repr)

    # decode(encode(x)) == x wherever SentencePiece round-trips (random strings)
    rng = random.Random(99)
    for level in ("spm", "glm"):
        # half from pools NFKC leaves alone (most round-trip), half from everything (few do)
        friendly = ["ascii", "cjk", "emoji1", "scripts"] + (["blank"] if level == "glm" else [])
        xs = [tc.random_text(rng, rng.randint(1, 40), pools=friendly if i % 2 else None,
                             newlines=(level == "glm")).decode() for i in range(3000)]
        if level == "spm":  # leading/trailing/double spaces never survive remove_extra_whitespaces
            xs = [" ".join(x.split()) if i % 2 else x for i, x in enumerate(xs)]
        jl = [tc.json.dumps(x).encode() for x in xs]
        if level == "spm":
            ref_rt = [sp.decode(sp.encode(x)) == x for x in xs]
            enc = tc.tool(["--tokenizer", M, "--spm", "--json_input"], jl)
            dec = tc.tool_json(["--tokenizer", M, "--spm", "--decode_lines"], enc)
        else:
            ref_rt = [ref.decode(ref.encode(x)) == x for x in xs]
            enc = tc.tool(["--tokenizer", M, "--json_input"], jl)
            dec = tc.tool_json(["--tokenizer", M, "--decode_lines"], enc)
        mine_rt = [d["text"] == x for d, x in zip(dec, xs)]
        bad = [i for i in range(len(xs)) if ref_rt[i] and not mine_rt[i]]
        why = "x=%r decodes to %r" % (xs[bad[0]], dec[bad[0]]["text"]) if bad else ""
        ok &= tc.report(name("roundtrip_property_" + level) + " (%d of %d strings round-trip)" % (sum(ref_rt), len(xs)),
                        not bad and len(dec) == len(xs) and sum(ref_rt) > len(xs) // 3, why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
