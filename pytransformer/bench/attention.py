"""Attention: ours vs F.scaled_dot_product_attention, forward and forward+backward, and the peak memory of a forward.

Sections (run by `main`, each a function taking the report): `attention` (the fused training/prefill op); a decode
section (decode_attention over a KV cache) belongs next to it. On CUDA the baselines are SDPA restricted to its flash
backend and to cuDNN (each where it runs), at 16k tokens a batch and d_model 2048 (H = 2048 / D).
"""
import argparse
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import ops
from . import Row, interleaved_median_times, matmul_ceiling, new_report, proc_status, record

LENGTHS = (256, 1024, 4096)
CUDA_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
CUDA_HEAD_DIMS = (64, 128)
CUDA_TOKENS, CUDA_MODEL_DIM = 16384, 2048  # per batch: B = tokens / L, H = d_model / D
MEMORY_LENGTHS = (1024, 2048, 4096, 8192)
B, H, D = 4, 8, 64


def _flops(lq, lk, causal, d=D, dv=D, b=B, h=H):
    """FLOPs of one forward (QK^T and PV over the visible pairs, bottom-right causal)."""
    pairs = sum(min(lk, i + lk - lq + 1) for i in range(lq)) if causal else lq * lk
    return 2 * b * h * pairs * (d + dv)


