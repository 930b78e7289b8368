"""Functional ops: thin wrappers over torch.ops.pytransformer.* with fake kernels and autograd registered."""
from .norm import layer_norm, rms_norm

__all__ = ["layer_norm", "rms_norm"]
