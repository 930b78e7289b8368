"""Transformer encoder/decoder layers (post-, pre- or sandwich-norm residual blocks) and the stacks built from them."""
import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .kv_cache import KVCache, LayerCache
from .torch_nn import decoder_layer_from_torch, encoder_layer_from_torch
from .norm import make_norm

NORMS = ("post", "pre", "sandwich")


class Residual(nn.Module):
    """x + dropout(f(x)) with a norm after the sum ("post"), before f ("pre") or before and after f ("sandwich");
    norm_type "layernorm" (LayerNorm, `bias` as given) or "rmsnorm" (RMSNorm, no bias)."""

    def __init__(self, d_model: int, norm: str = "post", dropout: float = 0.0, eps: float = 1e-5, bias: bool = True,
                 device=None, dtype=None, *, norm_type: str = "layernorm"):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
        self.mode = norm
        self.norm = make_norm(norm_type, d_model, eps, bias, device, dtype)
        self.out_norm = make_norm(norm_type, d_model, eps, bias, device, dtype) if norm == "sandwich" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, f) -> Tensor:
        """x [B, L, d_model], f: [B, L, d_model] -> [B, L, d_model]."""
        if self.mode == "post":
            y = f(x)
            return self.norm(x + (self.dropout(y) if self.training else y))
        y = f(self.norm(x))
        if self.out_norm is not None:
            y = self.out_norm(y)
        return x + (self.dropout(y) if self.training else y)


