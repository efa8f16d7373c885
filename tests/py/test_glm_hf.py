#!/usr/bin/env python3
"""GLM-4 in transformers' own layout (model_type "glm", GlmForCausalLM: the glm-4-9b-chat-hf
repositories) against transformers 4.46 itself (scripts/install-deps.sh puts it in a folder of its
own, with tokenizers 0.20; this test alone puts it on sys.path):
  - a tiny GlmForCausalLM with random weights, saved by save_pretrained: tool_model_driver's loss
    and every gradient (by THUDM's original names; q_proj | k_proj | v_proj stacked) within 1e-5
    of transformers' own loss and autograd on a right-padded batch, two rotary bases;
  - the same model under THUDM's original names (transformers' convert_glm_weights_to_hf.py
    mapping, inverted) gives the same loss: the -hf folder is the ChatGLM2 block renamed;
  - tokenizer.json as transformers' TikTokenConverter writes it from a GLM-4-style rank file:
    glmtrain's ids equal the tokenizers library's on mixed text, specials included;
  - `glmtrain train` on the -hf folder with that tokenizer.json: the loss falls; the saved folder
    holds transformers' names and config (no THUDM code files needed), GlmForCausalLM loads it
    with no missing or unexpected keys, and its loss on a batch equals tool_model_driver's on the
    same folder; greedy `glmtrain generate` equals transformers' greedy decode;
  - LoRA on all six of its modules (peft 0.10's LoraLayer on transformers' GlmForCausalLM, q_proj,
    k_proj and v_proj three adapters), and on q_proj and v_proj alone: tool_model_driver's loss and every adapter gradient within
    1e-5 of peft's (rslora on and off; with dropout, peft's masks replaced by glmtrain's, each of
    q, k, v its own); `glmtrain train --finetuning_type lora --lora_target all` writes peft's files
    under transformers' names, which PeftModel.from_pretrained loads onto GlmForCausalLM with the
    loss glmtrain computes with them, and `glmtrain merge` writes the same model merged;
  - GLM-4-0414 (model_type glm4, Glm4ForCausalLM): the reference is GlmForCausalLM with each
    layer given the two norms modeling_glm4.py adds (post_self_attn_layernorm on attention's output
    and post_mlp_layernorm on the MLP's, before each residual sum), a layer forward written here
    (transformers 4.51, which has the class, does not import beside torch 1.13): loss and every
    gradient within 1e-5, full and LoRA; `glmtrain train` on its folder saves its names and
    config, and the reference loads them with glmtrain's loss;
  - `glmtrain convert --layout transformers|thudm` between the two layouts of a GLM-4 folder:
    GlmForCausalLM loads the converted folder with the same loss (THUDM's rope_ratio 500 written as
    rope_theta 5e6, the list of end ids kept), and back; GLM-4-0414 to THUDM's layout refused;
  - 2 CPU ranks (ZeRO 0 and 1) equal 1 rank for the split adapters; 2 pipeline stages write the
    one process's adapter, and a full fine-tune's final model that GlmForCausalLM loads;
  - refused with a clear error: a head_dim that is
    not hidden_size / heads, a tokenizer.json whose split pattern is not GLM-4's, transformers'
    module names on a THUDM-layout model.
Prints PASS/FAIL/SKIP lines."""
import json, os, shutil, subprocess, sys, tempfile

TF_DIR = "/usr/local/lib/glmtrain-transformers-4.46"
PEFT_DIR = "/usr/local/lib/glmtrain-peft-0.10"  # peft 0.10 (scripts/install-deps.sh), which imports beside it
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mpi_runs import ENV, GLM, losses, probe, report, run  # noqa: E402
from test_generate import debug_ids  # noqa: E402

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
            "<|end_of_video|>"]
BUILD = os.environ.get("GLM_BUILD", "build")
DRIVER = os.path.join(BUILD, "tests", "tool_model_driver")


def rel(a, b):
    m = b.abs().max().item()
    d = (a.double() - b.double()).abs().max().item()
    return float("inf") if d != d else (d / m if m > 0 else d)


def tiny_model(torch, GlmConfig, GlmForCausalLM, vocab, theta, pad, eos, seed):
    cfg = GlmConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=theta,
                    pad_token_id=pad, eos_token_id=eos, attention_bias=True, attn_implementation="eager")
    torch.manual_seed(seed)
    m = GlmForCausalLM(cfg).float()
    with torch.no_grad():
        for n, p in m.named_parameters():  # every value away from its init (norms near 1, biases not 0)
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.3 * torch.randn_like(p))
    return m.eval()


def orig_name(n):
    """transformers' name -> THUDM's (convert_glm_weights_to_hf.py's mapping, inverted); q/k/v
    all map to query_key_value."""
    import re
    fixed = {"model.embed_tokens.weight": "transformer.embedding.word_embeddings.weight",
             "model.norm.weight": "transformer.encoder.final_layernorm.weight", "lm_head.weight": "transformer.output_layer.weight"}
    if n in fixed:
        return fixed[n]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", n)
    inner = {"self_attn.q_proj": "self_attention.query_key_value", "self_attn.k_proj": "self_attention.query_key_value",
             "self_attn.v_proj": "self_attention.query_key_value", "self_attn.o_proj": "self_attention.dense",
             "mlp.gate_up_proj": "mlp.dense_h_to_4h", "mlp.down_proj": "mlp.dense_4h_to_h"}
    rest = m.group(2)
    for k, v in inner.items():  # a module's own tensors and its adapters' (".lora_A.weight")
        if rest.startswith(k + "."):
            rest = v + rest[len(k):]
            break
    return "transformer.encoder.layers.%s.%s" % (m.group(1), rest)


def stacked(named):
    """{transformers name: tensor} -> {THUDM name: tensor}, q | k | v stacked in rows."""
    import torch
    out = {}
    for n, t in named.items():
        o = orig_name(n)
        part = [k for k, x in enumerate(("q_proj.", "k_proj.", "v_proj.")) if x in n]
        out.setdefault(o, []).append((part[0] if part else 0, t))
    return {o: torch.cat([t for _, t in sorted(v, key=lambda x: x[0])]) for o, v in out.items()}


def batch(torch, vocab, lengths, seed, pad):
    g = torch.Generator().manual_seed(seed)
    rows, labs = [], []
    for la, lb in lengths:
        a = torch.randint(3, vocab, (la,), generator=g).tolist()
        b = torch.randint(3, vocab, (lb,), generator=g).tolist()
        rows.append(a + b)
        labs.append([-100] * la + b)
    T = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    labels = torch.tensor([l + [-100] * (T - len(l)) for l in labs])
    return rows, labs, ids, labels


