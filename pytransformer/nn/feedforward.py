"""FeedForward: the position-wise MLP of a Transformer layer (ReLU, GELU, SiLU, or gated: SwiGLU, GeGLU)."""
import functools

import torch.nn.functional as F
from torch import Tensor, nn

from .linear import Linear

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
               "silu": F.silu}
# Gated: fc1 produces gate|up, and the activation is act(gate) * up (Llama's SwiGLU; Gemma's GeGLU, tanh GELU).
GATED = {"swiglu": F.silu, "geglu": ACTIVATIONS["gelu_tanh"]}


class FeedForward(nn.Module):
    """fc2(dropout(act(fc1(x)))); for a gated activation ("swiglu", "geglu"), fc1 produces gate|up and act is
    silu(gate) * up or gelu_tanh(gate) * up."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if activation not in ACTIVATIONS and activation not in GATED:
            raise ValueError(f"activation: expected one of {[*ACTIVATIONS, *GATED]}, got {activation!r}")
        self.activation = activation
        factory = {"device": device, "dtype": dtype}
        self.fc1 = Linear(d_model, 2 * d_ff if activation in GATED else d_ff, bias=bias, **factory)
        self.fc2 = Linear(d_ff, d_model, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x [..., d_model] -> [..., d_model]."""
        h = self.fc1(x)  # [..., d_ff] (swiglu: [..., 2 * d_ff])
        if self.activation in GATED:  # act(gate) * up into act's output, and no name left on fc1's: one
            d_ff = self.fc2.in_features  # [..., d_ff] temporary at a time besides fc1's, freed before fc2 runs
            h = GATED[self.activation](h[..., :d_ff]).mul_(h[..., d_ff:])
        else:
            h = ACTIVATIONS[self.activation](h)
        return self.fc2(self.dropout(h) if self.training else h)
