"""KVCache: preallocated, static-shape key/value storage for decoding (self-attention per layer, cross-attention once)."""
from typing import NamedTuple

import torch
from torch import Tensor


class AttentionCache(NamedTuple):
    """One attention's cache entry. Self-attention: `lengths` counts the rows already written (new keys are appended
    there); cross-attention (`static`): k/v were written once and `lengths` are the memory key lengths."""
    k: Tensor  # [B, Hkv, capacity, D]
    v: Tensor  # [B, Hkv, capacity, Dv]
    lengths: Tensor  # [B] int64
    static: bool


class LayerCache(NamedTuple):
    """The entries of one decoder layer."""
    self_attn: AttentionCache
    cross_attn: AttentionCache | None


class KVCache:
    """Preallocated caches for `n_layers` decoder layers with per-row lengths, so prompts of different lengths batch
    together. Every tensor keeps its shape and address for the cache's lifetime (torch.compile and CUDA graphs)."""

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int, *,
                 memory_length: int = 0, device=None, dtype=None):
        factory = {"device": device, "dtype": dtype}
        shape = (batch_size, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, **factory) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, **factory) for _ in range(n_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)  # [B] tokens held per row
        # Cross-attention K/V of the encoder output, written once by TransformerDecoder.cache_memory.
        mem_shape = (batch_size, n_kv_heads, memory_length, head_dim)
        self.cross_k = [torch.zeros(mem_shape, **factory) for _ in range(n_layers)] if memory_length else None
        self.cross_v = [torch.zeros(mem_shape, **factory) for _ in range(n_layers)] if memory_length else None
        self.memory_lengths = torch.full((batch_size,), memory_length, dtype=torch.int64, device=device)

    @property
    def capacity(self) -> int:
        """Rows per sequence that the self-attention cache can hold."""
        return self.k[0].shape[2]

    def layer(self, i: int) -> LayerCache:
        """The self- (and cross-) attention entries of decoder layer i."""
        cross = None
        if self.cross_k is not None:
            cross = AttentionCache(self.cross_k[i], self.cross_v[i], self.memory_lengths, True)
        return LayerCache(AttentionCache(self.k[i], self.v[i], self.lengths, False), cross)

    def positions(self, length: int) -> Tensor:
        """Absolute positions [B, length] of the next `length` tokens of every row."""
        return self.lengths[:, None] + torch.arange(length, device=self.lengths.device)

    def advance(self, n: int | Tensor) -> None:
        """Count n more tokens per row (an int, or [B] for padded prompts), in place."""
        self.lengths.add_(n)

    def reorder(self, index: Tensor) -> None:
        """Make row i a copy of row index[i] (beam search), in place; cross-attention rows are left as they are."""
        for t in self.k + self.v + [self.lengths]:
            t.copy_(t.index_select(0, index))

    def reset(self) -> None:
        """Empty every row (the stored K/V are simply overwritten later)."""
        self.lengths.zero_()
