"""ops.int8_linear against F.linear on the float weight, for GPT-2-small layer shapes and a 4096 x 4096 layer."""
import torch
import torch.nn.functional as F

from .. import ops
from ..nn.quantized import quantize_per_channel
from . import Row, interleaved_median_times, script_main

# (rows M, out features N, in features K, dtype): GPT-2 small's LM head and MLP input at one decoding row, 8 rows (a
# batch of 8 decoding) and a 512-token prefill in float32; a 4096 x 4096 layer decoding 1 and 8 rows in bfloat16 (the
# weight-bound case: int8 reads half the bytes of the bfloat16 weight).
OP_CASES = [(1, 50257, 768, torch.float32), (1, 3072, 768, torch.float32), (8, 50257, 768, torch.float32),
            (8, 3072, 768, torch.float32), (512, 3072, 768, torch.float32), (1, 4096, 4096, torch.bfloat16),
            (8, 4096, 4096, torch.bfloat16)]


def bench(report, device, cases=OP_CASES, runs=20):
    """int8_linear vs F.linear with the float weight; bytes = int8 weight + x + out (ours), FLOPs for many rows."""
    for m, n, k, dtype in cases:
        weight = torch.randn(n, k, device=device, dtype=dtype) * 0.02
        q, scale = quantize_per_channel(weight)
        bias = torch.zeros(n, device=device, dtype=dtype)
        x = torch.randn(m, k, device=device, dtype=dtype)
        with torch.no_grad():
            ours, theirs = interleaved_median_times([lambda: ops.int8_linear(x, q, scale, bias),
                                                     lambda: F.linear(x, weight, bias)], device, runs)
        report.add(Row("int8_linear", f"M{m} N{n} K{k} {str(dtype)[6:]}", ours, theirs,
                       bytes=q.numel() + x.element_size() * (x.numel() + m * n),
                       flops=2 * m * n * k if m > 16 else 0.0))


def main(argv=None):
    script_main(__doc__, "int8_linear benchmark", bench, argv, runs=20, dtype=False, flops=True)
