#!/usr/bin/env python3
"""Issue 17 end to end: quantized base weights through the glmtrain CLI, against the PyTorch
references of tests/py/quant_ref.py and tests/py/glm_ref.py, and through transformers with our
THUDM-style stand-in code (tests/py/thudm_standin, which quantizes as THUDM's quantization.py).

The source is a THUDM-download-shaped float folder (test_folder_interop.make_source: fp16
torch.save shards, LayerNorm fp32, our stand-in code, hidden 64, 2 layers). Checks:
  (a) THUDM's chatglm-6b-int4/int8 layout written by quant_ref.write_thudm_quantized_folder
      (config.json + "quantization_bit", one torch .bin with int8 weight + fp16 weight_scale)
      loads in glmtrain: `generate --do_sample false` gives glm_ref's greedy tokens on the
      dequantized weights; it loads in transformers through the stand-in with glm_ref's logits;
      and the stand-in's own model.quantize(bits) of the float source gives quant_ref's bytes;
  (b) `glmtrain quantize --quantization_bit 4|8` (sharded by --max_shard_size): config.json is
      the source's (key order, values) plus quantization_bit with torch_dtype float16; each
      quantized linear is `.weight` I8 [OC, C] / [OC, C/2] and `.weight_scale` F16 [OC] equal to
      quant_ref's quantization of the source bit for bit; every other tensor F16 and equal to
      `glmtrain convert`'s fp16 export of the source (same names: lm_head copy, inv_freq);
      the code and tokenizer files copied; the index covers the shards;
  (c) that output loads with AutoModel.from_pretrained(trust_remote_code=True) (the stand-in):
      logits equal glm_ref's on the dequantized weights, greedy tokens equal glmtrain's;
  (d) `glmtrain quantize` of that quantized folder again: byte-identical tensors;
  (e) quantize-at-load: `generate --quantization_bit 4|8` on the float source gives glm_ref's
      tokens on quant_ref's dequantization (and INT4 changes glm_ref's tokens on some prompt, so
      equal tokens prove something);
      `--quantization_bit 4 --quantization_type nf4` gives glm_ref's tokens on NF4-dequantized
      weights. The quantized folder's tokens equal those of its fp16 source (`glmtrain convert`
      of the source: a quantized folder keeps LayerNorm in fp16, the download has it in fp32)
      quantized at load, and LoRA training on the INT4 folder logs the losses of LoRA training on
      that fp16 source with --quantization_bit 4; `chat` (fed by a pipe) gives generate's tokens
      on the INT4 folder and with NF4 at load; `merge --quantization_bit 4` of that LoRA adapter
      is quant_ref's INT4 of `merge --dtype float32`, and loads with glm_ref's greedy tokens;
  (f) errors: --quantization_bit 3 (generate and quantize) names the flag; train
      --finetuning_type full --quantization_bit 4 is refused; --quantization_bit 8 on an int4
      folder names both; quantize --quantization_type nf4 is refused: each exits non-zero with
      an error message, without a crash or traceback.
Until glmtrain has them, the checks print SKIP naming what is missing: the `quantize` command
(`glmtrain quantize --help` fails) and the load flags (`glmtrain generate --help` lacks
--quantization_bit). Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Checks  # noqa: E402

BUILD = os.environ.get("GLM_BUILD", "build")
GLM = os.path.join(BUILD, "glmtrain")
ENV = dict(os.environ, OMP_NUM_THREADS="1")
PROMPTS = ["the quick brown fox", "故人", "山水", "明月 江南"]
SHARD = "20KB"
SHARD_BYTES = 20000

c = Checks()


def run_glm(*args, timeout=300):
    return subprocess.run([GLM, *map(str, args)], capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=ENV)


def crashed(p):
    """Why p looks like a crash rather than a clean error (None when it does not)."""
    text = p.stdout + p.stderr
    if p.returncode < 0 or p.returncode in (134, 136, 139):
        return "killed by a signal (exit %d)" % p.returncode
    for pat in ("Traceback", "Segmentation fault", "AddressSanitizer", "core dumped", "Assertion"):
        if pat in text:
            return "output has %r" % pat
    return None


def error_lines(p, strip=()):
    """stderr's error: / hint: lines (the paths given replaced, so digits in temp names do not
    count); empty when it has none."""
    text = p.stderr
    for s in strip:
        text = text.replace(s, "<dir>")
    return "\n".join(l for l in text.splitlines() if l.startswith(("error", "hint"))).strip()


# ---------------------------------------------------------------------------------------------
# The source folder (test_folder_interop's THUDM-shaped download, hidden 64)

def make_source(d):
    import test_folder_interop as tfi
    import test_train as tt
    orig = tfi.source_config_text

    def bigger(ids, vocab):
        return orig(ids, vocab).replace('"hidden_size": 32', '"hidden_size": 64').replace(
            '"inner_hidden_size": 64', '"inner_hidden_size": 128')
    tfi.source_config_text = bigger
    try:
        tok = tt.make_tokenizer(d)
        src, cfg = tfi.make_source(d, tok)
    finally:
        tfi.source_config_text = orig
    assert cfg["hidden_size"] == 64
    return src, cfg


def source_state(src):
    """The source's tensors as stored (fp16, LayerNorm fp32)."""
    import torch
    sd = {}
    for fn in sorted(glob.glob(os.path.join(src, "pytorch_model-*.bin"))):
        sd.update(torch.load(fn))
    return sd


