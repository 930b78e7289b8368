"""Builds the CUDA kernels (csrc/cuda: norms, masked_softmax, attention, kv_cache_append, decode_attention,
int8_linear) and their glue for the CPU, through a host emulator, and returns their op namespace,
torch.ops.pytransformer_emu (with the primitives' probe ops of tools/ptx_probes.cu, rewritten the same way, as
torch.ops.pytransformer_probes).

csrc/cuda's kernel units (*.cu), glue (*.cpp) and headers are rewritten (launches `k<<<g, b, s, st>>>(args)` ->
`emu::launcher(k, g, b, s, st)(args)`, no device guard or stream, __shared__ arrays as static arrays registered with the
sanitizers, `t.data_ptr()` as `emu::extent(t, t.data_ptr())`, the fast-math functions as those of fast_math.h, ops
registered for the CPU under torch.ops.pytransformer_emu with the schemas of csrc/registration.cpp) into
build/cuda_emulator, line for line (#line names the original), and compiled with g++, -fsanitize=thread (no TSan
runtime: sanitizer.cpp takes the instrumentation's calls), -ftrivial-auto-var-init=pattern (a local read before it is
written holds garbage, as a GPU register does) and gcov's line counters for csrc/cuda's code (coverage.py) against
prelude.h (fibers for threads), sanitizer.cpp and stubs.cpp (which also poisons every fresh CPU allocation: see
README.md). The glue, the launch logic and the kernels run unchanged; PT_CUDA_EMULATOR swaps only the bodies of the
instruction primitives of csrc/cuda/mma.cuh (inline PTX) for those of ptx.h here. The CUDA kernel cases of tests/ops run
against this namespace with `python -m pytest tests/ops -m cuda --cuda-emulator` (make cuda-emulate); see README.md
here.
"""
import re
from pathlib import Path

import torch
from torch.utils.cpp_extension import load as load_extension

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "build" / "cuda_emulator"
LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)<<<(.*?)>>>\(", re.S)
FAST_MATH = re.compile(r"(?<![\w:.])(exp2f|__expf|expf|log2f|logf|rsqrtf)\(")  # see fast_math.h
RECIPROCAL = re.compile(r"(?<![\w.])1\.f / ([A-Za-z_][\w.]*(?:\[[^\]]*\])*)")  # 1.f / x: rcp.approx
# gcov's line counters, updated atomically: -fsanitize=thread leaves atomic updates alone, where it would send plain
# ones through the sanitizers (coverage.py reads the counts)
COVERAGE_FLAGS = ["--coverage", "-fprofile-update=atomic"]
DATA_PTR = re.compile(r"\b(\w+)\.(?:const_|mutable_)?data_ptr(?:<[\w:]+>)?\(\)")


def rewrite(text: str) -> str:
    text = LAUNCH.sub(lambda m: f"emu::launcher({m.group(1)}, {m.group(2)})(", text)
    text = re.sub(r"c10::cuda::CUDAGuard guard\([^;]*\);", "", text)
    text = text.replace("c10::cuda::getCurrentCUDAStream()", "cudaStream_t{}")
    text = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?([\w ]+?) (\w+)\[\];",
                  r"\1* \2 = reinterpret_cast<\1*>(emu::dynamic_smem);", text)
    text = re.sub(r"__shared__ ([\w:<>]+) (\w+)((?:\[[^\]]+\])+);",
                  r'static \1 \2\3; emu::shared_array(\2, sizeof \2, "\2");', text)
    text = FAST_MATH.sub(r"emu::fast::\1(", text)
    text = RECIPROCAL.sub(r"emu::fast::rcp(\1)", text)
    text = DATA_PTR.sub(lambda m: f"emu::extent({m.group(1)}, {m.group(0)})", text)
    # CUDA registrations become CPU ones: pytransformer's under pytransformer_emu, the probes' under their own name
    text = re.sub(r"TORCH_LIBRARY_IMPL\(pytransformer(\w*), CUDA, m\)",
                  lambda m: f"TORCH_LIBRARY_IMPL(pytransformer{m.group(1) or '_emu'}, CPU, m)", text)
    return re.sub(r"#include <c10/cuda/CUDA(Guard|Stream)\.h>\n", "\n", text)


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


def rewritten(source: Path, prelude: bool = False) -> str:
    """The rewrite of `source`, its lines numbered as the original's (#line): compiler messages, the sanitizers'
    reports and the line coverage name the original file and line; prelude: prelude.h included first (a .cu file)."""
    return ('#include "prelude.h"\n' if prelude else "") + f'#line 1 "{source}"\n' + rewrite(source.read_text())


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` unless the file already holds it (an unchanged source keeps its timestamp: no recompile)."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def load():
    """Build (incrementally: ninja) and load the emulated kernels; return torch.ops.pytransformer_emu."""
    src = OUT / "src"
    (src / "csrc" / "cuda").mkdir(parents=True, exist_ok=True)
    for header in (ROOT / "csrc").glob("*.h"):
        write_if_changed(src / "csrc" / header.name, rewritten(header))
    write_if_changed(src / "probes.cpp", rewritten(HERE / "probes.cpp"))
    write_if_changed(src / "ptx_probes_cu.cpp", rewritten(HERE.parent / "ptx_probes.cu", prelude=True))
    sources = [HERE / "stubs.cpp", HERE / "sanitizer.cpp", src / "probes.cpp", src / "ptx_probes_cu.cpp"]
    for f in sorted((ROOT / "csrc" / "cuda").iterdir()):
        if f.suffix in (".cuh", ".h"):
            write_if_changed(src / "csrc" / "cuda" / f.name, rewritten(f))
        elif f.suffix in (".cu", ".cpp"):  # a kernel unit, or the glue
            sources.append(src / "csrc" / "cuda" / (f"{f.stem}_cu.cpp" if f.suffix == ".cu" else f.name))
            write_if_changed(sources[-1], rewritten(f, prelude=True))
    sources.append(src / "schemas.cpp")
    write_if_changed(sources[-1], schemas())
    (OUT / "obj").mkdir(exist_ok=True)
    load_extension(name="pytransformer_cuda_emulator", sources=[str(s) for s in sources], build_directory=str(OUT / "obj"),
         extra_include_paths=[str(HERE), str(src / "csrc"), "/usr/local/cuda/include"],
         extra_cflags=["-O1", "-std=c++20", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-DPT_CUDA_EMULATOR", "-w",
                      "-fsanitize=thread", "-fsanitize=alignment",
                      "--param=tsan-instrument-func-entry-exit=0",
                      "-ftrivial-auto-var-init=pattern", *COVERAGE_FLAGS,
                      f"-fprofile-filter-files={ROOT / 'csrc' / 'cuda'}/"],
         extra_ldflags=["--coverage"], is_python_module=False)
    return torch.ops.pytransformer_emu
