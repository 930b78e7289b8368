"""masked_softmax: wrapper, fake kernels and autograd over the pytransformer masked_softmax kernels."""
import torch
from torch import Tensor

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::masked_softmax")
def _(scores, mask, scale, causal):
    return torch.empty_like(scores, memory_format=torch.contiguous_format)


@torch.library.register_fake("pytransformer::masked_softmax_backward")
def _(grad_out, out, scale):
    return torch.empty_like(out, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.scale = inputs[2]
    ctx.save_for_backward(output)


def _backward(ctx, grad_out):
    (out,) = ctx.saved_tensors
    return _ops.masked_softmax_backward(grad_out, out, ctx.scale), None, None, None


torch.library.register_autograd("pytransformer::masked_softmax", _backward, setup_context=_setup_context)


def masked_softmax(scores: Tensor, mask: Tensor | None = None, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """softmax(scale * scores + mask) over the last dim (bool mask: True = keep); rows with nothing visible are 0."""
    return _ops.masked_softmax(scores, mask, float(scale), bool(causal))
