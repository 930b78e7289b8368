"""Loading Hugging Face checkpoints into our models: from a transformers model in memory (from_hf) or from a local
directory as save_pretrained writes it (from_pretrained: config.json plus model.safetensors or a sharded
model.safetensors.index.json, read with the safetensors package; transformers is not imported). The architectures
are in hf.py; both paths hand `convert` a config dict and a name -> tensor mapping.

The model is built on the meta device (without running its random initialisers), given uninitialised storage (a tied
parameter stays one parameter), and its parameters are then written one at a time from the tensors, read from the files
a block of rows at a time (a transposed tensor whole): peak memory stays near the model's size. from_pretrained on the
CPU copies nothing where it need not: a parameter that is one tensor of the file as stored (same dtype, not transposed,
not quantized; fused from parts, such as gate|up, only where the parts follow each other in the file) becomes a view of
a private mapping of the file (mmap=False turns this off), so its weights are the file's page cache, shared with other
processes reading the file and never counted as the process's anonymous memory; writing to it (training) copies the
pages written, never the file. As with torch.load(mmap=True), the file must not be overwritten in place while the model
lives. Buffers derived from the config (rotary frequencies, sinusoidal tables) are recomputed. With quantize=True the
model is quantized while still on the meta device and each linear weight is quantized as it is read, per output channel,
a block of rows at a time, so the float weights are never all in memory: peak memory stays near the int8 model's size
plus one block.

Every loading failure is a ValueError (FileNotFoundError for a missing path) whose message starts with the file it
concerns (config.json, a safetensors file or the index; "config" and "state_dict" for from_hf) and names the field or
tensor: invalid JSON, a missing, ill-typed or out-of-range config field, an unreadable or truncated safetensors file,
a tensor that is missing, unexpected, duplicated (in two shards, under two names, or in a shard its index does not
list it in), not floating-point (integer and bool tensors are refused, never cast), or of the wrong shape. Every check
reads the config and the files' headers only, before the model is allocated: an absurd size in the config fails
naming the field and the tensor whose header disagrees. Each part of a fused parameter (q, k, v; gate, up) is checked
on its own. A tied config (tie_word_embeddings) whose checkpoint also holds an lm_head.weight (or, for Marian, an
encoder/decoder embed_tokens.weight) different from the embedding is refused (transformers would warn and untie; set
tie_word_embeddings to false to use that head), and so is a Marian final_logits_bias other than zeros."""
import abc
import contextlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..nn.quantized import quantize as quantize_model, quantize_per_channel
from .hf import Architecture, Source, architecture, backbone_prefix, normalized_name


