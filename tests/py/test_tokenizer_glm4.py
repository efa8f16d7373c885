#!/usr/bin/env python3
"""GLM-4's tokenizer (a tiktoken rank file, byte-level BPE) against the PyPI tiktoken package that
THUDM's ChatGLM4Tokenizer wraps. The rank files are made here: a small byte-level BPE trained on the
shared test corpus (Chinese, English, code, digits, emoji), plus tokens that straddle the regex's
piece boundaries (so a boundary in the wrong place changes the ids), the same tokens with shuffled
ranks, and a sweep over Unicode (two-character tokens for every sampled code point). For each:
ids with and without special tokens, the [gMASK] <sop> prefix, pieces, batch encoding, decode,
build_inputs, invalid UTF-8, malformed files, the CLI, and the encode speed (printed, not judged).
The real GLM-4 tokenizer.model is compared too when it is there (GLM4_TOKENIZER or
../shared/tokenizers/glm-4-9b-chat/tokenizer.model), else that check is a SKIP."""
import base64
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import tokenizer_corpus as tc  # noqa: E402

PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
       r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
            "<|end_of_video|>"]
SPM_ONLY, ADD_SPECIAL, ENCODE_SPECIAL = 1, 2, 4
REAL = os.environ.get("GLM4_TOKENIZER", os.path.join(tc.REPO, "..", "shared", "tokenizers", "glm-4-9b-chat",
                                                      "tokenizer.model"))
C = harness.Checks()

HAND = [
    "", " ", "a", "hello world", "Hello, World! It's 2024.", "GLM-4是一个大模型model，支持128K上下文。",
    "I'm you're we've they'll he'd it's don't", "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T", "i'M yOu'Re We'Ve",
    "'s's''s 'S 'ſ 'ﬅ", "rock'n'roll o'clock '", "你好，世界！", "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "こんにちは、カタカナ", "안녕하세요 세계", "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "ไทย",
    "a  b", "a   \n\n  b", " " * 1000, "\t\t\tx", "   ", "x   ", "\n", "\r\n", "a\r\nb\r\n\r\n", " \r\n \n",
    "\n\n\n   \n", "\u3000\u3000中", "\u00a0a", "a\u2028b", "\x85", "a\x85b", "\x0b\x0c x", "x\u180e\u180ey",
    "\u200b\ufeff", " \t \t\n", "end with space ", "  lead", "\r", "\r\r\n\n\r",
    "1", "12", "123", "1234", "12345", "123456", "1234567", "3.14159", "1,000,000", "v1.2.3", "٣٤٥٦٧", "①②③",
    "２０２３年", "Ⅻ", "x1y22z333", "-42", "1e10",
    "👋", "👨‍👩‍👧‍👦", "🇨🇳", "❤️", "👍🏽 ok", "🚀🚀🚀", "𝄞𠀀", "emoji😀in😀text",
    "e\u0301", "é", "a\u0300\u0301\u0302", "\u0301abc", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d",
    "def f(x):\n    return x**2  # square\n", "int main(void) { return 0; }",
    "if (a && b) {\n\tprintf(\"%d\\n\", a);\n}", "x = [1, 2, 3]; y = {'k': \"v\"}", "<html><body>&nbsp;</body></html>",
    "<|user|>hi<|assistant|>", "[gMASK]<sop>", "<|endoftext|>", "a<|endoftext|>b", "<|user|", "<<|user|>>",
    "[MASK][gMASK][sMASK]", "<|begin_of_image|><|end_of_video|>", "a\x00b", "\x00",
    "a" * 20000, "春" * 5000, "ab" * 5000, "!!!" * 3000, "    " * 2000 + "x", ("  \n" * 300),
]


