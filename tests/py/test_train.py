#!/usr/bin/env python3
"""`glmtrain train` end to end on the CPU: a tiny random GLM and a tiny SentencePiece tokenizer
trained here with spm_train. Checks that the loss falls, that a resumed run reproduces the
uninterrupted one bit for bit, save_total_limit rotation, that incomplete checkpoints are never
resumed from, evaluation numbers, TensorBoard events (read with the real reader), NEFTune (noise in
training only, exact resume), logging_strategy epoch/no, eval_delay, dataloader_drop_last, and flag errors. Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import json, math, os, re, shutil, subprocess, sys, tempfile

BUILD = os.environ.get("GLM_BUILD", "build")
GLM = os.path.join(BUILD, "glmtrain")
results = []

def report(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + (": " + detail if detail else ""))
    results.append(ok)

def skip(name, why):
    print("SKIP %s: %s" % (name, why))

def make_tokenizer(d):
    """A small unigram model with ChatGLM's special pieces, so the ChatGLM layer finds its ids."""
    text = os.path.join(d, "corpus.txt")
    lines = []
    src = "/usr/share/games/fortunes/tang300"
    if os.path.exists(src):
        lines = [l.strip() for l in open(src, encoding="utf-8") if l.strip() and l.strip() != "%"]
    lines += ["the quick brown fox jumps over the lazy dog %d" % i for i in range(200)]
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    blanks = ",".join("<|blank_%d|>" % n for n in range(2, 81))
    prefix = os.path.join(d, "tok", "ice_text")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    subprocess.run(["spm_train", "--input=" + text, "--model_prefix=" + prefix, "--vocab_size=2500", "--hard_vocab_limit=false",
                    "--model_type=unigram", "--character_coverage=0.98", "--byte_fallback=true",
                    "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=3",
                    "--user_defined_symbols=<n>,<|tab|>," + blanks,
                    "--control_symbols=[MASK],[gMASK],[sMASK],<unused_0>,<sop>,<eop>,<ENC>,<dBLOCK>",
                    "--minloglevel=2"], check=True, capture_output=True)
    return os.path.dirname(prefix)

def piece_ids(tokdir):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tokdir, "ice_text.model"))
    return {p: sp.piece_to_id(p) for p in ["[MASK]", "[gMASK]", "<sop>", "<eop>", "<pad>"]}, sp.get_piece_size()

def write_config(d, ids, vocab):
    cfg = {"model_type": "chatglm", "vocab_size": vocab, "hidden_size": 32, "num_layers": 2,
           "num_attention_heads": 4, "inner_hidden_size": 64, "max_sequence_length": 256,
           "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "tie_word_embeddings": True,
           "mask_token_id": ids["[MASK]"], "gmask_token_id": ids["[gMASK]"], "bos_token_id": ids["<sop>"],
           "eos_token_id": ids["<eop>"], "pad_token_id": ids["<pad>"]}
    path = os.path.join(d, "config.json")
    json.dump(cfg, open(path, "w"))
    return path

def tiny_model(d):
    """The tokenizer folder and config.json of a tiny ChatGLM-6B in d: (tokenizer, config path)."""
    tok = make_tokenizer(d)
    ids, vocab = piece_ids(tok)
    return tok, write_config(d, ids, vocab)

def write_data(d):
    recs = []
    words = ["春", "风", "明月", "山", "水", "江南", "白云", "故人"]
    for i in range(40):
        q = "写一句关于%s的诗" % words[i % len(words)]
        a = "%s%s%s" % (words[i % len(words)], words[(i * 3 + 1) % len(words)], words[(i * 5 + 2) % len(words)])
        recs.append({"instruction": q, "output": a})
    train = os.path.join(d, "train.json")
    json.dump(recs[:32], open(train, "w"), ensure_ascii=False)
    val = os.path.join(d, "val.json")
    json.dump(recs[32:], open(val, "w"), ensure_ascii=False)
    return train, val

