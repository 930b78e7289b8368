"""How the extension is built: facts a kernel test cannot see."""
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pytransformer._C as ext


def test_cpu_kernels_are_built_with_openmp():
    """at::parallel_for is an inline OpenMP loop in torch's headers: compiled without -fopenmp it runs every CPU kernel
    on one thread, with correct results, so only the library's imports show it (GOMP_parallel is what an OpenMP
    parallel region calls)."""
    assert b"GOMP_parallel" in Path(ext.__file__).read_bytes()


def test_every_cpu_kernel_is_registered_at_every_isa_level():
    """Each kernel table holds one function per level (0 baseline, 1 AVX2, 2 AVX-512); a registration whose level came
    from code shared by all levels (one inline function for every unit) would fill a single slot for all of them. The
    GEMM of int8_linear exists with AVX2 only (csrc/cpu/gemm.h: the glue takes it where AVX2 is the best level), its
    AMX product with AVX-512 only."""
    kernels = ext.cpu_kernels()
    assert len(kernels) >= 10
    assert {name: levels for name, levels in kernels.items() if levels != [0, 1, 2]} == {"int8_gemm_kernel": [1],
                                                                                         "int8_amx_kernel": [2]}


@pytest.mark.parametrize("value", ["", "avx512_256", "bogus"])
def test_a_cpu_capability_that_aten_ignores_changes_nothing(value):
    """ATEN_CPU_CAPABILITY=default|avx2|avx512 caps the CPU kernels (and turns the AVX-512 extensions off); another
    value, which ATen warns of and ignores, leaves the level and the extensions as they are without it."""
    code = "import torch, pytransformer._C as c; print(c.cpu_isa(), c.cpu_bf16_dot_products(), c.cpu_amx())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    runs = [subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout
            for e in (env, env | {"ATEN_CPU_CAPABILITY": value})]
    assert runs[1] == runs[0]


