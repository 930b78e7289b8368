"""Correctness of every op's kernels on a device: `python -m pytransformer check [--device cuda|cpu] [--quick]`.

The kernel cases of every op, against float64 references, on shapes chosen to reach every path: the row
kernels (pack/scalar loads, sub-warp, warp and block row groups, rows streamed from memory, misaligned rows, masks of
every kind, causal rows with nothing visible), attention (forward out and lse, backward grad q/k/v over every mask,
GQA/MQA, odd and unequal head dims, Lq != Lk both ways, misaligned and strided operands), the KV-cache append and
split-KV decode, int8_linear (GEMV rows per block, split-K, tiled GEMM, 16-byte and byte weight loads), and linear
(on the CPU the streaming kernel's blocks of rows and the switch to GEMM; on CUDA it is ATen's). Outputs
are allocated over freed NaN-filled memory so unwritten elements show up as NaN.

int8_linear's references use x as the op's path on this processor sees it (reference.int8_linear_x: quantized
per row to 16 bits by the CPU kernel with integer dot products), so its bounds are those of float32 sums on every path.

Every compared output is checked as a whole (relative error within TOL) and row by row (each row of the last dim
within ROW_TOL, relative to its own size but not below the tensor's RMS row size), so that one wrong row among
thousands fails. The tests of tests/ops/test_<op>.py run these cases against the op namespace of the `kernel_target`
fixture (tests/conftest.py): the CUDA kernels on a GPU, or the same sources through the host emulator
(tools/cuda_emulator) on a CPU-only machine; `run` runs them against torch.ops.pytransformer on any device.
"""
import contextlib
import itertools
import re
from pathlib import Path

import torch

from pytransformer.ops import reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative error ||out - ref|| / ||ref|| allowed per dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Error of a float32 sum allowed relative to the magnitude of its terms.
SUM_TOL = 1e-6
# The worst row's error allowed (row_err), per dtype, and for sums relative to their terms' magnitudes.
ROW_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}
ROW_SUM_TOL = 1e-5

# [rows, n]: n reaches each geometry of common.cuh for float32 (4-element packs) and 16-bit types (8-element packs):
# 1..32 threads a row, block rows (64..512 threads), streaming (> 512 threads' worth), and odd n (scalar loads).
# The instantiation shapes reach the chunks a thread (row_config's iters) that the others do not: 65 (scalar, 4),
# 132 (float32 packs, 2; 16-bit scalar, 8), 260 (float32 packs, 4), 264 and 520 (16-bit packs, 2 and 4).
NORM_INSTANTIATION_SHAPES = [(3, 65), (3, 132), (3, 260), (3, 264), (3, 520)]
NORM_SHAPES = [(1, 1), (5, 3), (7, 8), (33, 64), (300, 100), (64, 768), (600, 1000), (40, 1001), (16, 4096),
               (9, 5120), (3, 8196), (4, 16384), (3, 16388), (2, 32776), (2, 40001)] + NORM_INSTANTIATION_SHAPES
NORM_SHAPES_QUICK = [(5, 3), (33, 64), (40, 1001), (16, 4096), (3, 8196), (2, 32776), (2, 40001)
                     ] + NORM_INSTANTIATION_SHAPES
# [B, H, Lq, Lk]; the instantiation shapes reach the chunks a thread that the others do not (8: packs, 1; 33 and
# 129: scalar, 2 and 8; 132, 260, 264: packs, 2 and 4), and 16392 streams 16-bit packs.
SOFTMAX_INSTANTIATION_SHAPES = [(1, 1, 2, n) for n in (8, 33, 129, 132, 260, 264)]
SOFTMAX_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (2, 2, 16, 64), (1, 2, 33, 77), (2, 1, 8, 1000), (1, 1, 4, 4096),
                  (1, 1, 3, 8192), (1, 1, 3, 8196), (1, 1, 2, 16388), (1, 1, 2, 16392), (1, 1, 2, 10001)
                  ] + SOFTMAX_INSTANTIATION_SHAPES
SOFTMAX_SHAPES_QUICK = [(2, 3, 5, 7), (1, 2, 33, 77), (1, 1, 4, 4096), (1, 1, 2, 16392), (1, 1, 2, 10001)
                        ] + SOFTMAX_INSTANTIATION_SHAPES
# kv_cache_append (B, Hkv, T, D, Dv, capacity): packed and odd head dims (scalar path), T = 1 and prefills (T = 70
# at D = 128: more new rows than a block copies, so several blocks along T).
APPEND_SHAPES = [(2, 3, 5, 64, 64, 20), (2, 2, 1, 37, 37, 9), (3, 2, 17, 128, 48, 40), (1, 1, 1, 8, 8, 1),
                 (2, 4, 70, 128, 128, 80)]
APPEND_SHAPES_QUICK = [(2, 2, 1, 37, 37, 9), (3, 2, 17, 128, 48, 40), (2, 4, 70, 128, 128, 80)]
# decode_attention (B, Hq, Hkv, T, D, Dv, capacity, window): MHA, GQA 4, MQA, T > 1 (several passes of query rows),
# odd D (scalar path), Dv != D, the largest head dim, windows, and caches long enough for several splits (3 splits
# of one row at Dv 37, in a window: an odd count of partial outputs before the split maxima and sums). Query rows a
# cache head (G * T) of 1, 2 and more: each a block's row count of its own.
# Short caches at head dims 16, 40, 100 and 256 with 1, 2 and 4 query rows a cache head, aligned and misaligned (each
# layout of check_decode), reach every instantiation of the split kernel: pack width, chunks a thread, rows a block.
DECODE_INSTANTIATION_SHAPES = [(1, m, 1, 1, d, d, 20, None) for d in (16, 40, 100, 256) for m in (1, 2)] + [
    (1, 4, 1, 1, d, d, 20, None) for d in (16, 100, 256)]