def driver(mdir, bpath, out):
    p = subprocess.run([DRIVER, "--model", mdir, "--batch", bpath, "--out", out], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise RuntimeError("tool_model_driver: " + (p.stdout + p.stderr)[-800:])
    from safetensors.torch import load_file
    return load_file(out)


def save_thudm(m, folder, extra):
    """The tiny model's weights under THUDM's names (q | k | v stacked) with a ChatGLM2-block
    config.json in THUDM's keys (extra: more of them): the layout transformers' converter reads."""
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in stacked({n: p.detach() for n, p in m.named_parameters()}).items()},
              os.path.join(folder, "model.safetensors"))
    cfg = {"model_type": "chatglm", "padded_vocab_size": 96, "hidden_size": 32, "num_layers": 2, "num_attention_heads": 4,
           "kv_channels": 8, "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 48,
           "layernorm_epsilon": 1e-5, "rmsnorm": True, "add_qkv_bias": True, "add_bias_linear": False,
           "apply_residual_connection_post_layernorm": False, "post_layer_norm": True, "original_rope": True,
           "seq_length": 256, "tie_word_embeddings": False, "eos_token_id": 2, "pad_token_id": 0}
    cfg.update(extra)
    json.dump(cfg, open(os.path.join(folder, "config.json"), "w"))
    return folder


def write_batch(torch, d, name, vocab, lengths, seed, pad):
    """batch()'s rows written for tool_model_driver: (its path, the padded ids and labels)."""
    rows, labs, ids, labels = batch(torch, vocab, lengths, seed, pad)
    bpath = os.path.join(d, name)
    json.dump({"input_ids": rows, "labels": labs}, open(bpath, "w"))
    return bpath, ids, labels


def full_grads(torch, m, mdir, bpath, ids, labels, out):
    """m's loss and autograd against tool_model_driver on mdir (every row trains): (the loss, its
    relative error, the worst gradient's (relative error, name), the reference's gradients by
    THUDM's names, the driver's output)."""
    m.zero_grad()
    loss = m(input_ids=ids, labels=labels).loss
    loss.backward()
    ref = stacked({n: p.grad for n, p in m.named_parameters()})
    got = driver(mdir, bpath, out)
    worst = max((rel(got["grad/" + k], v), k) for k, v in ref.items())
    return loss, abs(got["loss"].item() - loss.item()) / abs(loss.item()), worst, ref, got


def check_grads(torch, GlmConfig, GlmForCausalLM, d):
    from safetensors.torch import save_file
    for theta in (10000.0, 5e6):
        m = tiny_model(torch, GlmConfig, GlmForCausalLM, 96, theta, 0, [2, 5], 11)
        mdir = os.path.join(d, "hf-%g" % theta)
        m.save_pretrained(mdir, safe_serialization=True)
        bpath, ids, labels = write_batch(torch, d, "batch.json", 96, [(5, 7), (3, 4), (9, 6)], 3, 0)
        loss, lerr, worst, ref, got = full_grads(torch, m, mdir, bpath, ids, labels, os.path.join(d, "out.safetensors"))
        report("glm_hf_loss_and_grads_equal_transformers_theta_%g" % theta,
               lerr <= 1e-5 and worst[0] <= 1e-5 and len(ref) == sum(k.startswith("grad/") for k in got),
               "loss %.6f vs %.6f (rel %.2g); worst grad %s rel %.2g; %d grads" % (got["loss"].item(), loss.item(), lerr,
                                                                                   worst[1], worst[0], len(ref)))
    # the same weights under THUDM's names: the ChatGLM2 block (config in its keys)
    odir = save_thudm(m, os.path.join(d, "orig"), {"rope_ratio": 500, "eos_token_id": [2, 5]})
    got = driver(odir, bpath, os.path.join(d, "out2.safetensors"))
    report("glm_hf_equals_thudm_layout", abs(got["loss"].item() - loss.item()) <= 1e-5 * abs(loss.item()),
           "THUDM layout %.7f, transformers %.7f" % (got["loss"].item(), loss.item()))
    # glmtrain convert --layout: THUDM's folder to transformers' (GlmForCausalLM loads it, same loss,
    # rope_ratio 500 as rope_theta 5e6, the end ids kept), and transformers' back to THUDM's
    conv = os.path.join(d, "conv-hf")
    run(["--from", odir, "--to", conv, "--layout", "transformers", "--dtype", "float32"], cmd="convert")
    t = GlmForCausalLM.from_pretrained(conv, attn_implementation="eager").float().eval()
    cfg = json.load(open(os.path.join(conv, "config.json")))
    with torch.no_grad():
        closs = t(input_ids=ids, labels=labels).loss.item()
    report("glm_hf_convert_thudm_to_transformers", abs(closs - loss.item()) <= 1e-5 * abs(loss.item()) and
           cfg.get("model_type") == "glm" and cfg.get("rope_theta") == 5e6 and cfg.get("eos_token_id") == [2, 5],
           "loss %.7f vs %.7f; config %s" % (closs, loss.item(), {k: cfg.get(k) for k in ("model_type", "rope_theta", "eos_token_id")}))
    back = os.path.join(d, "conv-thudm")
    run(["--from", os.path.join(d, "hf-5e+06"), "--to", back, "--layout", "thudm", "--dtype", "float32"], cmd="convert")
    cfg = json.load(open(os.path.join(back, "config.json")))
    got = driver(back, bpath, os.path.join(d, "out3.safetensors"))
    report("glm_hf_convert_transformers_to_thudm", abs(got["loss"].item() - loss.item()) <= 1e-5 * abs(loss.item()) and
           cfg.get("model_type") == "chatglm" and cfg.get("rope_ratio") == 500,
           "loss %.7f vs %.7f; config model_type %s rope_ratio %s" % (got["loss"].item(), loss.item(), cfg.get("model_type"),
                                                                      cfg.get("rope_ratio")))


def make_tokenizer(d):
    """A GLM-4-style rank file (test_tokenizer_glm4's trainer) and the tokenizer.json transformers'
    TikTokenConverter makes of it, with the [gMASK] <sop> post-processor of its GLM converter."""
    import test_tokenizer_glm4 as G
    import tokenizer_corpus as tc
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter
    lines = [l.decode("utf-8", "ignore") for l in tc.corpus(seed=5)[:2500]]
    ranks = G.train(lines, 1200)
    G.write_model(os.path.join(d, "rank"), ranks)
    n = len(ranks)
    import tiktoken.load  # its file reader wants blobfile for a local path: hand the converter the ranks
    tiktoken.load.load_tiktoken_bpe = lambda path, expected_hash=None: dict(ranks)
    tk = TikTokenConverter(vocab_file=os.path.join(d, "rank", "tokenizer.model"), pattern=G.PAT,
                           additional_special_tokens=SPECIALS).converted()
    tk.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="[gMASK]:0 <sop>:0 $A:0", pair="[gMASK]:0 <sop>:0 $A:0 $B:1",
                                      special_tokens=[("[gMASK]", n + 2), ("<sop>", n + 4)])])
    tdir = os.path.join(d, "tokjson")
    os.makedirs(tdir, exist_ok=True)
    tk.save(os.path.join(tdir, "tokenizer.json"))
    return tdir, tk, n, lines


