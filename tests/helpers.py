"""Helpers shared by the test files: tolerances, runs under a capped CPU ISA level, compiled-training checks."""
import contextlib
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pytransformer as pt


def tolerance(dtype):
    """(atol, rtol) for comparing a result in `dtype` with a float64 reference."""
    return {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
            torch.bfloat16: (2e-2, 2e-2)}[dtype]


CPU_ISA_LEVELS = ["default", "avx2"]  # the levels below the best one, which the other tests run
# With AVX-512 capped as well, on a processor that has it: an ATEN_CPU_CAPABILITY cap turns its extensions off (BF16
# and VNNI dot products, AMX; csrc/cpu/isa.h), so the capped AVX-512 code is what an AVX-512 processor without them
# runs.
CAPPED_ISA_LEVELS = CPU_ISA_LEVELS + (["avx512"] if pt._C.cpu_isa() == "avx512" else [])


def run_under_isa(isa: str, code: str) -> None:
    """Run `code` (after `import torch, pytransformer as pt` and `from pytransformer.ops import reference as ref`) in
    a fresh interpreter whose CPU kernels are capped at ISA level `isa`; fail with its stderr if it raises."""
    prelude = "import torch, pytransformer as pt; from pytransformer.ops import reference as ref\n"
    out = subprocess.run([sys.executable, "-c", prelude + code + "\nprint(pt._C.cpu_isa())"], capture_output=True,
                         text=True, env=dict(os.environ, ATEN_CPU_CAPABILITY=isa))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in (isa, "default")


def assert_compiled_training_step_matches(model, loss_fn, *args) -> None:
    """torch.compile(loss_fn, fullgraph=True) (Inductor) gives eager's loss and parameter gradients."""
    params = list(model.parameters())
    eager = loss_fn(*args)
    grads = torch.autograd.grad(eager, params)
    loss = torch.compile(loss_fn, fullgraph=True)(*args)
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)
    for g, p in zip(grads, torch.autograd.grad(loss, params)):
        torch.testing.assert_close(p, g, atol=1e-4, rtol=1e-4)


def skip_unsupported(dtype, device):
    """float64 runs on the CPU only."""
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")


def randn(*shape, dtype=torch.float32, device="cpu"):
    """Standard normal values drawn in float64, then rounded to dtype."""
    return torch.randn(shape, dtype=torch.float64).to(device, dtype)


def caches(b, hkv, cap, d, dv, dtype, device):
    """Random K and V caches [B, Hkv, capacity, D | Dv]."""
    return randn(b, hkv, cap, d, dtype=dtype, device=device), randn(b, hkv, cap, dv, dtype=dtype, device=device)


def varied(model):
    """model with its weight matrices redrawn (std 0.5) so that its greedy tokens vary from step to step: a tiny model
    at its config's initialisation repeats one token, which would hide a step fed a stale token or cache row."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.5)
    return model


# A test's `cuda` mark, and its skip without a GPU and a CUDA build.
CUDA_MARKS = [pytest.mark.cuda, pytest.mark.skipif(not (torch.cuda.is_available() and pt.with_cuda()),
                                                   reason="needs a GPU and a CUDA build")]


def cuda_only(test):
    """Marks a test `cuda` and skips it without a GPU and a CUDA build."""
    for mark in CUDA_MARKS:
        test = mark(test)
    return test


class _NoHostTraffic(TorchDispatchMode):
    """What a CUDA graph capture refuses on a GPU raises RuntimeError: a tensor made from host data (torch.tensor /
    torch.as_tensor of Python values: a host-to-device copy) and a tensor's values read on the host (.item(), bool(),
    int(); and nonzero, masked_select or a boolean index, whose output size is read back: device-to-host copies)."""
    _READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.lift_fresh.default:
            raise RuntimeError("a tensor made from host data inside a CUDA graph capture: on a GPU a host-to-device "
                               "copy, which a capture refuses")
        bool_index = func is torch.ops.aten.index.Tensor and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        if func in self._READS or bool_index:
            raise RuntimeError(f"{func} inside a CUDA graph capture: on a GPU it reads device values back to the "
                               "host, which a capture refuses")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def emulated_capturing(emu):
    """A CUDA graph capture as the host emulator plays it (`emu`, its op namespace): the emulated glue sees a capturing
    stream, so its kernels check the lengths themselves, and what a capture refuses on a GPU raises RuntimeError: a
    tensor made from host data, or a tensor's values read on the host (_NoHostTraffic)."""
    emu.set_capturing(True)
    try:
        with _NoHostTraffic():
            yield
    finally:
        emu.set_capturing(False)


def captured_in_cuda_graph(fn):
    """fn() captured in a CUDA graph (after a warm-up run on a side stream); returns (graph, fn's result)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


WHERE = ["eager", "meta"]  # bad inputs on real tensors (the C++ glue) and on meta tensors (the fake kernels)


def factory_device(where: str):
    """A context in which tensor factories (torch.randn, torch.ones, ...) make CPU tensors ("eager") or meta
    tensors ("meta": the op runs its fake kernel)."""
    return torch.device("cpu" if where == "eager" else "meta")


def to_meta(args) -> tuple:
    """args with every tensor moved to the meta device (where an op runs its fake kernel)."""
    return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)


def compiled(fn):
    """fn under torch.compile(fullgraph=True) with the aot_eager backend: traced through the fake kernels."""
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


# What a fake kernel's error becomes while torch.compile traces (the eager op would raise a ValueError only later,
# when the compiled graph runs).
TRACING_ERROR = torch._dynamo.exc.TorchRuntimeError

