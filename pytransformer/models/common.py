"""Pieces shared by the three model families: input embeddings, rotary set-up and weight initialisation."""
import math

import torch
from torch import Tensor, nn

from ..nn import LayerNorm, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding


class Embeddings(nn.Module):
    """Token embedding (times sqrt(d_model) when `scale`) + positions + token types, optional LayerNorm, dropout."""

    def __init__(self, config, *, scale: bool = False, type_vocab_size: int = 0, norm: bool = False):
        super().__init__()
        d = config.d_model
        self.tok = nn.Embedding(config.vocab_size, d)
        self.pos = {"sinusoidal": lambda: SinusoidalPositionalEncoding(d, config.max_len),
                    "sinusoidal_halves": lambda: SinusoidalPositionalEncoding(d, config.max_len, halves=True),
                    "learned": lambda: LearnedPositionalEmbedding(config.max_len, d),
                    "rotary": lambda: None}[config.positional]()  # rotary positions are applied inside attention
        self.types = nn.Embedding(type_vocab_size, d) if type_vocab_size else None
        self.norm = LayerNorm(d, eps=config.eps) if norm else None
        self.dropout = nn.Dropout(config.dropout)
        self.scale = math.sqrt(d) if scale else 1.0

    def forward(self, ids: Tensor, positions: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """ids [B, L], positions [L] or [B, L] -> [B, L, d_model]."""
        x = self.tok(ids) * self.scale if self.scale != 1.0 else self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(positions)
        if self.types is not None:
            x = x + self.types(torch.zeros_like(ids) if token_type_ids is None else token_type_ids)
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x) if self.training else x


def rotary_for(config, theta: float | None = None) -> RotaryEmbedding | None:
    """The RotaryEmbedding shared by all layers of a model with positional="rotary", else None; with `theta`, one of
    that base and no scaling (DecoderConfig.local_rope_theta's, for the windowed layers)."""
    if config.positional != "rotary":
        return None
    if theta is not None:
        return RotaryEmbedding(config.head_dim, config.max_len, theta)
    return RotaryEmbedding(config.head_dim, config.max_len, config.rope_theta, config.rope_scaling)


def float_parameter(model: nn.Module) -> Tensor:
    """A floating-point parameter of `model`: its device and dtype are the activations' (also once quantized)."""
    return next(p for p in model.parameters() if p.is_floating_point())


def init_normal(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2/BERT initialisation: Linear and Embedding weights ~ N(0, std), biases 0 (norms keep ones/zeros)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
