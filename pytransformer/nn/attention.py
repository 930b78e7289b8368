"""MultiHeadAttention: self- or cross-attention over ops.attention (full sequences) and ops.decode_attention (cache)."""
import torch
from torch import Tensor, nn

from .. import ops
from ..ops import _checks
from ..ops.visibility import visible_keys
from .kv_cache import AttentionCache, is_rolling, rolling_attention
from .linear import Linear
from .norm import RMSNorm
from .positional import RotaryEmbedding
from .quantized import linear_rows


class MultiHeadAttention(nn.Module):
    """Multi-head attention with GQA/MQA (`n_kv_heads`), one fused Q|K|V projection, optional rotary positions and
    sliding window. Self-attention when `context` is None, cross-attention over `context` otherwise. `bias` is the
    output projection's; `qkv_bias` (default: `bias`) the Q|K|V projection's. Each head is `d_head` wide (default
    d_model // n_heads; another width, as Qwen3's 128 at d_model 1024 with 16 heads, makes the projections
    d_model -> n_heads * d_head -> d_model). `qk_norm` adds an RMSNorm over each head's width of q and of k (weights
    [d_head] in q_norm and k_norm, eps `qk_norm_eps`) after the projection and before rotary, as Qwen3's."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, *, qkv_bias: bool | None = None, rotary: RotaryEmbedding | None = None,
                 window: int | None = None, d_head: int | None = None, qk_norm: bool = False,
                 qk_norm_eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _checks.positive_window(window)
        if d_head is None and d_model % n_heads:
            raise ValueError(f"n_heads: d_model={d_model} must be divisible by n_heads={n_heads} (or give d_head)")
        if d_head is not None and (not isinstance(d_head, int) or d_head < 1):
            raise ValueError(f"d_head: expected a positive int, got {d_head!r}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads: n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if d_head is None else d_head
        self.dropout, self.rotary, self.window = dropout, rotary, window
        self.q_dim, self.kv_dim = n_heads * self.head_dim, n_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = Linear(d_model, self.q_dim + 2 * self.kv_dim, bias=bias if qkv_bias is None else qkv_bias,
                               **factory)  # rows: Q | K | V
        self.out_proj = Linear(self.q_dim, d_model, bias=bias, **factory)
        self.q_norm = RMSNorm(self.head_dim, qk_norm_eps, **factory) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, qk_norm_eps, **factory) if qk_norm else None

    def _heads(self, x: Tensor, n: int) -> Tensor:
        return x.unflatten(-1, (n, self.head_dim)).transpose(1, 2)  # [B, L, n*D] -> [B, n, L, D]

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values [B, Hkv, Lk, D] of `context` [B, Lk, d_model] (what a cross-attention cache holds)."""
        k, v = linear_rows(self.qkv_proj, context, slice(self.q_dim, None)).split(self.kv_dim, -1)
        k = self._heads(k, self.n_kv_heads)
        return k if self.k_norm is None else self.k_norm(k), self._heads(v, self.n_kv_heads)

    def _project_q(self, x: Tensor) -> Tensor:
        q = self._heads(linear_rows(self.qkv_proj, x, slice(self.q_dim)), self.n_heads)
        return q if self.q_norm is None else self.q_norm(q)

    def _qkv(self, x: Tensor, context: Tensor | None, positions: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        if context is not None:  # cross-attention
            return (self._project_q(x), *self.project_kv(context))
        # [B, L, (Hq + 2 Hkv) * D] -> [B, Hq + 2 Hkv, L, D], split into q, k, v: the same views as splitting first,
        # in fewer torch calls (each a microsecond or so, per layer per decoded token); q and k rotated together
        heads = (self.n_heads, self.n_kv_heads, self.n_kv_heads)
        qkv = self._heads(self.qkv_proj(x), sum(heads))
        if self.q_norm is not None:  # q and k normed apart (each its own weights), then rotated alike
            q, k, v = qkv.split(heads, 1)
            q, k = self.q_norm(q), self.k_norm(k)
            if self.rotary is None:
                return q, k, v
            cos, sin = self.rotary.cos_sin_of(q, positions)
            return self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin), v
        if self.rotary is not None:
            qk = self.rotary(qkv[:, :self.n_heads + self.n_kv_heads], positions)
            return (*qk.split(heads[:2], 1), qkv[:, self.n_heads + self.n_kv_heads:])
        return qkv.split(heads, 1)  # [B, Hq, L, D], [B, Hkv, Lk, D], [B, Hkv, Lk, D]

    def attention_weights(self, x: Tensor, context: Tensor | None = None, *, key_lengths: Tensor | None = None,
                          causal: bool = False) -> Tensor:
        """The attention probabilities [B, Hq, L, Lk] of x [B, L, d_model] over context (or x), recomputed through
        ops.masked_softmax for inspection (forward never materialises them)."""
        q, k, _ = self._qkv(x, context, None)  # [B, Hq, L, D], [B, Hkv, Lk, D]
        k = k.repeat_interleave(self.n_heads // self.n_kv_heads, 1)  # [B, Hq, Lk, D]
        mask = visible_keys(q.shape[2], k.shape[2], window=self.window, key_lengths=key_lengths, device=k.device)
        return ops.masked_softmax(q @ k.transpose(-1, -2), mask, scale=self.head_dim ** -0.5, causal=causal)

    def forward(self, x: Tensor, context: Tensor | None = None, *, mask: Tensor | None = None, causal: bool = False,
                key_lengths: Tensor | None = None, cache: AttentionCache | None = None) -> Tensor:
        """x [B, L, d_model] (context [B, Lk, d_model]) -> [B, L, d_model]. With a self-attention `cache`, x holds
        the next L tokens of every row: their K/V are appended and they attend causally to the cached rows. Attention
        over a cache runs in the cache's dtype (KVCache), the result in x's."""
        if cache is not None and mask is not None:
            raise ValueError("mask: not supported with a cache (cached attention is causal over the cached rows)")
        if cache is not None and cache.static:  # cross-attention over the K/V computed once
            q = _as(self._project_q(x), cache.k.dtype)
            if x.shape[1] == 1:  # a decoding step: the one query sees its row's memory, as decode_attention's does
                y = ops.decode_attention(q, cache.k, cache.v, cache.lengths, max_length=cache.k.shape[2])
            else:
                y = ops.attention(q, cache.k, cache.v, key_lengths=cache.lengths)
        elif cache is not None:  # self-attention over the cached rows plus the L new ones, in the cache's dtype
            q, k, v = (_as(t, cache.k.dtype) for t in self._qkv(x, context, cache.positions))
            if is_rolling(cache.k.shape[2], self.window):
                y = rolling_attention(q, k, v, cache, key_lengths)
            else:
                bound = cache.max_length  # host-side bound of cache.lengths (None: unknown, read on CUDA)
                ops.kv_cache_append(cache.k, cache.v, k, v, cache.lengths, max_position=bound)
                if cache.length is not None and x.shape[1] > 1:  # a prompt or a chunk of one, after `length`
                    n = cache.length + x.shape[1]  # rows in every row: tiled attention over the first n, bottom-right
                    y = ops.attention(q, cache.k[:, :, :n], cache.v[:, :, :n], causal=True, window=self.window)
                else:
                    y = ops.decode_attention(q, cache.k, cache.v, cache.visible, window=self.window,
                                             max_length=None if bound is None else bound + x.shape[1])
        else:
            q, k, v = self._qkv(x, context, None)
            y = ops.attention(q, k, v, mask=mask, causal=causal, window=self.window, key_lengths=key_lengths,
                              dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(_as(y, x.dtype).transpose(1, 2).flatten(2))  # [B, Hq, L, D] -> [B, L, d_model]


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t in dtype: t itself when it has it, decided in Python (Tensor.to returns t too, but through the dispatcher,
    about a microsecond, four times a layer in every eager decoding step)."""
    return t if t.dtype == dtype else t.to(dtype)
