"""Shared test fixtures: devices to run on (CUDA ones are marked `cuda` and skipped without a GPU), and the target of
the CUDA kernel cases (pytransformer/check.py): the GPU, or the host emulator with --cuda-emulator."""
import json
import os
import tempfile
import types

import pytest
import torch

import pytransformer  # noqa: F401  registers the ops

# Compiled decoding steps (models/compiled_step.py) are compiled afresh, into a directory of this run's own.
os.environ.setdefault("PYTRANSFORMER_CACHE", tempfile.mkdtemp(prefix="pytransformer-tests-"))
from pytransformer.check import KernelChecks
from tests.helpers import CUDA_MARKS, emulated_capturing


def pytest_addoption(parser):
    parser.addoption("--cuda-emulator", action="store_true",
                     help="run the CUDA kernel cases on the CPU through tools/cuda_emulator (no GPU needed)")
    parser.addoption("--cuda-full", action="store_true", help="the full shape lists of the CUDA kernel cases")
    parser.addoption("--cuda-reached", help="where an emulated run writes the kernels each test launched (default: "
                     "build/cuda_emulator/reached.json; separate files let runs go side by side)")

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA_MARKS)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed():
    """Fresh random inputs per test, reproducible from the printed seed."""
    seed = torch.seed() % 2**31
    torch.manual_seed(seed)
    yield seed


@pytest.fixture(scope="session")
def kernel_target(request):
    """Where the CUDA kernel cases run: torch.ops.pytransformer on a GPU with a CUDA build, else, with
    --cuda-emulator, the same CUDA sources built for the CPU by the host emulator; skipped otherwise."""
    full = request.config.getoption("--cuda-full")
    if torch.cuda.is_available() and pytransformer.with_cuda():
        return KernelTarget(torch.ops.pytransformer, "cuda", emulated=False, full=full)
    if request.config.getoption("--cuda-emulator"):
        from tools.cuda_emulator import build
        _reached["ops"] = build.load()
        return KernelTarget(_reached["ops"], "cpu", emulated=True, full=full)
    pytest.skip("needs a GPU and a CUDA build, or --cuda-emulator")


# The emulated kernels each test launched (mangled name -> test ids), written at the end of the session for
# tools/cuda_emulator/coverage.py (its map of the kernel instantiations against the cases that reach them).
_reached: dict = {"ops": None, "tests": {}}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    if _reached["ops"] is not None:
        for name in set(_reached["ops"].reached_kernels()):
            _reached["tests"].setdefault(name, []).append(item.nodeid)


def pytest_sessionfinish(session):
    if _reached["tests"]:
        from tools.cuda_emulator import coverage
        path = session.config.getoption("--cuda-reached") or coverage.REACHED
        with open(path, "w") as f:
            json.dump(_reached["tests"], f, indent=0)


@pytest.fixture(scope="session")
def ptx(kernel_target):
    """The probe ops of tools/ptx_probes.cu (torch.ops.pytransformer_probes) as functions of CPU tensors, run on the
    kernel target: on a GPU built now (torch.utils.cpp_extension, with the extension's nvcc flags), through the
    emulator its build's."""
    if not kernel_target.emulated:
        from torch.utils.cpp_extension import load

        from tools import build_config
        load(name="pytransformer_ptx_probes", sources=[str(build_config.ROOT / "tools" / "ptx_probes.cu")],
             extra_include_paths=[str(build_config.CSRC)], extra_cuda_cflags=build_config.nvcc_flags(),
             is_python_module=False)

    def on_target(op):
        return lambda *args: op(*(a.to(kernel_target.device) if torch.is_tensor(a) else a for a in args)).cpu()
    ops = torch.ops.pytransformer_probes
    return types.SimpleNamespace(**{name: on_target(getattr(ops, name))
                                    for name in ("probe_ldmatrix", "probe_mma", "probe_cp_async")})


@pytest.fixture(scope="session")
def emu(kernel_target):
    """The emulator's op namespace (its probe ops and knobs); skipped on a GPU."""
    if not kernel_target.emulated:
        pytest.skip("an emulator op")
    return kernel_target.ops


class KernelTarget:
    """Where the CUDA kernel cases run: the op namespace, its device, and (emulated) the pretend device sizes."""

    def __init__(self, ops, device: str, emulated: bool, full: bool):
        self.ops, self.device, self.emulated, self.full = ops, device, emulated, full

    def shapes(self, quick, full):
        """The full shape list with --cuda-full, else the quick one."""
        return full if self.full else quick

    def run(self, cases, each_device_size: bool = False) -> list[str]:
        """cases(KernelChecks) from a fixed seed, on a small and a large pretend device when emulated and
        `each_device_size` (persistent grids looping over many rows, or many row groups and split-K partial sums);
        returns the names of the failed cases."""
        torch.manual_seed(0)
        checks = KernelChecks(self.ops, self.device, kernel_device="cuda")
        for sms, blocks in ((2, 2), (64, 8)) if self.emulated and each_device_size else ((None, None),):
            if sms is not None:
                self.ops.set_device(sms, blocks)
            cases(checks)
        return checks.failures

    def captured(self, fn):
        """fn() as it runs while a stream is captured into a CUDA graph (on the GPU: captured, then replayed once)."""
        if self.emulated:
            with emulated_capturing(self.ops):
                return fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graph.replay()
        torch.cuda.synchronize()
        return out

