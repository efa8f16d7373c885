#!/usr/bin/env python3
"""Checkpoint integrity (issue 14): the cases where a run used to lose or corrupt work silently.
Each check damages or mixes up an output folder the way a hostile user, a full disk or a kill
does, and asserts that the run takes the right checkpoint (or refuses), names what it skipped or
removed, and ends with the same model an undisturbed run has. Tiny model of test_train.py on
the CPU; the 2-rank case runs under mpirun when this glmtrain has MPI."""
import hashlib, json, os, shutil, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness
import test_train as T

GLM = T.GLM
C = harness.Checks()


def run(args, check=False):
    return T.train(args, check=check)


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run_id(ck):
    return json.load(open(os.path.join(ck, "trainer_state.json"))).get("run_id")


def ckpts(out):
    return sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-"))


def overwrite_case(d, base):
    """Run A leaves checkpoint-2 and -4; run B starts over in the same folder."""
    out = os.path.join(d, "ow")
    run(base + ["--output_dir", out, "--max_steps", "4", "--save_steps", "2"], check=True)
    a_id = run_id(os.path.join(out, "checkpoint-4"))
    aside = os.path.join(d, "a-checkpoint-4")
    shutil.copytree(os.path.join(out, "checkpoint-4"), aside)
    p = run(base + ["--output_dir", out, "--overwrite_output_dir", "--max_steps", "2", "--save_steps", "1",
                    "--save_total_limit", "1", "--seed", "8"], check=True)
    removed = all("removed %s/checkpoint-%d" % (out, s) in p.stderr for s in (2, 4))
    left = ckpts(out)
    b_id = run_id(os.path.join(out, "checkpoint-2")) if left == [2] else None
    C.check("overwrite_removes_old_run", removed and left == [2] and b_id and b_id != a_id,
            "removed lines %s, left %s, ids %s %s" % (removed, left, a_id, b_id))
    # A's checkpoint-4 back in the folder (a copy, or A still running): B never resumes from it
    # nor rotates it away
    shutil.copytree(aside, os.path.join(out, "checkpoint-4"))
    p = run(base + ["--output_dir", out, "--overwrite_output_dir", "--resume_from_checkpoint", "--max_steps", "3",
                    "--save_steps", "1", "--save_total_limit", "1", "--seed", "8"])
    ok = p.returncode == 0 and "resumed from %s/checkpoint-2 at step 2" % out in p.stderr and \
        "not resuming from %s/checkpoint-4: it belongs to run %s" % (out, a_id) in p.stderr
    C.check("resume_skips_other_runs_checkpoint", ok, p.stderr[-600:])
    left = ckpts(out)
    C.check("rotation_keeps_other_runs_checkpoint",
            left == [3, 4] and run_id(os.path.join(out, "checkpoint-4")) == a_id and
            run_id(os.path.join(out, "checkpoint-3")) == b_id, "left %s" % left)


def reference(d, base):
    """An undisturbed run of 8 steps with checkpoints every 2."""
    ref = os.path.join(d, "ref")
    run(base + ["--output_dir", ref, "--max_steps", "8", "--save_steps", "2"], check=True)
    return ref


def copy(d, ref, name):
    """The reference folder as a run killed after checkpoint-6 leaves it."""
    out = os.path.join(d, name)
    shutil.copytree(ref, out)
    shutil.rmtree(os.path.join(out, "checkpoint-8"))
    os.remove(os.path.join(out, "model.safetensors"))
    return out


def damaged_case(d, base, ref):
    """Copies of the reference folder with the newest checkpoints damaged."""
    final = digest(os.path.join(ref, "model.safetensors"))
    # random bytes over the newest optimizer state (same size: only the hash can tell)
    out = copy(d, ref, "rand")
    opt = os.path.join(out, "checkpoint-6", "optimizer.safetensors")
    n = os.path.getsize(opt)
    with open(opt, "r+b") as f:
        f.seek(n // 2)
        f.write(os.urandom(4096))
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "2", "--resume_from_checkpoint"])
    named = "not resuming from %s/checkpoint-6: optimizer.safetensors does not match its checksum" % out in p.stderr
    took = "resumed from %s/checkpoint-4 at step 4" % out in p.stderr
    same = p.returncode == 0 and digest(os.path.join(out, "model.safetensors")) == final
    C.check("random_bytes_optimizer_skipped", named and took, p.stderr[-800:])
    C.check("random_bytes_final_model_equals_uninterrupted", same, "rc %d" % p.returncode)

    # a truncated model in checkpoint-6 and a truncated trainer_state.json in checkpoint-8
    out = copy(d, ref, "trunc")
    shutil.copytree(os.path.join(ref, "checkpoint-8"), os.path.join(out, "checkpoint-8"))
    with open(os.path.join(out, "checkpoint-6", "model.safetensors"), "r+b") as f:
        f.truncate(1000)
    st = os.path.join(out, "checkpoint-8", "trainer_state.json")
    with open(st, "r+b") as f:
        f.truncate(os.path.getsize(st) // 2)
    # a named checkpoint that is damaged is refused, naming the file and the intact one
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--resume_from_checkpoint", os.path.join(out, "checkpoint-6")])
    C.check("named_damaged_checkpoint_refused",
            p.returncode != 0 and "model.safetensors has 1000 bytes" in p.stderr and "truncated" in p.stderr and
            "%s/checkpoint-4 is intact" % out in p.stderr, p.stderr[-600:])
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "2", "--resume_from_checkpoint"])
    ok = p.returncode == 0 and "checkpoint-8: trainer_state.json has" in p.stderr and \
        "checkpoint-6: model.safetensors has 1000 bytes" in p.stderr and \
        "resumed from %s/checkpoint-4 at step 4" % out in p.stderr
    C.check("truncated_checkpoints_skipped", ok, p.stderr[-800:])
    C.check("truncated_final_model_equals_uninterrupted",
            p.returncode == 0 and digest(os.path.join(out, "model.safetensors")) == final)


