"""Replays cases that failed on a GPU (saved by `python -m pytransformer check --dump DIR`, which
benchmarks/gpu_check.sh keeps under DIR/cases/) through the host emulator's build of the same CUDA kernels, or with
--cpu through the CPU kernels, and prints each one's worst row error over its bound: the GPU's saved output, the
replayed one, and for an attention gradient the replayed backward of the GPU's own forward output.

    python tools/cuda_emulator/replay.py [--cpu] CASE.pt ...    # exit 1 when a replayed result fails its bound
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=Path, metavar="CASE.pt")
    ap.add_argument("--cpu", action="store_true", help="the CPU kernels instead of the emulated CUDA kernels")
    args = ap.parse_args(argv)
    from pytransformer import check
    if args.cpu:
        ops = torch.ops.pytransformer
    else:
        from tools.cuda_emulator import build
        ops = build.load()
    failed = False
    for path in args.cases:
        case = torch.load(path)
        print(f"\n{path}: {case['name']}\n\n| result | worst row error / bound | relative error |\n|---|---|---|")
        for what, ratio, err in check.replay(case, ops):
            print(f"| {what} | {ratio:.3f} | {err:.2e} |")
            failed |= what.startswith("replayed") and not ratio <= 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
