"""LayerNorm and RMSNorm modules (drop-in for torch.nn.LayerNorm / torch.nn.RMSNorm over the last dim)."""
import numbers

import torch
from torch import nn

from .. import ops


class _Norm(nn.Module):
    def __init__(self, normalized_shape, eps, elementwise_affine, bias, device, dtype):
        super().__init__()
        if not isinstance(normalized_shape, numbers.Integral):
            shape = tuple(normalized_shape)
            if len(shape) != 1:
                raise ValueError(f"normalized_shape: only the last dim is normalised, expected an int or a 1-tuple, got {shape}")
            normalized_shape = shape[0]
        self.normalized_shape = (int(normalized_shape),)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory)) if elementwise_affine and bias else None

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(_Norm):
    """LayerNorm over the last dim, same arguments and parameters as torch.nn.LayerNorm."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x):
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(_Norm):
    """RMSNorm over the last dim (weight only), like torch.nn.RMSNorm; eps defaults to 1e-6."""

    def __init__(self, normalized_shape, eps=1e-6, elementwise_affine=True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)


NORM_TYPES = ("layernorm", "rmsnorm")


def make_norm(norm_type: str, d_model: int, eps: float = 1e-5, bias: bool = True, device=None, dtype=None) -> _Norm:
    """A LayerNorm (`bias` as given) or an RMSNorm (weight only) over d_model features, by norm_type."""
    if norm_type == "layernorm":
        return LayerNorm(d_model, eps=eps, bias=bias, device=device, dtype=dtype)
    if norm_type == "rmsnorm":
        return RMSNorm(d_model, eps=eps, device=device, dtype=dtype)
    raise ValueError(f"norm_type: expected one of {NORM_TYPES}, got {norm_type!r}")
