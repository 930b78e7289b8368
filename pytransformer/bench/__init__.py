"""Microbenchmarks: the one implementation behind benchmarks/bench_*.py and `python -m pytransformer bench`.

Each op family has a module here with `bench(report, device, dtype, ...)` (the cases) and `main(argv)` (the script).

Times are medians over repeated runs after warm-up (CUDA: events on the current stream). Each result is reported as
a ratio to the PyTorch op measured in the same run and as a fraction of the device's measured ceiling (the fastest of
10 runs of a large copy or matmul). A case that counts both bytes and FLOPs is held to its roofline: the longer of the
times the copy bandwidth and the matmul ceiling allow it, so a few-rows matmul is memory-bound or compute-bound by
what it does.
"""
import datetime
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch


# Bytes that a case reading memory (a layer's weight, a KV cache) cycles through: 32x a 32 MiB last-level cache (at a
# quarter of that, an AMD EPYC's L3 still served part of the reads: benchmarks/results/cpu_kernel_notes_2026-11-28.md,
# bench). A model reads far more than the cache holds between two reads of the same tensor.
COLD_BYTES = 1 << 30
_pools = {}  # (dtype, device) -> one random tensor that the copies of every case are views of


def cold_copies(shape, dtype, device, cold_bytes: int) -> list:
    """Tensors of `shape` and `dtype` (float: normal * 0.02; int8: random int8 values) that together span at least
    `cold_bytes`, at least two (one when cold_bytes is 0): views of one pool per dtype and device, filled once for all
    cases; a case cycles through them, so each call reads its tensor from memory."""
    per_copy = math.prod(shape)
    count = max(2, -(-cold_bytes // (per_copy * torch.empty((), dtype=dtype).element_size()))) if cold_bytes else 1
    pool = _pools.get((dtype, device))
    if pool is None or pool.numel() < count * per_copy:
        _pools.pop((dtype, device), None)  # free the old pool before filling a larger one
        if dtype == torch.int8:
            pool = torch.randint(-127, 128, (count * per_copy,), dtype=dtype, device=device)
        else:
            pool = torch.randn(count * per_copy, dtype=dtype, device=device).mul_(0.02)
        _pools[(dtype, device)] = pool
    return [pool[i * per_copy:(i + 1) * per_copy].view(shape) for i in range(count)]


def proc_status(field: str) -> int:
    """A memory field of /proc/self/status in bytes (RssAnon, VmRSS, VmHWM); 0 off Linux."""
    if sys.platform != "linux":
        return 0
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith(field + ":"))) * 1024


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_time(fn, device="cpu", runs: int = 20, warmup: int = 3) -> float:
    """Median wall time of fn() in seconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        if torch.device(device).type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def best_time(fn, device="cpu", runs: int = 10, warmup: int = 3) -> float:
    """Fastest wall time of fn() in seconds: a ceiling is what the device does when nothing else interferes (the
    median of a shared machine's runs moved by a third between recordings)."""
    median_time(fn, device, runs=1, warmup=warmup)
    return min(median_time(fn, device, runs=1, warmup=0) for _ in range(runs))


def interleaved_median_times(fns, device="cpu", runs: int = 20, warmup: int = 3, lead: int = 0) -> list[float]:
    """Median wall time of each fn() in seconds, timed in turns so that changes in machine load hit all of them alike;
    each turn first makes `lead` untimed calls of the same fn, so that the call timed follows its own kind, as the
    layers of a model follow each other, not the other fns."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for t, fn in zip(times, fns):
            t.append(median_time(fn, device, runs=1, warmup=lead))
    return [statistics.median(t) for t in times]


def copy_bandwidth(device="cpu", nbytes: int = 1 << 30) -> float:
    """The device's copy ceiling in bytes/s: a large tensor copy, counting bytes read plus bytes written."""
    if torch.device(device).type == "cpu":
        nbytes = min(nbytes, 256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time(lambda: dst.copy_(src), device)


def read_bandwidth(device="cpu", nbytes: int = 1 << 30) -> float:
    """The bytes/s that a large reduction (a sum) reads: the read-only stream PyTorch itself achieves."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    return nbytes / best_time(lambda: src.sum(), device)


def matmul_ceiling(device="cpu", dtype=torch.float32, n: int = 2048) -> float:
    """The device's compute ceiling in FLOP/s: a large square matmul in `dtype`, the faster of ATen's and, on the CPU,
    ops.linear's (whose float32 GEMM can be the faster one), chosen at n / 8 first: without BF16 instructions ATen's
    bfloat16 matmul of n 2048 takes a minute (an AVX2 EPYC), so only the faster is timed at n."""
    from .. import ops

    def products(m):
        a = torch.randn(m, m, dtype=dtype, device=device)
        b = torch.randn(m, m, dtype=dtype, device=device)
        return [lambda: a @ b] + ([lambda: ops.linear(a, b)] if torch.device(device).type == "cpu" else [])

    small = products(n // 8)
    pick = min(range(len(small)), key=lambda i: best_time(small[i], device, runs=3))
    return 2 * n**3 / best_time(products(n)[pick], device)


def device_name(device="cpu") -> str:
    """The GPU's name; or the CPU's model name as lscpu gives it, with its family and model numbers (a virtual machine
    may name only "AMD EPYC", where family 25 model 1 is a Zen 3 and model 17 a Zen 4), the instruction set the CPU
    kernels run (pytransformer._C.cpu_isa()) and the thread count."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name()
    from .. import _C
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    fields = dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in out.splitlines() if ":" in line))
    model = fields.get("Model name") or platform.processor() or platform.machine()
    ids = [f"{name.lower()} {fields[name]}" for name in ("CPU family", "Model") if fields.get(name)]
    return f"{model} ({', '.join(ids + [_C.cpu_isa()])}), {torch.get_num_threads()} threads"