def train(texts, n_merges):
    """A plain byte-level BPE trainer (counts of pairs over the regex's pieces, most frequent first)."""
    import regex
    counts = collections.Counter()
    pat = regex.compile(PAT)
    for t in texts:
        for m in pat.findall(t):
            counts[m.encode()] += 1
    words = [[bytes([c]) for c in w] for w in counts]
    freqs = list(counts.values())
    pairs, where = collections.Counter(), collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[a, b] += freqs[i]
            where[a, b].add(i)
    ranks = {bytes([i]): i for i in range(256)}
    for _ in range(n_merges):
        if not pairs:
            break
        (a, b), c = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if c < 2:
            break
        ranks[a + b] = len(ranks)
        for i in list(where[a, b]):
            w, f = words[i], freqs[i]
            for x, y in zip(w, w[1:]):
                pairs[x, y] -= f
                if pairs[x, y] <= 0:
                    del pairs[x, y]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pairs[x, y] += f
                where[x, y].add(i)
    return ranks


def boundary_tokens(ranks, chars):
    """Tokens that cross where the regex may cut, so a cut in the wrong place shows in the ids."""
    for c in chars:
        for t in (c + c, c + "b", "a" + c, " " + c, c + " ", c + "\n", "\n" + c, c + "1", "1" + c, "'" + c, c * 3):
            ranks.setdefault(t.encode(), len(ranks))
    return ranks


def write_model(folder, ranks, config=None):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.model"), "w") as f:
        for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write("%s %d\n" % (base64.b64encode(t).decode(), r))
    if config:
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
    return folder


