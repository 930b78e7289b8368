"""ops.linear (and ops.int8_linear) against F.linear at the decoding shapes of GPT-2 small, a Llama-style ~124M model
and the widest layer input of a 7B Llama (its MLP down projection, K = 11008), one and 8 rows, in float32, bfloat16 and
int8 (weight-only, and int8-x8 with x quantized to 8 bits too, both against F.linear on the float32 weight), and the
rows around the CPU's switch from the weight-streaming kernel to a GEMM (ours or ATen's).

Decoding reads every weight of the model once per token, far more than the last-level cache holds, so each case cycles
through copies of its weight that together exceed the cache many times (COLD_BYTES): both ops read their weight from
memory, as in a model, rather than from a cache that a single small layer fits in. Throughput counts the weight bytes
(plus x and out). "Of ceiling" is the roofline: at one row the product is memory-bound, held to the bandwidth of
PyTorch's own read stream over the same weight bytes (a sum of their float32 view), timed in turns with the two ops so
that the memory bandwidth a shared host gives at that moment is in both (each timed call after an untimed one of the
same op on the next copy, as a model's layers follow each other: LEAD); with more rows it does 2 M FLOPs per weight and
can be compute-bound, held to the matmul ceiling of its dtype (float32 for the int8 rows, which compute in float32). The
record's notes also hold every case of ROWS against the copy bandwidth (read + write) measured just before the case, per
dtype, with what bounds it besides memory: the fraction that our fixed cost of a call leaves (the same call with 4
output features) and the one that the call's time with its weight in cache leaves (its compute), and against the read
anchor: on a host whose bandwidth moves within a case, only the read anchor, timed in turns, holds. (A large copy
timed in turns instead slows the case after it: benchmarks/results/cpu_kernel_notes_2026-11-28.md, bench.)"""
import itertools

import torch
import torch.nn.functional as F

from .. import ops
from . import (COLD_BYTES, Row, cold_copies, copy_bandwidth, interleaved_median_times, matmul_ceiling,
               read_bandwidth, script_main)

# (model, layer, out features N, in features K)
SHAPES = [("gpt2", "qkv", 2304, 768), ("gpt2", "attn out", 768, 768), ("gpt2", "mlp up", 3072, 768),
          ("gpt2", "mlp down", 768, 3072), ("gpt2", "lm head", 50257, 768),
          ("llama124m", "qkv gqa", 1152, 768), ("llama124m", "gate+up", 4096, 768),
          ("llama124m", "down", 768, 2048), ("llama124m", "lm head", 32000, 768), ("llama7b", "down", 4096, 11008)]
ROWS = (1, 8)
DTYPES = ("float32", "bfloat16", "int8", "int8-x8")  # int8-x8: int8_linear with x_bits=8
# The crossovers: rows of x at a layer shape around the CPU's switch from the kernel to a GEMM (csrc/cpu/linear.cpp),
# as (shape, dtypes, rows). GPT-2's MLP up: bfloat16 with AVX-512 BF16 takes ATen's GEMM above 28 rows at this K;
# float32 with AVX-512 takes the kernel up to 32 rows and its GEMM from 33 (cpu_linear_rows_2026-12-05_xeon.md). With
# AVX2 both take the kernel at every row count, its GEMM from 24 rows. At the baseline level they take the kernel up to
# 64 rows, then ATen's GEMM (bfloat16: on widened weight blocks).
# The 7B MLP down projection (K 11008) and the Llama-124M MLP at prefill lengths: the GEMMs against ATen's (int8: with
# AVX2 the GEMM on the widened weight, with AVX-512 VNNI integer dot products 8 rows a call; csrc/cpu/int8_linear.cpp).
CROSSOVERS = [(("gpt2", "mlp up", 3072, 768), ("float32", "bfloat16"),
               (2, 3, 4, 5, 8, 16, 23, 24, 28, 29, 32, 33, 47, 48, 64, 65)),
              (("llama7b", "down", 4096, 11008), ("float32",), (64, 65, 128, 256)),
              (("llama124m", "gate+up", 4096, 768), ("float32", "bfloat16", "int8"), (128, 512, 1024)),
              (("llama124m", "down", 768, 2048), ("float32", "bfloat16", "int8"), (128, 512, 1024))]