def float_params(sd):
    return {k: v.float() for k, v in sd.items()}


def st_tensors(folder):
    """{name: (dtype, shape, raw bytes)} of a folder's safetensors, read by hand."""
    import struct
    out = {}
    for fn in sorted(glob.glob(os.path.join(folder, "model*.safetensors"))):
        with open(fn, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            head = json.loads(f.read(n))
            body = f.read()
        for k, v in head.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            out[k] = (v["dtype"], tuple(v["shape"]), body[a:b])
    return out


def torch_of(entry):
    """A tensor from st_tensors' (dtype, shape, bytes)."""
    import numpy as np
    import torch
    dt, shape, raw = entry
    npdt = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "U8": np.uint8, "I64": np.int64, "I32": np.int32}[dt]
    return torch.from_numpy(np.frombuffer(raw, dtype=npdt).copy().reshape(shape))


def raw_of(t):
    return t.detach().contiguous().reshape(-1).numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# glm_ref's greedy tokens, glmtrain's

def ref_greedy(cfg, params, ids, n):
    import torch
    import glm_ref
    seq, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(glm_ref.forward(cfg, params, torch.tensor([seq]))["logits"][0, -1].argmax())
            if nxt == cfg["eos_token_id"]:
                break
            out.append(nxt)
            seq.append(nxt)
    return out


def generate_all(folder, extra=()):
    """[(prompt ids, greedy tokens cut at eos)] of glmtrain generate on every prompt, or raises."""
    import test_folder_interop as tfi
    runs = []
    for pr in PROMPTS:
        ids, resp = tfi.glm_generate(folder, list(extra), pr)
        runs.append((ids, tfi.greedy_of(resp, CFG["eos_token_id"])))
    return runs


def check_tokens_vs_ref(name, runs, params, also_differs_from=None):
    """glmtrain's greedy tokens on every prompt equal glm_ref's on params; with also_differs_from
    (other params, e.g. the float source), glm_ref's tokens on params must differ from those on
    it for some prompt, else equal tokens could not tell a run that ignored the quantization."""
    import test_folder_interop as tfi
    want = [ref_greedy(CFG, params, ids, tfi.NEW_TOKENS) for ids, _ in runs]
    bad = ["%r: glmtrain %s, glm_ref %s" % (pr, g, w) for pr, (_, g), w in zip(PROMPTS, runs, want) if g != w]
    why = "; ".join(bad)
    ok = not bad
    if also_differs_from is not None and ok:
        base = [ref_greedy(CFG, also_differs_from, ids, tfi.NEW_TOKENS) for ids, _ in runs]
        if base == want:
            ok, why = False, "glm_ref's tokens are the same with and without the quantization on every prompt: proves nothing"
    return c.check(name, ok, why)


# ---------------------------------------------------------------------------------------------
# transformers through the stand-in, all folders in one child process

HF_CHILD = r"""
import json, os, sys, torch
_baddbmm = torch.baddbmm
def baddbmm(input, b1, b2, *, beta=1, alpha=1, out=None):
    if beta == 0 and out is None:
        return torch.bmm(b1, b2) * alpha
    return _baddbmm(input, b1, b2, beta=beta, alpha=alpha, out=out)
torch.baddbmm = baddbmm
from transformers import AutoModel, AutoTokenizer
jobs, n = json.loads(sys.argv[1]), int(sys.argv[2])
for job in jobs:
    try:
        tok = AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=True)
        model = AutoModel.from_pretrained(job["folder"], trust_remote_code=True)
        if job.get("quantize"):
            model = model.half().quantize(job["quantize"])  # as THUDM's README: model.half().quantize(4)
        if job.get("save"):
            torch.save({k: v for k, v in model.state_dict().items()
                        if k.endswith(".weight_scale") or v.dtype == torch.int8}, job["save"])
        model = model.float().eval()
        eos = model.config.eos_token_id
        rows = []
        with torch.no_grad():
            for prompt in job["prompts"]:
                ids = tok(prompt)["input_ids"]
                seq, greedy = list(ids), []
                for _ in range(n):
                    nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                    if nxt == eos:
                        break
                    greedy.append(nxt)
                    seq.append(nxt)
                rows.append({"ids": ids, "greedy": greedy})
            logits = model(torch.tensor([rows[0]["ids"]])).logits[0]
        res = {"class": type(model).__name__, "rows": rows, "logits": logits.tolist(),
               "linear_class": type(model.transformer.layers[0].attention.query_key_value).__name__}
    except Exception as e:
        import traceback
        res = {"error": "%s: %s" % (type(e).__name__, e), "trace": traceback.format_exc()[-1500:]}
    print("RESULT " + json.dumps(res), flush=True)
"""


def hf_jobs(jobs, tmp):
    """Runs the jobs ({"folder", "prompts", "quantize": bits or None, "save": path or None}) in one
    fresh offline process; returns a result dict per job (with "error" when one failed)."""
    import test_folder_interop as tfi
    home = tempfile.mkdtemp(prefix="hf-", dir=tmp)
    env = dict(ENV, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=home,
               HF_MODULES_CACHE=os.path.join(home, "modules"), TRANSFORMERS_VERBOSITY="error")
    p = subprocess.run([sys.executable, "-c", HF_CHILD, json.dumps(jobs), str(tfi.NEW_TOKENS)],
                       capture_output=True, text=True, timeout=400, env=env)
    res = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if len(res) != len(jobs):
        lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
        err = "transformers child died (exit %d): %s" % (p.returncode, (lines[-1] if lines else "no output")[-600:])
        res += [{"error": err}] * (len(jobs) - len(res))
    return res


def check_hf_result(name, r, params, runs=None, rtol=1e-4):
    """The child's result for one folder: it loaded with QuantizedLinear, its logits equal
    glm_ref's on params, and its greedy tokens equal glmtrain's runs (when given)."""
    import torch
    import glm_ref
    if not c.check(name + "_transformers_load", "error" not in r and r.get("class") == "ChatGLMForConditionalGeneration"
                   and r.get("linear_class") == "QuantizedLinear",
                   r.get("error", "") + " " + r.get("trace", "")[-600:] if "error" in r
                   else "class %s, linear %s" % (r.get("class"), r.get("linear_class"))):
        return
    ids = r["rows"][0]["ids"]
    ref = glm_ref.forward(CFG, params, torch.tensor([ids]))["logits"][0]
    got = torch.tensor(r["logits"])
    err = float((got - ref).abs().max()) / max(float(ref.abs().max()), 1e-30) if got.shape == ref.shape else float("inf")
    c.check(name + "_transformers_logits", err <= rtol,
            "shape %s vs %s, max error %.3g of max |logit| (limit %g)" % (tuple(got.shape), tuple(ref.shape), err, rtol))
    if runs is not None:
        bad = ["%r: transformers %s, glmtrain %s" % (pr, row["greedy"], g) for pr, row, (_, g) in zip(PROMPTS, r["rows"], runs)
               if row["greedy"] != g]
        tok_bad = [pr for pr, row, (ids_g, _) in zip(PROMPTS, r["rows"], runs) if row["ids"] != ids_g]
        c.check(name + "_transformers_greedy", not bad and not tok_bad, "; ".join(bad) or "prompt ids differ on %s" % tok_bad)


# ---------------------------------------------------------------------------------------------
# The checks

def check_thudm_folders(src, sd, tmp, have_load, have_hf):
    """(a): quant_ref's THUDM-layout folders in glmtrain and transformers; the stand-in's quantize."""
    import quant_ref as qr
    out = {}
    jobs = []
    for bits in (4, 8):
        tag = "thudm_int%d" % bits
        qdir = os.path.join(tmp, tag)
        qsd = qr.write_thudm_quantized_folder(src, qdir, bits)
        params = qr.dequantized_params(qsd, bits)
        out[bits] = (qdir, params, qsd)
        jobs.append({"folder": qdir, "prompts": PROMPTS})
    for bits in (4, 8):
        jobs.append({"folder": src, "prompts": PROMPTS[:1], "quantize": bits,
                     "save": os.path.join(tmp, "standin_quantize_%d.pt" % bits)})
    runs = {}
    for bits in (4, 8):
        tag = "thudm_int%d" % bits
        qdir, params, _ = out[bits]
        if not have_load:
            c.skip(tag + "_loads_in_glmtrain", have_load_why())
            continue
        try:
            runs[bits] = generate_all(qdir)
            c.check(tag + "_loads_in_glmtrain", True)
        except Exception as e:
            c.check(tag + "_loads_in_glmtrain", False, str(e))
            continue
        check_tokens_vs_ref(tag + "_greedy_equals_glm_ref_dequantized", runs[bits], params)
    if not have_hf:
        c.skip("thudm_folders_transformers", have_hf_why(have_hf))
        return out
    res = hf_jobs(jobs, tmp)
    for i, bits in enumerate((4, 8)):
        check_hf_result("thudm_int%d" % bits, res[i], out[bits][1], runs.get(bits))
    # the stand-in's model.half().quantize(bits): quant_ref's bytes
    import torch
    for j, bits in enumerate((4, 8)):
        r = res[2 + j]
        name = "standin_quantize_int%d_equals_quant_ref" % bits
        if "error" in r:
            c.check(name, False, r["error"] + " " + r.get("trace", "")[-600:])
            continue
        saved = torch.load(os.path.join(tmp, "standin_quantize_%d.pt" % bits))
        qsd = out[bits][2]
        want = {k: v for k, v in qsd.items() if k.endswith(".weight_scale") or v.dtype == torch.int8}
        bad = sorted(k for k in want if k not in saved or saved[k].dtype != want[k].dtype or raw_of(saved[k]) != raw_of(want[k]))
        c.check(name, not bad and sorted(saved) == sorted(want), "differ: %s; names %s vs %s" % (bad[:4], sorted(saved)[:3], sorted(want)[:3]))
    return out


