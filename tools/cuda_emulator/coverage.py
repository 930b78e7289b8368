"""What the emulated test cases reach of the CUDA code, at two grains:

- instantiations: every instantiation of the CUDA kernels (each dispatch branch of the glue that picks a template: head
  dim, dtype, pack width, rows a block, chunks a thread, ...) against the emulated test cases that launch it. The
  instantiations are the kernels' symbols in the emulator's build (every one the glue can launch); the launches are
  those of the last `pytest tests/ops -m cuda --cuda-emulator` run, which tests/conftest.py writes to
  build/cuda_emulator/reached.json (kernel -> the tests that launched it), or, for a run split into parts that write
  their own files (--cuda-reached), those of the files given;
- lines: every line of csrc/cuda that has code in the emulator's build (kernels, device functions, launch code and
  glue, in every instantiation) against whether the emulated runs since the last build ran it: build.py compiles that
  code with gcov's counters (--coverage) and its own file and line numbers (#line), the runs' processes add their
  counts to build/cuda_emulator/obj/*.gcda as they exit (`make cuda-emulate` deletes those first), and gcov reads them
  here. So the runtime branches inside a kernel (a clean tile or a masked one, a split or not, ...) count too. A line
  that is an error by construction (`TORCH_CHECK(false, ...)`: an internal error, or a dtype the argument checks
  already refused) is not counted.

    python tools/cuda_emulator/coverage.py [--all] [--check] [REACHED.json ...]   # the unreached instantiations and
                                                   # lines (--all: the whole instantiation map); --check: exit 1 if any
"""
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = ROOT / "build" / "cuda_emulator"
REACHED = BUILD / "reached.json"
OBJ = BUILD / "obj"
LIBRARY = OBJ / "pytransformer_cuda_emulator.so"
CUDA_SOURCES = ROOT / "csrc" / "cuda"
ERROR_LINE = re.compile(r"TORCH_CHECK\w*\(false\b")  # a line that only raises: an error by construction
GLOBAL = re.compile(r"__global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(")


def kernel_names() -> set[str]:
    """The names of the __global__ functions of csrc/cuda."""
    return {m.group(1) for f in (ROOT / "csrc" / "cuda").glob("*.cu*") for m in GLOBAL.finditer(f.read_text())}


def demangle(names: list[str]) -> list[str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return [re.sub(r"^void ", "", n) for n in out.splitlines()]


def kernels_among(functions: list[str], names: set[str]) -> set[str]:
    """The demangled `functions` that are instantiations of the kernels `names`: not the functions local to them
    (`kernel<...>(...)::...`: a kernel's lambdas, which g++ emits as functions of their own and no launch names)."""
    return {f for f in functions if ")::" not in f and re.sub(r"(<.*)?\(.*$", "", f).split("::")[-1] in names}


def instantiations(library: Path = LIBRARY) -> set[str]:
    """The demangled kernel instantiations defined in the emulator's library."""
    symbols = subprocess.run(["nm", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    mangled = [line.split()[-1] for line in symbols.stdout.splitlines() if line.split()[-2:-1] in (["T"], ["t"], ["W"])]
    return kernels_among(demangle(mangled), kernel_names())


def coverage_map(reached: dict[str, list[str]], library: Path = LIBRARY) -> dict[str, list[str]]:
    """{instantiation: the tests that launched it} for every instantiation (an empty list: unreached)."""
    tests = dict(zip(demangle(list(reached)), reached.values()))
    return {name: sorted(tests.get(name, [])) for name in sorted(instantiations(library))}


def line_counts(obj: Path = OBJ, sources: Path = CUDA_SOURCES) -> dict[Path, dict[int, int]]:
    """{source file in `sources`: {line: times run}} for the lines that have code in the objects of `obj`, summed over
    the objects and instantiations (a line of a template counts as run if any instantiation ran it), from the counts
    in obj/*.gcda."""
    counts: dict[Path, dict[int, int]] = {}
    for gcda in sorted(obj.glob("*.gcda")):
        report = subprocess.run(["gcov", "--json-format", "--stdout", "--object-directory", str(obj), str(gcda)],
                                capture_output=True, text=True, check=True, cwd=obj).stdout
        for document in filter(str.strip, report.splitlines()):
            for source in json.loads(document)["files"]:
                path = Path(source["file"])
                if path.parent != sources:
                    continue
                lines = counts.setdefault(path, {})
                for line in source["lines"]:
                    lines[line["line_number"]] = lines.get(line["line_number"], 0) + line["count"]
    return counts


def unreached_lines(counts: dict[Path, dict[int, int]]) -> list[tuple[Path, int, str]]:
    """(file, line, text) of every line with code that no emulated run ran, error-only lines (ERROR_LINE) aside."""
    missed = []
    for path, lines in sorted(counts.items()):
        text = path.read_text().splitlines()
        missed += [(path, n, text[n - 1].strip()) for n, count in sorted(lines.items())
                   if count == 0 and not ERROR_LINE.search(text[n - 1])]
    return missed


def main(argv: list[str]) -> int:
    reached = {}
    for path in [Path(a) for a in argv if not a.startswith("--")] or [REACHED]:
        if not path.exists():
            print(f"coverage: no {path}: run make cuda-emulate first", file=sys.stderr)
            return 2
        for name, tests in json.loads(path.read_text()).items():
            reached.setdefault(name, []).extend(tests)
    table = coverage_map(reached)
    unreached = [name for name, tests in table.items() if not tests]
    for name, tests in table.items():
        if tests and "--all" in argv:
            print(f"{len(tests):4d}  {name}  ({tests[0]}{', ...' if len(tests) > 1 else ''})")
    for name in unreached:
        print(f"   -  {name}  UNREACHED")
    print(f"{len(table) - len(unreached)} of {len(table)} kernel instantiations reached by the emulated cases")
    counts = line_counts()
    if not counts:
        print(f"coverage: no line counts in {OBJ}: run make cuda-emulate first", file=sys.stderr)
        return 2
    missed = unreached_lines(counts)
    for path, n, text in missed:
        print(f"   -  {path.relative_to(ROOT)}:{n}: {text}  UNREACHED")
    total = sum(len(lines) for lines in counts.values())
    print(f"{total - len(missed)} of {total} lines with code in csrc/cuda run by the emulated cases (error-only lines "
          "aside)")
    return int("--check" in argv and bool(unreached or missed))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
