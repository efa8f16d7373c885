"""What the `glmtrain serve` tests share (tests/py/test_serve*.py): the tiny model folder with its
SentencePiece tokenizer (as tests/py/test_generate.py builds it), LoRA adapter folders in peft's
format, and a server process started on a free port whose stderr is kept."""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("GLM_BUILD", "build")
GLM = os.path.join(BUILD, "glmtrain")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def make_model(tmp):
    """A 2-layer random GLM (hidden 32) with a ChatGLM-style tokenizer; returns (folder, cfg, params)."""
    import glm_ref
    from test_generate import make_tokenizer
    tok, ids, vocab = make_tokenizer(tmp)
    cfg = glm_ref.load_config({"vocab_size": vocab, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4,
                               "inner_hidden_size": 64, "tie_word_embeddings": False, "max_sequence_length": 256,
                               "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"],
                               "bos_token_id": ids["<sop>"], "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]})
    params = glm_ref.init_params(cfg, seed=2, std=0.5)  # untied, no near-ties (test_generate.py)
    glm_ref.save_model_dir(tok, cfg, params)
    return tok, cfg, params


def make_adapter(path, cfg, r, targets, seed, alpha=16.0):
    """A peft-format LoRA folder (adapter_config.json + adapter_model.safetensors) with B != 0."""
    import glm_ref
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    ad = glm_ref.init_lora(cfg, r, targets, seed=seed, std_a=0.5, std_b=0.5)
    save_file({"base_model.model." + k: v.contiguous() for k, v in ad.items()},
              os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
                   "target_modules": list(targets), "task_type": "CAUSAL_LM"}, f)
    return path


def make_ptuning(path, cfg, pre_seq_len, seed):
    """A THUDM-layout P-Tuning v2 checkpoint without projection: config.json with pre_seq_len and
    model.safetensors holding transformer.prefix_encoder.embedding.weight [P, 2 * layers * hidden]."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(pre_seq_len, 2 * cfg["num_layers"] * cfg["hidden_size"], generator=g)
    save_file({"transformer.prefix_encoder.embedding.weight": emb}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "chatglm", "pre_seq_len": pre_seq_len, "prefix_projection": False}, f)
    return path


def generate(model, prompt, *flags):
    """`glmtrain generate --prompt` (stdout without its final newline)."""
    p = subprocess.run([GLM, "generate", "--model_name_or_path", model, "--prompt", prompt, "--device", "cpu"] + list(flags),
                       capture_output=True, text=True, errors="replace", timeout=120, env=ENV)
    if p.returncode != 0:
        raise RuntimeError("generate failed: " + p.stderr[-500:])
    return p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout


class Server:
    """`glmtrain serve` on a free port of 127.0.0.1; stderr is collected in self.log."""

    def __init__(self, model, *flags, timeout=60):
        self.p = subprocess.Popen([GLM, "serve", "--model_name_or_path", model, "--port", "0", "--device", "cpu"] + list(flags),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace", env=ENV)
        self.log, self.port = [], None
        end = time.time() + timeout
        for line in self.p.stderr:
            self.log.append(line)
            if "serving " in line and "http://" in line:
                self.port = int(line.rsplit(":", 1)[1].split("/")[0])
                break
            if time.time() > end:
                break
        if self.port is None:
            self.p.kill()
            raise RuntimeError("serve did not start: " + "".join(self.log)[-1500:])
        self.t = threading.Thread(target=self._drain, daemon=True)
        self.t.start()
        self.base = "http://127.0.0.1:%d" % self.port

    def _drain(self):
        for line in self.p.stderr:
            self.log.append(line)

    def client(self, key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=60, **kw)

    def stop(self, sig=15, timeout=30):
        """SIGTERM (default); returns the exit status (None if it did not exit in time)."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
        finally:
            self.t.join(timeout=5)

    def text(self):
        return "".join(self.log)


def http(port, method, path, body=None, headers=None, timeout=30):
    """A raw request (http.client): (status, parsed JSON or text)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def prompt_ids(server, before, wait=10.0):
    """The prompt ids serve logged (--debug) for the first request after log line `before`. A thread
    reads serve's stderr, so the line may land a moment after the answer: it is waited for."""
    t0 = time.time()
    while True:
        for line in server.log[before:]:
            if "serve: prompt ids: " in line:
                return [int(x) for x in line.split("serve: prompt ids: ")[1].split()]
        if time.time() - t0 > wait:
            return None
        time.sleep(0.05)


def logged(server, text, wait=10.0):
    """Whether serve's stderr holds text, waiting for it (a thread reads the log, so a line can land
    a moment after the answer it belongs to)."""
    t0 = time.time()
    while text not in server.text():
        if time.time() - t0 > wait:
            return False
        time.sleep(0.05)
    return True
