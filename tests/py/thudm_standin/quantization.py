"""Stand-in for the quantization.py a THUDM ChatGLM-6B download ships (glmtrain's own stub for
tests/py/test_folder_interop.py). modeling_chatglm.py imports it relatively, as the original
does, so transformers' remote-code loader refuses a folder that lacks this file: that is what
the test relies on. Weight-only int4/int8 quantization itself is not implemented here."""


def quantize(model, weight_bit_width, **kwargs):
    raise NotImplementedError("the test stand-in of quantization.py does not quantize (weight_bit_width=%r)"
                              % (weight_bit_width,))