def generate_case(d, ref):
    # generate refuses a damaged checkpoint and names the file
    bad = os.path.join(d, "rand-bad")
    shutil.copytree(os.path.join(ref, "checkpoint-4"), bad)
    with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
        f.seek(200)
        f.write(os.urandom(64))
    g = subprocess.run([GLM, "generate", "--model_name_or_path", bad, "--prompt", "春", "--max_new_tokens", "2",
                        "--device", "cpu"], capture_output=True, text=True, timeout=60)
    C.check("generate_refuses_damaged_checkpoint",
            g.returncode != 0 and "model.safetensors does not match its checksum" in g.stderr, g.stderr[-400:])
    g = subprocess.run([GLM, "generate", "--model_name_or_path", os.path.join(ref, "checkpoint-4"), "--prompt", "春",
                        "--max_new_tokens", "2", "--device", "cpu"], capture_output=True, text=True, timeout=60)
    C.check("generate_loads_intact_checkpoint", g.returncode == 0, g.stderr[-400:])


def legacy_case(d, base, ref):
    final = digest(os.path.join(ref, "model.safetensors"))
    # a checkpoint of an earlier glmtrain (no manifest, no run id) still resumes, saying so
    out = copy(d, ref, "legacy")
    shutil.rmtree(os.path.join(out, "checkpoint-6"))
    for f in ["run_id.txt"] + ["checkpoint-%d/checksums.json" % s for s in (2, 4)]:
        os.remove(os.path.join(out, f))
    for s in (2, 4):
        ck = os.path.join(out, "checkpoint-%d" % s)
        j = json.load(open(os.path.join(ck, "trainer_state.json")))
        del j["run_id"]
        json.dump(j, open(os.path.join(ck, "trainer_state.json"), "w"))
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "2", "--resume_from_checkpoint"])
    C.check("legacy_checkpoint_resumes_unverified",
            p.returncode == 0 and "checkpoint-4: no checksums.json (written by an earlier glmtrain)" in p.stderr and
            "resumed from %s/checkpoint-4 at step 4" % out in p.stderr and
            digest(os.path.join(out, "model.safetensors")) == final, p.stderr[-600:])
    # ... but one of this glmtrain (it has a run id) whose manifest was deleted is not trusted
    out = copy(d, ref, "nomanifest")
    os.remove(os.path.join(out, "checkpoint-6", "checksums.json"))
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "2", "--resume_from_checkpoint"])
    C.check("missing_manifest_skipped", p.returncode == 0 and "checkpoint-6: checksums.json is missing" in p.stderr and
            "resumed from %s/checkpoint-4" % out in p.stderr, p.stderr[-600:])


