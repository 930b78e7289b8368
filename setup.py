"""Build of pytransformer: the C++ CPU kernels always, the CUDA kernels when torch has CUDA and nvcc is found.

Environment: FORCE_CUDA=1 builds the CUDA sources even without a visible GPU; TORCH_CUDA_ARCH_LIST and MAX_JOBS are
honoured by torch.utils.cpp_extension. Each csrc/cpu/<op>.cpp is compiled once per CPU ISA level (see csrc/cpu/isa.h).
"""
import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
# ISA level -> GCC target; the level numbers match IsaLevel in csrc/cpu/isa.h.
# BuildExtension has one set of flags for all sources, so each wrapper sets its own target with a pragma and defines
# the feature macros that the pragma does not (headers such as sleef.h test them).
_AVX2 = ["avx", "avx2", "fma", "f16c"]
_AVX512 = _AVX2 + ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
ISA_LEVELS = [("DEFAULT", 0, []), ("AVX2", 1, _AVX2), ("AVX512", 2, _AVX512)]


def isa_wrappers():
    """Generate one translation unit per (CPU kernel file, ISA level) under build/isa; return their paths."""
    out_dir = ROOT / "build" / "isa"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for src in sorted((CSRC / "cpu").glob("*_kernel.cpp")):
        for name, level, features in ISA_LEVELS:
            text = "".join([
                f'#pragma GCC target("{",".join(features)}")\n' if features else "",
                "".join(f"#define __{f.upper()}__ 1\n" for f in features),
                f"#define CPU_CAPABILITY {name}\n#define CPU_CAPABILITY_{name}\n#define PT_ISA_LEVEL {level}\n",
                f'#include "{src}"\n',
            ])
            path = out_dir / f"{src.stem}_{name.lower()}.cpp"
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            paths.append(str(path.relative_to(ROOT)))
    return paths


def with_cuda():
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").exists()


def extension():
    glue = sorted(str(p.relative_to(ROOT)) for p in (CSRC / "cpu").glob("*.cpp") if not p.stem.endswith("_kernel"))
    sources = ["csrc/registration.cpp"] + glue + isa_wrappers()
    # -fopenmp: at::parallel_for is an inline OpenMP loop in torch's headers, serial in code compiled without it. The
    # extension then needs libgomp.so.1, which is torch's own copy once torch is imported (same soname).
    cxx = ["-O3", "-std=c++20", "-fvisibility=hidden", "-fopenmp"]
    link = ["-fopenmp"]
    if not with_cuda():
        return CppExtension("pytransformer._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=link)
    sources += sorted(str(p.relative_to(ROOT)) for p in (CSRC / "cuda").glob("*.cu"))
    nvcc = ["-O3", "-std=c++20", "--use_fast_math", "--expt-relaxed-constexpr", "-lineinfo"]
    return CUDAExtension("pytransformer._C", sources, define_macros=[("PT_WITH_CUDA", "1")],
                         extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=link)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
