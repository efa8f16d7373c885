#!/usr/bin/env python3
"""Issue 15: every folder glmtrain writes loads in the original code with no edits.

Builds a folder shaped like a THUDM/chatglm-6b download (config.json with _name_or_path,
architectures, auto_map, transformers_version and `"layernorm_epsilon": 1e-05` as text;
our own THUDM-style remote code from tests/py/thudm_standin; tokenizer_config.json with its
own auto_map; ice_text.model; fp16 torch.save shards pytorch_model-0000N-of-00002.bin with
pytorch_model.bin.index.json, LayerNorm kept fp32 as in the original), then runs
`glmtrain train` (final model and checkpoint-N), `glmtrain convert` (of the source and of the
trained model, one of them sharded) on it, and checks each output folder:
  * every *.py of the source byte-identical, the tokenizer files and generation_config.json too;
  * config.json: every source key in the source's order with the source's value, number
    literals as written (1e-05 stays 1e-05), torch_dtype naming the dtype actually written;
  * safetensors: __metadata__ {"format": "pt"}, every tensor in that dtype, shards with a
    model.safetensors.index.json whose weight_map covers exactly the tensors of the files;
  * it loads in glmtrain (`glmtrain generate`);
  * when transformers is installed: AutoTokenizer / AutoModel.from_pretrained(out,
    trust_remote_code=True), offline, in a subprocess: the tokenizer's ids equal glmtrain's
    prompt ids, the logits equal tests/py/glm_ref.py's on the weights read from the folder's
    safetensors, and the greedy next tokens equal `glmtrain generate --do_sample false`'s.
A model made with --init_from_config (no code files) still loads in glmtrain and the train log
says the folder lacks modeling_chatglm.py.

The parameter-efficient outputs, trained on the same download:
  * LoRA (`--finetuning_type lora`): adapter_config.json with peft's keys (LoraConfig reads
    them back as trained); with peft, PeftModel.from_pretrained(AutoModel of the source, out)
    gives glm_ref's logits with that adapter (forward's lora=) and `glmtrain generate --adapter`'s
    greedy tokens;
  * `glmtrain merge` of that adapter (float32 in one file; float16 in shards): the whole folder
    contract above, and the merged model equals base + adapter (glm_ref's LoRA branch on the
    source's weights; greedy tokens of `generate --adapter`);
  * P-Tuning v2 (`--pre_seq_len P`, with and without --prefix_projection): THUDM's layout
    (config.json = the source's plus pre_seq_len/prefix_projection; pytorch_model.bin with only
    transformer.prefix_encoder.*), loaded as THUDM's ptuning README does (AutoConfig of the
    source with pre_seq_len, AutoModel, prefix_encoder.load_state_dict of the stripped .bin):
    glm_ref's logits with that prefix (forward's prefix=) and `generate --adapter`'s tokens.
Every adapter comparison also requires the adapter to make a difference: glm_ref's logits move
by at least 10x the tolerance, and greedy tokens (compared on every ADAPTER_PROMPTS) change on
at least one prompt, so a loader or `generate --adapter` that dropped the adapter would fail.
(The source's weights are N(0, 0.6): at 0.3 the residual stream made every model repeat <sop>,
with or without an adapter.) The `quantize` outputs (INT8/INT4 in THUDM's chatglm-6b-int8/int4
layout) are held to the same contract by tests/py/test_quant_cli.py.

GLM_THUDM_CODE=DIR uses the *.py files of DIR (e.g. the real THUDM code) instead of the
stand-in. Prints PASS/FAIL/SKIP lines (tests/run.sh counts them)."""
import glob
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import Checks  # noqa: E402

BUILD = os.environ.get("GLM_BUILD", "build")
GLM = os.path.join(BUILD, "glmtrain")
STANDIN = os.environ.get("GLM_THUDM_CODE") or os.path.join(HERE, "thudm_standin")
PROMPT = "the quick brown fox"
# the adapter checks compare greedy tokens on these too: on the source's weights each adapter
# trained below changes glm_ref's greedy tokens on some of them (a check requires that)
ADAPTER_PROMPTS = [PROMPT, "故人", "山水", "明月 江南"]
NEW_TOKENS = 6
SHARD = "20KB"       # forces several shards on the tiny model
SHARD_BYTES = 20000  # HF units: KB = 1000
ENV = dict(os.environ, OMP_NUM_THREADS="1")

c = Checks()


# ---------------------------------------------------------------------------------------------
# The source folder

def source_config_text(ids, vocab):
    """config.json as THUDM ships it (key order and literals of the original), tiny sizes."""
    return """{
  "_name_or_path": "THUDM/chatglm-6b",
  "architectures": [
    "ChatGLMModel"
  ],
  "auto_map": {
    "AutoConfig": "configuration_chatglm.ChatGLMConfig",
    "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
    "AutoModelForSeq2SeqLM": "modeling_chatglm.ChatGLMForConditionalGeneration"
  },
  "bos_token_id": %d,
  "eos_token_id": %d,
  "mask_token_id": %d,
  "gmask_token_id": %d,
  "pad_token_id": %d,
  "hidden_size": 32,
  "inner_hidden_size": 64,
  "layernorm_epsilon": 1e-05,
  "max_sequence_length": 256,
  "model_type": "chatglm",
  "num_attention_heads": 4,
  "num_layers": 2,
  "position_encoding_2d": true,
  "torch_dtype": "float16",
  "transformers_version": "4.23.1",
  "use_cache": true,
  "vocab_size": %d
}
""" % (ids["<sop>"], ids["<eop>"], ids["[MASK]"], ids["[gMASK]"], ids["<pad>"], vocab)


