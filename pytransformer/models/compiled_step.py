"""compiled_step: a model's cached decoding step compiled ahead of time by AOTInductor, in a child process.

The step, model(tok, cache=cache)[:, -1], is exported (torch.export, non-strict) with the cache's capacity as its only
dynamic size, so one package serves every prompt length and max_new_tokens; AOTInductor compiles it into a shared
library without the weights (on the CPU a C++ wrapper around the kernels: no Python runs between them). A step then
calls the library through PyTorch's C++ loader, with the model's own parameters and buffers as its constants (the same
tensors, not copies: in-place updates are seen). There are no per-call guard checks or argument gathering, which
torch.compile's Dynamo front end spends on every call (about 0.6 ms a token for a 12-layer model with 2 CPU threads).

The export and the compile run in a child process (`python -m pytransformer.models.compiled_step`), handed a copy of
the model on the meta device (its modules, attributes, shapes and dtypes; no weights). So the process that generates
never imports Dynamo or Inductor, whose modules and compile-time memory come to some 110 MiB, more than a 12-layer
model's activations and cache: it holds the library, a few MiB. Packages are kept in a directory
(PYTRANSFORMER_CACHE, default ~/.cache/pytransformer) under a hash of what they were compiled from: the meta model,
the token and cache layouts, torch's version and CPU capability, and this package's files. A later process with a model
of the same structure and batch size loads its package in a fraction of a second instead of compiling (tens of
seconds; Inductor needs a C++ compiler on the CPU).

Each compiled_step call (once per generation, about 1 ms) picks the model's package for its train mode, the shapes,
dtypes and devices of the token and cache tensors apart from the capacity, and the capacity's range, and loads the
model's current tensors into it as its constants. A model's attention windows split the capacities: a rolling cache
(capacity == window) branches differently, so the range runs between the windows (and 2, as sizes 0 and 1 are
specialised), and a capacity that is a window, or below 2, gets a package of that capacity alone. The capacity is the
largest layer's: a windowed layer's rolling buffer beside larger layers (Gemma 3) keeps its size in the package.
Python attributes that the forward reads, such as a config's fields, are compiled as constants: change them and build
a new model.
Every batch size has its own package.

On CUDA the step is not compiled but captured in a CUDA graph (_graphed_step): the same step over the same cache
tensors, replayed with one launch a token instead of one a kernel. (The AOTInductor package of a CUDA step crashes
PyTorch 2.11's loader while the library's constructor parses its device string: docs/gpu.md.)
"""
import copy
import functools
import hashlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn

from ..nn import KVCache, MultiHeadAttention

_CAPACITY = 2  # the dynamic dimension of the [B, Hkv, capacity, D] cache tensors
_FIRST_KV = 2  # the index of the first cache tensor in the step's inputs (_inputs)


def decode_step(model: nn.Module, tok: Tensor, cache: KVCache) -> Tensor:
    """The last-position logits [B, vocab] of the next tokens tok [B, 1] of every row, appended to the cache."""
    return model(tok, cache=cache)[:, -1]


class _Step(nn.Module):
    """decode_step over the cache tensors as arguments: step(tok, lengths, *k, *v) -> logits [B, vocab]."""

    def __init__(self, model: nn.Module, n_layers: int):
        super().__init__()
        self.model, self.n_layers = model, n_layers

    def forward(self, tok: Tensor, lengths: Tensor, *kv: Tensor) -> Tensor:
        return decode_step(self.model, tok, KVCache.over(kv[:self.n_layers], kv[self.n_layers:], lengths))


class _Package(NamedTuple):
    key: str  # the hash of what it was compiled from, its file's name (_spec)
    capacities: tuple[int, int]  # the capacity range it serves, inclusive
    loader: object  # torch._C._aoti.AOTIModelPackageLoader


# model -> {its train mode, _layout and capacity range: the package loaded for them}; a loader holds the model's tensors
# as constants, so it goes with the model.
_PACKAGES = weakref.WeakKeyDictionary()


def _inputs(tok: Tensor, cache: KVCache) -> list:
    return [tok, cache.lengths, *cache.k, *cache.v]


def _capacity(inputs: list) -> int:
    """The cache's capacity: the rows of its largest layer."""
    return max(t.shape[_CAPACITY] for t in inputs[_FIRST_KV:])


def _dynamic(inputs: list) -> list[bool]:
    """Which inputs have the dynamic capacity: the cache tensors of the most rows (a windowed layer's rolling buffer
    beside layers of more rows keeps its `window` rows)."""
    top = _capacity(inputs)
    return [i >= _FIRST_KV and t.shape[_CAPACITY] == top for i, t in enumerate(inputs)]


