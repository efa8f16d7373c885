#!/usr/bin/env python3
"""`glmtrain serve`'s POST /, THUDM's api.py protocol (ChatGLM-6B / ChatGLM2-6B ship api.py and
the guides deploy with it), on a tiny random ChatGLM-6B model:

  * {"prompt", "history"} gets {"response", "history": history + [[prompt, response]],
    "status": 200, "time": "%Y-%m-%d %H:%M:%S"}, the response the chat completion of the same
    conversation gives (same seed: glmtrain's "seed" passes through);
  * max_length is HF's (prompt + response): a small one cuts the response;
  * a missing prompt, a history that is not [query, response] pairs, and a body that is not JSON
    get 400s naming the field; with --api_key the key is needed; GET / is still the chat page;
  * LLaMA-Factory's API config (model_name_or_path, adapter_name_or_path, template, ...) through
    --config: the base with the adapter is the served model, what generate --adapter gives.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import subprocess
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_common as sc  # noqa: E402
from harness import Checks  # noqa: E402

T = Checks()


def main():
    if not os.path.exists(sc.GLM):
        T.skip("serve_thudm_api", "%s not built" % sc.GLM)
        return
    if not shutil.which("spm_train"):
        T.skip("serve_thudm_api", "spm_train (Debian sentencepiece) not installed")
        return
    tmp = tempfile.mkdtemp(prefix="glm-serve-api-")
    S = None
    try:
        model, cfg, _ = sc.make_model(tmp)
        S = sc.Server(model, "--served_model_name", "model", "--api_key", "k1")
        auth = {"Authorization": "Bearer k1"}
        hist = [["你好", "你好，我是助手"]]
        st, body = sc.http(S.port, "POST", "/", {"prompt": "再说一遍", "history": hist, "seed": 5, "temperature": 0.9,
                                                 "top_p": 0.7, "max_length": 200}, headers=auth)
        msgs = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好，我是助手"},
                {"role": "user", "content": "再说一遍"}]
        st2, ref = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "messages": msgs, "seed": 5,
                                                                      "temperature": 0.9, "top_p": 0.7, "max_length": 200},
                           headers=auth)
        want = ref["choices"][0]["message"]["content"] if st2 == 200 else None
        T.check("api_py_answer_is_the_chat_completion", st == 200 and body.get("response") == want and want is not None,
                "%s %s / %s %s" % (st, body, st2, ref))
        T.check("api_py_history_and_fields", st == 200 and body.get("history") == hist + [["再说一遍", want]] and
                body.get("status") == 200 and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", body.get("time", "")),
                body)
        st, body = sc.http(S.port, "POST", "/", {"prompt": "你好", "max_length": 12, "seed": 1}, headers=auth)
        st2, ref = sc.http(S.port, "POST", "/v1/chat/completions", {"model": "model", "seed": 1, "max_length": 12,
                                                                      "messages": [{"role": "user", "content": "你好"}]},
                           headers=auth)
        T.check("api_py_max_length_is_prompt_plus_response", st == 200 and st2 == 200 and
                ref["choices"][0]["finish_reason"] == "length" and body["response"] == ref["choices"][0]["message"]["content"]
                and ref["usage"]["total_tokens"] == 12, "%s / %s" % (body, ref))
        st, body = sc.http(S.port, "POST", "/", {"history": []}, headers=auth)
        T.check("api_py_missing_prompt_400", st == 400 and body["error"]["param"] == "prompt", body)
        st, body = sc.http(S.port, "POST", "/", {"prompt": "x", "history": [["only one"]]}, headers=auth)
        T.check("api_py_bad_history_400", st == 400 and body["error"]["param"] == "history" and "history[0]" in
                body["error"]["message"], body)
        st, body = sc.http(S.port, "POST", "/", {"prompt": "x"})
        T.check("api_py_needs_the_key", st == 401, body)
        st, page = sc.http(S.port, "GET", "/")
        T.check("get_root_is_still_the_page", st == 200, str(page)[:200])
        rc = S.stop()
        T.check("clean_exit", rc == 0, S.text()[-300:])
        S = None
        # LLaMA-Factory's API config (llamafactory-cli api FILE.yaml): the base with its adapter is the served
        # model itself; requests naming it, or no model, get what generate --adapter gives
        ad = sc.make_adapter(os.path.join(tmp, "lf_lora"), cfg, 4, ["query_key_value", "dense_h_to_4h"], seed=2)
        yml = os.path.join(tmp, "api.yaml")
        open(yml, "w").write("model_name_or_path: %s\nadapter_name_or_path: %s\ntemplate: chatglm\nfinetuning_type: lora\n"
                             "infer_backend: huggingface\n" % (model, ad))
        want = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "10", "--adapter", ad)
        base = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "10")
        S = sc.Server(model, "--config", yml, "--served_model_name", "mine")
        got = []
        for m in ({}, {"model": "mine"}):
            st, body = sc.http(S.port, "POST", "/v1/chat/completions", dict(m, messages=[{"role": "user", "content": "你好"}],
                                                                            temperature=0, max_tokens=10))
            got.append((st, body["choices"][0]["message"]["content"] if st == 200 else body, body.get("model")))
        T.check("lf_api_config_serves_the_adapter_as_the_model", want != base and got == [(200, want, "mine")] * 2,
                "%s vs %r (base %r)" % (got, want, base))
        rc = S.stop()
        T.check("lf_api_clean_exit", rc == 0, S.text()[-300:])
        S = None
        # ... with a list of adapters: those before the last merge into the served base, as
        # generate --adapter_name_or_path A,B gives; with other --adapter ones beside it, refused
        ad0 = sc.make_adapter(os.path.join(tmp, "lf_lora0"), cfg, 2, ["dense", "dense_4h_to_h"], seed=5)
        lst = ad0 + "," + ad
        want = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "10", "--adapter_name_or_path", lst)
        alone = sc.generate(model, "你好", "--do_sample", "false", "--max_new_tokens", "10", "--adapter", ad)
        S = sc.Server(model, "--adapter_name_or_path", lst, "--served_model_name", "mine")
        st, body = sc.http(S.port, "POST", "/v1/chat/completions", dict(model="mine", messages=[{"role": "user", "content": "你好"}],
                                                                        temperature=0, max_tokens=10))
        got = body["choices"][0]["message"]["content"] if st == 200 else body
        T.check("lf_api_adapter_list_merges_before_the_last", st == 200 and got == want and want != alone,
                "%r vs %r (the last alone %r)" % (got, want, alone))
        rc = S.stop()
        S = None
        p = subprocess.run([sc.GLM, "serve", "--model_name_or_path", model, "--adapter_name_or_path", lst, "--adapter",
                            "x=" + ad0, "--port", "0", "--device", "cpu"], capture_output=True, text=True, timeout=120)
        T.check("lf_api_adapter_list_with_other_adapters_refused", rc == 0 and p.returncode != 0 and
                "--adapter serves others" in p.stderr, p.stderr[-300:])
    finally:
        if S and S.p.poll() is None:
            S.stop(9)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(T.status())
