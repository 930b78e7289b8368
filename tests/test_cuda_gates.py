"""The gates of `make cuda-check` that keep code nvcc miscompiles silently out of the CUDA sources, each against a
planted reintroduction: a host library call in device code (tools/host_calls_gate.py: std::copy of a register array,
which nvcc compiles to nothing), an mma.sync that reads a fragment nothing converted (tools/mma_operands_gate.py:
the P V products of an attention forward reading Q's registers, as they did when that copy was dropped), and a launch
function the glue calls that no kernel unit defines under the glue's name for it (tools/link_gate.py); and the
gate of `make cuda-emulate` that every kernel instantiation and every line of csrc/cuda with code is reached by an
emulated case (tools/cuda_emulator/coverage.py)."""
import json
import os
import shutil
import subprocess

import pytest

from tools import host_calls_gate, link_gate, mma_operands_gate
from tools.cuda_emulator import build, coverage

NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
needs_nvcc = pytest.mark.skipif(not shutil.which(NVCC), reason="needs nvcc")

KERNEL = """#include <algorithm>
#include <cstdint>
__global__ void copy_kernel(uint32_t* out, const uint32_t* x) {
  uint32_t a[4], b[4];
  for (int i = 0; i < 4; ++i) a[i] = x[i];
  COPY;
  out[threadIdx.x] = b[threadIdx.x % 4] + std::max(1u, a[0]);
}
"""


@needs_nvcc
@pytest.mark.parametrize("copy, reported", [("for (int i = 0; i < 4; ++i) b[i] = a[i]", None),
                                            ("std::copy(a, a + 4, b)", '"copy"'),
                                            ("std::fill(b, b + 4, a[1])", '"fill"')])
def test_host_calls_gate(tmp_path, copy, reported):
    """A loop and std::max pass; std::copy and std::fill of a register array in a kernel are reported."""
    source = tmp_path / "kernel.cu"
    source.write_text(KERNEL.replace("COPY", copy))
    found = host_calls_gate.check(NVCC, source)
    if reported is None:
        assert found == []
    else:
        assert len(found) == 1 and reported in found[0] and "copy_kernel" in found[0], found


def test_host_calls_gate_reads_nvcc_reports():
    """Named calls outside the allowed list fail, the unnamed twin of an allowed call passes, other errors fail."""
    allowed = ('a.cuh(3): error: calling a constexpr __host__ function("min") from a __global__ function("k") is not '
               'allowed. The experimental flag ...')
    twin = ('b.h(5): warning #20015-D: calling a constexpr __host__ function from a __host__ __device__ function is '
            'not allowed.')
    named_twin = twin.replace("function from", 'function("bit_cast") from')
    swap = allowed.replace('"min"', '"swap"')
    assert host_calls_gate.problems("\n".join([allowed, named_twin, twin, "      detected during ... error ..."])) == []
    assert host_calls_gate.problems("\n".join([allowed, swap, twin])) == [swap, twin]
    assert host_calls_gate.problems('k.cu(1): error: identifier "x" is undefined') == [
        'k.cu(1): error: identifier "x" is undefined']


# A forward kernel's PTX as nvcc writes it, cut to one S = Q K^T product and one P V product: Q and K by ldmatrix,
# P packed from float32 scores by cvt (through a mov), V by ldmatrix .trans.
FORWARD = """.visible .entry _ZN13pytransformer4cuda24attention_mma_fwd_kernelI6__halfLi64EEEvNS_15AttentionParamsE(
	.param .align 8 .b8 param_0[272]
)
{
	.reg .b32 	%r<100>;
	.reg .f32 	%f<100>;
$L__BB0_1:
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r50];
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r5, %r6, %r7, %r8}, [%r51];
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f1, %f2, %f3, %f4};
	ex2.approx.ftz.f32 	%f5, %f1;
	{ cvt.rn.f16x2.f32 %r11, %f5, %f2; }
	{ cvt.rn.f16x2.f32 %r12, %f3, %f4; }
	mov.b32 	%r13, %r11;
	@%p1 ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r21, %r22, %r23, %r24}, [%r52];
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f9, %f10, %f11, %f12}, {%r13, %r12, P2, P3}, {%r21, %r22}, {%f9, %f10, %f11, %f12};
	bra.uni 	$L__BB0_1;
}
"""
CORRECT = FORWARD.replace("P2, P3", "%r11, %r12")


