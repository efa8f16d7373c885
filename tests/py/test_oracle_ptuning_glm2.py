#!/usr/bin/env python3
"""The data-driven oracle program on a ChatGLM2 P-Tuning v2 file in the layout the oracle README
gives (the prefix key/value cache, float16 [num_layers*2, multi_query_group_num, P, kv_channels],
then glm2_model.data's items): a file made here from glm2_model.data's weights and inputs with a
random prefix, its outputs computed by the PyTorch reference (tests/py/glm2_ref.py, itself
checked against THUDM's oracle) with that prefix as every layer's past keys/values, the
positions 0..2, 3, 4 of the tokens and the prefix visible to every query (ChatGLM2's
get_masks with a past). `test_oracle --family chatglm2 --pre_seq_len 5 FILE` must PASS on it
and FAIL on a copy whose prefix is perturbed. SKIPs without torch or the shared oracle."""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    try:
        import torch
        import glm2_ref
        import test_glm2_ref_oracle as R
    except ImportError as e:
        print("SKIP oracle_ptuning_glm2: %s" % e)
        return 0
    src = R.find_oracle()
    tool = os.path.join(os.environ.get("GLM_BUILD", "build"), "tests", "test_oracle")
    if not src or not os.access(tool, os.X_OK):
        print("SKIP oracle_ptuning_glm2: glm2_model.data or %s not found" % tool)
        return 0
    cfg, params, data = R.load_oracle(src, glm2_ref)
    P, L, G, KC = 5, 1, 2, 4
    g = torch.Generator().manual_seed(11)
    cache = (torch.rand((2 * L, G, P, KC), generator=g) - 0.5).half()  # the file's float16 cache
    kv = cache.float()
    past = tuple((kv[2 * l].permute(1, 0, 2).unsqueeze(1), kv[2 * l + 1].permute(1, 0, 2).unsqueeze(1)) for l in range(L))
    outs = []
    o = glm2_ref.forward(cfg, params, data["x1"].view(1, 3), position_ids=torch.tensor([[0, 1, 2]]),
                         past_key_values=past, use_cache=True)
    outs.append(o["hidden"][0])
    for key, pos in (("x2", 3), ("x3", 4)):
        o = glm2_ref.forward(cfg, params, data[key].view(1, 1), position_ids=torch.tensor([[pos]]),
                             past_key_values=o["presents"], use_cache=True)
        outs.append(o["hidden"][0, 0])
    with open(src, "rb") as f:
        raw = f.read()
    n_w = sum(t.numel() for k, t in params.items() if k != "transformer.output_layer.weight")
    head = raw[:4 * n_w]
    d = tempfile.mkdtemp(prefix="oracle_pt2_")
    failures = 0
    for name, cc in (("good", cache), ("perturbed", (cache.float() + 0.05).half())):
        body = cc.numpy().tobytes() + head
        for key, y in (("x1", outs[0]), ("x2", outs[1]), ("x3", outs[2])):
            body += struct.pack("<%di" % data[key].numel(), *data[key].tolist())
            body += struct.pack("<%df" % y.numel(), *y.reshape(-1).tolist())
        path = os.path.join(d, "glm2_ptuning_%s.data" % name)
        with open(path, "wb") as f:
            f.write(body)
        p = subprocess.run([tool, "--family", "chatglm2", "--pre_seq_len", str(P), path], capture_output=True, text=True,
                           timeout=60)
        passed = "\nPASS " in "\n" + p.stdout and p.returncode == 0
        want = name == "good"
        ok = passed == want
        failures += not ok
        line = [l for l in p.stdout.splitlines() if "max abs error" in l]
        print("%s oracle_ptuning_glm2_%s_file_%s (%s)" % ("PASS" if ok else "FAIL", name, "passes" if want else "fails",
                                                          line[0].strip() if line else p.stdout.strip()[-200:]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