class Api:
    """tool_tokenizer --api: one JSON request per line through the library calls."""

    def __init__(self, path):
        self.p = subprocess.Popen([tc.TOOL, "--api", path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)

    def ask(self, **q):
        self.p.stdin.write((json.dumps(q) + "\n").encode())
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("tool_tokenizer --api ended: " + self.p.stderr.read().decode(errors="replace"))
        return json.loads(line)

    def batch(self, texts, flags=0):
        out = []
        for i in range(0, len(texts), 4000):
            r = self.ask(op="batch", hex=[t.encode().hex() for t in texts[i:i + 4000]], flags=flags, threads=2)
            if "error" in r:
                raise RuntimeError(r["error"])
            out += r["ids"]
        return out

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def same(name, texts, ref, got):
    """One check: ref == got element-wise, else the first differing text."""
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return C.check(name, False, "text %d %r: tiktoken %s, glmtrain %s" % (i, texts[i][:120], a[:40], b[:40]))
    return C.check(name, len(ref) == len(got), "%d vs %d results" % (len(ref), len(got)))


def special_texts(rng, n):
    """Texts with special tokens (whole, cut, nested) between ordinary text."""
    parts = SPECIALS + ["<|", "|>", "<|user", "[gMASK", "<<", ">>", " ", "\n", "abc", "你好", "12345", "'s"]
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def compare_encoding(tag, api, enc, texts, specials_texts):
    n = enc.n_vocab - len(SPECIALS)
    gm, sop = n + 2, n + 4
    ref = enc.encode_ordinary_batch(texts, num_threads=2)
    got = api.batch(texts)
    same(tag + "_ids", texts, ref, got)
    one = [api.ask(op="encode", hex=t.encode().hex())["ids"] for t in HAND]
    same(tag + "_single_equals_batch", HAND, got[:len(HAND)], one)
    same(tag + "_spm_only_flag", HAND, got[:len(HAND)], api.batch(HAND, SPM_ONLY))
    same(tag + "_prefix", HAND, [[gm, sop] + r for r in ref[:len(HAND)]], api.batch(HAND, ADD_SPECIAL))
    st = specials_texts + HAND
    same(tag + "_special_text_is_text", st, [enc.encode(t, allowed_special=set(), disallowed_special=()) for t in st],
         api.batch(st))
    ref_sp = [enc.encode(t, allowed_special="all") for t in st]
    same(tag + "_encode_special", st, ref_sp, api.batch(st, ENCODE_SPECIAL))
    same(tag + "_encode_special_prefix", st, [[gm, sop] + r for r in ref_sp], api.batch(st, ENCODE_SPECIAL | ADD_SPECIAL))
    pieces = [[bytes.fromhex(h) for h in api.ask(op="pieces", hex=t.encode().hex(), flags=ENCODE_SPECIAL)["pieces"]]
              for t in st[:300]]
    same(tag + "_pieces", st, [[enc.decode_single_token_bytes(i) for i in r] for r in ref_sp[:300]], pieces)
    dec = [bytes.fromhex(api.ask(op="decode", ids=r)["hex"]).decode() for r in got[:3000]]
    same(tag + "_decode_round_trip", texts, texts[:3000], dec)
    dec = [bytes.fromhex(api.ask(op="decode", ids=r)["hex"]) for r in ref_sp]
    same(tag + "_decode_drops_specials", st, [enc.decode([i for i in r if i < n]).encode() for r in ref_sp], dec)


def check_random_decode(api, enc, rng):
    """Random id runs (cut characters, specials, ids out of range) against tiktoken's decode."""
    n = enc.n_vocab - len(SPECIALS)
    runs = [[rng.randrange(-2, enc.n_vocab + 3) for _ in range(rng.randint(0, 40))] for _ in range(400)]
    runs += [[rng.randrange(128, 256) for _ in range(rng.randint(1, 8))] for _ in range(400)]
    ranks_only = [[i for i in r if 0 <= i < n] for r in runs]
    got = [bytes.fromhex(api.ask(op="decode", ids=r)["hex"]).decode() for r in runs]
    same("glm4_decode_replace_like_tiktoken", runs, [enc.decode(r) for r in ranks_only], got)
    got = [bytes.fromhex(api.ask(op="decode", ids=r, flags=SPM_ONLY)["hex"]) for r in runs]
    same("glm4_decode_raw_like_decode_bytes", runs, [enc.decode_bytes(r) for r in ranks_only], got)


def check_interface(api, enc, ranks):
    n = len(ranks)
    info = api.ask(op="info")
    want = {"kind": 3, "vocab": n + 14, "spm_size": n, "eos": n, "mask": n + 1, "gmask": n + 2, "sop": n + 4, "eop": n + 5,
            "pad": n, "unk": -1, "stop": [n, n + 7, n + 9]}
    C.check("glm4_info", info == want, "%s, wanted %s" % (info, want))
    ids = list(range(n, n + 14))
    got = api.ask(op="piece", ids=ids + [n + 14, -1])["pieces"]
    C.check("glm4_special_pieces", got == [s.encode().hex() for s in SPECIALS] + [None, None], str(got))
    got = api.ask(op="piece_id", hex=[s.encode().hex() for s in SPECIALS] + ["7a7a7a7a7a7a7a7a"])["ids"]
    C.check("glm4_special_piece_ids", got == ids + [-1], str(got))
    sample = [t for t in random.Random(5).sample(sorted(ranks), 500) if b"\0" not in t]
    got = api.ask(op="piece_id", hex=[t.hex() for t in sample])["ids"]
    C.check("glm4_piece_ids", got == [ranks[t] for t in sample], "first ids %s" % got[:5])
    got = api.ask(op="piece", ids=[ranks[t] for t in sample])["pieces"]
    C.check("glm4_pieces_of_ids", got == [t.hex() for t in sample], "first %s" % got[:5])
    got = api.ask(op="build", a=[5, 6], b=[7])["ids"], api.ask(op="build", a=[5, 6])["ids"]
    C.check("glm4_build_inputs", got == ([n + 2, n + 4, 5, 6, 7, n], [n + 2, n + 4, 5, 6]), str(got))


def check_bad_utf8(api, lines):
    bad = []
    for l in lines:
        try:
            l.decode("utf-8")
        except UnicodeDecodeError as e:
            bad.append((l, e.start))
    errs = [api.ask(op="encode", hex=l.hex())["error"] for l, _ in bad[:300]]
    wrong = [(l, at, e) for (l, at), e in zip(bad, errs) if "not valid UTF-8 at byte %d " % at not in e]
    C.check("glm4_invalid_utf8_refused", bad and not wrong, "%d texts, first wrong %r" % (len(bad), wrong[:1]))
    r = api.ask(op="batch", hex=["6f6b", bad[0][0].hex(), "6f6b"])
    C.check("glm4_invalid_utf8_in_batch", "text 1 of the batch" in r.get("error", ""), str(r))


def check_bad_files(tmp):
    good = "".join("%s %d\n" % (base64.b64encode(bytes([i])).decode(), i) for i in range(256))
    cases = {"no rank": (good + "YWI=\n", "line 257: \"YWI=\" has no rank"),
             "bad base64": (good + "Y!I= 256\n", "line 257: \"Y!I=\" is not base64"),
             "duplicate rank": (good + "YWI= 255\n", "line 257: rank 255 was already given on line 256"),
             "missing byte": (good.replace("QQ== 65\n", "YWI= 65\n"), "no token is the single byte 0x41")}
    for name, (text, needle) in cases.items():
        d = os.path.join(tmp, "bad_" + name.replace(" ", "_"))
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.model"), "w") as f:
            f.write(text)
        p = subprocess.run([tc.TOOL, "--tokenizer", d, "--text", "x"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = p.stderr.decode()
        C.check("glm4_bad_file_" + name.replace(" ", "_"), p.returncode == 1 and needle in err and
                os.path.join(d, "tokenizer.model") in err, err.strip())


def check_cli(folder, enc, texts):
    n = enc.n_vocab - len(SPECIALS)
    lines = [t for t in texts if "\n" not in t and "\r" not in t][:2000]
    data = [t.encode() for t in lines]
    ref = enc.encode_ordinary_batch(lines)
    got = tc.tool_ids(["--tokenizer", folder, "--no_special_tokens"], data)
    same("glm4_cli_ids", lines, ref, got)
    got = tc.tool_ids(["--tokenizer", folder], data)
    same("glm4_cli_prefix", lines, [[n + 2, n + 4] + r for r in ref], got)
    ids = " ".join(map(str, [n + 2, n + 4] + ref[1]))
    got = tc.tool(["--tokenizer", folder, "--decode", ids])
    C.check("glm4_cli_decode", got == [lines[1].encode()], "%r vs %r" % (got, lines[1]))


def check_speed(folder, enc, texts):
    """Encode speed on ~4 MB of the corpus, one thread, against tiktoken's (information, not a check
    beyond the ids being equal: the machine is shared)."""
    body = "\n".join(t for t in texts if "\r" not in t)
    while len(body.encode()) < 4_000_000:
        body += "\n" + body
    lines = body.split("\n")
    path = os.path.join(os.path.dirname(folder), "speed.txt")
    with open(path, "w") as f:
        f.write(body + "\n")
    nbytes = len(body.encode())
    t0 = time.time()
    ref = [enc.encode_ordinary(l) for l in lines]
    t_ref = time.time() - t0
    ntok = sum(map(len, ref))
    t0 = time.time()
    out = subprocess.run([tc.TOOL, "--tokenizer", folder, "--file", path, "--no_special_tokens", "--threads", "1"],
                         stdout=subprocess.PIPE, check=True).stdout
    t_c = time.time() - t0
    got = [[int(x) for x in l.split()] for l in out.decode().split("\n")[:-1]]
    print("INFO glm4 encode of %.1f MB (%d tokens, %d ranks), one thread: glmtrain %.2f s (%.2f M tokens/s, CLI "
          "and output included), tiktoken %s %.2f s (%.2f M tokens/s)" % (nbytes / 1e6, ntok, enc.n_vocab - 14, t_c,
                                                                         ntok / t_c / 1e6, "0.8", t_ref, ntok / t_ref / 1e6))
    C.check("glm4_speed_run_ids", got == ref, "%d vs %d lines" % (len(got), len(ref)))


def check_unicode(tmp, tiktoken):
    """Every sampled code point in a context where the regex's class decides the cut. Code points
    that this Python's unicodedata calls unassigned are left out: libpcre2 and tiktoken's regex crate
    may know newer Unicode versions than each other."""
    cps = [c for c in range(1, 0x32000, 7) if not 0xD800 <= c < 0xE000]
    cps += list(range(0x2000, 0x2070)) + [0x85, 0xA0, 0x1680, 0x180E, 0x3000, 0xFEFF]
    chars = [chr(c) for c in cps if unicodedata.category(chr(c)) != "Cn"]
    ranks = {bytes([i]): i for i in range(256)}
    for c in chars:
        for t in (c + c, c + "b", "a" + c, " " + c, "1" + c, c + "1", c + "\n"):
            ranks.setdefault(t.encode(), len(ranks))
    folder = write_model(os.path.join(tmp, "unicode"), ranks)
    enc = tiktoken.Encoding("uni", pat_str=PAT, mergeable_ranks=ranks, special_tokens={})
    texts = []
    for c in chars:
        texts += ["a%s%sb" % (c, c), "1%s%s1" % (c, c), " %s%s\n" % (c, c), "x %s" % c]
    api = Api(folder)
    same("glm4_unicode_classes_%d_code_points" % len(chars), texts, enc.encode_ordinary_batch(texts), api.batch(texts))
    api.close()


def check_real(tiktoken):
    if not os.path.isfile(REAL):
        C.skip("glm4_real_tokenizer", "no GLM-4 tokenizer.model at %s (set GLM4_TOKENIZER)" % REAL)
        return
    ranks = {}
    with open(REAL) as f:
        for line in f:
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    enc = tiktoken.Encoding("glm4", pat_str=PAT, mergeable_ranks=ranks,
                            special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIALS)})
    api = Api(REAL)
    info = api.ask(op="info")
    C.check("glm4_real_ids", len(ranks) == 151329 and info["gmask"] == 151331 and info["sop"] == 151333 and
            info["eos"] == 151329 and info["stop"] == [151329, 151336, 151338], "%d ranks, %s" % (len(ranks), info))
    lines = [l.decode() for l in tc.corpus() if _valid(l)] + HAND
    same("glm4_real_ids_corpus", lines, enc.encode_ordinary_batch(lines), api.batch(lines))
    api.close()


def _valid(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def main():
    try:
        import tiktoken
    except ImportError:
        C.skip("glm4_tiktoken", "tiktoken is not installed (scripts/install-deps.sh installs it)")
        return 0
    rng = random.Random(18)
    lines = tc.corpus()
    texts = [l.decode() for l in lines if _valid(l)]
    texts += [t.decode() for t in (tc.random_text(rng, rng.randint(1, 50), newlines=True) for _ in range(1000))
              if _valid(t)]
    with tempfile.TemporaryDirectory() as tmp:
        odd = [chr(c) for c in list(range(0, 0x250)) + [0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x200A, 0x200B, 0x2028,
                                                        0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x0301, 0x0660, 0x3007]]
        ranks = boundary_tokens(train(texts[:3000], 1500), odd)
        folder = write_model(os.path.join(tmp, "glm4"), ranks,
                             {"tokenizer_class": "ChatGLM4Tokenizer", "eos_token": "<|endoftext|>",
                              "pad_token": "<|endoftext|>", "padding_side": "left"})
        enc = tiktoken.Encoding("glm4-test", pat_str=PAT, mergeable_ranks=ranks,
                                special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIALS)})
        api = Api(folder)
        check_interface(api, enc, ranks)
        st = special_texts(rng, 400)
        compare_encoding("glm4_trained", api, enc, HAND + texts, st)
        check_random_decode(api, enc, rng)
        check_bad_utf8(api, lines)
        api.close()

        order = list(range(len(ranks)))
        rng.shuffle(order)
        shuffled = {t: order[r] for t, r in ranks.items()}
        sfolder = write_model(os.path.join(tmp, "shuffled"), shuffled)
        senc = tiktoken.Encoding("glm4-shuffled", pat_str=PAT, mergeable_ranks=shuffled,
                                 special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIALS)})
        api = Api(sfolder)
        compare_encoding("glm4_shuffled", api, senc, HAND + texts[:3000], st[:100])
        api.close()

        check_bad_files(tmp)
        check_cli(folder, enc, texts)
        check_unicode(tmp, tiktoken)
        check_speed(folder, enc, texts)
        check_real(tiktoken)
    return C.status()


if __name__ == "__main__":
    sys.exit(main())