# A glue unit (C++) calls launch<T> for a type of its own namespace and for one of csrc/<op>.h's kind, which lives in
# an inline namespace per compiler (PT_HOST_NAMESPACE); a kernel unit defines and instantiates launch for both.
LINK_TYPES = """#include "host_namespace.h"
namespace pytransformer {
inline namespace PT_HOST_NAMESPACE { struct Shared { int n; }; }
namespace cuda { struct Own { int n; }; template <typename T> void launch(const T&); }
}
"""
LINK_GLUE = """#include "types.h"
void glue() {
  pytransformer::cuda::launch(pytransformer::cuda::Own{1});
  pytransformer::cuda::launch(pytransformer::Shared{2});
}
"""
LINK_KERNELS = """#include "types.h"
template <typename T> void pytransformer::cuda::launch(const T&) {}
template void pytransformer::cuda::launch(const pytransformer::cuda::Own&);
INSTANCE
"""
SHARED_INSTANCE = "template void pytransformer::cuda::launch(const pytransformer::Shared&);"


@pytest.mark.parametrize("compiler, instance, undefined", [
    ("c++", SHARED_INSTANCE, []),
    ("c++", "", ["void pytransformer::cuda::launch<pytransformer::cxx_host::Shared>(pytransformer::cxx_host::Shared "
                 "const&)"]),
    ("nvcc", SHARED_INSTANCE, ["void pytransformer::cuda::launch<pytransformer::cxx_host::Shared>("
                               "pytransformer::cxx_host::Shared const&)"]),
])
def test_link_gate_finds_launches_without_a_definition(tmp_path, compiler, instance, undefined):
    """Clean when the kernel unit instantiates both; a missing instantiation, or one that nvcc names in its own inline
    namespace (the glue's call names the C++ compiler's), is reported."""
    if compiler == "nvcc" and not shutil.which(NVCC):
        pytest.skip("needs nvcc")
    csrc = build.ROOT / "csrc"
    (tmp_path / "types.h").write_text(LINK_TYPES)
    (tmp_path / "glue.cpp").write_text(LINK_GLUE)
    kernels = tmp_path / ("kernels.cu" if compiler == "nvcc" else "kernels.cpp")
    kernels.write_text(LINK_KERNELS.replace("INSTANCE", instance))
    subprocess.run(["c++", "-std=c++20", f"-I{csrc}", "-c", "glue.cpp", "-o", "glue.o"], cwd=tmp_path, check=True)
    subprocess.run([NVCC if compiler == "nvcc" else "c++", "-std=c++20", f"-I{csrc}", "-c", kernels.name, "-o",
                    "kernels.o"], cwd=tmp_path, check=True)
    assert link_gate.unresolved([tmp_path / "glue.o", tmp_path / "kernels.o"]) == undefined


def test_mma_operands_gate_passes_converted_p():
    assert mma_operands_gate.problems(CORRECT) == []
    assert mma_operands_gate.problems(CORRECT.replace("_fwd_", "_bwd_")) == []


@pytest.mark.parametrize("operands, reads", [
    ("%r3, %r4", "A from ['ldmatrix', 'pack']"),  # half of P's fragment from Q's registers
    ("%r11, %r99", "A from ['pack', 'unwritten']"),  # a register nothing writes
])
def test_mma_operands_gate_reports_p_v_reading_elsewhere(operands, reads):
    found = mma_operands_gate.problems(FORWARD.replace("P2, P3", operands))
    assert len(found) == 1 and "mma.sync #2 reads " + reads in found[0], found


