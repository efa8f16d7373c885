#!/usr/bin/env python3
"""Hostile input on a tiny model (issue 14): a run that turns non-finite stops with an error
naming the step, the learning rate and the last good checkpoint, and never saves NaN; AdamW
flags are range-checked as torch.optim.AdamW does; NaN input weights, NUL characters in data or
chat input, UTF-16 files, too-deep JSON, out-of-range ids, cut-off JSON configs and out-of-range
numbers are refused with a message naming the flag, tensor or file:line. Prints PASS/FAIL/SKIP."""
import json, os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import GLM, make_tokenizer, piece_ids, write_config, write_data, train, skip, results
import test_train


def report(name, ok, detail=""):
    test_train.report(name, ok, "" if ok else detail)  # the stderr tail only when it failed

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(args, stdin=None):
    return subprocess.run([GLM] + args, input=stdin, capture_output=True, timeout=120, env=ENV)


def failed_with(p, *subs):
    """rc != 0 and every substring in stderr; the detail for the report."""
    err = p.stderr.decode("utf-8", "replace") if isinstance(p.stderr, bytes) else p.stderr
    ok = p.returncode != 0 and all(s in err for s in subs)
    return ok, "rc %d, stderr tail: %s" % (p.returncode, err[-600:])


def all_finite_safetensors(path):
    import numpy as np
    from safetensors.numpy import load_file
    return all(np.isfinite(v).all() for v in load_file(path).values())


def optimizer_flags(base, d):
    cases = [("--adam_beta2", "1.5", "--adam_beta2 1.5: invalid beta parameter at index 1"),
             ("--adam_beta1", "-0.5", "--adam_beta1 -0.5: invalid beta parameter at index 0"),
             ("--adam_epsilon", "-1", "--adam_epsilon -1: invalid epsilon value"),
             ("--weight_decay", "-5", "--weight_decay -5: invalid weight_decay value"),
             ("--learning_rate", "-1e-3", "--learning_rate -0.001: invalid learning rate"),
             ("--max_bad_steps", "0", "--max_bad_steps 0: must be at least 1")]
    for flag, v, msg in cases:
        out = os.path.join(d, "opt")
        ok, why = failed_with(train(base + ["--output_dir", out, flag, v], check=False), msg)
        report("optimizer_flag_range%s" % flag.replace("-", "_"), ok and not os.path.exists(os.path.join(out, "model.safetensors")), why)


def tf32_on_cpu(base, d):
    out = os.path.join(d, "tf32")
    p = train(base + ["--output_dir", out, "--tf32", "true", "--device", "cpu"], check=False)
    ok, why = failed_with(p, "--tf32 needs an NVIDIA GPU", "drop --tf32")
    report("tf32_refused_on_cpu", ok and not os.path.exists(os.path.join(out, "model.safetensors")), why)


def determinism_on_cpu(base, d):
    """--full_determinism (Hugging Face's flag) is accepted on the CPU, which always is, and changes no bit."""
    outs = []
    for name, extra in (("plain", []), ("det", ["--full_determinism", "true"])):
        out = os.path.join(d, "fd_" + name)
        p = train(base + ["--output_dir", out, "--device", "cpu"] + extra, check=False)
        outs.append(os.path.join(out, "model.safetensors") if p.returncode == 0 else None)
    same = all(outs) and open(outs[0], "rb").read() == open(outs[1], "rb").read()
    report("full_determinism_accepted_on_cpu", same, "runs: %s" % outs)