def _layout(inputs: list) -> list:
    """Each input's shape (the dynamic capacity left out), dtype and device (the package is compiled for contiguous
    inputs, which compiled_step checks)."""
    def shape(t, dynamic):
        return [*t.shape[:_CAPACITY], *t.shape[_CAPACITY + 1:]] if dynamic else list(t.shape)
    return [[shape(t, d), str(t.dtype), str(t.device)] for t, d in zip(inputs, _dynamic(inputs))]


def _capacities(model: nn.Module, capacity: int) -> tuple[int, int]:
    """The range of capacities around `capacity` that one package serves: between the attention windows (a capacity
    equal to one is a rolling cache), from 2 (sizes 0 and 1 are specialised); a window or a size below 2 alone."""
    windows = {m.window for m in model.modules() if isinstance(m, MultiHeadAttention) and m.window is not None}
    if capacity < 2 or capacity in windows:
        return capacity, capacity
    return max([2] + [w + 1 for w in windows if w < capacity]), min([sys.maxsize] + [w - 1 for w in windows
                                                                                   if w > capacity])


def _meta_copy(model: nn.Module) -> nn.Module:
    """The model with every parameter and buffer on the meta device (shapes and dtypes kept), nothing copied."""
    memo = {}
    for t in _tensors(model).values():
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every parameter and buffer under each of its names (a tied or shared one under all), as the step names them."""
    named = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
    return {f"model.{name}": t for name, t in named}


@functools.cache
def _code_stamp() -> str:
    """This package's files (path, size, modification time) and torch's version and CPU capability, hashed."""
    root = Path(__file__).resolve().parents[1]
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".so", ".pyd"))
    stamp = [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    stamp += [torch.__version__, torch.backends.cpu.get_cpu_capability()]
    return hashlib.sha256(repr(stamp).encode()).hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("PYTRANSFORMER_CACHE", Path.home() / ".cache" / "pytransformer")) / "compiled"


def _spec(model: nn.Module, inputs: list, capacities: tuple[int, int]) -> tuple[str, bytes]:
    """The key of a package (the meta model as a step, the inputs' layout apart from the capacity, the capacity range
    and _code_stamp, hashed) and the child's input (the step and the inputs' shapes and dtypes)."""
    step = io.BytesIO()
    torch.save(_Step(_meta_copy(model), (len(inputs) - _FIRST_KV) // 2), step)
    described = json.dumps([_layout(inputs), capacities, _code_stamp()]).encode()
    key = hashlib.sha256(step.getvalue() + described).hexdigest()[:32]
    spec = io.BytesIO()
    torch.save({"step": step.getvalue(), "inputs": [(list(t.shape), t.dtype) for t in inputs],
                "capacities": capacities, "device": str(inputs[0].device)}, spec)
    return key, spec.getvalue()


def _options(device: torch.device) -> dict:
    """AOTInductor's options: the weights left out of the library (the model's own tensors are its constants), and no
    size_asserts, a check of every input's and op output's sizes and strides against the traced ones, which formats its
    error message's strings before checking (some 50 us a step of a 12-layer model on the CPU). The inputs are checked
    once per generate call instead (_layout, _capacities), and the ops' outputs match their fake kernels (opcheck)."""
    return {"aot_inductor.package_constants_in_so": False, "size_asserts": False}


def _compile(spec_path: str, package_path: str) -> None:
    """The child process: export the step of the meta model (made real but uninitialised) and compile it."""
    spec = torch.load(spec_path, weights_only=False)
    device = torch.device(spec["device"])
    step = torch.load(io.BytesIO(spec["step"]), weights_only=False).to_empty(device=device)
    inputs = tuple(torch.zeros(shape, dtype=dtype, device=device) if i < _FIRST_KV else
                   torch.empty(shape, dtype=dtype, device=device) for i, (shape, dtype) in enumerate(spec["inputs"]))
    low, high = spec["capacities"]
    capacity = None if low == high else torch.export.Dim("capacity", min=low, max=None if high == sys.maxsize else high)
    dims = tuple({_CAPACITY: capacity} if dynamic and capacity else None for dynamic in _dynamic(inputs)[_FIRST_KV:])
    with torch.no_grad():
        program = torch.export.export(step, inputs, dynamic_shapes=(None, None, dims), strict=False)
    torch._inductor.aoti_compile_and_package(program, package_path=package_path, inductor_configs=_options(device))


