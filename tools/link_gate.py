"""The link gate of the CUDA compile check (tools/check_cuda.sh): the glue (csrc/cuda/*.cpp, compiled by the C++
compiler) calls launch functions that the kernel units (csrc/cuda/*.cu, compiled by nvcc) define as explicit
instantiations. A call finds its definition only if both compilers name it alike: a missing instantiation, or a
parameter type that each compiler names differently (a type declared in PT_HOST_NAMESPACE's inline namespace, one
per compiler), leaves the call undefined, and a CUDA build fails at import. The host emulator cannot
show this: it compiles every unit with g++. So the objects of the check are linked together here (`ld -r`, no
libraries) and every symbol of namespace pytransformer still undefined fails the gate; so does a symbol defined twice
(the link's own error).

    python tools/link_gate.py OBJECT...    # exit 1 when a pytransformer symbol is left undefined
"""
import subprocess
import sys
import tempfile
from pathlib import Path

OWN = "pytransformer::"


def unresolved(objects: list[Path]) -> list[str]:
    """The demangled pytransformer symbols that `objects`, linked together, leave undefined; the link's error output
    instead when the link itself fails."""
    with tempfile.TemporaryDirectory() as tmp:
        linked = Path(tmp) / "linked.o"
        link = subprocess.run(["ld", "-r", "-o", str(linked), *map(str, objects)], capture_output=True, text=True)
        if link.returncode != 0:
            return [line for line in link.stderr.splitlines() if line.strip()] or ["ld -r failed"]
        nm = subprocess.run(["nm", "-C", "--undefined-only", str(linked)], capture_output=True, text=True, check=True)
    names = [line.split(None, 1)[-1] for line in nm.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if OWN in n)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    found = unresolved([Path(a) for a in argv])
    for name in found:
        print(f"link_gate: undefined: {name}")
    print(f"link_gate: {len(argv)} objects, {len(found)} pytransformer symbols undefined")
    return int(bool(found))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
