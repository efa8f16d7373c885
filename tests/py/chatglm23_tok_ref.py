"""A Python re-implementation of THUDM's tokenization_chatglm.py for ChatGLM2-6B (HF
THUDM/chatglm2-6b) and ChatGLM3-6B (its final revision, with encode_special_tokens and
build_single_message) on top of Debian's python3-sentencepiece, without transformers: what the
C tokenizer is compared against (test_chatglm23_tok.py, test_chatglm23_data.py).

Hugging Face's slow-tokenizer machinery is reduced to what these classes use under the
transformers versions the repos pin (4.27 / 4.30): encode = tokenize (EncodeAsPieces; ChatGLM3
with encode_special_tokens splits the specials' names out first) -> convert_token_to_id per piece
(the specials' names first, so a SentencePiece piece "sop" becomes the special) -> prefix
[gMASK] sop when add_special_tokens; truncation keeps the first max_length - 2 text ids; decode =
DecodePieces over convert_id_to_token. No special-token text is split out otherwise: neither
tokenizer_config.json names eos/unk/pad tokens, so transformers registers none.

Also: a SentencePiece model in the real file's layout trained here with spm_train (train_model)
and tokenizer folders as the HF repos have them (write_folder). Not a test itself."""
import json
import os
import re
import subprocess

import sentencepiece as spm

V2_SPECIALS = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop"]
ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]


class ChatGLM2Tokenizer:
    """THUDM/chatglm2-6b's SPTokenizer + ChatGLMTokenizer."""
    specials = V2_SPECIALS

    def __init__(self, model_file):
        self.sp = spm.SentencePieceProcessor(model_file=model_file)
        self.n_words = self.sp.vocab_size()
        self.bos_id, self.eos_id, self.pad_id = self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id()
        self.special_tokens, self.index_special_tokens = {}, {}
        for tok in self.specials:
            self.special_tokens[tok] = self.n_words
            self.index_special_tokens[self.n_words] = tok
            self.n_words += 1

    @property
    def vocab_size(self):
        return self.n_words

    @property
    def eos_token_id(self):
        return self.eos_id

    @property
    def pad_token_id(self):
        return self.pad_id

    def get_command(self, token):
        cmd = {"<bos>": self.bos_id, "<eos>": self.eos_id, "<pad>": self.pad_id, "<unk>": self.pad_id}
        return cmd[token] if token in cmd else self.special_tokens[token]

    # SPTokenizer.encode: SentencePiece's ids as they are
    def sp_encode(self, s):
        assert type(s) is str
        return self.sp.encode(s)

    def tokenize(self, text):
        return self.sp.encode_as_pieces(text) if text else []

    def convert_token_to_id(self, token):
        return self.special_tokens[token] if token in self.special_tokens else self.sp.piece_to_id(token)

    def convert_id_to_token(self, index):
        if index in self.index_special_tokens or index in (self.eos_id, self.bos_id, self.pad_id) or index < 0:
            return ""
        return self.sp.id_to_piece(index)

    def encode(self, text, add_special_tokens=True, max_length=None):
        ids = [self.convert_token_to_id(p) for p in self.tokenize(text)]
        if max_length is not None:  # truncation=True: room is left for the special tokens
            ids = ids[:max(0, max_length - (2 if add_special_tokens else 0))]
        return self.build_inputs_with_special_tokens(ids) if add_special_tokens else ids

    def get_prefix_tokens(self):
        return [self.get_command("[gMASK]"), self.get_command("sop")]

    def build_inputs_with_special_tokens(self, a, b=None):
        a = self.get_prefix_tokens() + a
        if b is not None:
            a = a + b + [self.get_command("<eos>")]
        return a

    def decode(self, ids):
        return self.sp.decode_pieces([self.convert_id_to_token(i) for i in ids])

    def build_prompt(self, query, history=None):
        prompt = ""
        for i, (old_query, response) in enumerate(history or []):
            prompt += "[Round {}]\n\n问：{}\n\n答：{}\n\n".format(i + 1, old_query, response)
        prompt += "[Round {}]\n\n问：{}\n\n答：".format(len(history or []) + 1, query)
        return prompt


