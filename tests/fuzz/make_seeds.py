#!/usr/bin/env python3
"""Writes the committed seed corpora under tests/fuzz/seeds/<target>/ (run from the repository
root: python3 tests/fuzz/make_seeds.py). Plain Python only: the torch pickles are assembled by
pickling stand-in classes registered under torch's names, the zip as torch.save lays it out.
Tokenizer models come from spm_train (tiny vocabularies, so each file is a few KB)."""
import collections, io, json, os, pickle, struct, subprocess, sys, tempfile, types, zipfile

ROOT = os.path.join("tests", "fuzz", "seeds")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ----
def st_file(header, nbytes):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(range(256))[:nbytes] + b"\0" * max(0, nbytes - 256)


def safetensors():
    put("safetensors", "ok", st_file({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                      "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]}}, 24))
    put("safetensors", "bf16_i64", st_file({"w": {"dtype": "BF16", "shape": [3, 1], "data_offsets": [0, 6]},
                                            "i": {"dtype": "I64", "shape": [], "data_offsets": [6, 14]}}, 14))
    put("safetensors", "overlap", st_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 16))
    put("safetensors", "f64_u8_bool", st_file({"d": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]},
                                               "u": {"dtype": "U8", "shape": [2, 2], "data_offsets": [16, 20]},
                                               "k": {"dtype": "BOOL", "shape": [1], "data_offsets": [20, 21]},
                                               "z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [21, 21]}}, 21))
    put("safetensors", "short_data", st_file({"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}}, 8))


# ---- torch .bin: pickles with torch's globals, without torch ----
def fake(modname, name):
    mod = sys.modules.setdefault(modname, types.ModuleType(modname))
    cls = type(name, (), {"__module__": modname, "__qualname__": name})
    setattr(mod, name, cls)
    return cls


FloatStorage, HalfStorage, BFloat16Storage = fake("torch", "FloatStorage"), fake("torch", "HalfStorage"), fake("torch", "BFloat16Storage")
_rt = fake("torch._utils", "_rebuild_tensor_v2")
_rp = fake("torch._utils", "_rebuild_parameter")


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, st, offset, size, stride):
        self.args = (st, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return (_rt, self.args)


class Param:
    def __init__(self, t):
        self.t = t

    def __reduce__(self):
        return (_rp, (self.t, True, collections.OrderedDict()))


class P(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def pkl(obj):
    b = io.BytesIO()
    P(b, protocol=2).dump(obj)
    return b.getvalue()


def torch_zip(obj, stores):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl(obj))
        for k, data in stores.items():
            z.writestr("archive/data/" + k, data)
        z.writestr("archive/version", "3\n")
    return b.getvalue()


def torchbin():
    s0, s1 = Storage(FloatStorage, "0", 16), Storage(HalfStorage, "1", 32)
    plain = collections.OrderedDict(w=Tensor(s0, 0, [2, 3], [3, 1]), b=Tensor(s1, 4, [3], [1]))
    views = collections.OrderedDict(a=Tensor(s0, 0, [12], [1]), v=Tensor(s0, 2, [4], [1]), t=Tensor(s0, 0, [4, 3], [1, 4]),
                                    p=Param(Tensor(Storage(BFloat16Storage, "1", 32), 0, [2], [1])))
    put("torchbin", "empty_dict_pkl", b"\x00\x80\x02}q\x00.")
    put("torchbin", "plain_pkl", b"\x00" + pkl(plain))
    put("torchbin", "views_pkl", b"\x00" + pkl(views))
    put("torchbin", "nested_pkl", b"\x00" + pkl({"state_dict": plain, "epoch": 3, "x": [1.5, None, True, "s"]}))
    stores = {"0": bytes(range(64)), "1": bytes(range(64, 128))}
    put("torchbin", "plain_zip", b"\x01" + torch_zip(plain, stores))
    put("torchbin", "views_zip", b"\x01" + torch_zip(views, stores))


# ---- config.json ----
CHATGLM6B = {
    "_name_or_path": "THUDM/chatglm-6b", "architectures": ["ChatGLMModel"],
    "auto_map": {"AutoConfig": "configuration_chatglm.ChatGLMConfig", "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration"},
    "bos_token_id": 130004, "eos_token_id": 130005, "mask_token_id": 130000, "gmask_token_id": 130001, "pad_token_id": 3,
    "hidden_size": 4096, "inner_hidden_size": 16384, "layernorm_epsilon": 1e-05, "max_sequence_length": 2048,
    "model_type": "chatglm", "num_attention_heads": 32, "num_layers": 28, "position_encoding_2d": True,
    "quantization_bit": 0, "pre_seq_len": None, "prefix_projection": False, "torch_dtype": "float16",
    "transformers_version": "4.27.1", "use_cache": True, "vocab_size": 130528,
}


def config():
    put("config", "chatglm6b.json", json.dumps(CHATGLM6B, indent=2))
    small = dict(CHATGLM6B, hidden_size=64, inner_hidden_size=256, num_layers=2, num_attention_heads=4, vocab_size=1000,
                 bos_token_id=4, eos_token_id=5, mask_token_id=6, gmask_token_id=7, max_sequence_length=128)
    put("config", "small.json", json.dumps(small))
    put("config", "untied_quant.json", json.dumps(dict(small, tie_word_embeddings=False, quantization_bit=8)))
    put("config", "cut_off.json", json.dumps(small)[:120])
    put("config", "bad_types.json", json.dumps(dict(small, hidden_size="64", num_layers=2.5, layernorm_epsilon=None,
                                                    position_encoding_2d=1, vocab_size=3e9)))
    put("config", "other_model.json", json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}))


# ---- --config files (byte 0 even) and command lines (byte 0 odd, NUL-separated) ----
def args_config():
    put("args_config", "full.json", b"\x00" + json.dumps({
        "model_name_or_path": "m", "train_file": "d.json", "output_dir": "out", "learning_rate": 2e-2,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_steps": 100, "bf16": True,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "save_total_limit": 2, "seed": 42, "zero_stage": 2,
        "resume_from_checkpoint": "latest", "max_memory_per_gpu": "70GiB", "report_to": "tensorboard",
        "ddp_bucket_cap_mb": 25, "nproc_per_node": "2", "device_map": "auto", "skip_bad_samples": True}, indent=1).encode())
    put("args_config", "types.json", b"\x00" + json.dumps({"max_steps": "12", "fp16": "false", "seed": 1.0, "warmup_steps": 1e14,
                                                           "adam_epsilon": 1e-300, "prompt_column": None, "eval_steps": -1}).encode())
    put("args_config", "bad.json", b"\x00{\"learnin_rate\": 1, \"bf16\": [true]}")
    put("args_config", "cut.json", b"\x00{\"output_dir\": \"o\", \"max_st")
    put("args_config", "empty.json", b"\x00{}")
    argv = ["--model_name_or_path", "m", "--learning_rate=1e-4", "--bf16", "--fp16", "false", "--max_steps", "10",
            "--lr_scheduler_type", "linear", "--resume_from_checkpoint", "--save_steps=5", "--seed", "-3"]
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1, "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.999], "eps": "auto", "weight_decay": 0}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto",
                                                             "warmup_num_steps": 10, "total_num_steps": "auto", "warmup_type": "linear"}},
          "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
          "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"},
                                "overlap_comm": True}, "steps_per_print": 10, "curriculum_learning": {"enabled": False}}
    put("args_config", "deepspeed.json", b"\x04" + json.dumps(ds, indent=1).encode())
    put("args_config", "deepspeed_cosine.json", b"\x14" + json.dumps({"train_batch_size": 2, "scheduler": {
        "type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.1, "cos_min_ratio": "auto"}}}).encode())
    put("args_config", "argv", b"\x01" + b"\0".join(a.encode() for a in argv))
    put("args_config", "argv_bad", b"\x01" + b"\0".join([b"--learning_rat", b"1", b"--max_steps", b"1e99", b"positional"]))


# ---- data files: byte 0 = reader settings (fuzz_json_records.c), then the file ----
def json_records():
    def opt(schema=0, container=3, skip=0, cols=0):
        return bytes([schema | container << 2 | skip << 4 | cols << 5])
    alp = [{"instruction": "写一首诗", "input": "", "output": "床前明月光"},
           {"instruction": "Translate", "input": "hello", "output": "你好", "history": [["q0", "a0"], ["q1", "a1"]], "system": "be brief"}]
    put("json_records", "alpaca_array", opt() + json.dumps(alp, ensure_ascii=False, indent=1).encode())
    put("json_records", "alpaca_jsonl", opt(1, 2) + "\n".join(json.dumps(r, ensure_ascii=False) for r in alp).encode() + b"\n")
    put("json_records", "advertisegen", opt() + "\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"content": "类型#上衣*颜色#红色", "summary": "一件红色上衣"}, {"content": "类型#裙", "summary": None}]).encode())
    put("json_records", "prompt_response", opt(2) + json.dumps([{"prompt": "p", "response": "r", "history": []},
                                                                 {"prompt": "p2", "response": "r2", "history": [["a", "b"]]}]).encode())
    put("json_records", "named_columns", opt(2, 2, 0, 1) + b'{"q": "x", "a": "y", "h": [["1", "2"]], "i": "in", "s": "sys"}\n{"q": "z", "a": "w"}\n')
    put("json_records", "sharegpt", opt(3) + json.dumps([{"conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}, {"from": "human", "value": "how?"},
        {"from": "gpt", "value": "fine"}], "system": "s"}]).encode())
    put("json_records", "messages", opt() + json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                                                    {"role": "assistant", "content": "a"}]}).encode() + b"\n")
    put("json_records", "bom_crlf", opt() + b"\xef\xbb\xbf" + b'{"instruction": "a", "output": "b"}\r\n{"instruction": "c", "output": "d"}\r\n')
    put("json_records", "bad_skip", opt(1, 2, 1) + b'{"instruction": "a", "output": "b"}\n{"instruction": 1}\n[1]\n{"instruction": "\xff", "output": "x"}\n{bad\n{"instruction": "e", "output": "f"}\n')
    put("json_records", "bad_array", opt(0, 1, 1) + b'[{"instruction": "a", "output": "b"}, {"instruction": "c", "output": ')
    put("json_records", "utf16", opt() + "[{\"instruction\": \"a\", \"output\": \"b\"}]".encode("utf-16"))
    put("json_records", "escapes", opt() + b'[{"instruction": "\\u4f60\\ud83d\\ude00\\n\\t\\u0000x", "output": "\\ud800"}]')
    # CSV (container 0): quotes, doubled quotes, line breaks in fields, CRLF, a ragged row, a BOM
    put("json_records", "csv_alpaca", opt(0, 0) + '\ufeffinstruction,input,output\r\n"写,诗","",床前明月光\r\n'
        '"say ""hi""",x,"two\nlines"\r\n\r\na,b,c\n'.encode())
    put("json_records", "csv_columns_bad", opt(2, 0, 1, 1) + b'q,a,i\nx,y,z\nshort,row\n"open,q,a\n')


# ---- SentencePiece models: tiny ones from spm_train (the charsmap from a small rule TSV, since
# nmt_nfkc's is 240 KB) ----
SPM_TEXT = ("The quick brown fox jumps over the lazy dog. 训练一个模型，你好世界。\n"
            "Tabs\tand  double  spaces, numbers 12345 and ÀÉÎ ﬁ ①.\n") * 40


def spm_model():
    with tempfile.TemporaryDirectory() as d:
        txt = os.path.join(d, "t.txt")
        open(txt, "w").write(SPM_TEXT)
        tsv = os.path.join(d, "rules.tsv")
        # source code points (hex) -> target code points: fullwidth/ligature/circled forms
        open(tsv, "w").write("41\t61\nFB01\t66 69\n2460\t31\nFF0C\t2C\n3000\t20\n")
        common = ["--input=" + txt, "--character_coverage=1.0", "--minloglevel=2"]
        runs = {
            "unigram_identity": ["--model_type=unigram", "--vocab_size=60", "--normalization_rule_name=identity"],
            "unigram_rules": ["--model_type=unigram", "--vocab_size=55", "--normalization_rule_tsv=" + tsv,
                              "--remove_extra_whitespaces=false"],
            "bpe_bytes": ["--model_type=bpe", "--vocab_size=350", "--byte_fallback=true", "--normalization_rule_name=identity"],
            "char": ["--model_type=char", "--normalization_rule_name=identity", "--add_dummy_prefix=false"],
            "word": ["--model_type=word", "--vocab_size=40", "--normalization_rule_name=identity", "--use_all_vocab=true"],
            "chatglm_like": ["--model_type=unigram", "--vocab_size=64", "--normalization_rule_name=identity",
                             "--user_defined_symbols=<n>,<|tab|>,<|blank_2|>,<|blank_3|>",
                             "--control_symbols=[MASK],[gMASK],<sop>,<eop>", "--pad_id=3", "--pad_piece=<pad>"],
            "suffix_ws": ["--model_type=bpe", "--vocab_size=80", "--normalization_rule_name=identity",
                          "--treat_whitespace_as_suffix=true", "--split_digits=true"],
        }
        for name, extra in runs.items():
            prefix = os.path.join(d, name)
            r = subprocess.run(["spm_train", "--model_prefix=" + prefix] + common + extra, capture_output=True, text=True)
            if r.returncode:
                print(name, r.stderr[-500:], file=sys.stderr)
                continue
            put("spm_model", name + ".model", open(prefix + ".model", "rb").read())


# ---- tokenizer input: byte 0 picks the tokenizer and flags (fuzz_tokenizer_text.c) ----
def tokenizer_text():
    texts = ["Hello world", "你好，世界！\n\n第二行\t制表符", "a    b" + " " * 90 + "c", "  leading and trailing  ",
             "[gMASK]<sop> <eop> <n> <|tab|> <|blank_4|> [MASK]", "ÀÉÎ ﬁ ① Ｆｕｌｌ　ｗｉｄｔｈ", "emoji 😀👍 and é (e\u0301)",
             "\x00nul\x00bytes", "1234567890 3.14159", "[[训练时间]] 问：你好?答：好!"]
    for i, t in enumerate(texts):
        for k, b0 in enumerate((0, 1 | 4, 2 | 8, 3)):
            put("tokenizer_text", "text%d_%d" % (i, k), bytes([b0]) + t.encode())
    put("tokenizer_text", "invalid_utf8", b"\x00\xff\xfe\xc0\x80\xed\xa0\x80abc\xf4\x90\x80\x80")
    put("tokenizer_text", "decode_ids", bytes([16]) + struct.pack("<12i", 0, 1, 2, 3, 4, 5, 100, 130001, 130004, -1, 1 << 30, 20005))
    put("tokenizer_text", "decode_ids_spm", bytes([16 | 4 | 1]) + struct.pack("<8i", 5, 6, 7, 8, 9, 10, 11, 12))


def serve_request():
    """Bodies for fuzz_serve_request: byte 0 bits 0-1 tokenizer, bit 2 chat, bit 3 THUDM's POST /,
    bits 4-5 max_model_len (16, 64, 512, 4096), bit 6 a served adapter."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "天气",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    chats = {
        "plain": {"model": "chatglm", "messages": [{"role": "user", "content": "你好"}]},
        "history": {"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "写一首诗"}],
                    "temperature": 0.8, "top_p": 0.9, "top_k": 40, "max_tokens": 8, "seed": -3, "stop": ["\n\n", "。"],
                    "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3},
        "parts": {"model": "lora-a", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}],
                  "max_completion_tokens": 4, "repetition_penalty": 1.1, "ignore_eos": True},
        "tools": {"model": "适配器-b", "messages": [{"role": "user", "content": "北京天气？"}], "tools": [weather],
                  "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "tool_turns": {"messages": [{"role": "user", "content": "北京天气？"},
                                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\": \"北京\"}"}}]},
                                    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 7.0}"}],
                       "tools": [weather], "tool_choice": "auto"},
        "functions": {"messages": [{"role": "user", "content": "x"},
                                   {"role": "assistant", "content": "get_weather\n tool_call(city='a')", "function_call": {"name": "get_weather", "arguments": "{}"}},
                                   {"role": "function", "name": "get_weather", "content": "sunny"}],
                      "functions": [weather["function"]], "function_call": "auto"},
        "required": {"messages": [{"role": "user", "content": "x"}], "tools": [weather], "tool_choice": "required", "n": 1},
        "bad_values": {"messages": [{"role": "user", "content": "x"}], "temperature": 3, "top_p": 0, "n": 2,
                       "presence_penalty": 1, "stop": ""},
    }
    for name, body in chats.items():
        text = json.dumps(body, ensure_ascii=False)
        for k, b0 in enumerate((4 | 0x20, 4 | 1 | 0x30, 4 | 2 | 0x30 | 0x40, 4 | 3)):
            put("serve_request", "chat_%s_%d" % (name, k), bytes([b0]) + text.encode())
    comps = {"prompt": {"model": "chatglm", "prompt": "你好", "max_tokens": 3, "logprobs": 2},
             "prompt_list": {"prompt": ["hello"], "echo": False, "best_of": 1, "temperature": 0},
             "prompt_bad": {"prompt": 5, "suffix": "x"},
             "logit_bias": {"prompt": [5, 6, 7], "logit_bias": {"5": 100, "6": -2.5, "x": 1}, "frequency_penalty": 0.5,
                            "presence_penalty": -1.0},
             "stop_ids": {"prompt": [5, 6, 7], "stop_token_ids": [5, 99999, "x"], "min_tokens": 2, "max_tokens": 1},
             "json_mode": {"prompt": "x", "response_format": {"type": "json_object"}, "max_tokens": 3},
             "json_schema": {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
             "json_schema_full": {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
                 "type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "array", "items": {
                     "enum": [1, "x", None]}, "minItems": 1, "maxItems": 2}, "c": {"type": "object", "properties": {
                         "d": {"const": True}}, "required": ["d"]}}, "required": ["a"]}}}},
             "guided_json": {"prompt": "x", "guided_json": "{\"type\": \"object\", \"properties\": {\"a\": {\"pattern\": 1}}}"},
             "guided_choice": {"prompt": "x", "guided_choice": ["正面", "负面", "", 5], "min_tokens": 1},
             "guided_both": {"prompt": "x", "guided_choice": ["a"], "response_format": {"type": "json_object"},
                             "ignore_eos": True}}
    for name, body in comps.items():
        put("serve_request", "completion_" + name, bytes([0x20]) + json.dumps(body, ensure_ascii=False).encode())
    thudm = {"plain": {"prompt": "你好", "history": []},
             "history": {"prompt": "再来", "history": [["你好", "你好！"]], "max_length": 100, "top_p": 0.7, "temperature": 0.95},
             "bad": {"prompt": "x", "history": [["only one"]]}}
    for name, body in thudm.items():
        put("serve_request", "thudm_" + name, bytes([8 | 0x20]) + json.dumps(body, ensure_ascii=False).encode())
    put("serve_request", "not_json", bytes([4]) + b'{"messages": [')
    # the bugs the target found: an error quoting a long name cut inside a character (invalid UTF-8
    # in the JSON sent back), and an empty message to a plain SentencePiece tokenizer (no ids)
    put("serve_request", "regression_cut_utf8", bytes([4]) + json.dumps({"model": "模" * 120, "messages": [{"role": "user", "content": "x"}]}, ensure_ascii=False).encode())
    put("serve_request", "regression_empty_prompt", bytes([4 | 3 | 0x30]) + b'{"model": "chatglm", "messages": [{"role": "user", "content": "\\u0000"}]}')
    put("serve_request", "long_model_name", bytes([4 | 0x20]) + json.dumps({"model": "模" * 120, "messages": []}, ensure_ascii=False).encode())


def tokenizer_folder():
    """tokenizer_config.json texts for fuzz_tokenizer_folder: byte 0 picks the model (bits 0-1) and
    the tokenization_chatglm.py (bits 2-3), the rest is the file."""
    v1 = {"name_or_path": "THUDM/chatglm-6b", "bos_token": "<sop>", "eos_token": "<eop>", "end_token": "</s>",
          "gmask_token": "[gMASK]", "mask_token": "[MASK]", "pad_token": "<pad>", "unk_token": "<unk>", "remove_space": False,
          "do_lower_case": False, "num_image_tokens": 0, "tokenizer_class": "ChatGLMTokenizer",
          "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}
    added = dict(v1, eos_token={"__type": "AddedToken", "content": "<eop>", "lstrip": False, "normalized": True,
                                "rstrip": False, "single_word": False}, num_image_tokens=20000)
    v3 = {"name_or_path": "THUDM/chatglm3-6b", "remove_space": False, "do_lower_case": False, "encode_special_tokens": True,
          "tokenizer_class": "ChatGLMTokenizer", "chat_template": "{% for message in messages %}<|{{ message['role'] }}|>{% endfor %}",
          "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}
    v2 = {"name_or_path": "THUDM/chatglm2-6b", "remove_space": False, "do_lower_case": False, "tokenizer_class": "ChatGLMTokenizer"}
    glm4 = {"tokenizer_class": "ChatGLM4Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
            "added_tokens_decoder": {"151329": {"content": "<|endoftext|>", "special": True}}}
    cases = {"v1_ice": (0, v1), "v1_added_token": (0, added), "v2_bpe": (1 | 4, v2), "v3_bpe": (1 | 8, v3),
             "v3_no_py": (1, v3), "glm4_ranks": (2, glm4), "lower_case": (0, dict(v1, do_lower_case=True)),
             "image_tokens_big": (0, dict(v1, num_image_tokens=1e12))}
    for name, (b0, conf) in cases.items():
        put("tokenizer_folder", name, bytes([b0]) + json.dumps(conf, ensure_ascii=False).encode())
    put("tokenizer_folder", "no_config", bytes([0]))


def dataset_info():
    """dataset_info.json files for fuzz_dataset_info: the first line is --dataset, the rest the file
    (beside it: d.json, e.jsonl and a folder sub)."""
    cases = {
        "alpaca": ("a", {"a": {"file_name": "d.json"}}),
        "columns": ("a,b", {"a": {"file_name": "d.json", "columns": {"prompt": "q", "query": "i", "response": "r", "history": "h",
                                                                    "system": "s"}},
                            "b": {"file_name": "e.jsonl", "formatting": "alpaca", "columns": {"prompt": "instruction"}}}),
        "sharegpt": (" s ,a", {"s": {"file_name": "e.jsonl", "formatting": "sharegpt",
                                     "columns": {"messages": "conversations", "system": "system"},
                                     "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                              "assistant_tag": "assistant"}},
                               "a": {"file_name": "d.json"}}),
        "hub": ("h", {"h": {"hf_hub_url": "x/y"}}),
        "ranking": ("r", {"r": {"file_name": "d.json", "ranking": True}}),
        "folder": ("f", {"f": {"file_name": "sub"}}),
        "null_columns": ("a", {"a": {"file_name": "d.json", "columns": {"prompt": None, "history": None}}}),
        "long_column": ("a", {"a": {"file_name": "d.json", "columns": {"prompt": "p" * 200}}}),
        "long_name": ("n" * 200, {"n" * 200: {"file_name": "d.json"}}),
        "images": ("a", {"a": {"file_name": "d.json", "columns": {"images": "img"}}}),
    }
    for name, (names, info) in cases.items():
        put("dataset_info", name, names + "\n" + json.dumps(info, ensure_ascii=False))


def adapter_config():
    """Folders for fuzz_adapter_config: byte 0 bit 0 P-Tuning (config.json), bit 1 no tensor file;
    the JSON text, a NUL, then tensor names one a line."""
    lora = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
            "target_modules": ["query_key_value"], "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
            "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
    qkv = ["base_model.model.transformer.layers.%d.attention.query_key_value.lora_%s.weight" % (l, ab) for l in range(2) for ab in "AB"]
    glm2 = ["base_model.model.transformer.encoder.layers.0.self_attention.query_key_value.lora_%s.weight" % ab for ab in "AB"]
    cases = {
        "lora": (0, lora, qkv),
        "lora_glm2_names": (0, lora, glm2),
        "lora_no_tensors": (2, lora, []),
        "regex": (0, dict(lora, target_modules=".*query_key_value"), qkv),
        "dotted": (0, dict(lora, target_modules=["attention.query_key_value", "mlp.dense_h_to_4h"]),
                   qkv + [n.replace("attention.query_key_value", "mlp.dense_h_to_4h") for n in qkv]),
        "one_layer": (0, dict(lora, target_modules=["layers.0.attention.query_key_value"]), qkv),
        "modules_to_save": (0, dict(lora, modules_to_save=["lm_head"]), qkv + ["base_model.model.lm_head.weight"]),
        "dora": (0, dict(lora, use_dora=True), qkv + [qkv[0].replace("lora_A.weight", "lora_magnitude_vector")]),
        "patterns": (0, dict(lora, rank_pattern={"dense": 4}, alpha_pattern={"dense": 2}), qkv),
        "rslora_all": (0, dict(lora, use_rslora=True, target_modules=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]),
                       [n.replace("attention.query_key_value", m) for n in qkv for m in
                        ["attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"]]),
        "ptuning": (1, {"model_type": "chatglm", "pre_seq_len": 128, "prefix_projection": False}, []),
        "ptuning_big": (1, {"pre_seq_len": 1e9}, []),
    }
    for name, (b0, conf, names) in cases.items():
        put("adapter_config", name, bytes([b0]) + json.dumps(conf).encode() + b"\0" + "\n".join(names).encode())
    # the bug the target found: a tensor named __metadata__ (the safetensors header's own key) was
    # written and then vanished on reading; st_save now refuses the name
    put("adapter_config", "regression_metadata_key", b'\0{ "target_modules": ["..all"]}"\0__metadata__')


def constraints():
    """Schemas and patterns for fuzz_constraints: byte 0 bit 0 a regex; the spec, a NUL, a text."""
    schemas = [
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-c]{1,3}"},
                                           "n": {"type": "number", "minimum": -1.5, "exclusiveMaximum": 0.25},
                                           "i": {"type": "integer", "minimum": 3, "maximum": 7}}, "required": ["a", "n"]},
         '{"a": "ab", "n": -0.125, "i": 5}'),
        ({"$defs": {"E": {"anyOf": [{"type": "object", "properties": {"op": {"const": "num"}, "v": {"type": "integer"}},
                                     "required": ["op", "v"]},
                                    {"type": "object", "properties": {"op": {"const": "add"}, "a": {"$ref": "#/$defs/E"},
                                                                      "b": {"$ref": "#/$defs/E"}}, "required": ["op", "a", "b"]}]}},
          "type": "object", "properties": {"e": {"$ref": "#/$defs/E"}}, "required": ["e"]},
         '{"e": {"op": "add", "a": {"op": "num", "v": 1}, "b": {"op": "num", "v": 2}}}'),
        ({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "array", "prefixItems": [
            {"type": "boolean"}], "items": {"type": ["string", "null"], "format": "date"}}}, "any": True,
            "w": {"type": "string", "format": "date-time"}}},
         '{"m": {"k": [true, "2024-01-31", null]}, "any": [1, {"x": "\u4e2d"}], "w": "2024-02-28T12:00:00Z"}'),
        ({"$defs": {"N": {"type": ["object", "null"], "properties": {"n": {"$ref": "#/$defs/N"}}, "required": ["n"]}},
          "type": "object", "properties": {"l": {"$ref": "#/$defs/N"}}, "required": ["l"]}, '{"l": {"n": {"n": null}}}'),
    ]
    schemas.append(({"type": "object", "properties": {
        "t": {"type": "array", "items": {"enum": ["a", "ab", 1, True]}, "uniqueItems": True},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
        "n": {"type": "string", "nullable": True}}}, '{"t": ["ab", 1], "m": {"k": 3}, "n": null}'))
    for i, (sc, text) in enumerate(schemas):
        put("constraints", "schema_%d" % i, b"\x00" + json.dumps(sc, ensure_ascii=False).encode() + b"\x00" + text.encode())
    patterns = [(r"\d{3}-[a-c]{2}|[中文]+x?", "555-ab"), (r"(?:yes|no)(, (?:yes|no))*", "yes, no"),
                (r"[^\"]{2,5}\.\w+", "中文ab.x1"), (r"(a|b)*c{1,3}[\u0080-\u07ff]?", "abacc\u00e9")]
    for i, (p, text) in enumerate(patterns):
        put("constraints", "regex_%d" % i, b"\x01" + p.encode() + b"\x00" + text.encode())


if __name__ == "__main__":
    which = sys.argv[1:] or ["safetensors", "torchbin", "json_records", "config", "args_config", "spm_model", "tokenizer_text"]
    for w in which:
        globals()[w]()