def diverging_runs(base, d):
    # a huge learning rate: the loss turns NaN after the first update; bf16/fp32 skip the
    # update, and after --max_bad_steps in a row the run stops naming step, lr and checkpoint
    out = os.path.join(d, "lr1e30")
    p = train(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "1", "--learning_rate", "1e30",
                      "--lr_scheduler_type", "constant", "--max_bad_steps", "2"], check=False)
    ok, why = failed_with(p, "training diverged: at step 3", "not finite for 2 steps in a row", "learning rate 1e+30",
                          "lower --learning_rate", "the last good checkpoint: %s/checkpoint-2" % out)
    report("nan_run_stops_after_max_bad_steps", ok and "step 2: loss nan, grad norm nan" in p.stderr, why)
    cks = sorted(n for n in os.listdir(out) if n.startswith("checkpoint-"))
    report("nan_run_writes_no_final_model", not os.path.exists(os.path.join(out, "model.safetensors"))
           and cks == ["checkpoint-1", "checkpoint-2"], str(sorted(os.listdir(out))))
    report("nan_run_checkpoints_finite", all(all_finite_safetensors(os.path.join(out, c, "model.safetensors")) for c in cks))

    # a learning rate beyond float: the first update makes inf weights; the save is refused
    out = os.path.join(d, "lr1e39")
    p = train(base + ["--output_dir", out, "--max_steps", "2", "--save_steps", "1", "--learning_rate", "1e39"], check=False)
    ok, why = failed_with(p, "not saving a checkpoint at step 1: parameter transformer.", "holds NaN or inf",
                          "last good checkpoint: none")
    report("nonfinite_model_never_saved", ok and not any(n.startswith("checkpoint-") for n in os.listdir(out))
           and not os.path.exists(os.path.join(out, "model.safetensors")), why)
    # the same with the final save only
    out = os.path.join(d, "lr1e39f")
    p = train(base + ["--output_dir", out, "--max_steps", "1", "--save_strategy", "no", "--learning_rate", "1e39"], check=False)
    ok, why = failed_with(p, "not saving the final model at step 1: parameter transformer.")
    report("nonfinite_final_model_never_saved", ok and not os.path.exists(os.path.join(out, "model.safetensors")), why)


def diverging_two_ranks(d, cfg, common):
    """Every rank takes the same decision (from the global loss and norm): both stop at step 3."""
    why = test_train.parallel_missing()
    if why:
        skip("nan_run_two_ranks_agree", why)
        return
    out = os.path.join(d, "dp-nan")
    flags = [a if a != "4" else "2" for a in common]  # 2 rows per rank
    p = train(["--init_from_config", cfg] + flags + ["--output_dir", out, "--max_steps", "6", "--save_steps", "1",
               "--learning_rate", "1e30", "--lr_scheduler_type", "constant", "--max_bad_steps", "2",
               "--nproc_per_node", "2"], check=False)
    stops = [l for l in p.stderr.splitlines() if "training diverged: at step 3" in l]
    report("nan_run_two_ranks_agree", p.returncode != 0 and len(stops) == 2 and "rank 0:" in stops[-1] + stops[0]
           and "rank 1:" in stops[0] + stops[-1] and not os.path.exists(os.path.join(out, "model.safetensors")),
           p.stderr[-800:])


def nan_weight_input(base_model, d, common):
    import numpy as np
    from safetensors.numpy import load_file, save_file
    bad = os.path.join(d, "bad-model")
    shutil.copytree(base_model, bad)
    w = load_file(os.path.join(bad, "model.safetensors"))
    name = "transformer.layers.1.mlp.dense_h_to_4h.weight"
    w[name] = w[name].copy()
    w[name][3, 5] = np.nan
    save_file(w, os.path.join(bad, "model.safetensors"))
    out = os.path.join(d, "from-bad")
    p = train(common + ["--model_name_or_path", bad, "--output_dir", out, "--max_steps", "1"], check=False)
    ok, why = failed_with(p, "tensor %s holds NaN at element %d" % (name, 3 * w[name].shape[1] + 5), bad)
    report("nan_input_weight_refused", ok and not os.path.exists(os.path.join(out, "model.safetensors")), why)
    # a weight float16 cannot hold (1e6) with --save_dtype float16: the final model is written as
    # float32, with a warning naming the tensor, instead of inf (or of being lost)
    big = os.path.join(d, "big-model")
    shutil.copytree(base_model, big)
    w = load_file(os.path.join(big, "model.safetensors"))
    w[name] = w[name].copy()
    w[name][3, 5] = 1e6
    save_file(w, os.path.join(big, "model.safetensors"), metadata={"format": "pt"})
    out = os.path.join(d, "from-big")
    p = train(common + ["--model_name_or_path", big, "--output_dir", out, "--max_steps", "1", "--learning_rate", "1e-9",
                        "--save_strategy", "no", "--save_dtype", "float16"], check=False)
    err = p.stderr.decode("utf-8", "replace") if isinstance(p.stderr, bytes) else p.stderr
    got = load_file(os.path.join(out, "model.safetensors")) if p.returncode == 0 else {}
    report("final_save_past_float16_written_as_float32", p.returncode == 0 and "past float16's range" in err and name in err and
           got.get(name) is not None and got[name].dtype == np.float32 and abs(got[name][3, 5] - 1e6) < 1 and
           '"torch_dtype": "float32"' in open(os.path.join(out, "config.json")).read(), err[-400:])