# Head dims 80 and 96 (5 and 6 vectors of 16 in a key row: the AVX-512 float32 kernel's instantiations for them);
# with 3 query rows a cache row and a full cache of 66, the first query row sees two whole blocks of 32 keys and
# nothing in the third, which the later rows see (a block with no visible key for a row).
DECODE_HEAD_DIM_SHAPES = [(1, 3, 1, 3, 80, 80, 66, None), (2, 4, 2, 2, 96, 64, 45, None)]
DECODE_SHAPES = [(2, 4, 4, 1, 64, 64, 50, None), (3, 8, 2, 1, 128, 128, 700, None), (2, 6, 1, 3, 37, 37, 90, None),
                 (2, 8, 2, 2, 128, 64, 300, 40), (2, 2, 2, 1, 256, 256, 200, None), (2, 4, 1, 4, 16, 16, 33, 5),
                 (2, 32, 8, 1, 128, 128, 1100, None), (2, 4, 2, 1, 40, 24, 1500, 700), (1, 1, 1, 1, 37, 37, 300, 260)
                 ] + DECODE_HEAD_DIM_SHAPES + DECODE_INSTANTIATION_SHAPES
DECODE_SHAPES_QUICK = [(3, 8, 2, 1, 128, 128, 700, None), (2, 6, 1, 3, 37, 37, 90, None),
                       (2, 8, 2, 2, 128, 64, 300, 40), (1, 1, 1, 1, 37, 37, 300, 260),
                       (2, 2, 1, 1, 16, 24, 40, None)] + DECODE_HEAD_DIM_SHAPES + DECODE_INSTANTIATION_SHAPES

# int8_linear (M, K, N): M reaches each rows-per-block of the GEMV (1, 2, 4, 8, 16) and the tiled GEMM (M > 64); K = 16
# and 4096 take 16-byte weight loads (4096: several K slices), K = 1, 15 and 4104 byte loads with a tail. The quick
# shapes reach each of them with 16-byte loads (and, misaligned, byte loads).
INT8_SHAPES = [(m, k, n) for m in (1, 2, 3, 7, 64, 200) for k in (1, 15, 16, 4096, 4104) for n in (1, 7, 512)]
INT8_SHAPES_QUICK = [(1, 4104, 512), (3, 15, 7), (1, 1, 1), (64, 16, 512), (16, 4096, 7), (200, 100, 130),
                     (1, 16, 7), (2, 16, 7), (3, 16, 7), (7, 16, 130), (65, 16, 7)]
# linear (M, K, N): on the CPU M reaches the streaming kernel's blocks of x rows (1, 3, 8), its calls of 32 rows
# (float32 and float16 above 32) and bfloat16's switch to GEMM (above 28 rows at small K, 8 rows at large K, or 2 rows
# without AVX-512 BF16); K and N full vectors and tails of both ISA widths.
LINEAR_SHAPES = [(m, k, n) for m in (1, 2, 3, 4, 5, 8, 32, 33) for k in (1, 15, 16, 768, 1100) for n in (1, 7, 130)]
LINEAR_SHAPES_QUICK = [(1, 1100, 130), (3, 15, 7), (1, 1, 1), (8, 768, 7), (32, 16, 130), (33, 100, 130)]



def poison(like: torch.Tensor, count: int = 4) -> None:
    """Leave freed blocks of the caching allocator filled with 0xff bytes (NaN as float32, float16 and bfloat16), so
    that outputs allocated next start as NaN."""
    bufs = [torch.full((like.numel() * 4 + 256,), 255, dtype=torch.uint8, device=like.device) for _ in range(count)]
    del bufs


# The tag of the cases that check_attention_cases runs again in deterministic mode.
DETERMINISTIC_TAG = " deterministic"


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """torch.use_deterministic_algorithms(on) inside the block, the mode as it was after it."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def rel_err(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor | None = None) -> float:
    """||out - ref|| / ||magnitude|| (default: ref)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if out.shape != ref.shape:
        return float("inf")
    if out.isnan().any() and not ref.isnan().any():
        return float("nan")
    magnitude = ref if magnitude is None else magnitude.double().cpu()
    return ((out - ref).norm() / magnitude.norm().clamp_min(1e-30)).item()