def check_tokenizer(tdir, tk, lines):
    texts = lines[:400] + ["Hello  world!\n\n  x", "数字 12345 and 'll 's", "<|user|>\n你好<|assistant|>"[2:-3], "   ", "a\r\nb"]
    p = subprocess.run([GLM, "tokenize", "--tokenizer", tdir, "--json_input", "--json", "--no_special_tokens"],
                       input="".join(json.dumps(t) + "\n" for t in texts), capture_output=True, text=True, timeout=120,
                       env=ENV)
    got = [json.loads(l)["ids"] for l in p.stdout.splitlines()] if p.returncode == 0 else None
    want = [tk.encode(t, add_special_tokens=False).ids for t in texts]
    bad = [i for i in range(len(texts)) if got is None or i >= len(got) or got[i] != want[i]]
    report("glm_hf_tokenizer_json_equals_tokenizers", got is not None and not bad and len(got) == len(want),
           p.stderr[-300:] if got is None else "%d texts; first difference: %s" % (
               len(texts), "none" if not bad else "%r glmtrain %s tokenizers %s" % (texts[bad[0]], got[bad[0]] if bad[0] < len(got) else None, want[bad[0]])))
    p = subprocess.run([GLM, "tokenize", "--tokenizer", tdir, "--text", "春风又绿江南岸"], capture_output=True, text=True,
                       timeout=60, env=ENV)
    want = tk.encode("春风又绿江南岸").ids  # the post-processor's [gMASK] <sop>
    report("glm_hf_tokenizer_json_special_prefix", p.returncode == 0 and [int(x) for x in p.stdout.split()] == want,
           "glmtrain %s, tokenizers %s" % (p.stdout.strip(), want))