TOKENIZER_CONFIG = """{
  "name_or_path": "THUDM/chatglm-6b",
  "bos_token": "<sop>",
  "eos_token": "<eop>",
  "end_token": "</s>",
  "gmask_token": "[gMASK]",
  "mask_token": "[MASK]",
  "pad_token": "<pad>",
  "unk_token": "<unk>",
  "remove_space": false,
  "do_lower_case": false,
  "tokenizer_class": "ChatGLMTokenizer",
  "num_image_tokens": 0,
  "auto_map": {
    "AutoTokenizer": [
      "tokenization_chatglm.ChatGLMTokenizer",
      null
    ]
  }
}
"""
SPECIAL_TOKENS_MAP = '{"bos_token": "<sop>", "eos_token": "<eop>", "mask_token": "[MASK]", "pad_token": "<pad>", "unk_token": "<unk>"}\n'


def make_source(d, tok):
    """The THUDM-download-shaped folder d/src; returns (path, glm_ref config, fp32 params)."""
    import torch
    import glm_ref
    import test_train as tt
    ids, vocab = tt.piece_ids(tok)
    src = os.path.join(d, "src")
    os.makedirs(src)
    with open(os.path.join(src, "config.json"), "w") as f:
        f.write(source_config_text(ids, vocab))
    for py in sorted(glob.glob(os.path.join(STANDIN, "*.py"))):
        shutil.copyfile(py, os.path.join(src, os.path.basename(py)))
    shutil.copyfile(os.path.join(tok, "ice_text.model"), os.path.join(src, "ice_text.model"))
    with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
        f.write(TOKENIZER_CONFIG)
    with open(os.path.join(src, "special_tokens_map.json"), "w") as f:
        f.write(SPECIAL_TOKENS_MAP)
    with open(os.path.join(src, "generation_config.json"), "w") as f:
        f.write('{\n  "_from_model_config": true,\n  "bos_token_id": %d,\n  "eos_token_id": %d,\n'
                '  "pad_token_id": %d,\n  "transformers_version": "4.27.0.dev0"\n}\n'
                % (ids["<sop>"], ids["<eop>"], ids["<pad>"]))
    cfg = glm_ref.load_config(os.path.join(src, "config.json"))
    params = glm_ref.init_params(cfg, seed=3, std=0.6)
    # as THUDM ships it: fp16, LayerNorm fp32, the rotary inv_freq buffers, lm_head a copy of
    # the embedding; two torch.save shards and the index
    rot = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
    inv = (1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))).half()
    shards = [{}, {}]
    for name, t in params.items():
        stored = t.clone() if "layernorm" in name else t.half()
        l = int(name.split(".")[2]) if name.startswith("transformer.layers.") else -1
        k = 0 if name.startswith("transformer.word_embeddings") or l == 0 else 1
        shards[k][name] = stored
        if name.endswith("input_layernorm.bias"):
            shards[k]["transformer.layers.%d.attention.rotary_emb.inv_freq" % l] = inv.clone()
    shards[1]["lm_head.weight"] = params["transformer.word_embeddings.weight"].half().clone()
    wmap, total = {}, 0
    for i, sd in enumerate(shards):
        fn = "pytorch_model-%05d-of-00002.bin" % (i + 1)
        torch.save(sd, os.path.join(src, fn))
        for name, t in sd.items():
            wmap[name] = fn
            total += t.numel() * t.element_size()
    with open(os.path.join(src, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)
    return src, cfg


# ---------------------------------------------------------------------------------------------
# Reading a folder

def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def weight_files(folder):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "model*.safetensors")))


def raw_pairs(text):
    """config.json as ordered (key, value) pairs, numbers kept as the text written."""
    return json.loads(text, object_pairs_hook=lambda kv: ("obj", kv),
                      parse_float=lambda s: ("num", s), parse_int=lambda s: ("num", s))[1]


def load_weights(folder):
    """{name: float32 tensor} from the folder's safetensors (the safetensors package)."""
    from safetensors.torch import load_file
    out = {}
    for fn in weight_files(folder):
        out.update({k: v.float() for k, v in load_file(os.path.join(folder, fn)).items()})
    return out


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


# ---------------------------------------------------------------------------------------------
# The contract on one folder

