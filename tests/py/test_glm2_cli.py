#!/usr/bin/env python3
"""`glmtrain` end to end on a tiny ChatGLM2-family model (ChatGLM2-6B's config.json keys,
2 key/value groups) on CPU ranks:
  - full fine-tuning: the loss falls; 2 ranks x micro-batch 4 equal 1 rank x 8 (ZeRO 0 and 1,
    losses within 1e-6 relative over 10 steps), and so do 2 and 3 pipeline stages;
  - the saved folder holds THUDM's tensor names and a ChatGLM2 config.json, and the PyTorch
    reference (tests/py/glm2_ref.py) on those weights gives the greedy tokens `glmtrain
    generate` gives;
  - LoRA: peft's adapter files with ChatGLM2's module names, `generate --adapter` equal to
    `generate` on the `merge`d folder;
  - P-Tuning v2: the loss falls, the prefix is saved in THUDM's layout, and `generate --adapter`
    (the prefix in front of the k|v cache) gives the reference's greedy tokens.
The tokenizer is test_train.py's (ChatGLM-6B layout) for these: what the model family changes is
the model, not the data layer. Then ChatGLM3 end to end: its tokenizer (trained with spm_train
in the real file's layout), finetune_demo's conversation records, and `generate --prompt`
building build_chat_input's role-token prompt (with --system: a <|system|> turn first).
Prints PASS/FAIL/SKIP lines."""
import json, os, shutil, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T
from mpi_runs import ENV, GLM, losses, probe, rel, report, run
from test_generate import debug_ids


def write_glm2_config(d, ids, vocab):
    cfg = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "padded_vocab_size": vocab,
           "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "kv_channels": 8,
           "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 48,
           "layernorm_epsilon": 1e-5, "rmsnorm": True, "add_qkv_bias": True, "add_bias_linear": False,
           "apply_residual_connection_post_layernorm": False, "post_layer_norm": True, "original_rope": True,
           "seq_length": 256, "tie_word_embeddings": False, "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]}
    path = os.path.join(d, "config.json")
    json.dump(cfg, open(path, "w"))
    return path


