"""int8_linear's many-rows product on AMX int8 tiles against the same op with AMX turned off (the AVX-512 VNNI
row-by-row kernel, 8 rows of x a call), on a CPU with AMX (pytransformer._C.cpu_amx()): an A/B in one process, the
two ways timed in turns, median of --runs. Both give the same outputs bit for bit (tests/ops/test_int8_linear.py).

- the op: the layer shapes of a Llama-style 124M model (and a 7B Llama's MLP down projection) at 17 to 1024 rows,
  with ATen's bfloat16 F.linear on the same shape beside them (oneDNN, which runs on AMX bfloat16 tiles on such a
  CPU), and the integer operations per second of the AMX path (2 M N K, counted once for 16-bit x, whose products
  take two tile products each);
- prefill: generate(ids, 1) of the benchmark's int8 Llama (bench-generate's model: random weights, quantized at load)
  at batch 1 and 8 and prompts of 128 to 4096 tokens, with the first tokens of the two ways compared.

    python benchmarks/int8_amx_ab.py [--runs N] [--record FILE.md]
"""
import argparse
import datetime
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

import pytransformer
from pytransformer import ops
from pytransformer.bench import command_line, device_name, interleaved_median_times, median_time
from pytransformer.bench.generate import hf_model, load_engine, prompts, save_folder

# (layer, out features N, in features K, rows)
OP_CASES = [("qkv", 1152, 768, (17, 32, 64, 128, 512, 1024)), ("gate+up", 4096, 768, (17, 32, 64, 128, 512, 1024)),
            ("down", 768, 2048, (17, 32, 64, 128, 512, 1024)), ("lm head", 32000, 768, (17, 128)),
            ("7B down", 4096, 11008, (17, 128))]
PREFILL_CASES = [(1, 128), (8, 128), (1, 512), (1, 2048), (1, 4096)]  # (batch, prompt tokens)


def with_amx(on: bool, fn):
    """fn with int8_linear's AMX path switched on or off for the call."""
    return lambda: (pytransformer._C.cpu_amx(on), fn())


def a_b(fn, runs: int) -> tuple[float, float]:
    """Median seconds of fn() with AMX on and off, in turns, each after an untimed call of its own way."""
    try:
        amx, vnni = interleaved_median_times([with_amx(True, fn), with_amx(False, fn)], "cpu", runs, lead=1)
    finally:
        pytransformer._C.cpu_amx(True)
    return amx, vnni


def op_rows(runs: int) -> list[str]:
    rows = ["| layer | N | K | rows | AMX (ms) | VNNI (ms) | AMX / VNNI | AMX GOP/s | bfloat16 F.linear (ms) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, n, k, row_counts in OP_CASES:
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scale, bias = torch.rand(n) * 0.01, torch.randn(n)
        w_bf16 = (w.float() * scale[:, None]).bfloat16()
        for m in row_counts:
            x = torch.randn(m, k)
            x_bf16 = x.bfloat16()
            amx, vnni = a_b(lambda: ops.int8_linear(x, w, scale, bias), runs)
            bf16 = median_time(lambda: F.linear(x_bf16, w_bf16), "cpu", runs)
            rows.append(f"| {name} | {n} | {k} | {m} | {amx * 1e3:.2f} | {vnni * 1e3:.2f} | {amx / vnni:.2f}x | "
                        f"{2 * m * n * k / amx / 1e9:.0f} | {bf16 * 1e3:.2f} |")
            print(rows[-1], flush=True)
    return rows


def prefill_rows(runs: int) -> list[str]:
    hf = hf_model("llama", "cpu")
    folder = Path(tempfile.mkdtemp())
    save_folder(hf, folder)
    generate = load_engine("ours", "int8", folder, "cpu", torch.get_num_threads(), 8,
                           max(p for _, p in PREFILL_CASES) + 8)
    rows = ["| batch | prompt | prefill AMX (ms) | prefill VNNI (ms) | AMX / VNNI | same first tokens |",
            "|---|---|---|---|---|---|"]
    for batch, prompt_len in PREFILL_CASES:
        ids = prompts(batch, prompt_len, hf.config.vocab_size, "cpu")
        first = {on: with_amx(on, lambda: generate(ids, 1))()[1] for on in (True, False)}
        amx, vnni = a_b(lambda: generate(ids, 1), runs if prompt_len <= 512 else max(1, runs // 2))
        rows.append(f"| {batch} | {prompt_len} | {amx * 1e3:.1f} | {vnni * 1e3:.1f} | {amx / vnni:.2f}x | "
                    f"{'yes' if torch.equal(first[True], first[False]) else 'no'} |")
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7, help="timed calls of each way per case (median; prompts over 512 "
                                                      "tokens take half)")
    p.add_argument("--record", help="write the tables as markdown to this file")
    args = p.parse_args(argv)
    if not pytransformer._C.cpu_amx():
        p.exit(0, "no AMX int8 tiles on this CPU (or Linux refuses them): nothing to compare\n")
    lines = ["# int8_linear on AMX tiles against AVX-512 VNNI", "",
             f"- device: {device_name()}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today()}",
             f"- command: `{command_line(argv)}`", "", *op_rows(args.runs), "", *prefill_rows(args.runs)]
    if args.record:
        Path(args.record).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
