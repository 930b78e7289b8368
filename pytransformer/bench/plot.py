"""Throughput against problem size, one panel per op, ours (solid) and PyTorch's (dashed), from a bench Report."""
import math

from ..plotting import pyplot
from . import Report, Row


def _size(row: Row) -> float:
    return row.flops or row.bytes


def plot_report(report: Report, path: str) -> None:
    """Write a PNG: per op, GB/s (or FLOP/s) of ours and of the PyTorch op against bytes moved (or FLOPs) per call,
    one colour per variant (fwd / bwd, mask kind, ...), with the measured ceiling dotted."""
    plt = pyplot()
    from matplotlib.ticker import NullFormatter

    ops = list(dict.fromkeys(r.op for r in report.rows))
    cols = min(3, len(ops))
    fig, axes = plt.subplots(math.ceil(len(ops) / cols), cols, figsize=(5.2 * cols, 4.2 * math.ceil(len(ops) / cols)),
                             squeeze=False)
    for ax, op in zip(axes.flat, ops):
        rows = [r for r in report.rows if r.op == op]
        flops = any(r.flops for r in rows)
        ceiling = report.ceiling_flops_s if flops else report.ceiling_bytes_s
        scale, unit = (1e12, "TFLOP/s") if flops and ceiling >= 1e12 else ((1e9, "GFLOP/s") if flops else (1e9, "GB/s"))
        for i, variant in enumerate(dict.fromkeys(r.variant for r in rows)):
            series = sorted((r for r in rows if r.variant == variant), key=_size)
            x = [_size(r) for r in series]
            ax.plot(x, [_size(r) / r.ours_s / scale for r in series], "o-", color=f"C{i}", label=variant or op)
            ax.plot(x, [_size(r) / r.torch_s / scale for r in series], "x--", color=f"C{i}", alpha=0.7)
        if ceiling:
            ax.axhline(ceiling / scale, color="gray", ls=":", label="measured " + ("matmul" if flops else "copy") +
                       " ceiling")
        ax.set(xscale="log", xlabel="FLOPs per call" if flops else "bytes moved per call", ylabel=unit, title=op,
               ylim=(0, None))
        ax.xaxis.set_minor_formatter(NullFormatter())  # a narrow log range would label every minor tick
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    fig.suptitle(f"pytransformer (solid) vs PyTorch (dashed): {report.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
