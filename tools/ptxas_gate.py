"""The ptxas gates of the CUDA compile check (tools/check_cuda.sh): reads the `-Xptxas -v` reports of its sm_90 pass
and fails when

- an attention, decode or append kernel uses local memory (spill stores or loads, or a stack frame): on the GPU
  that is slow per-thread memory traffic in the hottest loops;
- a kernel uses more registers than tools/cuda_registers.txt records for it (fewer warps fit on a multiprocessor),
  or is missing from it;
- a kernel is outside namespace pytransformer::cuda: benchmarks/gpu_check.sh's racecheck instruments the kernels
  whose mangled names hold that namespace, and no others.

The table is checked in so that a change that costs registers shows in review; after a deliberate change, rewrite it
with `--update` and commit it.

    python tools/ptxas_gate.py LOG...            # the logs of check_cuda.sh (build/cuda_check/*.log)
    python tools/ptxas_gate.py --update LOG...   # rewrite tools/cuda_registers.txt from them
"""
import re
import subprocess
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "cuda_registers.txt"
ARCH = "sm_90"
# Kernels that must not touch local memory, by their demangled names.
NO_LOCAL_MEMORY = re.compile(r"attention|decode|append")
# The namespace of every kernel, demangled (after the return type).
NAMESPACE = re.compile(r"^void pytransformer::cuda::")

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse(text: str) -> dict[str, dict[str, int]]:
    """{mangled kernel: {registers, stack, spill_stores, spill_loads}} of the ARCH entries of a ptxas -v report."""
    kernels, current = {}, None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1) if m.group(2) == ARCH else None
            if current:
                kernels[current] = {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0}
        elif current and (m := _FRAME.search(line)):
            kernels[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := _REGS.search(line)):
            kernels[current]["registers"] = int(m.group(1))
    return kernels


def demangle(names: list[str]) -> dict[str, str]:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def read_table(path: Path = TABLE) -> dict[str, int]:
    """{demangled kernel: registers} from lines "REGISTERS<TAB>NAME" (# comments)."""
    table = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            regs, name = line.split("\t", 1)
            table[name] = int(regs)
    return table


def check(kernels: dict[str, dict[str, int]], table: dict[str, int]) -> list[str]:
    """The gate's failures for the kernels {demangled name: figures} against the register table."""
    failures = []
    for name, k in sorted(kernels.items()):
        local = k["stack"] + k["spill_stores"] + k["spill_loads"]
        if NO_LOCAL_MEMORY.search(name) and local:
            failures.append(f"local memory: {k['stack']} bytes stack frame, {k['spill_stores']} bytes spill stores, "
                            f"{k['spill_loads']} bytes spill loads in {name}")
        if not NAMESPACE.match(name):
            failures.append(f"outside namespace pytransformer::cuda: {name}")
        if name not in table:
            failures.append(f"not in {TABLE.name} ({k['registers']} registers): {name}")
        elif k["registers"] > table[name]:
            failures.append(f"registers {table[name]} -> {k['registers']}: {name}")
    return failures


def main(argv: list[str]) -> int:
    update = "--update" in argv
    logs = [Path(a) for a in argv if a != "--update"]
    if not logs:
        print(__doc__, file=sys.stderr)
        return 2
    mangled = {}
    for log in logs:
        mangled.update(parse(log.read_text(errors="replace")))
    if not mangled:
        print(f"ptxas_gate: no {ARCH} entries in the logs (were they compiled with -Xptxas -v?)", file=sys.stderr)
        return 2
    names = demangle(sorted(mangled))
    kernels = {names[m]: k for m, k in mangled.items()}
    if update:
        lines = [f"# Registers per kernel ({ARCH}, ptxas -v; tools/ptxas_gate.py). A rise fails the compile check.",
                 *(f"{k['registers']}\t{name}" for name, k in sorted(kernels.items()))]
        TABLE.write_text("\n".join(lines) + "\n")
        print(f"ptxas_gate: wrote {len(kernels)} kernels to {TABLE}")
        return 0
    failures = check(kernels, read_table())
    for f in failures:
        print(f"ptxas_gate: FAIL {f}")
    print(f"ptxas_gate: {len(kernels)} kernels, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
