"""Command line: python -m pytransformer bench [--device ...]."""
import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytransformer", description="pytransformer command line")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="microbenchmarks of the ops against their PyTorch counterparts")
    bench.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.command == "bench":
        import torch
        from .bench import attention, decode, new_report, norm, quantize, softmax
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        report = new_report(device)
        norm.bench(report, device, shapes=norm.SHAPES[:1])
        softmax.bench(report, device, shapes=softmax.SHAPES[:1])
        attention.bench_attention(report, device, lengths=(1024,), runs=10)
        decode.bench(report, device, decode_cases=decode.DECODE_CASES[:1], append_cases=decode.APPEND_CASES[:1])
        quantize.bench_ops(report, device, cases=quantize.OP_CASES[:1])
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