def check_quantize_output(tag, q, src, sd, bits, conv):
    """(b): the folder `glmtrain quantize` wrote."""
    import test_folder_interop as tfi
    import quant_ref as qr
    # code, tokenizer and generation files
    pys = sorted(os.path.basename(p) for p in glob.glob(os.path.join(src, "*.py")))
    files = pys + ["ice_text.model", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]
    bad = [f for f in files if not os.path.isfile(os.path.join(q, f)) or not tfi.same_bytes(os.path.join(src, f), os.path.join(q, f))]
    c.check(tag + "_code_and_tokenizer_files", pys and not bad, "missing or changed: %s (folder holds %s)" % (bad, sorted(os.listdir(q))))
    # config.json: the source's keys in order with their values, torch_dtype float16, quantization_bit
    sp = tfi.raw_pairs(open(os.path.join(src, "config.json")).read())
    op = tfi.raw_pairs(open(os.path.join(q, "config.json")).read())
    od = dict(op)
    changed = ["%s: %s -> %s" % (k, json.dumps(v), json.dumps(od.get(k))) for k, v in sp if k != "torch_dtype" and od.get(k) != v]
    order = [k for k, _ in op if k in dict(sp)]
    c.check(tag + "_config_is_source_config", not changed and order == [k for k, _ in sp],
            "changed or dropped: %s; order %s" % (changed, order))
    c.check(tag + "_config_quantization_bit", od.get("quantization_bit") == ("num", str(bits)) and od.get("torch_dtype") == "float16",
            "quantization_bit %r, torch_dtype %r" % (od.get("quantization_bit"), od.get("torch_dtype")))
    # the tensors
    got = st_tensors(q)
    ref_other = st_tensors(conv)
    want_names = set(ref_other) | {k[:-len("weight")] + "weight_scale" for k in ref_other if qr.is_quantized_name(k)}
    c.check(tag + "_tensor_names", set(got) == want_names,
            "extra %s, missing %s" % (sorted(set(got) - want_names)[:4], sorted(want_names - set(got))[:4]))
    bad_q, bad_o = [], []
    for k in sorted(got):
        dt, shape, raw = got[k]
        if qr.is_quantized_name(k):
            wq, ws = qr.thudm_quantize(sd[k].float(), bits)
            if dt != "I8" or shape != tuple(wq.shape) or raw != raw_of(wq):
                bad_q.append("%s %s%s (want I8%s)" % (k, dt, list(shape), list(wq.shape)))
            sk = k[:-len("weight")] + "weight_scale"
            if sk in got:
                sdt, sshape, sraw = got[sk]
                if sdt != "F16" or sshape != (wq.shape[0],) or sraw != raw_of(ws):
                    bad_q.append("%s %s%s" % (sk, sdt, list(sshape)))
        elif not k.endswith(".weight_scale") and k in ref_other:
            if got[k] != ref_other[k] or dt != "F16":
                bad_o.append("%s %s%s (convert: %s%s)" % (k, dt, list(shape), ref_other[k][0], list(ref_other[k][1])))
    c.check(tag + "_quantized_tensors_equal_quant_ref", not bad_q, "; ".join(bad_q[:4]))
    c.check(tag + "_other_tensors_fp16_as_convert", not bad_o, "; ".join(bad_o[:4]))
    # shards and index
    stf = sorted(os.path.basename(p) for p in glob.glob(os.path.join(q, "model*.safetensors")))
    ix = os.path.join(q, "model.safetensors.index.json")
    ok, why = os.path.isfile(ix) and len(stf) > 1, "files %s, index %s" % (stf, os.path.isfile(ix))
    if ok:
        wm = json.load(open(ix)).get("weight_map", {})
        in_files = {k: fn for fn in stf for k in tfi.st_header(os.path.join(q, fn)) if k != "__metadata__"}
        ok = wm == in_files
        why = "weight_map of %d tensors vs %d in the files" % (len(wm), len(in_files))
        over = [fn for fn in stf if os.path.getsize(os.path.join(q, fn)) > SHARD_BYTES + 4096
                and len(tfi.st_header(os.path.join(q, fn))) > 2]
        ok = ok and not over
        why += "; over %s: %s" % (SHARD, over)
    c.check(tag + "_sharded_with_index", ok, why)
    heads = [tfi.st_header(os.path.join(q, fn)) for fn in stf]
    c.check(tag + "_safetensors_metadata", heads and all(h.get("__metadata__") == {"format": "pt"} for h in heads),
            "%s" % [h.get("__metadata__") for h in heads])
    return got


def dequantized_of(tensors, bits):
    """float32 params of a quantized folder's tensors (st_tensors' entries)."""
    import quant_ref as qr
    qsd = {k: torch_of(v) for k, v in tensors.items()}
    return qr.dequantized_params(qsd, bits)


