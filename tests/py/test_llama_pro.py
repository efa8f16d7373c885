#!/usr/bin/env python3
"""LLaMA Pro (`glmtrain expand`, `train --use_llama_pro`; model/expand.h) on a tiny ChatGLM2-family
model of 4 layers:
- expand --num_expand 2 writes 6 layers as LLaMA-Factory's scripts/llama_pro.py lays them out (a
  copy of layer i after every num_layers / num_expand layers), re-implemented here with ChatGLM2's
  own output projections zeroed (self_attention.dense, mlp.dense_4h_to_h: llama_pro.py's o_proj and
  down_proj), every tensor equal to that layout's; config.json says 6 layers and keeps every other
  key; the reference model (glm2_ref) gives the expanded folder the original's logits (within 1e-6:
  the attention's layer-number scaling rounds differently for moved layers), and `generate` the
  same tokens;
- train --finetuning_type freeze --use_llama_pro --freeze_trainable_layers 2 updates exactly the
  layers LLaMA-Factory's rule names (stride num_layers // N, range(stride - 1, num_layers + stride - 1,
  stride): 2 and 5, the added ones), with --freeze_trainable_modules mlp only their MLPs, the loss
  falling;
- refused by name: expanding a ChatGLM-6B (GLM v1) model, a --num_expand that does not divide the
  layers, --use_llama_pro with a count that does not divide them, and with full fine-tuning (LoRA on
  the added blocks: tests/py/test_lora_layers.py).
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
import test_lora_cli as T_lora  # noqa: E402
from test_glm2_cli import gen, write_glm2_config  # noqa: E402
from test_lora_cli import check  # noqa: E402  (its PASS/FAIL printer, counting failures)



def glm(args):
    return subprocess.run([T.GLM] + args, capture_output=True, text=True, timeout=300)


def load_dir(d):
    from safetensors.torch import load_file
    out = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def llama_pro_layout(state, num_layers, num_expand):
    """scripts/llama_pro.py's loop over a state dict, with ChatGLM2's names for o_proj / down_proj."""
    import torch
    split = num_layers // num_expand
    out, cnt = {}, 0
    for k, v in state.items():
        if ".layers." not in k:
            out[k] = v
    for i in range(num_layers):
        for k, v in state.items():
            if ".%d." % i in k:
                out[k.replace(".%d." % i, ".%d." % cnt)] = v
        cnt += 1
        if (i + 1) % split == 0:
            for k, v in state.items():
                if ".%d." % i in k:
                    zero = "self_attention.dense" in k or "mlp.dense_4h_to_h" in k
                    out[k.replace(".%d." % i, ".%d." % cnt)] = torch.zeros_like(v) if zero else v.clone()
            cnt += 1
    return out


def trainable_layers(num_layers, n):
    """LLaMA-Factory's _setup_freeze_tuning with use_llama_pro."""
    stride = num_layers // n
    return list(range(stride - 1, num_layers + stride - 1, stride))