def data_records(base, d):
    def data_run(name, body, extra=()):
        path = os.path.join(d, name)
        open(path, "wb").write(body)
        return train(base + ["--train_file", path, "--output_dir", os.path.join(d, "out-" + name), "--max_steps", "1",
                             "--save_strategy", "no", "--save_final_model", "false", "--overwrite_output_dir"] + list(extra),
                     check=False)
    good = b"".join(json.dumps({"instruction": "q%d" % i, "output": "a%d" % i}).encode() + b"\n" for i in range(6))
    p = data_run("esc.jsonl", good + b'{"instruction": "x\\u0000y", "output": "z"}\n')
    ok, why = failed_with(p, "esc.jsonl:7:", "\\u0000 (NUL) character", "--skip_bad_samples")
    report("data_nul_escape_refused", ok, why)
    p = data_run("raw.jsonl", good[:40] + b'{"instruction": "x\x00y", "output": "z"}\n' + good)
    ok, why = failed_with(p, "raw.jsonl:", "NUL byte")
    report("data_nul_byte_refused", ok, why)
    # a real "\\u0000" (backslash then u0000 as text) is not a NUL
    p = data_run("text.jsonl", good + b'{"instruction": "x\\\\u0000y", "output": "z"}\n')
    report("data_escaped_backslash_kept", p.returncode == 0, p.stderr[-400:])
    p = data_run("skip.jsonl", good + b'{"instruction": "x\\u0000y", "output": "z"}\n', ["--skip_bad_samples"])
    report("data_nul_skipped_counted", p.returncode == 0 and "1 bad records" in p.stderr and "skip.jsonl:7:" in p.stderr,
           p.stderr[-600:])
    recs = [{"instruction": "q%d" % i, "output": "a%d" % i} for i in range(6)]
    p = data_run("u16.json", json.dumps(recs).encode("utf-16"))
    ok, why = failed_with(p, "u16.json: the file is not UTF-8: it looks like UTF-16 LE")
    report("data_utf16_named", ok, why)
    p = data_run("u16nobom.json", json.dumps(recs).encode("utf-16-be"))
    ok, why = failed_with(p, "looks like UTF-16 or UTF-32")
    report("data_utf16_without_bom_named", ok, why)
    p = data_run("bom.json", b"\xef\xbb\xbf" + json.dumps(recs).encode())
    report("data_utf8_bom_accepted", p.returncode == 0, p.stderr[-400:])
    p = data_run("deep.json", b"[" * 100000 + b"]" * 100000)
    ok, why = failed_with(p, "deep.json:1:2: nesting deeper than 1000 levels")
    report("data_deep_nesting_named", ok and "syntax error" not in p.stderr, why)


def chat_and_tokenize(model, tok, vocab):
    p = run(["chat", "--model_name_or_path", model, "--max_new_tokens", "2", "--do_sample", "false"],
            stdin=b"he\x00llo\nexit\n")
    err = p.stderr.decode("utf-8", "replace")
    report("chat_nul_refused", "holds a NUL byte (at byte 3); it was not sent" in err and b"ChatGLM:" not in p.stdout.split(b"\x00")[-1],
           err[-400:])
    p = run(["tokenize", "--tokenizer", tok, "--decode", "5 %d" % (vocab + 7)])
    ok, why = failed_with(p, "id %d is out of range" % (vocab + 7), "has %d ids" % vocab)
    report("decode_out_of_range_id", ok, why)
    p = run(["tokenize", "--tokenizer", tok, "--decode", "-1"])
    ok, why = failed_with(p, "id -1 is out of range")
    report("decode_negative_id", ok, why)
    # a model too big for the machine's memory on the CPU (a 280-layer ChatGLM-6B shape: 210 GiB of
    # float32 weights) is refused before its weights are read, naming both sizes, instead of being
    # ended part-way by the out-of-memory killer; quantized as it loads, the hint leaves that out
    huge = os.path.join(os.path.dirname(model), "huge_model")
    os.makedirs(huge, exist_ok=True)
    conf = json.load(open(os.path.join(model, "config.json")))
    conf.update(hidden_size=4096, num_layers=280, num_attention_heads=32, inner_hidden_size=16384)
    json.dump(conf, open(os.path.join(huge, "config.json"), "w"))
    shutil.copy(os.path.join(tok, "ice_text.model"), huge)
    for q, want in [("0", "--quantization_bit 8"), ("4", "its linear weights quantized")]:
        p = run(["generate", "--model_name_or_path", huge, "--prompt", "hi", "--max_new_tokens", "2", "--device", "cpu",
                 "--quantization_bit", q])
        ok, why = failed_with(p, "as the CPU holds it", "of memory is available", want)
        report("cpu_generate_past_host_memory_refused_q%s" % q, ok and "no model weights" not in p.stderr.decode(), why)


