"""ops.linear against a float64 reference, each output element within the dot-product error bound of its dtype (both
CPU paths: our kernel up to gemv_rows rows, ATen's GEMM above; the kernel streams the weight for few rows, in calls of
32, and with AVX2 or AVX-512 has a GEMM of its own for many), dtypes, layouts, edge shapes, every CPU ISA level,
opcheck, gradcheck, torch.compile, bad input, and the CUDA glue's cases."""
import math

import pytest
import torch
import torch.nn.functional as F

import pytransformer
from pytransformer import check as kc
from pytransformer import ops
from pytransformer.ops import reference

from tests.helpers import CAPPED_ISA_LEVELS, TRACING_ERROR, WHERE, compiled, run_under_isa

# Error of an output element relative to sum_k |x_k w_nk| + |b_n| (the bound of a dot product's rounding error): float32
# accumulation over K <= a few thousand, plus the rounding of the result to the half types.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-12}


def gemv_rows(dtype, k):
    """The most rows of x of k features that take the CPU kernel (csrc/cpu/linear.cpp: path_of); float64 none,
    float16 every count (math.inf), float32 every count with AVX2 or AVX-512 (the kernel's GEMM), else 64; bfloat16
    with AVX-512 BF16 dot products up to 8 or 28 by K, else every count with AVX2 (its GEMM), else 64."""
    if dtype == torch.float64:
        return 0
    isa = pytransformer._C.cpu_isa()
    if dtype == torch.float32:
        return math.inf if isa in ("avx2", "avx512") else 64
    if dtype != torch.bfloat16:
        return math.inf
    if not pytransformer._C.cpu_bf16_dot_products():
        return math.inf if isa == "avx2" else 64
    return 8 if k > 2048 else min(28, (64 << 10) // (2 * k))  # x of at most 64 KiB in rows of at most 4 KiB


def make(n, k, device="cpu", dtype=torch.float32, bias=True):
    weight = torch.randn(n, k, dtype=torch.float64).to(device, dtype)
    return weight, torch.randn(n, dtype=torch.float64).to(device, dtype) if bias else None


def check(x, weight, bias):
    got = ops.linear(x, weight, bias)
    assert got.dtype == x.dtype and got.shape == (*x.shape[:-1], weight.shape[0])
    xd, wd = x.double(), weight.double()
    bd = None if bias is None else bias.double()
    want = reference.linear(xd, wd, bd)
    bound = reference.linear(xd.abs(), wd.abs(), None if bd is None else bd.abs())  # [..., N]
    err = (got.double() - want).abs()
    worst = (err / bound.clamp_min(1e-30)).amax().item() if err.numel() else 0.0
    assert worst <= REL_TOL[x.dtype], f"worst error {worst:.3g} x its bound; per element: {err}"


# 33, 40 and 70 rows: calls of 32 and the rest (32 + 32 + 6)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13, 16, 32, 33, 40, 70])
@pytest.mark.parametrize("k,n", [(64, 48), (37, 5), (1, 3), (300, 129), (17, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_reference(device, rows, k, n, bias):
    weight, b = make(n, k, device, bias=bias)
    check(torch.randn(rows, k, device=device), weight, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("rows", ["one", "last kernel", "first gemm"])
@pytest.mark.parametrize("k,n", [(72, 40), (301, 67), (1600, 7)])  # 1600: x in L1 in 1 row, not in the most
def test_dtypes(device, dtype, rows, k, n):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")
    last = gemv_rows(dtype, k)  # float16: no gemm, so 32 rows and 70 (calls of 32, 32 and 6)
    rows = {"one": 1, "last kernel": 32 if last == math.inf else max(1, last),
            "first gemm": 70 if last == math.inf else last + 1}[rows]
    weight, b = make(n, k, device, dtype)
    check(torch.randn(2, rows, k, device=device).to(dtype), weight, b)
    check(torch.randn(rows, k, device=device).to(dtype), weight, None)


@pytest.mark.parametrize("dtype,k", [(torch.float32, 16), (torch.float32, 6144), (torch.float32, 6145),
                                     (torch.float16, 6145), (torch.bfloat16, 3072),
                                     (torch.bfloat16, 2048), (torch.bfloat16, 1024), (torch.bfloat16, 16),
                                     (torch.float64, 16)])
def test_cpu_path_by_rows(dtype, k):
    """The kernel takes up to gemv_rows(dtype, k) rows and ATen's GEMM the rest (aten::linear in the profile, or
    aten::mm for bfloat16 without AVX-512 BF16, on widened weight blocks); float16 every row count, float32 too with
    AVX-512 (its GEMM)."""
    weight = torch.randn(7, k).to(dtype)
    last = gemv_rows(dtype, k)
    for rows in ({1, 32, 33, 100} if last == math.inf else {1, last, last + 1} - {0}):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            ops.linear(torch.randn(rows, k).to(dtype), weight)
        assert bool({"aten::linear", "aten::mm"} & {e.name for e in prof.events()}) == (rows > last), (rows, last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [24, 29, 33, 40, 48, 128, 144, 151])
@pytest.mark.parametrize("k,n", [(1, 33), (300, 32), (2049, 70), (96, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_tiles(dtype, rows, k, n, bias):
    """Many rows of x are the kernel's GEMM (csrc/cpu/linear_kernel.cpp, gemm): with AVX-512 float32 from 33 rows, in
    tiles of 12 rows of x by 32 weight rows, packed 16 x 16 at a time, and up to 11 tiles of 8 rows where they save
    padding rows; with AVX2 every dtype from 24 rows (the 16-bit types widened as they are packed; from 33 where their
    shape fits gemv_rows' assembly blocks, which none here does), in tiles of 6 by 16, packed 8 x 8, and of 4. The
    weight rows go in panels over the threads and K in blocks of 2048. Rows (AVX-512 / AVX2 tiles): 24 12 + 12 / 4 x
    6; 29 (AVX2) 5 x 6, the last of 5 rows; 33 3 x 12, the last of 9 / 5 x 6 + 4, the last of 3; 40 2 x 12 + 2 x 8 / 6
    x 6 + 4; 48 and 144 whole big tiles; 128 10 x 12 + 8 / 20 x 6 + 2 x 4; 151 12 x 12 + 8, the last of 7 / 24 x 6 + 2
    x 4, the last of 3. 1, 33 and 70 weight rows end in a panel of 1, 1 and 6, 32 is one whole panel (AVX2: two); K
    2049 is two blocks, the second of 1; K 1 a tile of one outer product; K 300 ends in 12 (AVX2: 4) columns of a
    packing. x and weights in [0.5, 1.5), so that a product left out or counted twice is far outside the bound of every
    element (check), and no product so small that float16 rounds it to a subnormal."""
    weight = (0.5 + torch.rand(n, k, dtype=torch.float64)).to(dtype)
    b = (0.5 + torch.rand(n, dtype=torch.float64)).to(dtype) if bias else None
    x = (0.5 + torch.rand(rows, k, dtype=torch.float64)).to(dtype)
    check(x, weight, b)
    check(-x, weight, b)


# avx512 capped explicitly runs the AVX-512 code without AVX-512 BF16 dot products (csrc/cpu/isa.h: has_avx512_bf16),
# which the uncapped tests use on a processor that has them.
@pytest.mark.parametrize("isa", CAPPED_ISA_LEVELS)
def test_each_cpu_isa_level_agrees(isa):
    """The kernel is compiled per ISA level (8 or 16 lanes, 2 or 4 rows of x per block): 13 weight rows (AVX-512:
    over 2 threads, 8 and 5, two streams of 4, and of 2 and the last row alone; below it blocks of 4, the next one
    prefetched a line at a time) and 7 rows of x (in bfloat16 13: with AVX-512 BF16 dot products blocks of 8, 4 and 1
    rows) reach every block shape, K = 1100 full vectors and a tail, in each weight
    dtype; 8 float32 rows (x of 35 KiB) go by in chunks of K at AVX-512, and 130 in the GEMM's tiles there; 130
    bfloat16 rows take AVX2's GEMM, and at the baseline and capped AVX-512 (no BF16 dot products) weight blocks
    widened to float32 for ATen's GEMM (csrc/cpu/linear.cpp, widened_mm). 1 and 2 rows below AVX-512 take blocks
    prefetched all at once (K 1100), or for long rows (float16 K 5000) a line at a time; their x and weights positive,
    so that a row left out is 100% off."""
    run_under_isa(isa, (
        "for dt, m, tol in ((torch.float32, 7, 2e-5), (torch.float32, 8, 2e-5), (torch.float32, 130, 2e-5),"
        " (torch.bfloat16, 13, 2e-2), (torch.bfloat16, 130, 2e-2), (torch.float16, 7, 2e-3)):\n"
        "  w=torch.randn(13,1100).to(dt); b=torch.randn(13).to(dt); x=torch.randn(m,1100).to(dt)\n"
        "  torch.testing.assert_close(pt.ops.linear(x,w,b).double(), ref.linear(x.double(),w.double(),b.double()),"
        " atol=tol*40, rtol=tol)\n"
        "for dt, k, tol in ((torch.float32, 1100, 2e-5), (torch.bfloat16, 1100, 2e-2), (torch.float16, 5000, 2e-3)):\n"
        "  for m in (1, 2):\n"
        "    w=torch.rand(41,k).to(dt); x=torch.rand(m,k).to(dt)\n"
        "    torch.testing.assert_close(pt.ops.linear(x,w).double(), ref.linear(x.double(),w.double()), atol=0,"
        " rtol=tol)"))


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 8e-3), (torch.float16, 2e-3)])
def test_16bit_weight_blocks(dtype, tol):
    """Below AVX-512, bfloat16 and float16 weights with 3 or 5 to 32 rows of x go in assembly blocks where K is a
    multiple of 32 and N of 4 (csrc/cpu/gemv.h, dot_block_16; bfloat16 as pairs, float16 by vcvtph2ps; AVX2's GEMM from
    33 rows there, from 24 for other shapes; 4 rows, the two streams): blocks of 4 weight rows by 3 rows of x, 2 for the
    last 2 or 4 (5 = 3 + 2, 7 = 3 + 2 + 2, 8 = 3 + 3 + 2, 10 = 3 + 3 + 2 + 2, 13 = 3 + 3 + 3 + 2 + 2, 32 = 10 x 3 + 2),
    K 32 to 96 one to three iterations of 32, N 44 several blocks whose next is prefetched and two that are not, N 1024
    ranges over two threads; K 48 and N 42 go the other way. Run at AVX2 (capped where the processor has AVX-512). x,
    weights and bias in [0.5, 1.5): each output is its own error bound, so a product left out or counted twice (1% of
    an output at K 96), a row of x or of weights in another's place, or one half of 16 weights taken for the other (odd
    elements for even ones), is far outside it."""
    run_under_isa("avx2", (
        "g = torch.Generator().manual_seed(0)\n"
        f"u = lambda *s: (0.5 + torch.rand(*s, generator=g, dtype=torch.float64)).to({dtype})\n"
        "for m in (3, 4, 5, 6, 7, 8, 9, 10, 13, 23, 24, 32, 33):\n"
        "  for n, k in ((44, 32), (44, 64), (44, 96), (1024, 64), (42, 64), (44, 48)):\n"
        "    x, w, b = u(m, k), u(n, k), u(n)\n"
        "    want = ref.linear(x.double(), w.double(), b.double())\n"
        "    err = ((pt.ops.linear(x, w, b).double() - want) / want).abs().max().item()\n"
        f"    assert err < {tol}, (m, n, k, err)"))


@pytest.mark.parametrize("dtype,rows,k", [(torch.float32, 8, 1063), (torch.float32, 6, 1400), (torch.float32, 5, 2000),
                                          (torch.bfloat16, 8, 2122), (torch.bfloat16, 3, 6000),
                                          (torch.bfloat16, 4, 4255)])
def test_x_in_chunks(dtype, rows, k):
    """x of more than 32 KiB (float32 in 5-8 rows, bfloat16 in 3-8 with AVX-512 BF16) goes by in chunks of K, 384 bytes
    of each weight row (96 float32, 192 bfloat16), 256 for up to 4 rows of x, over groups of 2 blocks (csrc/cpu/gemv.h,
    AVX-512), each row's lines prefetched on along it and into the next group's: 41 weight rows give each thread
    several groups and end in a group of one block of 1 row, and K ends in a chunk with a vector tail (K 1063, 2122 and
    4255: one shorter than a vector); every element against the reference, the bias as large as the sum of the
    products' magnitudes, so that a bias left out is off by about half its output's error bound."""
    weight, b = make(41, k, dtype=dtype)
    check(torch.randn(rows, k).to(dtype), weight, b * k)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("n", [1, 2, 5, 41, 150])
@pytest.mark.parametrize("dtype,k", [(torch.float32, 700), (torch.float16, 700), (torch.bfloat16, 700),
                                     (torch.float32, 9000)])
def test_weight_streams(dtype, k, n, rows):
    """While x is at most 32 KiB, or 48 for up to 4 rows (csrc/cpu/gemv.h, AVX-512), each thread reads its weight rows
    as two streams, its first and second halves, a row of each at a time, and the last row of an odd count alone: n =
    1, 2, 5 and 41 give threads one row, pairs with and without that last row, and (41) ranges of several blocks; 150
    more pairs than one call of the dot blocks takes (32 with 1, 2 or 8 rows of x); 16 rows of x (bfloat16: 22 KiB)
    go over each pair in two blocks of 8, each writing its own outputs.
    float32 at K = 9000: 1 row (35 KiB) streams too, 2 and 3 rows go in blocks of 4, 8 rows in chunks of K. Positive x
    and weights: each output is its own error bound, so a row left out or stored in another's place is 100% or a few %
    off."""
    weight, b = make(n, k, dtype=dtype)
    check(torch.rand(rows, k).to(dtype), weight.abs(), b)


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_weight_streams_taken_over_by_other_threads(rows):
    """A thread done with its range of the streams takes the last runs (32 pairs of rows, 8 rows of x: the whole
    range) of the others' (GemvRows::read_streams). With 6 threads on fewer cores, threads wait for a core and the
    others take over their runs, at random; every output stays bitwise the one thread's, for each weight width,
    over ranges of several runs, one run, and a last row alone."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for n, k in ((3000, 256), (6 * 4 * 33 + 1, 128), (4100, 64)):
            w = torch.randn(n, k)
            calls = [lambda x, w=w.to(torch.int8), s=torch.rand(n): ops.int8_linear(x, w, s)]
            calls += [lambda x, w=w.to(dtype), dtype=dtype: ops.linear(x.to(dtype), w)
                      for dtype in (torch.float32, torch.bfloat16)]
            x = torch.randn(rows, k)
            for call in calls:
                torch.set_num_threads(1)
                one = call(x)
                torch.set_num_threads(6)
                for _ in range(20):
                    assert torch.equal(call(x), one), (n, k, one.dtype)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def stream_prefetch():
    """pytransformer._C.cpu_stream_prefetch, set back to "auto" with its trials started over afterwards."""
    yield pytransformer._C.cpu_stream_prefetch
    pytransformer._C.cpu_stream_prefetch("auto")


def test_stream_prefetch_changes_no_result(stream_prefetch):
    """The few-rows kernel's two streams with and without software prefetch (csrc/cpu/stream_prefetch.h) give the
    same bits, for each weight width and 1 or 2 rows of x over weights of 512 KiB or more (the trial calls)."""
    torch.manual_seed(0)
    for rows in (1, 2):
        for dtype in (torch.float32, torch.bfloat16, torch.int8):
            w = torch.randn(700, 768)
            if dtype == torch.int8:
                call = lambda x, w=w.to(torch.int8), s=torch.rand(700): ops.int8_linear(x, w, s)  # noqa: E731
            else:
                call = lambda x, w=w.to(dtype): ops.linear(x.to(dtype), w)  # noqa: E731
            x = torch.randn(rows, 768)
            outs = []
            for mode in ("on", "off"):
                stream_prefetch(mode)
                outs.append(call(x))
            assert torch.equal(*outs), (rows, dtype)


def test_stream_prefetch_is_chosen_by_trials(stream_prefetch):
    """In mode "auto" the first 96 calls of a weight width over at least 512 KiB of weights are timed trials, half of
    them with each way, and then the faster way stays: a choice is made for bfloat16 (width 2) and none for the other
    widths; smaller calls are no trials; setting "auto" starts over; a mode other than auto, on and off is a
    ValueError naming it."""
    state = stream_prefetch("auto")
    assert state["mode"] == "auto" and all(state[w]["trials"] == 0 and state[w]["choice"] is None for w in (1, 2, 4))
    x, small, large = torch.randn(1, 256).bfloat16(), torch.randn(1000, 256).bfloat16(), torch.randn(1024, 256).bfloat16()
    for _ in range(100):
        ops.linear(x, small)  # 500 KiB
    assert stream_prefetch()[2]["trials"] == 0
    for _ in range(95):
        ops.linear(x, large)
    state = stream_prefetch()
    assert state[2]["trials"] == 95 and state[2]["choice"] is None
    ops.linear(x, large)
    state = stream_prefetch()
    assert state[2]["trials"] == 96 and state[2]["choice"] in ("none", "prefetch")
    assert state[2]["none_bytes_per_s"] > 0 and state[2]["prefetch_bytes_per_s"] > 0
    assert state[1]["choice"] is None and state[4]["choice"] is None
    assert stream_prefetch("auto")[2]["choice"] is None
    with pytest.raises(ValueError, match='mode: expected "auto", "on" or "off", got "fast"'):
        stream_prefetch("fast")


def test_layouts_and_edge_shapes(device):
    weight, b = make(24, 40, device)
    check(torch.randn(40, 6, device=device).t(), weight, b)  # transposed x
    check(torch.randn(3, 1, 40, device=device).expand(3, 4, 40), weight, b)  # expanded x
    check(torch.randn(5, 80, device=device)[:, ::2], weight, b)  # strided x
    check(torch.randn(40, device=device), weight, b)  # 1-d x
    check(torch.randn(2, 0, 40, device=device), weight, b)  # no rows
    check(torch.randn(5, 40, device=device), torch.randn(40, 24, device=device).t(), b)  # transposed weight
    check(torch.randn(5, 40, device=device), torch.randn(48, 40, device=device)[8:32], b)  # a row slice of a weight
    empty = ops.linear(torch.randn(3, 0, device=device), weight[:, :0], b)  # K = 0: the bias
    torch.testing.assert_close(empty, b.expand(3, 24))


def test_matches_f_linear_at_model_shapes():
    """A decoding step at GPT-2's LM-head width: the same result as F.linear within float32 rounding."""
    weight, b = make(50257 // 7, 768)
    x = torch.randn(1, 768)
    torch.testing.assert_close(ops.linear(x, weight, b), F.linear(x, weight, b), atol=1e-4, rtol=1e-4)


def test_opcheck(device):
    weight, b = make(16, 24, device)
    for x in (torch.randn(3, 24, device=device), torch.randn(2, 12, 24, device=device)):
        torch.library.opcheck(torch.ops.pytransformer.linear, (x, weight, b))
        torch.library.opcheck(torch.ops.pytransformer.linear, (x.requires_grad_(), weight.requires_grad_(), None))


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck(rows, bias):
    weight, b = make(5, 7, dtype=torch.float64, bias=bias)
    args = [t.requires_grad_(True) if t is not None else None for t in (torch.randn(2, rows, 7, dtype=torch.float64),
                                                                         weight, b)]
    assert torch.autograd.gradcheck(ops.linear, args)


def test_backward_matches_f_linear(device):
    """float32 gradients of the kernel path as F.linear's, and only for the inputs that need them."""
    weight, b = make(9, 13, device)
    x = torch.randn(2, 3, 13, device=device)
    ours = [t.clone().requires_grad_(True) for t in (x, weight, b)]
    theirs = [t.clone().requires_grad_(True) for t in (x, weight, b)]
    g = torch.randn(2, 3, 9, device=device)
    ops.linear(*ours).backward(g)
    F.linear(*theirs).backward(g)
    for a, t in zip(ours, theirs):
        torch.testing.assert_close(a.grad, t.grad)
    w = weight.clone().requires_grad_(True)  # x and bias without grad
    torch.testing.assert_close(torch.autograd.grad(ops.linear(x, w, b).sum(), [w])[0],
                               torch.autograd.grad(F.linear(x, w, b).sum(), [w])[0])


def test_no_grad_records_no_history(device):
    """Under no_grad an input that requires grad gives an output without history, equal to the recorded one's."""
    weight, b = make(16, 24, device)
    x = torch.randn(3, 24, device=device, requires_grad=True)
    with torch.no_grad():
        y = ops.linear(x, weight, b)
    assert not y.requires_grad and y.grad_fn is None
    recorded = ops.linear(x, weight, b)
    assert recorded.grad_fn is not None
    torch.testing.assert_close(y, recorded.detach())


@pytest.mark.parametrize("rows", [1, 30])
def test_compile(device, rows):
    weight, b = make(16, 24, device)
    x = torch.randn(2, rows, 24, device=device, requires_grad=True)
    fn = compiled(ops.linear)
    torch.testing.assert_close(fn(x, weight, b), ops.linear(x, weight, b))
    grad, = torch.autograd.grad(fn(x, weight, b).sum(), [x])
    torch.testing.assert_close(grad, torch.autograd.grad(F.linear(x, weight, b).sum(), [x])[0])


def test_compile_inductor():
    weight, b = make(16, 24)
    x = torch.randn(3, 24)
    torch.testing.assert_close(torch.compile(ops.linear, fullgraph=True)(x, weight, b), ops.linear(x, weight, b))


def test_bad_call_under_compile_names_the_argument():
    weight, b = make(4, 8)
    with pytest.raises(TRACING_ERROR, match="bias: expected shape"):
        compiled(ops.linear)(torch.randn(2, 8), weight, b[:3])


@pytest.mark.parametrize("where", WHERE)
def test_bad_input(where):
    device = "meta" if where == "meta" else "cpu"
    weight, b = make(4, 8, device)
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="weight: expected dtype"):
        ops.linear(x, weight.double(), b)
    with pytest.raises(ValueError, match="weight: expected"):
        ops.linear(x, weight.to(torch.int8), b)
    with pytest.raises(ValueError, match=r"weight: expected \[N, K\] with K = 8"):
        ops.linear(x, weight[:, :6], b)
    with pytest.raises(ValueError, match=r"weight: expected \[N, K\]"):
        ops.linear(x, weight[0], b)
    with pytest.raises(ValueError, match=r"bias: expected shape \[N\] = \[4\]"):
        ops.linear(x, weight, b[:3])
    with pytest.raises(ValueError, match="bias: expected dtype"):
        ops.linear(x, weight, b.double())
    with pytest.raises(ValueError, match="x: expected a float32"):
        ops.linear(x.long(), weight, b)
    with pytest.raises(ValueError, match="x: expected a tensor"):
        ops.linear(torch.tensor(1.0, device=device), weight, b)
    with pytest.raises(TypeError, match="weight: expected a tensor"):
        ops.linear(x, weight.tolist() if device == "cpu" else None, b)
    if device == "cpu":
        with pytest.raises(ValueError, match="weight: expected a tensor on cpu"):
            ops.linear(x, weight.to("meta"), b)


# ---- The CUDA glue (ATen's linear on the device): on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """linear's cases of pytransformer/check.py against float64 references on the CUDA target."""
    assert kernel_target.run(lambda c: c.check_linear(kernel_target.shapes(kc.LINEAR_SHAPES_QUICK, kc.LINEAR_SHAPES))) == []
