"""Checks that the host code of the CUDA glue cannot be swapped for a differently compiled copy, from the object files
of a build: nvcc compiles the host side of csrc/cuda/*.cu with its own host pass and flags, g++ the C++ sources with
the extension's, and an inline function or template that both compile is a weak symbol of which the linker keeps one
copy for every caller (and a weak symbol of default visibility is exported, so the dynamic linker may bind it to
another library's copy). Fails when

- an nvcc-compiled object defines a weak or unique symbol of default visibility (its host code is not compiled with
  the extension's -fvisibility=hidden), or
- an nvcc-compiled object and a g++-compiled one both define a symbol of pytransformer's own shared host code
  (namespace pytransformer, outside pytransformer::cuda): csrc/<op>.h compiled twice.

    python tools/check_host_objects.py DIR_OR_OBJECT...    # exit 0: clean, 1: findings, 2: no objects found
"""
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

NVCC_SECTION = ".nv_fatbin"  # nvcc puts the device code of a unit in this section, g++ objects have none
SHARED = "pytransformer::"
CUDA_OWN = "pytransformer::cuda::"


def objects(paths: list[str]) -> list[Path]:
    found = []
    for p in map(Path, paths):
        found += sorted(p.rglob("*.o")) if p.is_dir() else [p]
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
    exported, by_compiler = [], {"nvcc": defaultdict(list), "g++": defaultdict(list)}
    for obj in objs:
        compiler = "nvcc" if NVCC_SECTION in sections(obj) else "g++"
        for binding, visibility, name in weak_definitions(obj):
            by_compiler[compiler][name].append(obj.name)
            if compiler == "nvcc" and visibility == "DEFAULT":
                exported.append(f"{obj.name}: {binding} {name}")
    out = [f"exported by nvcc-compiled host code (default visibility): {e}" for e in exported]
    both = sorted(n for n in by_compiler["nvcc"] if n in by_compiler["g++"] and n.startswith(SHARED) and
                  not n.startswith(CUDA_OWN))
    out += [f"compiled by nvcc ({', '.join(sorted(set(by_compiler['nvcc'][n])))}) and by g++ "
            f"({', '.join(sorted(set(by_compiler['g++'][n])))}): {n}" for n in both]
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
    print(f"check_host_objects: {len(objs)} objects ({nvcc} compiled by nvcc): "
          f"{len(found)} finding(s)" if found else f"check_host_objects: {len(objs)} objects ({nvcc} compiled by nvcc): "
          "no host code shared between nvcc and g++, none exported")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
