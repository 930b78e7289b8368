"""KVCache: preallocated, static-shape key/value storage for decoding (self-attention per layer, cross-attention once);
for sliding-window attention of window W, a cache of W rows is a rolling buffer of the last W positions."""
import math
import mmap
from typing import NamedTuple

import torch
from torch import Tensor

from .. import ops


class AttentionCache(NamedTuple):
    """One attention's cache entry. Self-attention: `lengths` counts the rows already written (new keys are appended
    there); cross-attention (`static`): k/v were written once and `lengths` are the memory key lengths."""
    k: Tensor  # [B, Hkv, capacity, D]
    v: Tensor  # [B, Hkv, capacity, Dv]
    lengths: Tensor  # [B] int64
    static: bool
    # Self-attention, per forward step (computed once for all layers by KVCache.layers): the absolute positions
    # [B, L] of the step's L tokens, and the rows visible once they are appended, lengths + L [B].
    positions: Tensor | None = None
    visible: Tensor | None = None
    # A host-side bound of `lengths` (every row holds at most this many), None when unknown: passed to the kernels
    # as max_position / max_length, so that on CUDA they check it instead of reading the lengths back (a stream
    # synchronisation per layer per token).
    max_length: int | None = None
    # The host-side count every row holds when all hold the same (the bound is then exact), else None: the step's L
    # new tokens then attend to the first length + L rows of k/v, the same in every row (MultiHeadAttention).
    length: int | None = None


class LayerCache(NamedTuple):
    """The entries of one decoder layer."""
    self_attn: AttentionCache
    cross_attn: AttentionCache | None


