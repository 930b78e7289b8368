"""How much one call's time moves from call to call on this host, for generation and for work that does not depend on
our kernels: a probe of the machine beside the op, as in bench-generate's "spread" column.

In turns, each 0.2 s after the last (as bench-generate times its calls), --rounds times:
- generate: ours compiled, batch 1, a 128-token prompt and 64 new tokens, the benchmark's Llama in --dtype;
- compute: 1000 float32 products of 384 x 384 matrices (in cache: no memory traffic to speak of);
- read: 40 sums over a float32 buffer of --read-mib MiB (memory-bound).
For each: the median, the range (slowest - fastest) in ms and over the median, and every call over the median; and
the host's steal time over each call (/proc/stat, in ticks of 10 ms; 0 where the hypervisor does not report it). If
the compute and read calls move by as many milliseconds as generation does, the spread is the host's.

    python benchmarks/call_steadiness.py [--dtype int8] [--rounds 12] [--record FILE.md]
"""
import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pytransformer.bench import command_line, device_name
from pytransformer.bench.generate import hf_model, load_engine, prompts, save_folder


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default="int8")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--read-mib", type=int, default=124, help="the read buffer (default: the int8 model's bytes)")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    hf = hf_model("llama", "cpu")
    folder = Path(tempfile.mkdtemp())
    save_folder(hf, folder)
    generate = load_engine("ours, compiled", args.dtype, folder, "cpu", torch.get_num_threads(), 1, 256)
    ids = prompts(1, 128, hf.config.vocab_size, "cpu")
    a = torch.randn(384, 384)
    buf = torch.ones(args.read_mib << 18)

    def compute():
        for _ in range(1000):
            torch.mm(a, a)

    def read():
        for _ in range(40):
            buf.sum()

    calls = {f"generate ({args.dtype}, compiled)": lambda: generate(ids, 64), "compute": compute,
             f"read {args.read_mib} MiB": read}
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    steals = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            time.sleep(0.2)
            s0, t0 = steal_ticks(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            steals[name].append(steal_ticks() - s0)
    lines = ["# Call-to-call steadiness", "", f"- device: {device_name()}, {torch.get_num_threads()} threads",
             f"- torch: {torch.__version__}", f"- date: {datetime.date.today()}", f"- command: `{command_line(argv)}`",
             "", "| call | median (ms) | range (ms) | range / median | calls / median | steal ticks |",
             "|---|---|---|---|---|---|"]
    for name in calls:
        t = times[name]
        med, rng = statistics.median(t), max(t) - min(t)
        lines.append(f"| {name} | {med * 1e3:.0f} | {rng * 1e3:.0f} | {rng / med:.0%} | "
                     f"{' '.join(f'{x / med:.2f}' for x in t)} | {sum(steals[name])} |")
    print("\n".join(lines))
    if args.record:
        Path(args.record).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
