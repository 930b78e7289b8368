"""Runs the CUDA kernels (csrc/cuda: norms, masked_softmax, attention, kv_cache_append, decode_attention,
int8_linear) on the CPU, without a GPU, through a host emulator.

csrc/cuda/*.cu and *.cuh are rewritten (launches `k<<<g, b, s, st>>>(args)` -> `emu::launcher(k, g, b, s, st)(args)`,
no device guard or stream, ops registered for the CPU under torch.ops.pytransformer_emu with the schemas of
csrc/registration.cpp) into build/cuda_emulator, compiled with g++ against prelude.h (fibers for threads) and
stubs.cpp, and checked with the cases of benchmarks/gpu_ops_check.py, for several pretend device sizes. The glue,
the launch logic and the kernels run unchanged; what the emulator cannot show is timing, memory-model races and
anything about real hardware (sanitizers on the GPU do that: benchmarks/gpu_check.sh).

    PYTHONPATH=. python .ci/cuda_emulator/run.py [--full] [--only FAMILY ...]   # needs the CPU extension built (make build)
"""
import argparse
import re
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "build" / "cuda_emulator"
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)<<<(.*?)>>>\(", re.S)


def rewrite(text: str) -> str:
    text = LAUNCH.sub(lambda m: f"emu::launcher({m.group(1)}, {m.group(2)})(", text)
    text = re.sub(r"c10::cuda::CUDAGuard guard\([^;]*\);", "", text)
    text = text.replace("c10::cuda::getCurrentCUDAStream()", "cudaStream_t{}")
    text = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?([\w ]+?) (\w+)\[\];",
                  r"\1* \2 = reinterpret_cast<\1*>(emu::dynamic_smem);", text)
    text = text.replace("TORCH_LIBRARY_IMPL(pytransformer, CUDA, m)", "TORCH_LIBRARY_IMPL(pytransformer_emu, CPU, m)")
    return re.sub(r"#include <c10/cuda/CUDA(Guard|Stream)\.h>\n", "", text)


def schemas() -> str:
    """The TORCH_LIBRARY block of csrc/registration.cpp, as library pytransformer_emu."""
    text = (ROOT / "csrc" / "registration.cpp").read_text()
    start = text.index("TORCH_LIBRARY(pytransformer, m) {")
    depth, end = 0, start
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0 and text[end] == "}":
            break
    block = text[start:end + 1].replace("TORCH_LIBRARY(pytransformer, m)", "TORCH_LIBRARY(pytransformer_emu, m)")
    return f"#include <torch/library.h>\n\n{block}\n"


def build():
    src = OUT / "src"
    (src / "csrc" / "cuda").mkdir(parents=True, exist_ok=True)
    for header in (ROOT / "csrc").glob("*.h"):
        shutil.copy(header, src / "csrc" / header.name)
    sources = [HERE / "stubs.cpp"]
    for f in sorted((ROOT / "csrc" / "cuda").iterdir()):
        if f.suffix == ".cuh":
            origin = HERE / f.name if f.name == "mma.cuh" else f  # inline PTX: the emulator's mma.cuh stands in
            (src / "csrc" / "cuda" / f.name).write_text(rewrite(origin.read_text()))
        elif f.suffix == ".cu":
            sources.append(src / "csrc" / "cuda" / f"{f.stem}_cu.cpp")
            sources[-1].write_text('#include "prelude.h"\n' + rewrite(f.read_text()))
    sources.append(src / "schemas.cpp")
    sources[-1].write_text(schemas())
    (OUT / "obj").mkdir(exist_ok=True)
    load(name="pytransformer_cuda_emulator", sources=[str(s) for s in sources], build_directory=str(OUT / "obj"),
         extra_include_paths=[str(HERE), str(src / "csrc"), "/usr/local/cuda/include"],
         extra_cflags=["-O1", "-std=c++20", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-w"], is_python_module=False)


FAMILIES = ("norm", "softmax", "attention", "kv_cache", "int8_linear")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="every shape of gpu_ops_check.py (about 5 minutes)")
    p.add_argument("--only", nargs="+", choices=FAMILIES, default=list(FAMILIES), help="op families to check")
    args = p.parse_args(argv)
    start = time.time()
    build()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_ops_check as check

    torch.manual_seed(0)  # the same cases on every run, as gpu_ops_check.py does on the GPU
    emu = torch.ops.pytransformer_emu
    check.ops = emu
    dtypes = check.DTYPES
    # Small device: persistent grids loop over many rows; large device: many partial rows, a row group per block.
    # int8_linear: few K slices on the small device, many (split-K partial sums) on the large one.
    for sms, blocks in ((2, 2), (64, 8)):
        emu.set_device(sms, blocks)
        if "norm" in args.only:
            check.check_norms(check.NORM_SHAPES if args.full else check.NORM_SHAPES_QUICK, dtypes, "cpu")
        if "int8_linear" in args.only:
            check.check_int8_linear(check.INT8_SHAPES if args.full else check.INT8_SHAPES_QUICK, dtypes, "cpu")
    if "softmax" in args.only:
        check.check_softmax(check.SOFTMAX_SHAPES if args.full else check.SOFTMAX_SHAPES_QUICK, dtypes, "cpu")
    if "attention" in args.only:
        check.check_attention(check.ATTENTION_SHAPES_QUICK, dtypes, "cpu", quick=True)  # --full too: fibers are slow
    # KV cache: a small device (one split a row) and a large one (several splits and the combine kernel); then the
    # checks the kernels make themselves while the stream pretends to be captured into a CUDA graph.
    for sms, blocks in ((2, 2), (64, 8)) if "kv_cache" in args.only else ():
        emu.set_device(sms, blocks)
        check.check_kv_cache(check.APPEND_SHAPES if args.full else check.APPEND_SHAPES_QUICK, dtypes, "cpu")
        check.check_decode(check.DECODE_SHAPES if args.full else check.DECODE_SHAPES_QUICK, dtypes, "cpu")

    def captured(fn):
        emu.set_capturing(True)
        try:
            return fn()
        finally:
            emu.set_capturing(False)
    if "kv_cache" in args.only:
        check.check_kv_device_checks("cpu", captured)
    print(f"\n{len(check.failures)} failures ({time.time() - start:.0f} s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