def _zeros(shapes: list[tuple], *, device=None, dtype=None) -> list[Tensor]:
    """Zero tensors of these shapes. On the CPU (outside torch.compile) they are views of one anonymous memory mapping
    of their own, not malloc's: its pages are taken only as they are written, and all of them go back to the system
    when the last view is freed. From malloc, a cache freed after a generate call would stay in the heap, at another
    size than the next call's, whose cache and activations would then need more (glibc's mmap threshold rises to the
    largest block freed, so blocks of a few MiB come from the heap after a prefill; docs/benchmarks.md)."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    dtype = dtype or torch.get_default_dtype()
    sizes = [math.prod(shape) for shape in shapes]
    if device.type == "cpu" and not torch.compiler.is_compiling() and sum(sizes):
        flat = torch.frombuffer(mmap.mmap(-1, sum(sizes) * dtype.itemsize), dtype=dtype)  # zero-filled; tensor holds it
    else:
        flat = torch.zeros(sum(sizes), device=device, dtype=dtype)
    return [t.view(shape) for t, shape in zip(flat.split(sizes), shapes)]


class KVCache:
    """Preallocated caches for `n_layers` decoder layers with per-row lengths, so prompts of different lengths batch
    together. Every tensor keeps its shape and address for the cache's lifetime (torch.compile and CUDA graphs).

    `dtype` may be another float dtype than the model's: attention over the cache then runs in it (queries, keys and
    values rounded to it, float32 accumulation in the kernels) and its result returns to the model's dtype. A 16-bit
    cache of a float32 or int8 model takes half the memory, as llama.cpp's default float16 cache does.

    `lengths` [B] lives on the cache's device (the kernels read it there); beside it `max_length`, a host-side int
    bound of it, kept by advance/reset, lets the CUDA kernels check for overflow without reading the lengths back: an
    eager decode loop then has no stream synchronisation per token. Inside torch.compile the bound is dropped (None:
    unknown, so nothing is specialised on it) and later calls read the lengths as before. `uniform` says whether every
    row holds exactly max_length tokens (a prompt without padding, and the tokens after it): a prompt's later chunks
    then attend through the tiled attention kernel over the rows before them. Writing `lengths` directly breaks both:
    call reset() or set `max_length` (None if unknown) too.

    The window of sliding-window attention is the attention's alone: a self-attention cache of exactly `window` rows is
    a rolling buffer for it (position i in row i % window, see is_rolling), so a sequence of any length needs only
    `window` rows; a cache of any other capacity holds positions 0 .. capacity - 1 in order. `capacity` is one count
    for every layer or a list of one per layer: a model whose windowed layers sit beside layers that see every
    position (Gemma 3) gives the windowed ones rolling buffers of `window` rows and the others all the rows."""

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int | list[int], *,
                 memory_length: int = 0, device=None, dtype=None):
        factory = {"device": device, "dtype": dtype}
        capacities = [capacity] * n_layers if isinstance(capacity, int) else list(capacity)
        if len(capacities) != n_layers:
            raise ValueError(f"capacity: expected one count or {n_layers} (one per layer), got {len(capacities)}")
        kv = _zeros([(batch_size, n_kv_heads, c, head_dim) for c in capacities] * 2, **factory)
        self.k, self.v = kv[:n_layers], kv[n_layers:]
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)  # [B] tokens held per row
        self.max_length: int | None = 0  # host-side bound of lengths
        self.uniform = True  # every row holds max_length tokens
        # Cross-attention K/V of the encoder output, written once by TransformerDecoder.cache_memory.
        mem_shape = (batch_size, n_kv_heads, memory_length, head_dim)
        cross = _zeros([mem_shape] * (2 * n_layers), **factory) if memory_length else None
        self.cross_k, self.cross_v = (cross[:n_layers], cross[n_layers:]) if cross is not None else (None, None)
        self.memory_lengths = torch.full((batch_size,), memory_length, dtype=torch.int64, device=device)

    @classmethod
    def over(cls, k: list[Tensor], v: list[Tensor], lengths: Tensor) -> "KVCache":
        """A self-attention cache over existing tensors, not copied: k and v [B, Hkv, capacity, D] per layer and
        lengths [B], with no host-side bound of the lengths (max_length None), as a compiled step sees its cache."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.lengths = list(k), list(v), lengths
        cache.max_length, cache.uniform = None, False
        cache.cross_k = cache.cross_v = cache.memory_lengths = None
        return cache

    @property
    def capacity(self) -> int:
        """Rows per sequence of the self-attention cache: the most of any layer's (see capacities)."""
        return max(self.capacities, default=0)

    @property
    def capacities(self) -> list[int]:
        """Rows per sequence of each layer's self-attention cache (for attention of that window: a rolling buffer)."""
        return [k.shape[2] for k in self.k]

    def layers(self, length: int) -> list[LayerCache]:
        """The self- (and cross-) attention entries of every decoder layer for a forward step of the next `length`
        tokens of every row (their positions and the visible rows computed once, shared by all layers)."""
        positions = self.positions(length)
        visible = self.lengths + length
        exact = self.max_length if self.uniform else None
        entries = []
        for i in range(len(self.k)):
            cross = None
            if self.cross_k is not None:
                cross = AttentionCache(self.cross_k[i], self.cross_v[i], self.memory_lengths, True)
            entries.append(LayerCache(AttentionCache(self.k[i], self.v[i], self.lengths, False, positions, visible,
                                                     self.max_length, exact), cross))
        return entries

    def positions(self, length: int) -> Tensor:
        """Absolute positions [B, length] of the next `length` tokens of every row."""
        return self.lengths[:, None] + torch.arange(length, device=self.lengths.device)

    def advance(self, n: int | Tensor, most: int | None = None) -> None:
        """Count n more tokens per row (an int, or [B] for padded prompts), in place; `most` bounds n's largest value
        on the host (default: n itself, or n.max() read back for a tensor)."""
        self.lengths.add_(n)
        self.uniform = self.uniform and isinstance(n, int)
        if torch.compiler.is_compiling():
            self.max_length = None
        elif self.max_length is not None:
            self.max_length += most if most is not None else n if isinstance(n, int) else int(n.max())

    def reorder(self, index: Tensor) -> None:
        """Make row i a copy of row index[i] (beam search), in place; cross-attention rows are left as they are. Only
        the positions written so far are copied (max_length of them, when known), not the whole capacity."""
        held = self.capacity if self.max_length is None else min(self.max_length, self.capacity)
        for t in self.k + self.v:  # a layer of fewer rows: the slice stops at its capacity
            t[:, :, :held].copy_(t[:, :, :held].index_select(0, index))
        self.lengths.copy_(self.lengths.index_select(0, index))

    def reset(self) -> None:
        """Empty every row (the stored K/V are simply overwritten later)."""
        self.lengths.zero_()
        self.max_length, self.uniform = 0, True


