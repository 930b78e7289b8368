"""Shared test fixtures: devices to run on (CUDA ones are marked `cuda` and skipped without a GPU)."""
import pytest
import torch

import pytransformer  # noqa: F401  registers the ops

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


def tolerance(dtype):
    """(atol, rtol) for comparing a result in `dtype` with a float64 reference."""
    return {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3),
            torch.bfloat16: (2e-2, 2e-2)}[dtype]
