"""How the extension is compiled, in one place for setup.py, CMakeLists.txt and tools/check_cuda.sh: compiler flags,
the CPU instruction-set (ISA) levels, and the per-ISA translation units of the CPU kernels.

Every csrc/cpu/<op>_kernel.cpp is compiled once per ISA level through a generated unit that sets the compiler target
with a pragma, defines CPU_CAPABILITY (the inline namespace of at::vec and of our kernels) and PT_ISA_LEVEL, then
includes the kernel file; csrc/cpu/isa.h picks the best level the processor supports at run time. The other
csrc/cpu/*.cpp files (glue: checks, dispatch, registration) are compiled once.

    python tools/build_config.py sources OUT_DIR     # writes the per-ISA units under OUT_DIR; prints every C++ source
    python tools/build_config.py cxx-flags           # the C++ flags of the extension, one a line
    python tools/build_config.py nvcc-flags          # the nvcc flags of the extension (with torch's), one a line
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"

# -fopenmp: at::parallel_for is an inline OpenMP loop in torch's headers, serial in code compiled without it. The
# extension then needs libgomp.so.1, which is torch's own copy once torch is imported (same soname).
# -g0: Python's default flags carry -g; without debug info the objects are ~30x smaller and compile ~20% faster
# (symbols stay, so backtraces still name functions).
# -ffp-contract=off: a multiply and an add fuse into one fma only where the source says fmadd; GCC's default (fast)
# fuses them anywhere, so two copies of one expression could round differently (LayerNorm's backward with one feature
# gave dx = +-0.2 instead of 0: g * w - mean(g * w) fused on one side only, times rstd ~ 1e6).
# HOST_CODEGEN_FLAGS go to the host compiler of the .cu kernel units too (nvcc -Xcompiler): without them nvcc's host
# pass gives its inline functions and templates default visibility (exported from the extension, where the dynamic
# linker may bind them to another library's copy) and compiles torch's inline OpenMP code serial: a second flag set
# for the same host code.
HOST_CODEGEN_FLAGS = ["-fvisibility=hidden", "-fopenmp", "-ffp-contract=off"]
CXX_FLAGS = ["-O3", "-g0", "-std=c++20", *HOST_CODEGEN_FLAGS]
LINK_FLAGS = ["-fopenmp"]
NVCC_FLAGS = ["-O3", "-std=c++20", "--use_fast_math", "--expt-relaxed-constexpr", "-lineinfo",
              "-Xcompiler=" + ",".join(HOST_CODEGEN_FLAGS)]
CUDA_MACRO = "PT_WITH_CUDA"  # defined in a CUDA build, for the C++ and CUDA sources alike
# The GPU architectures of a CUDA build when TORCH_CUDA_ARCH_LIST is unset and no GPU is visible (torch would otherwise
# build for the visible GPUs): Turing (T4; SIMT kernels only, the tensor-core kernels need 8.0), Ampere (A100, A10 /
# RTX 30), Ada (L4 / RTX 40), Hopper, and PTX for later GPUs.
DEFAULT_CUDA_ARCH_LIST = "7.5;8.0;8.6;8.9;9.0+PTX"

# ISA level -> GCC target features; the level numbers match IsaLevel in csrc/cpu/isa.h. A unit sets its own target
# with a pragma (one set of flags serves every source) and defines the feature macros that the pragma does not
# (headers such as sleef.h test them).
_AVX2 = ["avx", "avx2", "fma", "f16c"]
_AVX512 = _AVX2 + ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
ISA_LEVELS = [("DEFAULT", 0, []), ("AVX2", 1, _AVX2), ("AVX512", 2, _AVX512)]
# Standard headers a unit with a target includes before its pragma, so that their functions keep the default target.
# From GCC 13, std::allocator's members are always_inline; declared under the pragma they would get the unit's target
# while the implicitly defined members that call them keep the default one, which GCC refuses to inline ("inlining
# failed in call to 'always_inline' ... target specific option mismatch", GCC bug 109753).
_STD_HEADERS = ["algorithm", "array", "atomic", "cmath", "cstdint", "cstdlib", "cstring", "functional", "limits",
                "memory", "optional", "sstream", "string", "type_traits", "utility", "vector"]


def kernel_sources() -> list[Path]:
    """The CPU kernel files, each compiled once per ISA level."""
    return sorted((CSRC / "cpu").glob("*_kernel.cpp"))


def glue_sources() -> list[Path]:
    """The C++ files compiled once: the registration unit and the CPU glue of every op."""
    cpu = [p for p in sorted((CSRC / "cpu").glob("*.cpp")) if not p.stem.endswith("_kernel")]
    return [CSRC / "registration.cpp"] + cpu


def cuda_sources() -> list[Path]:
    """The sources a CUDA build adds: the CUDA glue (csrc/cuda/*.cpp: checks, allocation, registration; compiled by the
    C++ compiler with CXX_FLAGS, as the CPU glue) and the kernel units (csrc/cuda/*.cu, compiled by nvcc)."""
    return sorted((CSRC / "cuda").glob("*.cpp")) + sorted((CSRC / "cuda").glob("*.cu"))


def isa_units(out_dir: Path) -> list[Path]:
    """Write one unit per (kernel file, ISA level) under out_dir (only where its text changed, so that an unchanged
    unit keeps its timestamp and is not recompiled); return their paths, every baseline unit first, then AVX2, then
    AVX-512. That is the link order, and it matters: an inline function or template of a header that is not in a
    CPU_CAPABILITY namespace (std::vector's, say) is compiled into every unit that uses it, each copy for that unit's
    ISA, and the linker keeps the first copy for all callers: the lowest level's, which every processor runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, level, features in ISA_LEVELS:
        for src in kernel_sources():
            text = "".join([
                "".join(f"#include <{h}>\n" for h in _STD_HEADERS) + f'#pragma GCC target("{",".join(features)}")\n'
                if features else "",
                "".join(f"#define __{f.upper()}__ 1\n" for f in features),
                f"#define CPU_CAPABILITY {name}\n#define CPU_CAPABILITY_{name}\n#define PT_ISA_LEVEL {level}\n",
                f'#include "{src}"\n',
            ])
            path = out_dir / f"{src.stem}_{name.lower()}.cpp"
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            paths.append(path)
    return paths


def nvcc_flags() -> list[str]:
    """The flags nvcc gets in a CUDA build: torch.utils.cpp_extension's common ones, ours, and the CUDA macro."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
    return COMMON_NVCC_FLAGS + [f for f in NVCC_FLAGS if f not in COMMON_NVCC_FLAGS] + [f"-D{CUDA_MACRO}"]


def cuda_arch_list(environ, gpu_visible: bool) -> str | None:
    """The TORCH_CUDA_ARCH_LIST a CUDA build should set: None (keep the user's list, or torch's detection of the visible
    GPUs), else DEFAULT_CUDA_ARCH_LIST (torch's detection fails without a GPU)."""
    return None if environ.get("TORCH_CUDA_ARCH_LIST") or gpu_visible else DEFAULT_CUDA_ARCH_LIST


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "sources":
        print("\n".join(str(p) for p in glue_sources() + isa_units(Path(argv[1]))))
    elif argv == ["cxx-flags"]:
        print("\n".join(CXX_FLAGS))
    elif argv == ["nvcc-flags"]:
        print("\n".join(nvcc_flags()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