def parallel_missing():
    """Why the multi-rank tests cannot run here (None when they can)."""
    if not os.path.exists(GLM):
        return "%s not built" % GLM
    if not shutil.which("mpirun") or not shutil.which("spm_train"):
        return "mpirun (openmpi-bin) or spm_train (sentencepiece) not installed"
    return None


def parallel_setup(d, num_layers=None):
    """Tokenizer, config (num_layers overridden if given) and the 32-record data set in d, and the
    train flags the data- and pipeline-parallel tests share: (config path, flags)."""
    tok = make_tokenizer(d)
    ids, vocab = piece_ids(tok)
    cfg_path = write_config(d, ids, vocab)
    if num_layers:
        cfg = json.load(open(cfg_path))
        cfg["num_layers"] = num_layers
        json.dump(cfg, open(cfg_path, "w"))
    train_file, _ = write_data(d)  # 32 records: every rank split the tests use divides them evenly
    return cfg_path, ["--init_from_config", cfg_path, "--tokenizer_name", tok, "--train_file", train_file,
                      "--learning_rate", "1e-2", "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7",
                      "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm", "--report_to", "none"]


def train(args, check=True):
    p = subprocess.run([GLM, "train"] + args, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if check and p.returncode != 0:
        raise RuntimeError("glmtrain train failed (%d):\n%s" % (p.returncode, p.stderr[-3000:]))
    return p

def history(out, ckpt=None):
    path = os.path.join(out, ckpt, "trainer_state.json") if ckpt else None
    if path is None:
        # the newest checkpoint holds the full log history
        cks = sorted((int(n.split("-")[1]), n) for n in os.listdir(out) if n.startswith("checkpoint-"))
        path = os.path.join(out, cks[-1][1], "trainer_state.json")
    return json.load(open(path))["log_history"]

def main():
    if not os.path.exists(GLM):
        skip("train_all", "%s not built" % GLM)
        return
    if not shutil.which("spm_train"):
        skip("train_all", "spm_train (Debian sentencepiece) not installed")
        return
    d = tempfile.mkdtemp(prefix="glmtrain-test-")
    try:
        tok = make_tokenizer(d)
        ids, vocab = piece_ids(tok)
        cfg = write_config(d, ids, vocab)
        train_file, val_file = write_data(d)
        base = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file,
                "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                "--learning_rate", "1e-2", "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7",
                "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm"]

        # 1. a full run: the loss falls
        out_a = os.path.join(d, "a")
        train(base + ["--output_dir", out_a, "--max_steps", "12", "--save_steps", "4",
                      "--validation_file", val_file, "--eval_strategy", "steps", "--eval_steps", "6"])
        h = history(out_a)
        losses = [r["loss"] for r in h if "loss" in r]
        report("train_loss_falls", len(losses) == 12 and losses[-1] < 0.8 * losses[0],
               "losses %s" % ["%.3f" % l for l in losses])
        report("final_model_saved", all(os.path.exists(os.path.join(out_a, f)) for f in
                                        ["config.json", "model.safetensors", "ice_text.model", "training_args.json"]))
        evals = [r for r in h if "eval_loss" in r]
        report("eval_logged", len(evals) == 2 and all(abs(math.exp(r["eval_loss"]) - r["eval_perplexity"]) < 1e-6 * r["eval_perplexity"] for r in evals),
               str(evals))

        # 2. resume from checkpoint-4 reproduces steps 5..12 bit for bit
        out_b = os.path.join(d, "b")
        shutil.copytree(os.path.join(out_a, "checkpoint-4"), os.path.join(out_b, "checkpoint-4"))
        train(base + ["--output_dir", out_b, "--max_steps", "12", "--save_steps", "4",
                      "--validation_file", val_file, "--eval_strategy", "steps", "--eval_steps", "6",
                      "--resume_from_checkpoint"])
        hb = history(out_b)
        la = [(r["step"], r["loss"]) for r in h if "loss" in r and r["step"] > 4]
        lb = [(r["step"], r["loss"]) for r in hb if "loss" in r and r["step"] > 4]
        report("resume_bit_exact", la == lb and len(la) == 8, "uninterrupted %s vs resumed %s" % (la[:3], lb[:3]))
        import struct
        wa = open(os.path.join(out_a, "model.safetensors"), "rb").read()
        wb = open(os.path.join(out_b, "model.safetensors"), "rb").read()
        report("resume_final_weights_identical", wa == wb)

        # 2b. NEFTune (--neftune_noise_alpha): noise changes the training losses from step 1 on, and
        # a resumed run draws the same noise (its seed follows the step)
        out_f, out_g = os.path.join(d, "neft"), os.path.join(d, "neft-resumed")
        neft = base + ["--neftune_noise_alpha", "5", "--max_steps", "6", "--save_steps", "3"]
        p = train(neft + ["--output_dir", out_f])
        hf = history(out_f)
        shutil.copytree(os.path.join(out_f, "checkpoint-3"), os.path.join(out_g, "checkpoint-3"))
        train(neft + ["--output_dir", out_g, "--resume_from_checkpoint"])
        lf = [(r["step"], r["loss"]) for r in hf if "loss" in r]
        lg = [(r["step"], r["loss"]) for r in history(out_g) if "loss" in r and r["step"] > 3]
        report("neftune_changes_training", "NEFTune" in p.stderr and len(lf) == 6 and lf[0][1] != losses[0]
               and all(math.isfinite(l) for _, l in lf), "first loss %s with noise, %s without" % (lf[:1], losses[:1]))
        report("neftune_resume_bit_exact", lf[3:] == lg and len(lg) == 3, "uninterrupted %s vs resumed %s" % (lf[3:], lg))
        p = train(base + ["--output_dir", os.path.join(d, "neft-bad"), "--max_steps", "1", "--neftune_noise_alpha", "-1"], check=False)
        report("neftune_negative_refused", p.returncode != 0 and "--neftune_noise_alpha -1" in p.stderr, p.stderr[-300:])

        # 2c. the Trainer's logging_strategy (epoch: the loss at each epoch's end; no: none) and
        # eval_delay (no evaluation before that step)
        def records(out, key):
            return [r["step"] for r in history(out) if key in r]
        out_e = os.path.join(d, "log-epoch")
        p = train(base + ["--output_dir", out_e, "--num_train_epochs", "2", "--save_strategy", "epoch", "--logging_strategy", "epoch"])
        spe = int(re.search(r"\((\d+) per epoch", p.stderr).group(1))
        report("logging_strategy_epoch", records(out_e, "loss") == [spe, 2 * spe], "loss at steps %s, %d steps an epoch" % (
            records(out_e, "loss"), spe))
        out_n = os.path.join(d, "log-no")
        train(base + ["--output_dir", out_n, "--max_steps", "4", "--save_steps", "4", "--logging_strategy", "no"])
        report("logging_strategy_no", records(out_n, "loss") == [], str(records(out_n, "loss")))
        out_d = os.path.join(d, "eval-delay")
        train(base + ["--output_dir", out_d, "--max_steps", "8", "--save_steps", "8", "--validation_file", val_file,
                      "--eval_strategy", "steps", "--eval_steps", "2", "--eval_delay", "5"])
        report("eval_delay_steps", records(out_d, "eval_loss") == [6, 8], str(records(out_d, "eval_loss")))
        # --dataloader_drop_last: 32 rows in micro-batches of 5 are 7 (the last of 2 rows) or 6
        per = {}
        for drop in ("false", "true"):
            p = train(base + ["--output_dir", os.path.join(d, "drop-" + drop), "--max_steps", "1", "--save_strategy", "no",
                              "--per_device_train_batch_size", "5", "--gradient_accumulation_steps", "1",
                              "--dataloader_drop_last", drop])
            per[drop] = re.search(r"(\d+) micro-batches of", p.stderr).group(1)
        report("dataloader_drop_last", per == {"false": "7", "true": "6"}, str(per))

        # 3. save_total_limit keeps the newest N
        out_c = os.path.join(d, "c")
        train(base + ["--output_dir", out_c, "--max_steps", "8", "--save_steps", "2", "--save_total_limit", "2"])
        cks = sorted(n for n in os.listdir(out_c) if n.startswith("checkpoint-"))
        report("save_total_limit", cks == ["checkpoint-6", "checkpoint-8"], str(cks))
        report("final_model_saved_beside_checkpoints", os.path.exists(os.path.join(out_c, "model.safetensors")))

        # 3b. --save_final_model false: checkpoints only, and a note when nothing is saved at all
        out_n = os.path.join(d, "n")
        train(base + ["--output_dir", out_n, "--max_steps", "2", "--save_steps", "2", "--save_final_model", "false"])
        p = train(base + ["--output_dir", os.path.join(d, "n2"), "--max_steps", "1", "--save_strategy", "no",
                          "--save_final_model", "false"])
        report("save_final_model_false", os.path.isdir(os.path.join(out_n, "checkpoint-2"))
               and not os.path.exists(os.path.join(out_n, "model.safetensors")) and "nothing of this run will be saved" in p.stderr,
               str(sorted(os.listdir(out_n))))

        # 4. an interrupted save (tmp folder, or a folder without trainer_state.json) is never resumed
        os.makedirs(os.path.join(out_c, "tmp-checkpoint-10"))
        shutil.copytree(os.path.join(out_c, "checkpoint-8"), os.path.join(out_c, "checkpoint-9"))
        os.remove(os.path.join(out_c, "checkpoint-9", "trainer_state.json"))
        p = train(base + ["--output_dir", out_c, "--max_steps", "9", "--save_steps", "100", "--resume_from_checkpoint"])
        report("incomplete_checkpoint_ignored", "checkpoint-8" in p.stderr and "resumed" in p.stderr, p.stderr[-400:])

        # 5. TensorBoard events read back by the real reader
        try:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
            ea = EventAccumulator(os.path.join(out_a, "runs"))
            ea.Reload()
            tags = ea.Tags()["scalars"]
            need = ["train/loss", "train/learning_rate", "train/grad_norm", "train/epoch", "train/tokens_per_second",
                    "eval/loss", "eval/perplexity"]
            tb_loss = [(e.step, e.value) for e in ea.Scalars("train/loss")] if "train/loss" in tags else []
            ok = all(t in tags for t in need) and len(tb_loss) == 12 and \
                all(abs(v - l) <= 1e-6 * abs(l) for (s, v), l in zip(tb_loss, losses))
            report("tensorboard_events", ok, "tags %s" % tags)
        except ImportError:
            skip("tensorboard_events", "python tensorboard package missing")

        # 6. on a terminal a progress bar is redrawn in place; in a pipe only log lines appear
        import pty
        master, slave = pty.openpty()
        out_p = os.path.join(d, "p")
        proc = subprocess.Popen([GLM, "train"] + [x for x in base if x != "--disable_tqdm"] +
                                ["--output_dir", out_p, "--max_steps", "6", "--save_steps", "100"],
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=120)
        os.close(master)
        tty_out = b"".join(chunks).decode("utf-8", "replace")
        report("progress_bar_on_terminal", proc.returncode == 0 and "\r" in tty_out and "6/6 [" in tty_out and "tok/s" in tty_out,
               repr(tty_out[-300:]))

        # 7. flag errors are clear
        p = train(["--output_dir", os.path.join(d, "e"), "--learnig_rate", "1e-4"], check=False)
        report("misspelt_flag_suggests", p.returncode != 0 and "--learning_rate" in p.stderr, p.stderr.strip())
        p = train(base + ["--output_dir", os.path.join(d, "f"), "--bf16", "--device", "cpu"], check=False)
        report("bf16_on_cpu_hint", p.returncode != 0 and "hint" in p.stderr, p.stderr.strip()[-300:])
        p = train(base + ["--output_dir", out_a, "--max_steps", "2"], check=False)
        report("existing_output_dir_refused", p.returncode != 0 and "overwrite_output_dir" in p.stderr, p.stderr.strip()[-300:])
    finally:
        shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        print("FAIL test_train: %s" % e)
        sys.exit(1)
    sys.exit(0 if all(results) else 1)
