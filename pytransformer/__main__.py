"""Command line: python -m pytransformer demo | bench | count (run with --help for the options)."""
import argparse
import json
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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


def _default_device() -> str:
    import torch

    import pytransformer
    return "cuda" if torch.cuda.is_available() and pytransformer.with_cuda() else "cpu"


def parser() -> argparse.ArgumentParser:
    from .bench.suite import FAMILIES
    from .demo import DemoConfig
    from .models import CONFIGS

    p = argparse.ArgumentParser(prog="python -m pytransformer", description="pytransformer command line")
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,bench,count}")
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

    count = sub.add_parser("count", help="parameters by component and KV-cache bytes per token of the named configs")
    count.add_argument("--config", choices=[*CONFIGS, "all"], default="all", help="a named config (default: all)")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
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
    else:
        from .models import CONFIGS
        from .models.count import report
        print("\n\n".join(report(name) for name in (CONFIGS if args.config == "all" else [args.config])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
