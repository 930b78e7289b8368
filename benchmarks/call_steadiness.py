"""How much a generate call's time moves from call to call, against how much the host moves fixed work of the same
length: bench-generate's "spread" column with anchors beside it. A stall of the host adds the same milliseconds to
any call it falls in, so its share of a call grows as the call shortens: an engine that generates faster shows a
larger relative range for the same host. Each engine is therefore compared with anchors as long as its own call.

For each --layers count (the benchmark's Llama with that many decoder layers) and batch size, in turns, each 0.2 s
after the last (as bench-generate times its calls), --rounds times:
- generate: each engine's generate(ids, 64) after a 128-token prompt, in --dtype, in a process of its own as
  bench-generate runs it: ours compiled and, with --llamacpp, llama.cpp's GGUF type for the dtype;
- compute, as long as an engine's call: float32 products of 384 x 384 matrices (in cache: no memory traffic to
  speak of), as many as take that engine's median time;
- read, as long as an engine's call: sums over a float32 buffer of the bytes one decoding token reads from the
  weights (the linear layers and the LM head in --dtype), as many as take that engine's median time.
For each: the median, the range (slowest - fastest) in ms and over the median, the interquartile range over the
median (the middle half) and every call over the median, in the order run. If an engine moves no more than its
anchors, its spread is the host's.

    python benchmarks/call_steadiness.py [--dtype int8] [--layers 12] [--batch-sizes 1 8] [--llamacpp]
        [--rounds 12] [--record FILE.md]
"""
import argparse
import datetime
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pytransformer.bench import command_line, device_name, llamacpp
from pytransformer.bench.generate import Engine, hf_model, pause, save_folder

PROMPT_LEN, NEW_TOKENS = 128, 64


def token_weight_mib(hf, dtype: str) -> float:
    """The MiB of weights one decoding token reads: every matrix but the embedding table, in `dtype`."""
    params = sum(p.numel() for name, p in hf.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    return params * getattr(torch, dtype).itemsize / 2**20


def repeat(step, seconds: float):
    """A call of `step` repeated as many times as take about `seconds` (the count rescaled over three timed calls)."""
    count = [20]

    def call():
        for _ in range(count[0]):
            step()
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        count[0] = max(1, round(count[0] * seconds / (time.perf_counter() - t0)))
    return call


def row(name: str, t: list) -> str:
    med, rng = statistics.median(t), max(t) - min(t)
    q1, _, q3 = statistics.quantiles(t, n=4, method="inclusive")
    return (f"| {name} | {med * 1e3:.0f} | {rng * 1e3:.0f} | {rng / med:.0%} | {(q3 - q1) / med:.0%} | "
            f"{' '.join(f'{x / med:.2f}' for x in t)} |")


def timed_rounds(calls: dict, rounds: int) -> list:
    """Table rows of the calls ({name: fn}) timed in turns, each PAUSE_S after the last: the seconds fn returns (an
    engine's call, timed in its process), else its wall time here."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            pause()
            t0 = time.perf_counter()
            seconds = fn()
            times[name].append(time.perf_counter() - t0 if seconds is None else seconds)
    return [row(name, t) for name, t in times.items()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default="int8")
    p.add_argument("--layers", type=int, nargs="+", default=[12], help="decoder layer counts (default: 12)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    p.add_argument("--llamacpp", action="store_true", help="also llama.cpp's GGUF type for --dtype")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    if args.llamacpp and importlib.util.find_spec("llama_cpp") is None:
        p.error("--llamacpp: llama-cpp-python is not installed (pytransformer/bench/llamacpp.py says how to build it)")
    names = ["ours, compiled"] + [f"llama.cpp {llamacpp.GGUF_TYPES[args.dtype][0]}"] * args.llamacpp
    a = torch.randn(384, 384)
    lines = ["# Call-to-call steadiness", "", f"- device: {device_name()}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today()}", f"- command: `{command_line(argv)}`", "",
             "| layers | weight MiB a token | batch | call | median (ms) | range (ms) | range / median | middle half "
             "| calls / median |", "|---|---|---|---|---|---|---|---|---|"]
    for layers in args.layers:
        hf = hf_model("llama", "cpu", num_hidden_layers=layers)
        mib = token_weight_mib(hf, args.dtype)
        buf = torch.ones(round(mib) << 18)
        with tempfile.TemporaryDirectory() as folder:
            save_folder(hf.to(torch.bfloat16) if args.dtype == "bfloat16" else hf, Path(folder))
            spec = dict(dtype=args.dtype, folder=folder, device="cpu", threads=torch.get_num_threads(),
                        batch_sizes=args.batch_sizes, prompt_len=PROMPT_LEN, vocab=hf.config.vocab_size,
                        new_tokens=NEW_TOKENS)
            engines = {name: Engine(dict(spec, engine=name)) for name in names}
            try:
                for batch in args.batch_sizes:
                    calls = {}
                    for name, engine in engines.items():
                        engine.time(batch, NEW_TOKENS)  # the first call (a compiled engine compiles then)
                        seconds = statistics.median(engine.time(batch, NEW_TOKENS) for _ in range(3))
                        calls[f"generate: {name}"] = lambda engine=engine: engine.time(batch, NEW_TOKENS)
                        calls[f"compute as long as {name}"] = repeat(lambda: torch.mm(a, a), seconds)
                        calls[f"read as long as {name}"] = repeat(buf.sum, seconds)
                    lines += [f"| {layers} | {mib:.0f} | {batch} {r}" for r in timed_rounds(calls, args.rounds)]
                    print("\n".join(lines[-len(calls):]), flush=True)
            finally:
                for engine in engines.values():
                    engine.close()
    print("\n".join(lines))
    if args.record:
        Path(args.record).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
