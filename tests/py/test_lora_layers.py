#!/usr/bin/env python3
"""LoRA on some layers only: peft's layers_to_transform, and LLaMA-Factory's LoRA with
--use_llama_pro (its find_expanded_modules: adapters on the added blocks alone), on a 4-layer
ChatGLM-6B-shaped model:
- a folder peft 0.6 itself writes (LoraConfig layers_to_transform [1, 3], layers_pattern "layers"):
  `glmtrain generate --adapter` gives glm_ref's greedy tokens with those adapters (which differ
  from the base's); the same adapter described as LLaMA-Factory writes it (target_modules as a list
  of single layers' modules) reads the same; `serve` swaps it per request beside an adapter on every
  layer, each answering as generate --adapter does;
- train --finetuning_type lora --use_llama_pro --freeze_trainable_layers 2: adapters on layers 1
  and 3 alone, adapter_config.json saying so (layers_to_transform, layers_pattern); peft loads the
  folder onto the stand-in with glm_ref's logits; generate with it equals generate on what
  `glmtrain merge` writes from it; a resume from its checkpoint is exact;
- refused by name: modules on different layers, layers_to_transform that the tensors contradict,
  another layers_pattern.
Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_generate import GLM, PENALTY, make_tokenizer, tiny_config, torch_greedy  # noqa: E402
import test_lora_cli as T_lora  # noqa: E402
from test_lora_cli import check, greedy, run  # noqa: E402

FC1, DENSE = "mlp.dense_h_to_4h", "attention.dense"


def merged(params, adapters, scaling):
    """W += s B A for every adapter row present (some layers only)."""
    out = {k: v.clone() for k, v in params.items()}
    for k, a in adapters.items():
        if k.endswith(".lora_A.weight"):
            stem = k[:-len(".lora_A.weight")]
            b = adapters[stem + ".lora_B.weight"]
            out[stem + ".weight"] = out[stem + ".weight"] + scaling * (b.double() @ a.double()).float()
    return out


def main():
    if not os.path.exists(GLM):
        print("SKIP lora_layers_all: %s not built" % GLM)
        return 0
    if not shutil.which("spm_train"):
        print("SKIP lora_layers_all: spm_train (Debian sentencepiece) not installed")
        return 0
    import torch
    import glm_ref
    from safetensors.torch import load_file, save_file
    from test_lora_ref import peft_missing, save_peft, standin
    tmp = tempfile.mkdtemp(prefix="glm-lora-layers-")
    try:
        tok, ids, vocab = make_tokenizer(tmp)
        cfg = tiny_config(ids, vocab, num_layers=4)
        params = glm_ref.init_params(cfg, seed=5, std=0.3)
        glm_ref.save_model_dir(tok, cfg, params)
        prompt = "写一句关于春的诗"
        _, pids, base_out = greedy(tok, prompt)
        why = peft_missing()
        if why:
            print("SKIP lora_layers_peft: " + why)
        else:
            # 1. a folder peft writes, adapters on layers 1 and 3
            from peft import LoraConfig, get_peft_model
            pm = get_peft_model(standin(cfg, params), LoraConfig(r=4, lora_alpha=8, target_modules=["dense_h_to_4h", "dense"],
                                                                 layers_to_transform=[1, 3], layers_pattern="layers",
                                                                 lora_dropout=0.0, bias="none"))
            g = torch.Generator().manual_seed(3)
            with torch.no_grad():
                for n, p in pm.named_parameters():
                    if ".lora_" in n:
                        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            pdir = os.path.join(tmp, "peft_layers")
            save_peft(pm, pdir, True)
            ad = load_file(os.path.join(pdir, "adapter_model.safetensors"))
            adapters = {k[len("base_model.model."):]: v for k, v in ad.items()}
            layers = sorted({int(k.split(".")[2]) for k in adapters})
            check("peft_wrote_layers_1_3", layers == [1, 3], str(layers))
            want = torch_greedy(cfg, merged(params, adapters, 2.0), pids, 12)[0]
            _, _, got = greedy(tok, prompt, ["--adapter", pdir])
            check("peft_layers_to_transform_generates_as_glm_ref", got == want and got != base_out,
                  "glmtrain %s, glm_ref %s, base %s" % (got, want, base_out))
            # LLaMA-Factory's description of the same adapter: the single layers' modules listed (dense_h_to_4h
            # before dense: one module's name inside another's must not hide it)
            ldir = os.path.join(tmp, "lf_layers")
            shutil.copytree(pdir, ldir)
            conf = json.load(open(os.path.join(ldir, "adapter_config.json")))
            conf.update(layers_to_transform=None, layers_pattern=None,
                        target_modules=["transformer.layers.%d.%s" % (l, m) for l in (1, 3) for m in (FC1, DENSE)])
            json.dump(conf, open(os.path.join(ldir, "adapter_config.json"), "w"))
            _, _, got2 = greedy(tok, prompt, ["--adapter", ldir])
            check("single_layer_target_modules_generate_the_same", got2 == want, "%s vs %s" % (got2, want))
            # served per request beside an adapter on every layer: what generate --adapter gives
            try:
                import openai  # noqa: F401
                import serve_common as sc
                whole = sc.make_adapter(os.path.join(tmp, "whole"), cfg, 4, ["query_key_value"], seed=9)
                srv = sc.Server(tok, "--adapter", "some=" + pdir, "--adapter", "whole=" + whole)
                try:
                    c = srv.client()
                    got_s = {}
                    for name in ("some", "whole", "some"):
                        r = c.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}], temperature=0,
                                                      max_tokens=8)
                        got_s.setdefault(name, []).append(r.choices[0].message.content)
                    want_s = {n: sc.generate(tok, prompt, "--do_sample", "false", "--max_new_tokens", "8", "--adapter", d)
                              for n, d in (("some", pdir), ("whole", whole))}
                    check("serve_some_layers_adapter_equals_generate", all(v == [want_s[n]] * len(v) for n, v in got_s.items()),
                          "%s vs %s" % (got_s, want_s))
                finally:
                    srv.stop()
            except ImportError:
                print("SKIP serve_some_layers_adapter_equals_generate: openai not installed")
            # refusals
            bad = {"different_layers": lambda c, t: [t.pop("base_model.model.transformer.layers.1.%s.lora_%s.weight" % (DENSE, x))
                                                     for x in "AB"],
                   "config_contradicts_tensors": lambda c, t: c.update(layers_to_transform=[1, 2]),
                   "other_layers_pattern": lambda c, t: c.update(layers_pattern="h")}
            texts = {"different_layers": "different layers", "config_contradicts_tensors": "names other layers (",
                     "other_layers_pattern": "layers_pattern"}
            for name, edit in bad.items():
                bdir = os.path.join(tmp, "bad_" + name)
                shutil.copytree(pdir, bdir)
                c = json.load(open(os.path.join(bdir, "adapter_config.json")))
                t = dict(ad)
                edit(c, t)
                json.dump(c, open(os.path.join(bdir, "adapter_config.json"), "w"))
                save_file(t, os.path.join(bdir, "adapter_model.safetensors"))
                r = run(["generate", "--model_name_or_path", tok, "--adapter", bdir, "--prompt", prompt, "--max_new_tokens", "4"])
                check("refused_" + name, r.returncode != 0 and texts[name] in r.stderr, r.stderr[-300:])

        # 2. LLaMA-Factory's LoRA with use_llama_pro: the added blocks alone (every second of 4 here)
        data = os.path.join(tmp, "train.json")
        json.dump([{"instruction": "写一句关于%s的诗" % w, "output": w * 3} for w in ["春", "风", "山", "水"] * 4],
                  open(data, "w"), ensure_ascii=False)
        out = os.path.join(tmp, "lora_pro")
        common = ["train", "--model_name_or_path", tok, "--train_file", data, "--finetuning_type", "lora", "--use_llama_pro",
                  "--freeze_trainable_layers", "2", "--lora_target", "query_key_value,dense_4h_to_h", "--lora_dropout", "0",
                  "--learning_rate", "1e-2", "--max_steps", "4", "--save_steps", "2", "--per_device_train_batch_size", "4",
                  "--logging_steps", "1", "--disable_tqdm", "--report_to", "none", "--max_source_length", "32",
                  "--max_target_length", "16", "--seed", "5", "--output_dir", out]
        p = run(common)
        if not check("lora_llama_pro_trains", p.returncode == 0, p.stderr[-600:]):
            return 1
        conf = json.load(open(os.path.join(out, "adapter_config.json")))
        ad = load_file(os.path.join(out, "adapter_model.safetensors"))
        layers = sorted({int(k.split(".")[4]) for k in ad})
        check("lora_llama_pro_adapters_on_layers_1_3", layers == [1, 3] and conf.get("layers_to_transform") == [1, 3] and
              conf.get("layers_pattern") == "layers", "%s %s" % (layers, conf))
        adapters = {k[len("base_model.model."):]: v for k, v in ad.items()}
        ids_t = torch.tensor([pids])
        with torch.no_grad():
            want_logits = glm_ref.forward(cfg, params, ids_t, lora=(adapters, 2.0))["logits"]
        if not peft_missing():
            from peft import PeftModel
            pm = PeftModel.from_pretrained(standin(cfg, params), out).eval()
            with torch.no_grad():
                pl = pm(input_ids=ids_t, return_dict=True).logits
            e = float((pl - want_logits).abs().max() / want_logits.abs().max())
            check("lora_llama_pro_loads_in_peft", e < 1e-5, "logits rel %.2g" % e)
        mdir = os.path.join(tmp, "lora_pro_merged")
        r = run(["merge", "--model_name_or_path", tok, "--adapter", out, "--output_dir", mdir, "--dtype", "float32"])
        _, _, a = greedy(tok, prompt, ["--adapter", out])
        _, _, b = greedy(mdir, prompt, ["--tokenizer_name", tok])
        check("lora_llama_pro_generate_equals_merged", r.returncode == 0 and a == b and a, "%s vs %s %s" % (a, b, r.stderr[-200:]))
        before = json.load(open(os.path.join(out, "checkpoint-4", "trainer_state.json")))["log_history"]
        rr = run(common + ["--resume_from_checkpoint", os.path.join(out, "checkpoint-2")])
        after = json.load(open(os.path.join(out, "checkpoint-4", "trainer_state.json")))["log_history"]
        check("lora_llama_pro_resume_is_exact", rr.returncode == 0 and
              [h.get("loss") for h in after] == [h.get("loss") for h in before], rr.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if T_lora.fails else 0


if __name__ == "__main__":
    sys.exit(main())
