"""Shared test fixtures: devices to run on (CUDA ones are marked `cuda` and skipped without a GPU), and the target of
the CUDA kernel cases (tests/ops/kernel_cases.py): the GPU, or the host emulator with --cuda-emulator."""
import pytest
import torch

import pytransformer  # noqa: F401  registers the ops
from tests.ops.kernel_cases import KernelTarget


def pytest_addoption(parser):
    parser.addoption("--cuda-emulator", action="store_true",
                     help="run the CUDA kernel cases on the CPU through tools/cuda_emulator (no GPU needed)")
    parser.addoption("--cuda-full", action="store_true", help="the full shape lists of the CUDA kernel cases")

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not (torch.cuda.is_available() and pytransformer.with_cuda()), reason="needs a GPU and a CUDA build")])]


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
        return KernelTarget(build.load(), "cpu", emulated=True, full=full)
    pytest.skip("needs a GPU and a CUDA build, or --cuda-emulator")