def configs(base, d, cfg):
    text = open(cfg).read()
    cut = os.path.join(d, "cut", "config.json")
    os.makedirs(os.path.dirname(cut), exist_ok=True)
    open(cut, "w").write(text[: len(text) // 2])
    p = train(base[2:] + ["--init_from_config", cut, "--output_dir", os.path.join(d, "cfg1")], check=False)
    ok, why = failed_with(p, cut + ":1:", "ends early (cut off?")
    report("config_cut_off_named", ok, why)
    big = json.loads(text)
    big["vocab_size"] = 1e12
    open(cut, "w").write(json.dumps(big))
    p = train(base[2:] + ["--init_from_config", cut, "--output_dir", os.path.join(d, "cfg2")], check=False)
    ok, why = failed_with(p, "\"vocab_size\" is 1000000000000: out of range")
    report("config_int_out_of_range", ok, why)
    flags = os.path.join(d, "flags.json")
    open(flags, "w").write('{"learning_rate": 1e-3,\n "max_steps": ')
    p = train(["--config", flags] + base + ["--output_dir", os.path.join(d, "cfg3")], check=False)
    ok, why = failed_with(p, flags + ":2:", "ends early")
    report("flags_config_cut_off_named", ok, why)
    p = train(base + ["--output_dir", os.path.join(d, "cfg4"), "--max_steps", "1e30"], check=False)
    ok, why = failed_with(p, "--max_steps: 1e30 is out of range")
    report("max_steps_out_of_range", ok, why)
    hf = os.path.join(d, "glm_hf", "config.json")  # transformers' GLM-4-0414 (Glm4ForCausalLM) with an option no model has
    os.makedirs(os.path.dirname(hf), exist_ok=True)
    json.dump({"architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "intermediate_size": 96,
               "hidden_act": "gelu"}, open(hf, "w"))
    p = train(base[2:] + ["--init_from_config", hf, "--output_dir", os.path.join(d, "cfg6")], check=False)
    ok, why = failed_with(p, "hidden_act other than silu", "GLM-4-9B-0414")
    report("config_glm4_option_named", ok, why)
    # transformers' GlmConfig without its shape fields: the missing one named
    json.dump({"architectures": ["GlmForCausalLM"], "model_type": "glm", "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}, open(hf, "w"))
    p = train(base[2:] + ["--init_from_config", hf, "--output_dir", os.path.join(d, "cfg7")], check=False)
    ok, why = failed_with(p, "intermediate_size")
    report("config_glm_hf_missing_field_named", ok, why)
    p = train(base[2:] + ["--init_from_config", os.path.join(d, "nope.json"), "--output_dir", os.path.join(d, "cfg5")], check=False)
    ok, why = failed_with(p, "nope.json", "--init_from_config takes a config.json")
    report("init_from_config_missing_hint", ok and "--model_name_or_path must" not in p.stderr, why)


def first_example_cut_characters(base, d):
    """The first example printed before training stays UTF-8 text when truncation cuts a character
    that byte pieces spell (rare characters): the cut bytes show as <0xE9>, as SentencePiece names them."""
    path = os.path.join(d, "rare.jsonl")
    open(path, "w", encoding="utf-8").write(json.dumps({"instruction": "龘靐齉爩" * 3, "output": "龘"}, ensure_ascii=False) + "\n")
    shown, all_utf8 = 0, True
    for n in range(3, 12):
        args = [a for a in base if a not in ("--max_source_length", "32")]
        p = subprocess.run([GLM, "train"] + args + ["--train_file", path, "--output_dir", os.path.join(d, "rare%d" % n),
                                                    "--max_steps", "1", "--save_strategy", "no", "--save_final_model", "false",
                                                    "--max_source_length", str(n)], capture_output=True, timeout=120, env=ENV)
        try:
            err = p.stderr.decode("utf-8")
            shown += "inputs: " in err and "<0x" in err
        except UnicodeDecodeError:
            all_utf8 = False
    report("first_example_cut_character_stays_utf8", all_utf8 and shown > 0, "utf8 %s, <0x shown in %d runs" % (all_utf8, shown))


def trailing_content(base, d, cfg, model, tok):
    """A JSON file with more after its value (two objects, or junk) is refused naming file:line:col,
    as Python's json.load refuses it ("Extra data"), never read as its first part."""
    two = os.path.join(d, "two", "config.json")
    os.makedirs(os.path.dirname(two), exist_ok=True)
    open(two, "w").write(open(cfg).read() + '\n{"num_layers": 8}\n')
    p = train(base[2:] + ["--init_from_config", two, "--output_dir", os.path.join(d, "tc1")], check=False)
    ok, why = failed_with(p, two + ":2:1: more after the JSON value ended")
    report("config_json_two_objects_refused", ok, why)
    flags = os.path.join(d, "flags2.json")
    open(flags, "w").write('{"max_steps": 1}\n{"learning_rate": 1}\n')
    p = train(["--config", flags] + base + ["--output_dir", os.path.join(d, "tc2")], check=False)
    ok, why = failed_with(p, flags + ":2:1: more after the JSON value ended")
    report("flags_config_two_objects_refused", ok, why)
    # a tokenizer folder whose tokenizer_config.json has junk after it
    tok2 = os.path.join(d, "tok2")
    shutil.copytree(tok, tok2)
    open(os.path.join(tok2, "tokenizer_config.json"), "w").write('{"eos_token": "<eop>"} x')
    p = train(["--init_from_config", cfg, "--tokenizer_name", tok2] + base[4:] + ["--output_dir", os.path.join(d, "tc3")],
              check=False)
    ok, why = failed_with(p, "tokenizer_config.json:1:24: more after the JSON value ended")
    report("tokenizer_config_junk_refused", ok, why)
    # generate's JSON Lines: two records on one line, and a history turn that is not a pair
    for name, line, want in (("two_records_a_line", '{"prompt": "a"} {"prompt": "b"}', "in.jsonl:1:17: more after"),
                             ("history_pair_short", '{"prompt": "a", "history": [["q"]]}', "in.jsonl:1: history[0] is not a"),
                             ("history_not_list", '{"prompt": "a", "history": "q"}', "\"history\" is not a list")):
        path = os.path.join(d, "in.jsonl")
        open(path, "w").write(line + "\n")
        p = run(["generate", "--model_name_or_path", model, "--input_file", path, "--max_new_tokens", "2", "--device", "cpu"])
        ok, why = failed_with(p, want)
        report("generate_input_%s_refused" % name, ok, why)


def main():
    if not os.path.exists(GLM):
        skip("bad_input_all", "%s not built" % GLM)
        return
    if not shutil.which("spm_train"):
        skip("bad_input_all", "spm_train (Debian sentencepiece) not installed")
        return
    d = tempfile.mkdtemp(prefix="glmtrain-bad-")
    try:
        tok = make_tokenizer(d)
        ids, vocab = piece_ids(tok)
        cfg = write_config(d, ids, vocab)
        train_file, _ = write_data(d)
        common = ["--tokenizer_name", tok, "--train_file", train_file, "--per_device_train_batch_size", "4",
                  "--logging_steps", "1", "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm"]
        base = ["--init_from_config", cfg] + common
        optimizer_flags(base, d)
        tf32_on_cpu(base, d)
        determinism_on_cpu(base, d)
        diverging_runs(base, d)
        diverging_two_ranks(d, cfg, common)
        model = os.path.join(d, "good")
        train(base + ["--output_dir", model, "--max_steps", "1", "--save_strategy", "no"])
        nan_weight_input(model, d, common)
        data_records(base, d)
        chat_and_tokenize(model, tok, vocab)
        configs(base, d, cfg)
        trailing_content(base, d, cfg, model, tok)
        first_example_cut_characters(base, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