def check_errors(src, q4, have_quantize, have_load, tmp, train_flags):
    """(f)"""
    cases = []
    if have_load:
        cases += [
            ("error_generate_quantization_bit_3", ["generate", "--model_name_or_path", src, "--prompt", "hi",
                                                   "--device", "cpu", "--quantization_bit", "3"], ["--quantization_bit"], [src]),
            ("error_train_full_with_quantization", ["train", "--model_name_or_path", src, "--output_dir", os.path.join(tmp, "e_full"),
                                                     "--finetuning_type", "full", "--quantization_bit", "4", "--max_steps", "1",
                                                     *train_flags], ["quantization_bit"], [src]),
        ]
        if q4:
            cases.append(("error_int8_flag_on_int4_folder", ["generate", "--model_name_or_path", q4, "--prompt", "hi",
                                                             "--device", "cpu", "--quantization_bit", "8"], ["4", "8"], [q4]))
    else:
        c.skip("errors_load_flags", have_load_why())
    if have_quantize:
        cases += [
            ("error_quantize_quantization_bit_3", ["quantize", "--model_name_or_path", src, "--output_dir", os.path.join(tmp, "e_q3"),
                                                    "--quantization_bit", "3"], ["--quantization_bit"], [src, tmp]),
            ("error_quantize_nf4_refused", ["quantize", "--model_name_or_path", src, "--output_dir", os.path.join(tmp, "e_nf4"),
                                             "--quantization_bit", "4", "--quantization_type", "nf4"], ["nf4"], [src, tmp]),
        ]
    else:
        c.skip("errors_quantize", have_quantize_why())
    for name, args, words, paths in cases:
        p = run_glm(*args)
        msg = error_lines(p, paths)
        why = crashed(p)
        ok = p.returncode != 0 and why is None and msg and all(w in msg for w in words)
        if c.check(name, ok, "exit %d; %s; stderr: %s" % (p.returncode, why or "no crash", msg[-500:])):
            print("#   %s" % msg.replace("\n", " | ")[:300])


def chat_tokens(model, prompt, extra=()):
    """The first response's token ids of `glmtrain chat --do_sample false --debug`, fed by a pipe."""
    import test_folder_interop as tfi
    p = subprocess.run([GLM, "chat", "--model_name_or_path", model, "--do_sample", "false", "--max_new_tokens",
                        str(tfi.NEW_TOKENS), "--debug", "--device", "cpu", *extra], input=prompt + "\nexit\n",
                       capture_output=True, text=True, errors="replace", timeout=120, env=ENV)
    if p.returncode != 0 or crashed(p):
        raise RuntimeError("glmtrain chat failed (%d): %s" % (p.returncode, p.stderr[-600:]))
    toks = [int(x) for x in re.findall(r"\[debug\] token (\d+)", p.stdout + p.stderr)]
    eos = CFG["eos_token_id"]
    return toks[:toks.index(eos)] if eos in toks else toks


def check_merge_quantized(base, lora, tmp):
    """merge --quantization_bit 4 = quant_ref's INT4 of merge --dtype float32, tensor for tensor."""
    import quant_ref as qr
    m32, m4 = os.path.join(tmp, "merged_f32"), os.path.join(tmp, "merged_int4")
    p = run_glm("merge", "--model_name_or_path", base, "--adapter", lora, "--output_dir", m32, "--dtype", "float32")
    p4 = run_glm("merge", "--model_name_or_path", base, "--adapter", lora, "--output_dir", m4, "--dtype", "float32",
                 "--quantization_bit", "4")
    if not c.check("merge_quantized_runs", p.returncode == 0 and p4.returncode == 0,
                   "float32 merge exit %d, --quantization_bit 4 exit %d: %s" % (p.returncode, p4.returncode, (p.stderr + p4.stderr)[-800:])):
        return
    f, q = st_tensors(m32), st_tensors(m4)
    cfg = json.load(open(os.path.join(m4, "config.json")))
    c.check("merge_quantized_config", cfg.get("quantization_bit") == 4, "quantization_bit %r" % cfg.get("quantization_bit"))
    bad = []
    for k, v in f.items():
        if qr.is_quantized_name(k):
            wq, ws = qr.thudm_quantize(torch_of(v).float(), 4)
            sk = k[:-len("weight")] + "weight_scale"
            if q.get(k, (None, None, None))[2] != raw_of(wq) or q.get(k)[0] != "I8" or sk not in q or q[sk][2] != raw_of(ws):
                bad.append(k)
        elif q.get(k) != v:
            bad.append(k)
    extra = sorted(set(q) - set(f) - {k[:-len("weight")] + "weight_scale" for k in f if qr.is_quantized_name(k)})
    c.check("merge_quantized_equals_quant_ref_of_float_merge", not bad and not extra, "differ: %s; extra %s" % (bad[:4], extra[:4]))
    try:
        runs = generate_all(m4)
        check_tokens_vs_ref("merge_quantized_greedy_equals_glm_ref", runs, dequantized_of(q, 4))
    except Exception as e:
        c.check("merge_quantized_greedy_equals_glm_ref", False, str(e))


