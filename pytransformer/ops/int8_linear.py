"""int8_linear: weight-only int8 linear layer (inference): wrapper and fake kernel over the pytransformer kernels (CPU
and CUDA: float32 accumulation; on CUDA float32/float16/bfloat16 x, on the CPU float64 too).

Like decode_attention it has no backward: differentiating through it raises (quantized models are for inference). That
autograd kernel is C++ (csrc/registration.cpp), as linear's is: a Python one costs microseconds per call."""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::int8_linear")
def _(x, weight, scale, bias):
    _checks.int8_linear(x, weight, scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """(x [..., K] @ weight int8 [N, K]^T) * scale [N] + bias [N] -> [..., N] in x's dtype; no backward."""
    _checks.tensors(("bias",), x=x, weight=weight, scale=scale, bias=bias)
    return _ops.int8_linear(x, weight, scale, bias)
