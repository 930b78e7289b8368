"""Functional ops: thin wrappers over torch.ops.pytransformer.* with fake kernels and autograd registered."""
from .attention import attention
from .norm import layer_norm, rms_norm

__all__ = ["attention", "layer_norm", "rms_norm"]
