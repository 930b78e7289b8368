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
