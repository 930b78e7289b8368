"""masked_softmax: wrapper, fake kernels and autograd over the pytransformer masked_softmax kernels.

Gradients flow to scores, and to a float mask that requires grad (a learned bias).
"""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::masked_softmax")
def _(scores, mask, scale, causal):
    _checks.masked_softmax(scores, mask, scale, causal)
    return torch.empty_like(scores, memory_format=torch.contiguous_format)


@torch.library.register_fake("pytransformer::masked_softmax_backward")
def _(grad_out, out, scale):
    _checks.float_dtype(out, "out")
    _checks.same_shape(grad_out, "grad_out", out, "out")
    _checks.finite(scale, "scale")
    return torch.empty_like(out, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    _, mask, ctx.scale, _ = inputs
    ctx.mask_shape = None if mask is None else mask.shape
    ctx.save_for_backward(output)


def _backward(ctx, grad_out):
    (out,) = ctx.saved_tensors
    if not ctx.needs_input_grad[1]:
        return _ops.masked_softmax_backward(grad_out, out, ctx.scale), None, None, None
    # A float mask that needs a gradient (a learned bias): d/d(scale * scores + mask), summed over broadcast dims.
    grad = _ops.masked_softmax_backward(grad_out, out, 1.0)
    return grad * ctx.scale, grad.sum_to_size(ctx.mask_shape), None, None


torch.library.register_autograd("pytransformer::masked_softmax", _backward, setup_context=_setup_context)


def masked_softmax(scores: Tensor, mask: Tensor | None = None, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """softmax(scale * scores + mask) over the last dim (bool mask: True = keep); rows with nothing visible are 0."""
    _checks.tensors(("mask",), scores=scores, mask=mask)
    return _ops.masked_softmax(scores, mask, float(scale), bool(causal))
