"""decode_attention: wrapper, fake kernel and autograd over the pytransformer decode-attention kernels.

An inference op that reads the KV caches in place. It runs on inputs that require grad (e.g. generating without
torch.no_grad()) but has no backward: differentiating through it raises, as does tracing it with torch.compile while
grad is needed; call it under torch.no_grad() / torch.inference_mode(), and train with pytransformer.ops.attention.
That autograd kernel is C++ (csrc/registration.cpp): a Python one costs microseconds per call, per layer per token.

Bad cache_lengths raise ValueError. On CUDA that check reads the values on the host: a device-to-host copy that waits
for the stream, and that a stream being captured into a CUDA graph cannot do. A caller that knows a bound of the
lengths on the host passes it as `max_length`: then only the bound is checked (within the capacity), nothing is read
back and nothing waits. Under capture, or when lengths exceed the bound given, the kernel checks them on the device
instead: a row whose length is out of range gives zeros, and nothing raises.

A key hidden from a query (past the row's length, before its window, or after it when T > 1) changes none of its
output: NaN or inf in that key's K or V row reaches only the queries that see the key.
"""
import math

import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::decode_attention")
def _(q, k_cache, v_cache, cache_lengths, scale, window, max_length=None):
    _checks.decode_attention(q, k_cache, v_cache, cache_lengths, scale, window, max_length)
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])  # [B, Hq, T, Dv]


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lengths: Tensor, *,
                     scale: float | None = None, window: int | None = None,
                     max_length: int | None = None) -> Tensor:
    """q [B, Hq, T, D] over the first cache_lengths[b] cache rows (bottom-right causal) -> [B, Hq, T, Dv]; no backward."""
    _checks.tensors(q=q, k_cache=k_cache, v_cache=v_cache, cache_lengths=cache_lengths)
    _checks.int_or_none(max_length, "max_length")
    if scale is None:  # 1/sqrt(D); a q of the wrong shape is reported by the op
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.dim() == 4 and q.shape[-1] > 0 else 1.0
    return _ops.decode_attention(q, k_cache, v_cache, cache_lengths, scale, window, max_length)
