"""masked_softmax: ours vs masked_fill(~mask, -inf) + torch.softmax (bool and causal masks), scores + mask +
torch.softmax (float masks) and plain torch.softmax, forward and backward.

Throughput counts the nominal traffic of the op: scores read and out written (forward), grad_out and out read and
grad written (backward); mask bytes are left out. scale = 1 (so the PyTorch side needs no extra multiply); the
PyTorch masks are built once, outside the timed region. Both sides allocate their outputs in the timed region.
"""
import argparse
import sys

import torch

from .. import ops
from ..ops.visibility import visible_keys
from . import Row, interleaved_median_times, new_report, record

SHAPES = [(16, 8, 512, 512), (8, 12, 128, 128), (2, 8, 1024, 1024)]
CASES = ["causal", "padding", "float", "none"]


def _case(case, x):
    """(ours, theirs) forward closures for scores x [B, H, Lq, Lk]."""
    b, _, lq, lk = x.shape
    if case == "causal":
        drop = ~visible_keys(lq, lk, causal=True, device=x.device)  # [Lq, Lk]
        return (lambda: ops.masked_softmax(x, causal=True),
                lambda: torch.softmax(x.masked_fill(drop, float("-inf")), -1))
    if case == "padding":
        keep = torch.arange(lk, device=x.device) < torch.randint(lk // 2, lk + 1, (b, 1, 1, 1), device=x.device)
        drop = ~keep  # [B, 1, 1, Lk]
        return (lambda: ops.masked_softmax(x, keep), lambda: torch.softmax(x.masked_fill(drop, float("-inf")), -1))
    if case == "float":
        bias = torch.randn(b, 1, lq, lk, dtype=x.dtype, device=x.device)  # [B, 1, Lq, Lk]
        return lambda: ops.masked_softmax(x, bias), lambda: torch.softmax(x + bias, -1)
    return lambda: ops.masked_softmax(x), lambda: torch.softmax(x, -1)


def bench_one(report, case, shape, dtype, device, runs=20, backward=True):
    """Forward (and backward) of one mask case at one shape [B, H, Lq, Lk]; appends rows to `report`."""
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=backward)
    ours, theirs = _case(case, x)
    name = f"{'x'.join(map(str, shape))} {str(dtype)[6:]} {case}"
    nbytes = x.numel() * x.element_size()
    with torch.no_grad():
        report.add(Row("masked_softmax", name + " fwd", *interleaved_median_times([ours, theirs], device, runs),
                       bytes=2 * nbytes, variant=f"{case} fwd"))
    if backward:
        g = torch.randn_like(x)
        y_ours, y_theirs = ours(), theirs()
        back = lambda y: lambda: torch.autograd.grad(y, x, g, retain_graph=True)  # noqa: E731
        report.add(Row("masked_softmax", name + " bwd",
                       *interleaved_median_times([back(y_ours), back(y_theirs)], device, runs), bytes=3 * nbytes,
                       variant=f"{case} bwd"))


def bench(report, device, dtype=torch.float32, shapes=SHAPES, cases=CASES, runs=20, backward=True):
    for shape in shapes:
        for case in cases:
            bench_one(report, case, shape, dtype, device, runs, backward)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=["x".join(map(str, s)) for s in SHAPES], help="BxHxLqxLk")
    p.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (CPU); default: torch's choice")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = new_report(args.device)
    bench(report, args.device, getattr(torch, args.dtype), [tuple(map(int, s.split("x"))) for s in args.shapes],
          args.cases, args.runs, not args.no_backward)
    if args.record:
        record(report, args.record, "masked_softmax benchmark", sys.argv)
