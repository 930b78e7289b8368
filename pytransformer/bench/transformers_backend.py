"""What each step of adopting our kernels buys a transformers user: greedy `generate` tokens/s of one model and prompt
on transformers with attn_implementation="sdpa", then "pytransformer" (integrations.transformers), then also its
linear layers patched to ours (float32, bfloat16, int8), and our own DecoderLM loaded from the same folder by
DecoderLM.from_pretrained (float32, bfloat16, int8).

The model is a random Llama-shaped model of GPT-2 small's size (bench.generate's LLAMA_SHAPE: 124M parameters, GQA
4:1), float32, saved with save_pretrained. Every variant runs in this one process, in rounds: each round runs every
variant once, in turn (patching the linears before and undoing it after), so that a change in the machine's load
reaches all of them alike; tokens/s is the new tokens over the median time of the rounds, prefill included. The
record also says where each variant's greedy tokens first differ from sdpa's.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from ..integrations import transformers as integration
from ..models import DecoderLM
from . import command_line, device_name
from .generate import LLAMA_SHAPE, first_difference, hf_generate, hf_model, prompts, timed

# (variant, attention backend, patch_linears arguments or None); DecoderLM variants: (name, None, dtype)
TRANSFORMERS_VARIANTS = [
    ("transformers, sdpa", "sdpa", None),
    ("transformers, pytransformer attention", integration.NAME, None),
    ("+ our linears, float32", integration.NAME, {}),
    ("+ our linears, bfloat16", integration.NAME, {"dtype": torch.bfloat16}),
    ("+ our linears, int8", integration.NAME, {"quantize": True}),
]
DECODERLM_VARIANTS = ["float32", "bfloat16", "int8"]


def transformers_variant(hf, attention: str, patch):
    """(generate(ids, n), undo()) of the transformers model on that attention backend, its linears patched when
    `patch` holds patch_linears' arguments."""
    hf.set_attn_implementation(attention)
    if patch is not None:
        integration.patch_linears(hf, **patch)
    return hf_generate(hf), lambda: integration.unpatch_linears(hf)


def decoderlm_variant(folder: Path, dtype: str):
    """DecoderLM.from_pretrained of the saved folder in that dtype (int8: float32 weights quantized on load)."""
    model = DecoderLM.from_pretrained(folder, torch.float32 if dtype == "int8" else getattr(torch, dtype),
                                      quantize=dtype == "int8")
    return model.generate


def run(hf, folder: Path, ids: torch.Tensor, new_tokens: int, rounds: int):
    """{variant: (median seconds, greedy new tokens of the first round)}, every variant once per round in turn."""
    ours = {f"DecoderLM, {d}": decoderlm_variant(folder, d) for d in DECODERLM_VARIANTS}
    times, tokens = {}, {}
    for _ in range(rounds):
        for name, attention, patch in TRANSFORMERS_VARIANTS:
            generate, undo = transformers_variant(hf, attention, patch)
            times.setdefault(name, []).append(measure(generate, ids, new_tokens, tokens, name))
            undo()
        for name, generate in ours.items():
            times.setdefault(name, []).append(measure(generate, ids, new_tokens, tokens, name))
    return {name: (statistics.median(t), tokens[name]) for name, t in times.items()}


def measure(generate, ids: torch.Tensor, new_tokens: int, tokens: dict, name: str) -> float:
    """Seconds of one generate call after a two-token warm-up; the first call's new tokens kept in tokens[name]."""
    generate(ids, 2)
    out = []
    seconds = timed(lambda: out.append(generate(ids, new_tokens)), "cpu")
    tokens.setdefault(name, out[0][:, ids.shape[1]:])
    return seconds


def markdown(results, command: str, prompt_len: int, new_tokens: int, rounds: int, load: tuple) -> str:
    import transformers
    sdpa_rate = new_tokens / results["transformers, sdpa"][0]
    lines = [f"- host: {device_name('cpu')}",
             f"- torch {torch.__version__}, transformers {transformers.__version__}, python "
             f"{platform.python_version()}", f"- date: {datetime.date.today().isoformat()}",
             f"- command: `{command}`",
             f"- model: random Llama shape ({LLAMA_SHAPE}), 124M parameters, float32, saved with save_pretrained; "
             f"batch 1, prompt {prompt_len} tokens, {new_tokens} new tokens, greedy; median of {rounds} rounds, "
             "every variant once per round in turn; tokens/s counts the new tokens over the whole generate call, "
             "prefill included",
             f"- load average (1 min) before and after the run: {load[0]} and {load[1]}{busy(load)}", "",
             "| variant | tokens/s | vs sdpa | greedy tokens vs sdpa's |", "|---|---|---|---|"]
    for name, (seconds, toks) in results.items():
        diff = first_difference(toks, results["transformers, sdpa"][1])
        same = "identical" if diff is None else f"first difference at new token {diff}"
        lines.append(f"| {name} | {new_tokens / seconds:.1f} | {new_tokens / seconds / sdpa_rate:.2f}x | {same} |")
    return "\n".join(lines) + "\n"


def load_average() -> str:
    return open("/proc/loadavg").read().split()[0] if sys.platform == "linux" else "n/a"


def busy(load: tuple) -> str:
    """The record's note when the load average exceeded the CPU count: other work shared the cores."""
    if any(x != "n/a" and float(x) > os.cpu_count() for x in load):
        return (f" on {os.cpu_count()} CPUs: other work shared the machine, so these times are not a quiet machine's "
                "(a rerun on one is needed before comparing variants)")
    return ""


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench_transformers_backend.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3, help="timed generate calls per variant (median)")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    load_before = load_average()
    hf = hf_model("llama", "cpu")
    ids = prompts(1, args.prompt_len, hf.config.vocab_size, "cpu")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        hf.save_pretrained(tmp)
        results = run(hf, Path(tmp), ids, args.new_tokens, args.rounds)
    text = markdown(results, command_line(), args.prompt_len, args.new_tokens, args.rounds,
                    (load_before, load_average()))
    print(text)
    if args.record:
        Path(args.record).write_text("# transformers generate on our kernels, step by step\n\n" + text)