def is_rolling(capacity: int, window: int | None) -> bool:
    """Whether a self-attention cache of `capacity` rows is a rolling buffer for attention with sliding `window`
    (position i in row i % window; rolling_attention): exactly when it has `window` rows."""
    return window is not None and capacity == window


def rolling_attention(q: Tensor, k: Tensor, v: Tensor, cache: AttentionCache, key_lengths: Tensor | None = None
                      ) -> Tensor:
    """Sliding-window attention (window W = the cache's capacity) of the next T tokens of every row over a rolling
    cache, storing their keys and values: q [B, Hq, T, D], k/v [B, Hkv, T, D|Dv] at positions cache.lengths + t ->
    [B, Hq, T, Dv]; key_lengths [B] (right-padded prompts): only the first key_lengths[b] new tokens are stored.

    T == 1 (decoding): the token goes to row p % W, and since every row then holds one of the last W positions,
    decode_attention over the first min(p + 1, W) rows (no window, no copy) is the windowed attention.
    T > 1 (prefill, any T): the W - 1 cached positions before the chunk are gathered in order (a copy of W - 1 rows
    per chunk) and put before the chunk's keys for ops.attention with window=W; then each row r of the buffer takes
    the newest stored position that is r mod W, if it is in the chunk.
    """
    k_cache, v_cache, lengths = cache.k, cache.v, cache.lengths
    window, t = k_cache.shape[2], q.shape[2]
    if t == 1:  # rows lengths % W < W, lengths + 1 clamped to W: bounds known without reading them
        ops.kv_cache_append(k_cache, v_cache, k, v, lengths % window, max_position=window - 1)
        return ops.decode_attention(q, k_cache, v_cache, (lengths + 1).clamp(max=window), max_length=window)
    past = lengths[:, None] + torch.arange(1 - window, 0, device=lengths.device)  # [B, W-1] positions before the chunk
    rows = (past % window)[:, None, :, None]  # [B, 1, W-1, 1]
    k_all = torch.cat([k_cache.gather(2, rows.expand(-1, k.shape[1], -1, k.shape[3])), k], 2)  # [B, Hkv, W-1+T, D]
    v_all = torch.cat([v_cache.gather(2, rows.expand(-1, v.shape[1], -1, v.shape[3])), v], 2)
    visible = torch.cat([past >= 0, torch.ones(q.shape[0], t, dtype=torch.bool, device=q.device)], 1)  # [B, W-1+T]
    y = ops.attention(q, k_all, v_all, mask=visible[:, None, None, :], window=window)
    # Row r gets position newest[b, r]: the newest stored position congruent to r (mod W).
    last = lengths + (t if key_lengths is None else key_lengths) - 1  # [B] newest stored position
    r = torch.arange(window, device=lengths.device)
    newest = last[:, None] - (last[:, None] - r) % window  # [B, W]
    from_chunk = (newest >= lengths[:, None])[:, None, :, None]  # [B, 1, W, 1]
    index = (newest - lengths[:, None]).clamp(0, t - 1)[:, None, :, None]  # [B, 1, W, 1]: its token in the chunk
    k_cache.copy_(torch.where(from_chunk, k.gather(2, index.expand(-1, k.shape[1], -1, k.shape[3])), k_cache))
    v_cache.copy_(torch.where(from_chunk, v.gather(2, index.expand(-1, v.shape[1], -1, v.shape[3])), v_cache))
    return y
