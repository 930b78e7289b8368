"""int8_linear: weight-only int8 linear layer (inference): wrapper and fake kernel over the pytransformer kernels (CPU
and CUDA: float32 accumulation; on CUDA float32/float16/bfloat16 x, on the CPU float64 too).

Like decode_attention it has no backward: differentiating through it raises (quantized models are for inference). That
autograd kernel is C++ (csrc/registration.cpp), as linear's is: a Python one costs microseconds per call."""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer

# The default x_bits of int8_linear and of the int8 modules (nn.QuantizedLinear, nn.quantize): weight-only quantization.
DEFAULT_X_BITS = 16


@torch.library.register_fake("pytransformer::int8_linear")
def _(x, weight, scale, bias, x_bits):
    _checks.int8_linear(x, weight, scale, bias, x_bits)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None, *,
                x_bits: int = DEFAULT_X_BITS) -> Tensor:
    """(x [..., K] @ weight int8 [N, K]^T) * scale [N] + bias [N] -> [..., N] in x's dtype; no backward.

    x_bits=16 (the default, weight-only quantization): on the CPU, on a processor with AVX-512 VNNI, x (float32,
    float16 or bfloat16; any number of rows, more than 16 in blocks of 8, prefill too) is quantized per row to 16 bits
    (to nearest, in steps of max|x row| / 32767; fewer levels past K 8192 so that int32 sums cannot overflow) and the
    products are summed exactly in integers: each output is within half a step times sum_k |weight[n, k]| *
    |scale[n]| of the exact product (typically 1e-5 to 1e-4 of the outputs, far below the int8 weights' own error),
    and a row's result is the same bit for bit whatever the number of rows; a row with an inf or NaN gives NaN.
    Elsewhere (other processors, float64 x, CUDA) x is used as it is, with float32 (float64) sums.

    x_bits=8 (dynamic activation quantization, as CTranslate2's int8_float32): every row of x is quantized to 8 bits,
    to nearest in steps of max|x row| / 127 (on the CPU's VNNI kernel fewer levels past K of about a million, so that
    no int32 sum overflows), on every device and path, so the error bound above holds with those steps (about 1e-2 of
    the outputs). On the CPU with VNNI (x not float64) the products are summed exactly in integers, half the
    instructions of 16 bits per weight (8 rows with the weights in cache: half the time; from memory it depends on the
    host, see docs/benchmarks.md). Elsewhere x is rounded to those same values first (in the kernel's float32
    arithmetic, float64 for float64 x; back to x's dtype) and multiplied as it is."""
    _checks.tensors(("bias",), x=x, weight=weight, scale=scale, bias=bias)
    return _ops.int8_linear(x, weight, scale, bias, x_bits)
