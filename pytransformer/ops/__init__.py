"""Functional ops: thin wrappers over torch.ops.pytransformer.* with fake kernels and autograd registered."""
from .attention import attention
from .int8_linear import int8_linear
from .decode_attention import decode_attention
from .kv_cache_append import kv_cache_append
from .linear import linear
from .masked_softmax import masked_softmax
from .norm import layer_norm, rms_norm

__all__ = ["attention", "decode_attention", "int8_linear", "kv_cache_append", "layer_norm", "linear", "masked_softmax", "rms_norm"]