def check_folder(name, out, src, dtype, sharded=None):
    """dtype: "float32"/"float16" (config torch_dtype and tensor dtypes); sharded: True (an index
    and several shards under SHARD_BYTES each), False (one model.safetensors), None (either)."""
    pys = sorted(os.path.basename(p) for p in glob.glob(os.path.join(src, "*.py")))
    bad = [p for p in pys if not os.path.isfile(os.path.join(out, p)) or not same_bytes(os.path.join(src, p), os.path.join(out, p))]
    c.check(name + "_code_files", pys and not bad, "missing or changed: %s (folder holds %s)" % (bad, sorted(os.listdir(out))))
    toks = ["ice_text.model", "tokenizer_config.json", "special_tokens_map.json"]
    bad = [t for t in toks if not os.path.isfile(os.path.join(out, t)) or not same_bytes(os.path.join(src, t), os.path.join(out, t))]
    c.check(name + "_tokenizer_files", not bad, "missing or changed: %s" % bad)
    g = os.path.join(out, "generation_config.json")
    c.check(name + "_generation_config", os.path.isfile(g) and same_bytes(os.path.join(src, "generation_config.json"), g),
            "generation_config.json missing or changed")

    cfg_path = os.path.join(out, "config.json")
    if not c.check(name + "_config_exists", os.path.isfile(cfg_path), "no config.json in %s" % out):
        return
    sp = raw_pairs(open(os.path.join(src, "config.json")).read())
    op = raw_pairs(open(cfg_path).read())
    od = dict(op)
    missing = [k for k, _ in sp if k not in od]
    order = [k for k, _ in op if k in dict(sp)]
    changed = ["%s: %s -> %s" % (k, json.dumps(v), json.dumps(od[k])) for k, v in sp
               if k != "torch_dtype" and k in od and od[k] != v]
    c.check(name + "_config_keys_kept", not missing, "source keys dropped: %s" % missing)
    c.check(name + "_config_key_order", order == [k for k, _ in sp if k in od], "order %s" % order)
    c.check(name + "_config_values_as_written", not changed, "; ".join(changed))
    c.check(name + "_config_torch_dtype", od.get("torch_dtype") == dtype,
            "torch_dtype %r, the weights are %s" % (od.get("torch_dtype"), dtype))

    files = weight_files(out)
    heads = {fn: st_header(os.path.join(out, fn)) for fn in files}
    c.check(name + "_safetensors_metadata", files and all(h.get("__metadata__") == {"format": "pt"} for h in heads.values()),
            "%s" % {fn: h.get("__metadata__") for fn, h in heads.items()})
    want = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    wrong = sorted({"%s %s" % (k, v["dtype"]) for h in heads.values() for k, v in h.items()
                    if k != "__metadata__" and v["dtype"] != want})
    c.check(name + "_weights_dtype", files and not wrong, "not %s: %s" % (want, wrong[:4]))
    ix_path = os.path.join(out, "model.safetensors.index.json")
    has_ix = os.path.isfile(ix_path)
    if sharded is False:
        c.check(name + "_single_file", files == ["model.safetensors"] and not has_ix, "files %s, index %s" % (files, has_ix))
    if has_ix or sharded:
        ok, why = has_ix, "no model.safetensors.index.json (files %s)" % files
        if has_ix:
            wm = json.load(open(ix_path)).get("weight_map", {})
            in_files = {k: fn for fn, h in heads.items() for k in h if k != "__metadata__"}
            ok = wm == in_files and sorted(set(wm.values())) == files and "model.safetensors" not in files
            why = "weight_map %d tensors in %s; files hold %d in %s" % (len(wm), sorted(set(wm.values())), len(in_files), files)
        c.check(name + "_index_covers_shards", ok, why)
    if sharded:
        over = [fn for fn, h in heads.items()
                if sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__") > SHARD_BYTES
                and len(h) > 2]
        c.check(name + "_sharded_under_limit", len(files) > 1 and not over,
                "%d files; over %s with more than one tensor: %s" % (len(files), SHARD, over))


# ---------------------------------------------------------------------------------------------
# glmtrain generate and the transformers loader

def glm_generate(folder, extra=(), prompt=PROMPT):
    """(prompt ids, response ids) of greedy `glmtrain generate --debug`, or raises."""
    p = subprocess.run([GLM, "generate", "--model_name_or_path", folder, "--prompt", prompt, "--do_sample", "false",
                        "--max_new_tokens", str(NEW_TOKENS), "--device", "cpu", "--debug", *extra],
                       capture_output=True, text=True, timeout=120, env=ENV)
    if p.returncode != 0:
        raise RuntimeError("glmtrain generate failed (%d): %s" % (p.returncode, p.stderr[-800:]))

    def ids(what):
        for line in p.stderr.splitlines():
            if line.startswith("[debug] %s ids (row 0):" % what):
                return [int(x) for x in line.split(":", 1)[1].split()]
        raise RuntimeError("no [debug] %s ids line in: %s" % (what, p.stderr[-800:]))
    return ids("prompt"), ids("response")


HF_CHILD = r"""
import json, os, sys, torch
# Debian's torch 1.13: baddbmm(..., beta=0) may read its uninitialised input and return NaN on
# small sizes; the real THUDM attention calls it like that. Compute such calls as alpha*bmm.
_baddbmm = torch.baddbmm
def baddbmm(input, b1, b2, *, beta=1, alpha=1, out=None):
    if beta == 0 and out is None:
        return torch.bmm(b1, b2) * alpha
    return _baddbmm(input, b1, b2, beta=beta, alpha=alpha, out=out)
torch.baddbmm = baddbmm
from transformers import AutoConfig, AutoModel, AutoTokenizer
folder, n, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
extra = {}
pt = spec.get("ptuning")
if pt:  # THUDM's ptuning README, word for word (on the CPU, in float32)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True, pre_seq_len=pt["pre_seq_len"],
                                        prefix_projection=pt["prefix_projection"])
    model = AutoModel.from_pretrained(folder, config=config, trust_remote_code=True)
    prefix_state_dict = torch.load(os.path.join(pt["checkpoint"], "pytorch_model.bin"))
    new_prefix_state_dict = {}
    for k, v in prefix_state_dict.items():
        if k.startswith("transformer.prefix_encoder."):
            new_prefix_state_dict[k[len("transformer.prefix_encoder."):]] = v
    model.transformer.prefix_encoder.load_state_dict(new_prefix_state_dict)
    extra["bin_keys"] = sorted(prefix_state_dict)
else:
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
model = model.float()
cls = type(model).__name__
if spec.get("peft"):
    from peft import PeftModel
    model = PeftModel.from_pretrained(model, spec["peft"])
    extra["peft_class"] = type(model).__name__
    extra["lora_modules"] = sorted(name for name, _ in model.named_modules() if name.endswith(".lora_A.default"))
model = model.eval()
eos = model.config.eos_token_id
rows = []
with torch.no_grad():
    for prompt in spec["prompts"]:
        ids = tok(prompt)["input_ids"]
        seq, greedy = list(ids), []
        for _ in range(n):  # greedy decoding by full recomputation (the mask rule makes it equal to a KV cache)
            nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            if nxt == eos:
                break
            greedy.append(nxt)
            seq.append(nxt)
        rows.append({"ids": ids, "greedy": greedy})
    logits = model(torch.tensor([rows[0]["ids"]])).logits[0]
print("RESULT " + json.dumps(dict(extra, **{"class": cls, "ids": rows[0]["ids"], "greedy": rows[0]["greedy"], "rows": rows,
                                            "logits": logits.tolist()})))
"""