def _sdpa(backend=None):
    """F.scaled_dot_product_attention(q, k, v, is_causal=causal), restricted to `backend` when given."""
    def call(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def _baselines(device, dtype):
    """(label, sdpa call) pairs: SDPA on the CPU; on CUDA its flash and cuDNN backends, each where it runs."""
    if torch.device(device).type != "cuda":
        return [("", _sdpa())]
    found = []
    for label, backend in (("SDPA flash", SDPBackend.FLASH_ATTENTION), ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION)):
        fn = _sdpa(backend)
        q = torch.randn(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
        try:
            fn(q, q, q, True).sum().backward()
            found.append((label, fn))
        except RuntimeError as e:
            print(f"{label}: not available here ({str(e).splitlines()[0]})", flush=True)
    return found


def bench_attention(report, device, dtype=torch.float32, lengths=LENGTHS, runs=20, head_dims=(D,)):
    """Forward and forward+backward, causal and not, per length and head dim: on the CPU [4, 8, L, 64]; on CUDA
    [16k / L, 2048 / D, L, D]. One row per baseline and case."""
    cuda = torch.device(device).type == "cuda"
    baselines = _baselines(device, dtype)
    for d in head_dims:
        for length in lengths:
            b, h = (max(1, CUDA_TOKENS // length), CUDA_MODEL_DIM // d) if cuda else (B, H)
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, length, d, dtype=dtype, device=device, requires_grad=True)
                           for _ in range(3))
                calls = [lambda: ops.attention(q, k, v, causal=causal)] + [
                    (lambda fn=fn: fn(q, k, v, causal)) for _, fn in baselines]
                case = f"B={b} H={h} L={length} D={d} {str(dtype)[6:]}{' causal' if causal else ''}"
                flops = _flops(length, length, causal, d, d, b, h)
                variant = "causal " if causal else ""
                with torch.no_grad():
                    times = interleaved_median_times(calls, device, runs)
                for (label, _), t in zip(baselines, times[1:]):
                    report.add(Row("attention", case + " fwd" + (f" vs {label}" if label else ""), times[0], t,
                                   flops=flops, variant=variant + "fwd"))
                g = torch.randn_like(q)
                step = lambda fn: lambda: torch.autograd.grad(fn(), (q, k, v), g)  # noqa: E731
                times = interleaved_median_times([step(fn) for fn in calls], device, runs)
                # the backward recomputes the scores: 5 products against the forward's 2
                for (label, _), t in zip(baselines, times[1:]):
                    report.add(Row("attention", case + " fwd+bwd" + (f" vs {label}" if label else ""), times[0], t,
                                   flops=3.5 * flops, variant=variant + "fwd+bwd"))


def _peak_rss_child(impl: str, length: int, causal: bool) -> None:
    """(In a fresh process) print the growth of resident memory over one forward: peak RSS during it minus RSS before."""
    q, k, v = (torch.randn(B, H, length, D) for _ in range(3))
    fn = ops.attention if impl == "ours" else lambda q, k, v, causal: F.scaled_dot_product_attention(
        q, k, v, is_causal=causal)
    with torch.no_grad():
        fn(q[:, :, :64], k[:, :, :64], v[:, :, :64], causal=causal)  # load kernels, start the thread pool
        before = proc_status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current RSS
        out = fn(q, k, v, causal=causal)
        print(proc_status("VmHWM") - before, out.numel() * out.element_size())


def peak_memory(length: int, impl: str, causal: bool = True) -> tuple[int, int]:
    """(extra resident bytes of one float32 forward at [4, 8, length, 64], bytes of its output), in a fresh process."""
    res = subprocess.run([sys.executable, "-m", "pytransformer.bench.attention", "--memory-child", impl, str(length),
                          str(int(causal))], capture_output=True, text=True, check=True)
    extra, out_bytes = res.stdout.split()
    return int(extra), int(out_bytes)


def memory_table(lengths=MEMORY_LENGTHS) -> str:
    """Markdown table of the extra resident memory of one causal forward, ours and SDPA's, vs the score matrix."""
    lines = ["| L | ours extra (MiB) | SDPA extra (MiB) | output (MiB) | float32 [B,H,L,L] scores (MiB) | ours / scores |",
             "|---|---|---|---|---|---|"]
    for length in lengths:
        ours, out_bytes = peak_memory(length, "ours")
        sdpa, _ = peak_memory(length, "sdpa")
        scores = B * H * length * length * 4
        lines.append(f"| {length} | {ours / 2**20:.1f} | {sdpa / 2**20:.1f} | {out_bytes / 2**20:.1f} | "
                     f"{scores / 2**20:.0f} | {ours / scores:.2%} |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


SECTIONS = {"attention": bench_attention}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    p.add_argument("--lengths", nargs="+", type=int, help=f"default: {LENGTHS} (CPU), {CUDA_LENGTHS} (CUDA)")
    p.add_argument("--head-dims", nargs="+", type=int, help=f"default: {D} (CPU), {CUDA_HEAD_DIMS} (CUDA)")
    p.add_argument("--memory-lengths", nargs="*", type=int, default=list(MEMORY_LENGTHS),
                   help="sequence lengths of the CPU peak-memory table (none: skip it)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--record", help="write the tables as markdown to this file")
    p.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        impl, length, causal = args.memory_child
        _peak_rss_child(impl, int(length), bool(int(causal)))
        return
    cuda = torch.device(args.device).type == "cuda"
    lengths = args.lengths or (CUDA_LENGTHS if cuda else LENGTHS)
    head_dims = args.head_dims or (CUDA_HEAD_DIMS if cuda else (D,))
    report = new_report(args.device)
    report.ceiling_flops_s = matmul_ceiling(args.device, getattr(torch, args.dtype), n=8192 if cuda else 2048)
    print(f"matmul ceiling {report.ceiling_flops_s / 1e9:.1f} GFLOP/s", flush=True)
    for name in args.sections:
        SECTIONS[name](report, args.device, getattr(torch, args.dtype), lengths=lengths, runs=args.runs,
                       head_dims=head_dims)
    memory = ""
    if args.device == "cpu" and args.memory_lengths:
        memory = ("\n## Peak memory of one causal float32 forward, B=4 H=8 D=64 (growth of resident memory, output "
                  "included; each in a fresh process)\n\n" + memory_table(args.memory_lengths))
    if args.record:
        record(report, args.record, "Attention benchmark", sys.argv)
        with open(args.record, "a") as f:
            f.write(memory)


if __name__ == "__main__":
    main()
