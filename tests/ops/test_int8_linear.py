"""ops.int8_linear against a float64 reference (every path: CPU few and many rows, CUDA GEMV and tiled GEMM), dtypes,
layouts, edge shapes, opcheck, torch.compile, no backward, bad input."""
import os
import subprocess
import sys

import pytest
import torch

import pytransformer
from pytransformer import ops
from pytransformer.ops import reference

from tests.helpers import CAPPED_ISA_LEVELS, TRACING_ERROR, compiled, run_under_isa, skip_unsupported, tolerance
from pytransformer import check as kc


INT_DOTS = pytransformer._C.cpu_int_dot_products()  # the few-rows CPU kernel quantizes x itself (ops.int8_linear)
needs_int_dots = pytest.mark.skipif(not INT_DOTS, reason="no integer dot products here (no AVX-512 VNNI and AVX2 not "
                                    "the best level, or an ATEN_CPU_CAPABILITY cap above AVX2)")


def make(n, k, device, dtype=torch.float32, bias=True):
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=device)
    scale = torch.rand(n, device=device, dtype=dtype) * 0.01 + 1e-3
    b = torch.randn(n, device=device, dtype=dtype) if bias else None
    return weight, scale, b


def check(x, weight, scale, bias, x_bits=16):
    """ops.int8_linear against the float64 reference on x as the op's path on this processor sees it
    (reference.int8_linear_x: rounded to 8 bits with x_bits=8, quantized to 16 bits by the CPU kernel with integer dot
    products)."""
    got = ops.int8_linear(x, weight, scale, bias, x_bits=x_bits)
    x64 = reference.int8_linear_x(x, x_bits).to(x.device)
    want = reference.int8_linear(x64, weight, scale.double(), None if bias is None else bias.double())
    assert got.dtype == x.dtype and got.shape == (*x.shape[:-1], weight.shape[0])
    atol, rtol = tolerance(x.dtype)
    magnitude = max(1.0, want.abs().amax().item()) if want.numel() else 1.0  # the half types round the result
    err = (got.double() - want).abs()
    allowed = atol * magnitude + rtol * want.abs()
    assert bool((err <= allowed).all()), f"{(err - allowed).amax().item()} over the tolerance"


# CPU: <= 16 rows the row-by-row kernel, more with AVX2 the GEMM (6 x 16 tiles: 17, 64 and 65 rows end in partial tiles,
# N 5, 7, 48 and 129 in partial panels, K 3072 and 3100 in two blocks of K), with AVX-512 VNNI the kernel 8 rows a call,
# else dequantize + ATen's GEMM; CUDA: <= 64 rows the GEMV, more the tiled GEMM. K 3072 and 3100: x of 1 or 2 rows fits
# in L1 (with AVX-512, each thread's weight rows read as two streams), of 5 or more does not (blocks of 4 weight rows;
# csrc/cpu/gemv.h)
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 64, 65])
@pytest.mark.parametrize("k,n", [(64, 48), (37, 5), (1, 3), (300, 129), (3072, 7), (3100, 7)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_bits", [16, 8])
def test_matches_reference(device, rows, k, n, bias, x_bits):
    weight, scale, b = make(n, k, device, bias=bias)
    check(torch.randn(rows, k, device=device), weight, scale, b, x_bits)


# avx512 capped explicitly runs the AVX-512 code that widens the int8 weights to float32 (no VNNI dot products: see
# csrc/cpu/isa.h), which the uncapped tests use on a processor that has them; avx2 sums in integers (vpmaddwd).
@pytest.mark.parametrize("isa", CAPPED_ISA_LEVELS)
def test_each_cpu_isa_level_agrees(isa):
    """The few-rows kernel is compiled per ISA level, with narrower blocks of x rows below AVX-512: 7 rows of x and
    13 weight rows (AVX-512: over 2 threads, 8 and 5, two streams of 4, and of 2 and the last row alone; below it
    blocks of 4, the next one prefetched a line at a time) reach every block shape, and 8 rows (AVX-512: 8 at once
    over 2 weight rows, each pair's 8 results written by its dot block, x in L1 at K 1000, in blocks at 1100) the
    widest; K 1100 spans whole 64-byte lines, a vector and a tail. 20 rows: the GEMM with AVX2, else dequantized
    weights and ATen's GEMM. x as the path at that level sees it (reference.int8_linear_x), and check's bound,
    scaled by the result's magnitude: the GEMM's float32 sums over K 1100 of products up to 127 |x| drift past
    2e-5 absolute. float64 x, 1 and 20 rows: the row-by-row kernel in float64, and dequantized float64 weights."""
    run_under_isa(isa, (
        "from tests.ops.test_int8_linear import check, make\n"
        "for k, m in ((1100, 7), (1100, 8), (1000, 8), (1100, 20)):\n"
        "  w, s, b = make(13, k, 'cpu'); x = torch.randn(m, k)\n"
        "  for x_bits in (16, 8): check(x, w, s, b, x_bits)\n"
        "for m in (1, 20):\n"
        "  w, s, b = make(13, 1100, 'cpu', torch.float64); check(torch.randn(m, 1100, dtype=torch.float64), w, s, b)"))


def quantized_x_reference(x, weight, scale, bias, bits=16):
    """What the few-rows CPU kernel computes with integer dot products, float32 x [M, K] quantized to `bits`: each row
    of x quantized in float32 arithmetic as csrc/cpu/gemv.h's quantize_rows does, the integer products summed
    exactly (float64 holds integers up to 2^53), then float32 (sum * x scale) * scale + bias; rows with an inf or NaN
    all NaN."""
    q, x_scale = reference.quantize_x_rows(x, bits)
    return (q.double() @ weight.double().T).float() * x_scale * scale + bias


def check_x_quantized_exactly(rows, k, bits):
    weight, scale, b = make(37, k, "cpu")
    weight[0] = -128  # the weight 8 bits shift to 0
    weight[1] = 127   # and to 255
    x = torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]
    got = ops.int8_linear(x, weight, scale, b, x_bits=bits)
    assert torch.equal(got, quantized_x_reference(x, weight, scale, b, bits))
    assert torch.equal(got[-1:], ops.int8_linear(x[-1:], weight, scale, b, x_bits=bits))


@needs_int_dots
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 16])
@pytest.mark.parametrize("k", [1, 33, 100, 773, 3072, 11008])
@pytest.mark.parametrize("bits", [16, 8])
def test_x_quantized_exactly(rows, k, bits):
    """With integer dot products the row-by-row kernel is exact integer arithmetic on x quantized per row, so it equals
    its emulation bit for bit, whatever the row count (each row as if alone) and path: 8 rows of K 3072 (16 bits) and 3
    or more of K 11008 go by in chunks of K, others as two streams or in blocks; K 11008 quantizes to at most 24385 with
    16 bits; K 33, 100 and 773 end in a partial vector of both widths (32 and 64 elements)."""
    check_x_quantized_exactly(rows, k, bits)