@dataclass
class Row:
    """One benchmark case: our time and PyTorch's, with the bytes moved (or FLOPs done) by one call; `variant` names
    the series the case belongs to when plotted against size (fwd / bwd, mask kind, ...)."""
    op: str
    case: str
    ours_s: float
    torch_s: float
    bytes: float = 0.0
    flops: float = 0.0
    variant: str = ""
    ceiling_flops_s: float = 0.0  # this case's compute ceiling when not the report's (a matmul in another dtype)
    ceiling_bytes_s: float = 0.0  # this case's bandwidth ceiling when not the report's (an anchor timed with it)

    def throughput(self, seconds: float | None = None, in_bytes: bool = False) -> tuple[float, str]:
        """(value, unit) of the FLOPs (when counted and not `in_bytes`) or bytes per `seconds` (default: our time)."""
        seconds = self.ours_s if seconds is None else seconds
        if in_bytes or not self.flops:
            return self.bytes / seconds / 1e9, "GB/s"
        rate = self.flops / seconds
        return (rate / 1e12, "TFLOP/s") if rate >= 1e12 else (rate / 1e9, "GFLOP/s")


@dataclass
class Report:
    device: str
    ceiling_bytes_s: float = 0.0
    ceiling_flops_s: float = 0.0
    rows: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # lines of the record about the measurement (other yardsticks, ...)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(self.format_row(row), flush=True)
        return row

    def bound_times(self, row: Row) -> tuple[float, float]:
        """(memory, compute): the least time the copy bandwidth allows the row's bytes and the matmul ceiling its FLOPs
        (0 for what the row does not count, NaN for a ceiling not measured)."""
        flops_s, bytes_s = row.ceiling_flops_s or self.ceiling_flops_s, row.ceiling_bytes_s or self.ceiling_bytes_s
        memory = (row.bytes / bytes_s if bytes_s else float("nan")) if row.bytes else 0.0
        compute = (row.flops / flops_s if flops_s else float("nan")) if row.flops else 0.0
        return memory, compute

    def fraction(self, row: Row) -> float:
        """The row's bound time over ours: of the bandwidth or of the compute ceiling, of the roofline when both."""
        memory, compute = self.bound_times(row)
        if row.bytes and row.flops:
            return max(memory, compute) / row.ours_s
        return (compute if row.flops else memory) / row.ours_s

    HEADER = "| op | case | ours (ms) | torch (ms) | ours/torch time | throughput | of ceiling |\n|---|---|---|---|---|---|---|"

    def format_row(self, r: Row) -> str:
        memory, compute = self.bound_times(r)
        value, unit = r.throughput(in_bytes=bool(r.bytes) and memory > compute)  # the binding one of a roofline
        return (f"| {r.op} | {r.case} | {r.ours_s * 1e3:.3f} | {r.torch_s * 1e3:.3f} | {r.ours_s / r.torch_s:.2f}x "
                f"| {value:.1f} {unit} | {self.fraction(r):.0%} |")

    def markdown(self, command: str) -> str:
        lines = [f"- device: {self.device}", f"- torch: {torch.__version__}",
                 f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`"]
        if self.ceiling_bytes_s:
            lines.append(f"- measured copy bandwidth (read + write): {self.ceiling_bytes_s / 1e9:.1f} GB/s")
        if self.ceiling_flops_s:
            lines.append(f"- measured matmul ceiling: {self.ceiling_flops_s / 1e9:.0f} GFLOP/s")
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines + ["", self.HEADER] + [self.format_row(r) for r in self.rows]) + "\n"

    def to_dict(self) -> dict:
        """Device, versions, ceilings and every row with its derived numbers (JSON-ready: no NaN)."""
        def number(x):
            return None if math.isnan(x) else x
        rows = []
        for r in self.rows:
            value, unit = r.throughput()
            rows.append({**asdict(r), "ratio": r.ours_s / r.torch_s, "throughput": value, "unit": unit,
                         "torch_throughput": r.throughput(r.torch_s)[0], "fraction_of_ceiling": number(self.fraction(r))})
        return {"device": self.device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                "ceiling_bytes_s": self.ceiling_bytes_s or None, "ceiling_flops_s": self.ceiling_flops_s or None,
                "notes": self.notes, "rows": rows}


def new_report(device, nbytes: int = 1 << 30) -> Report:
    """A report for `device` with its copy-bandwidth ceiling measured now (copying `nbytes`)."""
    report = Report(device_name(device), ceiling_bytes_s=copy_bandwidth(device, nbytes))
    print(f"device: {report.device}; copy bandwidth {report.ceiling_bytes_s / 1e9:.1f} GB/s\n{Report.HEADER}", flush=True)
    return report


THREAD_VARIABLES = ("OMP_NUM_THREADS",)  # environment variables that set the thread count a record ran with


def command_line(argv=None, environ=None) -> str:
    """The command that ran (default sys.argv) as one would type it: `python -m pytransformer ...` for the package's
    entry point, else `python SCRIPT ...`, each argument quoted for the shell where it needs to be, preceded by the
    thread-count variables set in `environ` (default os.environ), such as `OMP_NUM_THREADS=1`."""
    argv = list(sys.argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    entry = argv[0].endswith(os.path.join("pytransformer", "__main__.py"))
    settings = [f"{name}={shlex.quote(environ[name])}" for name in THREAD_VARIABLES if name in environ]
    return " ".join([*settings, shlex.join(["python", *(["-m", "pytransformer"] if entry else argv[:1]), *argv[1:]])])


def record(report: Report, path: str, title: str, argv) -> None:
    """Write the report as markdown (device, torch version, date, command, table) to `path`."""
    with open(path, "w") as f:
        f.write(f"# {title}\n\n{report.markdown(command_line(argv))}")


def script_main(doc: str, title: str, bench, argv=None, runs: int = 30, dtype: bool = True,
                flops: bool = False) -> None:
    """The command line of a benchmark script with no options of its own: --device, --dtype (when `dtype`), --runs
    and --record; runs bench(report, device[, dtype], runs=...) (after measuring the matmul ceiling when `flops`)."""
    import argparse
    import sys
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    if dtype:
        p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--runs", type=int, default=runs)
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    report = new_report(args.device)
    if flops:
        report.ceiling_flops_s = matmul_ceiling(args.device)
    bench(report, args.device, *([getattr(torch, args.dtype)] if dtype else []), runs=args.runs)
    if args.record:
        record(report, args.record, title, sys.argv)

