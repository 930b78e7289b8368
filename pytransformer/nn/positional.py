"""Positional encodings: sinusoidal (Vaswani et al.), learned (GPT-2, BERT) and rotary (RoFormer, half-split pairs)."""
import math

import torch
from torch import Tensor, nn


def token_positions(length: int, device=None, cache=None) -> Tensor:
    """Absolute positions of the next `length` tokens: [length] without a cache, [B, length] after its rows."""
    return torch.arange(length, device=device) if cache is None else cache.positions(length)


class _DerivedBuffers(nn.Module):
    """A module whose (non-persistent) buffers are functions of its constructor arguments: moving or casting it
    (.to, .double(), .to_empty() of a model built on the meta device) recomputes them on the new device by
    `_derive(device, dtype)` instead of converting the old values, so they are never uninitialised or rounded. On the
    meta device only their shapes are derived (computed on the CPU, kept as meta tensors): arithmetic on meta tensors
    runs Python reference kernels whose first use imports torch._dynamo, tens of MiB for a shape."""

    def _derive(self, device, dtype) -> None:
        raise NotImplementedError

    def _set_buffers(self, device, dtype) -> None:
        """The buffers on `device` (None: the default device) in `dtype`."""
        meta = torch.empty(0, device=device).is_meta
        self._derive("cpu" if meta else device, dtype)
        if meta:
            for name, b in self._buffers.items():
                self._buffers[name] = torch.empty_like(b, device="meta")

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        ref = next(self.buffers(recurse=False))
        self._set_buffers(ref.device, ref.dtype)
        return self


class SinusoidalPositionalEncoding(_DerivedBuffers):
    """Fixed encodings PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...); forward(positions) -> [..., d].
    halves=True puts the same values in the layout of tensor2tensor, fairseq and Marian checkpoints: every sine
    first, then every cosine (PE[p, i] = sin, PE[p, ceil(d/2) + i] = cos)."""

    def __init__(self, d_model: int, max_len: int = 5000, *, halves: bool = False):
        super().__init__()
        self.d_model, self.max_len, self.halves = d_model, max_len, halves
        self._set_buffers(None, torch.float32)

    def _derive(self, device, dtype) -> None:
        d = self.d_model
        pos = torch.arange(self.max_len, dtype=torch.float64, device=device)[:, None]  # [max_len, 1]
        freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / d))
        sin, cos = torch.sin(pos * freq), torch.cos(pos * freq[: d // 2])
        if self.halves:
            pe = torch.cat([sin, cos], 1)
        else:
            pe = torch.empty(self.max_len, d, dtype=torch.float64, device=device)
            pe[:, 0::2], pe[:, 1::2] = sin, cos
        self.register_buffer("pe", pe.to(dtype), persistent=False)  # [max_len, d_model]

    def forward(self, positions: Tensor) -> Tensor:
        """positions int [...] -> encodings [..., d_model]."""
        return self.pe[positions]


class LearnedPositionalEmbedding(nn.Embedding):
    """A trained table of max_len position vectors; forward(positions) -> [..., d_model]."""

    def __init__(self, max_len: int, d_model: int, device=None, dtype=None):
        super().__init__(max_len, d_model, device=device, dtype=dtype)


ROPE_TYPES = {"default": (), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings")}


def rope_type(scaling: dict | None) -> str:
    """The rope_type of a rope scaling dict (key "rope_type", or "type" as older configs write it; None: "default");
    ValueError naming it when it is not supported, or naming a missing parameter of a supported one."""
    kind = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported (one of {sorted(ROPE_TYPES)})")
    missing = [k for k in ROPE_TYPES[kind] if k not in scaling]
    if missing:
        raise ValueError(f"rope_scaling: rope_type {kind!r} needs {missing}")
    return kind


def rope_inv_freq(head_dim: int, base: float = 10000.0, scaling: dict | None = None, *, device=None,
                  dtype=torch.float32) -> Tensor:
    """Rotary inverse frequencies [D/2] as Hugging Face transformers computes them: 1 / base^(2i/D), then the
    `scaling` dict's adjustment. Supported scaling: None, {"rope_type": "default"} and {"rope_type": "llama3",
    "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} (Llama 3.1, the formula of
    transformers' _compute_llama3_parameters); any other type raises ValueError naming it."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).to(dtype) / head_dim))
    if rope_type(scaling) == "default":
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)  # long wavelengths: divided by factor
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)  # between the two: interpolated
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(_DerivedBuffers):
    """Rotary position embedding: rotates channel pairs (i, i + D/2) of q and k by p * inv_freq[i], inv_freq =
    base^(-2i/D) adjusted by `scaling` (see rope_inv_freq) -- the rotate-half layout and arithmetic of Hugging Face
    Llama: angles p * inv_freq in float32 (float64 once the module is cast to float64), cos/sin cast to x's dtype.
    cos/sin are computed for the positions asked, so any position works (`max_len` is accepted for compatibility and
    not used); inv_freq stays float32 when the module is cast to a lower precision."""

    def __init__(self, head_dim: int, max_len: int = 4096, base: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim: must be even for rotary embeddings, got {head_dim}")
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        self._set_buffers(None, torch.float32)

    def _derive(self, device, dtype) -> None:
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.register_buffer("inv_freq", rope_inv_freq(self.head_dim, self.base, self.scaling, device=device,
                                                       dtype=dtype), persistent=False)  # [D/2]

    def cos_sin(self, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
        """cos and signed sin [..., D] in `dtype` of the angles at positions int [...]: the sin of the first half
        negated, so that rotate is two products and a roll (see there)."""
        angles = positions[..., None].to(self.inv_freq.dtype) * self.inv_freq  # [..., D/2]
        sin = angles.sin()
        return torch.cat([angles, angles], -1).cos().to(dtype), torch.cat([-sin, sin], -1).to(dtype)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x [B, H, L, D] at positions [L] or [B, L] (default 0..L-1) -> rotated x [B, H, L, D]. Rotate q and k
        together where they are adjacent heads of one tensor: one set of ops instead of two."""
        return self.rotate(x, *self.cos_sin_of(x, positions))

    def cos_sin_of(self, x: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """cos_sin for x [B, H, L, D] at positions [L] or [B, L] (default 0..L-1), in x's dtype."""
        positions = torch.arange(x.shape[-2], device=x.device) if positions is None else positions
        return self.cos_sin(positions, x.dtype)

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [B, H, L, D] rotated by cos and signed sin [L, D] or [B, L, D] (cos_sin): x * cos + roll(x) * sin is
        Hugging Face's x * cos + cat(-x2, x1) * sin operation for operation (roll(x) is cat(x2, x1), and negating is
        exact), in three ops fewer."""
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, L, D]
        return x * cos + x.roll(x.shape[-1] // 2, -1) * sin