def check_more_specials(d, tdir, n):
    """A tokenizer.json whose added tokens go on past GLM-4's 14 (as later GLM releases' do): they
    join the specials at their ids."""
    more = os.path.join(d, "moretok")
    os.makedirs(more, exist_ok=True)
    j = json.load(open(os.path.join(tdir, "tokenizer.json")))
    extra = ["<|begin_of_audio|>", "<|end_of_audio|>", "<think>", "</think>"]
    j["added_tokens"] += [{"id": n + len(SPECIALS) + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": True} for i, t in enumerate(extra)]
    json.dump(j, open(os.path.join(more, "tokenizer.json"), "w"))
    ids = " ".join(str(n + len(SPECIALS) + i) for i in range(len(extra)))
    p = subprocess.run([GLM, "tokenize", "--tokenizer", more, "--decode", ids, "--pieces"], capture_output=True, text=True,
                       timeout=60, env=ENV)
    report("glm_hf_tokenizer_json_more_specials", p.returncode == 0 and p.stdout.split() == extra,
           "pieces %r %s" % (p.stdout.strip(), p.stderr[-200:]))


def check_train(torch, GlmConfig, GlmForCausalLM, d, tdir, n):
    vocab = (n + len(SPECIALS) + 63) // 64 * 64
    sid = {s: n + i for i, s in enumerate(SPECIALS)}
    m = tiny_model(torch, GlmConfig, GlmForCausalLM, vocab, 10000.0, sid["<|endoftext|>"],
                   [sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]], 5)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(0.3)
    base = os.path.join(d, "base")
    m.save_pretrained(base, safe_serialization=True)
    shutil.copy(os.path.join(tdir, "tokenizer.json"), base)
    data = os.path.join(d, "conv.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(32):
            f.write(json.dumps({"conversations": [{"role": "user", "content": "写一句关于%d的诗" % i},
                                                  {"role": "assistant", "content": "春风又绿江南岸 %d" % i}]},
                               ensure_ascii=False) + "\n")
    out = os.path.join(d, "out")
    run(["--model_name_or_path", base, "--train_file", data, "--learning_rate", "1e-2", "--warmup_steps", "2",
         "--logging_steps", "1", "--seed", "7", "--max_source_length", "32", "--max_target_length", "32",
         "--disable_tqdm", "--report_to", "none", "--max_steps", "8", "--save_steps", "8", "--output_dir", out,
         "--per_device_train_batch_size", "8"], timeout=300)
    l = losses(out, 8)
    report("glm_hf_train_loss_falls", len(l) == 8 and l[8] < l[1], "loss %.4f -> %.4f" % (l[1], l[8]))
    from safetensors import safe_open
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        names = set(f.keys())
    want = {n for n, _ in m.named_parameters()}
    cfg = json.load(open(os.path.join(out, "config.json")))
    report("glm_hf_saved_in_transformers_layout", names == want and cfg.get("model_type") == "glm" and
           os.path.isfile(os.path.join(out, "tokenizer.json")),
           "extra %s missing %s model_type %s" % (sorted(names - want)[:3], sorted(want - names)[:3], cfg.get("model_type")))
    t, info = GlmForCausalLM.from_pretrained(out, output_loading_info=True, attn_implementation="eager")
    t = t.float().eval()
    bpath, ids, labels = write_batch(torch, d, "batch2.json", n, [(6, 5), (4, 8)], 9, sid["<|endoftext|>"])
    with torch.no_grad():
        ref = t(input_ids=ids, labels=labels).loss.item()
    got = driver(out, bpath, os.path.join(d, "out3.safetensors"))["loss"].item()
    report("glm_hf_saved_folder_loads_in_transformers",
           not info["missing_keys"] and not info["unexpected_keys"] and abs(got - ref) <= 1e-5 * abs(ref),
           "missing %s unexpected %s; loss transformers %.7f glmtrain %.7f" % (info["missing_keys"][:3],
                                                                          info["unexpected_keys"][:3], ref, got))
    # greedy generation from the trained folder: the chat prompt, then argmax over the whole sequence
    p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--prompt", "写一句关于3的诗", "--do_sample",
                        "false", "--max_new_tokens", "6", "--repetition_penalty", "1.0", "--device", "cpu", "--debug"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    prompt = debug_ids(p.stderr, "prompt").get(0)
    resp = debug_ids(p.stderr, "response").get(0)
    seq = list(prompt or [])
    stops = {sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]}
    gen = []
    with torch.no_grad():
        for _ in range(6):
            nxt = int(t(torch.tensor([seq])).logits[0, -1].argmax())
            if nxt in stops:
                break
            gen.append(nxt)
            seq.append(nxt)
    report("glm_hf_generate_equals_transformers_greedy", prompt is not None and resp == gen,
           "prompt %s; glmtrain %s, transformers %s %s" % (prompt, resp, gen, "" if p.returncode == 0 else p.stderr[-300:]))


def peft_name(n):
    """peft's parameter name -> the file's (no adapter name), as save_pretrained writes it."""
    return n.replace(".default", "")


def set_masks(torch, pm, p, seed):
    """peft's dropout modules replaced by glmtrain's masks (backend/mask_hash.h, tests/py/glm_ref.py's
    dropout_keep) over the [b, s, in] tokens: module i of layer l seeded as model/peft.c's lora_seed,
    q_proj / k_proj / v_proj each its own (split_seed)."""
    import re
    import numpy as np
    from glm_ref import dropout_keep

    class Drop(torch.nn.Module):
        def __init__(self, seed):
            super().__init__()
            self.seed = seed

        def forward(self, x):
            keep = dropout_keep(self.seed, x.numel(), p).view(x.shape).to(x.dtype)
            return x * keep / (1 - float(np.float32(p)))

    index = {"q_proj": (0, 0), "k_proj": (0, 1), "v_proj": (0, 2), "o_proj": (1, 0), "gate_up_proj": (2, 0), "down_proj": (3, 0)}
    for name, mod in pm.named_modules():
        if hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout:
            l = int(re.search(r"layers\.(\d+)\.", name).group(1))
            i, k = index[name.rsplit(".", 1)[1]]
            sd = (seed + (l * 4 + i + 1) * 0x100000001B3 + k * 0x9E3779B97F4A7C15) % (1 << 64)
            mod.lora_dropout["default"] = Drop(sd)


def peft_case(torch, pm, folder, ids, labels, drop=0.0, f64=False):
    """A peft model's adapters drawn away from zero (0.1 randn: larger, the LoRA terms swamp the base
    and fp32 loses digits; with drop, glmtrain's dropout masks), saved into folder; its loss and the
    adapters' gradients by the file's names without peft's prefix. f64: computed in float64 from the
    saved fp32 values (DoRA's row scales make peft's own fp32 rounding reach 1e-5 in the deepest
    layer's gradients)."""
    if drop:
        set_masks(torch, pm, drop, 1234)
    with torch.no_grad():
        for n_, p_ in pm.named_parameters():
            if "magnitude" in n_:  # DoRA's, from the row norms peft starts it at: c = m / n off 1
                p_.mul_(1 + 0.1 * torch.randn_like(p_))
            elif "lora_" in n_:
                p_.copy_(0.1 * torch.randn_like(p_))
    pm.save_pretrained(folder)
    if f64:
        pm.double()
    pm.zero_grad()
    loss = pm(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss, {peft_name(n_)[len("base_model.model."):]: p_.grad for n_, p_ in pm.named_parameters() if "lora_" in n_}


def lora_vs_driver(name, mdir, bpath, out, args, loss, ref, n_rows):
    """tool_model_driver with an adapter (args) against the reference's loss and adapter gradients
    (ref: THUDM's names, n_rows of them), each within 1e-5."""
    p = subprocess.run([DRIVER, "--model", mdir, "--batch", bpath, "--out", out] + args, capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        return report(name, False, (p.stdout + p.stderr)[-400:])
    from safetensors.torch import load_file
    got = load_file(out)
    worst = max((rel(got["grad/" + k], v), k) for k, v in ref.items())
    lerr = abs(got["loss"].item() - loss.item()) / abs(loss.item())
    report(name, lerr <= 1e-5 and worst[0] <= 1e-5 and len(ref) == n_rows,
           "loss rel %.2g; worst %s rel %.2g; %d adapter rows" % (lerr, worst[1], worst[0], len(ref)))


def check_lora(torch, GlmConfig, GlmForCausalLM, d):
    sys.path.insert(1, PEFT_DIR)
    from peft import LoraConfig, PeftModel, get_peft_model
    mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]
    m = tiny_model(torch, GlmConfig, GlmForCausalLM, 96, 10000.0, 0, [2, 5], 11)
    base = os.path.join(d, "lbase")
    m.save_pretrained(base, safe_serialization=True)
    for rslora, drop in ((False, 0.0), (True, 0.0), (False, 0.25)):
        pm = get_peft_model(tiny_model(torch, GlmConfig, GlmForCausalLM, 96, 10000.0, 0, [2, 5], 11),
                            LoraConfig(r=4, lora_alpha=12, target_modules=mods, lora_dropout=drop, use_rslora=rslora))
        ad = os.path.join(d, "peft-%d-%g" % (rslora, drop))
        bpath, ids, labels = write_batch(torch, d, "lbatch.json", 96, [(5, 7), (3, 4), (9, 6)], 3, 0)
        loss, ref = peft_case(torch, pm, ad, ids, labels, drop)
        ref = stacked(ref)
        extra = ["--finetuning_type", "lora", "--lora_target", ",".join(mods), "--lora_rank", "4", "--lora_alpha", "12",
                 "--adapter", ad] + (["--use_rslora"] if rslora else []) + (
                 ["--lora_dropout", str(drop), "--dropout_seed", "1234"] if drop else [])
        lora_vs_driver("glm_hf_lora_grads_equal_peft_rslora_%d_dropout_%g" % (rslora, drop), base, bpath,
                       os.path.join(d, "lout.safetensors"), extra, loss, ref, 16)
    # DoRA (peft 0.10's use_dora): q, k and v each with its own magnitude and row norms, and its
    # own dropout mask on the base product's share too. Against peft in float64: DoRA's row scales
    # make fp32 rounding depend on the batch (layer 0's k block of A reached 1.3e-5 on the batch
    # above, peft's own fp32 3.7e-6 there; 0.7-5e-6 on three other batches, this one among them)
    dpath, dids, dlabels = write_batch(torch, d, "dbatch.json", 96, [(5, 7), (3, 4), (9, 6)], 5, 0)
    for drop in (0.0, 0.25):
        pm = get_peft_model(tiny_model(torch, GlmConfig, GlmForCausalLM, 96, 10000.0, 0, [2, 5], 11),
                            LoraConfig(r=4, lora_alpha=12, target_modules=mods, lora_dropout=drop, use_dora=True))
        ad = os.path.join(d, "peft-dora-%g" % drop)
        loss, ref = peft_case(torch, pm, ad, dids, dlabels, drop, f64=True)
        ref = stacked(ref)
        lora_vs_driver("glm_hf_dora_grads_equal_peft_dropout_%g" % drop, base, dpath, os.path.join(d, "dout.safetensors"),
                       ["--finetuning_type", "lora", "--lora_target", ",".join(mods), "--lora_rank", "4", "--lora_alpha",
                        "12", "--use_dora", "--adapter", ad] + (["--lora_dropout", str(drop), "--dropout_seed", "1234"]
                                                                if drop else []), loss, ref, 24)
    # q_proj and v_proj alone (LLaMA-Factory's common choice): k's rows stay zero, which is no adapter
    pm = get_peft_model(tiny_model(torch, GlmConfig, GlmForCausalLM, 96, 10000.0, 0, [2, 5], 11),
                        LoraConfig(r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0))
    qv = os.path.join(d, "peft-qv")
    loss, ref = peft_case(torch, pm, qv, ids, labels)
    for l in range(2):  # k_proj's place in the stack: zeros
        for ab, shape in (("A", (4, 32)), ("B", (16, 4))):
            ref["model.layers.%d.self_attn.k_proj.lora_%s.weight" % (l, ab)] = torch.zeros(*shape)
    ref = stacked(ref)
    lora_vs_driver("glm_hf_lora_q_v_alone_equal_peft", base, bpath, os.path.join(d, "qvout.safetensors"),
                   ["--finetuning_type", "lora", "--lora_target", "q_proj,v_proj,down_proj", "--lora_rank", "4",
                    "--lora_alpha", "12", "--adapter", qv], loss, ref, 8)
    # THUDM's one adapter on query_key_value on this layout: q, k, v each get its A, the same model
    from safetensors.torch import save_file
    odir, fused = save_thudm(m, os.path.join(d, "lorig"), {}), os.path.join(d, "fused")
    os.makedirs(fused, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    save_file({"base_model.model.transformer.encoder.layers.%d.self_attention.query_key_value.lora_%s.weight" % (l, ab):
               0.1 * torch.randn(*shape, generator=g) for l in range(2) for ab, shape in (("A", (4, 32)), ("B", (64, 4)))},
              os.path.join(fused, "adapter_model.safetensors"))
    json.dump({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["query_key_value"], "lora_dropout": 0.0,
               "bias": "none", "task_type": "CAUSAL_LM"}, open(os.path.join(fused, "adapter_config.json"), "w"))
    losses_ = []
    for mdl in (odir, base):
        p = subprocess.run([DRIVER, "--model", mdl, "--batch", bpath, "--out", os.path.join(d, "fout.safetensors"),
                            "--finetuning_type", "lora", "--lora_target", "query_key_value", "--lora_rank", "4",
                            "--adapter", fused], capture_output=True, text=True, timeout=300)
        losses_.append(float(p.stdout.split()[1]) if p.returncode == 0 else float("nan"))
        why = (p.stdout + p.stderr)[-300:]
    report("glm_hf_thudm_adapter_on_transformers_layout", abs(losses_[0] - losses_[1]) <= 1e-6 * abs(losses_[0]),
           "THUDM layout %.8f, transformers' %.8f %s" % (losses_[0], losses_[1], why if losses_[1] != losses_[1] else ""))
    return base, bpath, ids, labels


def train_adapter(base_tok, d, out, flags, steps=3):
    """`glmtrain train` of an adapter (rank 4) on the guide-style records of check_train; its
    adapter_config.json and the names in its adapter_model.safetensors."""
    from safetensors import safe_open
    run(["--model_name_or_path", base_tok, "--finetuning_type", "lora", "--lora_rank", "4", "--train_file",
         os.path.join(d, "conv.jsonl"), "--learning_rate", "5e-3", "--seed", "7", "--max_source_length", "32",
         "--max_target_length", "32", "--disable_tqdm", "--report_to", "none", "--max_steps", str(steps), "--save_steps",
         str(steps), "--output_dir", out, "--per_device_train_batch_size", "8"] + flags, timeout=300)
    with safe_open(os.path.join(out, "adapter_model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    return json.load(open(os.path.join(out, "adapter_config.json"))), names


def peft_loss(torch, GlmForCausalLM, base_tok, adapter, ids, labels):
    """The loss of PeftModel.from_pretrained(GlmForCausalLM of base_tok, adapter)."""
    from peft import PeftModel
    pm = PeftModel.from_pretrained(GlmForCausalLM.from_pretrained(base_tok, attn_implementation="eager").float().eval(),
                                   adapter).eval()
    with torch.no_grad():
        return pm(input_ids=ids, labels=labels).loss.item()


def merged_loss(torch, GlmForCausalLM, base_tok, adapter, out, ids, labels):
    """`glmtrain merge` of adapter into base_tok (float32) at out; the merged model's loss in transformers."""
    run(["--model_name_or_path", base_tok, "--adapter", adapter, "--output_dir", out, "--dtype", "float32"], cmd="merge")
    with torch.no_grad():
        return GlmForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()(input_ids=ids,
                                                                                             labels=labels).loss.item()


def check_lora_cli(torch, GlmForCausalLM, d, base_tok, lbase, bpath, ids, labels):
    from peft import PeftModel
    out = os.path.join(d, "lora")
    run(["--model_name_or_path", base_tok, "--finetuning_type", "lora", "--lora_target", "all", "--lora_rank", "4",
         "--train_file", os.path.join(d, "conv.jsonl"), "--learning_rate", "5e-3", "--logging_steps", "1", "--seed", "7",
         "--max_source_length", "32", "--max_target_length", "32", "--disable_tqdm", "--report_to", "none",
         "--max_steps", "4", "--save_steps", "4", "--output_dir", out, "--per_device_train_batch_size", "8"], timeout=300)
    cfg = json.load(open(os.path.join(out, "adapter_config.json")))
    from safetensors import safe_open
    with safe_open(os.path.join(out, "adapter_model.safetensors"), "pt") as f:
        names = sorted(f.keys())
    report("glm_hf_lora_saved_with_transformers_names",
           sorted(cfg["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]) and
           len(names) == 24 and all(n.startswith("base_model.model.model.layers.") for n in names),
           "target_modules %s; %d tensors, e.g. %s" % (cfg["target_modules"], len(names), names[:2]))
    t = GlmForCausalLM.from_pretrained(base_tok, attn_implementation="eager").float().eval()
    with torch.no_grad():
        without = t(input_ids=ids, labels=labels).loss.item()
    pm = PeftModel.from_pretrained(t, out).eval()
    with torch.no_grad():
        ref = pm(input_ids=ids, labels=labels).loss.item()
    p = subprocess.run([DRIVER, "--model", base_tok, "--batch", bpath, "--out", os.path.join(d, "lout2.safetensors"),
                        "--finetuning_type", "lora", "--lora_target", ",".join(cfg["target_modules"]), "--lora_rank", "4",
                        "--lora_alpha", str(cfg["lora_alpha"]), "--adapter", out], capture_output=True, text=True, timeout=300)
    from safetensors.torch import load_file
    got = load_file(os.path.join(d, "lout2.safetensors"))["loss"].item() if p.returncode == 0 else float("nan")
    report("glm_hf_lora_adapter_loads_in_peft", abs(got - ref) <= 1e-5 * abs(ref) and abs(ref - without) > 1e-3,
           "peft %.7f glmtrain %.7f, the base alone %.7f %s" % (ref, got, without,
                                                              (p.stdout + p.stderr)[-300:] if p.returncode else ""))
    # trained on q_proj and v_proj alone: the files hold those two, peft loads them, merge agrees
    qv = os.path.join(d, "lora-qv")
    qcfg, qnames = train_adapter(base_tok, d, qv, ["--lora_target", "q_proj,v_proj"])
    qref = peft_loss(torch, GlmForCausalLM, base_tok, qv, ids, labels)
    qmerged = merged_loss(torch, GlmForCausalLM, base_tok, qv, os.path.join(d, "merged-qv"), ids, labels)
    report("glm_hf_lora_q_v_alone_trained", sorted(qcfg["target_modules"]) == ["q_proj", "v_proj"] and len(qnames) == 8 and
           not any("k_proj" in x for x in qnames) and abs(qmerged - qref) <= 1e-5 * abs(qref) and abs(qref - without) > 1e-4,
           "target_modules %s, %d tensors; peft %.7f merged %.7f base %.7f" % (qcfg["target_modules"], len(qnames), qref, qmerged,
                                                                            without))
    # 2 CPU ranks (ZeRO 0 and 1) equal 1 rank for the split adapters; pipeline stages refused for now
    common = ["--model_name_or_path", base_tok, "--finetuning_type", "lora", "--lora_target", "q_proj,v_proj,down_proj",
              "--lora_dropout", "0", "--train_file", os.path.join(d, "conv.jsonl"), "--learning_rate", "5e-3",
              "--logging_steps", "1", "--seed", "7", "--max_source_length", "32", "--max_target_length", "32",
              "--disable_tqdm", "--report_to", "none", "--max_steps", "4", "--save_steps", "4"]
    run(common + ["--output_dir", os.path.join(d, "dp1"), "--per_device_train_batch_size", "8"], timeout=300)
    one = losses(os.path.join(d, "dp1"), 4)
    if probe(common + ["--output_dir", os.path.join(d, "dp-probe"), "--per_device_train_batch_size", "4", "--max_steps", "1",
                       "--save_steps", "1"], "glm_hf_lora_2_ranks", "split adapters"):
        for z in ("0", "1"):
            out2 = os.path.join(d, "dp2-%s" % z)
            run(common + ["--output_dir", out2, "--per_device_train_batch_size", "4", "--zero_stage", z], np=2, timeout=300)
            two = losses(out2, 4)
            worst = max(abs(two[k] - one[k]) / abs(one[k]) for k in one) if len(two) == 4 else float("inf")
            report("glm_hf_lora_2_ranks_zero%s_equal_1_rank" % z, worst <= 1e-6, "worst relative loss difference %.2g" % worst)
        # 2 pipeline stages: the adapter gathered from the stages is the one process's, under its names
        run(common + ["--output_dir", os.path.join(d, "pp2"), "--per_device_train_batch_size", "8",
                      "--pipeline_parallel_size", "2"], np=2, timeout=300)
        a = load_file(os.path.join(d, "dp1", "adapter_model.safetensors"))
        b = load_file(os.path.join(d, "pp2", "adapter_model.safetensors"))
        diff = max(float((a[k] - b[k]).abs().max()) for k in a) if sorted(a) == sorted(b) else float("inf")
        report("glm_hf_lora_pipeline_adapter_equals_one_process", diff <= 1e-6,
               "names %s / %s; max diff %.2g" % (sorted(a)[:1], sorted(b)[:1], diff))
        # and a full fine-tune's final model: shards and index under transformers' names
        full = [x for x in common if x not in ("lora", "q_proj,v_proj,down_proj", "--lora_target", "--lora_dropout", "0")]
        full[full.index("--finetuning_type") + 1:full.index("--finetuning_type") + 1] = ["full"]
        run(full + ["--output_dir", os.path.join(d, "ppf"), "--per_device_train_batch_size", "8",
                    "--pipeline_parallel_size", "2"], np=2, timeout=300)
        run(full + ["--output_dir", os.path.join(d, "ppf1"), "--per_device_train_batch_size", "8"], timeout=300)
        t3 = GlmForCausalLM.from_pretrained(os.path.join(d, "ppf"), attn_implementation="eager").float().eval()
        t4 = GlmForCausalLM.from_pretrained(os.path.join(d, "ppf1"), attn_implementation="eager").float().eval()
        with torch.no_grad():
            l3, l4 = (t_(input_ids=ids, labels=labels).loss.item() for t_ in (t3, t4))
        report("glm_hf_full_pipeline_model_loads_in_transformers", abs(l3 - l4) <= 1e-5 * abs(l4),
               "2 stages %.7f, one process %.7f" % (l3, l4))
    merged = os.path.join(d, "merged")
    run(["--model_name_or_path", base_tok, "--adapter", out, "--output_dir", merged, "--dtype", "float32"], cmd="merge")
    mt = GlmForCausalLM.from_pretrained(merged, attn_implementation="eager").float().eval()
    with torch.no_grad():
        mref = mt(input_ids=ids, labels=labels).loss.item()
    report("glm_hf_lora_merged_equals_peft", abs(mref - ref) <= 1e-5 * abs(ref), "merged %.7f peft %.7f" % (mref, ref))


def sandwich(torch, m):
    """GlmForCausalLM -> GLM-4-0414's layers: two more GlmRMSNorms per layer, in modeling_glm4.py's order."""
    import types
    from transformers.models.glm.modeling_glm import GlmRMSNorm

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None, output_attentions=False,
                use_cache=False, cache_position=None, position_embeddings=None, **kw):
        residual = hidden_states
        h, w, present = self.self_attn(hidden_states=self.input_layernorm(hidden_states), attention_mask=attention_mask,
                                       position_ids=position_ids, past_key_value=past_key_value,
                                       output_attentions=output_attentions, use_cache=use_cache,
                                       cache_position=cache_position, position_embeddings=position_embeddings, **kw)
        h = residual + self.post_self_attn_layernorm(h)
        h = h + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(h)))
        return (h,) + ((w,) if output_attentions else ()) + ((present,) if use_cache else ())

    cfg = m.config
    for layer in m.model.layers:
        layer.post_self_attn_layernorm = GlmRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        layer.post_mlp_layernorm = GlmRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        with torch.no_grad():
            for n in (layer.post_self_attn_layernorm, layer.post_mlp_layernorm):
                n.weight.copy_(1 + 0.2 * torch.randn_like(n.weight))
        layer.forward = types.MethodType(forward, layer)
    return m


def save_0414(torch, m, folder):
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in m.state_dict().items()}, os.path.join(folder, "model.safetensors"))
    c = m.config
    json.dump({"architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "vocab_size": c.vocab_size,
               "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
               "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
               "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "partial_rotary_factor": 0.5,
               "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
               "rope_theta": c.rope_theta, "attention_bias": True, "tie_word_embeddings": False,
               "pad_token_id": c.pad_token_id, "eos_token_id": c.eos_token_id}, open(os.path.join(folder, "config.json"), "w"))


def check_dora_pissa_cli(torch, GlmForCausalLM, d, base_tok, bpath, ids, labels):
    """DoRA and PiSSA on peft's q_proj, k_proj, v_proj (and the rest) through the command line."""
    from safetensors.torch import load_file
    with torch.no_grad():
        without = GlmForCausalLM.from_pretrained(base_tok, attn_implementation="eager").float().eval()(
            input_ids=ids, labels=labels).loss.item()
    # DoRA on every module: its magnitudes saved under q_proj / k_proj / v_proj's names, loaded by
    # peft, merged per block
    dd = os.path.join(d, "dora")
    _, dnames = train_adapter(base_tok, d, dd, ["--lora_target", "all", "--use_dora"])
    dref = peft_loss(torch, GlmForCausalLM, base_tok, dd, ids, labels)
    p = subprocess.run([DRIVER, "--model", base_tok, "--batch", bpath, "--out", os.path.join(d, "dout2.safetensors"),
                        "--finetuning_type", "lora", "--lora_target", "all", "--lora_rank", "4", "--use_dora", "--adapter", dd],
                       capture_output=True, text=True, timeout=300)
    dgot = load_file(os.path.join(d, "dout2.safetensors"))["loss"].item() if p.returncode == 0 else float("nan")
    dmerged = merged_loss(torch, GlmForCausalLM, base_tok, dd, os.path.join(d, "merged-dora"), ids, labels)
    mags = [x for x in dnames if "magnitude" in x]
    report("glm_hf_dora_trained_loads_in_peft_and_merges",
           len(mags) == 12 and any("k_proj.lora_magnitude_vector" in x for x in mags) and
           abs(dgot - dref) <= 1e-5 * abs(dref) and abs(dmerged - dref) <= 1e-5 * abs(dref) and abs(dref - without) > 1e-4,
           "%d magnitudes (%s); peft %.7f glmtrain %.7f merged %.7f base %.7f %s" % (
               len(mags), mags[:1], dref, dgot, dmerged, without, (p.stdout + p.stderr)[-300:] if p.returncode else ""))
    p = subprocess.run([GLM, "train", "--model_name_or_path", base_tok, "--finetuning_type", "lora", "--lora_target",
                        "q_proj,v_proj", "--use_dora", "--train_file", os.path.join(d, "conv.jsonl"), "--output_dir",
                        os.path.join(d, "dora-qv")], capture_output=True, text=True, timeout=120, env=ENV)
    report("glm_hf_dora_on_some_of_qkv_refused", p.returncode != 0 and "all three" in p.stderr, p.stderr[-300:])
    # PiSSA on every module: q, k and v each from its own rows' SVD (--pissa_iter -1: the full SVD's
    # triplets); after training, the PiSSA folder merged, its converted form (a plain LoRA of rank 2r
    # for the original base) in peft and merged, give one loss
    pi = os.path.join(d, "pissa")
    pcfg, _ = train_adapter(base_tok, d, pi, ["--lora_target", "all", "--pissa_init", "--pissa_iter", "-1", "--pissa_convert",
                                              "--lora_dropout", "0", "--logging_steps", "1"])
    # its first loss is the base's (W - s B0 A0 + s B0 A0): check_lora_cli's LoRA run's, whose B starts at 0
    first, first_lora = losses(pi, 3)[1], losses(os.path.join(d, "lora"), 4)[1]
    init = load_file(os.path.join(pi, "pissa_init", "adapter_model.safetensors"))
    sd = load_file(os.path.join(base_tok, "model.safetensors"))
    worst, scale = 0.0, pcfg["lora_alpha"] / 4.0
    for mod in ("q_proj", "k_proj", "v_proj", "o_proj"):
        U, S, Vh = torch.linalg.svd(sd["model.layers.0.self_attn.%s.weight" % mod].double(), full_matrices=False)
        want = U[:, :4] @ torch.diag(S[:4]) @ Vh[:4]
        key = "base_model.model.model.layers.0.self_attn.%s.lora_%s.weight"
        got_ = scale * init[key % (mod, "B")].double() @ init[key % (mod, "A")].double()
        worst = max(worst, float((got_ - want).abs().max() / want.abs().max()))
    conv = os.path.join(pi, "pissa_converted")
    ccfg = json.load(open(os.path.join(conv, "adapter_config.json")))
    cref = peft_loss(torch, GlmForCausalLM, base_tok, conv, ids, labels)
    got_l = [merged_loss(torch, GlmForCausalLM, base_tok, src, os.path.join(d, name), ids, labels)
             for src, name in ((pi, "merged-pissa"), (conv, "merged-pissa-conv"))]
    # the folder loaded as it is (its base made the residual from pissa_init/): the merged model's answer
    gens = []
    for mdl, extra in ((base_tok, ["--adapter", pi]), (os.path.join(d, "merged-pissa"), [])):
        p = subprocess.run([GLM, "generate", "--model_name_or_path", mdl, "--tokenizer_name", base_tok, "--prompt", "你好",
                            "--do_sample", "false", "--max_new_tokens", "6", "--debug"] + extra, capture_output=True,
                           text=True, timeout=120, env=ENV)
        gens.append([l for l in p.stderr.splitlines() if l.startswith("[debug] token")] if p.returncode == 0 else p.stderr[-200:])
    report("glm_hf_pissa_split_folder_generates_as_merged", gens[0] == gens[1] and len(gens[0]) == 6, "%s / %s" % (
        gens[0][:2], gens[1][:2]))
    report("glm_hf_pissa_split_q_k_v",
           worst <= 1e-4 and ccfg["r"] == 8 and all(abs(x - cref) <= 1e-5 * abs(cref) for x in got_l) and
           abs(first - first_lora) <= 1e-5 * abs(first_lora) and
           abs(cref - without) > 1e-4 and len([k for k in init if "k_proj" in k]) == 4,
           "s B0 A0 against the SVD's top 4 %.2g; first loss %.7f (LoRA's %.7f); converted r %s; peft(converted) %.7f, "
           "merged PiSSA %s, base %.7f" % (worst, first, first_lora, ccfg["r"], cref, ["%.7f" % x for x in got_l], without))


def check_0414(torch, GlmConfig, GlmForCausalLM, d, tdir, n):
    sys.path.insert(1, PEFT_DIR)
    from peft import LoraConfig, get_peft_model
    m = sandwich(torch, tiny_model(torch, GlmConfig, GlmForCausalLM, 96, 10000.0, 0, [2, 5], 13))
    mdir = os.path.join(d, "g0414")
    save_0414(torch, m, mdir)
    bpath, ids, labels = write_batch(torch, d, "b0414.json", 96, [(5, 7), (3, 4), (9, 6)], 4, 0)
    loss, lerr, worst, ref, got = full_grads(torch, m, mdir, bpath, ids, labels, os.path.join(d, "o0414.safetensors"))
    norms = sum("post_mlp_layernorm" in k or "post_self_attn_layernorm" in k for k in ref)
    report("glm4_0414_loss_and_grads_equal_reference", lerr <= 1e-5 and worst[0] <= 1e-5 and norms == 4 and
           len(ref) == sum(k.startswith("grad/") for k in got),
           "loss rel %.2g; worst %s rel %.2g; %d grads, %d of the new norms" % (lerr, worst[1], worst[0], len(ref), norms))
    p = run(["--from", mdir, "--to", os.path.join(d, "g0414-thudm"), "--layout", "thudm"], cmd="convert", check=False)
    report("glm4_0414_to_thudm_layout_refused", p.returncode != 0 and "transformers' layout only" in p.stderr, p.stderr[-300:])
    same = []
    for level in (["--gradient_checkpointing"], ["--gradient_checkpointing", "selective"]):
        p = subprocess.run([DRIVER, "--model", mdir, "--batch", bpath, "--out", os.path.join(d, "c0414.safetensors")] + level,
                           capture_output=True, text=True, timeout=300)
        from safetensors.torch import load_file
        ck = load_file(os.path.join(d, "c0414.safetensors")) if p.returncode == 0 else {}
        same.append(bool(ck) and all(torch.equal(ck[k], got[k]) for k in got))
    report("glm4_0414_checkpointing_bit_identical", all(same), "full %s, selective %s" % tuple(same))
    mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=mods, lora_dropout=0.0))
    ad = os.path.join(d, "p0414")
    loss, ref = peft_case(torch, pm, ad, ids, labels)
    ref = stacked(ref)
    lora_vs_driver("glm4_0414_lora_grads_equal_peft", mdir, bpath, os.path.join(d, "l0414.safetensors"),
                   ["--finetuning_type", "lora", "--lora_target", ",".join(mods), "--lora_rank", "4", "--lora_alpha", "8",
                    "--adapter", ad], loss, ref, 16)
    # training from a GLM-4-0414 folder with the tokenizer.json: its names and config saved
    vocab = (n + len(SPECIALS) + 63) // 64 * 64
    sid = {s_: n + i for i, s_ in enumerate(SPECIALS)}
    m = sandwich(torch, tiny_model(torch, GlmConfig, GlmForCausalLM, vocab, 10000.0, sid["<|endoftext|>"],
                                   [sid["<|endoftext|>"], sid["<|user|>"]], 17))
    base = os.path.join(d, "g0414tok")
    save_0414(torch, m, base)
    shutil.copy(os.path.join(tdir, "tokenizer.json"), base)
    out = os.path.join(d, "o0414")
    run(["--model_name_or_path", base, "--train_file", os.path.join(d, "conv.jsonl"), "--learning_rate", "1e-3",
         "--logging_steps", "1", "--seed", "7", "--max_source_length", "32", "--max_target_length", "32", "--disable_tqdm",
         "--report_to", "none", "--max_steps", "3", "--save_steps", "3", "--output_dir", out,
         "--per_device_train_batch_size", "8"], timeout=300)
    cfg = json.load(open(os.path.join(out, "config.json")))
    from safetensors.torch import load_file
    sd = load_file(os.path.join(out, "model.safetensors"))
    missing, unexpected = m.load_state_dict(sd, strict=False)
    bpath, ids, labels = write_batch(torch, d, "b0414b.json", n, [(6, 5), (4, 8)], 9, sid["<|endoftext|>"])
    with torch.no_grad():
        ref = m.eval()(input_ids=ids, labels=labels).loss.item()
    got = driver(out, bpath, os.path.join(d, "o0414b.safetensors"))["loss"].item()
    p = subprocess.run([GLM, "generate", "--model_name_or_path", out, "--prompt", "写一句关于5的诗", "--do_sample", "false",
                        "--max_new_tokens", "6", "--repetition_penalty", "1.0", "--device", "cpu", "--debug"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    prompt, resp = debug_ids(p.stderr, "prompt").get(0), debug_ids(p.stderr, "response").get(0)
    seq, gen = list(prompt or []), []
    with torch.no_grad():
        for _ in range(6):
            nxt = int(m(torch.tensor([seq])).logits[0, -1].argmax())
            if nxt in (sid["<|endoftext|>"], sid["<|user|>"], sid["<|observation|>"]):
                break
            gen.append(nxt)
            seq.append(nxt)
    report("glm4_0414_generate_equals_reference_greedy", prompt is not None and resp == gen,
           "glmtrain %s, reference %s %s" % (resp, gen, "" if p.returncode == 0 else p.stderr[-300:]))
    report("glm4_0414_trained_folder_loads_in_reference", cfg.get("model_type") == "glm4" and not missing and not unexpected
           and abs(got - ref) <= 1e-5 * abs(ref), "model_type %s; missing %s unexpected %s; loss reference %.7f glmtrain %.7f" % (
               cfg.get("model_type"), missing[:3], unexpected[:3], ref, got))


def check_refusals(d, tdir):
    p = subprocess.run([GLM, "info", "--model_name_or_path", os.path.join(d, "base"), "--finetuning_type", "freeze",
                        "--num_layer_trainable", "1", "--freeze_trainable_modules", "self_attn", "--freeze_extra_modules",
                        "embed_tokens"], capture_output=True, text=True, timeout=60, env=ENV)
    report("glm_hf_freeze_takes_transformers_module_names", p.returncode == 0 and
           "layer 1 (self_attention) and word_embeddings train" in p.stdout, (p.stdout + p.stderr)[-300:])
    p = subprocess.run([GLM, "train", "--model_name_or_path", os.path.join(d, "orig"), "--finetuning_type", "lora",
                        "--lora_target", "q_proj,k_proj,v_proj", "--train_file", os.path.join(d, "conv.jsonl"),
                        "--output_dir", os.path.join(d, "lora-bad2"), "--max_steps", "1"], capture_output=True, text=True,
                       timeout=60, env=ENV)
    report("glm_hf_names_on_thudm_layout_refused", p.returncode != 0 and "transformers' GLM layout" in p.stderr, p.stderr[-300:])
    cfg = {"model_type": "glm", "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 48}
    path = os.path.join(d, "glm4.json")
    cfg.update(model_type="glm", head_dim=16)
    json.dump(cfg, open(path, "w"))
    p = subprocess.run([GLM, "info", "--init_from_config", path], capture_output=True, text=True, timeout=60, env=ENV)
    report("glm_hf_head_dim_mismatch_refused", p.returncode != 0 and "head_dim 16" in p.stderr, p.stderr[-300:])
    bad = os.path.join(d, "badtok")
    os.makedirs(bad, exist_ok=True)
    j = json.load(open(os.path.join(tdir, "tokenizer.json")))
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    json.dump(j, open(os.path.join(bad, "tokenizer.json"), "w"))
    p = subprocess.run([GLM, "tokenize", "--tokenizer", bad, "--text", "x"], capture_output=True, text=True, timeout=60,
                       env=ENV)
    report("glm_hf_foreign_tokenizer_json_refused", p.returncode != 0 and "tokenizer.json" in p.stderr and
           "not GLM-4's" in p.stderr, p.stderr[-300:])


def use_transformers_446(test, programs):
    """transformers 4.46 (and its tokenizers) first on sys.path, Debian's copies forgotten; False
    (with a SKIP line for `test`) when it or one of the programs is missing."""
    if not os.path.isfile(os.path.join(TF_DIR, "transformers", "models", "glm", "modeling_glm.py")):
        print("SKIP %s: transformers 4.46 is not in %s (scripts/install-deps.sh puts it there)" % (test, TF_DIR))
        return False
    if not all(os.access(p, os.X_OK) for p in programs):
        print("SKIP %s: %s not built" % (test, " or ".join(programs)))
        return False
    sys.path.insert(0, TF_DIR)
    for k in [k for k in sys.modules if k.split(".")[0] in ("transformers", "tokenizers", "huggingface_hub", "safetensors")]:
        del sys.modules[k]
    return True


def main():
    if not use_transformers_446("glm_hf", [DRIVER, GLM]):
        return 0
    import torch
    from transformers import GlmConfig, GlmForCausalLM
    d = tempfile.mkdtemp(prefix="glmtrain-glmhf-")
    try:
        check_grads(torch, GlmConfig, GlmForCausalLM, d)
        lbase, bpath, ids, labels = check_lora(torch, GlmConfig, GlmForCausalLM, d)
        tdir, tk, n, lines = make_tokenizer(d)
        check_tokenizer(tdir, tk, lines)
        check_more_specials(d, tdir, n)
        check_train(torch, GlmConfig, GlmForCausalLM, d, tdir, n)
        bpath, ids, labels = write_batch(torch, d, "batch3.json", n, [(6, 5), (4, 8)], 9, n)
        check_lora_cli(torch, GlmForCausalLM, d, os.path.join(d, "base"), lbase, bpath, ids, labels)
        check_dora_pissa_cli(torch, GlmForCausalLM, d, os.path.join(d, "base"), bpath, ids, labels)
        check_0414(torch, GlmConfig, GlmForCausalLM, d, tdir, n)
        check_refusals(d, tdir)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
