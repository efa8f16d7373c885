"""ChatGLM-6B (GLM v1) configuration: glmtrain's own small stand-in for the remote code a
THUDM download ships (written for tests/py/test_folder_interop.py from the published facts
of docs/chatglm-spec.md section 1; not THUDM's file). Field names and class defaults are the
original's, so a config.json written for the original loads here unchanged."""
from transformers.configuration_utils import PretrainedConfig


class ChatGLMConfig(PretrainedConfig):
    model_type = "chatglm"

    def __init__(self, vocab_size=150528, hidden_size=4096, num_layers=28, num_attention_heads=32,
                 layernorm_epsilon=1e-5, use_cache=False, bos_token_id=150004, eos_token_id=150005,
                 mask_token_id=150000, gmask_token_id=150001, pad_token_id=0, max_sequence_length=2048,
                 inner_hidden_size=16384, position_encoding_2d=True, quantization_bit=0, pre_seq_len=None,
                 prefix_projection=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_attention_heads = num_attention_heads
        self.layernorm_epsilon = layernorm_epsilon
        self.use_cache = use_cache
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.mask_token_id = mask_token_id
        self.gmask_token_id = gmask_token_id
        self.pad_token_id = pad_token_id
        self.max_sequence_length = max_sequence_length
        self.inner_hidden_size = inner_hidden_size
        self.position_encoding_2d = position_encoding_2d
        self.quantization_bit = quantization_bit
        self.pre_seq_len = pre_seq_len
        self.prefix_projection = prefix_projection
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)