# Untimed calls (each on the next cold copy) before each timed one, in every turn: a call right after F.linear's GEMM
# at 8 rows is slower (cpu_kernel_notes_2026-11-28.md, bench), a state that F.linear leaves behind for the next op and
# that a model's back-to-back layers never see.
LEAD = 1
FIXED_N, FIXED_RUNS = 4, 200  # the output features and runs of the call that gives a case's fixed cost
CACHED_BYTES = 1 << 19  # the weight bytes of the call that gives a case's time with its weight in cache
def bench_case(report, device, model, layer, n, k, m, dtype, runs, cold_bytes=COLD_BYTES, ceiling_flops_s=0.0):
    """One row: ours vs F.linear, each cycling through weight copies that span `cold_bytes` (0: one copy); int8 rows
    time ops.int8_linear on int8 copies against F.linear on float32 copies. `ceiling_flops_s`: the row's compute
    ceiling when not the report's. Returns (read, fixed, cached): the read anchor's time (timed in turns with the
    case), and our times of the case's call besides reading its weight from memory: fixed, the same call with FIXED_N
    output features; cached, the call with its weight in cache, estimated from the first rows of one copy
    (CACHED_BYTES of them, called repeatedly, so in L2) as fixed plus their time beyond it scaled to all rows."""
    float_dtype = torch.float32 if dtype.startswith("int8") else getattr(torch, dtype)
    weights = cold_copies((n, k), float_dtype, device, cold_bytes)
    bias = torch.zeros(n, device=device, dtype=float_dtype)
    x = torch.randn(m, k, device=device, dtype=float_dtype)
    if dtype.startswith("int8"):
        scale, x_bits = torch.rand(n, device=device) * 1e-3, 8 if dtype == "int8-x8" else 16
        ours_weights = cold_copies((n, k), torch.int8, device, cold_bytes)
        call = lambda q, s=scale, b=bias: ops.int8_linear(x, q, s, b, x_bits=x_bits)  # noqa: E731
        ours = itertools.cycle([lambda q=q: call(q) for q in ours_weights])
        first = lambda rows: (ours_weights[0][:rows], scale[:rows], bias[:rows])  # noqa: E731
    else:
        ours_weights = weights
        call = lambda w, b=bias: ops.linear(x, w, b)  # noqa: E731
        ours = itertools.cycle([lambda w=w: call(w) for w in weights])
        first = lambda rows: (weights[0][:rows], bias[:rows])  # noqa: E731
    weight_bytes = ours_weights[0].numel() * ours_weights[0].element_size()
    # F.linear starts half way round the cycle: the two ops take turns, and the copy that one has just read is still
    # cached when it is small; half the cycle away it has been evicted (for a single copy, there is nothing to offset).
    half = len(weights) // 2
    theirs = itertools.cycle([lambda w=w: F.linear(x, w, bias) for w in weights[half:] + weights[:half]])
    # The read anchor: a sum over the bytes that ours reads (its copies' float32 view), a quarter of the cycle away.
    views = [w.view(-1)[: w.numel() - w.numel() % (4 // w.element_size())].view(torch.float32) for w in ours_weights]
    quarter = len(views) // 4
    read = itertools.cycle([lambda v=v: v.sum() for v in views[quarter:] + views[:quarter]])
    with torch.no_grad():
        t_ours, t_theirs, t_read = interleaved_median_times(
            [lambda: next(ours)(), lambda: next(theirs)(), lambda: next(read)()], device, runs, lead=LEAD)
        cached_rows = max(FIXED_N, min(n, CACHED_BYTES * n // weight_bytes))
        small, cached = first(FIXED_N), first(cached_rows)
        fixed, part = interleaved_median_times([lambda: call(*small), lambda: call(*cached)], device, FIXED_RUNS)
    report.add(Row("linear", f"{model} {layer} M{m} N{n} K{k} {dtype}", t_ours, t_theirs,
                   bytes=weight_bytes + x.element_size() * (x.numel() + m * n), flops=2 * m * n * k, variant=dtype,
                   ceiling_flops_s=ceiling_flops_s, ceiling_bytes_s=weight_bytes / t_read))
    return t_read, fixed, fixed + max(0.0, part - fixed) * n / cached_rows


def bench(report, device, shapes=SHAPES, rows=ROWS, dtypes=DTYPES, crossovers=CROSSOVERS, runs=15, cold_bytes=None):
    """Every (shape, rows, dtype) case, then the crossovers' rows (see CROSSOVERS); weights cycle through `cold_bytes`
    (default COLD_BYTES on the CPU, one copy on a GPU, whose cache is small)."""
    if cold_bytes is None:
        cold_bytes = COLD_BYTES if torch.device(device).type == "cpu" else 0
    if cold_bytes:
        read = read_bandwidth(device)
        report.notes.append(f"read bandwidth of a PyTorch reduction (a sum of 1 GiB): {read / 1e9:.1f} GB/s")
    x, w, b = (torch.randn(*shape, device=device) for shape in ((1, 16), (4, 16), (4,)))
    with torch.no_grad():
        fixed = interleaved_median_times([lambda: ops.linear(x, w, b), lambda: F.linear(x, w, b)], device, 200)
    report.notes.append(f"fixed cost of a call (float32, M1 N4 K16): ours {fixed[0] * 1e6:.1f} us, F.linear "
                        f"{fixed[1] * 1e6:.1f} us")
    bf16_flops_s = matmul_ceiling(device, torch.bfloat16)  # the compute ceiling of the bfloat16 rows
    report.notes.append(f"matmul ceiling in bfloat16 (the bfloat16 rows' compute ceiling): {bf16_flops_s / 1e9:.0f} "
                        "GFLOP/s")
    ceilings = {"bfloat16": bf16_flops_s}
    cases = list(itertools.product(shapes, dtypes, rows))
    measured = len(cases)  # those whose notes say what bounds them (the crossover repeats some of them)
    cases += [(shape, dtype, m) for shape, types, counts in crossovers for dtype, m in itertools.product(types, counts)]
    bounds = {}  # case -> (the copy bandwidth measured just before it, the read's, our fixed and cached times)
    for i, ((model, layer, n, k), dtype, m) in enumerate(cases):
        # the host's bandwidth can move within a run, so each case has its own measurement
        copy_bytes_s = copy_bandwidth(device) if report.ceiling_bytes_s and i < measured else 0.0
        times = bench_case(report, device, model, layer, n, k, m, dtype, runs, cold_bytes, ceilings.get(dtype, 0.0))
        bounds.setdefault(report.rows[-1].case, (copy_bytes_s, *times))
    if report.ceiling_bytes_s:  # every case of `rows` against the copy bandwidth measured just before it
        copies = [b[0] for b in bounds.values() if b[0]]
        report.notes.append(f"copy bandwidth measured again before each case: {min(copies) / 1e9:.1f} to "
                            f"{max(copies) / 1e9:.1f} GB/s, and at the end: {copy_bandwidth(device) / 1e9:.1f} GB/s")
        for dtype, m in itertools.product(dtypes, rows):
            fractions = {}  # layer -> fractions (see the note)
            for r in report.rows:
                if r.op == "linear" and r.variant == dtype and f" M{m} " in r.case and bounds[r.case][0]:
                    copy_bytes_s, t_read, fixed, cached = bounds[r.case]
                    at_copy = r.bytes / copy_bytes_s  # the call's time at the copy bandwidth
                    fractions[r.case.split(f" M{m} ")[0]] = (at_copy / r.ours_s, at_copy / (at_copy + fixed),
                                                             min(1.0, at_copy / cached), t_read / r.ours_s)
            if fractions:
                report.notes.append(
                    f"{dtype}, {m} row{'s' if m > 1 else ''}, of the copy bandwidth measured just before the case (in "
                    f"brackets, the most that our time besides the weight's reads leaves: the call's time at that "
                    f"bandwidth over it plus the fixed cost of the call, the same call at N = {FIXED_N}; and over the "
                    f"call's time with its weight in cache; after the semicolon, the read anchor's time over ours, "
                    f"the read timed in turns with the case): " +
                    ", ".join(f"{layer} {f:.0%} ({fixed:.0%}, {cached:.0%}; {read:.0%})"
                              for layer, (f, fixed, cached, read) in fractions.items()))


def main(argv=None):
    script_main(__doc__, "linear benchmark", bench, argv, runs=15, dtype=False, flops=True)
