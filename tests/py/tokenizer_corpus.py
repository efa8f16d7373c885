"""Shared helpers for the tokenizer tests: a deterministic, deliberately nasty test corpus, the
ChatGLM-6B reference pre/post-processing (a transcription of THUDM's tokenization_chatglm.py on
top of Debian's python3-sentencepiece) and a driver for build/tests/tool_tokenizer.

Not a test itself (run.sh only runs tests/py/test_*.py)."""
import json
import os
import random
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("GLM_BUILD", "build")
TOOL = os.path.join(REPO, BUILD, "tests", "tool_tokenizer") if not os.path.isabs(BUILD) else os.path.join(BUILD, "tests", "tool_tokenizer")
REAL_MODEL = os.environ.get("GLM_TOKENIZER_MODEL",
                            os.path.join(REPO, "..", "shared", "tokenizers", "chatglm-6b", "ice_text.model"))
FORTUNES = "/usr/share/games/fortunes"


def report(name, ok, why=""):
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)
    return ok


# ---------------------------------------------------------------- corpus

def _read_lines(path, limit=None):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    return lines[:limit] if limit else lines


POOLS = {
    "ascii": [chr(c) for c in range(0x20, 0x7f)],
    "cjk": [chr(c) for c in range(0x4e00, 0x9fff, 37)] + list("你好世界中文的一是不了人我在有他这为之大来以个中上们"),
    "fullwidth": list("，。！？：；（）【】「」『』、《》〈〉…—～·＂＇＃＄％＆＊＋－／＜＝＞＠［＼］＾＿｀｛｜｝") +
                 [chr(c) for c in range(0xff10, 0xff5e, 3)] + ["\u3000"],
    "emoji": ["👋", "😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🇨🇳", "❤️", "✨", "🚀", "🤖", "\U0001f9d1\u200d\U0001f4bb", "☃", "⌚"],
    "emoji1": ["👋", "😀", "🎉", "👍🏽", "🇨🇳", "✨", "🚀", "🤖", "☃", "⌚", "🀄", "𝄞", "𠀀"],
    "blank": [" ", "  ", "\t", "    ", "\t\t", " " * 81, " " * 7],
    "compat": list("ﬁﬂ①②⑳ⅫⅣ²³¼½ｶﾞﾊﾟ㍻㎏℃℉™ﷺ㈱Å\u00c5\u212b") + ["e\u0301", "\u1100\u1161", "ᄀ", "\uac00"],
    "space": [" ", " ", "  ", "   ", "\t", " \t ", "\u00a0", "\u2003", "\u200b", "\ufeff", "\u3000", "\r"],
    "control": [chr(c) for c in range(1, 0x20) if c != 10] + ["\x7f", "\x85", "\u2028", "\u200d", "\u2066"],
    "scripts": list("Ωπσβάέήίόύώ" "Привет мир" "مرحبا" "שלום" "नमस्ते" "こんにちは" "カタカナ" "안녕하세요" "ไทย"),
    "special": ["▁", "<n>", "<|tab|>", "<|blank_3|>", "<|blank_80|>", "[gMASK]", "<sop>", "<eop>", "<unk>", "<pad>",
                "<s>", "</s>", "<0x41>", "\ufffd", "[MASK]", "<|blank_1|>", "<|blank_02|>", "<|blank_81|>"],
    "digits": list("0123456789") + ["3.14159", "1,000,000", "２０２３年", "v1.2.3"],
}
BAD_BYTES = [b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xe4\xbd", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80",
             b"\xc3", b"\xe2\x82", b"\xf0\x9f\x91", b"\x00"]


def random_text(rng, n_units, pools=None, bad=0.0, newlines=False):
    """A random string made of units drawn from the pools (with runs of spaces and tabs)."""
    pools = pools or list(POOLS)
    out = []
    for _ in range(n_units):
        p = rng.choice(pools)
        u = rng.choice(POOLS[p])
        if p == "space" and rng.random() < 0.3:
            u = u * rng.randint(2, 100)
        out.append(u.encode("utf-8"))
        if bad and rng.random() < bad:
            out.append(rng.choice(BAD_BYTES))
        if newlines and rng.random() < 0.05:
            out.append(b"\n")
    return b"".join(out)