def check_two_ranks(q4, tmp, train_flags):
    import mpi_runs as M
    if not q4 or not shutil.which("mpirun"):
        c.skip("train_lora_int4_2ranks", "mpirun (OpenMPI) not installed" if q4 else "no INT4 folder")
        return
    flags = [f for f in train_flags]
    i = flags.index("--per_device_train_batch_size")
    got = {}
    for np_, bs, acc in ((1, "2", "2"), (2, "2", "1")):
        flags[i + 1] = bs
        out = os.path.join(tmp, "lora_int4_np%d" % np_)
        p = M.run(["--model_name_or_path", q4, "--output_dir", out, "--finetuning_type", "lora", "--lora_dropout", "0",
                   "--max_steps", "3", "--gradient_accumulation_steps", acc] + flags, np=np_, check=False, timeout=300)
        if any(x in p.stdout + p.stderr for x in M.NO_MPI):
            c.skip("train_lora_int4_2ranks", "glmtrain built without MPI")
            return
        if not c.check("train_lora_int4_np%d_runs" % np_, p.returncode == 0, (p.stdout + p.stderr)[-800:]):
            return
        got[np_] = [float(x) for x in re.findall(r"\{'loss': ([^,]+),", p.stdout + p.stderr)]
    worst = max((abs(a - b) for a, b in zip(got[1], got[2])), default=float("inf"))
    c.check("train_lora_int4_2ranks_equal_1rank", len(got[1]) == 3 and len(got[2]) == 3 and worst < 1e-6,
            "1 rank %s, 2 ranks %s" % (got[1], got[2]))


def check_resume(q4, tmp, train_flags):
    if not q4:
        c.skip("train_lora_int4_resume", "no INT4 folder")
        return
    flags = [f for f in train_flags if f not in ("--save_strategy", "no")]
    common = ["--model_name_or_path", q4, "--finetuning_type", "lora", "--max_steps", "4", "--save_steps", "2"] + flags
    full, res = os.path.join(tmp, "lora_int4_full"), os.path.join(tmp, "lora_int4_resumed")
    p = run_glm("train", "--output_dir", full, *common)
    if not c.check("train_lora_int4_4_steps", p.returncode == 0, p.stderr[-800:]):
        return
    want = re.findall(r"\{'loss': ([^,]+),", p.stdout + p.stderr)
    os.makedirs(res)
    shutil.copytree(os.path.join(full, "checkpoint-2"), os.path.join(res, "checkpoint-2"))
    p = run_glm("train", "--output_dir", res, "--overwrite_output_dir", "--resume_from_checkpoint",
                os.path.join(res, "checkpoint-2"), *common)
    if not c.check("train_lora_int4_resume_runs", p.returncode == 0, p.stderr[-800:]):
        return
    got = re.findall(r"\{'loss': ([^,]+),", p.stdout + p.stderr)
    same = open(os.path.join(full, "adapter_model.safetensors"), "rb").read() == \
        open(os.path.join(res, "adapter_model.safetensors"), "rb").read()
    c.check("train_lora_int4_resume_exact", len(want) == 4 and got == want[2:] and same,
            "steps 3-4 %s resumed %s; adapters equal %s" % (want[2:], got, same))


def check_stages(q4, src, lora, tmp, train_flags):
    """A quantized base split over 2 pipeline stages (--device_map auto, on the CPU here): generate
    gives the whole model's greedy tokens (the INT4 folder, NF4 at load, the INT4 base with the
    LoRA adapter trained on it), and LoRA training on the INT4 folder over 2 stages (2 ranks)
    logs the losses of 1 stage and saves the same adapter."""
    split = ["--device_map", "auto", "--pipeline_parallel_size", "2"]
    for name, model, extra in (("int4_folder", q4, []), ("nf4_at_load", src, ["--quantization_bit", "4", "--quantization_type", "nf4"]),
                               ("int4_with_lora", q4, ["--adapter", lora] if lora else None)):
        if not model or extra is None:
            c.skip("stages_%s_equal_whole" % name, "no INT4 folder or adapter")
            continue
        try:
            whole, parts = generate_all(model, extra), generate_all(model, extra + split)
            c.check("stages_%s_equal_whole" % name, whole == parts, "whole %s, 2 stages %s" % (whole, parts))
        except Exception as e:
            c.check("stages_%s_equal_whole" % name, False, str(e))
    import mpi_runs as M
    if not q4 or not shutil.which("mpirun"):
        c.skip("train_lora_int4_2_stages", "mpirun (OpenMPI) not installed" if q4 else "no INT4 folder")
        return
    flags = [f for f in train_flags if f not in ("--save_strategy", "no")]
    got, ad = {}, {}
    for np_, extra in ((1, []), (2, ["--pipeline_parallel_size", "2"])):
        out = os.path.join(tmp, "lora_int4_pp%d" % np_)
        p = M.run(["--model_name_or_path", q4, "--output_dir", out, "--finetuning_type", "lora", "--lora_dropout", "0",
                   "--lora_target", "all", "--max_steps", "3", "--save_steps", "3"] + extra + flags, np=np_, check=False,
                  timeout=300)
        if any(x in p.stdout + p.stderr for x in M.NO_MPI):
            c.skip("train_lora_int4_2_stages", "glmtrain built without MPI")
            return
        if not c.check("train_lora_int4_pp%d_runs" % np_, p.returncode == 0, (p.stdout + p.stderr)[-800:]):
            return
        got[np_] = [float(x) for x in re.findall(r"\{'loss': ([^,]+),", p.stdout + p.stderr)]
        from safetensors.torch import load_file
        ad[np_] = load_file(os.path.join(out, "adapter_model.safetensors"))
    worst = max((abs(a - b) for a, b in zip(got[1], got[2])), default=float("inf"))
    dif = max((float((ad[1][k].float() - ad[2][k].float()).abs().max()) for k in ad[1] if k in ad[2]), default=float("inf"))
    c.check("train_lora_int4_2_stages_equal_1", len(got[1]) == 3 and len(got[2]) == 3 and worst < 1e-6 and
            set(ad[1]) == set(ad[2]) and dif < 1e-6,
            "1 stage %s, 2 stages %s; adapters differ by %g (%d / %d tensors)" % (got[1], got[2], dif, len(ad[1]), len(ad[2])))


