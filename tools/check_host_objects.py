"""Checks that shared host code cannot be swapped for a differently compiled copy, from the object files of a build:
nvcc compiles the host side of the kernel units (csrc/cuda/*.cu) through its own front end and host flags, g++ the
C++ sources (the CPU and CUDA glue) with the extension's, and an inline function or template that both compile is a
weak symbol of which the linker keeps one copy for every caller. Fails when

- an nvcc-compiled object and a g++-compiled one both define a symbol of pytransformer's own (namespace
  pytransformer): a helper of the headers that both compilers read (csrc/<op>_params.h, cuda/launch.h) outside
  PT_HOST_NAMESPACE, one copy for both; or
- they both define a weak symbol with different visibility: the host code is compiled with two flag sets (nvcc's host
  pass without the extension's -fvisibility=hidden exports it, and the dynamic linker may bind it to another
  library's copy).

    python tools/check_host_objects.py DIR_OR_OBJECT...    # exit 0: clean, 1: findings, 2: no objects found
"""
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

NVCC_SECTION = ".nv_fatbin"  # nvcc puts the device code of a unit in this section, g++ objects have none
SHARED = "pytransformer::"


def objects(paths: list[str]) -> list[Path]:
    found = []
    for p in map(Path, paths):
        found += sorted(p.rglob("*.o")) if p.is_dir() else [p] if p.is_file() else []
    return found


def sections(obj: Path) -> set[str]:
    out = subprocess.run(["readelf", "-SW", str(obj)], capture_output=True, text=True, check=True).stdout
    return {parts[1] for line in out.splitlines() if (parts := line.replace("[ ", "[").split()) and
            parts[0].startswith("[") and len(parts) > 1}


def weak_definitions(obj: Path) -> list[tuple[str, str, str]]:
    """(binding, visibility, demangled name) of the weak and unique symbols that obj defines."""
    out = subprocess.run(["readelf", "-sW", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[4] in ("WEAK", "UNIQUE") and parts[6] != "UND" and parts[3] in ("FUNC", "OBJECT"):
            found.append((parts[4], parts[5], parts[7]))
    return found


def findings(objs: list[Path]) -> list[str]:
    # {compiler: {name: {visibility: [object names]}}}
    seen = {"nvcc": defaultdict(lambda: defaultdict(list)), "g++": defaultdict(lambda: defaultdict(list))}
    for obj in objs:
        compiler = "nvcc" if NVCC_SECTION in sections(obj) else "g++"
        for _, visibility, name in weak_definitions(obj):
            seen[compiler][name][visibility].append(obj.name)
    both = sorted(set(seen["nvcc"]) & set(seen["g++"]))

    def where(compiler, name):
        return ", ".join(f"{vis} in {' '.join(sorted(set(o)))}" for vis, o in sorted(seen[compiler][name].items()))

    out = [f"compiled by nvcc ({where('nvcc', n)}) and by g++ ({where('g++', n)}): {n}" for n in both
           if n.startswith(SHARED)]
    out += [f"visibility differs, nvcc: {where('nvcc', n)}; g++: {where('g++', n)}: {n}" for n in both
            if set(seen["nvcc"][n]) != set(seen["g++"][n])]
    return out


def main(argv: list[str]) -> int:
    objs = objects(argv)
    if not argv or not objs:
        print(__doc__ if not argv else f"check_host_objects: no object files under {' '.join(argv)}", file=sys.stderr)
        return 2
    nvcc = sum(NVCC_SECTION in sections(o) for o in objs)
    found = findings(objs)
    for line in found[:50]:
        print(line)
    if len(found) > 50:
        print(f"... and {len(found) - 50} more")
    summary = f"{len(found)} finding(s)" if found else "no shared host code of ours in both, visibility alike"
    print(f"check_host_objects: {len(objs)} objects ({nvcc} compiled by nvcc): {summary}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