def corpus(seed=1234, n_min=10000):
    """>= n_min lines (bytes, no b'\\n'): Tang/Song poems and Chinese fortunes, English prose,
    source code, and random lines with emoji, full-width punctuation, compatibility characters,
    space/tab runs, control characters, empty lines and invalid UTF-8."""
    rng = random.Random(seed)
    lines = []
    for name in ("tang300", "song100"):
        lines += _read_lines(os.path.join(FORTUNES, name))
    chinese = _read_lines(os.path.join(FORTUNES, "chinese"))
    if chinese:
        lines += rng.sample(chinese, min(3000, len(chinese)))
    for lic in ("GPL-3", "Apache-2.0", "Artistic"):
        lines += _read_lines(os.path.join("/usr/share/common-licenses", lic), 600)
    src = []
    for root in (os.path.join(REPO, "src"), "/usr/lib/python3/dist-packages/sentencepiece"):
        for dp, _, fs in os.walk(root):
            for f in sorted(fs):
                if f.endswith((".c", ".h", ".py", ".cu")):
                    src += _read_lines(os.path.join(dp, f), 400)
    rng.shuffle(src)
    lines += src[:2000]
    while len(lines) < n_min:
        r = rng.random()
        if r < 0.05:
            lines.append(b"")
        elif r < 0.10:
            lines.append(b"".join(rng.choice([b" ", b"\t", b"  "]) for _ in range(rng.randint(1, 120))))
        elif r < 0.30:
            lines.append(random_text(rng, rng.randint(1, 60), bad=0.1))
        elif r < 0.45:
            lines.append(random_text(rng, rng.randint(1, 40), pools=["cjk", "fullwidth", "space", "emoji"]))
        elif r < 0.55 and chinese:
            # mutate a real line: insert spaces, bad bytes, emoji
            b = bytearray(rng.choice(chinese))
            for _ in range(rng.randint(1, 4)):
                pos = rng.randint(0, len(b))
                b[pos:pos] = rng.choice([b"  ", b"\t", "👋".encode(), b"\xff", "，".encode(), b"   \t "])
            lines.append(bytes(b))
        else:
            lines.append(random_text(rng, rng.randint(1, 30)))
    # a few long lines
    lines.append(("春眠不觉晓，处处闻啼鸟。" * 800).encode())
    lines.append(b"a" * 30000)
    lines.append((" " * 500 + "x") .encode() * 20)
    return [l.replace(b"\n", b"") for l in lines]


# ---------------------------------------------------------------- ChatGLM-6B reference

def glm_preprocess(text):
    """SPTokenizer._preprocess (linebreak=True, whitespaces=True, max_len=80), on bytes or str."""
    b = isinstance(text, bytes)
    rep = (lambda s: s.encode()) if b else (lambda s: s)
    text = text.replace(rep("\n"), rep("<n>"))
    text = text.replace(rep("\t"), rep("<|tab|>"))
    for i in range(80, 1, -1):
        text = text.replace(rep(" " * i), rep("<|blank_%d|>" % i))
    return text


def glm_postprocess(text):
    """SPTokenizer.postprocess."""
    text = text.replace("<n>", "\n")
    text = text.replace("<|tab|>", "\t")
    for i in range(2, 81):
        text = text.replace("<|blank_%d|>" % i, " " * i)
    return text


class GlmRef:
    """ChatGLMTokenizer (num_image_tokens 0) on top of sentencepiece."""

    def __init__(self, sp):
        self.sp = sp
        self.gmask, self.sop, self.pad = sp.piece_to_id("[gMASK]"), sp.piece_to_id("<sop>"), sp.piece_to_id("<pad>")

    def encode(self, text, special=True):
        ids = self.sp.encode(glm_preprocess(text))
        return ids + [self.gmask, self.sop] if special else ids

    def decode(self, ids):
        return glm_postprocess(self.sp.decode([i for i in ids if i != self.pad]))


# ---------------------------------------------------------------- driver

def tool(args, lines=None, text_input=None):
    """Runs tool_tokenizer; lines (bytes) go to a file passed with --file. Returns stdout lines."""
    cmd = [TOOL] + args
    data = None
    if lines is not None:
        data = b"\n".join(lines) + b"\n"
        cmd += ["--file", "-"]
    p = subprocess.run(cmd, input=data if data is not None else text_input, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("tool_tokenizer %s failed: %s" % (" ".join(args), p.stderr.decode(errors="replace")))
    out = p.stdout.split(b"\n")
    if out and out[-1] == b"":
        out.pop()
    return out


def tool_ids(args, lines):
    return [[int(x) for x in l.split()] for l in tool(args, lines)]


def tool_json(args, lines):
    return [json.loads(l) for l in tool(args + ["--json"], lines)]


def first_diff(name, lines, ref, mine, show=lambda x: x):
    """Reports PASS when ref == mine element-wise, else FAIL with the first differing line."""
    if len(ref) != len(mine):
        return report(name, False, "%d reference outputs vs %d" % (len(ref), len(mine)))
    for i, (a, b) in enumerate(zip(ref, mine)):
        if a != b:
            return report(name, False, "line %d %r: sentencepiece %r, glmtrain %r" % (i, show(lines[i])[:300], a, b))
    return report(name, True)