def main():
    if not os.path.exists(T.GLM):
        print("SKIP llama_pro_all: %s not built" % T.GLM)
        return 0
    if not shutil.which("spm_train"):
        print("SKIP llama_pro_all: spm_train (Debian sentencepiece) not installed")
        return 0
    import torch
    import glm2_ref
    from safetensors.torch import save_file
    d = tempfile.mkdtemp(prefix="glm-llama-pro-")
    try:
        tok = T.make_tokenizer(d)
        ids, vocab = T.piece_ids(tok)
        cfg_path = write_glm2_config(d, ids, vocab)
        raw = json.load(open(cfg_path))
        raw["num_layers"] = 4
        raw["an_unrelated_key"] = 1e-05
        base = os.path.join(d, "base")
        os.makedirs(base)
        json.dump(raw, open(os.path.join(base, "config.json"), "w"))
        cfg = glm2_ref.load_config(raw)
        params = glm2_ref.init_params(cfg, seed=3, std=0.2)
        save_file({k: v.contiguous() for k, v in params.items()}, os.path.join(base, "model.safetensors"))
        train_file, _ = T.write_data(d)

        # 1. the expansion
        exp = os.path.join(d, "expanded")
        p = glm(["expand", "--model_name_or_path", base, "--output_dir", exp, "--num_expand", "2", "--dtype", "float32"])
        if not check("expand_runs", p.returncode == 0, p.stderr[-600:]):
            return 1
        econf = json.load(open(os.path.join(exp, "config.json")))
        check("expand_config_says_6_layers", econf.get("num_layers") == 6 and econf.get("an_unrelated_key") == 1e-05 and
              econf.get("multi_query_group_num") == 2, str(econf))
        got = {k: v for k, v in load_dir(exp).items() if "inv_freq" not in k}
        want = llama_pro_layout(params, 4, 2)
        bad = [k for k in want if k not in got or not torch.equal(got[k], want[k])]
        check("expand_layout_is_llama_pro_py", not bad and sorted(got) == sorted(want), "%s; extra %s" % (bad[:4], set(got) - set(want)))
        ecfg = glm2_ref.load_config(econf)
        x = torch.tensor([[ids["[gMASK]"], ids["<sop>"]] + list(range(10, 40))])
        with torch.no_grad():
            l0 = glm2_ref.forward(cfg, params, x)["logits"]
            l1 = glm2_ref.forward(ecfg, got, x)["logits"]
        # not bit for bit: ChatGLM2's attention scales the scores by 1 / layer_number and back in float
        # (apply_query_key_layer_scaling), and the original layers' numbers move
        err = float((l0 - l1).abs().max() / l0.abs().max())
        check("expanded_model_computes_the_original", err < 1e-6, "relative %.3g" % err)
        q = ["--prompt", "写一句关于春的诗", "--tokenizer_name", tok]
        try:
            _, a = gen(["--model_name_or_path", base] + q)
            _, b = gen(["--model_name_or_path", exp] + q)
            check("expanded_model_generates_the_same_tokens", a == b and a, "%s vs %s" % (a, b))
        except RuntimeError as e:
            check("expanded_model_generates_the_same_tokens", False, str(e)[-400:])

        # 2. training the added blocks alone
        common = ["train", "--model_name_or_path", exp, "--tokenizer_name", tok, "--train_file", train_file,
                  "--finetuning_type", "freeze", "--use_llama_pro", "--freeze_trainable_layers", "2", "--learning_rate", "1e-2",
                  "--max_steps", "6", "--per_device_train_batch_size", "8", "--logging_steps", "1", "--disable_tqdm",
                  "--report_to", "none", "--max_source_length", "32", "--max_target_length", "16", "--seed", "3",
                  "--save_strategy", "no"]
        for name, extra, module in (("all", [], ""), ("mlp", ["--freeze_trainable_modules", "mlp"], ".mlp.")):
            out = os.path.join(d, "pro_" + name)
            r = glm(common + ["--output_dir", out] + extra)
            if not check("llama_pro_train_%s_runs" % name, r.returncode == 0, r.stderr[-600:]):
                continue
            after = load_dir(out)
            layers = trainable_layers(6, 2)
            moved = sorted(k for k in got if not torch.equal(after[k], got[k]))
            should = sorted(k for k in got if any(".layers.%d.%s" % (l, module.strip(".")) in k if module else ".layers.%d." % l in k
                                                  for l in layers))
            check("llama_pro_%s_trains_layers_%s" % (name, "_".join(map(str, layers))), moved == should,
                  "moved %s, LLaMA-Factory's rule %s" % (moved, should))
            losses = [json.loads(l.replace("'", '"'))["loss"] for l in r.stderr.splitlines() if l.startswith("{'loss'")]
            check("llama_pro_%s_loss_falls" % name, len(losses) == 6 and losses[-1] < losses[0], str(losses))
            check("llama_pro_%s_says_what_trains" % name, "LLaMA Pro's added layers 2, 5" in r.stderr,
                  [l for l in r.stderr.splitlines() if "freeze:" in l])

        # 3. refusals
        v1 = os.path.join(d, "v1")
        os.makedirs(v1)
        shutil.copy(T.write_config(d, ids, vocab), os.path.join(v1, "config.json"))
        mk = glm(["train", "--init_from_config", os.path.join(v1, "config.json"), "--tokenizer_name", tok, "--train_file",
                  train_file, "--output_dir", os.path.join(d, "v1out"), "--max_steps", "1", "--learning_rate", "0",
                  "--disable_tqdm", "--report_to", "none", "--save_strategy", "no", "--max_source_length", "16",
                  "--max_target_length", "8"])
        r = glm(["expand", "--model_name_or_path", os.path.join(d, "v1out"), "--output_dir", os.path.join(d, "v1x"), "--num_expand", "1"])
        check("expand_glm_v1_refused", mk.returncode == 0 and r.returncode != 0 and "GLM v1" in r.stderr and "sqrt(2" in r.stderr,
              (mk.stderr + r.stderr)[-300:])
        r = glm(["expand", "--model_name_or_path", base, "--output_dir", os.path.join(d, "x3"), "--num_expand", "3"])
        check("expand_num_not_dividing_refused", r.returncode != 0 and "must divide" in r.stderr, r.stderr[-300:])
        for name, extra, want_text in (("count", ["--freeze_trainable_layers", "4"], "must divide"),
                                       ("full", ["--finetuning_type", "full"], "--use_llama_pro with --finetuning_type full")):
            r = glm(common + ["--output_dir", os.path.join(d, "r_" + name)] + extra)
            check("llama_pro_refused_" + name, r.returncode != 0 and want_text in r.stderr, r.stderr[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 1 if T_lora.fails else 0


if __name__ == "__main__":
    sys.exit(main())