def have_load_why():
    return "glmtrain generate has no --quantization_bit yet (issue 17): quantized folders and quantize-at-load not testable"


def have_quantize_why():
    return "glmtrain has no `quantize` command yet (issue 17: `glmtrain quantize --help` fails)"


def have_hf_why(have_hf):
    return "transformers not installed (scripts/install-deps.sh installs 4.33.3)" if not have_hf else "?"


CFG = None


def main():
    global CFG
    if not os.path.exists(GLM):
        c.skip("quant_cli", "%s not built" % GLM)
        return
    if not shutil.which("spm_train"):
        c.skip("quant_cli", "spm_train (Debian sentencepiece) not installed")
        return
    try:
        import torch  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        c.skip("quant_cli", "python torch/safetensors missing: %s" % e)
        return
    import quant_ref as qr
    have_hf = importlib.util.find_spec("transformers") is not None
    hq = run_glm("quantize", "--help")
    have_quantize = hq.returncode == 0
    hg = run_glm("generate", "--help")
    have_load = "--quantization_bit" in hg.stdout + hg.stderr
    d = tempfile.mkdtemp(prefix="glm-quant-cli-")
    try:
        src, CFG = make_source(d)
        sd = source_state(src)
        fsd = float_params(sd)
        train_file, _ = __import__("test_train").write_data(d)
        train_flags = ["--train_file", train_file, "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
                       "--warmup_steps", "1", "--logging_steps", "1", "--seed", "7", "--max_source_length", "32",
                       "--max_target_length", "16", "--disable_tqdm", "--report_to", "none", "--device", "cpu",
                       "--save_strategy", "no"]

        # (a) THUDM's layout written by the reference
        thudm = check_thudm_folders(src, sd, d, have_load, have_hf)

        # the source in fp16 throughout (LayerNorm too), as a quantized folder stores the tensors
        # it does not quantize: quantizing it at load must give that folder's weights exactly
        conv = os.path.join(d, "converted")
        p = run_glm("convert", "--from", src, "--to", conv)
        if not c.check("convert_source_fp16", p.returncode == 0, p.stderr[-600:]):
            conv = None

        # (b)-(d) glmtrain quantize
        qdirs = {}
        if have_quantize:
            jobs, names = [], []
            for bits in (4, 8):
                tag = "quantize_int%d" % bits
                q = os.path.join(d, tag)
                p = run_glm("quantize", "--model_name_or_path", src, "--quantization_bit", bits, "--output_dir", q,
                            "--max_shard_size", SHARD)
                if not c.check(tag, p.returncode == 0 and crashed(p) is None, "exit %d: %s" % (p.returncode, p.stderr[-800:])):
                    continue
                qdirs[bits] = q
                got = check_quantize_output(tag, q, src, sd, bits, conv) if conv else st_tensors(q)
                params = dequantized_of(got, bits)
                runs = None
                if have_load:
                    try:
                        runs = generate_all(q)
                        c.check(tag + "_loads_in_glmtrain", True)
                        check_tokens_vs_ref(tag + "_greedy_equals_glm_ref_dequantized", runs, params)
                    except Exception as e:
                        c.check(tag + "_loads_in_glmtrain", False, str(e))
                jobs.append({"folder": q, "prompts": PROMPTS})
                names.append((tag, params, runs))
                # (d) the quantized folder quantized again
                q2 = os.path.join(d, tag + "_again")
                p = run_glm("quantize", "--model_name_or_path", q, "--quantization_bit", bits, "--output_dir", q2)
                if c.check(tag + "_requantize_runs", p.returncode == 0 and crashed(p) is None, "exit %d: %s" % (p.returncode, p.stderr[-800:])):
                    again = st_tensors(q2)
                    diff = sorted(k for k in set(got) | set(again) if got.get(k) != again.get(k))
                    c.check(tag + "_requantize_byte_identical", not diff,
                            "%d tensors differ or are missing: %s" % (len(diff), diff[:4]))
            # (c) transformers through the stand-in
            if have_hf and jobs:
                for (tag, params, runs), r in zip(names, hf_jobs(jobs, d)):
                    check_hf_result(tag, r, params, runs)
            elif not have_hf:
                c.skip("quantize_transformers", have_hf_why(have_hf))
        else:
            c.skip("quantize_command", have_quantize_why())

        # (e) quantize at load
        if have_load:
            for bits in (4, 8):
                tag = "load_quantization_bit_%d" % bits
                try:
                    runs = generate_all(src, ["--quantization_bit", str(bits)])
                except Exception as e:
                    c.check(tag + "_generate", False, str(e))
                    continue
                qsd = qr.quantize_state_dict(sd, bits)
                # glmtrain keeps the non-quantized tensors as loaded (LayerNorm fp32): the reference too
                params = dict(fsd, **{k: v for k, v in qr.dequantized_params(qsd, bits).items() if qr.is_quantized_name(k)})
                check_tokens_vs_ref(tag + "_greedy_equals_glm_ref", runs, params, also_differs_from=fsd if bits == 4 else None)
                # the quantized folder against the fp16 source quantized at load: the same weights
                other = qdirs.get(bits) or thudm.get(bits, (None,))[0]
                if other and conv:
                    try:
                        o = generate_all(other)
                        r16 = generate_all(conv, ["--quantization_bit", str(bits)])
                        c.check(tag + "_equals_quantized_folder", o == r16,
                                "%s: %s; the fp16 source with --quantization_bit %d: %s" % (os.path.basename(other), o, bits, r16))
                    except Exception as e:
                        c.check(tag + "_equals_quantized_folder", False, str(e))
            tag = "load_nf4"
            try:
                runs = generate_all(src, ["--quantization_bit", "4", "--quantization_type", "nf4"])
                params = dict(fsd)
                for k, v in fsd.items():
                    if qr.is_quantized_name(k):
                        params[k] = qr.dequantize("nf4", v.shape[0], v.shape[1], qr.nf4_quantize(v))
                check_tokens_vs_ref(tag + "_greedy_equals_glm_ref", runs, params, also_differs_from=fsd)
            except Exception as e:
                c.check(tag + "_generate", False, str(e))
            # LoRA on an INT4 base: the int4 folder, and the float source quantized at load
            q4 = qdirs.get(4) or thudm.get(4, (None,))[0]
            losses = {}
            for name, model, extra in (("folder", q4, []), ("at_load", conv or src, ["--quantization_bit", "4"])):
                out = os.path.join(d, "lora_int4_" + name)
                p = run_glm("train", "--model_name_or_path", model, "--output_dir", out, "--finetuning_type", "lora",
                            "--max_steps", "2", *extra, *train_flags)
                if c.check("train_lora_int4_" + name, p.returncode == 0 and crashed(p) is None, p.stderr[-800:]):
                    losses[name] = re.findall(r"\{'loss': ([^,]+),", p.stdout + p.stderr)
            if len(losses) == 2:
                # the same weights (the fp16 source quantized at load = the INT4 folder): the same losses
                c.check("train_lora_int4_folder_equals_at_load", losses["folder"] and losses["folder"] == losses["at_load"],
                        "losses %s" % losses)
            # data parallelism on an INT4 base: 2 CPU ranks (every rank quantizes the base itself)
            # equal 1 rank with the same global batch (LoRA dropout 0: its masks are drawn per rank)
            check_two_ranks(q4, d, train_flags)
            # exact resume on an INT4 base: 4 steps, against checkpoint-2 resumed (the base is
            # quantized again on the way in; the adapter and optimizer state come from the checkpoint)
            check_resume(q4, d, train_flags)
            # chat on the INT4 folder, and on the float source with NF4 at load: generate's tokens
            for name, model, extra in (("int4_folder", q4, []),
                                       ("nf4_at_load", src, ["--quantization_bit", "4", "--quantization_type", "nf4"])):
                try:
                    got = chat_tokens(model, PROMPTS[0], extra)
                    want = generate_all(model, extra)[0][1]
                    c.check("chat_%s_equals_generate" % name, got == want, "chat %s, generate %s" % (got, want))
                except Exception as e:
                    c.check("chat_%s_equals_generate" % name, False, str(e))
            # the quantized base split over pipeline stages: generate and LoRA training
            lora = os.path.join(d, "lora_int4_at_load")
            check_stages(q4, src, lora if os.path.isfile(os.path.join(lora, "adapter_config.json")) else None, d, train_flags)
            # merge --quantization_bit 4 of the adapter trained on the INT4 base: THUDM's layout
            # of the float32 merge quantized (quant_ref), and it loads in glmtrain
            hm = run_glm("merge", "--help")
            lora = os.path.join(d, "lora_int4_at_load")
            if "--quantization_bit" not in hm.stdout + hm.stderr:
                c.skip("merge_quantized", "glmtrain merge has no --quantization_bit yet")
            elif conv and os.path.isfile(os.path.join(lora, "adapter_config.json")):
                check_merge_quantized(conv, lora, d)
        else:
            c.skip("quantize_at_load", have_load_why())

        # (f) errors
        check_errors(src, qdirs.get(4) or (thudm.get(4, (None,))[0] if have_load else None), have_quantize, have_load, d, train_flags)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL test_quant_cli: %s" % e)
        sys.exit(1)
    sys.exit(c.status())
