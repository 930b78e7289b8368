"""Pure-PyTorch references of every op, materialising everything in the input's dtype (use float64 for ground
truth), for the tests, the benchmarks and correctness checks: the ops never fall back to these."""
import math

import torch
from torch import Tensor

from .._C import cpu_int_dot_products
from .visibility import visible_keys


def layer_norm(x: Tensor, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    y = y * weight if weight is not None else y
    return y + bias if bias is not None else y


def rms_norm(x: Tensor, weight=None, eps: float = 1e-6) -> Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def _apply_mask(s: Tensor, mask) -> Tensor:
    if mask is None:
        return s
    if mask.dtype == torch.bool:
        return s.masked_fill(~mask, float("-inf"))
    return s + mask


def softmax_rows(s: Tensor) -> Tensor:
    """softmax over the last dim where rows with no finite entry give zeros."""
    empty = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1)
    return p.masked_fill(empty, 0.0)


def masked_softmax(scores: Tensor, mask=None, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    s = _apply_mask(scores * scale, mask)
    if causal:
        s = s.masked_fill(~visible_keys(s.shape[-2], s.shape[-1], causal=True, device=s.device), float("-inf"))
    return softmax_rows(s)


def attention_scores(q, k, *, mask=None, causal=False, window=None, key_lengths=None, scale=None) -> Tensor:
    """Scaled, masked scores [B, Hq, Lq, Lk] of attention (-inf where a key is hidden); logsumexp gives its lse."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _apply_mask(torch.matmul(q, k.transpose(-1, -2)) * scale, mask)
    keep = visible_keys(q.shape[-2], k.shape[-2], causal=causal, window=window, key_lengths=key_lengths,
                        device=s.device)
    return s if keep is None else s.masked_fill(~keep, float("-inf"))


def attention(q, k, v, *, mask=None, causal=False, window=None, key_lengths=None, scale=None) -> Tensor:
    """Materialised attention: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> [B, Hq, Lq, Dv]."""
    s = attention_scores(q, k, mask=mask, causal=causal, window=window, key_lengths=key_lengths, scale=scale)
    return torch.matmul(softmax_rows(s), v.repeat_interleave(q.shape[1] // v.shape[1], dim=1))


def decode_attention(q, k_cache, v_cache, cache_lengths, *, scale=None, window=None) -> Tensor:
    """q [B, Hq, T, D] over the first cache_lengths[b] cache rows, bottom-right causal per row."""
    outs = []
    for b in range(q.shape[0]):
        n = int(cache_lengths[b])
        outs.append(attention(q[b:b + 1], k_cache[b:b + 1, :, :n], v_cache[b:b + 1, :, :n], causal=True,
                              window=window, scale=scale))
    return torch.cat(outs)


def linear(x, weight, bias=None) -> Tensor:
    """x [..., K] @ weight [N, K]^T + bias, in x's dtype."""
    y = x @ weight.T
    return y if bias is None else y + bias


def round_x_to_8_bits(x) -> Tensor:
    """Each row of x rounded to 8 bits as int8_linear's x_bits=8 does, in its arithmetic (float32, float64 for float64
    x): q = round(x * pre * (127 / big)) to nearest, ties to even, big = max|x row| * pre, pre = 2^100 for a row below
    2^-100 (else 1); returns q * (big / 127) / pre in float32 (float64). Zeros stay zeros, a row with an inf or NaN
    becomes NaN."""
    xf = x if x.dtype == torch.float64 else x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    pre = torch.where(amax < 2.0**-100, 2.0**100, 1.0).to(xf.dtype)
    big = amax * pre
    mul = torch.where(big > 0, torch.tensor(127.0, dtype=big.dtype) / big, 0.0)  # (127 / big is 127 * (1 / big))
    return (xf * pre * mul).round() * (big / 127) / pre


def x_quant_max(k: int, bits: int = 16) -> int:
    """The largest |x| that int8_linear's CPU kernel with integer dot products quantizes x to, as x_quant_max in
    csrc/cpu/gemv.h: 32767 (16 bits) or 127 (8 bits), less over K 8192 (16 bits) or about a million (8 bits) so that
    no int32 sum can overflow."""
    if bits == 16:
        return min(32767, (2**31 - 1) // (128 * 2 * max(1, -(-k // 32))))
    return min(127, (2**31 - 1) // (255 * 4 * max(1, -(-k // 64))))


def quantize_x_rows(x, bits: int = 16) -> tuple[Tensor, Tensor]:
    """Each row of x [..., K] quantized as int8_linear's CPU kernel with integer dot products does (quantize_rows in
    csrc/cpu/gemv.h), in float32: (q, x_scale [..., 1]), q = round(x * pre * (q_max / big)) to nearest, ties to even,
    big = max|x row| * pre, pre = 2^100 for a row below 2^-100 (else 1), q_max = x_quant_max(K, bits), and
    x_scale = big / q_max / pre; a row with an inf or a NaN gets x_scale NaN."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    pre = torch.where(amax < 2.0**-100, 2.0**100, 1.0)
    big = amax * pre
    q_max = torch.tensor(float(x_quant_max(x.shape[-1], bits)))
    q = torch.round(xf * pre * torch.where(big > 0, q_max / big, 0.0))
    return q, torch.where(amax.isfinite(), big / q_max / pre, torch.nan)


def int8_linear_x(x, x_bits: int = 16, kernel_device=None) -> Tensor:
    """x [..., K] as int8_linear's kernels for `kernel_device` (default x's device; "cuda" for the CUDA kernels that
    the host emulator runs on CPU tensors) multiply it on this processor, in float64 on the CPU: rounded to 8 bits with
    x_bits=8 on every path (round_x_to_8_bits); with x_bits=16 quantized per row to 16 bits where the CPU kernel does
    it (x not float64, integer dot products at x's number of rows: AVX-512 VNNI or AMX, or AVX2 as the best level up
    to 16 rows, pytransformer._C.cpu_int_dot_products(rows, K); csrc/cpu/int8_linear.cpp), else x itself. The
    references of int8_linear take this x, so that their bounds are those of float32 sums on every path."""
    if x_bits == 8:
        return round_x_to_8_bits(x.cpu()).double()
    cpu_kernel = torch.device(kernel_device or x.device).type == "cpu"
    if cpu_kernel and x.dtype != torch.float64 and cpu_int_dot_products(math.prod(x.shape[:-1]), x.shape[-1]):
        q, x_scale = quantize_x_rows(x, 16)
        return q.double() * x_scale.double()
    return x.double().cpu()


def int8_linear(x, weight, scale, bias=None) -> Tensor:
    """x [..., K] @ (weight [N, K] * scale[:, None])^T + bias, in x's dtype."""
    y = x @ (weight.to(x.dtype) * scale.to(x.dtype)[:, None]).T
    return y if bias is None else y + bias.to(x.dtype)