def stale_case(d, base, ref):
    # a stale tmp-checkpoint of a killed save: removed with a log line, never resumed
    out = copy(d, ref, "stale")
    tmp = os.path.join(out, "tmp-checkpoint-8")
    os.makedirs(tmp)
    open(os.path.join(tmp, "model.safetensors.tmp"), "wb").write(os.urandom(5000))
    p = run(base + ["--output_dir", out, "--max_steps", "8", "--save_steps", "2", "--resume_from_checkpoint"])
    C.check("stale_tmp_removed", p.returncode == 0 and "removed %s" % tmp in p.stderr and
            "resumed from %s/checkpoint-6" % out in p.stderr and not os.path.exists(tmp) and
            os.path.isdir(os.path.join(out, "checkpoint-8")), p.stderr[-600:])
    C.check("same_settings_no_warning", "settings that differ" not in p.stderr, p.stderr[-300:])
    out = copy(d, ref, "changed")
    p = run(base[:-2] + ["--report_to", "tensorboard", "--learning_rate", "2e-2", "--output_dir", out, "--max_steps", "8",
                         "--resume_from_checkpoint"])
    C.check("changed_settings_warned", p.returncode == 0 and "settings that differ from its training_args.json" in p.stderr and
            "--learning_rate 0.01 -> 0.02" in p.stderr and '--report_to "none" -> "tensorboard"' in p.stderr, p.stderr[-600:])
    # other training data (the same file name, one record changed): named; refused with --resume_mismatch error
    i = base.index("--train_file")
    recs = json.load(open(base[i + 1]))
    recs[0]["output"] += "。"
    other = os.path.join(d, "train-changed.json")
    json.dump(recs, open(other, "w"), ensure_ascii=False)
    changed = base[:i + 1] + [other] + base[i + 2:]
    out = copy(d, ref, "changed-data")
    p = run(changed + ["--output_dir", out, "--max_steps", "8", "--resume_from_checkpoint"])
    C.check("changed_data_warned", p.returncode == 0 and "the training data as tokenized" in p.stderr, p.stderr[-600:])
    out = copy(d, ref, "changed-data-strict")
    p = run(changed + ["--output_dir", out, "--max_steps", "8", "--resume_from_checkpoint", "--resume_mismatch", "error"])
    C.check("changed_data_refused_with_resume_mismatch_error", p.returncode != 0 and "--resume_mismatch error" in p.stderr and
            "the training data as tokenized" in p.stderr and not os.path.isdir(os.path.join(out, "checkpoint-8")), p.stderr[-600:])


def ckpt_bytes(ck):
    return sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck))


def size_in(msg):
    """The size the hint states, in bytes."""
    import re
    m = re.search(r"the checkpoint needs about ([0-9.]+) (kB|MB|GB)", msg)
    return float(m.group(1)) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2)] if m else None


def full_disk_case(d, base, ref):
    need = ckpt_bytes(os.path.join(ref, "checkpoint-2"))
    # something where the tmp folder must go: the save fails, the message states the size
    out = os.path.join(d, "blocked")
    os.makedirs(out)
    open(os.path.join(out, "tmp-checkpoint-2"), "w").write("in the way")
    p = run(base + ["--output_dir", out, "--max_steps", "2", "--save_steps", "2"])
    said = size_in(p.stderr)
    C.check("blocked_save_states_size", p.returncode != 0 and said and abs(said - need) < 0.1 * need,
            "needs %d bytes, said %s: %s" % (need, said, p.stderr[-300:]))
    # a real full disk: a small tmpfs (root only)
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt)
    size = int(need * 0.6) // 4096 * 4096
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0:
        C.skip("full_disk_leaves_nothing", "cannot mount a tmpfs here: %s" % m.stderr.strip())
        return
    try:
        out = os.path.join(mnt, "out")
        args = base + ["--output_dir", out, "--max_steps", "2", "--save_steps", "2", "--cache_dir", os.path.join(d, "cache")]
        p = run(args)
        said = size_in(p.stderr)
        left = [n for n in os.listdir(out) if "checkpoint" in n]
        C.check("full_disk_leaves_nothing", p.returncode != 0 and not left, "left %s: %s" % (left, p.stderr[-300:]))
        C.check("full_disk_states_size", said is not None and abs(said - need) < 0.1 * need and "the disk is full" in p.stderr,
                "needs %d bytes, said %s: %s" % (need, said, p.stderr[-300:]))
        subprocess.run(["mount", "-o", "remount,size=%d" % (8 * need), mnt], check=True)
        p = run(args)
        C.check("full_disk_retry_succeeds", p.returncode == 0 and ckpts(out) == [2], p.stderr[-300:])
    finally:
        subprocess.run(["umount", mnt])