def _build(key: str, spec: bytes) -> Path:
    """The package of `key`, compiled by a child process unless the cache directory has it."""
    path = _cache_dir() / f"{key}.pt2"
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK):
            raise PermissionError("not writable")
    except OSError as e:
        raise RuntimeError(f"compiled_step: cannot write compiled steps to {path.parent} ({e}); set "
                           "PYTRANSFORMER_CACHE to a writable directory") from e
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        spec_path, package = Path(tmp) / "spec.pt", Path(tmp) / "step.pt2"
        spec_path.write_bytes(spec)
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        done = subprocess.run([sys.executable, "-m", __name__, str(spec_path), str(package)], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiled_step: compiling the decoding step failed:\n{done.stderr[-4000:]}")
        os.replace(package, path)  # atomic: another process sees the whole package or none
    return path


def _load(path: Path, device: torch.device):
    index = -1 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)


def _package(model: nn.Module, inputs: list) -> tuple[_Package, list]:
    """The model's package for these inputs, its constants set to the model's tensors (returned: the package refers
    to them without holding them). The meta copy and its hash are made only for a train mode, layout and capacity
    range this model has no package for yet (tens of ms for a 12-layer model)."""
    capacities = _capacities(model, _capacity(inputs))
    packages = _PACKAGES.setdefault(model, {})
    where = json.dumps([model.training, _layout(inputs), capacities])
    if where not in packages:
        key, spec = _spec(model, inputs, capacities)
        packages[where] = _Package(key, capacities, _load(_build(key, spec), inputs[0].device))
    tensors, loader = _tensors(model), packages[where].loader
    constants = {name: tensors[name] for name in loader.get_constant_fqns()}
    loader.load_constants(constants, False, True, True)  # not the inactive buffer, all of them, user-managed
    return packages[where], list(constants.values())


def _capture(run: nn.Module, first: list, inputs: list) -> tuple[Tensor, Callable[[], None], Tensor]:
    """run(*first) on a side stream, this token's step and the warm-up that a capture needs on its stream (kernels
    loaded, cuBLAS's workspace for that stream made), then run(*inputs) captured in a CUDA graph on that stream
    (nothing runs): the first step's logits, the graph's replay, and its output tensor, which every replay
    overwrites."""
    with torch.cuda.device(first[0].device):  # the model's GPU, whichever is current
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            logits = run(*first)
        torch.cuda.current_stream().wait_stream(stream)
        logits.record_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = run(*inputs)
    return logits, graph.replay, out


def _graphed_step(model: nn.Module, cache: KVCache, capture=_capture) -> Callable[[Tensor], Tensor]:
    """The CUDA step: its first call runs the step and captures it (_capture), and every later call replays the
    graph with its tokens copied into the captured input. The captured step reads the lengths on the device
    (KVCache.over), as a compiled one does, and the kernels check them there (a capture allows no host read-back)."""
    run, inputs, replay, out = _Step(model, len(cache.k)), [], None, None

    def step(tok: Tensor) -> Tensor:
        nonlocal replay, out
        if replay is not None:
            inputs[0].copy_(tok)
            replay()
            return out.clone()  # the next replay overwrites `out`
        inputs.extend(_inputs(tok.clone(), cache))
        logits, replay, out = capture(run, _inputs(tok, cache), inputs)
        return logits
    return step


def compiled_step(model: nn.Module, cache: KVCache) -> Callable[[Tensor], Tensor]:
    """decode_step(model, tok, cache) as one compiled library (see the module's docstring): the returned step(tok)
    loads or compiles the package for this model structure, batch and capacity on its first call (tens of seconds
    when compiled; Inductor needs a C++ compiler on the CPU), and from then on runs it directly with the same cache
    tensors and tokens of tok's shape. On CUDA it captures the step in a CUDA graph instead (_graphed_step). The
    cache's host-side length bound is dropped, as the compiled kernels read the lengths (KVCache). A cache with
    cross-attention entries is a ValueError: its tensors would be constants."""
    if cache.cross_k is not None:
        raise ValueError("cache: compiled_step takes a self-attention cache (no cross-attention entries)")
    if not all(t.is_contiguous() for t in _inputs(cache.lengths, cache)):
        raise ValueError("cache: compiled_step takes contiguous cache tensors (as KVCache makes them)")
    cache.max_length = None
    if cache.lengths.is_cuda:
        return _graphed_step(model, cache)
    inputs, run, constants = [], None, []

    def step(tok: Tensor) -> Tensor:
        nonlocal run
        if run is None:
            inputs.extend(_inputs(tok, cache))
            package, held = _package(model, inputs)
            constants.extend(held)  # alive while the step is, should the model's attributes be replaced
            run = package.loader.run
        inputs[0] = tok.contiguous()
        return run(inputs)[0]
    return step


if __name__ == "__main__":
    _compile(sys.argv[1], sys.argv[2])
