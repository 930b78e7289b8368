"""Loading Hugging Face checkpoints into our models: from a transformers model in memory (from_hf) or from a local
directory as save_pretrained writes it (from_pretrained: config.json plus model.safetensors or a sharded
model.safetensors.index.json, read with the safetensors package; transformers is not imported). The architectures
are in hf.py; both paths hand `convert` a config dict and a name -> tensor mapping.

The model is built on the meta device, given uninitialised storage (a tied parameter stays one parameter), and its
parameters are then copied one at a time from the tensors, read one at a time from the files: peak memory stays near
the model's size. Buffers derived from the config (rotary frequencies, sinusoidal tables) are recomputed. With
quantize=True the model is quantized while still on the meta device and each linear weight is quantized as it is
read, so the float weights are never all in memory: peak memory stays near the int8 model's size plus one tensor.
A tensor the model needs that is absent, a tensor it would not use, or a tensor of the wrong shape raises ValueError
naming it."""
import contextlib
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from ..nn.quantized import quantize as quantize_model, quantize_per_channel
from .hf import architecture


def _materialize(model: nn.Module, device) -> None:
    """Uninitialised storage on `device` for a model built on the meta device; tied parameters stay tied."""
    fresh, keep = {}, []
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                if id(p) not in fresh:
                    keep.append(p)  # holds the meta parameter alive, so ids stay unique
                    fresh[id(p)] = nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
                m._parameters[name] = fresh[id(p)]
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = torch.empty_like(b, device=device)
    model.to(device)  # moves nothing; recomputes the derived buffers (nn.positional)


def _combined(tensors, names: tuple[str, ...], transpose: bool, ours: str) -> torch.Tensor:
    parts = [tensors[n] for n in names]
    try:
        t = parts[0] if len(parts) == 1 else torch.cat(parts)
    except RuntimeError as e:
        raise ValueError(f"{ours}: tensors {list(names)} of shapes {[list(p.shape) for p in parts]} do not stack "
                         "into one") from e
    return t.t() if transpose else t


def _list(names) -> str:
    names = sorted(names)
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _writers(model: nn.Module, quantize: bool) -> dict:
    """For each parameter name of a model on the meta device, a function writing a tensor into it once the model is
    materialised. quantize=True quantizes the model (still on meta) first: a linear layer's weight (or a weight tied to
    one) is then written into its QuantizedLinear, quantized per channel, and its bias into the int8 layer's bias."""
    params = dict(model.named_parameters())
    linears = {}  # id(parameter) -> (path of the first Linear using it, "weight" | "bias"), as quantize() ties them
    if quantize:
        for path, m in model.named_modules():
            if isinstance(m, nn.Linear):
                for attr in ("weight", "bias"):
                    if getattr(m, attr) is not None:
                        linears.setdefault(id(getattr(m, attr)), (path, attr))
        quantize_model(model)
    where = {name: linears.get(id(p)) for name, p in params.items()}

    def write(name):
        def to_param(t):
            model.get_parameter(name).copy_(t)

        def to_int8(t):
            path, attr = where[name]
            layer = model.get_submodule(path)
            if attr == "bias":
                layer.bias.copy_(t)
            else:
                q, scale = quantize_per_channel(t.to(layer.scale.dtype))
                layer.weight.copy_(q)
                layer.scale.copy_(scale)
        return to_int8 if where[name] else to_param
    return {name: write(name) for name in params}


def convert(cls, config_class, d: dict, tensors: Mapping, *, dtype: torch.dtype, device,
            quantize: bool = False) -> nn.Module:
    """A `cls` model (its config a `config_class`) in `dtype` on `device` from a Hugging Face config dict and a
    mapping of Hugging Face tensor names to tensors (read on access); quantize=True: its linear layers int8."""
    arch, given = architecture(d, tensors.keys())
    if not isinstance(arch.config, config_class):
        raise ValueError(f"model_type: {d['model_type']!r} is not a {cls.__name__} architecture")
    needed = {n for names, _ in arch.plan.values() for n in names}
    missing = needed - given.keys()
    if missing:
        raise ValueError(f"checkpoint: missing tensors {_list(missing)}")
    unexpected = {n for n in given.keys() - needed if not any(re.fullmatch(p, n) for p in arch.ignored)}
    if unexpected:
        raise ValueError(f"checkpoint: unexpected tensors {_list(unexpected)}")
    with torch.device("meta"):
        model = cls(arch.config).to(dtype)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert shapes.keys() == arch.plan.keys(), "hf.py: the plan must cover the model's parameters"
    writers = _writers(model, quantize)
    _materialize(model, device)
    with torch.no_grad():
        for ours, (names, transpose) in arch.plan.items():
            t = _combined(tensors, tuple(given[n] for n in names), transpose, ours)
            if t.shape != shapes[ours]:
                raise ValueError(f"{' + '.join(names)}: shape {list(t.shape)} does not fit {ours} "
                                 f"{list(shapes[ours])} of the config")
            writers[ours](t)
    return model


def from_hf(cls, config_class, model) -> nn.Module:
    """`cls` with the config and weights of a transformers model object, on its device, in its dtype and mode."""
    w = next(model.parameters())
    ours = convert(cls, config_class, model.config.to_dict(), model.state_dict(), dtype=w.dtype, device=w.device)
    return ours.train(model.training)


class SafetensorsFiles(Mapping):
    """The tensors of safetensors files by name, each read from its file when asked for (opened by the caller's
    ExitStack)."""

    def __init__(self, files, stack: contextlib.ExitStack):
        from safetensors import safe_open
        self._file = {}
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
            self._file |= dict.fromkeys(handle.keys(), handle)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._file[name].get_tensor(name)

    def __iter__(self):
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)


def checkpoint_files(path) -> tuple[dict, list[Path]]:
    """config.json's dict and the safetensors files of a save_pretrained directory; FileNotFoundError naming what
    is missing."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"path: {path} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: no such file (a save_pretrained directory has config.json)")
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"{f}: no such file (listed in {index.name})")
    else:
        raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json (only safetensors "
                                "checkpoints are read)")
    return json.loads(config.read_text()), files


def from_pretrained(cls, config_class, path, *, dtype: torch.dtype = torch.float32, device=None,
                    quantize: bool = False) -> nn.Module:
    """`cls` from a save_pretrained directory, in `dtype` on `device` (default CPU), in eval mode; quantize=True:
    the weight-only int8 model (pytransformer.quantize), quantized tensor by tensor as the weights are read."""
    d, files = checkpoint_files(path)
    with contextlib.ExitStack() as stack:
        model = convert(cls, config_class, d, SafetensorsFiles(files, stack), dtype=dtype,
                        device=torch.device("cpu") if device is None else device, quantize=quantize)
    return model.eval()
