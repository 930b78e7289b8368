"""Functional ops: thin wrappers over torch.ops.pytransformer.* with fake kernels and autograd registered."""
from .kv_cache import decode_attention, kv_cache_append
from .norm import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm", "kv_cache_append", "decode_attention"]
