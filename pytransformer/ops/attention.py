"""attention: wrapper, fake kernels and autograd over the pytransformer fused attention kernels."""
import math

import torch
from torch import Tensor

from . import _checks
from .visibility import visible_keys

_ops = torch.ops.pytransformer


def _lse_like(q: Tensor) -> Tensor:
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(q.shape[:3], dtype=dtype)


@torch.library.register_fake("pytransformer::attention")
def _(q, k, v, mask, causal, window, key_lengths, scale):
    _checks.attention(q, k, v, mask, window, key_lengths, scale)
    return q.new_empty((*q.shape[:3], v.shape[-1])), _lse_like(q)


@torch.library.register_fake("pytransformer::attention_backward")
def _(grad_out, q, k, v, out, lse, mask, causal, window, key_lengths, scale):
    _checks.attention(q, k, v, mask, window, key_lengths, scale)
    expected = (*q.shape[:3], v.shape[3])
    for t, name in ((grad_out, "grad_out"), (out, "out")):
        _checks.like(t, name, q, "q")
        _checks.check(t.shape == expected, f"{name}: expected shape {list(expected)}, got {list(t.shape)}")
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, causal, window, key_lengths, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], mask, key_lengths)
    ctx.causal, ctx.window, ctx.scale = causal, window, scale


def _attention_backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, mask, key_lengths = ctx.saved_tensors
    dq, dk, dv = _ops.attention_backward(grad_out, q, k, v, out, lse, mask, ctx.causal, ctx.window, key_lengths,
                                         ctx.scale)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("pytransformer::attention", _attention_backward, setup_context=_attention_setup)


def _attention_unfused(q, k, v, mask, causal, window, key_lengths, scale, dropout_p):
    """Materialised attention with dropout on the probabilities, from torch ops (the dropout_p > 0 path). Like the fused
    kernels it computes in float32 (float64 for float64 inputs) and returns q's dtype."""
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qg = q.to(acc).reshape(b, hkv, hq // hkv, lq, q.shape[-1])  # [B, Hkv, G, Lq, D]: a GQA group shares its K/V
    s = torch.matmul(qg, k.to(acc).unsqueeze(2).transpose(-1, -2)) * scale  # [B, Hkv, G, Lq, Lk]
    s = s.reshape(b, hq, lq, lk)
    keep = torch.ones((), dtype=torch.bool, device=q.device)
    if mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        s = s + mask.to(acc)
        keep = keep & (mask != float("-inf"))  # a NaN or inf score of a key the mask removes stays removed
    visible = visible_keys(lq, lk, causal=causal, window=window, key_lengths=key_lengths, device=q.device)
    if visible is not None:
        keep = keep & visible
    s = s.masked_fill(~keep, float("-inf"))
    empty = torch.isneginf(s).all(-1, keepdim=True)  # rows with no visible key give zeros
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    p = torch.nn.functional.dropout(p, dropout_p).reshape(b, hkv, hq // hkv, lq, lk)
    return _weighted_values(p, v.to(acc).unsqueeze(2)).reshape(b, hq, lq, v.shape[-1]).to(q.dtype)


def _weighted_values(p: Tensor, v: Tensor) -> Tensor:
    """p @ v where a zero weight leaves a value out: a NaN or inf in v reaches only the rows that weigh it (as NaN),
    since 0 * NaN is NaN and a hidden or dropped key must not change a visible result."""
    finite = torch.isfinite(v)
    reached = torch.matmul((p != 0).to(p.dtype), (~finite).to(p.dtype)) > 0
    return torch.matmul(p, v.masked_fill(~finite, 0.0)).masked_fill(reached, float("nan"))


def attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, causal: bool = False,
              window: int | None = None, key_lengths: Tensor | None = None, scale: float | None = None,
              dropout_p: float = 0.0) -> Tensor:
    """Fused attention softmax(q k^T * scale + masks) v: q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D/Dv] -> [B, Hq, Lq, Dv].

    Masks combine: mask (bool True = may attend, or float added to the scores; broadcast to [B, Hq, Lq, Lk]; a float
    mask gets no gradient), causal (bottom-right), window=W (keys p - W < j <= p, implies causal) and key_lengths
    (int [B]; keys j >= key_lengths[b] are padding). Rows with no visible key give zeros. GQA/MQA: Hq % Hkv == 0.
    A hidden key changes no visible result: NaN or inf in its K or V row reaches only the rows that see it (forward
    and gradients), on every device and kernel.
    dropout_p > 0 drops probabilities whenever given (pass 0 in eval), on an unfused path that materialises the
    scores; dropout_p == 0 always runs the fused kernel.
    """
    _checks.tensors(("mask", "key_lengths"), q=q, k=k, v=v, mask=mask, key_lengths=key_lengths)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.dim() and q.shape[-1] else 1.0  # (bad shapes raise in the op)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p: expected a probability in [0, 1], got {dropout_p}")
    if dropout_p > 0.0:
        # The fused op's own argument checks, run on zero queries so that nothing is computed.
        _ops.attention(q[..., :0, :] if q.dim() >= 2 else q, k, v,
                       mask[..., :0, :] if mask is not None and mask.dim() >= 2 else mask, causal, window, key_lengths,
                       scale)
        return _attention_unfused(q, k, v, mask, causal, window, key_lengths, scale, dropout_p)
    return _ops.attention(q, k, v, mask, causal, window, key_lengths, scale)[0]
