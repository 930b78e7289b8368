"""LayerNorm / RMSNorm: ours vs F.layer_norm / F.rms_norm, forward and backward."""
import argparse
import sys

import torch
import torch.nn.functional as F

from .. import ops
from . import Row, interleaved_median_times, new_report, record

SHAPES = [(8192, 1024), (4096, 4096), (16384, 768), (8192, 1000), (4096, 5120)]


def bench_one(report, op, shape, dtype, device, runs=30):
    """Forward and backward of one norm at one shape [M, N]; appends two rows to `report`."""
    m, n = shape
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    if op == "layer_norm":
        ours, theirs, leaves = (lambda: ops.layer_norm(x, w, b)), (lambda: F.layer_norm(x, (n,), w, b)), [x, w, b]
    else:
        ours, theirs, leaves = (lambda: ops.rms_norm(x, w)), (lambda: F.rms_norm(x, (n,), w, 1e-6)), [x, w]
    case = f"{m}x{n} {str(dtype)[6:]}"
    with torch.no_grad():
        report.add(Row(op, case + " fwd", *interleaved_median_times([ours, theirs], device, runs),
                       bytes=2 * x.numel() * x.element_size(), variant="fwd"))
    g = torch.randn_like(x)
    y_ours, y_theirs = ours(), theirs()
    back = lambda y: lambda: torch.autograd.grad(y, leaves, g, retain_graph=True)  # noqa: E731
    report.add(Row(op, case + " bwd", *interleaved_median_times([back(y_ours), back(y_theirs)], device, runs),
                   bytes=3 * x.numel() * x.element_size(), variant="bwd"))


def bench(report, device, dtype=torch.float32, shapes=SHAPES, runs=30):
    for shape in shapes:
        for op in ("layer_norm", "rms_norm"):
            bench_one(report, op, shape, dtype, device, runs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=[f"{m}x{n}" for m, n in SHAPES], help="MxN")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    report = new_report(args.device)
    bench(report, args.device, getattr(torch, args.dtype), [tuple(map(int, s.split("x"))) for s in args.shapes], args.runs)
    if args.record:
        record(report, args.record, "LayerNorm / RMSNorm benchmark", sys.argv)
