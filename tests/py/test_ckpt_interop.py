#!/usr/bin/env python3
"""Checkpoint interop at the model level: files written by the real torch.save (single and
sharded with an index, fp16 and fp32, LayerNorm kept fp32 as in the original, shared storages
with offsets, the tied lm_head) load into the C model (tool_weights) to the same values as
safetensors; damaged or mismatched checkpoints give a clear error; `glmtrain convert` and
glm_model_export write HF folders that the Python safetensors package reads with the original
names and shapes, and export -> import -> export round-trips bit for bit.

Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("GLM_BUILD", "build")
TOOL = os.path.join(BUILD, "tests", "tool_weights")
GLM = os.path.join(BUILD, "glmtrain")
fails = 0


def check(name, cond, why=""):
    global fails
    print(("PASS %s" % name) if cond else ("FAIL %s: %s" % (name, why)))
    fails += 0 if cond else 1


def tool(*args):
    return subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True, errors="replace")


def load_c(cfg_dir, weights, tmp):
    """Parameters as the C model holds them after glm_model_load: {name: float32 array}."""
    import numpy as np
    out = os.path.join(tmp, "params.f32")
    p = tool("load", cfg_dir, weights, out)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip())
    flat = np.fromfile(out, dtype=np.float32)
    res, off = {}, 0
    for line in p.stdout.splitlines():
        name, shape = line.split("\t")
        shape = tuple(int(x) for x in shape.split(","))
        n = int(np.prod(shape))
        res[name] = flat[off:off + n].reshape(shape)
        off += n
    return res, p.stderr


def same(a, b):
    """Bitwise equality of two {name: array} maps (names of a)."""
    import numpy as np
    bad = [k for k in a if k not in b or a[k].shape != b[k].shape or
           not np.array_equal(a[k].view(np.uint32), np.ascontiguousarray(b[k], dtype=np.float32).view(np.uint32))]
    return bad


def convert(*args):
    return subprocess.run([GLM, "convert", *map(str, args)], capture_output=True, text=True, errors="replace")


def main():
    import numpy as np
    import torch
    import glm_ref
    from safetensors import safe_open

    if not os.path.exists(TOOL) or not os.path.exists(GLM):
        print("SKIP ckpt_interop: %s or %s not built" % (TOOL, GLM))
        return
    tmp = tempfile.mkdtemp(prefix="glm-ckpt-")
    try:
        cfg = glm_ref.load_config({"vocab_size": 40, "hidden_size": 16, "num_layers": 2, "num_attention_heads": 2,
                                   "inner_hidden_size": 32, "tie_word_embeddings": True, "bos_token_id": 35,
                                   "eos_token_id": 36, "mask_token_id": 33, "gmask_token_id": 34, "pad_token_id": 3})
        params = glm_ref.init_params(cfg, seed=1, std=0.5)
        ref = {k: v.numpy() for k, v in params.items()}
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        inv = (1.0 / (10000 ** (torch.arange(0, hd // 2, 2).float() / (hd // 2)))).half()

        def state_dict(half):
            """The original layout: fp16 matrices/biases (or fp32), fp32 LayerNorm, inv_freq buffers,
            lm_head sharing the embedding's storage."""
            sd = {}
            for k, v in params.items():
                sd[k] = v.clone() if ("layernorm" in k or not half) else v.half()
                if k.endswith("input_layernorm.bias"):
                    sd[k.replace("input_layernorm.bias", "attention.rotary_emb.inv_freq")] = inv.clone()
            sd["lm_head.weight"] = sd["transformer.word_embeddings.weight"]
            # a tensor that is a view at an offset into a larger storage
            big = torch.cat([torch.zeros(7, dtype=sd["transformer.final_layernorm.bias"].dtype),
                             sd["transformer.final_layernorm.bias"]])
            sd["transformer.final_layernorm.bias"] = big[7:]
            return sd

        def folder(name, config=cfg):
            d = os.path.join(tmp, name)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write(glm_ref.config_json(config))
            return d

        # A. safetensors fp32 (the reference) and B. torch.save single file fp32
        st_dir = folder("st")
        glm_ref.save_model_dir(st_dir, cfg, params)
        v_st, _ = load_c(st_dir, st_dir, tmp)
        check("load_safetensors_exact", not same(ref, v_st), "differs: %s" % same(ref, v_st)[:3])
        b32 = folder("bin32")
        torch.save(state_dict(False), os.path.join(b32, "pytorch_model.bin"))
        v, _ = load_c(b32, b32, tmp)
        check("load_torch_bin_fp32_equals_safetensors", not same(v_st, v), "differs: %s" % same(v_st, v)[:3])

        # C. fp16 sharded with an index, layers straddling shards, LayerNorm fp32
        b16 = folder("bin16")
        sd = state_dict(True)
        names = list(sd)
        cuts = [0, 5, len(names) - 9, len(names)]
        wm = {}
        for i in range(3):
            fn = "pytorch_model-%05d-of-00003.bin" % (i + 1)
            part = {k: sd[k] for k in names[cuts[i]:cuts[i + 1]]}
            torch.save(part, os.path.join(b16, fn))
            wm.update({k: fn for k in part})
        with open(os.path.join(b16, "pytorch_model.bin.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 12345}, "weight_map": wm}, f)
        v16, _ = load_c(b16, b16, tmp)
        want16 = {k: (params[k] if "layernorm" in k else params[k].half().float()).numpy() for k in params}
        check("load_torch_bin_fp16_sharded_index", not same(want16, v16), "differs: %s" % same(want16, v16)[:3])
        v16f, _ = load_c(b16, os.path.join(b16, "pytorch_model.bin.index.json"), tmp)
        check("load_torch_bin_by_index_file", not same(want16, v16f), "differs")

        # D. lm_head: an untied model takes it; a tied model keeps word_embeddings and warns
        cfg_u = dict(cfg, tie_word_embeddings=False)
        ud = folder("untied", cfg_u)
        sdu = state_dict(False)
        head = torch.randn(cfg["vocab_size"], cfg["hidden_size"]) * 0.3
        sdu["lm_head.weight"] = head
        torch.save(sdu, os.path.join(ud, "pytorch_model.bin"))
        vu, _ = load_c(ud, ud, tmp)
        check("untied_model_takes_lm_head", not same({"lm_head.weight": head.numpy()}, vu), "lm_head differs")
        vt, err = load_c(b32, ud, tmp)
        check("tied_model_keeps_word_embeddings_and_warns",
              not same(v_st, vt) and "differs from word_embeddings" in err, "stderr: %s" % err.strip()[-300:])
        p = tool("load", ud, st_dir, os.path.join(tmp, "x.f32"))
        print("  e.g.", p.stderr.strip().replace("\n", " / "))
        check("untied_model_without_lm_head_fails", p.returncode == 1 and "lm_head.weight is missing" in p.stderr,
              p.stderr.strip()[-300:])

        # E. damaged and mismatched checkpoints: exit 1 with a message naming the problem
        bad = folder("bad_trunc")
        shutil.copy(os.path.join(b32, "pytorch_model.bin"), bad)
        fb = os.path.join(bad, "pytorch_model.bin")
        data = open(fb, "rb").read()
        open(fb, "wb").write(data[:len(data) // 2])
        p = tool("load", bad, bad, os.path.join(tmp, "x.f32"))
        check("truncated_bin_clear_error", p.returncode == 1 and "pytorch_model.bin" in p.stderr and "error:" in p.stderr,
              "rc %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
        bad = folder("bad_index")
        shutil.copy(os.path.join(b16, "pytorch_model.bin.index.json"), bad)
        for fn in ["pytorch_model-00001-of-00003.bin", "pytorch_model-00002-of-00003.bin"]:
            shutil.copy(os.path.join(b16, fn), bad)
        p = tool("load", bad, bad, os.path.join(tmp, "x.f32"))
        check("index_with_missing_shard_clear_error", p.returncode == 1 and "00003" in p.stderr,
              "rc %d: %s" % (p.returncode, p.stderr.strip()[-300:]))
        bad = folder("bad_missing")
        sdm = state_dict(False)
        del sdm["transformer.layers.1.mlp.dense_4h_to_h.weight"]
        torch.save(sdm, os.path.join(bad, "pytorch_model.bin"))
        p = tool("load", bad, bad, os.path.join(tmp, "x.f32"))
        check("missing_tensor_named", p.returncode == 1 and "transformer.layers.1.mlp.dense_4h_to_h.weight is missing" in p.stderr,
              p.stderr.strip()[-300:])
        wide = folder("bad_shape", dict(cfg, inner_hidden_size=48))
        p = tool("load", wide, b32, os.path.join(tmp, "x.f32"))
        check("shape_mismatch_named", p.returncode == 1 and "dense_h_to_4h" in p.stderr, p.stderr.strip()[-300:])
        p = tool("load", folder("empty"), folder("empty"), os.path.join(tmp, "x.f32"))
        check("folder_without_weights_clear_error", p.returncode == 1 and "no model weights" in p.stderr, p.stderr.strip()[-300:])

        # F. convert the fp16 sharded .bin to fp16 safetensors shards: original names, shapes, bits
        with open(os.path.join(b16, "tokenizer_config.json"), "w") as f:
            f.write('{"name_or_path": "test"}\n')
        open(os.path.join(b16, "ice_text.model"), "wb").write(b"not really a model")
        out1, out2 = os.path.join(tmp, "out1"), os.path.join(tmp, "out2")
        p = convert("--from", b16, "--to", out1, "--dtype", "float16", "--max_shard_size", "3000")
        check("convert_runs", p.returncode == 0, p.stderr.strip()[-500:])
        index = json.load(open(os.path.join(out1, "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
        got, shapes, total = {}, {}, 0
        for fn in files:
            with safe_open(os.path.join(out1, fn), framework="pt") as f:
                for k in f.keys():
                    got[k] = f.get_tensor(k)
                    total += got[k].numel() * got[k].element_size()
        check("export_original_names_and_shapes", {k: tuple(v.shape) for k, v in got.items()} ==
              {k: tuple(v.shape) for k, v in sd.items()}, "names %s" % sorted(set(got) ^ set(sd)))
        check("export_sharded_index", len(files) > 2 and set(index["weight_map"]) == set(got) and
              index["metadata"]["total_size"] == total and files[0] == "model-00001-of-%05d.safetensors" % len(files),
              "files %s total %s vs %d" % (files, index["metadata"].get("total_size"), total))
        bad = [k for k in sd if got.get(k) is None or got[k].dtype != torch.float16 or
               not torch.equal(got[k].view(torch.int16), sd[k].half().contiguous().view(torch.int16))]
        check("export_fp16_bits_equal_source", not bad, "differ: %s" % bad[:4])
        cj = json.load(open(os.path.join(out1, "config.json")))
        check("export_config_and_tokenizer_files", cj["torch_dtype"] == "float16" and cj["hidden_size"] == 16 and
              os.path.exists(os.path.join(out1, "ice_text.model")) and
              os.path.exists(os.path.join(out1, "tokenizer_config.json")), str(cj))

        # G. export -> import -> export is bit-exact; the import equals the source values
        p = convert("--from", out1, "--to", out2, "--dtype", "float16", "--max_shard_size", "3000")
        diff = [fn for fn in files + ["model.safetensors.index.json"]
                if p.returncode != 0 or open(os.path.join(out1, fn), "rb").read() != open(os.path.join(out2, fn), "rb").read()]
        check("export_import_export_bit_exact", p.returncode == 0 and not diff, "rc %d, differ: %s %s" % (p.returncode, diff, p.stderr[-300:]))
        v1, _ = load_c(out1, out1, tmp)
        want1 = {k: params[k].half().float().numpy() for k in params}
        check("exported_fp16_loads_into_model", not same(want1, v1), "differs: %s" % same(want1, v1)[:3])

        # H. fp32 and bf16 from safetensors; glm_model_export from the model, one file
        o32, obf, oex = os.path.join(tmp, "o32"), os.path.join(tmp, "obf"), os.path.join(tmp, "oex")
        p = convert("--from", st_dir, "--to", o32, "--dtype", "float32", "--max_shard_size", "0")
        v32, _ = load_c(o32, o32, tmp) if p.returncode == 0 else ({}, "")
        check("convert_fp32_round_trip_exact", p.returncode == 0 and not same(ref, v32), p.stderr.strip()[-300:])
        p = convert("--from", st_dir, "--to", obf, "--dtype", "bfloat16", "--original_layout", "false")
        ok = p.returncode == 0
        if ok:
            with safe_open(os.path.join(obf, "model.safetensors"), framework="pt") as f:
                gb = {k: f.get_tensor(k) for k in f.keys()}
            ok = set(gb) == set(params) and all(
                torch.equal(gb[k].view(torch.int16), params[k].to(torch.bfloat16).view(torch.int16)) for k in params)
        check("convert_bf16_round_to_nearest_even", ok, p.stderr.strip()[-300:])
        p = tool("export", st_dir, st_dir, oex, "F32", 0, 1)
        vex, _ = load_c(oex, oex, tmp) if p.returncode == 0 else ({}, "")
        ok = p.returncode == 0 and not same(ref, vex)
        if ok:
            with safe_open(os.path.join(oex, "model.safetensors"), framework="pt") as f:
                ok = torch.equal(f.get_tensor("lm_head.weight"), params["transformer.word_embeddings.weight"]) and \
                     torch.equal(f.get_tensor("transformer.layers.0.attention.rotary_emb.inv_freq"), inv.float())
        check("model_export_round_trip_with_tied_head_and_inv_freq", ok, p.stderr.strip()[-300:])

        # I. refusals
        p = convert("--from", st_dir, "--to", o32, "--dtype", "float32")
        check("convert_refuses_existing_weights", p.returncode == 1 and "overwrite_output_dir" in p.stderr, p.stderr[-300:])
        p = convert("--from", st_dir, "--to", st_dir, "--dtype", "float32", "--overwrite_output_dir")
        check("convert_refuses_same_folder", p.returncode == 1 and "same folder" in p.stderr, p.stderr[-300:])
        p = convert("--from", st_dir, "--to", o32, "--dtype", "int8")
        check("convert_bad_dtype_flag", p.returncode != 0 and "dtype" in p.stderr, p.stderr[-300:])
        # a weight past float16's range (1e6) converted to float16 would become inf: refused, no weight file,
        # and bfloat16 (float32's range) writes it
        big = os.path.join(tmp, "big_src")
        shutil.copytree(o32, big)
        from safetensors.numpy import load_file as np_load, save_file as np_save
        wf = [f for f in os.listdir(big) if f.endswith(".safetensors")]
        t = np_load(os.path.join(big, wf[0]))
        k = sorted(n for n in t if n.endswith("dense_4h_to_h.weight"))[0]
        t[k] = t[k].copy()
        t[k].flat[3] = 1e6
        np_save(t, os.path.join(big, wf[0]), metadata={"format": "pt"})
        o16 = os.path.join(tmp, "big16")
        p = convert("--from", big, "--to", o16, "--dtype", "float16")
        check("convert_refuses_float16_overflow", p.returncode != 0 and "past float16's range" in p.stderr and k in p.stderr and
              not any(f.endswith(".safetensors") for f in (os.listdir(o16) if os.path.isdir(o16) else [])), p.stderr[-300:])
        p = convert("--from", big, "--to", os.path.join(tmp, "bigbf"), "--dtype", "bfloat16")
        check("convert_bfloat16_keeps_the_big_weight", p.returncode == 0, p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL ckpt_interop: %s" % e)
        sys.exit(1)
    sys.exit(1 if fails else 0)
