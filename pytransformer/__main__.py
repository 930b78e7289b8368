"""Command line: python -m pytransformer demo | bench | bench-generate | count | generate | check (--help for the
options)."""
import argparse
import json
import sys
from pathlib import Path


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _temperature(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite value >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _directory(text: str) -> str:
    from pathlib import Path
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return text


def _device(text: str) -> str:
    import torch

    import pytransformer
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu or cuda, got {text!r}")
    if device.type == "cuda" and not (torch.cuda.is_available() and pytransformer.with_cuda()):
        raise argparse.ArgumentTypeError("CUDA is not available (no GPU, or a CPU-only build of pytransformer)")
    return text


def _check_ops() -> list[str]:
    from .check import OPS
    return list(OPS)


def _default_device() -> str:
    import torch

    import pytransformer
    return "cuda" if torch.cuda.is_available() and pytransformer.with_cuda() else "cpu"


def parser() -> argparse.ArgumentParser:
    from .bench.suite import FAMILIES
    from .demo import DemoConfig
    from .models import CONFIGS

    p = argparse.ArgumentParser(prog="python -m pytransformer", description="pytransformer command line")
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,bench,bench-generate,count,generate,check}")
    device_help = "cpu or cuda (default: cuda when available)"

    demo = sub.add_parser("demo", help="train a small encoder-decoder to reverse digit strings, then decode it",
                          description="Train a small Seq2SeqTransformer to reverse digit strings (about two minutes "
                                      "on a CPU), decode a held-out set greedily and with beam search, with and "
                                      "without the KV cache, and plot the loss and a cross-attention map.")
    demo.add_argument("--device", type=_device, help=device_help)
    demo.add_argument("--steps", type=_positive_int, default=DemoConfig.steps, help="training steps (default %(default)s)")
    demo.add_argument("--seed", type=int, default=DemoConfig.seed, help="random seed (default %(default)s)")
    demo.add_argument("--held-out", type=_positive_int, default=DemoConfig.held_out,
                      help="held-out strings to decode (default %(default)s)")
    demo.add_argument("--threads", type=_positive_int, default=1,
                      help="CPU threads (default %(default)s: this model is too small to gain from more, and extra "
                           "threads stall when the machine is busy)")
    demo.add_argument("--out-dir", default="demo_out", help="where the PNGs go (default %(default)s)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")

    bench = sub.add_parser("bench", help="microbenchmarks of every op against its PyTorch counterpart",
                           description="Time every op against its PyTorch counterpart on the device: a table of "
                                       "times, throughput, fraction of the measured ceiling and ratio.")
    bench.add_argument("--device", type=_device, help=device_help)
    bench.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    bench.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="op families to run")
    bench.add_argument("--runs", type=_positive_int, help="timed runs per case (default: per family)")
    bench.add_argument("--threads", type=_positive_int, help="CPU threads (default: PyTorch's, one per core)")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    bench.add_argument("--plot", metavar="FILE.png", help="plot throughput against size per op")
    bench.add_argument("--record", metavar="FILE.md", help="write the results as markdown")
    bench.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)  # tiny sizes: a smoke test

    sub.add_parser("bench-generate", add_help=False,
                   help="generation tokens/s of a GPT-2, Llama or Marian shape against Hugging Face, CTranslate2 "
                        "and llama.cpp (its options: bench-generate --help)")

    count = sub.add_parser("count", help="parameters by component and KV-cache bytes per token of the named configs")
    count.add_argument("--config", choices=[*CONFIGS, "all"], default="all", help="a named config (default: all)")

    gen = sub.add_parser("generate", help="continue a prompt with a Hugging Face checkpoint directory",
                         description="Load a save_pretrained directory (gpt2, llama, mistral, qwen2, qwen3, phi3 or "
                                     "gemma3_text safetensors and its tokenizer.json), continue the prompt, writing "
                                     "the text as it is generated, then the prefill and decode tokens/s. Greedy "
                                     "unless --temperature, --top-p or --top-k is given.")
    gen.add_argument("--model", type=_directory, required=True, metavar="DIR", help="the checkpoint directory")
    gen.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N",
                     help="tokens to generate (default %(default)s; fewer at the end-of-sequence token)")
    gen.add_argument("--int8", action="store_true", help="weight-only int8 linear layers")
    gen.add_argument("--bf16", action="store_true", help="bfloat16 weights and activations")
    gen.add_argument("--bf16-cache", action="store_true",
                     help="a bfloat16 KV cache: half a float32 or int8 model's cache memory")
    gen.add_argument("--compile", action="store_true",
                     help="each decoding step as one compiled library (generate(compile=True)): compiled before the "
                          "prompt runs, tens of seconds the first time for a model, then loaded from "
                          "$PYTRANSFORMER_CACHE")
    gen.add_argument("--temperature", type=_temperature, metavar="T", help="sampling temperature (0: greedy)")
    gen.add_argument("--top-p", type=_probability, metavar="P", help="nucleus sampling mass")
    gen.add_argument("--top-k", type=_nonnegative_int, metavar="K", help="sample among the K most likely tokens (0: all)")
    gen.add_argument("--seed", type=int, metavar="S", help="random seed of the sampling")
    gen.add_argument("--device", type=_device, help=device_help)
    gen.add_argument("--threads", type=_positive_int, metavar="N", help="CPU threads (default: PyTorch's)")

    check = sub.add_parser("check", help="correctness of every op's kernels on this device against float64 references",
                           description="Run the correctness cases of every op (every kernel path, mask, layout and "
                                       "dtype) on the device against float64 references and print a table: op, dtype, "
                                       "cases, the worst row's error over its bound, failures. Exit status 1 on any "
                                       "failure. The first command to run on a new GPU.")
    check.add_argument("--device", type=_device, help=device_help)
    check.add_argument("--quick", action="store_true", help="the short shape lists (seconds on a GPU)")
    ops = _check_ops()
    check.add_argument("--op", action="append", choices=ops, metavar="OP",
                       help=f"check only this op (repeatable; default: all of {', '.join(ops)})")
    check.add_argument("--dtype", action="append", choices=["float32", "float16", "bfloat16"], metavar="DTYPE",
                       help="check only this dtype's cases (repeatable; default: float32, float16 and bfloat16)")
    check.add_argument("--dump", type=Path, metavar="DIR",
                       help="save each failing comparison (its operands, output and float64 reference) as DIR/NNN.pt")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench-generate"]:  # the options are those of benchmarks/bench_generate.py
        from .bench.generate import main as bench_generate
        bench_generate(argv[1:])
        return 0
    args = parser().parse_args(argv)
    if args.command == "demo":
        import torch

        from .demo import DemoConfig, run
        torch.set_num_threads(args.threads)
        run(DemoConfig(steps=args.steps, seed=args.seed, held_out=args.held_out), args.device or _default_device(), args.out_dir,
            progress=not args.no_progress)
    elif args.command == "bench":
        import torch

        from .bench import record
        from .bench.plot import plot_report
        from .bench.suite import run
        from .plotting import pyplot
        if args.plot:
            try:
                pyplot()
            except ImportError as e:
                parser().error(f"--plot: {e}")
        if args.threads:
            torch.set_num_threads(args.threads)
        report = run(args.device or _default_device(), getattr(torch, args.dtype), args.only, args.runs, args.quick)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report.to_dict(), f, indent=1)
        if args.plot:
            plot_report(report, args.plot)
        if args.record:
            record(report, args.record, "Benchmark of every op", ["-m", "pytransformer"] + argv)
    elif args.command == "generate":
        import torch

        from .models import textgen
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            prepared = textgen.prepare(args.model, args.prompt, int8=args.int8, bf16=args.bf16,
                                       device=args.device or _default_device())
            textgen.stream(*prepared, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_p=args.top_p, top_k=args.top_k, seed=args.seed, eos_id=textgen.eos_tokens(args.model),
                           cache_dtype=torch.bfloat16 if args.bf16_cache else None, compile=args.compile)
        except (ValueError, FileNotFoundError) as e:  # a broken checkpoint directory or prompt: one line, status 2
            message = " ".join(str(e).splitlines())
            print(f"python -m pytransformer generate: error: {message}", file=sys.stderr)
            return 2
    elif args.command == "check":
        import torch

        from . import check
        device = args.device or _default_device()
        dtypes = [getattr(torch, d) for d in args.dtype] if args.dtype else None
        checks = check.run(device, quick=args.quick, ops=args.op, dump=args.dump, dtypes=dtypes)
        what = ", ".join((args.op or []) + (args.dtype or []))
        print(f"pytransformer check on {device}{' (quick)' if args.quick else ''}{f' ({what})' if what else ''}\n\n"
              f"{check.table(checks)}")
        if checks.failures:
            print(f"\n{len(checks.failures)} failures:\n" + "\n".join(checks.failures[:50]))
            if args.dump:
                print(f"failing cases saved under {args.dump}")
            return 1
        print(f"\nall {sum(cases for cases, _, _ in checks.stats.values())} cases pass")
    else:
        from .models import CONFIGS
        from .models.count import report
        print("\n\n".join(report(name) for name in (CONFIGS if args.config == "all" else [args.config])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