def mpi_case(d, base):
    """2 ranks: rank 0 verifies and every rank loads the checkpoint it chose."""
    import mpi_runs as M
    why = T.parallel_missing()
    if why:
        C.skip("dp2_random_bytes_skipped", why)
        return
    ref = os.path.join(d, "dp-ref")
    args = base + ["--max_steps", "4", "--save_steps", "2"]
    p = M.run(args + ["--output_dir", ref], np=2, check=False)
    if any(s in p.stdout + p.stderr for s in M.NO_MPI):
        C.skip("dp2_random_bytes_skipped", "this glmtrain was built without MPI")
        return
    if p.returncode != 0:
        C.check("dp2_reference_run", False, (p.stdout + p.stderr)[-600:])
        return
    out = os.path.join(d, "dp")
    shutil.copytree(ref, out)
    os.remove(os.path.join(out, "model.safetensors"))
    opt = os.path.join(out, "checkpoint-4", "optimizer.safetensors")
    with open(opt, "r+b") as f:
        f.seek(os.path.getsize(opt) - 5000)
        f.write(os.urandom(4000))
    p = M.run(args + ["--output_dir", out, "--resume_from_checkpoint"], np=2, check=False)
    text = p.stdout + p.stderr
    C.check("dp2_random_bytes_skipped", p.returncode == 0 and "not resuming from %s/checkpoint-4" % out in text and
            "resumed from %s/checkpoint-2 at step 2" % out in text and
            digest(os.path.join(out, "model.safetensors")) == digest(os.path.join(ref, "model.safetensors")), text[-800:])
    # a checkpoint of 2 ranks in mid-epoch resumed on 1: the data position is re-mapped, so the
    # epoch trains every example once (its supervised tokens equal an uninterrupted 1-rank epoch's)
    out = os.path.join(d, "dp-mid")
    p = M.run(base + ["--max_steps", "1", "--save_steps", "1", "--output_dir", out], np=2, check=False)
    p = M.run(base + ["--max_steps", "3", "--save_strategy", "epoch", "--output_dir", out, "--resume_from_checkpoint"],
              check=False)
    one = os.path.join(d, "one-rank-epoch")
    p1 = M.run(base + ["--max_steps", "4", "--save_strategy", "epoch", "--output_dir", one], check=False)
    st = lambda ck: json.load(open(os.path.join(ck, "trainer_state.json")))  # noqa: E731
    ok = p.returncode == 0 and p1.returncode == 0 and os.path.isdir(os.path.join(out, "checkpoint-3"))
    C.check("dp2_to_1_remapped", ok and "re-mapped the data position: 16 rows of epoch 0" in p.stderr and
            "not re-mapped" not in p.stderr, p.stderr[-600:])
    if ok:
        a, b = st(os.path.join(out, "checkpoint-3")), st(os.path.join(one, "checkpoint-4"))
        C.check("dp2_to_1_epoch_trains_each_example_once", a["tokens_seen"] == b["tokens_seen"] and a["epoch"] == 1 and
                a["data_cursor"] == 0, "tokens %s vs %s, epoch %s cursor %s" % (a["tokens_seen"], b["tokens_seen"],
                                                                               a["epoch"], a["data_cursor"]))
    # pipeline stages write shards through their own writer (parallel/pipe/pipe_ckpt.c): sealed the same way
    pp = args + ["--pipeline_parallel_size", "2"]
    out = os.path.join(d, "pp")
    p = M.run(pp + ["--output_dir", out], np=2, check=False)
    manifest = os.path.join(out, "checkpoint-4", "checksums.json")
    shard = "optimizer-00002-of-00002.safetensors"
    listed = os.path.exists(manifest) and shard in json.load(open(manifest))["files"]
    if p.returncode == 0 and listed:
        with open(os.path.join(out, "checkpoint-4", shard), "r+b") as f:
            f.truncate(2000)
        p = M.run(pp + ["--output_dir", out, "--resume_from_checkpoint"], np=2, check=False)
    text = p.stdout + p.stderr
    C.check("pp2_truncated_shard_skipped", listed and p.returncode == 0 and
            "checkpoint-4: %s has 2000 bytes" % shard in text and "resumed from %s/checkpoint-2 at step 2" % out in text,
            text[-800:])


def main():
    if not os.path.exists(GLM):
        C.skip("ckpt_integrity", "%s not built" % GLM)
        return 0
    if not shutil.which("spm_train"):
        C.skip("ckpt_integrity", "spm_train (Debian sentencepiece) not installed")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-ckint-")
    try:
        tok = T.make_tokenizer(d)
        ids, vocab = T.piece_ids(tok)
        cfg = T.write_config(d, ids, vocab)
        train_file, _ = T.write_data(d)
        base = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file,
                "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                "--learning_rate", "1e-2", "--warmup_steps", "2", "--logging_steps", "1", "--seed", "7",
                "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm", "--report_to", "none"]
        ref = reference(d, base)
        cases = [("overwrite_case", lambda: overwrite_case(d, base)), ("damaged_case", lambda: damaged_case(d, base, ref)),
                 ("generate_case", lambda: generate_case(d, ref)), ("legacy_case", lambda: legacy_case(d, base, ref)),
                 ("stale_case", lambda: stale_case(d, base, ref)), ("full_disk_case", lambda: full_disk_case(d, base, ref)),
                 ("mpi_case", lambda: mpi_case(d, base))]
        for name, case in cases:
            try:  # a case that crashes is one failure; the others still run
                case()
            except Exception as e:
                C.check(name, False, "%s: %s" % (type(e).__name__, str(e)[-500:]))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return C.status()


if __name__ == "__main__":
    sys.exit(main())
