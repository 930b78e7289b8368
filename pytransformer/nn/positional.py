"""Positional encodings: sinusoidal (Vaswani et al.), learned (GPT-2, BERT) and rotary (RoFormer, half-split pairs)."""
import math

import torch
from torch import Tensor, nn


def token_positions(length: int, device=None, cache=None) -> Tensor:
    """Absolute positions of the next `length` tokens: [length] without a cache, [B, length] after its rows."""
    return torch.arange(length, device=device) if cache is None else cache.positions(length)


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed encodings PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...); forward(positions) -> [..., d]."""

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # [max_len, 1]
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq[: d_model // 2])
        self.register_buffer("pe", pe.float(), persistent=False)  # [max_len, d_model]

    def forward(self, positions: Tensor) -> Tensor:
        """positions int [...] -> encodings [..., d_model]."""
        return self.pe[positions]


class LearnedPositionalEmbedding(nn.Embedding):
    """A trained table of max_len position vectors; forward(positions) -> [..., d_model]."""

    def __init__(self, max_len: int, d_model: int, device=None, dtype=None):
        super().__init__(max_len, d_model, device=device, dtype=dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding: rotates channel pairs (i, i + D/2) of q and k by p * base^(-2i/D)."""

    def __init__(self, head_dim: int, max_len: int = 4096, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim: must be even for rotary embeddings, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [D/2]
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # [max_len, D/2]
        angles = torch.cat([angles, angles], -1)  # [max_len, D]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x [B, H, L, D] at positions [L] or [B, L] (default 0..L-1) -> rotated x [B, H, L, D]."""
        if positions is None:
            positions = torch.arange(x.shape[-2], device=x.device)
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)  # [L, D] or [B, L, D]
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, L, D]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin
