"""Weight-only int8 quantization of a GPT-2-small-shaped DecoderLM (random weights): state-dict size, logits error
against the float model, and greedy generation tokens/s of both on the same device in the same run; the record also
has the op benchmark of bench/int8_linear.py."""
import argparse
import copy
import datetime
import statistics

import torch

from .. import quantize
from ..models import DecoderLM, count_parameters, gpt2_small
from ..quantization import state_dict_bytes
from . import command_line, device_name, int8_linear, matmul_ceiling, new_report
from .generate import timed


def logits_error(model, quantized, ids) -> dict:
    """Max and mean |logits error| of the quantized model, the float logits' scale, and next-token agreement."""
    with torch.no_grad():
        want, got = model(ids).float(), quantized(ids).float()
    err = (got - want).abs()
    return {"max_err": err.max().item(), "mean_err": err.mean().item(), "max_abs": want.abs().max().item(),
            "mean_abs": want.abs().mean().item(), "top1": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}


def bench(device, config, batch_sizes, prompt_len, new_tokens, runs):
    """Sizes, logits error and tokens/s rows (batch, variant, tokens/s) of the float and the quantized model."""
    torch.manual_seed(0)
    model = DecoderLM(config).to(device).eval()
    quantized = quantize(copy.deepcopy(model))
    sizes = {"float": state_dict_bytes(model), "int8": state_dict_bytes(quantized), "parameters": count_parameters(model)}
    error = logits_error(model, quantized, torch.randint(0, config.vocab_size, (4, prompt_len), device=device))
    print(f"state dict: {sizes['float'] / 2**20:.1f} MiB -> {sizes['int8'] / 2**20:.1f} MiB; logits error max "
          f"{error['max_err']:.4g} mean {error['mean_err']:.4g}", flush=True)
    rows = []
    for batch in batch_sizes:
        ids = torch.randint(0, config.vocab_size, (batch, prompt_len), device=device)
        variants = {"float": model, "int8": quantized}
        times = {name: [] for name in variants}
        for m in variants.values():
            m.generate(ids, 4)  # warm-up
        for _ in range(runs):  # round-robin, so that load changes on a shared machine hit both alike
            for name, m in variants.items():
                times[name].append(timed(lambda: m.generate(ids, new_tokens), device))
        for name in variants:
            rate = batch * new_tokens / statistics.median(times[name])
            rows.append((batch, name, rate))
            print(f"| {batch} | {name} | {rate:.1f} |", flush=True)
    return sizes, error, rows


def markdown(model_desc, sizes, error, rows, device, command, prompt_len, new_tokens, runs) -> str:
    lines = [f"- device: {device_name(device)}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`",
             f"- model: {model_desc}; greedy generation, prompt {prompt_len} tokens, {new_tokens} new tokens, "
             f"median of {runs} round-robin runs", "",
             "| | float32 | int8 weights | ratio |", "|---|---|---|---|",
             f"| state dict (MiB) | {sizes['float'] / 2**20:.1f} | {sizes['int8'] / 2**20:.1f} | "
             f"{sizes['int8'] / sizes['float']:.3f} |", "",
             f"Logits error (4 x {prompt_len} tokens): max |err| {error['max_err']:.4g} (max |logit| "
             f"{error['max_abs']:.4g}), mean |err| {error['mean_err']:.4g} (mean |logit| {error['mean_abs']:.4g}); "
             f"argmax agreement {error['top1']:.1%}.", "",
             "| batch | variant | tokens/s | int8 vs float |", "|---|---|---|---|"]
    fp = {b: r for b, name, r in rows if name == "float"}
    lines += [f"| {b} | {name} | {r:.1f} | {r / fp[b]:.2f}x |" for b, name, r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="timed generate calls per variant, round-robin (median)")
    p.add_argument("--op-runs", type=int, default=20, help="timed calls per op case, interleaved (median)")
    p.add_argument("--n-layers", type=int, default=12, help="layers of the GPT-2-small-shaped model")
    p.add_argument("--record", help="write the results as markdown to this file")
    args = p.parse_args(argv)
    config = gpt2_small(dropout=0.0, n_layers=args.n_layers)
    report = new_report(args.device)
    report.ceiling_flops_s = matmul_ceiling(args.device)
    int8_linear.bench(report, args.device, runs=args.op_runs)
    print("| batch | variant | tokens/s |\n|---|---|---|", flush=True)
    sizes, error, rows = bench(args.device, config, args.batch_sizes, args.prompt_len, args.new_tokens, args.runs)
    model_desc = f"GPT-2 small shape, {args.n_layers} layers ({sizes['parameters']:,} parameters, random weights, " \
                 "float32)"
    if args.record:
        with open(args.record, "w") as f:
            command = command_line()
            f.write("# Weight-only int8 quantization benchmark\n\n" + markdown(
                model_desc, sizes, error, rows, args.device, command, args.prompt_len, args.new_tokens, args.runs)
                + "\n## ops.int8_linear vs F.linear (float32 weight)\n\n" + report.markdown(command))


if __name__ == "__main__":
    main()
