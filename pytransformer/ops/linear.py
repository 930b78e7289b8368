"""linear: x [..., K] @ weight [N, K]^T + bias [N] -> [..., N], the math of F.linear: wrapper and fake kernel.

On the CPU, float32 and float16 x run our weight-streaming kernel (the weight read once at memory bandwidth for up to 32
rows of x, float32 accumulation) at every row count, more than 32 rows (prefill, training) in calls of 32: it took
0.48-0.89x the time of ATen's float32 GEMM there (csrc/cpu/linear.cpp). With AVX-512, float32 x of 48 rows or more runs
our GEMM instead (register tiles of outer products; 0.4-0.5x ATen's time); below it, float32 x in rows of more than
6144 features goes to ATen's GEMM above 128 rows, where 32 rows of x no longer stay in L2.
bfloat16 x runs it for few rows (on a processor with AVX-512 BF16, whose dot products the kernel then uses, up to 8, or
up to 28 while x is at most 64 KiB in rows of at most 4 KiB (K <= 2048), else 2) and ATen's bfloat16 GEMM, faster above,
for more; float64 runs ATen's GEMM. On CUDA the op calls ATen (cuBLAS). The backward is ATen's matmuls: grad_x = g @ W,
grad_W = g^T x, grad_b = g summed over the rows, in a C++ autograd function (csrc/registration.cpp: decoding calls
linear for every projection of every layer, and a Python autograd kernel would cost microseconds a call)."""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::linear")
def _(x, weight, bias):
    _checks.linear(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ weight [N, K]^T + bias [N] -> [..., N] (F.linear); x, weight and bias of one dtype."""
    _checks.tensors(("bias",), x=x, weight=weight, bias=bias)
    return _ops.linear(x, weight, bias)
