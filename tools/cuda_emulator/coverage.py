"""The map of every instantiation of the CUDA kernels (each dispatch branch of the glue that picks a template: head
dim, dtype, pack width, rows a block, chunks a thread, ...) against the emulated test cases that launch it.

The instantiations are the kernels' symbols in the emulator's build (every one the glue can launch); the launches are
those of the last `pytest tests/ops -m cuda --cuda-emulator` run, which tests/conftest.py writes to
build/cuda_emulator/reached.json (kernel -> the tests that launched it), or, for a run split into parts that write
their own files (--cuda-reached), those of the files given.

    python tools/cuda_emulator/coverage.py [--all] [--check] [REACHED.json ...]   # the unreached instantiations
                                                   # (--all: the whole map); --check: exit 1 if any is unreached
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
LIBRARY = BUILD / "obj" / "pytransformer_cuda_emulator.so"
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
    return int("--check" in argv and bool(unreached))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
