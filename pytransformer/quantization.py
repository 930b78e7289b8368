"""pytransformer.quantize: post-training weight-only int8 quantization of a model's nn.Linear layers."""
from torch import nn

from .nn.quantized import QuantizedEmbedding, QuantizedLinear


def quantize(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` in place by a QuantizedLinear (int8 weight, per-output-channel scale) and
    return the model; an nn.Embedding whose weight is tied to a Linear's becomes a QuantizedEmbedding of that head."""
    if isinstance(model, nn.Linear):
        return QuantizedLinear.from_linear(model)
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
    for parent in modules:
        for name, child in list(parent.named_children()):
            if id(child) in new:
                setattr(parent, name, new[id(child)])
    return model


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of the tensors in model.state_dict(), each storage counted once (tied weights once, as torch.save does)."""
    storages = {}
    for t in model.state_dict().values():
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())