def test_no_standard_template_takes_the_kernels_vectors():
    """No std:: template is instantiated on at::vec's vectors in csrc/cpu (at::vec's reductions take VecPlus,
    csrc/cpu/vec_util.h, not std::plus<Vec>): the standard headers come before a kernel unit's target pragma
    (tools/build_config.py), so such a function, where the compiler does not inline it, is baseline code, which
    returns a vector in memory where the AVX2 and AVX-512 code returns it in registers: built with -O1 -fno-inline,
    those kernels crashed in attention's backward."""
    root = Path(__file__).resolve().parents[1] / "csrc" / "cpu"
    template = re.compile(r"std::[\w:]+<[^<>;]*\b(Vec|Vectorized|VecF)\b")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(root.glob("*.[ch]*"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if template.search(line.split("//")[0])]
    assert found == []


def test_each_kernel_function_has_one_home():
    """Each function at namespace scope in csrc/cpu's kernel files and the headers they share is defined in one file:
    the kernel files share namespace CPU_CAPABILITY (one per level), so two functions of one name and signature in two
    of them are one symbol, and where they are not inlined the linker keeps one body for both callers (attention's and
    masked_softmax's `dot` were two such bodies)."""
    root = Path(__file__).resolve().parents[1] / "csrc" / "cpu"
    definition = re.compile(r"^[A-Za-z_][\w:<>,\s*&]* [*&]?(\w+)\(")
    homes = {}
    for path in sorted(root.glob("*_kernel.cpp")) + sorted(root.glob("*.h")):
        lines = path.read_text().splitlines()
        for name in {m.group(1) for line in lines if (m := definition.match(line)) and not line.endswith(";")}:
            homes.setdefault(name, []).append(path.name)
    assert len(homes) > 50  # the pattern sees the definitions
    assert {name: files for name, files in homes.items() if len(files) > 1} == {}


def _functions_with(disassembly: str, opcode_bytes) -> dict[str, int]:
    """{function: count} of instructions whose first byte (after an address-size prefix) is in opcode_bytes."""
    found, fn = {}, None
    for line in disassembly.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            fn = m.group(1)
            continue
        parts = line.split("\t")
        raw = parts[1].split() if len(parts) > 2 else []
        first = raw[1] if raw[:1] == ["67"] and len(raw) > 1 else (raw[0] if raw else None)
        if first in opcode_bytes:
            found[fn] = found.get(fn, 0) + 1
    return found


@pytest.mark.skipif(shutil.which("objdump") is None or platform.machine() != "x86_64", reason="needs x86-64 objdump")
def test_avx512_code_stays_in_the_avx512_kernels():
    """Only functions of the AVX-512 kernel units (namespace ...::AVX512::) may hold EVEX-encoded (AVX-512)
    instructions, and the baseline kernels (...::DEFAULT::) no VEX either: an inline function of a header compiled into
    every ISA unit is one symbol, and the linker keeps one copy for all callers, which must be one every processor can
    run (tools/build_config.py links the baseline units first). A clone GCC makes of a function for one unit
    ("[clone .isra.0]", ".constprop", ".part") is a local symbol that only that unit calls, so it may hold the unit's
    instructions. ATen's vectors of a level (at::vec::AVX512::, at::vec::DEFAULT::) are that level's too, where the
    compiler leaves their functions out of line (a build at -O1 -fno-inline)."""
    text = subprocess.run(["objdump", "-d", "-C", ext.__file__], capture_output=True, text=True, check=True).stdout
    def in_namespace(fn, isa):  # demangled, or mangled where objdump cannot demangle (lambdas)
        return any(f"{ns}::{isa}::" in fn for ns in ("pytransformer::cpu", "at::vec")) or \
            f"13pytransformer3cpu{len(isa)}{isa}" in fn

    evex = _functions_with(text, {"62"})
    assert sum(n for f, n in evex.items() if in_namespace(f, "AVX512")) > 0  # the check sees the AVX-512 kernels
    assert {f: n for f, n in evex.items() if not in_namespace(f, "AVX512") and "[clone ." not in f} == {}
    vex = _functions_with(text, {"62", "c4", "c5"})
    assert {f: n for f, n in vex.items() if in_namespace(f, "DEFAULT")} == {}


def test_cuda_arch_list_without_a_gpu(monkeypatch):
    """FORCE_CUDA=1 with no visible GPU and no TORCH_CUDA_ARCH_LIST: torch's own detection fails (it asks the missing
    GPU for its capability); setup.py then sets the documented default list, which torch turns into nvcc flags."""
    import torch.utils.cpp_extension as cpp
    from tools import build_config
    assert build_config.cuda_arch_list({"TORCH_CUDA_ARCH_LIST": "9.0"}, gpu_visible=False) is None
    assert build_config.cuda_arch_list({}, gpu_visible=True) is None
    archs = build_config.cuda_arch_list({}, gpu_visible=False)
    assert archs == build_config.DEFAULT_CUDA_ARCH_LIST
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", archs)
    flags = cpp._get_cuda_arch_flags()
    assert "-gencode=arch=compute_75,code=sm_75" in flags and "-gencode=arch=compute_90,code=compute_90" in flags


def _includes(path: Path, seen: set) -> list[str]:
    """The headers that `path` and the csrc files it includes with "..." (recursively) name, as written."""
    if path in seen or not path.exists():  # (mma.cuh's "ptx.h" is the emulator's, outside csrc)
        return []
    seen.add(path)
    found = []
    for kind, name in re.findall(r'^#include ([<"])([^>"]+)', path.read_text(), re.MULTILINE):
        found += [name] if kind == "<" else [name, *_includes((path.parent / name).resolve(), seen)]
    return found


def _unit_headers(folder: str, pattern: str) -> list[tuple[Path, list[str]]]:
    """Each csrc/<folder>/<pattern> file with the <...> headers it reaches (_includes)."""
    units = sorted((Path(__file__).resolve().parents[1] / "csrc" / folder).glob(pattern))
    return [(unit, _includes(unit, set())) for unit in units]


def test_cuda_kernel_units_include_no_aten():
    """The CUDA kernel units (csrc/cuda/*.cu), which nvcc parses in several passes a GPU architecture, include no ATen
    or torch header, directly or through the launch headers (the kernels' parameters are csrc/<op>_params.h, standard
    headers only; launch.h takes a few of c10's): parsing ATen's Tensor took most of a small unit's compile time (12 s
    against 7 with nvcc 13.0 for sm_90; a tensor-core attention unit 37 s against 14), and nvcc's host pass then
    compiled ATen's inline code beside the C++ compiler's copy. The glue (csrc/cuda/*.cpp, compiled by the C++ compiler)
    allocates, registers, and includes no kernel header (no device code)."""
    units = _unit_headers("cuda", "*.cu")
    assert len(units) == 14
    for unit, headers in units:
        assert "cuda_fp16.h" in headers and "c10/core/ScalarType.h" in headers  # the walk reaches launch.h
        assert [h for h in headers if h.startswith(("ATen/", "torch/"))] == [], unit.name
    glue = _unit_headers("cuda", "*.cpp")
    assert len(glue) == 7
    for unit, headers in glue:
        assert [h for h in headers if h.endswith(".cuh")] == [], unit.name


# setup.py run as a script, with torch made to look like a CUDA build (torch.utils.cpp_extension, imported by setup.py
# after this, then takes CUDA_HOME from the environment).
_SETUP_WITH_CUDA_TORCH = """import runpy, sys, torch
torch.cuda._is_compiled = lambda: True
torch.cuda.is_available = lambda: False
torch.version.cuda = "13.0"
sys.argv = ["setup.py", "--version"]
runpy.run_path("setup.py", run_name="__main__")
"""


@pytest.mark.parametrize("torch_cuda", [False, True])
def test_cuda_build_stops_early_without_cuda_torch_or_toolkit_headers(tmp_path, torch_cuda):
    """FORCE_CUDA=1 with a torch that has no CUDA, or with a CUDA_HOME that has no include/cuda_runtime.h (torch's guess
    from a wrapper script on PATH), stops at once with a message that says which, before any compile fails."""
    env = {**os.environ, "FORCE_CUDA": "1", "CUDA_HOME": str(tmp_path)}
    env.pop("CUDA_PATH", None)
    cmd = [sys.executable, "-c", _SETUP_WITH_CUDA_TORCH] if torch_cuda else [sys.executable, "setup.py", "--version"]
    run = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    if torch_cuda:
        assert f"CUDA_HOME={tmp_path} has no include/cuda_runtime.h" in run.stderr
    else:
        assert "FORCE_CUDA=1 needs a CUDA build of torch" in run.stderr

def test_cpu_kernel_units_parse_no_operator_or_library_headers():
    """The CPU kernel files, each compiled once per ISA level, include neither torch/library.h nor ATen's operator
    headers (ATen/ops/*, torch/extension.h), directly or through the op headers: the glue allocates and registers.
    Those headers took about 5 s of an 8 s parse, in 21 units a build."""
    units = _unit_headers("cpu", "*_kernel.cpp")
    assert len(units) == 7
    for unit, headers in units:
        assert "ATen/core/Tensor.h" in headers  # the walk reaches the op headers (common.h)
        heavy = [h for h in headers if h.startswith("ATen/ops/") or h in ("torch/library.h", "torch/extension.h")]
        assert heavy == [], unit.name


_PTXAS_LOG = """ptxas info    : Compiling entry function '_ZN13pytransformer4cuda24attention_mma_fwd_kernelI6__halfLi64EEEvNS_15AttentionParamsE' for 'sm_90'
ptxas info    : Function properties for _ZN13pytransformer4cuda24attention_mma_fwd_kernelI6__halfLi64EEEvNS_15AttentionParamsE
    {frame} bytes stack frame, {spills} bytes spill stores, {spills} bytes spill loads
ptxas info    : Used {regs} registers, used 1 barriers, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_ZN13pytransformer4cuda24attention_mma_fwd_kernelI6__halfLi64EEEvNS_15AttentionParamsE' for 'sm_75'
ptxas info    : Function properties for _ZN13pytransformer4cuda24attention_mma_fwd_kernelI6__halfLi64EEEvNS_15AttentionParamsE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 400 bytes cmem[0]
"""


def test_ptxas_gate(tmp_path):
    """tools/ptxas_gate.py on a planted report: the sm_90 entry is read (not the sm_75 one), spills or a stack frame in
    an attention kernel fail, a register count above the table fails, equal or fewer pass, a kernel missing from the
    table fails, and so does one outside namespace pytransformer::cuda."""
    from tools import ptxas_gate as gate
    name = "void pytransformer::cuda::attention_mma_fwd_kernel<__half, 64>(pytransformer::AttentionParams)"
    table = {name: 128}

    def failures(frame=0, spills=0, regs=128, known=table, namespace="4cuda"):
        log = _PTXAS_LOG.format(frame=frame, spills=spills, regs=regs)
        mangled = gate.parse(log.replace("13pytransformer4cuda", "13pytransformer" + namespace))
        names = gate.demangle(list(mangled))
        return gate.check({names[m]: k for m, k in mangled.items()}, known)

    assert failures() == [] and failures(regs=120) == []
    assert [f.split(":")[0] for f in failures(spills=8)] == ["local memory"]
    assert [f.split(":")[0] for f in failures(frame=16)] == ["local memory"]
    assert failures(regs=130) == [f"registers 128 -> 130: {name}"]
    assert failures(known={})[0].startswith("not in cuda_registers.txt")
    # a kernel outside namespace pytransformer::cuda (here pytransformer::other), which racecheck would not see
    assert failures(namespace="5other", known={})[0].startswith("outside namespace pytransformer::cuda: void "
                                                                 "pytransformer::other::attention_mma_fwd_kernel")
    # the checked-in table lists the kernels of every CUDA source
    recorded = gate.read_table()
    assert name in recorded and any("decode_split_kernel" in n for n in recorded)


# One unit of the host code that both compilers compile: the helpers of a parameter header and of cuda/launch.h.
_SHARED_HOST_UNIT = """#include "masked_softmax_params.h"
#include "cuda/launch.h"
#ifdef __CUDACC__
__global__ void unit_kernel(int* x) { *x = 1; }
#endif
// A parameter header's helper and c10's message formatting, as a kernel unit's launch code and the glue use them.
int64_t unit_offset(const pytransformer::MaskLayout& ml, int64_t row) {
  TORCH_CHECK(row >= 0, "row: expected a row >= 0, got ", row);
  return pytransformer::mask_row_offset(ml, row);
}
// Their addresses keep out-of-line copies of the inline helpers in the object, as calls that are not inlined do.
const void* unit_helper_address() { return reinterpret_cast<const void*>(&pytransformer::mask_row_offset); }
const void* unit_launch_helper_address() {
  return reinterpret_cast<const void*>(&pytransformer::cuda::device_attribute);
}
"""


def _nvcc():
    """nvcc as tools/check_cuda.sh finds it ($NVCC, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda's), or None: a
    toolkit's own, whose include/ folder has cuda_runtime.h for the C++ compiler."""
    found = os.environ.get("NVCC") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return found if Path(found).exists() else None


@pytest.mark.skipif(_nvcc() is None or shutil.which("readelf") is None or shutil.which("c++") is None,
                    reason="needs nvcc, c++ and readelf")
def test_nvcc_units_get_their_own_copy_of_shared_host_code(tmp_path):
    """The same unit of shared host code (helpers of a parameter header and of cuda/launch.h, c10's message
    formatting) compiled as the extension compiles it, by g++ (the glue) and by nvcc (a kernel unit, PTX only, against
    the installed torch's headers: a CPU wheel is enough), then tools/check_host_objects.py on the two objects: no
    inline function of pytransformer's headers defined by both (the linker would keep one copy for both;
    PT_HOST_NAMESPACE gives each compiler its own), and every weak symbol that both define has the same visibility in
    both (one flag set for host code: build_config.HOST_CODEGEN_FLAGS)."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    from tools import build_config, check_host_objects
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "unit.cpp"
    src.write_text(_SHARED_HOST_UNIT)
    (tmp_path / "unit.cu").write_text(_SHARED_HOST_UNIT)
    includes = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}", f"-I{root / 'csrc'}",
                                                      f"-I{Path(_nvcc()).parents[1] / 'include'}",
                                                      "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE"]
    gxx = ["c++", "-c", "-fPIC", *build_config.CXX_FLAGS, *includes, str(src), "-o", str(tmp_path / "gxx.o")]
    nvcc = [_nvcc(), "-c", *build_config.nvcc_flags(), "-Xcompiler=-fPIC", *includes, "-gencode", "arch=compute_80,code=compute_80", str(tmp_path / "unit.cu"), "-o",
            str(tmp_path / "nvcc.o")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd in (gxx, nvcc)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    objs = [tmp_path / "gxx.o", tmp_path / "nvcc.o"]
    assert [check_host_objects.NVCC_SECTION in check_host_objects.sections(o) for o in objs] == [False, True]
    nvcc_weak = [name for *_, name in check_host_objects.weak_definitions(objs[1])]
    for helper in ("mask_row_offset", "device_attribute", "_str_wrapper"):
        assert any(helper in name for name in nvcc_weak), helper
    assert check_host_objects.findings(objs) == []