class _SkipInit(TorchFunctionMode):
    """Construction on the meta device without the random initialisers (nn.init's normal_, uniform_ and the
    like): their values would be replaced by the checkpoint's anyway, and on meta tensors they run Python reference
    kernels that import torch._dynamo, tens of MiB of resident memory for nothing."""
    INITIALISERS = {"normal_", "uniform_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                    "kaiming_normal_", "orthogonal_", "sparse_"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _materialize(model: nn.Module, device, mapped: dict) -> None:
    """Storage on `device` for a model built on the meta device: the tensor `mapped` holds for a parameter's name,
    else uninitialised; tied parameters stay tied."""
    names = {id(p): name for name, p in model.named_parameters()}
    fresh, keep = {}, []
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                if id(p) not in fresh:
                    keep.append(p)  # holds the meta parameter alive, so ids stay unique
                    data = mapped.get(names[id(p)])
                    fresh[id(p)] = nn.Parameter(_empty(p, device) if data is None else data, p.requires_grad)
                m._parameters[name] = fresh[id(p)]
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = _empty(b, device)
    model.to(device)  # moves nothing; recomputes the derived buffers (nn.positional)


def _empty(t: torch.Tensor, device) -> torch.Tensor:
    """Uninitialised storage for meta tensor t: torch.empty, as empty_like of a meta tensor runs a Python reference
    that imports torch's symbolic shapes (sympy, some 30 MiB)."""
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def _list(names) -> str:
    names = sorted(names)
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


_BLOCK_ROWS = 1024  # rows of a checkpoint tensor read and converted at a time while loading


def _int8_owners(model: nn.Module, quantize: bool) -> dict:
    """{parameter name: None, or (path of the QuantizedLinear that takes it, "weight" | "bias")} of a model on the meta
    device; quantize=True quantizes the model (still on meta) first, so that a linear layer's weight (or a weight tied
    to one) and its bias belong to its QuantizedLinear."""
    params = dict(model.named_parameters())
    linears = {}  # id(parameter) -> (path of the first Linear using it, "weight" | "bias"), as quantize() ties them
    if quantize:
        for path, m in model.named_modules():
            if isinstance(m, nn.Linear):
                for attr in ("weight", "bias"):
                    if getattr(m, attr) is not None:
                        linears.setdefault(id(getattr(m, attr)), (path, attr))
        for path, m in model.named_modules():  # an untied embedding's own int8 table (QuantizedEmbedding.head)
            if isinstance(m, nn.Embedding) and m.max_norm is None:
                linears.setdefault(id(m.weight), (f"{path}.head", "weight"))
        quantize_model(model)
    return {name: linears.get(id(p)) for name, p in params.items()}


def _writers(model: nn.Module, where: dict) -> dict:
    """For each parameter name of `where` (_int8_owners), a function write(t, row) putting tensor t into the rows
    row .. row + len(t) of it once the model is materialised: into the parameter, or into its QuantizedLinear (a
    weight quantized per channel: each row on its own, so rows written apart equal the whole quantized at once)."""
    def write(name):
        def to_param(t, row):
            model.get_parameter(name)[row:row + t.shape[0]].copy_(t)

        def to_int8(t, row):
            path, attr = where[name]
            layer, rows = model.get_submodule(path), slice(row, row + t.shape[0])
            if attr == "bias":
                layer.bias[rows].copy_(t)
            else:
                q, scale = quantize_per_channel(t.to(layer.scale.dtype))
                layer.weight[rows].copy_(q)
                layer.scale[rows].copy_(scale)
        return to_int8 if where[name] else to_param
    return {name: write(name) for name in where}


def _mapped(model: nn.Module, arch: Architecture, given: dict, tensors: "Tensors", where: dict, device) -> dict:
    """{our parameter name: a view of the checkpoint file's mapping} for every parameter of the model (on the meta
    device) that can keep its weights there: on the CPU, from file tensors stored in the parameter's dtype, not
    transposed or offset, not quantized, and, for a parameter fused from parts (q|k|v, gate|up), only where the parts
    follow each other in the file in its order (gate|up in Hugging Face's files, whose tensors are in name order;
    SafetensorsFiles.mapped)."""
    if not isinstance(tensors, SafetensorsFiles) or torch.device(device).type != "cpu":
        return {}
    views = {}
    for ours, source in arch.plan.items():
        if not source.transpose and not source.offset and where[ours] is None:
            view = tensors.mapped([given[n] for n in source.names], model.get_parameter(ours).dtype)
            if view is not None:
                views[ours] = view
    return views


@contextlib.contextmanager
def _naming(where: str):
    """Prefixes the ValueErrors raised inside with `where` (the file they concern)."""
    try:
        yield
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


class Tensors(Mapping):
    """A checkpoint's tensors by name, each read when asked for, with its shape, dtype and origin known without
    reading it. `source` names the whole checkpoint in messages."""
    source: str

    @abc.abstractmethod
    def shape(self, name: str) -> list[int]:
        """The tensor's shape, without reading it."""

    @abc.abstractmethod
    def dtype(self, name: str) -> str:
        """The tensor's dtype (for messages), without reading it."""

    @abc.abstractmethod
    def floating(self, name: str) -> bool:
        """Whether the tensor is floating-point, without reading it."""

    def where(self, name: str) -> str:
        """The file holding tensor `name` (for messages)."""
        return self.source

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start .. stop of tensor `name` (of a 1-D tensor, its elements)."""
        return self[name][start:stop]


class InMemory(Tensors):
    """Tensors already in memory: a transformers model's state_dict()."""
    source = "state_dict"

    def __init__(self, tensors: Mapping):
        self._tensors = tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def shape(self, name: str) -> list[int]:
        return list(self._tensors[name].shape)

    def dtype(self, name: str) -> str:
        return str(self._tensors[name].dtype).removeprefix("torch.")

    def floating(self, name: str) -> bool:
        return self._tensors[name].is_floating_point()


class SafetensorsFiles(Tensors):
    """The tensors of safetensors files by name, each read from its file when asked for (opened by the caller's
    ExitStack); shapes and dtypes come from the headers. With an index's weight_map, every tensor must be in the file
    the map lists it in; a tensor in two files is refused."""

    def __init__(self, files: list[Path], stack: contextlib.ExitStack, index: Path | None = None,
                 weight_map: dict | None = None, mmap: bool = True):
        self.source = str(index or files[0])
        self._file, self._handle, self._maps, self._offsets, self._mmap = {}, {}, {}, {}, mmap
        for f in files:
            handle = _open_safetensors(f, stack)
            for name in handle.keys():
                if name in self._file:
                    raise ValueError(f"{f}: tensor {name!r} is also in {self._file[name]} (duplicated)")
                listed = name if weight_map is None else weight_map.get(name)
                if weight_map is not None and listed != f.name:
                    raise ValueError(f"{f}: tensor {name!r} is " + (f"listed in {index.name} under {listed}" if listed
                                                                    else f"not in the weight_map of {index.name}"))
                self._file[name], self._handle[name] = f, handle
        if weight_map is not None and (absent := weight_map.keys() - self._file.keys()):
            raise ValueError(f"{index}: weight_map lists tensors that are not in their files: {_list(absent)}")

    def __getitem__(self, name: str) -> torch.Tensor:
        """Tensor `name` read from its file into memory of its own. A floating-point tensor is read with plain file
        reads, not through a mapping, so that one that is converted, fused or quantized (and then dropped) leaves no
        file pages in the process's resident memory: a mapping would keep every page read until the file is closed
        (an int8 load of a float32 Llama of 124.7M parameters peaked 594 MiB above its start that way, 296 with
        whole tensors read; with blocks of rows, `rows`, and the model built without meta arithmetic, 112)."""
        from safetensors import SafetensorError
        if _TORCH_DTYPES.get(self.dtype(name)) is None:  # other dtypes (refused later, or skipped) as safetensors reads
            try:
                return self._handle[name].get_tensor(name)
            except SafetensorError as e:
                raise ValueError(f"{self._file[name]}: {name}: unreadable ({e})") from e
        return self._read(name, 0, self.shape(name))

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start .. stop of tensor `name` read from its file into memory of their own, as __getitem__ reads."""
        shape = self.shape(name)
        if _TORCH_DTYPES.get(self.dtype(name)) is None:
            return super().rows(name, start, stop)
        return self._read(name, start * math.prod(shape[1:]), [stop - start, *shape[1:]])

    def _read(self, name: str, first: int, shape: list[int]) -> torch.Tensor:
        """A tensor of `shape` read from tensor `name`'s data from its element `first`."""
        path, dtype = self._file[name], _TORCH_DTYPES[self.dtype(name)]
        data = torch.empty(math.prod(shape) * dtype.itemsize, dtype=torch.uint8)
        with open(path, "rb") as f:
            f.seek(self._offset(name) + first * dtype.itemsize)
            if f.readinto(data.numpy()) != data.numel():
                raise ValueError(f"{path}: {name}: unreadable (the file ends inside its data)")
        return data.view(dtype).reshape(shape)

    def __iter__(self):
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def shape(self, name: str) -> list[int]:
        return list(self._handle[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._handle[name].get_slice(name).get_dtype()

    def floating(self, name: str) -> bool:
        return self.dtype(name).startswith(("F", "BF"))  # F64, F32, F16, BF16, F8_*; not I*, U*, BOOL

    def where(self, name: str) -> str:
        return str(self._file[name])

    def _offset(self, name: str) -> int:
        """The byte offset of tensor `name`'s data in its file (each file's header parsed once)."""
        path = self._file[name]
        if path not in self._offsets:
            self._offsets[path] = _data_offsets(path)
        return self._offsets[path][name]

    def mapped(self, names: list[str], dtype: torch.dtype) -> torch.Tensor | None:
        """Tensors `names` concatenated by rows, as a view of a private (copy-on-write) mapping of their file, or None
        unless mapping is on, every one is stored in `dtype`, they follow each other in one file in this order (the
        rows of each the same length; one tensor always does) and the first starts at a multiple of the element
        size. The view's pages are the file's page cache, read on first touch; a write copies the page it lands on,
        never the file."""
        if not self._mmap or any(self.dtype(n) != _SAFETENSORS_DTYPES.get(dtype) for n in names):
            return None
        path = self._file[names[0]]
        if path not in self._maps:
            self._maps[path] = _map_file(path)
        shapes = [self.shape(n) for n in names]
        start = end = self._offset(names[0])
        for name, shape in zip(names, shapes):
            if self._file[name] != path or self._offset(name) != end or shape[1:] != shapes[0][1:]:
                return None
            end += math.prod(shape) * dtype.itemsize
        if start % dtype.itemsize:
            return None
        rows = [sum(shape[0] for shape in shapes)] + shapes[0][1:]
        return torch.empty(0, dtype=dtype).set_(self._maps[path], start // dtype.itemsize, rows)


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}


def _map_file(path: Path) -> torch.UntypedStorage:
    """A private mapping of a safetensors file (whose header safe_open has checked)."""
    return torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)


def _data_offsets(path: Path) -> dict[str, int]:
    """Each tensor's byte offset in a safetensors file (whose header safe_open has checked): the file is an 8-byte
    little-endian header length, the JSON header, then the data, where each tensor's data_offsets start."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    return {name: 8 + length + info["data_offsets"][0] for name, info in header.items() if name != "__metadata__"}


def _open_safetensors(path: Path, stack: contextlib.ExitStack):
    """A safe_open handle of `path` on the caller's stack; ValueError naming the file when its header is unreadable
    (corrupt or truncated: safetensors checks that the header covers the whole file)."""
    from safetensors import SafetensorError, safe_open
    try:
        return stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from e


def _normalized(tensors: Tensors, prefix: str) -> dict[str, str]:
    """Normalized name (hf.normalized_name) -> the name as given; ValueError naming both tensors when two names
    normalize to one (model.norm.weight and norm.weight)."""
    given = {}
    for name in tensors:
        n = normalized_name(name, prefix)
        if n in given:
            raise ValueError(f"{tensors.where(name)}: tensors {given[n]!r} and {name!r} are both {n!r} (duplicated)")
        given[n] = name
    return given


def _check_names(arch: Architecture, given: dict, tensors: Tensors) -> None:
    """ValueError naming the tensors the plan needs and the checkpoint lacks, or that it holds and the plan does not
    use (nor ignore)."""
    needed = {n for source in arch.plan.values() for n in source.names} | arch.zeros.keys()
    if missing := needed - given.keys():
        raise ValueError(f"{tensors.source}: missing tensors {_list(missing)}")
    known = needed | arch.copies.keys()
    unexpected = {n for n in given.keys() - known if not any(re.fullmatch(p, n) for p in arch.ignored)}
    if unexpected:
        raise ValueError(f"{tensors.source}: unexpected tensors {_list(unexpected)}")


def _check_sizes(arch: Architecture, tensors: Tensors, config_name: str) -> None:
    """ValueError naming a config size larger than the largest tensor's number of elements: no tensor can have that
    dimension, and the model is not even built on the meta device (whose sizes could overflow)."""
    largest = max(tensors, key=lambda n: math.prod(tensors.shape(n)))
    most = math.prod(tensors.shape(largest))
    for field, value in arch.sizes.items():
        if value > most:
            raise ValueError(f"{config_name}: {field}: {value} is larger than any tensor of the checkpoint (the largest, "
                             f"{largest} in {tensors.where(largest)}, has {most} elements)")


def _parts(source: Source, shape) -> list[list[int]]:
    """The shape each tensor of `source` must have for our parameter of `shape`."""
    if source.rows is None:
        return [list(shape)[::-1] if source.transpose else list(shape)]
    return [[rows, *shape[1:]] for rows in source.rows]


def _fields(sizes: dict, needed: list[int], got: list[int]) -> str:
    """The config fields whose value is a size `needed` has where `got` differs, as ' (field = value)'."""
    named = [f"{f} = {v}" for f, v in sizes.items() if any(n == v != g for n, g in zip(needed, got))]
    return f" ({', '.join(named)})" if named else ""


def _check_tensors(arch: Architecture, given: dict, tensors: Tensors, shapes: dict) -> None:
    """ValueError naming the first tensor that is not floating-point or whose header shape does not fit the config
    (each part of a fused parameter on its own), a tied copy that differs from the embedding (Architecture.copies),
    and a tensor that must hold zeros and does not (Architecture.zeros)."""
    for ours, source in arch.plan.items():
        for name, needed in zip(source.names, _parts(source, shapes[ours])):
            n, where = given[name], tensors.where(given[name])
            if not tensors.floating(n):
                raise ValueError(f"{where}: {n}: dtype {tensors.dtype(n)} is not a floating-point type (weights are "
                                 "never cast from integers or booleans)")
            if (got := tensors.shape(n)) != needed:
                raise ValueError(f"{where}: {n}: shape {got} does not fit {ours} of the config, which needs "
                                 f"{needed}{_fields(arch.sizes, needed, got)}")
    for copy, original in arch.copies.items():
        copy, original = given.get(copy), given[original]
        if copy is not None and not (tensors.shape(copy) == tensors.shape(original)
                                     and torch.equal(tensors[copy], tensors[original])):
            hint = " (set it to false to use this head)" if copy.endswith("lm_head.weight") else ""
            raise ValueError(f"{tensors.where(copy)}: {copy}: differs from the embedding {original} while "
                             f"tie_word_embeddings is true{hint}")
    for name, needed in ((given[n], shape) for n, shape in arch.zeros.items()):
        if not tensors.floating(name) or tensors.shape(name) != needed or torch.count_nonzero(tensors[name]):
            raise ValueError(f"{tensors.where(name)}: {name}: expected zeros of shape {needed} (pytransformer adds no "
                             f"such tensor), got {tensors.dtype(name)} {tensors.shape(name)} with other values")


def convert(cls, config_class, d, tensors: Mapping, *, dtype: torch.dtype, device, quantize: bool = False,
            config_name: str = "config") -> nn.Module:
    """A `cls` model (its config a `config_class`) in `dtype` on `device` from a Hugging Face config dict (read from
    `config_name`, for messages) and a mapping of Hugging Face tensor names to tensors (a Tensors reads them on
    access); quantize=True: its linear layers int8. Everything is checked before the model is allocated."""
    tensors = tensors if isinstance(tensors, Tensors) else InMemory(tensors)
    with _naming(config_name):
        prefix = backbone_prefix(d, config_class, cls.__name__)
    given = _normalized(tensors, prefix)
    with _naming(config_name):
        arch = architecture(d, given.keys())
    _check_names(arch, given, tensors)
    _check_sizes(arch, tensors, config_name)
    with _naming(config_name), torch.device("meta"), _SkipInit():
        model = cls(arch.config).to(dtype)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert shapes.keys() == arch.plan.keys(), "hf.py: the plan must cover the model's parameters"
    _check_tensors(arch, given, tensors, shapes)
    where = _int8_owners(model, quantize)
    writers, mapped = _writers(model, where), _mapped(model, arch, given, tensors, where, device)
    _materialize(model, device, mapped)
    with torch.no_grad():
        for ours, source in arch.plan.items():
            if ours in mapped:
                continue
            if source.transpose:
                writers[ours](tensors[given[source.names[0]]].t(), 0)
                continue
            if source.offset:
                writers[ours](tensors[given[source.names[0]]].float() + source.offset, 0)
                continue
            row = 0
            for name in source.names:  # each part in blocks of rows: no float copy of a whole weight
                rows = tensors.shape(given[name])[0]
                for start in range(0, rows, _BLOCK_ROWS):
                    writers[ours](tensors.rows(given[name], start, min(rows, start + _BLOCK_ROWS)), row + start)
                row += rows
    return model


def from_hf(cls, config_class, model) -> nn.Module:
    """`cls` with the config and weights of a transformers model object, on its device, in its dtype and mode."""
    w = next(model.parameters())
    ours = convert(cls, config_class, model.config.to_dict(), model.state_dict(), dtype=w.dtype, device=w.device)
    return ours.train(model.training)


def read_json(path: Path):
    """The parsed JSON of a file; ValueError naming the file when it is not valid JSON (or not UTF-8)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _weight_map(index: Path) -> dict[str, str]:
    """The weight_map of a sharded checkpoint's index (tensor name -> file name in the same directory)."""
    d = read_json(index)
    weight_map = d.get("weight_map") if isinstance(d, dict) else None
    if not (isinstance(weight_map, dict) and weight_map and all(
            isinstance(v, str) and Path(v).name == v and v not in ("", ".", "..") for v in weight_map.values())):
        raise ValueError(f"{index}: weight_map: expected a JSON object of tensor names -> file names in the directory, "
                         f"got {str(weight_map)[:80]}")
    return weight_map


class Folder(NamedTuple):
    """What a save_pretrained directory holds: config.json's path and dict, the safetensors files, and for a
    sharded checkpoint its index and weight_map (else None)."""
    config_path: Path
    config: dict
    files: list[Path]
    index: Path | None
    weight_map: dict | None


def checkpoint_files(path) -> Folder:
    """The files of a save_pretrained directory; FileNotFoundError naming what is missing, ValueError naming a file
    that is not valid JSON or an index without a usable weight_map."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"path: {path} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: no such file (a save_pretrained directory has config.json)")
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return Folder(config, read_json(config), [single], None, None)
    if not index.is_file():
        raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json (only safetensors "
                                "checkpoints are read)")
    weight_map = _weight_map(index)
    files = [path / f for f in sorted(set(weight_map.values()))]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file (listed in {index.name})")
    return Folder(config, read_json(config), files, index, weight_map)


def from_pretrained(cls, config_class, path, *, dtype: torch.dtype = torch.float32, device=None,
                    quantize: bool = False, mmap: bool = True) -> nn.Module:
    """`cls` from a save_pretrained directory, in `dtype` on `device` (default CPU), in eval mode; quantize=True:
    the weight-only int8 model (pytransformer.quantize), quantized tensor by tensor as the weights are read; mmap:
    parameters that can stay in a private mapping of their file do (see the module's docstring)."""
    folder = checkpoint_files(path)
    with contextlib.ExitStack() as stack:
        tensors = SafetensorsFiles(folder.files, stack, folder.index, folder.weight_map, mmap=mmap)
        model = convert(cls, config_class, folder.config, tensors, dtype=dtype, quantize=quantize,
                        device=torch.device("cpu") if device is None else device, config_name=str(folder.config_path))
    return model.eval()