@pytest.mark.skipif(not pytransformer._C.cpu_int_dot_products(17), reason="more than 16 rows take a GEMM on x as it is "
                    "here (AVX2), or there are no integer dot products")
@pytest.mark.parametrize("rows", [17, 30])
@pytest.mark.parametrize("k", [33, 3072, 11008])
@pytest.mark.parametrize("bits", [16, 8])
def test_x_quantized_exactly_many_rows(rows, k, bits):
    """With AVX-512 VNNI more than 16 rows go through the row-by-row kernel too, in calls of 8 (17: 8, 8 and 1; 30: 8,
    8, 8 and 6), each row the same as alone."""
    check_x_quantized_exactly(rows, k, bits)


needs_amx = pytest.mark.skipif(not pytransformer._C.cpu_amx(), reason="no AMX int8 tiles here (or Linux refuses them)")


def without_amx(f):
    """f() with int8_linear's AMX path turned off (more than 16 rows then take the VNNI row-by-row kernel)."""
    pytransformer._C.cpu_amx(False)
    try:
        return f()
    finally:
        pytransformer._C.cpu_amx(True)


@needs_amx
@pytest.mark.parametrize("rows", [17, 40])
@pytest.mark.parametrize("n, k", [(33, 1), (300, 100), (70, 2048), (45, 11008)])
@pytest.mark.parametrize("bits", [16, 8])
def test_amx_equals_vnni(rows, n, k, bits):
    """With AMX int8 tiles, more than 16 rows are summed by tiles (16 rows by 16 outputs, K by 64) instead of the VNNI
    kernel, on the same quantized x: the same outputs bit for bit, with rows, outputs and K past whole tiles (K 1 and
    100: a partial step; a thread's outputs in several packed panels at K 2048 and 11008) and with
    edge rows (zeros, tiny, subnormal, an inf, a NaN), and equal to the exact emulation."""
    weight, scale, b = make(n, k, "cpu")
    weight[0], weight[1] = -128, 127
    x = torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]
    x[5] = x.abs().amax()  # every x at its row's maximum (the largest integers) against weights of -128 and 127
    x[0] = 0.0
    x[1] *= 1e-35
    x[2] = torch.randn(k) * 1e-44
    x[3, k // 2] = float("inf")
    x[4, 0] = float("nan")
    got = ops.int8_linear(x, weight, scale, b, x_bits=bits)
    vnni = without_amx(lambda: ops.int8_linear(x, weight, scale, b, x_bits=bits))
    torch.testing.assert_close(got, vnni, rtol=0, atol=0, equal_nan=True)
    ok = torch.ones(rows, dtype=torch.bool)
    ok[3:5] = False
    assert got[3:5].isnan().all() and torch.equal(got[ok], quantized_x_reference(x, weight, scale, b, bits)[ok])


@needs_amx
@pytest.mark.parametrize("bits", [16, 8])
def test_amx_largest_sums(bits):
    """The largest sums the AMX path takes: every x at its row's maximum against weights of -128 over K 65536
    (kAmxMaxK; 8 bits: 127 * 128 * 65536 in one int32 sum; 16 bits: 255 * 128 * 65536 in the sum of low bytes), and
    over K 65537, which goes to the VNNI kernel: both equal the exact emulation."""
    for k in (65536, 65537):
        weight, scale = torch.full((3, k), -128, dtype=torch.int8), torch.ones(3)
        got = ops.int8_linear(torch.ones(17, k), weight, scale, x_bits=bits)
        assert torch.equal(got, quantized_x_reference(torch.ones(17, k), weight, scale, torch.zeros(3), bits))
        torch.testing.assert_close(got, torch.full_like(got, -128.0 * k), rtol=1e-6, atol=0)


@needs_int_dots
@pytest.mark.parametrize("bits", [16, 8])
def test_x_quantized_edge_rows(bits):
    """Rows of zeros (the bias), of tiny values (below 2^-100, subnormal too), with an inf or a NaN (all NaN); and the
    largest sums: 16 bits, every x at its row's maximum against weights of -128 over K 20000, which would overflow an
    int32 lane with x quantized to 32767 and overflows the int32 total of the lanes (-3.4e10); 8 bits, against weights
    of 127 (shifted to 255) over K 1.1 million, which x quantized to 127 would overflow (x_quant_max: 122)."""
    weight, scale, b = make(21, 300, "cpu")
    x = torch.randn(6, 300)
    x[0] = 0.0
    x[1] *= 1e-35
    x[2] = torch.randn(300) * 1e-44  # subnormal
    x[3, 7] = float("inf")
    x[4, 100] = float("nan")
    got = ops.int8_linear(x, weight, scale, b, x_bits=bits)
    want = quantized_x_reference(x, weight, scale, b, bits)
    assert torch.equal(got[:3], want[:3]) and torch.equal(got[5:], want[5:])
    assert torch.equal(got[0], b) and got[3:5].isnan().all()
    k, w = (20000, -128) if bits == 16 else (1100000, 127)
    weight = torch.full((5, k), w, dtype=torch.int8)
    scale = torch.ones(5)
    for rows in (1, 8):
        got = ops.int8_linear(torch.ones(rows, k), weight, scale, x_bits=bits)
        want = quantized_x_reference(torch.ones(rows, k), weight, scale, torch.zeros(5), bits)
        assert torch.equal(got, want)
        torch.testing.assert_close(got, torch.full_like(got, k * w), rtol=1e-6, atol=0)


@pytest.mark.skipif(pytransformer._C.cpu_isa() != "avx512", reason="the tests above run AVX2's kernel uncapped here")
def test_x_quantized_exactly_by_avx2():
    """The two tests above with the kernels capped at AVX2, whose integer dot products (vpmaddwd) multiply the same
    integers as AVX-512 VNNI's and so give the same results, bit for bit."""
    tests = [f"{__file__}::{name}" for name in ("test_x_quantized_exactly", "test_x_quantized_edge_rows")]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], capture_output=True,
                         text=True, env=dict(os.environ, ATEN_CPU_CAPABILITY="avx2"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "skipped" not in out.stdout, out.stdout[-3000:]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_weight_blocks(device, bias, dtype):
    """Many rows of x with a weight of several dequantization blocks on the CPU (16 MiB each: 2 of float32, 3 of
    float64), the path of float64 x everywhere and of float32 x without integer dot products (with them, 17 rows go
    through the row-by-row kernel, 8 at a time)."""
    skip_unsupported(dtype, device)
    weight, scale, b = make(4500, 1024, device, dtype=dtype, bias=bias)
    check(torch.randn(17, 1024, device=device, dtype=dtype), weight, scale, b)
    with torch.inference_mode():
        check(torch.randn(17, 1024, device=device, dtype=dtype), weight, scale, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("rows", [3, 20])
@pytest.mark.parametrize("x_bits", [16, 8])
def test_dtypes(device, dtype, rows, x_bits):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")
    weight, scale, b = make(40, 72, device, dtype)
    check(torch.randn(2, rows, 72, device=device, dtype=dtype), weight, scale, b, x_bits)
    # Scales and bias may have another float dtype than x (e.g. a float32 scale for bfloat16 activations).
    check(torch.randn(rows, 72, device=device, dtype=dtype), weight, scale.float(), b.float(), x_bits)


def test_layouts_and_edge_shapes(device):
    weight, scale, b = make(24, 40, device)
    check(torch.randn(40, 6, device=device).t(), weight, scale, b)  # transposed x
    check(torch.randn(3, 1, 40, device=device).expand(3, 4, 40), weight, scale, b)  # expanded x
    check(torch.randn(40, device=device), weight, scale, b)  # 1-d x
    check(torch.randn(2, 0, 40, device=device), weight, scale, b)  # no rows
    w_rows = torch.randint(-127, 128, (48, 40), dtype=torch.int8, device=device)[8:32]  # a row slice of a weight
    check(torch.randn(5, 40, device=device), w_rows, scale, b)
    check(torch.randn(5, 40, device=device), weight.t().contiguous().t().contiguous(), scale, b)
    for rows in (3, 20):  # K = 0: the bias, with few rows and with many (prefill's paths)
        empty = ops.int8_linear(torch.randn(rows, 0, device=device), weight[:, :0], scale, b)
        torch.testing.assert_close(empty, b.expand(rows, 24))


def test_opcheck(device):
    weight, scale, b = make(16, 24, device)
    for x in (torch.randn(3, 24, device=device), torch.randn(2, 12, 24, device=device)):
        torch.library.opcheck(torch.ops.pytransformer.int8_linear, (x, weight, scale, b, 16))
        torch.library.opcheck(torch.ops.pytransformer.int8_linear, (x, weight, scale, None, 16))
        torch.library.opcheck(torch.ops.pytransformer.int8_linear, (x, weight, scale, b, 8))


def test_compile(device):
    weight, scale, b = make(16, 24, device)
    fn = torch.compile(ops.int8_linear, fullgraph=True, backend="aot_eager")
    for rows in (1, 30):
        x = torch.randn(rows, 24, device=device)
        torch.testing.assert_close(fn(x, weight, scale, b), ops.int8_linear(x, weight, scale, b))
        torch.testing.assert_close(fn(x, weight, scale, b, x_bits=8), ops.int8_linear(x, weight, scale, b, x_bits=8))


def test_no_backward(device):
    weight, scale, b = make(4, 8, device)
    x = torch.randn(2, 8, device=device, requires_grad=True)
    y = ops.int8_linear(x, weight, scale, b)
    with pytest.raises(RuntimeError, match="inference"):
        y.sum().backward()
    with torch.no_grad():  # no history to refuse
        z = ops.int8_linear(x, weight, scale, b)
    assert not z.requires_grad and z.grad_fn is None
    torch.testing.assert_close(z, y.detach())


def test_bad_input_on_meta_tensors():
    test_bad_input("meta")


def test_bad_call_under_compile_names_the_argument():
    weight, scale, b = make(4, 8, "cpu")
    with pytest.raises(TRACING_ERROR, match="scale: expected shape"):
        compiled(ops.int8_linear)(torch.randn(2, 8), weight, scale[:3], b)


def test_bad_input(device):
    weight, scale, b = make(4, 8, device)
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="weight"):
        ops.int8_linear(x, weight.float(), scale, b)
    with pytest.raises(ValueError, match="weight"):
        ops.int8_linear(x, weight[:, :6], scale, b)
    with pytest.raises(ValueError, match="scale"):
        ops.int8_linear(x, weight, scale[:3], b)
    with pytest.raises(ValueError, match="scale"):
        ops.int8_linear(x, weight, scale.to(torch.int32), b)
    with pytest.raises(ValueError, match="bias"):
        ops.int8_linear(x, weight, scale, torch.randn(5, device=device))
    with pytest.raises(ValueError, match="x"):
        ops.int8_linear(x.long(), weight, scale, b)
    with pytest.raises(ValueError, match="x"):
        ops.int8_linear(torch.tensor(1.0, device=device), weight, scale, b)
    with pytest.raises(ValueError, match="x_bits"):
        ops.int8_linear(x, weight, scale, b, x_bits=4)
    if device == "cuda":
        with pytest.raises(ValueError, match="x"):
            ops.int8_linear(x.double(), weight, scale, b)  # float64 is CPU-only
        with pytest.raises(ValueError, match="weight"):
            ops.int8_linear(x, weight.cpu(), scale, b)


# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA kernels of int8_linear (GEMV rows per block, split-K, tiled GEMM) against float64 references
    (pytransformer/check.py)."""
    assert kernel_target.run(lambda c: c.check_int8_linear(kernel_target.shapes(kc.INT8_SHAPES_QUICK, kc.INT8_SHAPES)),
                             each_device_size=True) == []
