"""masked_softmax: against the float64 reference (masks, broadcasting, causal), empty rows, non-contiguous inputs,
gradcheck, opcheck, torch.compile, errors."""
import pytest
import torch

import pytransformer as pt
from pytransformer.ops import reference as ref
from tests.helpers import CPU_ISA_LEVELS, TRACING_ERROR, WHERE, compiled, factory_device, run_under_isa, tolerance
from pytransformer import check as kc

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SHAPES = [(5, 1), (3, 7), (2, 3, 384), (3, 1000), (2, 4096), (2, 2, 3, 33)]
ops = torch.ops.pytransformer


def _skip_unsupported(dtype, device):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")


def _scores(shape, dtype, device, spread=3.0):
    return (torch.randn(shape, dtype=torch.float64) * spread).to(device, dtype)


def _mask(kind, shape, dtype, device):
    """A random bool mask (True = keep) or float mask (finite values and -inf) of `shape`, or None."""
    if kind == "none":
        return None
    keep = torch.rand(shape) > 0.3
    if kind == "bool":
        return keep.to(device)
    values = torch.randn(shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    return values.to(device, dtype)


def _expected(x, mask, scale, causal):
    return ref.masked_softmax(x.double(), None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                              scale=scale, causal=causal)


def _check(out, x, mask=None, scale=1.0, causal=False):
    atol, rtol = tolerance(x.dtype)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), _expected(x, mask, scale, causal), atol=atol, rtol=rtol * 5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_matches_reference(device, dtype, shape, scale):
    _skip_unsupported(dtype, device)
    x = _scores(shape, dtype, device)
    _check(pt.ops.masked_softmax(x, scale=scale), x, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_scores_are_stable(device, dtype):
    _skip_unsupported(dtype, device)
    x = _scores((4, 300), dtype, device, spread=1e3 if dtype != torch.float16 else 1e2)
    _check(pt.ops.masked_softmax(x, scale=4.0), x, scale=4.0)


# Mask shapes for scores [B, H, Lq, Lk] = [2, 3, Lq, Lk], as functions of (Lq, Lk).
MASK_SHAPES = {
    "[Lk]": lambda lq, lk: (lk,),
    "[Lq,Lk]": lambda lq, lk: (lq, lk),
    "[B,1,1,Lk]": lambda lq, lk: (2, 1, 1, lk),
    "[B,1,Lq,Lk]": lambda lq, lk: (2, 1, lq, lk),
    "[1,H,Lq,1]": lambda lq, lk: (1, 3, lq, 1),
    "[B,H,Lq,Lk]": lambda lq, lk: (2, 3, lq, lk),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,mask_shape", [("none", None)] + [(k, s) for k in ("bool", "float") for s in MASK_SHAPES])
@pytest.mark.parametrize("causal", [False, True])
def test_masks_match_reference(device, dtype, kind, mask_shape, causal):
    _skip_unsupported(dtype, device)
    for lq, lk in [(5, 5), (4, 37), (9, 6)]:  # square, Lq < Lk (decoding), Lq > Lk (rows with no visible key)
        x = _scores((2, 3, lq, lk), dtype, device)
        mask = mask_shape and _mask(kind, MASK_SHAPES[mask_shape](lq, lk), dtype, device)
        _check(pt.ops.masked_softmax(x, mask, scale=0.5, causal=causal), x, mask, 0.5, causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_inf_scores_give_nan_rows_as_torch(device, dtype, bad):
    """A NaN or +inf score makes its row NaN, as torch.softmax does (+inf gave [0, nan, 0]); other rows are unchanged
    and a -inf score is an ordinary removed entry."""
    _skip_unsupported(dtype, device)
    x = _scores((3, 5, 70), dtype, device)
    x[0, 1, 7] = bad
    x[2, 4, 69] = float("-inf")
    out = pt.ops.masked_softmax(x, scale=0.5)
    torch.testing.assert_close(out.isnan(), torch.softmax(x.double() * 0.5, -1).isnan(), atol=0, rtol=0)
    assert out[0, 1].isnan().all() and out.isnan().sum() == 70
    rest = torch.ones(3, 5, dtype=torch.bool)
    rest[0, 1] = False
    _check(out[rest], x[rest], scale=0.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_with_nothing_visible_are_zero_with_zero_grad(device, dtype):
    _skip_unsupported(dtype, device)
    x = _scores((2, 6, 40), dtype, device).requires_grad_(True)
    keep = torch.rand(2, 6, 40, device=device) > 0.5
    keep[0, 1] = False  # bool mask removes the whole row
    bias = torch.zeros(2, 6, 40, dtype=dtype, device=device)
    bias[1, 2] = float("-inf")  # float mask of -inf over the whole row
    cases = [(keep, False), (bias, False), (None, True)]  # causal, Lq = 6 > Lk = 4 below: rows 0, 1 see nothing
    for mask, causal in cases:
        xs = x[..., :4] if causal else x
        out = pt.ops.masked_softmax(xs, mask, causal=causal)
        assert not out.isnan().any()
        _check(out, xs.detach(), mask, 1.0, causal)
        (grad,) = torch.autograd.grad(out, x, torch.randn_like(out))
        empty = (out == 0).all(-1)
        assert empty.any() and not grad.isnan().any()
        assert (grad[..., :out.shape[-1]][empty] == 0).all()
    assert (pt.ops.masked_softmax(torch.full((3, 5), float("-inf"), dtype=dtype, device=device)) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 384), (2, 1000)])
@pytest.mark.parametrize("kind,causal", [("none", False), ("bool", True), ("float", False)])
def test_backward_matches_reference(device, dtype, shape, kind, causal):
    _skip_unsupported(dtype, device)
    x = _scores(shape, dtype, device).requires_grad_(True)
    mask = _mask(kind, shape[-2:], dtype, device)
    g = torch.randn(shape, dtype=torch.float64).to(device, dtype)
    (ours,) = torch.autograd.grad(pt.ops.masked_softmax(x, mask, scale=0.3, causal=causal), x, g)
    x64 = x.detach().double().requires_grad_(True)
    (theirs,) = torch.autograd.grad(_expected(x64, mask, 0.3, causal), x64, g.double())
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(ours.double(), theirs, atol=atol * 10, rtol=rtol * 5)


def test_non_contiguous_scores_and_masks(device):
    x = torch.randn(2, 3, 9, 7, device=device).transpose(-1, -2)  # [2, 3, 7, 9], transposed view
    assert not x.is_contiguous()
    masks = [
        torch.rand(9, 7, device=device).t() > 0.3,  # [7, 9] transposed
        torch.rand(2, 1, 1, 18, device=device)[..., ::2] > 0.3,  # [2, 1, 1, 9], last-dim stride 2
        (torch.rand(2, 1, 7, 1, device=device) > 0.3).expand(2, 3, 7, 9),  # expanded in every broadcast dim
        torch.randn(3, 7, 9, device=device).transpose(0, 1).contiguous().transpose(0, 1),  # float, permuted strides
    ]
    for mask in masks:
        for causal in (False, True):
            out = pt.ops.masked_softmax(x, mask, scale=0.7, causal=causal)
            torch.testing.assert_close(out, pt.ops.masked_softmax(x.contiguous(), mask.contiguous(), scale=0.7,
                                                                  causal=causal))
            _check(out, x, mask, 0.7, causal)
    xe = torch.randn(1, 1, 33, device=device).expand(4, 5, 33)
    _check(pt.ops.masked_softmax(xe, causal=True), xe, causal=True)


def test_mask_with_many_broadcast_dims(device):
    """Leading dims alternating broadcast / not do not coalesce: the kernel's mask layout must still be right."""
    x = torch.randn(2, 2, 2, 2, 2, 2, 2, 2, 5, device=device)
    mask = torch.rand(2, 1, 2, 1, 2, 1, 2, 1, 5, device=device) > 0.4
    _check(pt.ops.masked_softmax(x, mask), x, mask)
    _check(pt.ops.masked_softmax(x, mask[..., :1]), x, mask[..., :1])


def test_empty_inputs(device):
    for shape in [(0, 5), (3, 0), (2, 0, 4)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        out = pt.ops.masked_softmax(x, causal=len(shape) > 2)
        assert out.shape == x.shape
        out.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("kind,causal", [("none", False), ("bool", True), ("float", False), ("float", True)])
def test_gradcheck(kind, causal):
    x = _scores((2, 3, 4, 6), torch.float64, "cpu").requires_grad_(True)
    mask = _mask(kind, (2, 1, 4, 6), torch.float64, "cpu")
    assert torch.autograd.gradcheck(lambda t: pt.ops.masked_softmax(t, mask, scale=0.7, causal=causal), (x,))


def test_float_mask_gradient():
    """A float mask that requires grad (a learned bias) gets its gradient, summed over its broadcast dims."""
    x = _scores((2, 3, 4, 6), torch.float64, "cpu").requires_grad_(True)
    bias = torch.randn(3, 1, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, b: pt.ops.masked_softmax(t, b, scale=0.7, causal=True), (x, bias))


def test_opcheck(device):
    x = torch.randn(2, 3, 5, 7, device=device, requires_grad=True)
    for mask in [None, torch.rand(5, 7, device=device) > 0.3, torch.randn(2, 1, 1, 7, device=device)]:
        for causal in (False, True):
            torch.library.opcheck(ops.masked_softmax, (x, mask, 0.5, causal))
    out = ops.masked_softmax(x.detach(), None, 0.5, True)
    torch.library.opcheck(ops.masked_softmax_backward, (torch.randn_like(out), out, 0.5))


def test_compile_fullgraph_forward_backward(device):
    def f(x, mask):
        return (pt.ops.masked_softmax(x, mask, scale=0.25, causal=True) * torch.arange(7.0, device=x.device)).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 5, 7, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 1, 7, device=device) > 0.3
    compiled(x, mask).backward()
    x2 = x.detach().clone().requires_grad_(True)
    f(x2, mask).backward()
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize("where", WHERE)
def test_bad_inputs_raise(where):
    with factory_device(where):
        _bad_inputs_raise()


def test_bad_call_under_compile_names_the_argument():
    with pytest.raises(TRACING_ERROR, match="mask: shape"):
        compiled(lambda x, m: pt.ops.masked_softmax(x, m))(torch.randn(2, 3, 4, 5), torch.ones(3, 5, dtype=torch.bool))


def test_a_mask_on_another_device_raises():
    """A meta mask with CPU scores is refused by the kernel that serves the call, not answered with garbage."""
    with pytest.raises(ValueError, match="mask: expected a tensor on"):
        pt.ops.masked_softmax(torch.randn(3, 4), torch.ones(3, 4, dtype=torch.bool, device="meta"))


def _bad_inputs_raise():
    x = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"mask: shape \[3, 5\] is not broadcastable to scores' shape \[2, 3, 4, 5\]"):
        pt.ops.masked_softmax(x, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: shape"):
        pt.ops.masked_softmax(x, torch.ones(1, 2, 3, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask: expected a bool mask or a float mask"):
        pt.ops.masked_softmax(x, torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="mask: expected a bool mask"):
        pt.ops.masked_softmax(x, torch.ones(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="scores: expected a float"):
        pt.ops.masked_softmax(torch.ones(4, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="scores: causal=True needs shape"):
        pt.ops.masked_softmax(torch.randn(5), causal=True)
    with pytest.raises(ValueError, match="scores: expected a tensor of shape"):
        pt.ops.masked_softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match="scale"):
        pt.ops.masked_softmax(x, scale=float("nan"))
    with pytest.raises(ValueError, match="grad_out: expected shape"):
        ops.masked_softmax_backward(torch.randn(2, 3, 4, 4), torch.rand(2, 3, 4, 5), 1.0)
    with pytest.raises(ValueError, match="grad_out: expected dtype"):
        ops.masked_softmax_backward(torch.randn(4, 5, dtype=torch.float64), torch.rand(4, 5), 1.0)


@pytest.mark.parametrize("isa", CPU_ISA_LEVELS)
def test_each_cpu_isa_level_agrees(isa):
    """The kernels are compiled per ISA level; the lower levels must agree with the reference too."""
    run_under_isa(isa, (
        "x=torch.randn(2,3,9,1000); m=torch.rand(3,1,1000)>0.3; m[1]=False;"
        "e=ref.masked_softmax(x.double(),m,scale=0.5,causal=True);"
        "torch.testing.assert_close(pt.ops.masked_softmax(x,m,scale=0.5,causal=True).double(),e,atol=2e-5,rtol=1e-4);"
        "xb=x.bfloat16(); f=torch.randn(9,1000).bfloat16(); f[2]=float('-inf');"
        "torch.testing.assert_close(pt.ops.masked_softmax(xb,f).double(),ref.masked_softmax(xb.double(),f.double()),"
            " atol=2e-2, rtol=2e-2);"))


# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA kernels of masked_softmax on every path (pytransformer/check.py) against float64 references."""
    assert kernel_target.run(
        lambda c: c.check_softmax(kernel_target.shapes(kc.SOFTMAX_SHAPES_QUICK, kc.SOFTMAX_SHAPES))) == []
