"""layer_norm and rms_norm: wrappers and fake kernels over the pytransformer norm kernels. Their autograd (the
backward ops, from the saved statistics) is C++ (csrc/registration.cpp), as linear's is: a decoding step calls a norm
twice per layer, and a Python autograd kernel costs microseconds a call."""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


def _stats_like(x: Tensor) -> Tensor:
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(x.shape[:-1], dtype=dtype)


@torch.library.register_fake("pytransformer::layer_norm")
def _(x, weight, bias, eps):
    _checks.norm(x, weight, bias, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format), _stats_like(x), _stats_like(x)


@torch.library.register_fake("pytransformer::layer_norm_backward")
def _(grad_out, x, mean, rstd, weight, has_bias):
    _checks.norm(x, weight, None, 0.0)
    _checks.same_shape(grad_out, "grad_out", x, "x")
    n = x.shape[-1]
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty(n if weight is not None else 0), x.new_empty(n if has_bias else 0))


@torch.library.register_fake("pytransformer::rms_norm")
def _(x, weight, eps):
    _checks.norm(x, weight, None, eps)
    return torch.empty_like(x, memory_format=torch.contiguous_format), _stats_like(x)


@torch.library.register_fake("pytransformer::rms_norm_backward")
def _(grad_out, x, rstd, weight):
    _checks.norm(x, weight, None, 0.0)
    _checks.same_shape(grad_out, "grad_out", x, "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[-1] if weight is not None else 0)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dim of x [..., N]: (x - mean) / sqrt(var + eps) * weight + bias."""
    _checks.tensors(("weight", "bias"), x=x, weight=weight, bias=bias)
    return _ops.layer_norm(x, weight, bias, eps)[0]


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dim of x [..., N]: x / sqrt(mean(x^2) + eps) * weight."""
    _checks.tensors(("weight",), x=x, weight=weight)
    return _ops.rms_norm(x, weight, eps)[0]
