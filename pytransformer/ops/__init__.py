"""Functional ops: thin wrappers over torch.ops.pytransformer.* with fake kernels and autograd registered."""
from .attention import attention
from .masked_softmax import masked_softmax
from .norm import layer_norm, rms_norm

__all__ = ["attention", "layer_norm", "masked_softmax", "rms_norm"]
