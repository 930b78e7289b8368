"""How much one call's time moves from call to call on this host, for generation and for work that does not depend on
our kernels: a probe of the machine beside the op, as in bench-generate's "spread" column.

For each --layers count (the benchmark's Llama with that many decoder layers, so that the weights a token reads cross
the sizes at which the host's last-level cache stops holding them), in turns, each 0.2 s after the last (as
bench-generate times its calls), --rounds times:
- generate: ours compiled, batch 1, a 128-token prompt and 64 new tokens, in --dtype;
- compute: 1000 float32 products of 384 x 384 matrices (in cache: no memory traffic to speak of);
- read: 40 sums over a float32 buffer of the bytes one decoding token reads from the weights (the linear layers and
  the LM head in --dtype; --read-mib sets another size).
For each: the median, the range (slowest - fastest) in ms and over the median, and every call over the median; and
the host's steal time over each call (/proc/stat, in ticks of 10 ms; 0 where the hypervisor does not report it). If
the read moves by as many milliseconds as generation does, and the compute call does not, the spread is the memory's.

    python benchmarks/call_steadiness.py [--dtype int8] [--layers 12] [--rounds 12] [--record FILE.md]
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


def token_weight_mib(hf, dtype: str) -> float:
    """The MiB of weights one decoding token reads: every matrix but the embedding table, in `dtype`."""
    params = sum(p.numel() for name, p in hf.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    return params * getattr(torch, dtype).itemsize / 2**20


def timed_rounds(calls: dict, rounds: int) -> list:
    """Table rows of the calls timed in turns."""
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    steals = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            time.sleep(0.2)
            s0, t0 = steal_ticks(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            steals[name].append(steal_ticks() - s0)
    rows = []
    for name in calls:
        t = times[name]
        med, rng = statistics.median(t), max(t) - min(t)
        rows.append(f"| {name} | {med * 1e3:.0f} | {rng * 1e3:.0f} | {rng / med:.0%} | "
                    f"{' '.join(f'{x / med:.2f}' for x in t)} | {sum(steals[name])} |")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default="int8")
    p.add_argument("--layers", type=int, nargs="+", default=[12], help="decoder layer counts (default: 12)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--read-mib", type=int, help="the read buffer (default: the MiB a token reads from the weights)")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    a = torch.randn(384, 384)

    def compute():
        for _ in range(1000):
            torch.mm(a, a)

    lines = ["# Call-to-call steadiness", "", f"- device: {device_name()}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today()}", f"- command: `{command_line(argv)}`", "",
             "| layers | weight MiB a token | call | median (ms) | range (ms) | range / median | calls / median "
             "| steal ticks |", "|---|---|---|---|---|---|---|---|"]
    for layers in args.layers:
        hf = hf_model("llama", "cpu", num_hidden_layers=layers)
        folder = Path(tempfile.mkdtemp())
        save_folder(hf, folder)
        mib = token_weight_mib(hf, args.dtype)
        read_mib = args.read_mib or round(mib)
        generate = load_engine("ours, compiled", args.dtype, folder, "cpu", torch.get_num_threads(), 1, 256)
        ids = prompts(1, 128, hf.config.vocab_size, "cpu")
        buf = torch.ones(read_mib << 18)

        def read():
            for _ in range(40):
                buf.sum()

        calls = {f"generate ({args.dtype}, compiled)": lambda: generate(ids, 64), "compute": compute,
                 f"read {read_mib} MiB": read}
        lines += [f"| {layers} | {mib:.0f} {row}" for row in timed_rounds(calls, args.rounds)]
        print("\n".join(lines[-3:]), flush=True)
    print("\n".join(lines))
    if args.record:
        Path(args.record).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
