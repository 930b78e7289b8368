"""linear: x [..., K] @ weight [N, K]^T + bias [N] -> [..., N], the math of F.linear: wrapper, fake kernel, autograd.

On the CPU, few rows of x (decoding: up to 32 in float32 and float16, 2 in bfloat16, where ATen's bfloat16 GEMM is
faster above; csrc/cpu/linear.cpp) run our weight-streaming kernel (the weight read once at memory bandwidth, float32
accumulation); more rows (prefill) and float64 run ATen's GEMM. On CUDA the op calls
ATen (cuBLAS). The backward is ATen's matmuls: grad_x = g @ W, grad_W = g^T x, grad_b = g summed over the rows."""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::linear")
def _(x, weight, bias):
    _checks.linear(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    grad_x = grad_weight = grad_bias = None
    g = grad_out.reshape(-1, weight.shape[0])  # [M, N]
    if ctx.needs_input_grad[0]:
        grad_x = grad_out @ weight  # [..., K]
    if ctx.needs_input_grad[1]:
        grad_weight = g.t() @ x.reshape(-1, weight.shape[1])  # [N, K]
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = g.sum(0)  # [N]
    return grad_x, grad_weight, grad_bias


torch.library.register_autograd("pytransformer::linear", _backward, setup_context=_setup_context)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ weight [N, K]^T + bias [N] -> [..., N] (F.linear); x, weight and bias of one dtype."""
    _checks.tensors(("bias",), x=x, weight=weight, bias=bias)
    return _ops.linear(x, weight, bias)
