"""Keeps host library calls out of device code (a step of `make cuda-check`).

With --expt-relaxed-constexpr (a flag of the build) device code may call constexpr host functions, and some of those
calls compile to nothing: libstdc++ lowers std::copy, std::fill, std::swap_ranges ... of plain arrays to
__builtin_memmove or __builtin_memset, which nvcc drops from device code without a word. g++ runs them correctly, so
the emulator cannot see it. This gate compiles each CUDA source through nvcc's device front end alone
(-fdevice-syntax-only, compute_80: no optimisation, no code) with the extension's flags but without
--expt-relaxed-constexpr, so that nvcc reports every call of a host function from device code, and fails on any
whose function is not in ALLOWED.

    python tools/host_calls_gate.py [--nvcc NVCC] [--jobs N] FILE.cu ...   # exit 1 if one is found
"""
import argparse
import os
import re
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools import build_config  # noqa: E402

# The host functions device code may call, reviewed: each compiles to plain arithmetic on the device.
ALLOWED = {
    "min": "std::min: a comparison",
    "max": "std::max: a comparison",
    "bit_cast": "c10::bit_cast in torch's BFloat16 rounding: std::bit_cast, that is __builtin_bit_cast",
    "dq_row_tiles": "attention_mma.cuh: a constexpr of the backward's dQ tiling, evaluated at compile time",
    "dq_column_slices": "attention_mma.cuh: a constexpr of the backward's dQ tiling, evaluated at compile time",
}
# nvcc's report of a call of a host function from device code; the name is missing from one of the two lines nvcc
# gives a __host__ __device__ caller (the other, at the same place, names it).
HOST_CALL = re.compile(r'^(?P<place>\S+\(\d+\)): (?:error|warning)(?: #\d+-D)?: calling a (?:constexpr )?__host__ '
                       r'function(?:\("(?P<name>[^"]*)"\))? from a [\w ]+ function')
# Any other error: a diagnostic's first line (not the source lines nvcc echoes under it), or nvcc's own.
ERROR = re.compile(r"^(?:\S+\(\d+\): (?:catastrophic )?error|\S+: fatal error|nvcc fatal|Error limit reached)")
ERROR_LIMIT = 100000  # nvcc's front end stops after 100 errors by default, and the allowed calls count as errors


def nvcc_command(nvcc: str, source: Path) -> list[str]:
    """The front-end-only device compile of `source` with the extension's flags, less --expt-relaxed-constexpr."""
    from torch.utils.cpp_extension import include_paths
    flags = [f for f in build_config.nvcc_flags() if f != "--expt-relaxed-constexpr"]
    includes = [f"-I{p}" for p in include_paths() + [sysconfig.get_paths()["include"], str(build_config.CSRC)]]
    return [nvcc, "-fdevice-syntax-only", "--ptx", "-o", os.devnull, "-arch=compute_80", "-Xcicc",
            f"--error_limit={ERROR_LIMIT}", *flags, "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", *includes, str(source)]


def problems(log: str) -> list[str]:
    """The lines of nvcc's output that fail the gate: calls of host functions outside ALLOWED (or unnamed and alone
    at their place), and errors of any other kind."""
    lines = log.splitlines()
    calls = [(line, m) for line in lines if (m := HOST_CALL.match(line))]
    named = {m["place"] for _, m in calls if m["name"]}
    found = [line for line, m in calls if (m["name"] not in ALLOWED if m["name"] else m["place"] not in named)]
    found += [line for line in lines if ERROR.match(line) and not HOST_CALL.match(line)]
    return found


def check(nvcc: str, source: Path) -> list[str]:
    """Compiles `source` as the gate does; returns its problems (see problems)."""
    run = subprocess.run(nvcc_command(nvcc, source), capture_output=True, text=True)
    return problems(run.stdout + run.stderr)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--nvcc", default=os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)

    def timed(source):
        start = time.monotonic()
        return check(args.nvcc, source), time.monotonic() - start
    failed = False
    with ThreadPoolExecutor(args.jobs) as pool:
        for source, (found, seconds) in zip(args.files, pool.map(timed, args.files)):
            print(f"{'FAIL' if found else 'ok  '}  host calls in device code {source} ({seconds:.0f} s)")
            for line in found:
                print(f"  {line}")
            failed |= bool(found)
    if failed:
        print("host_calls_gate: device code calls host functions (copy with a loop; see tools/host_calls_gate.py)")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
