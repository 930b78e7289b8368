"""int8_linear: weight-only int8 linear layer (inference): wrapper and fake kernel over the pytransformer kernel.

Like decode_attention it has no backward: differentiating through it raises (quantized models are for inference)."""
import torch
import torch.nn.functional as F
from torch import Tensor

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::int8_linear")
def _(x, weight, scale, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def _int8_linear_backward(ctx, grad_out):
    raise RuntimeError("int8_linear is an inference op and has no backward: run quantized models under "
                       "torch.no_grad() or torch.inference_mode()")


torch.library.register_autograd("pytransformer::int8_linear", _int8_linear_backward)


def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """(x [..., K] @ weight int8 [N, K]^T) * scale [N] + bias [N] -> [..., N] in x's dtype; no backward."""
    if x.device.type == "cpu":
        return _ops.int8_linear(x, weight, scale, bias)
    # No kernel of ours on this device yet: PyTorch ops (torch.compile fuses the conversion into the product).
    y = F.linear(x, weight.to(x.dtype))
    y = y * scale.to(y.dtype)
    return y if bias is None else y + bias.to(y.dtype)