class TransformerEncoderLayer(nn.Module):
    """Self-attention and feed-forward blocks; same arguments as torch.nn.TransformerEncoderLayer where they overlap."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int = 2048, dropout: float = 0.1, activation: str = "relu",
                 norm: str = "post", eps: float = 1e-5, bias: bool = True, n_kv_heads: int | None = None, *,
                 rotary=None, window: int | None = None, norm_type: str = "layernorm", qkv_bias: bool | None = None,
                 d_head: int | None = None, qk_norm: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        heads = {"qkv_bias": qkv_bias, "d_head": d_head, "qk_norm": qk_norm, "qk_norm_eps": eps}
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout, bias, rotary=rotary, window=window,
                                            **heads, **factory)
        self.ff = FeedForward(d_model, d_ff, activation, dropout, bias, **factory)
        self.res_attn = Residual(d_model, norm, dropout, eps, bias, **factory, norm_type=norm_type)
        self.res_ff = Residual(d_model, norm, dropout, eps, bias, **factory, norm_type=norm_type)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, key_lengths: Tensor | None = None,
                causal: bool = False) -> Tensor:
        """x [B, L, d_model] -> [B, L, d_model]."""
        x = self.res_attn(x, lambda h: self.self_attn(h, mask=mask, causal=causal, key_lengths=key_lengths))
        return self.res_ff(x, self.ff)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "TransformerEncoderLayer":
        """A layer with the weights and settings of a torch.nn.TransformerEncoderLayer (inputs are batch-first)."""
        return encoder_layer_from_torch(cls, layer)


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention over an encoder output, feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int = 2048, dropout: float = 0.1, activation: str = "relu",
                 norm: str = "post", eps: float = 1e-5, bias: bool = True, n_kv_heads: int | None = None, *,
                 cross_attention: bool = True, rotary=None, window: int | None = None, norm_type: str = "layernorm",
                 qkv_bias: bool | None = None, d_head: int | None = None, qk_norm: bool = False, device=None,
                 dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        heads = {"qkv_bias": qkv_bias, "d_head": d_head, "qk_norm": qk_norm, "qk_norm_eps": eps}
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout, bias, rotary=rotary, window=window,
                                            **heads, **factory)
        self.res_self = Residual(d_model, norm, dropout, eps, bias, **factory, norm_type=norm_type)
        self.cross_attn = (MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout, bias, **heads, **factory)
                           if cross_attention else None)
        self.res_cross = (Residual(d_model, norm, dropout, eps, bias, **factory, norm_type=norm_type)
                          if cross_attention else None)
        self.ff = FeedForward(d_model, d_ff, activation, dropout, bias, **factory)
        self.res_ff = Residual(d_model, norm, dropout, eps, bias, **factory, norm_type=norm_type)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, causal: bool = True, mask: Tensor | None = None,
                key_lengths: Tensor | None = None, memory_key_lengths: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: LayerCache | None = None,
                keep: Tensor | None = None) -> Tensor:
        """x [B, L, d_model], memory [B, Lm, d_model] -> [B, L, d_model]. With a cache, x holds the next tokens and
        cross-attention reads the cached memory K/V when the cache has them. keep [B] (positions): only the output at
        position keep[b] of each row, [B, 1, d_model]; self-attention still reads (and caches) every position, and the
        rest of the layer runs on the kept rows alone."""
        if keep is not None and memory_mask is not None:
            raise ValueError("keep: not with memory_mask (its rows are those of every position)")
        self_cache = None if cache is None else cache.self_attn
        x = self.res_self(x, lambda h: self.self_attn(h, mask=mask, causal=causal, key_lengths=key_lengths,
                                                      cache=self_cache))
        if keep is not None:
            x = x[torch.arange(x.shape[0], device=x.device), keep][:, None]
        if self.cross_attn is not None:
            cross_cache = None if cache is None else cache.cross_attn
            if memory is None and cross_cache is None:
                raise ValueError("memory: this decoder layer has cross-attention and needs memory [B, Lm, d_model]")
            x = self.res_cross(x, lambda h: self.cross_attn(h, memory, mask=memory_mask, key_lengths=memory_key_lengths,
                                                            cache=cross_cache))
        return self.res_ff(x, self.ff)

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "TransformerDecoderLayer":
        """A layer with the weights and settings of a torch.nn.TransformerDecoderLayer (inputs are batch-first)."""
        return decoder_layer_from_torch(cls, layer)


class TransformerEncoder(nn.Module):
    """n_layers encoder layers, plus a final norm for pre/sandwich norm; layer_kwargs go to each layer."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int = 2048, **layer_kwargs):
        super().__init__()
        self.layers = nn.ModuleList(TransformerEncoderLayer(d_model, n_heads, d_ff, **layer_kwargs)
                                    for _ in range(n_layers))
        self.norm = _final_norm(d_model, layer_kwargs)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, key_lengths: Tensor | None = None,
                causal: bool = False) -> Tensor:
        """x [B, L, d_model] -> [B, L, d_model]."""
        for layer in self.layers:
            x = layer(x, mask=mask, key_lengths=key_lengths, causal=causal)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(nn.Module):
    """n_layers decoder layers, plus a final norm for pre/sandwich norm; layer_kwargs go to each layer, and
    per_layer[i] (a dict, when given) to layer i over them (a layer's own window and rotary, as Gemma 3's)."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int = 2048, *,
                 per_layer: list[dict] | None = None, **layer_kwargs):
        super().__init__()
        if per_layer is not None and len(per_layer) != n_layers:
            raise ValueError(f"per_layer: expected {n_layers} dicts (one a layer), got {len(per_layer)}")
        self.layers = nn.ModuleList(TransformerDecoderLayer(d_model, n_heads, d_ff,
                                                            **{**layer_kwargs, **(per_layer[i] if per_layer else {})})
                                    for i in range(n_layers))
        self.norm = _final_norm(d_model, layer_kwargs)

    def cache_memory(self, cache: KVCache, memory: Tensor, memory_key_lengths: Tensor | None = None) -> None:
        """Write every layer's cross-attention K/V of memory [B, Lm, d_model] into the cache, once per source."""
        for layer, k, v in zip(self.layers, cache.cross_k, cache.cross_v):
            new_k, new_v = layer.cross_attn.project_kv(memory)  # [B, Hkv, Lm, D]
            k.copy_(new_k)
            v.copy_(new_v)
        if memory_key_lengths is None:
            cache.memory_lengths.fill_(memory.shape[1])
        else:
            cache.memory_lengths.copy_(memory_key_lengths)

    def forward(self, x: Tensor, memory: Tensor | None = None, *, causal: bool = True, mask: Tensor | None = None,
                key_lengths: Tensor | None = None, memory_key_lengths: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None, keep: Tensor | None = None) -> Tensor:
        """x [B, L, d_model] -> [B, L, d_model]. With a cache, x holds the next L tokens of every row; afterwards the
        cache counts them (key_lengths [B] of a right-padded prompt: only the real ones). keep [B] (positions): only
        the output at position keep[b] of each row, [B, 1, d_model], as generation needs from a prompt: the last
        layer's feed-forward (and cross-attention) then runs on those rows alone."""
        length = x.shape[1]
        caches = [None] * len(self.layers) if cache is None else cache.layers(length)
        for i, (layer, layer_cache) in enumerate(zip(self.layers, caches)):
            x = layer(x, memory, causal=causal, mask=mask, key_lengths=key_lengths,
                      memory_key_lengths=memory_key_lengths, memory_mask=memory_mask, cache=layer_cache,
                      keep=keep if i == len(self.layers) - 1 else None)
        if cache is not None:
            cache.advance(length if key_lengths is None else key_lengths, length)
        return x if self.norm is None else self.norm(x)


def _final_norm(d_model: int, layer_kwargs: dict) -> nn.Module | None:
    if layer_kwargs.get("norm", "post") == "post":
        return None
    return make_norm(layer_kwargs.get("norm_type", "layernorm"), d_model, layer_kwargs.get("eps", 1e-5),
                     layer_kwargs.get("bias", True), layer_kwargs.get("device"), layer_kwargs.get("dtype"))
