"""ChatGLM-6B (v1) tokenizer: glmtrain's own small stand-in for THUDM's tokenization_chatglm.py,
written for tests/py/test_folder_interop.py from docs/chatglm-spec.md section 6 (not THUDM's
file). SentencePiece over ice_text.model with ChatGLM's pre-processing ("\\n" -> <n>, "\\t" ->
<|tab|>, runs of 2..80 spaces -> <|blank_N|>), ids offset by num_image_tokens, and
build_inputs_with_special_tokens appending [gMASK] <sop>. Enough to encode a prompt."""
import os
import re

import sentencepiece as spm
from transformers.tokenization_utils import PreTrainedTokenizer

MAX_BLANK = 80


def _preprocess(text):
    text = text.replace("\n", "<n>").replace("\t", "<|tab|>")
    return re.sub(" {2,%d}" % MAX_BLANK, lambda m: "<|blank_%d|>" % len(m.group(0)), text)


def _postprocess(text):
    text = text.replace("<n>", "\n").replace("<|tab|>", "\t")
    return re.sub(r"<\|blank_(\d+)\|>", lambda m: " " * int(m.group(1)), text)


class ChatGLMTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "ice_text.model"}
    model_input_names = ["input_ids", "attention_mask", "position_ids"]

    def __init__(self, vocab_file, do_lower_case=False, remove_space=False, bos_token="<sop>", eos_token="<eop>",
                 end_token="</s>", mask_token="[MASK]", gmask_token="[gMASK]", padding_side="left",
                 pad_token="<pad>", unk_token="<unk>", num_image_tokens=20000, **kwargs):
        # the SentencePiece model first: the base class may ask for the vocabulary while it sets up
        self.vocab_file = vocab_file
        self.sp = spm.SentencePieceProcessor(model_file=vocab_file)
        self.num_image_tokens = num_image_tokens
        self.do_lower_case = do_lower_case
        self.remove_space = remove_space
        self.end_token = end_token
        self.mask_token_str = mask_token
        self.gmask_token = gmask_token
        super().__init__(do_lower_case=do_lower_case, remove_space=remove_space, padding_side=padding_side,
                         bos_token=bos_token, eos_token=eos_token, end_token=end_token, mask_token=mask_token,
                         gmask_token=gmask_token, pad_token=pad_token, unk_token=unk_token,
                         num_image_tokens=num_image_tokens, **kwargs)

    @property
    def vocab_size(self):
        return self.num_image_tokens + self.sp.get_piece_size()

    def get_vocab(self):
        vocab = {self._convert_id_to_token(i): i for i in range(self.vocab_size)}
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text, **kwargs):
        if self.remove_space:
            text = " ".join(text.strip().split())
        if self.do_lower_case:
            text = text.lower()
        return self.sp.encode(_preprocess(text), out_type=str)

    def _convert_token_to_id(self, token):
        return self.sp.piece_to_id(token) + self.num_image_tokens

    def _convert_id_to_token(self, index):
        if index < self.num_image_tokens:
            return "<image_%d>" % index
        return self.sp.id_to_piece(index - self.num_image_tokens)

    def convert_tokens_to_string(self, tokens):
        return _postprocess(self.sp.decode_pieces(tokens))

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        gmask = self._convert_token_to_id(self.gmask_token)
        sop = self._convert_token_to_id(str(self.bos_token))
        eop = self._convert_token_to_id(str(self.eos_token))
        ids = list(token_ids_0) + [gmask, sop]
        if token_ids_1 is not None:
            ids += list(token_ids_1) + [eop]
        return ids

    def save_vocabulary(self, save_directory, filename_prefix=None):
        name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
        with open(self.vocab_file, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        return (path,)
