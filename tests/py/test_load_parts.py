#!/usr/bin/env python3
"""Weights loading in parts (model/weights.c): a float tensor of the table's shape is read as its
stored bytes 64 MiB at a time and converted by the backend. Checked on a tied model whose
embedding (540,000 x 32 float32 = 69 MB) spans two parts, through a run that cannot change the
weights (learning rate 0: the saved model is the loaded one):
  - safetensors float32 and torch .bin float16 (one weight stored as a transposed, strided view,
    which is read whole) load to exactly the stored values;
  - a NaN in the embedding's second part is refused naming its element;
  - an lm_head copy that differs from word_embeddings only in the second part still gets the
    warning, an equal one none.
Prints PASS/FAIL/SKIP."""
import json, os, shutil, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train import GLM, make_tokenizer, piece_ids, write_config, write_data, train, skip, results
import test_train


def report(name, ok, detail=""):
    test_train.report(name, ok, "" if ok else detail)

V_BIG = 540000  # x hidden 32 x 4 bytes = 69.1 MB: past one 64 MiB part
WTE = "transformer.word_embeddings.weight"


def saved_model(out):
    from safetensors.numpy import load_file
    return load_file(os.path.join(out, "model.safetensors"))


def roundtrip(common, model, out):
    """train with learning rate 0 for one step: the model written is the model read."""
    return train(common + ["--model_name_or_path", model, "--output_dir", out, "--max_steps", "1", "--learning_rate", "0",
                           "--weight_decay", "0", "--save_strategy", "no"], check=False)


def main():
    if not os.path.exists(GLM):
        skip("load_parts_all", "%s not built" % GLM)
        return
    try:
        import numpy as np
        import torch
        from safetensors.numpy import save_file
    except ImportError as e:
        skip("load_parts_all", "needs numpy, torch and safetensors (%s)" % e)
        return
    if not shutil.which("spm_train"):
        skip("load_parts_all", "spm_train (Debian sentencepiece) not installed")
        return
    d = tempfile.mkdtemp(prefix="glmtrain-parts-")
    try:
        tok = make_tokenizer(d)
        ids, vocab = piece_ids(tok)
        cfg = write_config(d, ids, V_BIG)
        train_file, _ = write_data(d)
        common = ["--tokenizer_name", tok, "--train_file", train_file, "--per_device_train_batch_size", "1",
                  "--max_source_length", "16", "--max_target_length", "8", "--disable_tqdm"]
        base = os.path.join(d, "base")
        p = train(["--init_from_config", cfg] + common + ["--output_dir", base, "--max_steps", "1", "--save_strategy", "no"])
        w = saved_model(base)
        assert w[WTE].size * 4 > (64 << 20), "the embedding must span two parts"

        def folder(name, tensors, bin16=False, strided=None):
            f = os.path.join(d, name)
            os.makedirs(f, exist_ok=True)
            shutil.copy(os.path.join(base, "config.json"), f)
            if bin16:
                sd = {k: torch.from_numpy(v.astype(np.float16)) for k, v in tensors.items()}
                if strided:  # stored as the transpose of a contiguous tensor: a strided view in the file
                    sd[strided] = torch.from_numpy(tensors[strided].astype(np.float16).T.copy()).t()
                    assert not sd[strided].is_contiguous()
                torch.save(sd, os.path.join(f, "pytorch_model.bin"))
            else:
                save_file(tensors, os.path.join(f, "model.safetensors"))
            return f

        # float32 safetensors with lm_head equal to the embedding: exact, no warning
        t = dict(w)
        t["lm_head.weight"] = w[WTE].copy()
        out = os.path.join(d, "o-f32")
        p = roundtrip(common, folder("f32", t), out)
        got = saved_model(out) if p.returncode == 0 else {}
        bad = [k for k in w if k not in got or not np.array_equal(got[k], w[k])]
        report("parts_f32_safetensors_exact", p.returncode == 0 and not bad, (p.stderr[-400:] if p.returncode else str(bad[:3])))
        report("parts_equal_lm_head_no_warning", p.returncode == 0 and "differs from word_embeddings" not in p.stderr,
               p.stderr[-300:])

        # lm_head differing in the second part only
        t2 = dict(t)
        t2["lm_head.weight"] = w[WTE].copy()
        t2["lm_head.weight"].reshape(-1)[17000000] += 0.25
        p = roundtrip(common, folder("f32-head", t2), os.path.join(d, "o-head"))
        report("parts_lm_head_differing_late_warned", p.returncode == 0 and "differs from word_embeddings" in p.stderr,
               p.stderr[-300:])

        # NaN in the second part, named by its element
        t3 = dict(w)
        t3[WTE] = w[WTE].copy()
        t3[WTE].reshape(-1)[17000003] = np.nan
        p = roundtrip(common, folder("f32-nan", t3), os.path.join(d, "o-nan"))
        report("parts_nan_in_second_part_named", p.returncode != 0 and "tensor %s holds NaN at element 17000003" % WTE in p.stderr,
               p.stderr[-300:])

        # torch .bin float16, one weight a strided view
        sv = "transformer.layers.0.mlp.dense_h_to_4h.weight"
        out = os.path.join(d, "o-bin16")
        p = roundtrip(common, folder("bin16", w, bin16=True, strided=sv), out)
        got = saved_model(out) if p.returncode == 0 else {}
        bad = [k for k in w if k not in got or not np.array_equal(got[k], w[k].astype(np.float16).astype(np.float32))]
        report("parts_bin_fp16_with_strided_view_exact", p.returncode == 0 and not bad,
               (p.stderr[-400:] if p.returncode else str(bad[:3])))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
