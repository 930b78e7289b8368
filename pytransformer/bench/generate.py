"""Generation throughput of a GPT-2-small-shaped DecoderLM (random weights): with the KV cache, without it, and
Hugging Face GPT-2 `generate` (when transformers is installed) on the same device in the same run."""
import argparse
import datetime
import statistics
import sys
import time

import torch

from ..models import DecoderLM, gpt2_small
from . import device_name, sync


def timed(fn, device) -> float:
    """Wall time of one fn() call in seconds."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def bench(device, batch_sizes, prompt_len, new_tokens, uncached_new_tokens, runs, uncached_runs, with_hf=True):
    """Rows (batch, variant, new tokens, tokens/s) for each batch size."""
    torch.manual_seed(0)
    model = DecoderLM(gpt2_small(dropout=0.0)).to(device).eval()
    hf = None
    if with_hf:
        try:
            import transformers
        except ImportError:
            print("transformers is not installed: no Hugging Face baseline", flush=True)
        else:
            hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(pad_token_id=0)).to(device).eval()
    rows = []
    for batch in batch_sizes:
        ids = torch.randint(0, 50257, (batch, prompt_len), device=device)
        variants = [("ours, KV cache", new_tokens, lambda n: model.generate(ids, n)),
                    ("ours, no cache", uncached_new_tokens, lambda n: model.generate(ids, n, use_cache=False))]
        if hf is not None:
            mask = torch.ones_like(ids)
            variants.append(("Hugging Face GPT-2", new_tokens, lambda n: hf.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)))
        times = {name: [] for name, _, _ in variants}
        with torch.no_grad():
            for _, _, fn in variants:
                fn(4)  # warm-up
            for i in range(runs):  # round-robin, so that load changes on a shared machine hit every variant alike
                for name, n, fn in variants:
                    if name != "ours, no cache" or i < uncached_runs:
                        times[name].append(timed(lambda: fn(n), device))
        for name, n, _ in variants:
            rate = batch * n / statistics.median(times[name])
            rows.append((batch, name, n, rate))
            print(f"| {batch} | {name} | {n} | {rate:.1f} |", flush=True)
    return rows


def markdown(rows, device, command, prompt_len) -> str:
    lines = [f"- device: {device_name(device)}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`",
             f"- model: GPT-2 small shape (124.4M parameters, random weights, float32), prompt {prompt_len} tokens, "
             "greedy", "", "| batch | variant | new tokens | tokens/s | KV cache vs this |", "|---|---|---|---|---|"]
    cached = {b: r for b, name, _, r in rows if name == "ours, KV cache"}
    lines += [f"| {b} | {name} | {n} | {r:.1f} | {cached[b] / r:.2f}x |" for b, name, n, r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--uncached-new-tokens", type=int, default=None,
                   help="fewer new tokens for the uncached run (its cost per token grows with length, so a shorter "
                        "run overstates its tokens/s)")
    p.add_argument("--runs", type=int, default=3, help="timed generate calls per variant, round-robin (median)")
    p.add_argument("--uncached-runs", type=int, default=1, help="timed calls of the (slow) uncached variant")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    print(f"device: {device_name(args.device)}\n| batch | variant | new tokens | tokens/s |\n|---|---|---|---|", flush=True)
    rows = bench(args.device, args.batch_sizes, args.prompt_len, args.new_tokens,
                 args.uncached_new_tokens or args.new_tokens, args.runs, args.uncached_runs, not args.no_hf)
    if args.record:
        with open(args.record, "w") as f:
            f.write("# Generation benchmark\n\n" + markdown(rows, args.device, " ".join(["python"] + sys.argv),
                                                           args.prompt_len))


if __name__ == "__main__":
    main()