def test_mma_operands_gate_reports_a_forward_without_p_v():
    """The dropped copy seen in nvcc's PTX: every product reads Q's fragments, none reads converted P."""
    found = mma_operands_gate.problems(CORRECT.replace("{%r13, %r12, %r11, %r12}", "{%r1, %r2, %r3, %r4}"))
    assert "mma.sync #2 reads A from ['ldmatrix'], B from ['ldmatrix.trans']" in found[0]


NORM_FWD = "pytransformer::cuda::norm_fwd_kernel<float, 1, 4>(pytransformer::cuda::NormFwdParams<float>, int)"
NORM_FWD_PACKED = "pytransformer::cuda::norm_fwd_kernel<float, 4, 2>(pytransformer::cuda::NormFwdParams<float>, int)"


def test_coverage_counts_kernels_not_their_lambdas():
    """A kernel's lambda (a function of its own in the emulator's build, never launched) and the launch code are not
    kernel instantiations."""
    functions = [NORM_FWD, NORM_FWD + "::{lambda(int, long)#3}::operator()(int, long) const",
                 "void pytransformer::cuda::launch_norm_fwd<float>(pytransformer::cuda::NormFwdParams<float> const&)"]
    assert coverage.kernels_among(functions, {"norm_fwd_kernel"}) == {NORM_FWD}


@pytest.mark.parametrize("reached, status", [([NORM_FWD, NORM_FWD_PACKED], 0), ([NORM_FWD], 1)])
def test_coverage_check_fails_on_an_unreached_instantiation(monkeypatch, tmp_path, capsys, reached, status):
    monkeypatch.setattr(coverage, "instantiations", lambda library=coverage.LIBRARY: {NORM_FWD, NORM_FWD_PACKED})
    monkeypatch.setattr(coverage, "demangle", lambda names: names)
    monkeypatch.setattr(coverage, "line_counts", lambda: {tmp_path / "kernel.cuh": {1: 3}})
    (tmp_path / "kernel.cuh").write_text("x;\n")
    path = tmp_path / "reached.json"
    path.write_text(json.dumps({name: ["tests/ops/test_norm.py::test_x"] for name in reached}))
    assert coverage.main(["--check", str(path)]) == status
    out = capsys.readouterr().out
    assert (f"{NORM_FWD_PACKED}  UNREACHED" in out) == bool(status)


def test_emulator_rewrite_keeps_every_line_in_place():
    """The emulator compiles each CUDA source rewritten under its own name and line numbers (#line 1): its sanitizers'
    reports and line coverage point into the original only if the rewrite moves no line."""
    for source in sorted(coverage.CUDA_SOURCES.glob("*.cu*")):
        text = source.read_text()
        assert build.rewrite(text).count("\n") == text.count("\n"), source.name


LINES = """#include <cstdio>
#define TORCH_CHECK(c, m) if (!(c)) std::puts(m)
int step(int x) {
  if (x > 0)
    return x + 1;
  if (x == 0)
    TORCH_CHECK(false, "internal error");
  return x - 1;
}
int main(int argc, char**) { return step(argc - 2) > 100; }
"""


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("gcov")), reason="needs g++ and gcov")
@pytest.mark.parametrize("args", [[], ["positive"]])
def test_coverage_finds_an_unreached_line(tmp_path, args):
    """A program built as the emulator is (--coverage, atomic counters) and run: a line no run took is reported by
    file and line, unless it only raises (TORCH_CHECK(false, ...)); run with both signs, nothing is."""
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "step.cpp"
    source.write_text(LINES)
    subprocess.run(["g++", "-O1", *build.COVERAGE_FLAGS, "-o", "step", str(source)], cwd=tmp_path, check=True)
    subprocess.run([str(tmp_path / "step")], cwd=tmp_path, check=True)  # step(-1): the negative branch
    for arg in args:
        subprocess.run([str(tmp_path / "step"), arg, arg], cwd=tmp_path, check=True)  # step(1)
    counts = coverage.line_counts(tmp_path, tmp_path / "src")
    assert counts[source][4] >= 1 + len(args) and counts[source][7] == 0
    assert coverage.unreached_lines(counts) == ([] if args else [(source, 5, "return x + 1;")])
