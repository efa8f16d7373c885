#!/usr/bin/env python3
"""The decoding constraints' regular expressions (infer/regex.h: vLLM's guided_regex, a JSON
Schema's pattern and format) against Python's re.fullmatch, through tests/c/tool_regex:

  * 26 patterns (literals, classes and negated classes, ranges, escapes, \\d \\w \\s and their
    negations, groups, named groups, alternation, * + ? {m} {m,} {m,n}, lazy forms, anchors,
    CJK and \\u escapes, the date-time / uuid / email forms schema_mode uses): 300 random walks each
    through the recognizer's own choices never reach a state that takes no byte, and those that end
    are matches for re.fullmatch;
  * 40,000 texts (random over an alphabet of the patterns' characters, and mutations of the walks'):
    the recognizer's "match" is re.fullmatch's, exactly where a pattern has no \\d \\w \\s (which
    are ASCII here and Unicode in Python) and soundly (a match here is one there) everywhere; every
    prefix of a match is taken;
  * characters cut between tokens: a UTF-8 character's first bytes are taken exactly when some
    character they can still become is one the pattern takes (its length's range, no surrogates);
  * 16 patterns refused, each naming what is not supported.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import random
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Checks, tool  # noqa: E402
from test_serve_constrained import mutate  # noqa: E402

T = Checks()
DATE_TIME = (r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?"
             r"([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)")
PATTERNS = [
    r"abc", r"a|b|cd", r"(ab|cd)*e?", r"[a-c]{2,3}x", r"x{0,2}y{1,}z{3}", r"[^\"]+", r"[^a-z0-9]*!",
    r"\d{3}-\d{4}", r"\w+@\w+\.com", r"\s*\S+\s*", r"\D\W?", r"(?:yes|no)(, (?:yes|no))*",
    r"(?P<year>19|20)\d\d", r"a*?b+?c??", r"^hello( world)?$", r"中文?[一-龥]{1,2}", r"\u4e2d|\x41+",
    r"[\]\[\\-]+", r"\.\*\+\?\(\)\{\}", r"((a|b)c)*", r"(a?)*b", r"", r".{2,4}", DATE_TIME,
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+",
]
REFUSED = [(r"a(?=b)", "lookarounds"), (r"(a)\1", "backreferences"), (r"\bx", "\\b is not supported"),
           (r"(?i)a", "flags"), (r"a{2,1}", "below its lower"), (r"[b-a]", "below its start"), (r"(ab", "')'"),
           (r"ab)", "unbalanced"), (r"[ab", "']'"), (r"*a", "nothing before it"), (r"a{1001}", "above 1000"),
           (r"a^b", "only at the pattern's ends"), (r"[^\d]", "inside [^...]"), (r"a++", "possessive"),
           (r"\U00110000", "UTF-8 cannot write"), (r"x[\ud800-\udfff]", "UTF-8 cannot write")]


def tool_lines(lines, *args):
    p = subprocess.run([tool("tool_regex"), *args], input="".join(json.dumps(x) + "\n" for x in lines),
                       capture_output=True, text=True, timeout=300)
    return p.stdout.split("\n")[:-1] if p.returncode == 0 else None


def fullmatch(pattern, text):
    return re.fullmatch(pattern, text) is not None


def exact(pattern):
    return not re.search(r"\\[dwsDWS]", pattern)


def main():
    if not os.path.exists(tool("tool_regex")):
        print("SKIP regex: %s not built" % tool("tool_regex"))
        return 0
    rng = random.Random(3)
    walks = {}
    for i, p in enumerate(PATTERNS):
        rows = [json.loads(r) for r in tool_lines([[p, i]], "--walk", "300") or []]
        stuck = [t for v, t in rows if v == "stuck"]
        done = [t for v, t in rows if v == "match"]
        bad = [t for t in done if not fullmatch(p, t)]
        walks[p] = done
        T.check("regex_walks_%d" % i, len(rows) == 300 and not stuck and not bad and len(done) >= 150,
                "%r: %d rows, %d stuck %s, %d matches, %d not Python's %s" % (p, len(rows), len(stuck), stuck[:1],
                                                                            len(done), len(bad), bad[:2]))
    texts = []
    for p in PATTERNS:
        alphabet = sorted(set(re.sub(r"\\[a-zA-Z]", "", p)) | set("ab1 中x-") )
        for _ in range(700):
            texts.append((p, "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))))
        for _ in range(800):
            w = rng.choice(walks[p] or [""])
            d = mutate(rng, w, alphabet)
            texts.append((p, d))
    got = tool_lines(texts)
    unsound = [(p, t) for (p, t), g in zip(texts, got or []) if g == "match" and not fullmatch(p, t)]
    missed = [(p, t) for (p, t), g in zip(texts, got or []) if g != "match" and fullmatch(p, t) and exact(p)]
    matches = sum(1 for g in got or [] if g == "match")
    T.check("regex_matches_are_python_fullmatch", got is not None and len(got) == len(texts) and not unsound and
            matches > 5000, "%d unsound %s (%d matches)" % (len(unsound), unsound[:3], matches))
    T.check("regex_python_fullmatch_is_a_match_without_shorthands", got is not None and not missed,
            "%d missed %s" % (len(missed), missed[:3]))
    pre = [(p, t[:k]) for (p, t), g in zip(texts, got or []) if g == "match" for k in range(len(t))]
    pv = tool_lines(pre) if pre else []
    T.check("regex_prefixes_of_matches_taken", pv is not None and all(v in ("prefix", "match") for v in pv) and pre,
            str([(x, v) for x, v in zip(pre, pv or []) if v not in ("prefix", "match")][:3]))
    cases = [(r"[\x00-\x7f]+", b"a\xe0", "refused 1"), ("中", b"\xe4\xb8", "prefix"), ("中", b"\xe4\xb9", "refused 1"),
             ("中", b"\xe5", "refused 0"), (r"[\u0080-\u07ff]", b"\xc2", "prefix"), (r"[\u0080-\u07ff]", b"\xe0", "refused 0"),
             (".", b"\xed\xa0", "refused 1"), (r"[\ud7ff-\udfff]|a", b"\xed", "prefix"), (".", b"\xe0\x80", "refused 1"),
             (r"[\U00010000-\U0010ffff]", b"\xf0\x9f\x98", "prefix"), (r"[\U00010000-\U0010ffff]", b"\xe4", "refused 0")]
    got = tool_lines([[p, b.decode("latin-1"), "bytes"] for p, b, _ in cases])
    bad = [(p, b, want, g) for (p, b, want), g in zip(cases, got or [None] * len(cases)) if g != want]
    T.check("regex_characters_cut_by_tokens", got is not None and not bad, str(bad[:3]))
    got = tool_lines([[p, ""] for p, _ in REFUSED])
    for (p, want), g in zip(REFUSED, got or [None] * len(REFUSED)):
        T.check("regex_refuses_%s" % re.sub(r"\W+", "_", p), g is not None and g.startswith("regex: ") and want in g,
                "%r -> %s" % (p, g))
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
