"""Build of pytransformer: the C++ CPU kernels always, the CUDA kernels when torch has CUDA and nvcc is found.

Flags, ISA levels and the per-ISA units come from tools/build_config.py (shared with CMakeLists.txt and
tools/check_cuda.sh). Environment: FORCE_CUDA=1 builds the CUDA sources even without a visible GPU; then
TORCH_CUDA_ARCH_LIST and MAX_JOBS are honoured by torch.utils.cpp_extension; without TORCH_CUDA_ARCH_LIST and without a
visible GPU the build targets tools/build_config.py's DEFAULT_CUDA_ARCH_LIST (7.5;8.0;8.6;8.9;9.0+PTX).

    python setup.py build_ext --inplace            # incremental: ninja recompiles only what changed (make build)
    pip install --no-build-isolation .             # or `pip wheel`, from a checkout or an sdist
"""
import importlib.util
import os
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
import torch

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("build_config", ROOT / "tools" / "build_config.py")
config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(config)


def with_cuda():
    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    return torch.version.cuda is not None and CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").exists()


def rel(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def extension():
    sources = rel(config.glue_sources() + config.isa_units(ROOT / "build" / "isa"))
    # Headers as dependencies: setuptools skips the build when no listed file is newer than the library; ninja then
    # tracks which objects each header reaches.
    depends = rel(sorted(p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".h", ".cuh")))
    depends += rel(config.kernel_sources())
    cxx = {"cxx": config.CXX_FLAGS}
    if not with_cuda():
        return CppExtension("pytransformer._C", sources, depends=depends, extra_compile_args=cxx,
                            extra_link_args=config.LINK_FLAGS)
    # The glue (csrc/cuda/*.cpp) is compiled by the C++ compiler, which finds cuda_runtime.h only through CUDA_HOME.
    # torch takes CUDA_HOME from the environment or the folder above the nvcc on PATH, which a wrapper script
    # (/usr/local/bin/nvcc running the toolkit's) leads astray.
    if torch.version.cuda is None:
        raise SystemExit(f"pytransformer: FORCE_CUDA=1 needs a CUDA build of torch, and torch {torch.__version__} "
                         "has no CUDA")
    if CUDA_HOME is None or not (Path(CUDA_HOME) / "include" / "cuda_runtime.h").exists():
        raise SystemExit(f"pytransformer: CUDA_HOME={CUDA_HOME} has no include/cuda_runtime.h: set CUDA_HOME to the "
                         "CUDA toolkit's root (the folder of bin/nvcc and include/)")
    archs = config.cuda_arch_list(os.environ, torch.cuda.is_available())
    if archs:
        print(f"pytransformer: no GPU visible and TORCH_CUDA_ARCH_LIST unset: building for {archs}")
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    return CUDAExtension("pytransformer._C", sources + rel(config.cuda_sources()), depends=depends,
                         define_macros=[(config.CUDA_MACRO, "1")],
                         extra_compile_args={**cxx, "nvcc": config.NVCC_FLAGS}, extra_link_args=config.LINK_FLAGS)


setup(
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