def row_err(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor | None = None) -> float:
    """The worst row (last dim) of ||out_r - ref_r|| / max(||m_r||, RMS of the nonzero ||m_r||), m = magnitude
    (default ref): each row against its own size, but no row held to less than the RMS size of the rows that have
    terms (a row whose values cancel to nearly zero cannot be held to a relative bound that its terms' rounding does
    not allow; rows that are exactly zero, such as the key gradients of keys no query sees, have no terms and do not
    lower that floor)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if out.shape != ref.shape:
        return float("inf")
    if out.isnan().any() and not ref.isnan().any():
        return float("nan")
    if out.numel() == 0:
        return 0.0
    magnitude = ref if magnitude is None else magnitude.double().cpu()
    width = ref.shape[-1] if ref.dim() else 1
    diff, mag = (out - ref).reshape(-1, width), magnitude.reshape(-1, width)
    norms = mag.norm(dim=-1)
    held = norms[norms > 0]
    floor = held.square().mean().sqrt() if held.numel() else norms.new_zeros(())
    return (diff.norm(dim=-1) / torch.maximum(norms, floor).clamp_min(1e-30)).max().item()


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


def masks(shape, dtype, device):
    """(name, mask) pairs: every mask kind and broadcast pattern."""
    b, h, lq, lk = shape
    keep = torch.rand(b, 1, lq, lk, device=device) > 0.3
    keep[..., 0, :] = False  # a fully removed row
    bias = torch.randn(b, h, lq, lk, device=device).to(dtype)
    bias[..., -1, : lk // 2] = float("-inf")
    return [
        ("none", None),
        ("bool [B,1,Lq,Lk]", keep),
        ("bool [Lk]", torch.rand(lk, device=device) > 0.5),
        ("bool [B,H,Lq,1]", torch.rand(b, h, lq, 1, device=device) > 0.2),
        ("bool transposed", (torch.rand(b, 1, lk, lq, device=device) > 0.3).transpose(-1, -2)),
        ("float [B,H,Lq,Lk]", bias),
        ("float [Lq,Lk]", torch.randn(lq, lk, device=device).to(dtype)),
    ]


# (B, Hq, Hkv, Lq, Lk, D, Dv): Lq = 1, Lk = 1, Lq != Lk both ways, odd D and Dv != D, D = 128, MQA and GQA 4, head
# dims past the tensor-core limit (SIMT only), lengths spanning several 32-key chunks.
ATTENTION_SHAPES = [(2, 4, 4, 1, 37, 64, 64), (2, 2, 1, 5, 1, 16, 16), (2, 4, 1, 19, 45, 33, 20),
                    (2, 8, 2, 70, 40, 128, 128), (1, 4, 1, 100, 260, 64, 64), (2, 4, 4, 257, 257, 80, 80),
                    (1, 2, 2, 33, 65, 256, 256), (1, 2, 1, 40, 50, 320, 136), (1, 1, 1, 9, 70, 512, 512),
                    (2, 6, 3, 130, 97, 96, 40)]
# Quick (the sanitizers, CI's emulator run): tensor-core head dims 32 (D 8, 16, 24), 64 and 128 (the issue's
# benchmark head dims), 224 (D 136, Dv 200: the backward's split head dim, dS K on 4 warps) and 256 (D 248: on 8);
# SIMT for D 33 and Dv 264.
ATTENTION_SHAPES_QUICK = [(2, 2, 2, 1, 37, 16, 16), (2, 2, 1, 5, 1, 8, 8), (2, 4, 1, 19, 45, 33, 20),
                          (2, 4, 2, 70, 23, 24, 24), (1, 2, 1, 6, 9, 136, 264), (1, 2, 1, 7, 20, 136, 200),
                          (1, 2, 1, 7, 20, 248, 256), (1, 2, 1, 9, 20, 64, 64), (1, 2, 1, 9, 20, 128, 128)]
ATTENTION_TILE_HEAD_DIMS = [32, 64, 96, 128, 160, 192, 224, 256]  # the tensor-core head-dim families


def attention_tiles(head_dim: int, gqa: bool) -> tuple:
    """(B, Hq, Hkv, Lq, Lk, D, Dv) over 2 query tiles (128 rows up to head dim 128, else 64) and 3 key tiles (64 keys
    up to head dim 128, else 32), each length a few rows past a whole number of tiles; with GQA, B = 2 (the masks' key
    lengths leave batch row 0 empty) and 3 query heads a K/V head, so that the backward's steps cross from one query
    head to the next several times and on an odd group."""
    block_m, block_n = (128, 64) if head_dim <= 128 else (64, 32)
    return ((2, 3, 1) if gqa else (1, 1, 1)) + (2 * block_m + 3, 3 * block_n + 5, head_dim, head_dim)


# (shape, mask, dtype, also in deterministic mode[, scale]; default scale D^-0.5). Several tiles on every tensor-core
# head-dim family: Lq over 2 query tiles and Lk over 3 key tiles (attention_tiles), so that the online softmax rescales
# across key tiles, the next tiles' K/V are prefetched into the other stage, the barriers that protect the stages
# matter, and full unmasked tiles take the clean-tile path; masked and not, GQA, and the deterministic dQ kernel; and
# a negative and a zero scale, with which clean tiles scale their scores before the row max (a positive scale goes
# into the exponent instead). The CI emulator run takes these besides the quick shapes.
ATTENTION_TILE_CASES = (
    [(attention_tiles(hd, False), "none", torch.bfloat16, False) for hd in ATTENTION_TILE_HEAD_DIMS] +
    [(attention_tiles(hd, False), "window+float", torch.float16, False) for hd in ATTENTION_TILE_HEAD_DIMS] +
    [(attention_tiles(hd, True), "causal+lengths+bool", torch.bfloat16, hd in (64, 256))
     for hd in ATTENTION_TILE_HEAD_DIMS] +
    [(attention_tiles(64, False), "causal", torch.bfloat16, True, -0.3),
     (attention_tiles(64, False), "none", torch.float16, False, 0.0)])
# The deterministic backward (the dQ kernel, and the dK/dV kernel without dQ atomics) of every head-dim family in
# both 16-bit dtypes, on one tile: with ATTENTION_TILE_CASES, every tensor-core kernel instantiation.
ATTENTION_DETERMINISTIC_CASES = [((1, 2, 1, 9, 20, hd, hd), "causal", dtype, True)
                                 for hd in ATTENTION_TILE_HEAD_DIMS for dtype in (torch.float16, torch.bfloat16)]


ATTENTION_MASKS = ["none", "causal", "window", "key_lengths", "bool [B,1,Lq,Lk]", "bool [Lk]", "bool transposed",
                   "float [B,Hq,Lq,Lk]", "float [Lq,Lk]", "float [B,1,1,Lk]", "causal+lengths+bool", "window+float"]
# Operand layouts: contiguous, misaligned (data one element past 16 bytes), strided (q a transposed view of
# [B, Lq, Hq, D], k expanded over the batch, v with a non-unit last-dim stride). The quick check runs every mask
# contiguous and these (mask, layout) pairs besides.
ATTENTION_LAYOUTS = ["contiguous", "misaligned", "strided"]
ATTENTION_LAYOUT_CASES_QUICK = [("none", "misaligned"), ("causal+lengths+bool", "misaligned"), ("none", "strided"),
                                ("float [B,Hq,Lq,Lk]", "strided")]


def attention_kwargs(kind, b, hq, lq, lk, dtype, device):
    """Keyword arguments of attention for one mask kind at [B, Hq, Lq, Lk], freshly random."""
    lengths = torch.randint(1, lk + 1, (b,), device=device)
    lengths[0] = 0  # a batch row that sees no key
    keep = torch.rand(b, 1, lq, lk, device=device) > 0.3
    keep[..., 0, :] = False  # a fully removed row
    bias = torch.randn(b, hq, lq, lk, device=device).to(dtype)
    bias[..., -1, : lk // 2] = float("-inf")
    padding = torch.randn(b, 1, 1, lk, device=device).to(dtype)  # an additive padding mask: -inf at hidden keys
    padding[torch.rand(b, 1, 1, lk, device=device) < 0.3] = float("-inf")
    return {
        "none": {},
        "causal": {"causal": True},
        "window": {"window": 5},
        "key_lengths": {"key_lengths": lengths.to(torch.int32)},
        "bool [B,1,Lq,Lk]": {"mask": keep},
        "bool [Lk]": {"mask": torch.rand(lk, device=device) > 0.5},
        "bool transposed": {"mask": (torch.rand(b, 1, lk, lq, device=device) > 0.3).transpose(-1, -2)},
        "float [B,Hq,Lq,Lk]": {"mask": bias},
        "float [Lq,Lk]": {"mask": torch.randn(lq, lk, device=device).to(dtype)},
        "float [B,1,1,Lk]": {"mask": padding},
        "causal+lengths+bool": {"causal": True, "key_lengths": lengths, "mask": keep},
        "window+float": {"window": 7, "mask": torch.randn(lq, lk, device=device).to(dtype)},
    }[kind]


def attention_args(kwargs: dict, scale: float) -> tuple:
    """The positional mask arguments and scale of ops.attention and its backward, from attention_kwargs' keywords."""
    return kwargs.get("mask"), kwargs.get("causal", False), kwargs.get("window"), kwargs.get("key_lengths"), scale


