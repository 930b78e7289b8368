"""kv_cache_append and decode_attention: wrappers and fake kernels over the pytransformer KV-cache kernels.

Both are inference ops. kv_cache_append stores values, not autograd history (its Autograd kernel is a fallthrough,
csrc/registration.cpp). decode_attention runs on inputs that require grad (e.g. generating without torch.no_grad())
but has no backward: differentiating through it raises, as does tracing it with torch.compile while grad is needed;
call it under torch.no_grad() / torch.inference_mode(), and train with pytransformer.ops.attention.

Bad positions / cache_lengths raise ValueError before anything is written. On CUDA that check reads the values on
the host, which a stream being captured into a CUDA graph cannot do: under capture the kernels check them on the
device instead, an append row that does not fit writes nothing and a decode row whose length is out of range gives
zeros, and nothing raises.
"""
import math

import torch
from torch import Tensor

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::kv_cache_append")
def _(k_cache, v_cache, k_new, v_new, positions):
    return None  # writes the caches in place; the schema declares the mutation


@torch.library.register_fake("pytransformer::decode_attention")
def _(q, k_cache, v_cache, cache_lengths, scale, window):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])  # [B, Hq, T, Dv]


def _decode_attention_backward(ctx, grad_out):
    raise RuntimeError("decode_attention is an inference op and has no backward: call it under torch.no_grad() or "
                       "torch.inference_mode(), and use pytransformer.ops.attention where gradients are needed")


torch.library.register_autograd("pytransformer::decode_attention", _decode_attention_backward)


def kv_cache_append(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, positions: Tensor) -> None:
    """Write k_new/v_new [B, Hkv, T, D|Dv] into the caches [B, Hkv, capacity, D|Dv] at rows positions[b] + t, in place."""
    _ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lengths: Tensor, *,
                     scale: float | None = None, window: int | None = None) -> Tensor:
    """q [B, Hq, T, D] over the first cache_lengths[b] cache rows (bottom-right causal) -> [B, Hq, T, Dv]; no backward."""
    if scale is None:  # 1/sqrt(D); a q of the wrong shape is reported by the op
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.dim() == 4 and q.shape[-1] > 0 else 1.0
    return _ops.decode_attention(q, k_cache, v_cache, cache_lengths, scale, window)
