"""pytransformer.quantize: post-training weight-only int8 quantization of a model's nn.Linear layers and embeddings
(defined in nn.quantized, so that models can load a checkpoint quantized), and state_dict_bytes."""
from torch import nn

from .nn.quantized import quantize

__all__ = ["quantize", "state_dict_bytes"]


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of the tensors in model.state_dict(), each storage counted once (tied weights once, as torch.save does)."""
    storages = {}
    for t in model.state_dict().values():
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())
