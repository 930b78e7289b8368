"""Shared test fixtures: devices to run on (CUDA ones are marked `cuda` and skipped without a GPU)."""
import os
import subprocess
import sys

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


CPU_ISA_LEVELS = ["default", "avx2"]  # the levels below the best one, which the other tests run


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