class ChatGLM3Tokenizer(ChatGLM2Tokenizer):
    """THUDM/chatglm3-6b's final tokenization_chatglm.py: role tokens, encode_special_tokens,
    build_single_message / build_chat_input, specials decoded as their names."""
    specials = V2_SPECIALS + ROLES

    def __init__(self, model_file, encode_special_tokens=False):
        super().__init__(model_file)
        self.encode_special_tokens = encode_special_tokens
        self.special_token_expression = "|".join(re.escape(t) for t in self.specials)

    def tokenize(self, text):
        if not self.encode_special_tokens:
            return super().tokenize(text)
        last, t = 0, []
        for m in re.finditer(self.special_token_expression, text):
            if last < m.start():
                t.extend(self.sp.encode_as_pieces(text[last:m.start()]))
            t.append(text[m.start():m.end()])
            last = m.end()
        if last < len(text):
            t.extend(self.sp.encode_as_pieces(text[last:]))
        return t

    def convert_id_to_token(self, index):
        if index in self.index_special_tokens:
            return self.index_special_tokens[index]
        if index in (self.eos_id, self.bos_id, self.pad_id) or index < 0 or index > self.sp.vocab_size():
            return ""
        return self.sp.id_to_piece(index)

    def build_single_message(self, role, metadata, message):
        assert role in ["system", "user", "assistant", "observation"], role
        role_tokens = [self.get_command(f"<|{role}|>")] + self.sp_encode(f"{metadata}\n")
        return role_tokens + self.sp_encode(message)

    def build_chat_input(self, query, history=None, role="user"):
        input_ids = []
        for item in history or []:
            content = item["content"]
            if item["role"] == "system" and "tools" in item:
                content = content + "\n" + json.dumps(item["tools"], indent=4, ensure_ascii=False)
            input_ids.extend(self.build_single_message(item["role"], item.get("metadata", ""), content))
        input_ids.extend(self.build_single_message(role, "", query))
        input_ids.extend([self.get_command("<|assistant|>")])
        return self.get_prefix_tokens() + input_ids

    def stop_ids(self):
        """model.chat's eos_token_id list."""
        return [self.eos_token_id, self.get_command("<|user|>"), self.get_command("<|observation|>")]


# ---------------------------------------------------------------- test tokenizers

CONFIG_V2 = {"name_or_path": "THUDM/chatglm2-6b", "remove_space": False, "do_lower_case": False,
             "tokenizer_class": "ChatGLMTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}
CONFIG_V3 = dict(CONFIG_V2, name_or_path="THUDM/chatglm3-6b")

# ChatGLM2/3's tokenizer.model as far as the spec knows it: <unk> 0, <s> 1, </s> 2, byte pieces
# <0x00>.. at 3..258, BPE, no NFKC folding, spaces kept, a dummy prefix
SPM_ARGS = ["--model_type=bpe", "--byte_fallback=true", "--normalization_rule_name=identity",
            "--remove_extra_whitespaces=false", "--add_dummy_prefix=true", "--split_digits=true",
            "--allow_whitespace_only_pieces=true", "--character_coverage=0.98", "--unk_id=0", "--bos_id=1",
            "--eos_id=2", "--pad_id=-1", "--num_threads=2", "--minloglevel=2"]

# words that make BPE learn the pieces "sop" and "eop", which HF's encode maps to the specials
SOP_WORDS = "isopropyl Aesop sop geop eop sopping aesop isop people deop ISOP sopwith geopolitics Prosopis lsop eopx"


def training_text(lines):
    """A small Chinese + English + code corpus (bytes lines from tokenizer_corpus.corpus)."""
    keep = [l for i, l in enumerate(lines) if i % 4 == 0 and 0 < len(l) < 400]
    keep += [SOP_WORDS.encode()] * 200
    return b"\n".join(keep)


def train_model(tmp, lines, vocab_size=4000):
    """Trains tokenizer.model in tmp with spm_train; returns its path."""
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "wb") as f:
        f.write(training_text(lines))
    prefix = os.path.join(tmp, "glm2spm")
    subprocess.run(["spm_train", "--input=" + corpus, "--model_prefix=" + prefix, "--vocab_size=%d" % vocab_size]
                   + SPM_ARGS, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return prefix + ".model"


def write_folder(path, model, config, py=None):
    """A tokenizer folder as the HF repos have it: tokenizer.model + tokenizer_config.json
    (+ tokenization_chatglm.py text when py is given)."""
    os.makedirs(path, exist_ok=True)
    with open(model, "rb") as f, open(os.path.join(path, "tokenizer.model"), "wb") as g:
        g.write(f.read())
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if py is not None:
        with open(os.path.join(path, "tokenization_chatglm.py"), "w") as f:
            f.write(py)
    return path
