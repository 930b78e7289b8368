"""kv_cache_append: wrapper and fake kernel over the pytransformer KV-cache append kernels.

An inference op: it stores values, not autograd history, and, as torch's in-place ops do, refuses a cache that is a
leaf requiring grad and bumps the caches' version counters (its Autograd kernel, csrc/registration.cpp).
Bad positions raise ValueError before anything is written. On CUDA that check reads the positions on the host: a
device-to-host copy that waits for the stream, and that a stream being captured into a CUDA graph cannot do. A caller
that knows a bound of the positions on the host (a cache tracking its lengths) passes it as `max_position`: then
only the bound is checked (a row at max_position must fit), nothing is read back and nothing waits. Under capture,
or when positions exceed the bound given, the kernel checks them on the device instead: a row that does not fit
writes nothing, and nothing raises.
"""
import torch
from torch import Tensor

from . import _checks

_ops = torch.ops.pytransformer


@torch.library.register_fake("pytransformer::kv_cache_append")
def _(k_cache, v_cache, k_new, v_new, positions, max_position=None):
    _checks.kv_cache_append(k_cache, v_cache, k_new, v_new, positions, max_position)
    return None  # writes the caches in place; the schema declares the mutation


def kv_cache_append(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, positions: Tensor, *,
                    max_position: int | None = None) -> None:
    """Write k_new/v_new [B, Hkv, T, D|Dv] into the caches [B, Hkv, capacity, D|Dv] at rows positions[b] + t, in place."""
    _checks.tensors(k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, positions=positions)
    _checks.int_or_none(max_position, "max_position")
    _ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions, max_position)
