#!/usr/bin/env python3
"""`glmtrain chat`'s KV cache kept between turns (--reuse_kv_cache, as THUDM's ChatGLM2/3 cli_demo
keeps past_key_values): on a tiny random ChatGLM2-family model, greedy, a conversation of three
turns, 'clear', and one more:

  * the whole transcript (every answer) is bit for bit the one without the kept cache, on the
    whole model and split over 2 pipeline stages (CPU);
  * the third turn takes the earlier turns' tokens from the cache (--debug's count > 0; the second
    turn's prompt, model.chat's first "[Round 0]" form, shares only what it shares), and the turn
    after 'clear' takes none;
  * ChatGLM-6B (GLM v1, whose prompt sees itself whole) keeps nothing and answers as before.
Prints PASS/FAIL/SKIP lines."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()
MSGS = "写一首关于春天的诗\n明月\n再来一首\nclear\n你好\n"


def chat(model, *flags):
    p = subprocess.run([sc.GLM, "chat", "--model_name_or_path", model, "--device", "cpu", "--do_sample", "false",
                        "--max_new_tokens", "12", "--debug"] + list(flags), input=MSGS, capture_output=True, text=True,
                       errors="replace", timeout=180, env=sc.ENV)
    counts = [int(m.group(1)) for m in re.finditer(r"\[debug\] (\d+) of the prompt's \d+ tokens from the cache", p.stderr)]
    return p, counts


def main():
    if not os.path.exists(sc.GLM):
        print("SKIP chat_cache: %s not built" % sc.GLM)
        return 0
    from test_serve_echo import make_glm2
    tmp = tempfile.mkdtemp(prefix="glmtrain-chat-cache-")
    try:
        model, _, _ = make_glm2(tmp)
        kept, counts = chat(model)
        fresh, none = chat(model, "--reuse_kv_cache", "false")
        T.check("chat_kept_cache_transcript_bit_identical", kept.returncode == fresh.returncode == 0 and
                kept.stdout == fresh.stdout and kept.stdout.count("ChatGLM:") == 4, kept.stderr[-500:])
        T.check("chat_kept_cache_counts", len(counts) == 4 and counts[0] == 0 and counts[2] > 10 and counts[3] == 0 and
                none == [], "%s / %s" % (counts, none))
        split, scounts = chat(model, "--device_map", "auto", "--pipeline_parallel_size", "2")
        T.check("chat_kept_cache_2_stages_bit_identical", split.returncode == 0 and split.stdout == fresh.stdout and
                scounts == counts, "%s %s" % (scounts, split.stderr[-400:]))
        os.makedirs(os.path.join(tmp, "v1"))
        v1, _, _ = sc.make_model(os.path.join(tmp, "v1"))
        a, c1 = chat(v1)
        b, _ = chat(v1, "--reuse_kv_cache", "false")
        T.check("chat_glm1_keeps_nothing", a.returncode == 0 and c1 == [] and a.stdout == b.stdout, a.stderr[-400:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return T.status()


if __name__ == "__main__":
    sys.exit(main())
