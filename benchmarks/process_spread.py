"""Whether one process's calls are slower than another's for reasons of its own (its memory layout, where its threads
run), or whether the host's speed, which moves over seconds, is what a process-to-process spread shows.

--processes fresh processes each load the benchmark's Llama (bench-generate's random Llama-124M shape, saved with
`save_pretrained` in --dtype) and warm up; then, in --rounds rounds, each process in turn times a group of --pairs
pairs of calls while the others wait: `DecoderLM.prefill(ids, cache, last=True)` of a --prompt-len-token prompt
(batch 1, as generation runs it), then an anchor of fixed work (float32 products of 384 x 384 matrices, in cache: the
host's compute speed at that moment; as many products in every process). Groups of one round run within seconds of
each other, so the host's speed moves them alike; a cell over its round's median takes that out. A process that is
slow by itself is over 1.00 in every round.

    python benchmarks/process_spread.py [--dtype float16] [--processes 6] [--rounds 6] [--pairs 5] [--record FILE.md]
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from pytransformer.bench import command_line, device_name
from pytransformer.bench.generate import hf_model, save_folder

WARMUP_CALLS = 3
PRODUCTS = 150  # the anchor's products of 384 x 384 matrices: about a 128-token prefill's time on a 2-core host


def child(folder: str, dtype: str, prompt_len: int, pairs: int) -> None:
    """Load the model from `folder`, warm up, print "ready"; then for each line read, time `pairs` (prefill, anchor)
    pairs in turns and print their seconds as JSON [prefill times, anchor times]."""
    from pytransformer import models
    lm = models.DecoderLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    a, b = torch.randn(384, 384), torch.randn(384, 384)

    def prefill():
        lm.prefill(ids, lm.new_cache(1, prompt_len), last=True)

    def anchor():
        for _ in range(PRODUCTS):
            a @ b
    with torch.no_grad():
        for _ in range(WARMUP_CALLS):
            prefill(), anchor()
        print("ready", flush=True)
        for _ in sys.stdin:
            times = ([], [])
            for _ in range(pairs):
                for fn, out in ((prefill, times[0]), (anchor, times[1])):
                    t0 = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t0)
            print(json.dumps(times), flush=True)


def table(title: str, cells: list) -> list[str]:
    """Markdown lines: cells[p][r] (ms) by process and round, then each over its round's median with the median of
    those per process."""
    rounds = range(len(cells[0]))
    round_median = [statistics.median(c[r] for c in cells) for r in rounds]
    head = "| process | " + " | ".join(f"round {r + 1}" for r in rounds)
    lines = [f"### {title}", "", head + " | median over rounds |", "|---" * (len(cells[0]) + 2) + "|"]
    for p, c in enumerate(cells, 1):
        lines.append(f"| {p} | " + " | ".join(f"{v:.1f}" for v in c) + f" | {statistics.median(c):.1f} |")
    lines += ["", head + " | median |", "|---" * (len(cells[0]) + 2) + "|"]
    for p, c in enumerate(cells, 1):
        rel = [v / m for v, m in zip(c, round_median)]
        lines.append(f"| {p} | " + " | ".join(f"{v:.2f}" for v in rel) + f" | {statistics.median(rel):.2f} |")
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--processes", type=int, default=6)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--record", help="write the tables as markdown to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a model folder: serve groups of timed pairs
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.dtype, args.prompt_len, args.pairs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        save_folder(hf_model("llama", "cpu").to(getattr(torch, args.dtype)), Path(tmp))
        command = [sys.executable, __file__, "--child", tmp, "--dtype", args.dtype, "--prompt-len",
                   str(args.prompt_len), "--pairs", str(args.pairs)]
        procs = []
        for _ in range(args.processes):  # one at a time: a loading process would slow another's warm-up
            procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            if procs[-1].stdout.readline().strip() != "ready":
                raise RuntimeError("a timing process failed to start")
        prefill = [[] for _ in procs]
        anchor = [[] for _ in procs]
        for r in range(args.rounds):
            for i, proc in enumerate(procs):
                proc.stdin.write("go\n")
                proc.stdin.flush()
                pre, anc = json.loads(proc.stdout.readline())
                prefill[i].append(statistics.median(pre) * 1e3)
                anchor[i].append(statistics.median(anc) * 1e3)
            print(f"round {r + 1}: prefill " + " ".join(f"{c[-1]:.1f}" for c in prefill), flush=True)
        for proc in procs:
            proc.stdin.close()
            proc.wait()
    lines = [f"# Prefill from process to process, in rounds ({datetime.date.today()})", "",
             f"- device: {device_name()}", f"- torch: {torch.__version__}", f"- command: `{command_line(argv)}`",
             f"- each cell: the median of {args.pairs} calls, timed in turns (prefill, anchor), of a "
             f"{args.prompt_len}-token {args.dtype} prefill (batch 1) or of the anchor ({PRODUCTS} products of 384 x "
             f"384 float32 matrices), after {WARMUP_CALLS} warm-up calls of each; each round times every process "
             "in turn, the others waiting", ""]
    lines += table("Prefill (ms; then over the round's median)", prefill)
    lines += table("Anchor (ms; then over the round's median)", anchor)
    text = "\n".join(lines)
    print(text)
    if args.record:
        Path(args.record).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
