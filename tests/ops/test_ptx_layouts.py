"""The layout oracle of the tensor-core primitives: the fragment tables of the PTX ISA ("Matrix fragments for
mma.m16n8k16 with floating point type", "ldmatrix"), written out here from the ISA's own formulas, against the
primitives of csrc/cuda/mma.cuh through the probe ops of tools/ptx_probes.cu (the `ptx` fixture), exhaustively: every
(lane, register, half) of A, B, C/D of mma.sync m16n8k16 .row.col f16 and bf16, ldmatrix .x1/.x2/.x4 with and without
.trans with the rows given in a shuffled order, and cp.async's zero fill. On a GPU the instructions themselves run:
the check that the tables (and so the emulator, and the kernels' fragment loaders) match the hardware. Through the
emulator the host bodies of tools/cuda_emulator/ptx.h run: the check that they match the tables."""
import pytest
import torch

pytestmark = pytest.mark.cuda


# The PTX ISA's tables for m16n8k16 with .f16/.bf16 inputs and .f32 accumulators. groupID = laneid >> 2,
# threadID_in_group = laneid % 4; element i of a thread's fragment is register i // 2, half i % 2 (a register holds
# two 16-bit elements, the lower index in the low half).
def a_row_col(lane: int, i: int) -> tuple[int, int]:
    """A (16x16, .row), elements a0..a7."""
    group, tig = lane >> 2, lane % 4
    row = group if i < 2 or 4 <= i < 6 else group + 8
    col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_row_col(lane: int, i: int) -> tuple[int, int]:
    """B (16x8, .col), elements b0..b3."""
    group, tig = lane >> 2, lane % 4
    return tig * 2 + (i & 1) + (8 if i >= 2 else 0), group


def cd_row_col(lane: int, i: int) -> tuple[int, int]:
    """C and D (16x8, float32), elements c0..c3 (one register each)."""
    group, tig = lane >> 2, lane % 4
    return group + (8 if i >= 2 else 0), tig * 2 + (i & 1)


def bits16(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 16-bit patterns of x in dtype, as int64 in [0, 65536)."""
    return x.to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF


def pack(values: torch.Tensor, table, n_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """Registers [32, n_elements // 2] holding matrix `values` laid out by `table`."""
    bits = bits16(values, dtype)
    regs = torch.zeros(32, n_elements // 2, dtype=torch.int64)
    for lane in range(32):
        for i in range(n_elements):
            r, c = table(lane, i)
            regs[lane, i // 2] |= bits[r, c] << (16 * (i % 2))
    return regs


def test_table_coverage():
    """Each table maps the 32 lanes' elements one to one onto its matrix."""
    for table, n, shape in ((a_row_col, 8, (16, 16)), (b_row_col, 4, (16, 8)), (cd_row_col, 4, (16, 8))):
        cells = {table(lane, i) for lane in range(32) for i in range(n)}
        assert cells == {(r, c) for r in range(shape[0]) for c in range(shape[1])}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mma_m16n8k16_layouts(ptx, dtype):
    # Small integers: every product and sum is exact in float32, so D must equal A B + C bit for bit. Random values
    # tell every element apart; a one-hot A per element then pins each (lane, register, half) of A on its own.
    gen = torch.Generator().manual_seed(0)
    for trial in range(4):
        a = torch.randint(-8, 9, (16, 16), generator=gen).double()
        b = torch.randint(-8, 9, (16, 8), generator=gen).double()
        c = torch.randint(-64, 65, (16, 8), generator=gen).double()
        c_regs = torch.tensor([[c[cd_row_col(lane, i)] for i in range(4)] for lane in range(32)], dtype=torch.float32)
        d_regs = ptx.probe_mma(pack(a, a_row_col, 8, dtype), pack(b, b_row_col, 4, dtype), c_regs,
                               dtype == torch.bfloat16)
        d = a @ b + c
        expected = torch.tensor([[d[cd_row_col(lane, i)] for i in range(4)] for lane in range(32)], dtype=torch.float32)
        assert torch.equal(d_regs, expected), f"trial {trial}: D differs at (lane, reg) {(d_regs != expected).nonzero()}"
    b = torch.arange(128, dtype=torch.float64).reshape(16, 8) + 1  # distinct columns: a row of B names its k
    zeros = torch.zeros(32, 4, dtype=torch.float32)
    b_regs = pack(b, b_row_col, 4, dtype)
    for row in range(16):
        for k in range(16):
            a = torch.zeros(16, 16, dtype=torch.float64)
            a[row, k] = 1
            d = ptx.probe_mma(pack(a, a_row_col, 8, dtype), b_regs, zeros, dtype == torch.bfloat16)
            expected = torch.zeros(16, 8, dtype=torch.float64)
            expected[row] = b[k]
            exp_regs = torch.tensor([[expected[cd_row_col(lane, i)] for i in range(4)] for lane in range(32)],
                                    dtype=torch.float32)
            assert torch.equal(d, exp_regs), f"A element ({row}, {k})"


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_layouts(ptx, num, trans):
    # Shared memory of 64 rows of 8 distinct 16-bit values; lanes 8i..8i+7 give the rows of matrix i (in a shuffled
    # order, so that which lane gives which row matters); lanes past 8 * num give rows that must be ignored.
    gen = torch.Generator().manual_seed(num + 8 * trans)
    smem = torch.arange(64 * 8, dtype=torch.int64).reshape(64, 8) * 7 + 1
    rows = torch.randperm(64, generator=gen)[:32]
    regs = ptx.probe_ldmatrix(smem.to(torch.int16), rows, num, trans)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(num):
            matrix = smem[rows[8 * i:8 * i + 8]]  # [8 rows, 8 columns] as the lanes 8i..8i+7 addressed them
            if trans:
                matrix = matrix.T
            lo, hi = int(matrix[group, 2 * tig]), int(matrix[group, 2 * tig + 1])
            assert int(regs[lane, i]) == lo | hi << 16, f"lane {lane} matrix {i}"


def test_cp_async_copies_valid_chunks_and_zero_fills_the_rest(ptx):
    """cp.async.cg 16 bytes with src-size 16 copies the chunk; with src-size 0 it writes 16 zero bytes (over shared
    memory that held 0xff bytes), and the data is there after commit, wait and a barrier."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(1, 256, (96, 16), dtype=torch.uint8, generator=gen)  # no zero bytes: a fill shows
    valid = torch.rand(96, generator=gen) < 0.5
    out = ptx.probe_cp_async(src, valid)
    assert torch.equal(out[valid], src[valid])
    assert torch.equal(out[~valid], torch.zeros_like(src[~valid]))
