#!/usr/bin/env python3
"""LoRA through the command line: `generate --adapter` and `merge` against a PyTorch reference
of the merged weights (W + scaling * B A), a LoRA training run's files (peft's names, small
checkpoints), and the errors users of peft/LLaMA-Factory hit (unknown --lora_target, an adapter
for another base, merging a P-Tuning checkpoint). Prints PASS/FAIL/SKIP lines (tests/run.sh)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_generate import GLM, PENALTY, debug_ids, make_tokenizer, tiny_config, torch_greedy  # noqa: E402

fails = 0


def check(name, cond, why=""):
    global fails
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
    fails += 0 if cond else 1
    return cond


def run(args):
    return subprocess.run([GLM] + args, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


MODULES = {"query_key_value": "attention.query_key_value", "dense": "attention.dense",
           "dense_h_to_4h": "mlp.dense_h_to_4h", "dense_4h_to_h": "mlp.dense_4h_to_h"}


def tiny_poem_run(tmp, skip_name):
    """What the optimizer tests' command-line cases start from: a tiny ChatGLM-6B-shaped model with a
    trained SentencePiece tokenizer (std 0.3 weights, seed 4) and 16 instruction rows; (model folder,
    config, params, data file), or None after printing the SKIP line when glmtrain or spm_train is
    missing."""
    import glm_ref
    if not os.path.exists(GLM):
        print("SKIP %s: %s not built" % (skip_name, GLM))
        return None
    if not shutil.which("spm_train"):
        print("SKIP %s: spm_train (Debian sentencepiece) not installed" % skip_name)
        return None
    tok, ids, vocab = make_tokenizer(tmp)
    cfg = tiny_config(ids, vocab)
    params = glm_ref.init_params(cfg, seed=4, std=0.3)
    glm_ref.save_model_dir(tok, cfg, params)
    data = os.path.join(tmp, "train.json")
    json.dump([{"instruction": "写一句关于%s的诗" % w, "output": w * 3} for w in ["春", "风", "山", "水"] * 4],
              open(data, "w"), ensure_ascii=False)
    return tok, cfg, params, data


def write_adapter(path, cfg, targets, r, alpha, seed, rslora=False):
    """A peft-format adapter folder with random A and B (B non-zero, so it changes the model)."""
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    os.makedirs(path, exist_ok=True)
    H, F = cfg["hidden_size"], cfg["inner_hidden_size"]
    dims = {"query_key_value": (H, 3 * H), "dense": (H, H), "dense_h_to_4h": (H, F), "dense_4h_to_h": (F, H)}
    tensors = {}
    for l in range(cfg["num_layers"]):
        for t in targets:
            i, o = dims[t]
            name = "base_model.model.transformer.layers.%d.%s" % (l, MODULES[t])
            tensors[name + ".lora_A.weight"] = torch.randn(r, i, generator=g) * 0.3
            tensors[name + ".lora_B.weight"] = torch.randn(o, r, generator=g) * 0.3
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
            "target_modules": targets, "bias": "none", "fan_in_fan_out": False, "inference_mode": True}
    if rslora:
        conf["use_rslora"] = True
    json.dump(conf, open(os.path.join(path, "adapter_config.json"), "w"))
    return tensors


def merged_params(params, adapter, cfg, targets, r, alpha, rslora=False):
    s = alpha / (r ** 0.5) if rslora else alpha / r
    out = {k: v.clone() for k, v in params.items()}
    for l in range(cfg["num_layers"]):
        for t in targets:
            name = "transformer.layers.%d.%s" % (l, MODULES[t])
            a, b = adapter["base_model.model." + name + ".lora_A.weight"], adapter["base_model.model." + name + ".lora_B.weight"]
            out[name + ".weight"] = out[name + ".weight"] + s * (b.double() @ a.double()).float()
    return out


def greedy(model, prompt, extra=()):
    p = run(["generate", "--model_name_or_path", model, "--prompt", prompt, "--do_sample", "false",
             "--repetition_penalty", str(PENALTY), "--max_new_tokens", "12", "--debug"] + list(extra))
    return p, debug_ids(p.stderr, "prompt").get(0), debug_ids(p.stderr, "response").get(0)


def main():
    import torch
    import glm_ref
    if not os.path.exists(GLM):
        print("SKIP lora_cli_all: %s not built" % GLM)
        return 0
    if not shutil.which("spm_train"):
        print("SKIP lora_cli_all: spm_train (Debian sentencepiece) not installed")
        return 0
    tmp = tempfile.mkdtemp(prefix="glm-lora-")
    try:
        tok, ids, vocab = make_tokenizer(tmp)
        cfg = tiny_config(ids, vocab)
        params = glm_ref.init_params(cfg, seed=2, std=0.5)
        glm_ref.save_model_dir(tok, cfg, params)
        base = tok
        prompt = "写一首关于春天的诗"

        # 1. generate --adapter: the model with the adapter's branch equals the merged reference
        made = {}
        for case, targets, r, alpha, rslora in [("qkv", ["query_key_value"], 4, 8, False),
                                                ("all_rslora", list(MODULES), 2, 4, True)]:
            ad = os.path.join(tmp, "adapter_" + case)
            adapter = write_adapter(ad, cfg, targets, r, alpha, seed=len(case), rslora=rslora)
            made[case] = (ad, adapter, targets, r, alpha, rslora)
            ref = merged_params(params, adapter, cfg, targets, r, alpha, rslora)
            p, pin, pout = greedy(base, prompt, ["--adapter", ad])
            ok = p.returncode == 0 and pin is not None and pout is not None
            want, gap = torch_greedy(cfg, ref, pin, 12) if ok else (None, 0)
            base_want, _ = torch_greedy(cfg, params, pin, 12) if ok else (None, 0)
            check("adapter_%s_generate_equals_merged_reference" % case, ok and pout == want and gap > 1e-4,
                  "rc %d: C %s vs torch %s (gap %.2g) %s" % (p.returncode, pout, want, gap, p.stderr[-600:]))
            check("adapter_%s_changes_the_model" % case, ok and want != base_want, "the adapter left the greedy tokens as the base's")

            # 2. merge: the written weights equal W + s B A; the merged folder generates the same
            out = os.path.join(tmp, "merged_" + case)
            p = run(["merge", "--model_name_or_path", base, "--adapter", ad, "--output_dir", out, "--dtype", "float32"])
            if check("merge_%s_runs" % case, p.returncode == 0, p.stderr[-600:]):
                from safetensors.torch import load_file
                got = load_file(os.path.join(out, "model.safetensors"))
                worst = max(float((got[k] - v).abs().max() / v.abs().max()) for k, v in ref.items())
                check("merge_%s_weights_equal_reference" % case, worst < 1e-6, "max rel diff %.3g" % worst)
                cfg_out = json.load(open(os.path.join(out, "config.json")))
                check("merge_%s_config_of_base" % case, cfg_out.get("hidden_size") == 32 and cfg_out.get("torch_dtype") == "float32",
                      str(cfg_out))
                p2, _, mout = greedy(out, prompt)
                check("merge_%s_generates_as_adapter" % case, p2.returncode == 0 and mout == pout, "merged %s vs adapter %s" % (mout, pout))
                if case == "qkv":  # LLaMA-Factory's merge config (examples/merge_lora) through --config: the same files
                    yml = os.path.join(tmp, "merge_lora.yaml")
                    lf = os.path.join(tmp, "merged_lf")
                    open(yml, "w").write("model_name_or_path: %s\nadapter_name_or_path: %s\ntemplate: chatglm\nfinetuning_type: lora\n"
                                         "export_dir: %s\nexport_size: 2\nexport_device: cpu\nexport_legacy_format: false\n"
                                         % (base, ad, lf))
                    p3 = run(["merge", "--config", yml, "--dtype", "float32"])
                    same = p3.returncode == 0 and all(
                        open(os.path.join(out, f), "rb").read() == open(os.path.join(lf, f), "rb").read()
                        for f in ("model.safetensors", "config.json"))
                    check("merge_llama_factory_export_config_same_files", same, p3.stderr[-400:])
                    p3 = run(["merge", "--model_name_or_path", base, "--adapter_name_or_path", ad, "--export_dir",
                              os.path.join(tmp, "m_bin"), "--export_legacy_format", "true"])
                    check("merge_legacy_format_refused", p3.returncode != 0 and "safetensors" in p3.stderr, p3.stderr[-300:])

        # 3. errors users hit
        p = run(["train", "--model_name_or_path", base, "--train_file", "x.json", "--output_dir", os.path.join(tmp, "e"),
                 "--finetuning_type", "lora", "--lora_target", "q_proj,v_proj"])
        check("unknown_lora_target_lists_modules", p.returncode != 0 and "q_proj" in p.stderr and "dense_h_to_4h" in p.stderr,
              p.stderr[-400:])
        bad = os.path.join(tmp, "adapter_badrank")
        write_adapter(bad, cfg, ["query_key_value"], 4, 8, seed=9)
        conf = json.load(open(os.path.join(bad, "adapter_config.json")))
        conf["r"] = 8  # the tensors have r = 4: an adapter made for another setup
        json.dump(conf, open(os.path.join(bad, "adapter_config.json"), "w"))
        p, _, _ = greedy(base, prompt, ["--adapter", bad])
        check("adapter_shape_mismatch_names_tensor", p.returncode != 0 and "lora_A.weight" in p.stderr and "[4, 32]" in p.stderr,
              p.stderr[-400:])
        # peft's adapter_config.json keys that change what peft computes: target_modules as a regular
        # expression or dotted suffixes (read, the same adapter as the list's), and what glmtrain does
        # not apply (refused, naming the key or tensor, instead of loading an adapter that computes
        # otherwise than peft's): modules_to_save copies, DoRA, LoRA biases, some layers only,
        # per-module ranks or alphas, a tensor of another kind beside the LoRA ones
        qkv = os.path.join(tmp, "adapter_qkv")
        _, _, qkv_out = greedy(base, prompt, ["--adapter", qkv])
        pt_dir = os.path.join(tmp, "ptuning_small")  # a P-Tuning v2 checkpoint's config (its prefix is never read)
        os.makedirs(pt_dir)
        json.dump({"model_type": "chatglm", "pre_seq_len": 4, "prefix_projection": False},
                  open(os.path.join(pt_dir, "config.json"), "w"))
        from safetensors.torch import load_file as st_load, save_file as st_save

        def variant(name, conf_edit, extra_tensors=None):
            d = os.path.join(tmp, "adapter_v_" + name)
            shutil.copytree(qkv, d)
            conf = json.load(open(os.path.join(d, "adapter_config.json")))
            conf.update(conf_edit)
            json.dump(conf, open(os.path.join(d, "adapter_config.json"), "w"))
            if extra_tensors:
                t = st_load(os.path.join(d, "adapter_model.safetensors"))
                t.update(extra_tensors)
                st_save(t, os.path.join(d, "adapter_model.safetensors"))
            return greedy(base, prompt, ["--adapter", d])
        for name, edit in [("regex", {"target_modules": ".*query_key_value"}),
                           ("dotted", {"target_modules": ["attention.query_key_value"]}),
                           ("absent", {"target_modules": None})]:
            p, _, out = variant(name, edit)
            check("adapter_target_modules_%s_same_as_list" % name, p.returncode == 0 and out == qkv_out and out is not None,
                  "rc %d: %s vs %s %s" % (p.returncode, out, qkv_out, p.stderr[-300:]))
        head = {"base_model.model.lm_head.weight": torch.zeros(vocab, 32)}
        mag = {"base_model.model.transformer.layers.%d.attention.query_key_value.lora_magnitude_vector" % l: torch.ones(96)
               for l in range(2)}
        for name, edit, extra, want in [
                ("modules_to_save_in_layers", {"modules_to_save": ["mlp"]}, None, "modules_to_save"),
                ("extra_tensor", {}, head, "base_model.model.lm_head.weight"),
                ("layer_module_tensor", {}, {"base_model.model.transformer.layers.0.mlp.dense_h_to_4h.weight":
                                             torch.zeros(128, 32)}, "whole module's weights"),
                ("dora_without_magnitudes", {"use_dora": True}, None, "lora_magnitude_vector"),
                ("dora_tensors_only", {}, mag, "DoRA"),
                ("lora_bias", {"lora_bias": True}, None, "lora_bias"),
                ("layers_to_transform_not_the_tensors", {"layers_to_transform": [1]}, None, "names other layers"),
                ("rank_pattern", {"rank_pattern": {"layers.0.attention.query_key_value": 4}}, None, "rank_pattern"),
                ("alpha_pattern", {"alpha_pattern": {"query_key_value": 32}}, None, "alpha_pattern"),
                ("fan_in_fan_out", {"fan_in_fan_out": True}, None, "fan_in_fan_out"),
                ("layer_replication", {"layer_replication": [[0, 2], [1, 2]]}, None, "layer_replication"),
                ("trainable_token_indices", {"trainable_token_indices": [5, 6]}, None, "trainable_token_indices"),
                ("one_layer_target_not_the_tensors", {"target_modules": ["layers.0.attention.query_key_value"]}, None,
                 "names other layers"),
                ("targets_differ", {"target_modules": ["query_key_value", "dense"]}, None, "tensors adapt query_key_value")]:
            p, _, _ = variant(name, edit, extra)
            check("adapter_%s_refused" % name, p.returncode != 0 and want in p.stderr and "adapter" in p.stderr, p.stderr[-400:])
        # LLaMA-Factory's list of adapters: those before the last merged into the base as it loads,
        # the last applied beside it; against the reference of the two merges in turn
        (a1, t1, *s1), (a2, t2, *s2) = [(made[k][0], made[k][1], made[k][2], made[k][3], made[k][4], made[k][5])
                                        for k in ("qkv", "all_rslora")]
        stack = merged_params(merged_params(params, t1, cfg, *s1), t2, cfg, *s2)
        lst = a1 + "," + a2
        p, pin, l_out = greedy(base, prompt, ["--adapter_name_or_path", lst])
        ok = p.returncode == 0 and pin is not None and l_out is not None
        want, gap = torch_greedy(cfg, stack, pin, 12) if ok else (None, 0)
        _, _, last_alone = greedy(base, prompt, ["--adapter", a2])
        check("adapter_list_generate_equals_merges_in_turn", ok and l_out == want and gap > 1e-4 and l_out != last_alone and
              "merged into the base: " + a1 in p.stderr, "rc %d: C %s vs torch %s (gap %.2g), last alone %s %s" %
              (p.returncode, l_out, want, gap, last_alone, p.stderr[-400:]))
        p, _, out = greedy(base, prompt, ["--adapter_name_or_path", " %s , %s " % (a1, a2)])  # LLaMA-Factory strips the names
        check("adapter_list_names_stripped", p.returncode == 0 and out == l_out, "%s vs %s %s" % (out, l_out, p.stderr[-300:]))
        p, _, out = greedy(os.path.join(tmp, "merged_qkv"), prompt, ["--adapter", a2])
        check("adapter_list_equals_merged_folder_with_the_last", p.returncode == 0 and out == l_out, "%s vs %s" % (out, l_out))
        p, _, out = greedy(base, prompt, ["--adapter_name_or_path", lst, "--device_map", "auto", "--pipeline_parallel_size", "2",
                                          "--device", "cpu"])
        check("adapter_list_device_map_stages_merge_too", p.returncode == 0 and out == l_out, "%s vs %s %s" %
              (out, l_out, p.stderr[-300:]))
        p, _, q_list = greedy(base, prompt, ["--adapter_name_or_path", lst, "--quantization_bit", "8"])
        p2, _, q_folder = greedy(os.path.join(tmp, "merged_qkv"), prompt, ["--adapter", a2, "--quantization_bit", "8"])
        check("adapter_list_merges_before_quantizing", p.returncode == 0 and p2.returncode == 0 and q_list == q_folder and
              q_list is not None, "%s vs %s %s" % (q_list, q_folder, (p.stderr + p2.stderr)[-300:]))
        out = os.path.join(tmp, "merged_list")
        p = run(["merge", "--model_name_or_path", base, "--adapter_name_or_path", lst, "--output_dir", out, "--dtype", "float32"])
        worst = 1.0
        if p.returncode == 0:
            from safetensors.torch import load_file
            got = load_file(os.path.join(out, "model.safetensors"))
            worst = max(float((got[k] - v).abs().max() / v.abs().max()) for k, v in stack.items())
        check("merge_adapter_list_equals_merges_in_turn", worst < 1e-6, "max rel diff %.3g %s" % (worst, p.stderr[-300:]))
        for name, flags, msgs in (
                ("empty_item", ["--adapter_name_or_path", a1 + ",," + a2], ["an empty name in the list"]),
                ("missing_item", ["--adapter_name_or_path", a1 + "," + os.path.join(tmp, "nowhere")], ["nowhere"]),
                ("ptuning_merged", ["--adapter_name_or_path", pt_dir + "," + a2], ["cannot be merged"])):
            p, _, _ = greedy(base, prompt, flags)
            check("adapter_list_%s_refused" % name, p.returncode != 0 and all(m in p.stderr for m in msgs) and
                  "loaded" not in p.stderr, p.stderr[-300:])
        # LLaMA-Factory's inference configs name the dtype infer_dtype
        p, _, out = greedy(base, prompt, ["--adapter_name_or_path", lst, "--infer_dtype", "float32"])
        p2, _, _ = greedy(base, prompt, ["--dtype", "float16", "--infer_dtype", "bfloat16"])
        check("infer_dtype_is_dtype", p.returncode == 0 and out == l_out and p2.returncode != 0 and "disagree" in p2.stderr,
              (p.stderr + p2.stderr)[-300:])
        # an adapter_config.json with more after its object (two objects, an editor's junk) is refused
        # naming file:line:col, as Python's json.load (peft's reader) refuses it
        d = os.path.join(tmp, "adapter_v_junk")
        shutil.copytree(qkv, d)
        open(os.path.join(d, "adapter_config.json"), "a").write('\n{"r": 64}\n')
        p, _, _ = greedy(base, prompt, ["--adapter", d])
        check("adapter_config_two_objects_refused", p.returncode != 0 and "adapter_config.json:" in p.stderr
              and "more after the JSON value ended" in p.stderr, p.stderr[-400:])
        p = run(["merge", "--model_name_or_path", base, "--adapter", os.path.join(tmp, "adapter_v_modules_to_save_in_layers"),
                 "--output_dir", os.path.join(tmp, "m_mts")])
        check("merge_modules_to_save_in_layers_refused", p.returncode != 0 and "modules_to_save" in p.stderr and
              not os.path.exists(os.path.join(tmp, "m_mts", "model.safetensors")), p.stderr[-400:])
        # peft's modules_to_save (LLaMA-Factory's additional_target) of the untied head: the adapter's
        # whole copy replaces the base's head in generate, and merge writes it
        g = torch.Generator().manual_seed(5)
        head_copy = params["lm_head.weight"] + 0.5 * torch.randn(params["lm_head.weight"].shape, generator=g)
        p, _, mts_out = variant("modules_to_save", {"modules_to_save": ["lm_head"]}, {"base_model.model.lm_head.weight": head_copy})
        mts = os.path.join(tmp, "adapter_v_modules_to_save")
        p2 = run(["merge", "--model_name_or_path", base, "--adapter", mts, "--output_dir", os.path.join(tmp, "m_mts2"),
                  "--dtype", "float32"])
        merged = st_load(os.path.join(tmp, "m_mts2", "model.safetensors")) if p2.returncode == 0 else {}
        p3, _, m_out = greedy(os.path.join(tmp, "m_mts2"), prompt) if p2.returncode == 0 else (p2, None, None)
        check("adapter_modules_to_save_head_generates_as_merged", p.returncode == 0 and mts_out is not None and
              mts_out == m_out and mts_out != qkv_out and torch.equal(merged.get("lm_head.weight", torch.zeros(1)), head_copy),
              "adapter %s, merged %s, without the head copy %s; %s" % (mts_out, m_out, qkv_out, (p.stderr + p2.stderr)[-300:]))
        pt = os.path.join(tmp, "ptuning_ckpt")
        os.makedirs(pt)
        json.dump({"model_type": "chatglm", "pre_seq_len": 128, "prefix_projection": False}, open(os.path.join(pt, "config.json"), "w"))
        p = run(["merge", "--model_name_or_path", base, "--adapter", pt, "--output_dir", os.path.join(tmp, "mp")])
        check("merge_ptuning_refused", p.returncode != 0 and "cannot be merged" in p.stderr, p.stderr[-400:])
        for n in (1e9, 2.5):  # refused before anything is allocated for it (1e9 planned 477 GiB of prefix)
            json.dump({"model_type": "chatglm", "pre_seq_len": n}, open(os.path.join(pt, "config.json"), "w"))
            p, _, _ = greedy(base, prompt, ["--adapter", pt])
            check("ptuning_pre_seq_len_%g_refused" % n, p.returncode != 0 and "is not a P-Tuning v2 prefix length" in p.stderr
                  and "memory" not in p.stderr, p.stderr[-300:])

        # 4. a LoRA training run: peft's files at the end, checkpoints of adapter size
        data = os.path.join(tmp, "train.json")
        json.dump([{"instruction": "写一句关于%s的诗" % w, "output": w * 3} for w in ["春", "风", "山", "水"] * 4],
                  open(data, "w"), ensure_ascii=False)
        out = os.path.join(tmp, "lora_run")
        p = run(["train", "--model_name_or_path", base, "--train_file", data, "--output_dir", out, "--finetuning_type", "lora",
                 "--lora_rank", "4", "--lora_target", "query_key_value,dense_4h_to_h", "--max_steps", "4", "--save_steps", "2",
                 "--learning_rate", "1e-2", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--disable_tqdm",
                 "--report_to", "none", "--max_source_length", "32", "--max_target_length", "16"])
        if check("lora_train_runs", p.returncode == 0, p.stderr[-800:]):
            files = set(os.listdir(out))
            check("lora_train_writes_peft_files", {"adapter_config.json", "adapter_model.safetensors"} <= files and
                  "model.safetensors" not in files, str(sorted(files)))
            conf = json.load(open(os.path.join(out, "adapter_config.json")))
            check("lora_adapter_config", conf.get("r") == 4 and conf.get("lora_alpha") == 8 and conf.get("peft_type") == "LORA"
                  and sorted(conf.get("target_modules", [])) == ["dense_4h_to_h", "query_key_value"], str(conf))
            from safetensors import safe_open
            with safe_open(os.path.join(out, "adapter_model.safetensors"), "pt") as f:
                names = sorted(f.keys())
            want = sorted("base_model.model.transformer.layers.%d.%s.lora_%s.weight" % (l, MODULES[m], ab)
                          for l in range(2) for m in ["query_key_value", "dense_4h_to_h"] for ab in "AB")
            check("lora_adapter_tensor_names", names == want, "%s" % names[:4])
            ck = os.path.join(out, "checkpoint-4")
            size = sum(os.path.getsize(os.path.join(ck, n)) for n in os.listdir(ck) if n != "ice_text.model")
            base_size = os.path.getsize(os.path.join(base, "model.safetensors"))
            check("lora_checkpoint_holds_only_adapter", "model.safetensors" not in os.listdir(ck) and size < base_size,
                  "%s, %d bytes vs base %d" % (sorted(os.listdir(ck)), size, base_size))
            p2, _, _ = greedy(base, prompt, ["--adapter", out])
            check("lora_trained_adapter_loads", p2.returncode == 0, p2.stderr[-400:])
            # resuming it as another kind of run, or another rank: refused before anything loads, naming both
            for name, extra, want in [("full", ["--finetuning_type", "full"], "this run trains model weights (full fine-tuning)"),
                                      ("rank", ["--finetuning_type", "lora", "--lora_rank", "8"], "this run trains a LoRA adapter (r 8"),
                                      ("ptuning", ["--pre_seq_len", "4"], "this run trains a P-Tuning v2 prefix (pre_seq_len 4"),
                                      ("freeze", ["--finetuning_type", "freeze", "--num_layer_trainable", "1"],
                                       "this run trains layer 1 (all modules) (freeze fine-tuning)")]:
                q = run(["train", "--model_name_or_path", base, "--train_file", data, "--output_dir", out, "--max_steps", "6",
                         "--per_device_train_batch_size", "4", "--report_to", "none", "--disable_tqdm", "--max_source_length", "32",
                         "--max_target_length", "16", "--lora_target", "query_key_value,dense_4h_to_h",
                         "--resume_from_checkpoint"] + extra)
                check("lora_checkpoint_resumed_as_%s_refused" % name, q.returncode != 0 and
                      "checkpoint-4 holds a LoRA adapter (r 4 on query_key_value,dense_4h_to_h)" in q.stderr and want in q.stderr,
                      q.stderr[-400:])

        # 4b. LoRA+ (--loraplus_lr_ratio): the same run with lora_B at 16x the rate trains
        # otherwise; the host's AdamW (--offload_optimizer cpu) applies the ratio as the device's;
        # without LoRA, or with the 8-bit moments (blocks across A and B), it is refused
        lp = ["train", "--model_name_or_path", base, "--train_file", data, "--finetuning_type", "lora", "--lora_rank", "4",
              "--max_steps", "3", "--learning_rate", "1e-3", "--per_device_train_batch_size", "4", "--logging_steps", "1",
              "--disable_tqdm", "--report_to", "none", "--max_source_length", "32", "--max_target_length", "16",
              "--save_strategy", "no", "--lora_dropout", "0"]
        from safetensors.torch import load_file

        def lp_run(name, extra):
            o = os.path.join(tmp, name)
            q = run(lp + ["--output_dir", o] + extra)
            return q, (load_file(os.path.join(o, "adapter_model.safetensors")) if q.returncode == 0 else None)
        p0, a0 = lp_run("lp0", ["--do_predict", "--test_file", data, "--max_predict_samples", "3"])
        # --do_predict after a LoRA run answers with the base and the adapter it wrote
        lines = open(os.path.join(tmp, "lp0", "generated_predictions.txt"), encoding="utf-8").read().splitlines() \
            if p0.returncode == 0 and os.path.exists(os.path.join(tmp, "lp0", "generated_predictions.txt")) else []
        check("lora_do_predict_uses_base_and_adapter", len(lines) == 3 and ("%s + %s" % (base, os.path.join(tmp, "lp0"))) in p0.stderr
              and os.path.exists(os.path.join(tmp, "lp0", "predict_results.json")), p0.stderr[-500:])
        p1, a1 = lp_run("lp16", ["--loraplus_lr_ratio", "16"])
        p2, a2 = lp_run("lp16off", ["--loraplus_lr_ratio", "16", "--offload_optimizer", "cpu"])
        ok = a0 is not None and a1 is not None and a2 is not None
        # from B = 0 a step moves each element of B by about the rate: 16x the rate, 16x the move
        ratio = 0.0
        if ok:
            bs = [k for k in a0 if "lora_B" in k]
            ratio = sum(float(a1[k].abs().sum()) for k in bs) / max(sum(float(a0[k].abs().sum()) for k in bs), 1e-30)
        check("loraplus_moves_lora_B_faster", ok and 8 < ratio < 20 and "LoRA+" in p1.stderr,
              "sum |B| with LoRA+ / without %.2f; %s" % (ratio, (p0.stderr + p1.stderr)[-400:]))
        check("loraplus_offload_equals_device", ok and all(torch.equal(a1[k], a2[k]) for k in a1), p2.stderr[-300:])
        for name, extra, needle in (("full", ["--finetuning_type", "full"], "--finetuning_type lora"),
                                    ("adamw8", ["--optim", "adamw_8bit"], "adamw_torch")):
            q, _ = lp_run("lpbad_" + name, ["--loraplus_lr_ratio", "16"] + extra)
            check("loraplus_refused_with_" + name, q.returncode != 0 and "--loraplus_lr_ratio" in q.stderr and needle in q.stderr,
                  q.stderr[-300:])

        # 5. P-Tuning v2 through train: THUDM's layout (config.json with pre_seq_len, only the
        # prefix encoder's tensors), checkpoints loadable with --adapter, merge refused
        out = os.path.join(tmp, "ptuning_run")
        common = ["--model_name_or_path", base, "--train_file", data, "--max_steps", "4", "--save_steps", "2",
                  "--learning_rate", "1e-2", "--per_device_train_batch_size", "4", "--disable_tqdm", "--report_to", "none",
                  "--max_source_length", "32", "--max_target_length", "16"]
        p = run(["train", "--output_dir", out, "--pre_seq_len", "4", "--prefix_projection"] + common)
        if check("ptuning_train_runs", p.returncode == 0, p.stderr[-800:]):
            conf = json.load(open(os.path.join(out, "config.json")))
            check("ptuning_config_has_pre_seq_len", conf.get("pre_seq_len") == 4 and conf.get("prefix_projection") is True
                  and conf.get("hidden_size") == 32, str(conf))
            from safetensors import safe_open
            with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
                names = sorted(f.keys())
            check("ptuning_saves_only_prefix_encoder", names == ["transformer.prefix_encoder.embedding.weight",
                  "transformer.prefix_encoder.trans.0.bias", "transformer.prefix_encoder.trans.0.weight",
                  "transformer.prefix_encoder.trans.2.bias", "transformer.prefix_encoder.trans.2.weight"], str(names))
            import torch
            from safetensors.torch import load_file
            sd, st = torch.load(os.path.join(out, "pytorch_model.bin")), load_file(os.path.join(out, "model.safetensors"))
            check("ptuning_pytorch_model_bin_loads_in_torch", sorted(sd) == sorted(st) and all(torch.equal(sd[k], st[k]) for k in st),
                  "torch.load keys %s" % sorted(sd))
            thudm = os.path.join(tmp, "thudm_ptuning_ckpt")  # THUDM's checkpoint layout: config.json + pytorch_model.bin
            os.makedirs(thudm)
            for n in ["config.json", "pytorch_model.bin"]:
                shutil.copy(os.path.join(out, n), thudm)
            _, _, want_out = greedy(base, prompt, ["--adapter", out])
            for d in [out, os.path.join(out, "checkpoint-4"), thudm]:
                p2, _, pout = greedy(base, prompt, ["--adapter", d])
                check("ptuning_generate_adapter_%s" % os.path.basename(d), p2.returncode == 0 and pout == want_out and
                      "P-Tuning v2 prefix" in p2.stderr, "%s vs %s: %s" % (pout, want_out, p2.stderr[-400:]))
            p2 = run(["merge", "--model_name_or_path", base, "--adapter", out, "--output_dir", os.path.join(tmp, "mp2")])
            check("ptuning_merge_refused", p2.returncode != 0 and "cannot be merged" in p2.stderr, p2.stderr[-300:])
        # resuming it with another pre_seq_len / prefix_projection names both settings
        longer = [("6" if i and common[i - 1] == "--max_steps" else x) for i, x in enumerate(common)]
        p2 = run(["train", "--output_dir", out, "--pre_seq_len", "6"] + longer + ["--resume_from_checkpoint"]) \
            if os.path.isdir(out) else None
        check("ptuning_resume_other_pre_seq_len_named", p2 is not None and p2.returncode != 0 and
              "holds a P-Tuning v2 prefix (pre_seq_len 4, prefix_projection true); this run trains a P-Tuning v2 prefix "
              "(pre_seq_len 6, prefix_projection false)" in p2.stderr,
              p2.stderr[-500:] if p2 else "no P-Tuning run")
        p = run(["train", "--output_dir", os.path.join(tmp, "pp"), "--pre_seq_len", "4", "--packing"] + common)
        check("ptuning_packing_refused", p.returncode != 0 and "--packing" in p.stderr, p.stderr[-300:])
        p = run(["train", "--output_dir", os.path.join(tmp, "pl"), "--pre_seq_len", "4", "--finetuning_type", "lora"] + common)
        check("ptuning_with_lora_refused", p.returncode != 0 and "pre_seq_len" in p.stderr, p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
