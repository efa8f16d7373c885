#!/usr/bin/env python3
"""Models named as on the Hugging Face Hub (THUDM's train.sh writes --model_name_or_path
THUDM/chatglm-6b) are found in the local Hugging Face cache, laid out as huggingface_hub writes
it (models--ORG--NAME/refs/main holding a commit, snapshots/COMMIT/ the files), on a tiny model:
  * generate, train (--model_name_or_path), tokenize and info (merge, quantize and convert too) take
    the name and load the snapshot refs/main names: the same output as the folder itself;
  * --model_revision picks another branch or a commit; HF_HUB_CACHE comes before HF_HOME;
  * a folder of that relative path here is taken before the cache;
  * a LoRA adapter trained on it names its base "ORG/NAME" in adapter_config.json, not the snapshot;
  * serve lists the model as "ORG/NAME" and takes --adapter ORG/NAME from the cache;
  * a name in no cache, or a revision the cache lacks, is refused naming the cache and the
    download command; a snapshot whose weights link to a missing blob names the link; a bare word that is no folder keeps the loader's own error.
Prints PASS/FAIL/SKIP lines."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_train as T  # noqa: E402
from mpi_runs import ENV, GLM, report  # noqa: E402


def run(args, env_extra, cwd=None):
    env = dict(ENV)
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        env.pop(k, None)
    env.update(env_extra)
    return subprocess.run([os.path.abspath(GLM)] + args, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def snapshot(cache, repo, commit, src, ref=None):
    """A cache entry as huggingface_hub lays it out: files as links into blobs/."""
    top = os.path.join(cache, "models--" + repo.replace("/", "--"))
    snap = os.path.join(top, "snapshots", commit)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(top, "blobs"), exist_ok=True)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if not os.path.isfile(path):
            continue
        blob = os.path.join(top, "blobs", commit + "-" + name)
        shutil.copy(path, blob)
        os.symlink(os.path.relpath(blob, snap), os.path.join(snap, name))
    if ref:
        os.makedirs(os.path.join(top, "refs"), exist_ok=True)
        open(os.path.join(top, "refs", ref), "w").write(commit)  # no newline, as huggingface_hub writes it
    return snap


def main():
    if not os.path.exists(GLM) or not shutil.which("spm_train"):
        print("SKIP hub_cache: glmtrain or spm_train missing")
        return 0
    d = tempfile.mkdtemp(prefix="glmtrain-hub-")
    try:
        tok, cfg = T.tiny_model(d)
        train_file, _ = T.write_data(d)
        base = ["--init_from_config", cfg, "--tokenizer_name", tok, "--train_file", train_file, "--per_device_train_batch_size", "4",
                "--max_source_length", "32", "--max_target_length", "16", "--disable_tqdm", "--learning_rate", "1e-2",
                "--save_strategy", "no", "--overwrite_output_dir"]
        m1, m2 = os.path.join(d, "m1"), os.path.join(d, "m2")
        for out, steps in ((m1, "2"), (m2, "4")):
            p = run(["train"] + base + ["--output_dir", out, "--max_steps", steps], {})
            if p.returncode:
                print("FAIL hub_cache_setup: %s" % p.stderr[-800:])
                return 0
        home = os.path.join(d, "hf")
        cache = os.path.join(home, "hub")
        snap1 = snapshot(cache, "THUDM/tiny-glm", "c1" * 20, m1, ref="main")
        snap2 = snapshot(cache, "THUDM/tiny-glm", "c2" * 20, m2, ref="v2")
        env = {"HF_HOME": home}
        gen = ["generate", "--prompt", "春风", "--do_sample", "true", "--temperature", "2", "--top_p", "1", "--seed", "3",
           "--max_new_tokens", "8", "--device", "cpu"]  # sampled: the tiny models greedily end at once

        def answer(model, env_extra, *extra):
            p = run(gen + ["--model_name_or_path", model] + list(extra), env_extra)
            return p.stdout if p.returncode == 0 else None, p

        want1, _ = answer(m1, {})
        want2, _ = answer(m2, {})
        got, p = answer("THUDM/tiny-glm", env)
        report("generate_by_name_loads_refs_main", got is not None and got == want1 and snap1 in p.stderr and want1 != want2,
               "%r %r %r %s" % (got, want1, want2, p.stderr[-400:]))
        got, p = answer("THUDM/tiny-glm", env, "--model_revision", "v2")
        report("model_revision_branch", got == want2 and snap2 in p.stderr, p.stderr[-400:])
        got, p = answer("THUDM/tiny-glm", env, "--model_revision", "c2" * 20)
        report("model_revision_commit", got == want2, p.stderr[-400:])
        # HF_HUB_CACHE before HF_HOME: a second cache whose main is the other model
        other = os.path.join(d, "other_cache")
        snapshot(other, "THUDM/tiny-glm", "c2" * 20, m2, ref="main")
        got, p = answer("THUDM/tiny-glm", {"HF_HOME": home, "HF_HUB_CACHE": other})
        report("hf_hub_cache_before_hf_home", got == want2, p.stderr[-400:])
        got, p = answer("THUDM/tiny-glm", {"XDG_CACHE_HOME": os.path.join(d, "xdg_none"), "HOME": d})
        report("xdg_cache_home_followed", got is None and os.path.join(d, "xdg_none", "huggingface", "hub") in p.stderr,
               p.stderr[-400:])
        # a folder of that relative path here comes first
        local = os.path.join(d, "cwd")
        os.makedirs(os.path.join(local, "THUDM"))
        shutil.copytree(m2, os.path.join(local, "THUDM", "tiny-glm"))
        p = run(gen + ["--model_name_or_path", "THUDM/tiny-glm"], env, cwd=local)
        report("local_folder_before_cache", p.returncode == 0 and p.stdout == want2 and "cache's snapshot" not in p.stderr,
               p.stderr[-400:])
        # refused: a name in no cache, a revision the cache lacks
        p = run(gen + ["--model_name_or_path", "THUDM/chatglm-6b"], env)
        report("missing_name_refused_with_download_hint", p.returncode != 0 and cache in p.stderr and
               "huggingface-cli download THUDM/chatglm-6b --local-dir" in p.stderr, p.stderr[-400:])
        p = run(gen + ["--model_name_or_path", "THUDM/tiny-glm", "--model_revision", "v9"], env)
        report("missing_revision_refused", p.returncode != 0 and "no snapshot of revision v9" in p.stderr and
               "--revision v9" in p.stderr, p.stderr[-400:])
        # a snapshot whose weights link to a blob that is gone (an unfinished or pruned download)
        broken = snapshot(cache, "THUDM/broken", "c5" * 20, m1, ref="main")
        for name in os.listdir(broken):
            if name.endswith(".safetensors"):
                os.remove(os.path.realpath(os.path.join(broken, name)))
        p = run(gen + ["--model_name_or_path", "THUDM/broken"], env)
        report("missing_blob_named", p.returncode != 0 and "which does not exist" in p.stderr and "fetch the model again" in p.stderr,
               p.stderr[-300:])
        p = run(gen + ["--model_name_or_path", "nowhere"], env)
        report("bare_word_keeps_loader_error", p.returncode != 0 and "Hugging Face cache" not in p.stderr, p.stderr[-300:])
        # training from the name: the same losses as from the folder, the snapshot recorded
        t_args = [a for a in base if a not in ("--init_from_config", cfg)]
        losses = []
        for name, model in (("folder", m1), ("hub", "THUDM/tiny-glm")):
            out = os.path.join(d, "t_" + name)
            p = run(["train"] + t_args + ["--model_name_or_path", model, "--output_dir", out, "--max_steps", "2",
                                          "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "2"], env)
            losses.append([r["loss"] for r in T.history(out) if "loss" in r] if p.returncode == 0 else p.stderr[-400:])
        args = json.load(open(os.path.join(d, "t_hub", "training_args.json"))) if os.path.exists(
            os.path.join(d, "t_hub", "training_args.json")) else {}
        report("train_by_name_equals_folder", len(losses[0]) == 2 and losses[0] == losses[1]
               and args.get("model_name_or_path") == snap1, "%s %s" % (losses, args.get("model_name_or_path")))
        # a LoRA adapter trained on the cache's model names its base as the Hub does, for other machines
        out = os.path.join(d, "t_lora")
        p = run(["train"] + t_args + ["--model_name_or_path", "THUDM/tiny-glm", "--output_dir", out, "--max_steps", "1",
                                      "--finetuning_type", "lora"], env)
        ac = os.path.join(out, "adapter_config.json")
        base_name = json.load(open(ac)).get("base_model_name_or_path") if p.returncode == 0 and os.path.exists(ac) else None
        report("adapter_names_its_base_by_repository", base_name == "THUDM/tiny-glm", "%s %s" % (base_name, p.stderr[-300:]))
        # the tokenizer alone, info and merge by name
        tok_repo = os.path.join(d, "tokonly")
        os.makedirs(tok_repo)
        shutil.copy(os.path.join(tok, "ice_text.model"), tok_repo)
        snapshot(cache, "someone/tok", "c3" * 20, tok_repo, ref="main")
        a = run(["tokenize", "--tokenizer", tok, "--text", "春风明月"], {})
        b = run(["tokenize", "--tokenizer", "someone/tok", "--text", "春风明月"], env)
        report("tokenize_by_name", a.returncode == 0 and a.stdout == b.stdout and a.stdout.strip(), b.stderr[-300:])
        p = run(["info", "--model_name_or_path", "THUDM/tiny-glm"], env)
        report("info_by_name", p.returncode == 0 and snap1 in p.stderr, p.stderr[-300:])
        # serve names the model by its repository (not the snapshot's commit), and takes an adapter of the cache
        snapshot(cache, "someone/tiny-lora", "c4" * 20, out, ref="main")
        try:
            import serve_common as sc
            sc.ENV.update(env)
            S = sc.Server("THUDM/tiny-glm", "--adapter", "someone/tiny-lora")
            st, b = sc.http(S.port, "GET", "/v1/models")
            S.stop()
            ids = sorted(m["id"] for m in b.get("data", [])) if st == 200 else []
            report("serve_names_the_repository", ids == ["THUDM/tiny-glm", "tiny-lora"], "%s %s" % (ids, S.text()[-300:]))
        except RuntimeError as e:
            report("serve_names_the_repository", False, str(e)[-400:])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