def hf_load(folder, tmp, peft=None, ptuning=None, prompts=(PROMPT,)):
    """What transformers makes of the folder, in a fresh offline process: dict or raises
    (ids, greedy and logits of the first prompt; rows: ids and greedy of every prompt).
    peft: a LoRA folder for PeftModel.from_pretrained on top; ptuning: {"checkpoint": DIR,
    "pre_seq_len": P, "prefix_projection": bool}, loaded as THUDM's ptuning README does."""
    home = tempfile.mkdtemp(prefix="hf-", dir=tmp)
    env = dict(ENV, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=home,
               HF_MODULES_CACHE=os.path.join(home, "modules"), TRANSFORMERS_VERBOSITY="error")
    spec = json.dumps({"peft": peft, "ptuning": ptuning, "prompts": list(prompts)})
    p = subprocess.run([sys.executable, "-c", HF_CHILD, folder, str(NEW_TOKENS), spec],
                       capture_output=True, text=True, timeout=180, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    raise RuntimeError("transformers could not load %s (exit %d): %s" % (folder, p.returncode, (lines[-1] if lines else "no output")[-600:]))


def hf_skip_reason(have_hf):
    return (have_hf is None and "transformers not installed (scripts/install-deps.sh installs 4.33.3)"
            or "the stand-in source folder did not load in transformers (see source_transformers_load)")


def rel_err(got, ref):
    return float((got - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)


def check_logits(name, got, ref, rtol, without=None):
    """got equals ref within rtol (of max |logit|); with `without` (the logits of the model
    without the adapter) the adapter must also move them by more than 10 * rtol, or the check
    could not tell a loader that dropped the adapter."""
    ok = tuple(got.shape) == tuple(ref.shape)
    err = rel_err(got, ref) if ok else float("inf")
    why = "shape %s vs %s, max error %.3g of max |logit| (limit %g)" % (tuple(got.shape), tuple(ref.shape), err, rtol)
    ok = ok and err <= rtol
    if without is not None:
        moved = rel_err(without, ref)
        why += "; the adapter moves glm_ref's logits by %.3g (must exceed %g)" % (moved, 10 * rtol)
        ok = ok and moved > 10 * rtol
        if ok:
            print("# %s: %s" % (name, why))  # the margins, for whoever reads the log
    return c.check(name, ok, why)


def check_loads(name, folder, tmp, rtol, have_hf, prompts=(PROMPT,)):
    """glmtrain generate on the folder; with transformers, the original loaders too (greedy
    tokens of every prompt in the result's rows; the checks here use the first).
    Returns (glmtrain's greedy response ids or None, transformers' result dict or None)."""
    import torch
    import glm_ref
    try:
        gids, gresp = glm_generate(folder)
        c.check(name + "_loads_in_glmtrain", True)
    except Exception as e:
        c.check(name + "_loads_in_glmtrain", False, str(e))
        gids = gresp = None
    if not have_hf:
        c.skip(name + "_transformers", hf_skip_reason(have_hf))
        return gresp, None
    try:
        r = hf_load(folder, tmp, prompts=prompts)
        c.check(name + "_transformers_load", r["class"] == "ChatGLMForConditionalGeneration", "class %s" % r["class"])
    except Exception as e:
        c.check(name + "_transformers_load", False, str(e))
        return gresp, None
    if gids is not None:
        c.check(name + "_transformers_tokenizer", r["ids"] == gids, "AutoTokenizer %s, glmtrain %s" % (r["ids"], gids))
    cfg = glm_ref.load_config(folder)
    try:
        params = load_weights(folder)
        ref = glm_ref.forward(cfg, params, torch.tensor([r["ids"]]))["logits"][0]
        got = torch.tensor(r["logits"])
        err = float((got - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
        c.check(name + "_transformers_logits", got.shape == ref.shape and err <= rtol,
                "shape %s vs %s, max error %.3g of max |logit| (limit %g)" % (tuple(got.shape), tuple(ref.shape), err, rtol))
    except Exception as e:
        c.check(name + "_transformers_logits", False, "glm_ref on the folder's weights: %s" % e)
    if gresp is not None:
        eos = cfg["eos_token_id"]
        g = gresp[:gresp.index(eos)] if eos in gresp else gresp
        c.check(name + "_transformers_greedy", r["greedy"] == g[:NEW_TOKENS],
                "transformers %s, glmtrain generate %s" % (r["greedy"], gresp))
    return gresp, r


def greedy_of(resp, eos):
    """glmtrain's response ids as the transformers child's greedy list (cut at eos, at most NEW_TOKENS)."""
    return (resp[:resp.index(eos)] if eos in resp else resp)[:NEW_TOKENS]


def ref_greedy(cfg, params, ids, **adapter):
    """glm_ref's greedy tokens by full recomputation (adapter: forward's lora= or prefix=)."""
    import torch
    import glm_ref
    seq, out = list(ids), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            nxt = int(glm_ref.forward(cfg, params, torch.tensor([seq]), **adapter)["logits"][0, -1].argmax())
            if nxt == cfg["eos_token_id"]:
                break
            out.append(nxt)
            seq.append(nxt)
    return out


def generate_adapter(name, src, adapter_dir):
    """glmtrain generate --adapter on every ADAPTER_PROMPTS: [(prompt ids, response ids)] or None."""
    try:
        runs = [glm_generate(src, ["--adapter", adapter_dir], pr) for pr in ADAPTER_PROMPTS]
        c.check(name + "_generate_adapter", True)
        return runs
    except Exception as e:
        c.check(name + "_generate_adapter", False, str(e))
        return None


def check_adapter_greedy(name, cfg, sd, runs, **adapter):
    """generate --adapter's greedy tokens equal glm_ref's with the adapter on every prompt, and the
    adapter changes glm_ref's tokens on at least one (else equal tokens would prove nothing).
    Returns glm_ref's tokens without the adapter, per prompt."""
    eos = cfg["eos_token_id"]
    want = [ref_greedy(cfg, sd, ids, **adapter) for ids, _ in runs]
    base = [ref_greedy(cfg, sd, ids) for ids, _ in runs]
    got = [greedy_of(resp, eos) for _, resp in runs]
    bad = ["%r: glmtrain %s, glm_ref %s" % (pr, g, w) for pr, g, w in zip(ADAPTER_PROMPTS, got, want) if g != w]
    changed = [pr for pr, w, b in zip(ADAPTER_PROMPTS, want, base) if w != b]
    c.check(name + "_generate_adapter_greedy", not bad and changed,
            "; ".join(bad) or "the adapter changes glm_ref's greedy tokens on none of %s: equal tokens would prove nothing"
            % ADAPTER_PROMPTS)
    return base


def check_rows_greedy(name, rows, runs, eos, what):
    """The transformers child's greedy tokens on every prompt equal glmtrain's runs."""
    bad = ["%r: %s %s, glmtrain %s" % (pr, what, r["greedy"], greedy_of(resp, eos))
           for pr, r, (_, resp) in zip(ADAPTER_PROMPTS, rows, runs) if r["greedy"] != greedy_of(resp, eos)]
    c.check(name, len(rows) == len(runs) and not bad, "; ".join(bad) or "%d rows for %d prompts" % (len(rows), len(runs)))


# ---------------------------------------------------------------------------------------------
# LoRA, merge and P-Tuning v2 outputs

PEFT_PREFIX = "base_model.model."
LORA_TARGETS = ["query_key_value", "dense_4h_to_h"]
LORA_R, LORA_ALPHA, LORA_DROPOUT = 8, 16, 0.05  # glmtrain's defaults (peft's r, 2 x r, LLaMA-Factory's dropout)
# what peft's LoraConfig.save_pretrained writes and from_pretrained needs to rebuild the adapter
PEFT_LORA_KEYS = ["base_model_name_or_path", "bias", "fan_in_fan_out", "inference_mode", "lora_alpha", "lora_dropout",
                  "modules_to_save", "peft_type", "r", "target_modules", "task_type"]


def read_lora(folder):
    """(adapter_config dict, {glm_ref name: fp32 A/B}, scaling) of a peft-format folder."""
    import glm_ref
    from safetensors.torch import load_file
    conf = json.load(open(os.path.join(folder, "adapter_config.json")))
    raw = load_file(os.path.join(folder, "adapter_model.safetensors"))
    ads = {(k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k): v.float() for k, v in raw.items()}
    return conf, ads, glm_ref.lora_scaling(conf["lora_alpha"], conf["r"], conf.get("use_rslora", False))


def check_lora_output(out, src, sd, cfg, tmp, have_hf):
    """The LoRA run's folder: peft's config keys and tensor names; generate --adapter against
    glm_ref's LoRA branch; PeftModel.from_pretrained on the source's AutoModel gives glm_ref's
    logits with the adapter and generate --adapter's tokens. Returns what the merge checks
    compare with ({"runs": generate --adapter per prompt, "ref"/"ref_base": glm_ref's logits of
    the first prompt with and without the adapter, "base_greedy"}) or None."""
    import torch
    import glm_ref
    try:
        conf, ads, scaling = read_lora(out)
    except Exception as e:
        c.check("lora_output_files", False, "%s (folder holds %s)" % (e, sorted(os.listdir(out))))
        return None
    c.check("lora_output_files", not os.path.exists(os.path.join(out, "model.safetensors")),
            "a whole model.safetensors beside the adapter: %s" % sorted(os.listdir(out)))
    missing = [k for k in PEFT_LORA_KEYS if k not in conf]
    c.check("lora_adapter_config_peft_keys", not missing, "missing %s in %s" % (missing, sorted(conf)))
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_R, "lora_alpha": LORA_ALPHA, "bias": "none",
            "fan_in_fan_out": False}
    bad = ["%s %r (want %r)" % (k, conf.get(k), v) for k, v in want.items() if conf.get(k) != v]
    if sorted(conf.get("target_modules") or []) != sorted(LORA_TARGETS):
        bad.append("target_modules %r" % conf.get("target_modules"))
    if not isinstance(conf.get("lora_dropout"), (int, float)) or abs(conf["lora_dropout"] - LORA_DROPOUT) > 1e-6:
        bad.append("lora_dropout %r" % conf.get("lora_dropout"))
    c.check("lora_adapter_config_values", not bad, "; ".join(bad))
    shapes = dict(glm_ref.lora_shapes(cfg, LORA_R, LORA_TARGETS))
    names = [k for k in st_header(os.path.join(out, "adapter_model.safetensors")) if k != "__metadata__"]
    c.check("lora_adapter_tensor_names", {k: tuple(v.shape) for k, v in ads.items()} == shapes
            and all(k.startswith(PEFT_PREFIX) for k in names),
            "tensors %s, want %s under %s" % (sorted(names)[:4], sorted(shapes)[:4], PEFT_PREFIX))
    have_peft = importlib.util.find_spec("peft") is not None
    if have_peft:
        # peft's own reader of the config (peft 0.6 refuses a key it does not know), each value
        # read back as written
        try:
            from peft import LoraConfig
            lc = LoraConfig.from_pretrained(out)
            unknown = [k for k in conf if not hasattr(lc, k)]
            differ = ["%s %r -> %r" % (k, v, getattr(lc, k)) for k, v in conf.items() if hasattr(lc, k)
                      and (sorted(v) != sorted(getattr(lc, k)) if isinstance(v, list) else getattr(lc, k) != v)]
            c.check("lora_adapter_config_read_by_peft", not unknown and not differ,
                    "keys peft ignores: %s; values read differently: %s" % (unknown, differ))
        except Exception as e:
            c.check("lora_adapter_config_read_by_peft", False, "LoraConfig.from_pretrained: %s" % e)

    runs = generate_adapter("lora", src, out)
    if runs is None:
        return None
    lora = (ads, scaling)
    base_greedy = check_adapter_greedy("lora", cfg, sd, runs, lora=lora)
    x = torch.tensor([runs[0][0]])
    res = {"runs": runs, "base_greedy": base_greedy, "ref": glm_ref.forward(cfg, sd, x, lora=lora)["logits"][0],
           "ref_base": glm_ref.forward(cfg, sd, x)["logits"][0]}
    if not have_hf:
        c.skip("lora_peft", hf_skip_reason(have_hf))
        return res
    if not have_peft:
        c.skip("lora_peft", "peft not installed (scripts/install-deps.sh installs 0.6.2)")
        return res
    try:
        r = hf_load(src, tmp, peft=out, prompts=ADAPTER_PROMPTS)
    except Exception as e:
        c.check("lora_peft_load", False, str(e))
        return res
    want_mods = sorted(k[:-len(".lora_A.weight")] + ".lora_A.default" for k in shapes if ".lora_A." in k)
    have_mods = sorted(m[len(PEFT_PREFIX):] if m.startswith(PEFT_PREFIX) else m for m in r["lora_modules"])
    c.check("lora_peft_load", r.get("peft_class") == "PeftModelForCausalLM" and have_mods == want_mods,
            "%s with LoRA on %s, want %s" % (r.get("peft_class"), have_mods, want_mods))
    c.check("lora_peft_tokenizer", [row["ids"] for row in r["rows"]] == [ids for ids, _ in runs],
            "AutoTokenizer %s, glmtrain %s" % ([row["ids"] for row in r["rows"]], [ids for ids, _ in runs]))
    check_logits("lora_peft_logits", torch.tensor(r["logits"]), res["ref"], 1e-4, without=res["ref_base"])
    check_rows_greedy("lora_peft_greedy", r["rows"], runs, cfg["eos_token_id"], "peft")
    return res


def check_merges(lora, src, cfg, tmp, have_hf, adapter_run):
    """glmtrain merge of the LoRA run: float32 in one file and float16 in shards, each a whole
    folder under the contract; the float32 one equals base + adapter."""
    import torch
    import glm_ref
    runs, eos = adapter_run["runs"], cfg["eos_token_id"]
    merged = os.path.join(tmp, "merged")
    w32 = None
    p = run_glm("merge", "--model_name_or_path", src, "--adapter", lora, "--output_dir", merged, "--dtype", "float32")
    if c.check("merge_lora", p.returncode == 0, p.stderr[-800:]):
        check_folder("merge", merged, src, "float32", sharded=False)
        _, r = check_loads("merge", merged, tmp, 1e-4, have_hf, prompts=ADAPTER_PROMPTS)
        # base + adapter: glm_ref on the merged weights is glm_ref's LoRA branch on the source's
        try:
            w32 = load_weights(merged)
            check_logits("merge_weights_are_base_plus_adapter",
                         glm_ref.forward(cfg, w32, torch.tensor([runs[0][0]]))["logits"][0],
                         adapter_run["ref"], 1e-4, without=adapter_run["ref_base"])
        except Exception as e:
            c.check("merge_weights_are_base_plus_adapter", False, "glm_ref on the merged weights: %s" % e)
        # the merged folder generates what the base with --adapter generates (where the adapter
        # changes glm_ref's tokens on some prompt: see lora_generate_adapter_greedy)
        try:
            mruns = [glm_generate(merged, prompt=pr) for pr in ADAPTER_PROMPTS]
            bad = ["%r: merged %s, --adapter %s" % (pr, m[1], a[1]) for pr, m, a in zip(ADAPTER_PROMPTS, mruns, runs)
                   if greedy_of(m[1], eos) != greedy_of(a[1], eos)]
            changed = any(greedy_of(a[1], eos) != b for a, b in zip(runs, adapter_run["base_greedy"]))
            c.check("merge_greedy_equals_generate_adapter", not bad and changed,
                    "; ".join(bad) or "the adapter's tokens are the base's on every prompt: equal tokens prove nothing")
        except Exception as e:
            c.check("merge_greedy_equals_generate_adapter", False, str(e))
        if r is not None:
            check_logits("merge_transformers_logits_are_base_plus_adapter", torch.tensor(r["logits"]),
                         adapter_run["ref"], 1e-4, without=adapter_run["ref_base"])
            check_rows_greedy("merge_transformers_greedy_equals_generate_adapter", r["rows"], runs, eos,
                              "transformers on the merged folder")
    merged16 = os.path.join(tmp, "merged_sharded")
    p = run_glm("merge", "--model_name_or_path", src, "--adapter", lora, "--output_dir", merged16,
                "--max_shard_size", SHARD)
    if c.check("merge_lora_sharded", p.returncode == 0, p.stderr[-800:]):
        check_folder("merge_sharded", merged16, src, "float16", sharded=True)
        check_loads("merge_sharded", merged16, tmp, 1e-3, have_hf)
        if w32 is not None:
            w16 = load_weights(merged16)
            bad = sorted(k for k, v in w32.items() if k not in w16 or
                         not bool(((w16[k] - v).abs() <= v.abs() * 2.0 ** -11 + 2.0 ** -24).all()))
            c.check("merge_sharded_is_float32_merge_rounded", not bad and sorted(w16) == sorted(w32),
                    "differ beyond fp16 rounding: %s; same names %s" % (bad[:4], sorted(w16) == sorted(w32)))


def check_ptuning_output(tag, out, src, sd, cfg, P, proj, tmp, have_hf):
    """THUDM's ptuning checkpoint layout and its README's way of loading it."""
    import torch
    import glm_ref
    cfg_path = os.path.join(out, "config.json")
    if not c.check(tag + "_config_exists", os.path.isfile(cfg_path), "no config.json in %s" % sorted(os.listdir(out))):
        return
    sp = raw_pairs(open(os.path.join(src, "config.json")).read())
    op = raw_pairs(open(cfg_path).read())
    od = dict(op)
    skeys = [k for k, _ in sp]
    changed = ["%s: %s -> %s" % (k, json.dumps(v), json.dumps(od.get(k))) for k, v in sp if k != "torch_dtype" and od.get(k) != v]
    order = [k for k, _ in op if k in dict(sp)]
    c.check(tag + "_config_is_source_config", not changed and order == skeys, "changed or dropped: %s; order %s" % (changed, order))
    c.check(tag + "_config_pre_seq_len", od.get("pre_seq_len") == ("num", str(P)) and od.get("prefix_projection") is proj,
            "pre_seq_len %r, prefix_projection %r (want %d, %r)" % (od.get("pre_seq_len"), od.get("prefix_projection"), P, proj))
    shapes = dict(glm_ref.prefix_shapes(cfg, P, proj))
    binp, stp = os.path.join(out, "pytorch_model.bin"), os.path.join(out, "model.safetensors")
    try:
        bsd = torch.load(binp)
        got = {k: tuple(v.shape) for k, v in bsd.items()}
        c.check(tag + "_pytorch_model_bin_prefix_only", got == shapes, "torch.load gives %s, want %s" % (got, shapes))
    except Exception as e:
        c.check(tag + "_pytorch_model_bin_prefix_only", False, "torch.load(%s): %s" % (binp, e))
        return
    if c.check(tag + "_safetensors_written", os.path.isfile(stp), "no model.safetensors: %s" % sorted(os.listdir(out))):
        from safetensors.torch import load_file
        pp = {k: v.float() for k, v in load_file(stp).items()}
        c.check(tag + "_safetensors_equals_bin", sorted(pp) == sorted(bsd) and all(torch.equal(pp[k], bsd[k].float()) for k in pp),
                "safetensors %s vs bin %s" % (sorted(pp), sorted(bsd)))
    else:
        pp = {k: v.float() for k, v in bsd.items()}
    runs = generate_adapter(tag, src, out)
    if runs is None:
        return
    prefix = glm_ref.ptuning_prefix(cfg, pp, proj)
    check_adapter_greedy(tag, cfg, sd, runs, prefix=prefix)
    if not have_hf:
        c.skip(tag + "_thudm_readme_load", hf_skip_reason(have_hf))
        return
    try:
        r = hf_load(src, tmp, ptuning={"checkpoint": out, "pre_seq_len": P, "prefix_projection": proj}, prompts=ADAPTER_PROMPTS)
        c.check(tag + "_thudm_readme_load", r["class"] == "ChatGLMForConditionalGeneration" and r["bin_keys"] == sorted(shapes),
                "class %s, pytorch_model.bin keys %s" % (r["class"], r["bin_keys"]))
    except Exception as e:
        c.check(tag + "_thudm_readme_load", False, str(e))
        return
    c.check(tag + "_transformers_tokenizer", [row["ids"] for row in r["rows"]] == [ids for ids, _ in runs],
            "AutoTokenizer %s, glmtrain %s" % ([row["ids"] for row in r["rows"]], [ids for ids, _ in runs]))
    x = torch.tensor([runs[0][0]])
    check_logits(tag + "_transformers_logits", torch.tensor(r["logits"]), glm_ref.forward(cfg, sd, x, prefix=prefix)["logits"][0],
                 1e-4, without=glm_ref.forward(cfg, sd, x)["logits"][0])
    check_rows_greedy(tag + "_transformers_greedy", r["rows"], runs, cfg["eos_token_id"], "transformers")


# ---------------------------------------------------------------------------------------------

def run_glm(*args, timeout=300):
    return subprocess.run([GLM, *map(str, args)], capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=ENV)


def main():
    if not os.path.exists(GLM):
        c.skip("folder_interop", "%s not built" % GLM)
        return
    if not shutil.which("spm_train"):
        c.skip("folder_interop", "spm_train (Debian sentencepiece) not installed")
        return
    try:
        import safetensors  # noqa: F401
    except ImportError:
        c.skip("folder_interop", "python safetensors package missing (scripts/install-deps.sh)")
        return
    import test_train as tt
    have_hf = True if importlib.util.find_spec("transformers") else None
    d = tempfile.mkdtemp(prefix="glm-interop-")
    try:
        tok = tt.make_tokenizer(d)
        src, cfg = make_source(d, tok)
        train_file, _ = tt.write_data(d)

        # the source itself: the stand-in code and the .bin shards load in transformers like the
        # original's (a failure here is a defect of the stand-in, not of glmtrain)
        import torch
        sd = {}  # the source's weights in fp32 (glm_ref's base for the adapter checks)
        for fn in sorted(glob.glob(os.path.join(src, "pytorch_model-*.bin"))):
            sd.update({k: v.float() for k, v in torch.load(fn).items()})
        if have_hf:
            try:
                r = hf_load(src, d)
                import glm_ref
                ref = glm_ref.forward(cfg, sd, torch.tensor([r["ids"]]))["logits"][0]
                err = float((torch.tensor(r["logits"]) - ref).abs().max()) / float(ref.abs().max())
                have_hf = c.check("source_transformers_load", err <= 1e-4,
                                  "stand-in logits differ from glm_ref by %.3g of max |logit|" % err)
            except Exception as e:
                have_hf = c.check("source_transformers_load", False, str(e))
        else:
            c.skip("source_transformers_load", "transformers not installed (scripts/install-deps.sh installs 4.33.3)")

        base = ["--train_file", train_file, "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
                "--warmup_steps", "1", "--logging_steps", "1", "--seed", "7", "--max_source_length", "32",
                "--max_target_length", "16", "--disable_tqdm", "--report_to", "none", "--device", "cpu"]

        # 1. train from the download: the final model (--save_dtype default) and checkpoint-N
        out = os.path.join(d, "trained")
        p = run_glm("train", "--model_name_or_path", src, "--output_dir", out, "--max_steps", "4", "--save_steps", "2", *base)
        if c.check("train_from_download", p.returncode == 0, p.stderr[-1500:]):
            check_folder("train_final", out, src, "float32", sharded=False)
            check_loads("train_final", out, d, 1e-4, have_hf)
            cks = sorted(glob.glob(os.path.join(out, "checkpoint-*")))
            c.check("train_checkpoints_written", len(cks) == 2, "%s" % cks)
            for ck in cks:
                check_folder("train_" + os.path.basename(ck).replace("-", ""), ck, src, "float32")
            if cks:
                check_loads("train_" + os.path.basename(cks[-1]).replace("-", ""), cks[-1], d, 1e-4, have_hf)

        # 2. train's --max_shard_size: the final model in shards with an index
        out_s = os.path.join(d, "trained_sharded")
        p = run_glm("train", "--model_name_or_path", src, "--output_dir", out_s, "--max_steps", "1",
                    "--save_strategy", "no", "--max_shard_size", SHARD, *base)
        if c.check("train_max_shard_size", p.returncode == 0, p.stderr[-600:]):
            check_folder("train_sharded", out_s, src, "float32", sharded=True)
            check_loads("train_sharded", out_s, d, 1e-4, have_hf)

        # 3. convert the download (float16, one file) and the trained model (float32, shards)
        conv = os.path.join(d, "converted")
        p = run_glm("convert", "--from", src, "--to", conv)
        if c.check("convert_download", p.returncode == 0, p.stderr[-600:]):
            check_folder("convert_download", conv, src, "float16", sharded=False)
            check_loads("convert_download", conv, d, 1e-3, have_hf)
        if os.path.isdir(out):
            conv2 = os.path.join(d, "converted_trained")
            p = run_glm("convert", "--from", out, "--to", conv2, "--dtype", "float32", "--max_shard_size", SHARD)
            if c.check("convert_trained", p.returncode == 0, p.stderr[-600:]):
                # the code files come from the trained folder, which has the download's
                check_folder("convert_trained", conv2, src, "float32", sharded=True)
                check_loads("convert_trained", conv2, d, 1e-4, have_hf)

        # 4. a model without code files (--init_from_config) still loads in glmtrain, and the log
        # says which files the original loaders would need
        ids, vocab = tt.piece_ids(tok)
        plain_cfg = tt.write_config(d, ids, vocab)
        out_i = os.path.join(d, "from_config")
        p = run_glm("train", "--init_from_config", plain_cfg, "--tokenizer_name", tok, "--output_dir", out_i,
                    "--max_steps", "1", "--save_strategy", "no", *base)
        if c.check("train_init_from_config", p.returncode == 0, p.stderr[-600:]):
            c.check("init_from_config_log_names_code_files", "modeling_chatglm.py" in p.stderr,
                    "the train log does not mention modeling_chatglm.py: %s" % p.stderr[-600:])
            try:
                glm_generate(out_i)
                c.check("init_from_config_loads_in_glmtrain", True)
            except Exception as e:
                c.check("init_from_config_loads_in_glmtrain", False, str(e))

        # 5. LoRA from the download: peft's files, loaded by peft onto the source's AutoModel;
        # then glmtrain merge of that adapter, whole folders under the same contract
        lora = os.path.join(d, "lora")
        p = run_glm("train", "--model_name_or_path", src, "--output_dir", lora, "--max_steps", "4", "--save_strategy", "no",
                    "--finetuning_type", "lora", "--lora_target", ",".join(LORA_TARGETS), *base)
        if c.check("lora_train_from_download", p.returncode == 0, p.stderr[-1500:]):
            adapter_run = check_lora_output(lora, src, sd, cfg, d, have_hf)
            if adapter_run is not None:
                check_merges(lora, src, cfg, d, have_hf, adapter_run)

        # 6. P-Tuning v2 from the download: THUDM's checkpoint layout, loaded as its ptuning README says
        for P, proj in ((4, True), (3, False)):
            tag = "ptuning_" + ("projection" if proj else "embedding")
            out_p = os.path.join(d, tag)
            p = run_glm("train", "--model_name_or_path", src, "--output_dir", out_p, "--max_steps", "4", "--save_strategy", "no",
                        "--pre_seq_len", str(P), *(["--prefix_projection"] if proj else []), *base)
            if c.check(tag + "_train_from_download", p.returncode == 0, p.stderr[-1500:]):
                check_ptuning_output(tag, out_p, src, sd, cfg, P, proj, d, have_hf)

    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is one failure with its reason
        import traceback
        traceback.print_exc()
        print("FAIL test_folder_interop: %s" % e)
        sys.exit(1)
    sys.exit(c.status())
