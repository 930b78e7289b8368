"""int8 modules: QuantizedLinear (per-output-channel scales) and QuantizedEmbedding (an int8 table: a quantized LM head
it is tied to, or its own), and quantize(model), which swaps them in. Weights are quantized after training;
activations stay in floating point (x_bits=16, weight-only) or are quantized per row to 8 bits as each layer runs
(x_bits=8, see ops.int8_linear)."""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import ops
from ..ops import _checks
from ..ops.int8_linear import DEFAULT_X_BITS


def quantize_per_channel(weight: Tensor, rows: int = 1024) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row: weight [out, in] -> int8 [out, in], scale [out] (weight's dtype).
    Computed `rows` rows at a time, so the float temporaries stay small beside a large weight (an LM head)."""
    w = weight.detach()
    absmax = torch.cat([w[r:r + rows].float().abs().amax(1) for r in range(0, max(1, w.shape[0]), rows)])  # [out]
    scale = (absmax / 127.0).to(weight.dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero rows quantize to 0 with any scale
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    for r in range(0, w.shape[0], rows):
        q[r:r + rows] = (w[r:r + rows].float() / scale[r:r + rows].float()[:, None]).round_().clamp_(-127, 127)
    return q, scale


class QuantizedLinear(nn.Module):
    """y = (x @ weight.T) * scale + bias with int8 weight [out, in] and float scale [out]: int8 nn.Linear over
    ops.int8_linear, x_bits (16: weight-only; 8: x quantized per row to 8 bits too) passed on to it. Buffers, not
    parameters: the module is for inference (no backward)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, x_bits: int = DEFAULT_X_BITS,
                 device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features, self.x_bits = in_features, out_features, x_bits
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(out_features, device=device, dtype=dtype))
        self.register_buffer("bias", torch.zeros(out_features, device=device, dtype=dtype) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "QuantizedLinear":
        """The int8 version of an nn.Linear (its weights quantized per output channel)."""
        return cls.from_weight(linear.weight, linear.bias)

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None = None) -> "QuantizedLinear":
        """The int8 version of weight [out, in] (quantized per output channel) and bias [out]; on the meta device
        only the shapes, as there are no values to quantize."""
        q = cls(weight.shape[1], weight.shape[0], bias is not None, device=weight.device, dtype=weight.dtype)
        if not weight.is_meta:
            q.weight, q.scale = quantize_per_channel(weight)
        if bias is not None:
            q.bias = bias.detach().clone()
        return q

    @property
    def x_bits(self) -> int:
        """16: weight-only; 8: x quantized per row to 8 bits too (see ops.int8_linear); checked when set."""
        return self._x_bits

    @x_bits.setter
    def x_bits(self, bits: int) -> None:
        _checks.known_x_bits(bits)
        self._x_bits = bits

    def dequantized_weight(self) -> Tensor:
        """The float weight [out, in] that this module multiplies by (weight * scale)."""
        return self.weight.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] -> [..., out]."""
        return ops.int8_linear(x, self.weight, self.scale, self.bias, x_bits=self.x_bits)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8, x_bits={self.x_bits}")


def linear_rows(linear: nn.Module, x: Tensor, rows: slice) -> Tensor:
    """The output features `rows` of an nn.Linear or QuantizedLinear applied to x [..., in] -> [..., len(rows)]."""
    bias = None if linear.bias is None else linear.bias[rows]
    if isinstance(linear, QuantizedLinear):
        return ops.int8_linear(x, linear.weight[rows], linear.scale[rows], bias, x_bits=linear.x_bits)
    return ops.linear(x, linear.weight[rows], bias)


class QuantizedEmbedding(nn.Module):
    """An int8 embedding table: row i is `head`'s int8 row i times scale[i], where head is the QuantizedLinear LM head
    the embedding is tied to (a submodule: as a tied weight, it appears in the state dict under both names and moves
    with .to()) or, for an untied embedding (from_embedding), a table of its own in the same form, used only here."""

    def __init__(self, head: QuantizedLinear):
        super().__init__()
        self.head = head

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> "QuantizedEmbedding":
        """The int8 version of an untied nn.Embedding (each row quantized with a scale of its own)."""
        return cls(QuantizedLinear.from_weight(embedding.weight))

    def forward(self, ids: Tensor) -> Tensor:
        """ids int [...] -> [..., embedding_dim] in the head's float dtype."""
        scale = self.head.scale
        return F.embedding(ids, self.head.weight).to(scale.dtype) * scale[ids, None]


def quantize(model: nn.Module, x_bits: int = DEFAULT_X_BITS) -> nn.Module:
    """Replace every nn.Linear of `model` in place by a QuantizedLinear (int8 weight, per-output-channel scale) and
    return the model; an nn.Embedding whose weight is tied to a Linear's becomes a QuantizedEmbedding of that head,
    any other nn.Embedding one of its own table quantized per row (as llama.cpp's q8_0 and CTranslate2's int8 store
    embeddings), except one with max_norm, which stays as it is. Every QuantizedLinear of the model, new or already
    there (a model loaded with quantize=True), then has `x_bits`: 16 weight-only, 8 x quantized per row to 8 bits too
    (see ops.int8_linear)."""
    _checks.known_x_bits(x_bits)  # before the model changes
    if isinstance(model, nn.Linear):
        model = QuantizedLinear.from_linear(model)
    modules = list(model.modules())  # holds every original module (and weight) alive, so their ids stay unique
    new = {id(m): QuantizedLinear.from_linear(m) for m in modules if isinstance(m, nn.Linear)}
    heads = {}  # id(float weight) -> the QuantizedLinear of the first Linear using it
    for m in modules:
        if isinstance(m, nn.Linear):
            heads.setdefault(id(m.weight), new[id(m)])
    for m in modules:
        if isinstance(m, nn.Embedding) and id(m.weight) in heads:
            if m.max_norm is not None:
                raise ValueError("model: an nn.Embedding tied to a Linear has max_norm, which the int8 table cannot "
                                 "apply")
            new[id(m)] = QuantizedEmbedding(heads[id(m.weight)])
        elif isinstance(m, nn.Embedding) and m.max_norm is None:
            new[id(m)] = QuantizedEmbedding.from_embedding(m)
    for parent in modules:
        for name, child in list(parent.named_children()):
            if id(child) in new:
                setattr(parent, name, new[id(child)])
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.x_bits = x_bits
    return model