def attention_operands(shape, dtype, device, layout):
    """q, k, v with values of N(0, 1) rounded to dtype, in the given layout."""
    b, hq, hkv, lq, lk, d, dv = shape
    if layout == "strided":
        q = torch.randn(b, lq, hq, d, dtype=torch.float64).to(device, dtype).transpose(1, 2)
        k = torch.randn(1, hkv, lk, d, dtype=torch.float64).to(device, dtype).expand(b, hkv, lk, d)
        v = torch.randn(b, hkv, dv, lk, dtype=torch.float64).to(device, dtype).transpose(-1, -2)
        return q, k, v
    q, k, v = (torch.randn(*s, dtype=torch.float64).to(device, dtype)
               for s in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
    if layout == "misaligned":
        q, k, v = misaligned(q), misaligned(k), misaligned(v)
    return q, k, v


def layouts(t: torch.Tensor, extra: int = 3):
    """(name, tensor) pairs holding t's values [B, H, L, E]: contiguous, one element past a 16-byte boundary
    (scalar path), and a slice of a bigger buffer (strided, still 16-byte aligned rows when E allows)."""
    b, h, length, e = t.shape
    big = torch.empty(b, h + 1, length + extra, e, dtype=t.dtype, device=t.device)
    view = big[:, 1:, extra:]
    view.copy_(t)
    return [("contiguous", t.clone()), ("misaligned", misaligned(t)), ("slice", view)]


class KernelChecks:
    """The cases of every kernel run against `ops` (torch.ops.pytransformer, or the emulator's namespace) on tensors
    of `device`, the kernels being those of `kernel_device` (default `device`; "cuda" for the emulator's, which run on
    CPU tensors); the names of failed cases collect in `failures`."""

    def __init__(self, ops, device: str, kernel_device: str | None = None, dump: Path | None = None, dtypes=None):
        self.ops, self.device, self.kernel_device, self.failures = ops, device, kernel_device or device, []
        self.dtypes = list(DTYPES if dtypes is None else dtypes)  # the dtypes whose cases run
        self.stats = {}  # (op, dtype) -> [cases, failed, worst row error / its bound]
        # dump: where a failing comparison saves its case (see save_case); inputs: the case at hand's operands, set
        # by the cases that record them (attention, decode_attention)
        self.dump, self.inputs = dump, {}

    def save_case(self, name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
        """dump/NNN.pt: the failing comparison's name, output, float64 reference and the case's operands, all on the
        CPU (torch.load it to replay the case elsewhere, e.g. through the host emulator)."""
        self.dump.mkdir(parents=True, exist_ok=True)
        cpu = {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in self.inputs.items()}
        path = self.dump / f"{len(list(self.dump.glob('*.pt'))):03d}.pt"
        torch.save({"name": name, "out": out.detach().cpu(), "ref": ref.detach().cpu(), "inputs": cpu}, path)

    def record(self, name: str, ok: bool, row_ratio: float = 0.0) -> None:
        """One case of the op and dtype that `name` starts with and mentions; row_ratio: its worst row error over the
        bound."""
        dtype = re.search(r"\b(float32|float16|bfloat16)\b", name)
        stats = self.stats.setdefault((name.split()[0], dtype.group(1) if dtype else "-"), [0, 0, 0.0])
        stats[0] += 1
        stats[1] += not ok
        stats[2] = max(stats[2], row_ratio) if row_ratio == row_ratio else float("nan")  # NaN sticks
        if not ok and not any(f.startswith(name) for f in self.failures):
            self.failures.append(name)

    def check(self, name: str, out: torch.Tensor, ref: torch.Tensor, dtype, terms: torch.Tensor | None = None) -> None:
        """Passes within TOL[dtype] of ref as a whole and ROW_TOL[dtype] in every row, or, for sums given the sum of
        their terms' magnitudes `terms`, within float32 rounding of those (SUM_TOL, ROW_SUM_TOL: a sum may cancel to
        far below its terms: one dot product of 4096 terms has no other outputs to average that out)."""
        err, row = rel_err(out, ref), row_err(out, ref)
        ok = err <= TOL[dtype] and row <= ROW_TOL[dtype]  # NaN fails
        ratio = row / ROW_TOL[dtype]
        if not ok and terms is not None:
            sum_err, sum_row = rel_err(out, ref, terms), row_err(out, ref, terms)
            ok = sum_err <= SUM_TOL and sum_row <= ROW_SUM_TOL
            ratio = min(ratio, sum_row / ROW_SUM_TOL)
        if not ok:
            self.failures.append(f"{name}: rel err {err:.2e}, worst row {row:.2e}")
            if self.dump is not None:
                self.save_case(name, out, ref)
        self.record(name, ok, ratio)

    def check_norms(self, shapes) -> None:
        device, dtypes = self.device, self.dtypes
        for rows, n in shapes:
            for dtype in dtypes:
                for variant in ("affine", "plain", "misaligned"):
                    x64 = torch.randn(rows, n, dtype=torch.float64) * 3 + 1.5
                    w64 = torch.randn(n, dtype=torch.float64) if variant != "plain" else None
                    b64 = torch.randn(n, dtype=torch.float64) if variant != "plain" else None
                    g64 = torch.randn(rows, n, dtype=torch.float64)
                    to = (lambda t: None if t is None else t.to(device, dtype))  # noqa: E731
                    x, w, b, g = to(x64), to(w64), to(b64), to(g64)
                    if variant == "misaligned":
                        x, w, b, g = misaligned(x), misaligned(w), misaligned(b), misaligned(g)
                    # float64 references of the values the kernel sees (inputs rounded to dtype)
                    xr = x.double().cpu().requires_grad_()
                    wr = None if w is None else w.double().cpu().requires_grad_()
                    br = None if b is None else b.double().cpu().requires_grad_()
                    gr = g.double().cpu()
                    tag = f"[{rows}, {n}] {str(dtype)[6:]} {variant}"

                    poison(x)
                    y, mean, rstd = self.ops.layer_norm(x, w, b, 1e-5)
                    ref = reference.layer_norm(xr, wr, br, 1e-5)
                    self.check(f"layer_norm fwd {tag}", y, ref, dtype)
                    if variant == "plain" and n > 1:  # statistics for any offset: one element far from the mean
                        xs = x.clone()
                        xs[:, 0] = 1e4
                        self.check(f"layer_norm fwd x[:, 0] = 1e4 {tag}", self.ops.layer_norm(xs, None, None, 1e-5)[0],
                                   reference.layer_norm(xs.double().cpu()), dtype)
                    self.check(f"layer_norm mean {tag}", mean, xr.detach().mean(-1), torch.float32)
                    leaves = [t for t in (xr, wr, br) if t is not None]
                    grads = torch.autograd.grad(ref, leaves, gr)
                    poison(x)
                    dx, dw, db = self.ops.layer_norm_backward(g, x, mean, rstd, w, b is not None)
                    self.check(f"layer_norm bwd dx {tag}", dx, grads[0], dtype)
                    if w is not None:
                        self.check(f"layer_norm bwd dw {tag}", dw, grads[1], dtype)
                        self.check(f"layer_norm bwd db {tag}", db, grads[2], dtype)

                    poison(x)
                    y, rstd = self.ops.rms_norm(x, w, 1e-6)
                    ref = reference.rms_norm(xr, wr, 1e-6)
                    self.check(f"rms_norm fwd {tag}", y, ref, dtype)
                    leaves = [t for t in (xr, wr) if t is not None]
                    grads = torch.autograd.grad(ref, leaves, gr)
                    poison(x)
                    dx, dw = self.ops.rms_norm_backward(g, x, rstd, w)
                    if n > 1:  # n = 1: grad_x is eps-sized, 1 - xhat^2 cancels in any float32 evaluation
                        self.check(f"rms_norm bwd dx {tag}", dx, grads[0], dtype)
                    if w is not None:
                        self.check(f"rms_norm bwd dw {tag}", dw, grads[1], dtype)

    def check_softmax(self, shapes) -> None:
        device, dtypes = self.device, self.dtypes
        for shape in shapes:
            for dtype in dtypes:
                for causal, lq_shift in ((False, 0), (True, 0), (True, 3)):
                    # lq_shift > 0: more queries than keys, so the first causal rows see nothing
                    b, h, lq, lk = shape
                    lq += lq_shift
                    for mask_name, mask in masks((b, h, lq, lk), dtype, device):
                        scores = (torch.randn(b, h, lq, lk, dtype=torch.float64) * 4).to(device, dtype)
                        scale = 0.7
                        tag = f"[{b}, {h}, {lq}, {lk}] {str(dtype)[6:]} causal={causal} mask={mask_name}"
                        mref = None if mask is None else (mask if mask.dtype == torch.bool else mask.double()).cpu()
                        ref = reference.masked_softmax(scores.double().cpu(), mref, scale=scale, causal=causal)
                        poison(scores)
                        out = self.ops.masked_softmax(scores, mask, scale, causal)
                        self.check(f"masked_softmax fwd {tag}", out, ref, dtype)
                        g = torch.randn_like(out)
                        o64, g64 = out.double().cpu(), g.double().cpu()
                        gref = scale * o64 * (g64 - (g64 * o64).sum(-1, keepdim=True))
                        poison(scores)
                        grad = self.ops.masked_softmax_backward(g, out, scale)
                        if gref.norm() > 0:
                            self.check(f"masked_softmax bwd {tag}", grad, gref, dtype)
                        elif grad.ne(0).any():
                            self.record(f"masked_softmax bwd {tag}: expected zeros", False)
                if lq > 1:  # a NaN score and a +inf score make their rows NaN, as torch.softmax does
                    scores = torch.randn(b, h, lq, lk, dtype=torch.float64).to(device, dtype)
                    scores[0, 0, 0, lk // 2], scores[-1, -1, -1, lk - 1] = float("nan"), float("inf")
                    out = self.ops.masked_softmax(scores, None, 1.0, False)
                    self.check_nan_rows(f"masked_softmax NaN/inf rows [{b}, {h}, {lq}, {lk}] {str(dtype)[6:]}", out,
                                        torch.softmax(scores.double().cpu(), -1).isnan().any(-1))

    def check_nan_rows(self, name: str, out: torch.Tensor, nan_rows: torch.Tensor) -> None:
        """Exactly the rows (last dim) marked in nan_rows are NaN, wholly; NaN propagates as in torch."""
        isnan = out.isnan().cpu()
        if not (torch.equal(isnan.all(-1), nan_rows) and torch.equal(isnan.any(-1), nan_rows)):
            self.record(f"{name}: NaN rows {isnan.any(-1).nonzero().tolist()}, expected "
                        f"{nan_rows.nonzero().tolist()}", False)

    def check_finite_equal(self, name, out, ref) -> None:
        """out == ref where ref is -inf (rows that see nothing), relative error elsewhere (lse)."""
        out, ref = out.double().cpu(), ref.double().cpu()
        empty = torch.isneginf(ref)
        if not torch.equal(torch.isneginf(out), empty):
            self.record(f"{name}: -inf rows differ", False)
            return
        self.check(name, out[~empty], ref[~empty], torch.float32)

    def check_attention(self, shapes) -> None:
        device, dtypes = self.device, self.dtypes
        if shapes is ATTENTION_SHAPES_QUICK:
            cases = [(kind, "contiguous") for kind in ATTENTION_MASKS] + ATTENTION_LAYOUT_CASES_QUICK
        else:
            cases = [(kind, layout) for kind in ATTENTION_MASKS for layout in ATTENTION_LAYOUTS]
        for shape in shapes:
            b, hq, hkv, lq, lk, d, dv = shape
            for dtype in dtypes:
                for kind, layout in cases:
                    self.attention_case(shape, dtype, kind, layout)
                # NaN in the last query of row 0, head 0: that output row is NaN, the others are unchanged
                q, k, v = attention_operands(shape, dtype, device, "contiguous")
                q[0, 0, lq - 1, 0] = float("nan")
                nan_rows = torch.zeros(b, hq, lq, dtype=torch.bool)
                nan_rows[0, 0, lq - 1] = True
                self.check_nan_rows(f"attention NaN {list(shape)} {str(dtype)[6:]}",
                                    self.ops.attention(q, k, v, None, False, None, None, d ** -0.5)[0], nan_rows)

    def check_attention_cases(self, cases) -> None:
        """ATTENTION_TILE_CASES-like (shape, mask, dtype, deterministic too[, scale]): forward and backward; the
        backward again in deterministic mode (the dQ kernel without atomics) where marked."""
        for shape, kind, dtype, deterministic, *given in (c for c in cases if c[2] in self.dtypes):
            scale = given[0] if given else None
            self.attention_case(shape, dtype, kind, scale=scale)
            if deterministic:
                with deterministic_algorithms(True):
                    self.attention_case(shape, dtype, kind, tag=DETERMINISTIC_TAG, scale=scale)

    def attention_case(self, shape, dtype, kind: str, layout: str = "contiguous", tag: str = "",
                       scale: float | None = None) -> None:
        """One attention case: forward out and lse, backward grad q/k/v, against float64 references (scale: D^-0.5
        if None)."""
        device = self.device
        b, hq, hkv, lq, lk, d, dv = shape
        q, k, v = attention_operands(shape, dtype, device, layout)
        kwargs = attention_kwargs(kind, b, hq, lq, lk, dtype, device)
        tag = f"{list(shape)} {str(dtype)[6:]} {kind} {layout}{'' if scale is None else f' scale={scale}'}{tag}"
        scale = d ** -0.5 if scale is None else scale
        # float64 references of the values the kernels see (inputs rounded to dtype)
        ref_kwargs = {n: (a.double().cpu() if torch.is_tensor(a) and a.is_floating_point() else
                          a.cpu() if torch.is_tensor(a) else a) for n, a in kwargs.items()}
        qr, kr, vr = (t.double().cpu().requires_grad_() for t in (q, k, v))
        ref = reference.attention(qr, kr, vr, scale=scale, **ref_kwargs)
        lse_ref = torch.logsumexp(reference.attention_scores(qr.detach(), kr.detach(), scale=scale,
                                                             **ref_kwargs), -1)
        args = attention_args(kwargs, scale)
        self.inputs = {"q": q, "k": k, "v": v, **kwargs, "scale": scale}
        poison(q)
        out, lse = self.ops.attention(q, k, v, *args)
        self.check(f"attention fwd {tag}", out, ref, dtype)
        self.check_finite_equal(f"attention lse {tag}", lse, lse_ref)
        g = torch.randn(out.shape, dtype=torch.float64).to(device, dtype)
        grads_ref = torch.autograd.grad(ref, (qr, kr, vr), g.double().cpu())
        self.inputs.update(grad_out=g, out=out, lse=lse)
        poison(q)
        grads = self.ops.attention_backward(g, q, k, v, out, lse, *args)
        # A zero reference (rows that see one key: P = 1, dS = 0) is compared with rounding-level values at
        # the scale of |grad_out| * max|q, k, v|.
        zero_scale = g.double().norm().item() * max(t.detach().abs().max().item() for t in (qr, kr, vr))
        for name, grad, grad_ref in zip(("dq", "dk", "dv"), grads, grads_ref):
            if grad_ref.norm() > 0:
                self.check(f"attention bwd {name} {tag}", grad, grad_ref, dtype)
            elif grad.double().norm().item() > TOL[dtype] * zero_scale:
                self.record(f"attention bwd {name} {tag}: expected zeros", False)

    def check_kv_cache(self, shapes) -> None:
        """kv_cache_append: bit-exact against slice assignment; other cache rows untouched."""
        device, dtypes = self.device, self.dtypes
        for b, hkv, t, d, dv, cap in shapes:
            for dtype in dtypes:
                k0, v0 = (torch.randn(b, hkv, cap, e, dtype=torch.float64).to(device, dtype) for e in (d, dv))
                k_new, v_new = (torch.randn(b, hkv, t, e, dtype=torch.float64).to(device, dtype) for e in (d, dv))
                positions = torch.randint(0, cap - t + 1, (b,))
                positions[0] = cap - t  # the last rows of the cache
                expected_k, expected_v = k0.clone(), v0.clone()
                for i, p in enumerate(positions.tolist()):
                    expected_k[i, :, p:p + t], expected_v[i, :, p:p + t] = k_new[i], v_new[i]
                for (name, kc), (_, vc), (_, kn), (_, vn) in zip(layouts(k0), layouts(v0), layouts(k_new),
                                                                 layouts(v_new)):
                    self.ops.kv_cache_append(kc, vc, kn, vn, positions.to(device, torch.int32))
                    ok = torch.equal(kc, expected_k) and torch.equal(vc, expected_v)
                    self.record(f"kv_cache_append [B{b} Hkv{hkv} T{t} D{d} Dv{dv} cap{cap}] {str(dtype)[6:]} {name}",
                                ok)

    def check_decode(self, shapes) -> None:
        """decode_attention against float64 references, with a full row, an unused row (length 0) and random lengths."""
        device, dtypes = self.device, self.dtypes
        for b, hq, hkv, t, d, dv, cap, window in shapes:
            for dtype in dtypes:
                q = torch.randn(b, hq, t, d, dtype=torch.float64).to(device, dtype)
                k0, v0 = (torch.randn(b, hkv, cap, e, dtype=torch.float64).to(device, dtype) for e in (d, dv))
                lengths = torch.randint(t, cap + 1, (b,))
                lengths[0] = cap
                lengths[-1] = 0 if b > 1 else lengths[-1]
                ref = reference.decode_attention(q.double().cpu(), k0.double().cpu(), v0.double().cpu(), lengths,
                                                 window=window, scale=0.3)
                for (name, k), (_, v) in zip(layouts(k0), layouts(v0)):
                    self.inputs = {"q": q, "k": k, "v": v, "lengths": lengths, "scale": 0.3, "window": window}
                    poison(q)
                    out = self.ops.decode_attention(q, k, v, lengths.to(device), 0.3, window)
                    tag = (f"decode_attention [B{b} Hq{hq} Hkv{hkv} T{t} D{d} Dv{dv} cap{cap} w{window}] "
                           f"{str(dtype)[6:]} {name}")
                    self.check(tag, out, ref, dtype)
                # NaN in a query head of row 0 and in the last (visible) key of row 0's last KV head: NaN rows, as
                # attention gives; NaN in unused cache rows (past the length) changes nothing.
                qn, kn = q.clone(), k0.clone()
                qn[0, 0, 0, 0] = float("nan")
                kn[0, -1, cap - 1, 0] = float("nan")
                if b > 1:
                    kn[-1] = float("nan")  # length 0
                out = self.ops.decode_attention(qn, kn, v0, lengths.to(device), 0.3, window)
                nan_rows = torch.zeros(b, hq, t, dtype=torch.bool)
                nan_rows[0, 0, 0] = True
                nan_rows[0, hq - hq // hkv:, t - 1] = True  # the last query sees key cap - 1
                self.check_nan_rows(f"decode_attention NaN [B{b} Hq{hq} Hkv{hkv} T{t} cap{cap}] {str(dtype)[6:]}", out,
                                    nan_rows)

    def check_kv_device_checks(self, captured) -> None:
        """The values the kernels check themselves when the host cannot (graph capture): an append row whose positions
        do not fit writes nothing, a decode row with an out-of-range length gives zeros, the other rows are right.
        `captured(fn)` runs fn as it would run under capture and returns its result."""
        device = self.device
        k0, v0 = torch.randn(3, 2, 10, 8, device=device), torch.randn(3, 2, 10, 8, device=device)
        k_new, v_new = torch.randn(3, 2, 4, 8, device=device), torch.randn(3, 2, 4, 8, device=device)
        k, v = k0.clone(), v0.clone()
        positions = torch.tensor([7, 2, -1], device=device)  # made before the capture, which copies nothing host-side
        captured(lambda: self.ops.kv_cache_append(k, v, k_new, v_new, positions))
        expected_k, expected_v = k0.clone(), v0.clone()
        expected_k[1, :, 2:6], expected_v[1, :, 2:6] = k_new[1], v_new[1]
        ok = torch.equal(k, expected_k) and torch.equal(v, expected_v)
        if not ok:
            self.failures.append("kv_cache_append device check")
        q = torch.randn(3, 4, 2, 8, device=device)
        lengths = torch.tensor([11, 6, 1], device=device)  # over capacity, good, under T
        out = captured(lambda: self.ops.decode_attention(q, k0, v0, lengths, 0.5, None))
        ref = reference.decode_attention(q[1:2].double().cpu(), k0[1:2].double().cpu(), v0[1:2].double().cpu(),
                                         torch.tensor([6]), scale=0.5)
        self.check("decode_attention device check: good row", out[1:2], ref, torch.float32)
        ok = torch.equal(out[0::2], torch.zeros_like(out[0::2]))
        if not ok:
            self.failures.append("decode_attention device check")

    def check_kv_host_bounds(self) -> None:
        """Host-side bounds instead of reading the values back (max_position, max_length): the same results as without
        them; a bound past the capacity raises ValueError before anything is written; values that break the bound are
        caught by the kernels' own checks (the row is skipped / gives zeros)."""
        device = self.device
        k0, v0 = torch.randn(3, 2, 10, 8, device=device), torch.randn(3, 2, 10, 8, device=device)
        k_new, v_new = torch.randn(3, 2, 4, 8, device=device), torch.randn(3, 2, 4, 8, device=device)
        positions = torch.tensor([6, 0, 3], device=device)
        k, v, k_ref, v_ref = k0.clone(), v0.clone(), k0.clone(), v0.clone()
        self.ops.kv_cache_append(k, v, k_new, v_new, positions, 6)
        self.ops.kv_cache_append(k_ref, v_ref, k_new, v_new, positions)
        if not (torch.equal(k, k_ref) and torch.equal(v, v_ref)):
            self.failures.append("kv_cache_append with max_position")
        k, v = k0.clone(), v0.clone()
        try:
            self.ops.kv_cache_append(k, v, k_new, v_new, positions, 7)  # 7 + 4 > 10
            self.failures.append("kv_cache_append: max_position past the capacity did not raise")
        except ValueError as e:
            if "max_position" not in str(e) or not (torch.equal(k, k0) and torch.equal(v, v0)):
                self.failures.append(f"kv_cache_append: max_position error or written cache: {e}")
        q = torch.randn(3, 4, 1, 8, device=device)
        lengths = torch.tensor([10, 1, 7], device=device)
        out = self.ops.decode_attention(q, k0, v0, lengths, 0.5, None, 10)
        self.check("decode_attention with max_length", out, self.ops.decode_attention(q, k0, v0, lengths, 0.5, None),
                   torch.float32)
        try:
            self.ops.decode_attention(q, k0, v0, lengths, 0.5, None, 11)
            self.failures.append("decode_attention: max_length past the capacity did not raise")
        except ValueError as e:
            if "max_length" not in str(e):
                self.failures.append(f"decode_attention: max_length error: {e}")
        k = k0.clone()  # positions above the bound given: the kernel skips the row that does not fit
        self.ops.kv_cache_append(k, v0.clone(), k_new, v_new, torch.tensor([8, 0, 3], device=device), 6)
        if not (torch.equal(k[0], k0[0]) and torch.equal(k[1, :, :4], k_new[1])):
            self.failures.append("kv_cache_append: a row past a broken max_position was not skipped")

    def check_int8_linear(self, shapes) -> None:
        device, dtypes = self.device, self.dtypes
        for m, k, n in shapes:
            for dtype in dtypes:
                for variant in ("bias", "plain", "misaligned", "x8"):
                    # "bias": scale and bias in x's dtype; "plain": no bias, a float32 scale; "misaligned": x, weight,
                    # scale and a float32 bias each one element past a 16-byte boundary; "x8": as "plain", x_bits=8
                    # (x rounded to 8 bits by the glue).
                    x = torch.randn(m, k, dtype=torch.float64).to(device, dtype)
                    weight = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
                    sdtype = torch.float32 if variant in ("plain", "x8") else dtype
                    scale = (torch.rand(n, dtype=torch.float64) * 0.02 + 1e-3).to(device, sdtype)
                    bias = None
                    if variant in ("bias", "misaligned"):
                        bias_dtype = dtype if variant == "bias" else torch.float32
                        bias = torch.randn(n, dtype=torch.float64).to(device, bias_dtype)
                    if variant == "misaligned":
                        x, weight, scale, bias = misaligned(x), misaligned(weight), misaligned(scale), misaligned(bias)
                    x_bits = 8 if variant == "x8" else 16
                    x64 = reference.int8_linear_x(x, x_bits, self.kernel_device)  # as the op's path sees it
                    w64 = weight.double().cpu() * scale.double().cpu()[:, None]
                    b64 = torch.zeros(n, dtype=torch.float64) if bias is None else bias.double().cpu()
                    ref = x64 @ w64.t() + b64  # [M, N]
                    terms = x64.abs() @ w64.abs().t() + b64.abs()
                    poison(x)
                    out = self.ops.int8_linear(x, weight, scale, bias, x_bits)
                    self.check(f"int8_linear [M {m}, K {k}, N {n}] {str(dtype)[6:]} {variant}", out, ref, dtype, terms)

    def check_linear(self, shapes) -> None:
        for (m, k, n), dtype, variant in itertools.product(shapes, self.dtypes, ("bias", "plain", "misaligned")):
            # "misaligned": x, weight and bias each one element past a 16-byte boundary; "plain": no bias.
            x, weight, bias = (torch.randn(*shape, dtype=torch.float64).to(self.device, dtype)
                               for shape in ((m, k), (n, k), (n,)))
            bias = None if variant == "plain" else bias
            if variant == "misaligned":
                x, weight, bias = misaligned(x), misaligned(weight), misaligned(bias)
            x64, w64 = x.double().cpu(), weight.double().cpu()
            b64 = torch.zeros(n, dtype=torch.float64) if bias is None else bias.double().cpu()
            poison(x)
            out = self.ops.linear(x, weight, bias)
            self.check(f"linear [M {m}, K {k}, N {n}] {str(dtype)[6:]} {variant}", out, x64 @ w64.t() + b64, dtype,
                       x64.abs() @ w64.abs().t() + b64.abs())


def replay(case: dict, ops) -> list[tuple[str, float, float]]:
    """A case saved by `check --dump` (torch.load of DIR/NNN.pt) run again through `ops` (an op namespace whose
    kernels take CPU tensors: the CPU kernels, or the host emulator's CUDA kernels), against its float64 reference:
    (what, worst row error over its bound, relative error) for the saved output and for `ops`' own. For an attention
    gradient also `ops`' backward from the saved forward output and lse: when that one is within the bound and `ops`'
    own forward differs from the saved one, the saved failure came from the forward's output, not from the backward."""
    name, out, ref, i = case["name"], case["out"], case["ref"], case["inputs"]
    dtype = getattr(torch, re.search(r"\b(float32|float16|bfloat16)\b", name).group(1))

    def row(label, t):
        return label, row_err(t, ref) / ROW_TOL[dtype], rel_err(t, ref)
    rows = [row("saved output", out)]
    op, part = name.split()[:2]
    with deterministic_algorithms(name.endswith(DETERMINISTIC_TAG)):  # as check_attention_cases ran it
        if op == "attention":
            args = attention_args(i, i["scale"])
            fwd_out, lse = ops.attention(i["q"], i["k"], i["v"], *args)
            if part == "fwd":
                rows.append(row("replayed forward", fwd_out))
            elif part == "bwd":
                which = ("dq", "dk", "dv").index(name.split()[2])
                rows.append(row("replayed forward and backward", ops.attention_backward(
                    i["grad_out"], i["q"], i["k"], i["v"], fwd_out, lse, *args)[which]))
                rows.append(row("replayed backward of the saved forward", ops.attention_backward(
                    i["grad_out"], i["q"], i["k"], i["v"], i["out"], i["lse"], *args)[which]))
                rows.append(("saved forward output against the replayed one",
                             row_err(i["out"], fwd_out) / ROW_TOL[dtype], rel_err(i["out"], fwd_out)))
        elif op == "decode_attention":
            rows.append(row("replayed", ops.decode_attention(i["q"], i["k"], i["v"], i["lengths"], i["scale"],
                                                             i["window"])))
    return rows


# ---- python -m pytransformer check ----

# The ops that `run` can check, in its order: op -> its cases, given (checks, pick(short list, full list)).
OPS = {
    "norm": lambda c, pick: c.check_norms(pick(NORM_SHAPES_QUICK, NORM_SHAPES)),
    "masked_softmax": lambda c, pick: c.check_softmax(pick(SOFTMAX_SHAPES_QUICK, SOFTMAX_SHAPES)),
    "attention": lambda c, pick: (c.check_attention(pick(ATTENTION_SHAPES_QUICK, ATTENTION_SHAPES)),
                                  c.check_attention_cases(ATTENTION_TILE_CASES + ATTENTION_DETERMINISTIC_CASES)),
    "kv_cache_append": lambda c, pick: c.check_kv_cache(pick(APPEND_SHAPES_QUICK, APPEND_SHAPES)),
    "decode_attention": lambda c, pick: c.check_decode(pick(DECODE_SHAPES_QUICK, DECODE_SHAPES)),
    "int8_linear": lambda c, pick: c.check_int8_linear(pick(INT8_SHAPES_QUICK, INT8_SHAPES)),
    "linear": lambda c, pick: c.check_linear(pick(LINEAR_SHAPES_QUICK, LINEAR_SHAPES)),
}


def run(device: str, quick: bool = False, ops=None, dump: Path | None = None, dtypes=None) -> KernelChecks:
    """The cases of every op, or of the ops named in `ops` (keys of OPS), in every dtype or those in `dtypes`, against
    torch.ops.pytransformer on `device` (the quick shape lists with `quick`), from a fixed seed (so a subset's cases
    draw other inputs than the same cases in a full run); each failing comparison saved under `dump` if given."""
    torch.manual_seed(0)
    checks = KernelChecks(torch.ops.pytransformer, device, dump=dump, dtypes=dtypes)
    pick = (lambda short, full: short if quick else full)  # noqa: E731
    for op, cases in OPS.items():
        if ops is None or op in ops:
            checks.inputs = {}
            cases(checks, pick)
    return checks


def table(checks: KernelChecks) -> str:
    """A markdown table: op, dtype, cases, worst row error over its bound (1.0 is the bound), failed, pass/fail."""
    rows = ["| op | dtype | cases | worst row error / bound | failed | result |", "|---|---|---|---|---|---|"]
    for (op, dtype), (cases, failed, ratio) in sorted(checks.stats.items()):
        rows.append(f"| {op} | {dtype} | {cases} | {ratio:.3f} | {failed} | {'FAIL' if failed else 'pass'} |")
    return "\n".join(rows)