def greedy_ref(cfg, params, prompt, eos, past=None, n=8):
    """The reference's greedy decode of up to n tokens (the whole sequence each step; with a
    P-Tuning prefix as every layer's past, positions from 0 for the tokens)."""
    import torch
    import glm2_ref
    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            kw = {"position_ids": torch.arange(len(seq)).unsqueeze(0), "past_key_values": past} if past else {}
            nxt = int(glm2_ref.forward(cfg, params, torch.tensor([seq]), **kw)["logits"][0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
            seq.append(nxt)
    return out


def gen(args):
    """Greedy generate of one prompt with --debug: (prompt ids, response ids)."""
    p = subprocess.run([GLM, "generate", "--do_sample", "false", "--debug", "--max_new_tokens", "8"] + args,
                       capture_output=True, text=True, timeout=120, env=ENV)
    if p.returncode != 0:
        raise RuntimeError("generate failed: " + (p.stdout + p.stderr)[-2000:])
    got = {}
    for line in p.stderr.splitlines():
        for what in ("prompt", "response"):
            tag = "[debug] %s ids (row 0):" % what
            if line.startswith(tag):
                got[what] = [int(x) for x in line[len(tag):].split()]
    return got.get("prompt"), got.get("response")


def main():
    why = T.parallel_missing()
    if why:
        print("SKIP glm2_cli: " + why)
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-glm2-")
    try:
        tok = T.make_tokenizer(d)
        ids, vocab = T.piece_ids(tok)
        cfg = write_glm2_config(d, ids, vocab)
        train_file, _ = T.write_data(d)
        base = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--learning_rate", "1e-2",
                "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7", "--max_source_length", "32",
                "--max_target_length", "16", "--disable_tqdm", "--report_to", "none", "--max_steps", "10",
                "--save_steps", "10"]
        # 1. full fine-tuning, 1 rank x 8
        ref = os.path.join(d, "full")
        run(base + ["--output_dir", ref, "--per_device_train_batch_size", "8"], timeout=300)
        lr = losses(ref, 10)
        report("glm2_full_loss_falls", len(lr) == 10 and lr[10] < lr[1], "loss %.4f -> %.4f" % (lr[1], lr[10]))
        # 2. data parallel on 2 CPU ranks
        if probe(base + ["--output_dir", os.path.join(d, "probe"), "--max_steps", "1", "--save_strategy", "no"],
                 "glm2_dp", "2-rank probe"):
            for zero in (0, 1):
                out = os.path.join(d, "dp-z%d" % zero)
                run(base + ["--output_dir", out, "--per_device_train_batch_size", "4", "--zero_stage", str(zero)], np=2,
                    timeout=300)
                err, n = rel(losses(out, 10), lr)
                report("glm2_dp_2ranks_zero%d_matches_1rank" % zero, n == 10 and err < 1e-6,
                       "max relative loss difference %.2e over %d steps" % (err, n))
            # pipeline parallelism: 2 stages (1 layer each), then THUDM-style 3 stages
            for name, np_, extra in (("p2", 2, ["--pipeline_parallel_size", "2"]),
                                     ("p3_thudm", 3, ["--pipeline_parallel_size", "3", "--device_map", "thudm"])):
                out = os.path.join(d, name)
                run(base + extra + ["--output_dir", out, "--per_device_train_batch_size", "8"], np=np_, timeout=300)
                err, n = rel(losses(out, 10), lr)
                report("glm2_pipeline_%s_matches_single_process" % name, n == 10 and err < 1e-6,
                       "max relative loss difference %.2e over %d steps" % (err, n))
        # 3. the saved folder: THUDM's names, ChatGLM2's config, greedy tokens as the reference's
        from safetensors.torch import load_file
        import torch
        import glm2_ref
        files = [f for f in os.listdir(ref) if f.endswith(".safetensors")]
        st = {}
        for f in files:
            st.update(load_file(os.path.join(ref, f)))
        saved = json.load(open(os.path.join(ref, "config.json")))
        names_ok = ("transformer.encoder.layers.1.self_attention.query_key_value.weight" in st and
                    "transformer.output_layer.weight" in st and "transformer.embedding.word_embeddings.weight" in st and
                    saved.get("multi_query_group_num") == 2 and saved.get("padded_vocab_size") == vocab)
        report("glm2_saved_folder_thudm_names", names_ok, "%d tensors, config keys %s" % (len(st), sorted(saved)[:6]))
        q = ["--prompt", "写一句关于春的诗", "--tokenizer_name", tok]
        prompt_ids, got = gen(["--model_name_or_path", ref] + q)
        rc = glm2_ref.load_config(saved)
        params = {k: v.float() for k, v in st.items() if "inv_freq" not in k}
        want = greedy_ref(rc, params, prompt_ids, ids["<eop>"])
        report("glm2_generate_equals_reference", got == want, "glmtrain %s, reference %s" % (got, want))
        # the same weights as THUDM ships them: fp16 pytorch_model-0000N-of-00002.bin shards with
        # an index and the rotary buffer, no safetensors
        th = os.path.join(d, "thudm")
        os.makedirs(th)
        shutil.copy(os.path.join(ref, "config.json"), th)
        names = list(st)
        half = len(names) // 2
        wmap = {}
        for k, part in enumerate((names[:half], names[half:])):
            fn = "pytorch_model-%05d-of-00002.bin" % (k + 1)
            sd = {n: st[n].half() for n in part}
            if k == 0:
                sd["transformer.rotary_pos_emb.inv_freq"] = torch.ones(2)
            torch.save(sd, os.path.join(th, fn))
            wmap.update({n: fn for n in sd})
        json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(th, "pytorch_model.bin.index.json"), "w"))
        got_th = gen(["--model_name_or_path", th] + q)[1]
        want16 = greedy_ref(rc, {k: v.half().float() for k, v in params.items()}, prompt_ids, ids["<eop>"])
        report("glm2_loads_thudm_bin_shards", got_th == want16, "glmtrain %s, reference on the fp16 weights %s" % (got_th, want16))
        # 3b. quantized: `quantize` writes THUDM's int4 layout, which loads and decodes as the fp16
        # folder quantized as it loads; info plans a LoRA run on it
        q4 = os.path.join(d, "q4")
        p = subprocess.run([GLM, "quantize", "--model_name_or_path", ref, "--quantization_bit", "4", "--output_dir", q4],
                           capture_output=True, text=True, timeout=120, env=ENV)
        a4 = gen(["--model_name_or_path", q4] + q)[1] if p.returncode == 0 else None
        b4 = gen(["--model_name_or_path", ref, "--quantization_bit", "4"] + q)[1]
        report("glm2_int4_folder_equals_quantized_on_load", a4 is not None and a4 == b4,
               "quantize rc %d; int4 folder %s, --quantization_bit 4 %s" % (p.returncode, a4, b4))
        p = subprocess.run([GLM, "info", "--model_name_or_path", ref, "--finetuning_type", "lora", "--quantization_bit", "4"],
                           capture_output=True, text=True, timeout=60, env=ENV)
        report("glm2_info_plans_lora_on_int4", p.returncode == 0 and "total" in p.stdout, p.stdout.strip()[-160:])
        # 4. LoRA: peft files, generate --adapter == generate on the merged folder
        lo = os.path.join(d, "lora")
        run(base + ["--output_dir", lo, "--per_device_train_batch_size", "8", "--finetuning_type", "lora",
                    "--lora_target", "all", "--lora_rank", "4", "--learning_rate", "5e-2"], timeout=300)
        ac = json.load(open(os.path.join(lo, "adapter_config.json")))
        ad = load_file(os.path.join(lo, "adapter_model.safetensors"))
        key = "base_model.model.transformer.encoder.layers.0.self_attention.query_key_value.lora_A.weight"
        report("glm2_lora_peft_files", key in ad and ac.get("r") == 4, "%d adapter tensors, target_modules %s" %
               (len(ad), ac.get("target_modules")))
        merged = os.path.join(d, "merged")
        p = subprocess.run([GLM, "merge", "--model_name_or_path", ref, "--adapter", lo, "--output_dir", merged,
                            "--dtype", "float32"], capture_output=True, text=True, timeout=120, env=ENV)
        if p.returncode != 0:
            report("glm2_lora_merge", False, (p.stdout + p.stderr)[-600:])
        else:
            a = gen(["--model_name_or_path", ref, "--adapter", lo] + q)[1]
            b = gen(["--model_name_or_path", merged] + q)[1]
            report("glm2_lora_adapter_equals_merged", a == b and a is not None, "adapter %s merged %s" % (a, b))
        # LoRA with peft's modules_to_save on ChatGLM2's untied embedding and output_layer: the folder
        # names them, generate with it equals generate on its merge, and the same folder naming
        # the embedding's module as peft also may (transformer.embedding) reads the same
        lw = os.path.join(d, "lora_whole")
        run(base + ["--output_dir", lw, "--per_device_train_batch_size", "8", "--finetuning_type", "lora", "--lora_rank", "4",
                    "--additional_target", "word_embeddings,output_layer", "--learning_rate", "5e-2"], timeout=300)
        ac = json.load(open(os.path.join(lw, "adapter_config.json")))
        mw = os.path.join(d, "merged_whole")
        p = subprocess.run([GLM, "merge", "--model_name_or_path", ref, "--adapter", lw, "--output_dir", mw,
                            "--dtype", "float32"], capture_output=True, text=True, timeout=120, env=ENV)
        alias = os.path.join(d, "lora_whole_alias")
        shutil.copytree(lw, alias)
        json.dump(dict(ac, modules_to_save=["embedding", "output_layer"]), open(os.path.join(alias, "adapter_config.json"), "w"))
        a = gen(["--model_name_or_path", ref, "--adapter", lw] + q)[1]
        b = gen(["--model_name_or_path", mw] + q)[1] if p.returncode == 0 else None
        c = gen(["--model_name_or_path", ref, "--adapter", alias] + q)[1]
        report("glm2_lora_modules_to_save_equals_merged", ac.get("modules_to_save") == ["word_embeddings", "output_layer"]
               and a is not None and a == b == c, "modules_to_save %s; adapter %s, merged %s, named as transformer.embedding "
               "%s %s" % (ac.get("modules_to_save"), a, b, c, p.stderr[-200:]))
        # PiSSA on this family (the SwiGLU's merged dense_h_to_4h split as one weight, as peft's):
        # its folder, its converted form and its merge generate the same
        lp_ = os.path.join(d, "pissa")
        run(base + ["--output_dir", lp_, "--per_device_train_batch_size", "8", "--finetuning_type", "lora", "--lora_rank", "4",
                    "--lora_target", "all", "--lora_dropout", "0", "--pissa_init", "--pissa_convert", "--learning_rate", "5e-2"],
            timeout=300)
        mp = os.path.join(d, "merged_pissa")
        p = subprocess.run([GLM, "merge", "--model_name_or_path", ref, "--adapter", lp_, "--output_dir", mp, "--dtype", "float32"],
                           capture_output=True, text=True, timeout=120, env=ENV)
        a = gen(["--model_name_or_path", ref, "--adapter", lp_] + q)[1]
        b = gen(["--model_name_or_path", ref, "--adapter", os.path.join(lp_, "pissa_converted")] + q)[1]
        c = gen(["--model_name_or_path", mp] + q)[1] if p.returncode == 0 else None
        report("glm2_pissa_folder_equals_converted_and_merged", a is not None and a == b == c and a != got,
               "PiSSA %s, converted %s, merged %s (base alone %s) %s" % (a, b, c, got, p.stderr[-200:]))
        # 5. P-Tuning v2 on this family: trains; generate --adapter (the prefix in the k|v cache)
        # gives the reference's greedy tokens with the saved prefix as every layer's past
        pt = os.path.join(d, "pt")
        run(base + ["--output_dir", pt, "--per_device_train_batch_size", "8", "--finetuning_type", "ptuning",
                    "--pre_seq_len", "4", "--learning_rate", "5e-2", "--model_name_or_path", ref], timeout=300)
        lp = losses(pt, 10)
        report("glm2_ptuning_loss_falls", len(lp) == 10 and lp[10] < lp[1], "loss %.4f -> %.4f" % (lp[1], lp[10]))
        pfiles = sorted(f for f in os.listdir(pt) if f.endswith((".safetensors", ".bin")))
        enc = {}
        for f in pfiles:
            if f.endswith(".safetensors"):
                enc.update(load_file(os.path.join(pt, f)))
            else:
                enc.update(torch.load(os.path.join(pt, f), map_location="cpu"))
        emb = enc.get("transformer.prefix_encoder.embedding.weight")
        report("glm2_ptuning_saved_prefix", emb is not None and tuple(emb.shape) == (4, 2 * 2 * 2 * 8),
               "files %s, embedding %s" % (pfiles, None if emb is None else tuple(emb.shape)))
        if emb is not None:
            # a prefix large enough to steer greedy decoding (a 10-step one barely moves it): the
            # same folder with a random embedding
            from safetensors.torch import save_file
            emb = 3.0 * torch.randn(emb.shape, generator=torch.Generator().manual_seed(5))
            for f in pfiles:
                os.remove(os.path.join(pt, f))
            save_file({"transformer.prefix_encoder.embedding.weight": emb.contiguous()}, os.path.join(pt, "model.safetensors"))
            pids, got_pt = gen(["--model_name_or_path", ref, "--adapter", pt] + q)
            kv = emb.float().view(4, 4, 2, 8)
            past = tuple((kv[:, 2 * l].unsqueeze(1), kv[:, 2 * l + 1].unsqueeze(1)) for l in range(2))
            want_pt = greedy_ref(rc, params, pids, ids["<eop>"], past)
            # the prefix must matter for this to prove anything: the base alone answers otherwise
            report("glm2_ptuning_generate_equals_reference", got_pt == want_pt and got_pt is not None and got_pt != got,
                   "glmtrain %s, reference %s (base alone %s)" % (got_pt, want_pt, got))
            batched_ptuning("glm2", ref, pt, tok, d)
        # 6. ChatGLM3 end to end: its tokenizer (spm_train in the real file's layout), conversation
        # records in finetune_demo's format, the role-token prompt of build_chat_input
        chatglm3(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


def batched_ptuning(name, base, adapter, tok, d):
    """P-Tuning prompts of different lengths generated together (left padding, each row's prefix
    right before its first real token) give what each gives alone."""
    recs = [{"instruction": q, "output": ""} for q in ("写一句关于春的诗", "风", "明月几时有，把酒问青天，不知天上宫阙")]
    data = os.path.join(d, name + "-prompts.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    outs = {}
    for bs in (1, 3):
        out = os.path.join(d, "%s-pred-b%d.jsonl" % (name, bs))
        p = subprocess.run([GLM, "generate", "--model_name_or_path", base, "--adapter", adapter, "--tokenizer_name", tok,
                            "--input_file", data, "--output_file", out, "--per_device_eval_batch_size", str(bs),
                            "--do_sample", "false", "--max_new_tokens", "6", "--debug"], capture_output=True, text=True,
                           timeout=120, env=ENV)
        rows = {}
        for ln in p.stderr.splitlines():
            if ln.startswith("[debug] response ids (row "):
                head, ids_ = ln[len("[debug] response ids (row "):].split("):", 1)
                rows[int(head)] = [int(x) for x in ids_.split()]
        outs[bs] = [rows.get(i) for i in range(len(recs))] if p.returncode == 0 else (p.stdout + p.stderr)[-400:]
    report("%s_ptuning_batched_generation_equals_one_at_a_time" % name, isinstance(outs[3], list) and outs[1] == outs[3]
           and all(outs[1]), "batch 1 %s, batch 3 %s" % (outs[1], outs[3]))


def chatglm3(d):
    import chatglm23_tok_ref as R
    import tokenizer_corpus as tc
    model = R.train_model(d, tc.corpus(seed=2023))
    ref3 = R.ChatGLM3Tokenizer(model)
    tok = R.write_folder(os.path.join(d, "chatglm3-tok"), model, R.CONFIG_V3)
    vocab = (ref3.vocab_size + 63) // 64 * 64
    cfg = write_glm2_config(d, {"<eop>": ref3.eos_token_id, "<pad>": 0}, vocab)
    recs = []
    for i in range(32):
        conv = [{"role": "user", "content": "你好 %d" % i}, {"role": "assistant", "content": "你好，我是助手 %d。" % i}]
        if i % 4 == 0:
            conv = [{"role": "system", "content": "You are a helpful assistant."}] + conv
        recs.append({"conversations": conv})
    data = os.path.join(d, "conv.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    out = os.path.join(d, "glm3")
    run(["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", data, "--learning_rate", "1e-2",
         "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7", "--max_source_length", "32",
         "--max_target_length", "32", "--disable_tqdm", "--report_to", "none", "--max_steps", "10", "--save_steps", "10",
         "--output_dir", out, "--per_device_train_batch_size", "8"], timeout=300)
    l3 = losses(out, 10)
    report("glm3_conversations_train", len(l3) == 10 and l3[10] < l3[1], "loss %.4f -> %.4f" % (l3[1], l3[10]))
    pids, _ = gen(["--model_name_or_path", out, "--tokenizer_name", tok, "--prompt", "你好"])
    want = list(ref3.build_chat_input("你好"))
    report("glm3_generate_prompt_is_build_chat_input", pids == want, "glmtrain %s, reference %s" % (pids, want))
    pids, _ = gen(["--model_name_or_path", out, "--tokenizer_name", tok, "--prompt", "你好", "--system", "Be brief."])
    want = list(ref3.build_chat_input("你好", history=[{"role": "system", "content": "Be brief."}]))
    report("glm3_generate_system_turn", pids == want, "glmtrain %s, reference %s" % (pids, want))
    # evaluation on conversations: a prompt per assistant turn, as finetune_hf.py's process_batch_eval
    evals = [{"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"},
                                {"role": "assistant", "content": "你好，我是助手。"}, {"role": "user", "content": "再见"},
                                {"role": "assistant", "content": "再见！"}]},
             {"conversations": [{"role": "user", "content": "北京天气"}, {"role": "assistant", "content": "查询中"},
                                {"role": "observation", "content": "晴 20 度"}, {"role": "assistant", "content": "晴，20 度。"}]},
             {"conversations": [{"role": "user", "content": "没有回答"}]}]
    edata = os.path.join(d, "eval.jsonl")
    with open(edata, "w", encoding="utf-8") as f:
        for r in evals:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    for cut in (0, 12):
        want = []
        for i, r in enumerate(evals):
            ids = list(ref3.get_prefix_tokens())
            for k, m in enumerate(r["conversations"]):
                if cut and len(ids) >= cut:
                    break
                new = ref3.build_single_message(m["role"], "", m["content"])
                if m["role"] == "assistant":
                    want.append((i, k, (ids[:cut] if cut else ids) + new[:1], m["content"]))
                ids += new
        flags = ["--max_source_length", str(cut)] if cut else []
        p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--tokenizer_name", tok, "--input_file", edata,
                            "--do_sample", "false", "--max_new_tokens", "4", "--debug", "--per_device_eval_batch_size", "2"]
                           + flags, capture_output=True, text=True, timeout=120, env=ENV)
        rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        pids = debug_ids(p.stderr, "prompt")
        got = [(r["index"], r["turn"], pids.get(j), r.get("labels")) for j, r in enumerate(rows)]
        report("glm3_eval_prompts_are_process_batch_eval%s" % ("_cut" if cut else ""), p.returncode == 0 and got == want,
               "glmtrain %s, reference %s %s" % (got, want, p.stderr[-300:]))


if __name__ == "__main__":
    sys.exit(main())
