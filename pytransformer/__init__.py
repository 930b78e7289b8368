"""pytransformer: Transformer building blocks on hand-written CPU and CUDA kernels, exposed as custom ops."""
import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C  # noqa: F401  loads the kernels and registers torch.ops.pytransformer.* (before the fake kernels)
from . import ops, nn, models, training
from .quantization import quantize

__all__ = ["ops", "nn", "models", "training", "quantize", "with_cuda"]


def with_cuda() -> bool:
    """Whether this build has the CUDA kernels compiled in."""
    return _C.with_cuda()
