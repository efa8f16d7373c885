#!/usr/bin/env python3
"""The web chat page of `glmtrain serve` in a real browser: Debian's headless Chromium opens
/?q=QUESTION&temperature=0&max_tokens=16 (the page sends the question itself, streams the answer
over fetch + server-sent events), and
  * the DOM after the exchange (--dump-dom) holds the question and exactly the answer the API gives
    for the same request, marked done;
  * a screenshot of the page after the exchange is kept in $GLM_BUILD/serve_page.png;
  * the page's clear button and history are in the page (served from the binary).
SKIPs with the reason when chromium is not installed. Prints PASS/FAIL/SKIP lines."""
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402
import serve_common as sc  # noqa: E402

T = Checks()
QUESTION = "写一首关于春天的诗"


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def browse(exe, url, *what, profile):
    """Runs headless Chromium on url (virtual time lets the page's requests finish first)."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--user-data-dir=" + profile, "--virtual-time-budget=20000", "--window-size=1000,700"] + list(what) + [url]
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=90)


def main():
    exe = chromium()
    if not exe:
        T.skip("serve_page_screenshot", "chromium is not installed (Debian's chromium package: scripts/install-deps.sh)")
        return
    if not os.path.exists(sc.GLM) or not shutil.which("spm_train"):
        T.skip("serve_page_screenshot", "glmtrain not built or spm_train missing")
        return
    try:
        import openai  # noqa: F401
    except ImportError:
        T.skip("serve_page_screenshot", "the openai Python client is not installed (scripts/install-deps.sh)")
        return
    tmp = tempfile.mkdtemp(prefix="glm-page-")
    S = None
    try:
        model, _, _ = sc.make_model(tmp)
        S = sc.Server(model)
        want = S.client().chat.completions.create(model="model", messages=[{"role": "user", "content": QUESTION}],
                                                  temperature=0, max_tokens=16).choices[0].message.content
        url = S.base + "/?" + urllib.parse.urlencode({"q": QUESTION, "temperature": "0", "max_tokens": "16"})
        st, page = sc.http(S.port, "GET", "/")
        T.check("page_served_at_root", st == 200 and "<title>glmtrain chat</title>" in page and 'id="clear"' in page and
                "text/event-stream" not in page and "getReader" in page, str(page)[:200])
        p = browse(exe, url, "--dump-dom", profile=os.path.join(tmp, "p1"))
        dom = p.stdout
        user = re.search(r'<div class="msg user">.*?<span class="text">(.*?)</span></div>', dom, re.S)
        ans = re.search(r'<div class="msg assistant" data-state="(\w+)">.*?<span class="text">(.*?)</span></div>', dom, re.S)
        T.check("page_shows_question_after_exchange", p.returncode == 0 and user and html.unescape(user.group(1)) == QUESTION,
                "rc %d: %s" % (p.returncode, (dom or p.stderr)[-600:]))
        T.check("page_shows_the_streamed_answer", ans is not None and ans.group(1) == "done" and
                html.unescape(ans.group(2)) == want, "%r vs %r" % (ans.groups() if ans else dom[-400:], want))
        shot = os.path.abspath(os.path.join(sc.BUILD, "serve_page.png"))
        if os.path.exists(shot):
            os.remove(shot)
        t0 = time.time()
        p = browse(exe, url, "--screenshot=" + shot, profile=os.path.join(tmp, "p2"))
        ok = p.returncode == 0 and os.path.exists(shot) and os.path.getsize(shot) > 5000
        with open(shot, "rb") as f:
            png = f.read(8) if os.path.exists(shot) else b""
        T.check("page_screenshot_after_exchange", ok and png == b"\x89PNG\r\n\x1a\n",
                "rc %d, %s: %s" % (p.returncode, shot, p.stderr[-300:]))
        print("  screenshot: %s (%.1f s)" % (shot, time.time() - t0))
        h = sc.http(S.port, "GET", "/health")[1]
        T.check("page_requests_reached_the_engine", h["served"] >= 3, str(h))
    finally:
        if S:
            S.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL serve_page: %s" % e)
        sys.exit(1)
    sys.exit(T.status())
