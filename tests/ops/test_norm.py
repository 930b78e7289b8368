"""layer_norm / rms_norm: against float64 references, opcheck, gradcheck, torch.compile, errors."""
import pytest
import torch
import torch.nn.functional as F

import pytransformer as pt
from pytransformer.ops import reference as ref
from tests.helpers import CPU_ISA_LEVELS, TRACING_ERROR, WHERE, compiled, factory_device, run_under_isa, tolerance
from pytransformer import check as kc

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(5, 1), (3, 7), (2, 3, 384), (4, 1000), (2, 4096), (2, 2, 2, 33)]


def _inputs(shape, dtype, device, affine=True, bias=True):
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1.5).to(device, dtype)
    n = shape[-1]
    w = torch.randn(n, dtype=torch.float64).to(device, dtype) if affine else None
    b = torch.randn(n, dtype=torch.float64).to(device, dtype) if affine and bias else None
    return x, w, b


def _skip_unsupported(dtype, device):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_reference(device, dtype, shape, affine):
    _skip_unsupported(dtype, device)
    x, w, b = _inputs(shape, dtype, device, affine)
    f64 = lambda t: None if t is None else t.double()  # noqa: E731
    expected = ref.layer_norm(x.double(), f64(w), f64(b))
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(pt.ops.layer_norm(x, w, b).double(), expected, atol=atol * 10, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_rows_at_their_mean(device, dtype):
    """Elements equal to their row's mean normalise to exactly 0, so the output is the bias: rows of one element,
    and constant rows, far from 0 (x * rstd - mean * rstd as one fma was off by mean * rstd's rounding, ~0.01 here)."""
    _skip_unsupported(dtype, device)
    x = (torch.randn(6, 1, dtype=dtype) * 1e3).to(device).expand(6, 37)
    w, b = torch.randn(37, dtype=dtype, device=device), torch.randn(37, dtype=dtype, device=device)
    for rows in (x[:, :1], x):
        torch.testing.assert_close(pt.ops.layer_norm(rows, w[:rows.shape[1]], b[:rows.shape[1]]),
                                   b[:rows.shape[1]].expand(rows.shape), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [3, 1000, 4096])
def test_layer_norm_statistics_for_any_offset(device, dtype, n):
    """One element far from the row's mean (statistics shifted by x[0] lost the variance to cancellation: 2.8e-2 at
    4096 columns), and whole rows offset by 1e3 (|mean| >> std). Besides the dtype's tolerance, each row may be off by
    what a mean in the dtype cannot avoid: a few ulps of the row's largest |x|, over its std (3 columns 1e3 + randn
    whose std is 0.15: 3e-4 in float32)."""
    _skip_unsupported(dtype, device)
    x = torch.randn(4, n, dtype=torch.float64)
    x[:2, 0] = 1e4
    x[2:] += 1e3
    x = x.to(device, dtype)
    x64 = x.double().cpu()
    expected = F.layer_norm(x64, (n,))
    atol, rtol = tolerance(dtype)
    for row in range(4):  # per row: a wrong row cannot hide in a norm
        mean_ulps = 4 * torch.finfo(dtype).eps * x64[row].abs().max().item() / x64[row].std(unbiased=False).item()
        torch.testing.assert_close(pt.ops.layer_norm(x[row]).double().cpu(), expected[row], atol=atol * 10 + mean_ulps,
                                   rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_backward_of_one_feature_is_zero(device, dtype):
    """N = 1: xhat = 0 and dx = rstd * (g w - mean(g w)) = 0 exactly, even with BERT's eps = 1e-12 (rstd = 1e6); a
    multiply-add fused on one side only left +-0.2."""
    _skip_unsupported(dtype, device)
    x = torch.randn(64, 1, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(1, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(1, dtype=dtype, device=device, requires_grad=True)
    y = pt.ops.layer_norm(x, w, b, eps=1e-12)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    assert torch.equal(dx, torch.zeros_like(dx))
    assert dw.abs().item() == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_matches_reference(device, dtype, shape):
    _skip_unsupported(dtype, device)
    x, w, _ = _inputs(shape, dtype, device)
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(pt.ops.rms_norm(x, w).double(), ref.rms_norm(x.double(), w.double()),
                               atol=atol * 10, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 384), (4, 1000)])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_backward_matches_reference(device, dtype, shape, op):
    x, w, b = _inputs(shape, dtype, device)
    args = (w, b) if op == "layer_norm" else (w,)
    leaves = [x, *args]
    for t in leaves:
        t.requires_grad_(True)
    g = torch.randn(shape, dtype=torch.float64).to(device, dtype)
    ours = torch.autograd.grad(getattr(pt.ops, op)(x, *args), leaves, g)
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    theirs = torch.autograd.grad(getattr(ref, op)(*leaves64), leaves64, g.double())
    atol, rtol = tolerance(dtype)
    for a, e in zip(ours, theirs):
        # weight/bias grads sum over rows: scale the tolerance with the reduction length
        torch.testing.assert_close(a.double(), e, atol=atol * 20 * shape[0], rtol=rtol * 5)


def test_non_contiguous_input(device):
    x = torch.randn(64, 48, device=device).t()  # [48, 64], transposed view
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    torch.testing.assert_close(pt.ops.layer_norm(x, w, b), pt.ops.layer_norm(x.contiguous(), w, b))
    torch.testing.assert_close(pt.ops.rms_norm(x, w), pt.ops.rms_norm(x.contiguous(), w))
    xe = torch.randn(1, 64, device=device).expand(5, 64)
    torch.testing.assert_close(pt.ops.layer_norm(xe), pt.ops.layer_norm(xe.contiguous()))


@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
def test_gradcheck(affine, bias):
    x, w, b = _inputs((3, 11), torch.float64, "cpu", affine, bias)
    args = [t.requires_grad_(True) if t is not None else None for t in (x, w, b)]
    assert torch.autograd.gradcheck(lambda *a: pt.ops.layer_norm(*a), args)
    assert torch.autograd.gradcheck(lambda x, w: pt.ops.rms_norm(x, w), args[:2])


def test_autograd_records_history_only_where_needed():
    """The C++ autograd (csrc/registration.cpp): no graph under no_grad or for inputs without grad, and the
    statistics are outputs without gradients."""
    x, w, b = _inputs((3, 8), torch.float32, "cpu")
    ops = torch.ops.pytransformer
    assert ops.layer_norm(x, w, b, 1e-5)[0].grad_fn is None and ops.rms_norm(x, w, 1e-6)[0].grad_fn is None
    for t in (x, w, b):
        t.requires_grad_(True)
    with torch.no_grad():
        assert ops.layer_norm(x, w, b, 1e-5)[0].grad_fn is None and ops.rms_norm(x, w, 1e-6)[0].grad_fn is None
    out, mean, rstd = ops.layer_norm(x, w, b, 1e-5)
    rms_out, rms_rstd = ops.rms_norm(x, w, 1e-6)
    assert out.requires_grad and rms_out.requires_grad
    assert not (mean.requires_grad or rstd.requires_grad or rms_rstd.requires_grad)
    w_only = ops.layer_norm(x.detach(), w, None, 1e-5)[0]  # grad for the weight alone
    w_only.sum().backward()
    assert x.grad is None and w.grad is not None


def test_opcheck(device):
    x, w, b = _inputs((4, 33), torch.float32, device)
    x.requires_grad_(True)
    ops = torch.ops.pytransformer
    torch.library.opcheck(ops.layer_norm, (x, w, b, 1e-5))
    torch.library.opcheck(ops.layer_norm, (x, None, None, 1e-5))
    torch.library.opcheck(ops.rms_norm, (x, w, 1e-6))
    g = torch.randn_like(x)
    with torch.no_grad():
        mean, rstd = ops.layer_norm(x, w, b, 1e-5)[1:]
        rms_rstd = ops.rms_norm(x, w, 1e-6)[1]
    torch.library.opcheck(ops.layer_norm_backward, (g, x.detach(), mean, rstd, w, True))
    torch.library.opcheck(ops.rms_norm_backward, (g, x.detach(), rms_rstd, w))


def test_compile_fullgraph_forward_backward(device):
    ln, rms = pt.nn.LayerNorm(40).to(device), pt.nn.RMSNorm(40).to(device)
    f = torch.compile(lambda x: rms(ln(x)).square().sum(), fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 5, 40, device=device, requires_grad=True)
    f(x).backward()
    x2 = x.detach().clone().requires_grad_(True)
    rms(ln(x2)).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_modules_are_drop_in_for_torch(device):
    ours = pt.nn.LayerNorm(32).to(device)
    torch.nn.init.normal_(ours.weight), torch.nn.init.normal_(ours.bias)
    theirs = torch.nn.LayerNorm(32).to(device)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 32, device=device)
    torch.testing.assert_close(ours(x), theirs(x))
    plain = pt.nn.LayerNorm((32,), elementwise_affine=False).to(device)
    assert plain.weight is None and plain.bias is None and not list(plain.parameters())
    torch.testing.assert_close(plain(x), F.layer_norm(x, (32,)))
    rms = pt.nn.RMSNorm(32, eps=1e-5).to(device)
    torch.testing.assert_close(rms(x), F.rms_norm(x, (32,), rms.weight, 1e-5))
    assert set(pt.nn.LayerNorm(8, bias=False).state_dict()) == {"weight"}


@pytest.mark.parametrize("where", WHERE)
def test_bad_inputs_raise(where):
    with factory_device(where):
        _bad_inputs_raise()


def test_bad_call_under_compile_names_the_argument():
    with pytest.raises(TRACING_ERROR, match=r"weight: expected shape \[8\]"):
        compiled(lambda x, w: pt.ops.layer_norm(x, w))(torch.randn(4, 8), torch.ones(7))


def _bad_inputs_raise():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="weight"):
        pt.ops.layer_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match="bias"):
        pt.ops.layer_norm(x, torch.ones(8), torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="x: expected a float"):
        pt.ops.layer_norm(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="x: expected shape"):
        pt.ops.rms_norm(torch.randn(4, 0))
    with pytest.raises(ValueError, match="x: expected shape"):
        pt.ops.layer_norm(torch.tensor(1.0))
    with pytest.raises(ValueError, match="normalized_shape"):
        pt.nn.LayerNorm((4, 8))


@pytest.mark.parametrize("isa", CPU_ISA_LEVELS)
def test_each_cpu_isa_level_agrees(isa):
    """The kernels are compiled per ISA level; the lower levels must agree with the best one."""
    run_under_isa(isa, (
        "x=torch.randn(6,1000,dtype=torch.float64); w=torch.randn(1000,dtype=torch.float64);"
        "torch.testing.assert_close(pt.ops.layer_norm(x,w), ref.layer_norm(x,w));"
            "xb=x.bfloat16(); torch.testing.assert_close(pt.ops.rms_norm(xb).double(), ref.rms_norm(xb.double()),"
            " atol=2e-2, rtol=2e-2);"))


# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA kernels of layer_norm and rms_norm on every path (pytransformer/check.py) against float64 references."""
    assert kernel_target.run(lambda c: c.check_norms(kernel_target.shapes(kc.NORM_SHAPES_QUICK, kc.NORM_SHAPES)),
                             each_device_size=True) == []
