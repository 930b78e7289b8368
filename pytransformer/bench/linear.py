"""ops.linear (and ops.int8_linear) against F.linear at the decoding shapes of GPT-2 small and a Llama-style ~124M
model, one and 8 rows, in float32, bfloat16 and int8 (weight-only, against F.linear on the float32 weight), and the
rows around the CPU's switch from the weight-streaming kernel to ATen's GEMM.

Decoding reads every weight of the model once per token, far more than the last-level cache holds, so each case
cycles through copies of its weight that together exceed the cache (COLD_BYTES): both ops read their weight from
memory, as in a model, rather than from a cache that a single small layer fits in. Throughput counts the weight bytes
(plus x and out); its fraction of the measured copy bandwidth is the kernel's efficiency."""
import itertools

import torch
import torch.nn.functional as F

from .. import ops
from ..nn.quantized import quantize_per_channel
from . import Row, interleaved_median_times, script_main

# (model, layer, out features N, in features K)
SHAPES = [("gpt2", "qkv", 2304, 768), ("gpt2", "attn out", 768, 768), ("gpt2", "mlp up", 3072, 768),
          ("gpt2", "mlp down", 768, 3072), ("gpt2", "lm head", 50257, 768),
          ("llama124m", "qkv gqa", 1152, 768), ("llama124m", "gate+up", 4096, 768),
          ("llama124m", "down", 768, 2048), ("llama124m", "lm head", 32000, 768)]
ROWS = (1, 8)
DTYPES = ("float32", "bfloat16", "int8")
# The crossover: rows of x at one layer shape (GPT-2's MLP up) around the CPU's switch to GEMM (csrc/cpu/linear.cpp:
# above 32 rows in float32, 2 in bfloat16).
CROSSOVER_SHAPE = ("gpt2", "mlp up", 3072, 768)
CROSSOVER_ROWS = (2, 3, 4, 16, 32, 33, 64)
COLD_BYTES = 256 << 20  # float weight bytes each case cycles through (8x a 32 MiB last-level cache; int8: 2x)


def bench_case(report, device, model, layer, n, k, m, dtype, runs, cold_bytes=COLD_BYTES):
    """One row: ours vs F.linear on the same cycle of float weight copies, enough to exceed `cold_bytes` (0: one
    copy); int8 quantizes each copy."""
    float_dtype = torch.float32 if dtype == "int8" else getattr(torch, dtype)
    count = -(-cold_bytes // (n * k * torch.finfo(float_dtype).bits // 8)) or 1  # int8: a quarter of cold_bytes
    weights = [torch.randn(n, k, device=device, dtype=float_dtype) * 0.02 for _ in range(count)]
    bias = torch.zeros(n, device=device, dtype=float_dtype)
    x = torch.randn(m, k, device=device, dtype=float_dtype)
    if dtype == "int8":
        quantized = [quantize_per_channel(w) for w in weights]
        ours = itertools.cycle([lambda q=q, s=s: ops.int8_linear(x, q, s, bias) for q, s in quantized])
        weight_bytes = n * k
    else:
        ours = itertools.cycle([lambda w=w: ops.linear(x, w, bias) for w in weights])
        weight_bytes = weights[0].numel() * weights[0].element_size()
    # F.linear starts half way round the cycle: the two ops take turns, and the copy that one has just read is still
    # cached when it is small; half the cycle away it has been evicted (for a single copy, there is nothing to offset).
    half = len(weights) // 2
    theirs = itertools.cycle([lambda w=w: F.linear(x, w, bias) for w in weights[half:] + weights[:half]])
    with torch.no_grad():
        t_ours, t_theirs = interleaved_median_times([lambda: next(ours)(), lambda: next(theirs)()], device, runs)
    report.add(Row("linear", f"{model} {layer} M{m} N{n} K{k} {dtype}", t_ours, t_theirs,
                   bytes=weight_bytes + x.element_size() * (x.numel() + m * n), variant=dtype))


def bench(report, device, shapes=SHAPES, rows=ROWS, dtypes=DTYPES, crossover_rows=CROSSOVER_ROWS, runs=15,
          cold_bytes=None):
    """Every (shape, rows, dtype) case, then the crossover rows at CROSSOVER_SHAPE in float32 and bfloat16; weights
    cycle through `cold_bytes` (default COLD_BYTES on the CPU, one copy on a GPU, whose cache is small)."""
    if cold_bytes is None:
        cold_bytes = COLD_BYTES if torch.device(device).type == "cpu" else 0
    for (model, layer, n, k), dtype, m in itertools.product(shapes, dtypes, rows):
        bench_case(report, device, model, layer, n, k, m, dtype, runs, cold_bytes)
    model, layer, n, k = CROSSOVER_SHAPE
    for dtype, m in itertools.product(("float32", "bfloat16"), crossover_rows):
        bench_case(report, device, model, layer, n, k, m, dtype, runs, cold_bytes)


def main(argv=None):
    script_main(__doc__, "linear benchmark", bench, argv, runs=15, dtype=False)
