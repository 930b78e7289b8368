"""Triage of the CUDA kernels on a GPU: one probe a hypothesis about why the hardware disagrees with the host emulator,
each ending in a verdict. Run by `bash benchmarks/gpu_check.sh triage` after its build step (see its --help); the
probes of tools/gpu_probes/ need nvcc and a GPU, the op probes the CUDA build of pytransformer.

    python tools/gpu_probes/triage.py --out DIR [--arch sm_90] [--prebuilt DIR] [--build-only] [--timeout S]

Hypotheses and their probes (a probe that cannot run gives the verdict SKIP with the reason):

  prebuilt        every executable in --prebuilt DIR (standalone probes built elsewhere), first
  kernel_ran      the forward kernels write every output element (a sentinel fills the output before the launch)
  forward         the forward kernels against float64, head dims 64, 80 (the 96 kernel) and 32
  backward        the dK/dV kernel's debug tiles S^T, P^T, dP^T, dS^T of block 0 and its dK, dV against float64
  fragments       ldmatrix, mma.sync and cp.async against the PTX ISA's tables (tests/ops/test_ptx_layouts.py)
  uninitialised   the same results with every multiprocessor's shared memory filled with NaN before each launch
  params          sizeof, offsetof and the bytes of the parameter structs as the device sees them
  fast_math       the probes built without --use_fast_math: a check that passes only there blames fast math
  instantiation   the kernels the glue launches for float16 attention (torch profiler), by name and head dim
  host_twice      tools/check_host_objects.py over the build's objects: no host function compiled by both nvcc and g++
  decode, append  one decode_attention and one kv_cache_append call on CUDA tensors, each in a process of its own,
                  so that a crash is a verdict (and, with gdb on PATH, a native backtrace in DIR/*.log)
  compiled_step   generate(compile=True) of a tiny GPT-2 on CUDA (the decoding step captured in a CUDA graph) gives
                  the eager tokens, in a process of its own likewise
  aoti_plain      AOTInductor compiles and loads a CUDA package of a torch.nn.Linear in a process that never imports
                  pytransformer: whether the loader crash that compile=True's AOTInductor package met on CUDA
                  (docs/gpu.md) is PyTorch's and the toolchain's alone

Prints the verdicts as a table and writes DIR/triage.md; exit status 0 when every verdict is OK, 1 otherwise, 2 for
bad arguments.
"""
import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VERDICT = re.compile(r"^VERDICT (\S+) (OK|FAIL): (.*)$", re.M)
# Each probe executable: (name, source, extra nvcc flags); the *_precise builds drop --use_fast_math.
PROBES = [("attention_probe", "attention_probe.cu", ["-DPT_ATTENTION_BWD_DEBUG"]),
          ("attention_probe_precise", "attention_probe.cu", ["-DPT_ATTENTION_BWD_DEBUG"]),
          ("params_probe", "params_probe.cu", [])]

# One call of each decode op on CUDA tensors (a process each: a crash is a verdict, not the end of the triage).
OP_CALLS = {
    "decode": "import torch, pytransformer as pt\n"
              "q = torch.randn(2, 4, 1, 64, device='cuda'); kc = torch.randn(2, 2, 16, 64, device='cuda')\n"
              "lengths = torch.tensor([5, 16], device='cuda')\n"
              "out = pt.ops.decode_attention(q, kc, kc.clone(), lengths)\n"
              "torch.cuda.synchronize(); print('VERDICT decode OK: shape', tuple(out.shape))\n",
    "append": "import torch, pytransformer as pt\n"
              "kc = torch.zeros(2, 2, 16, 64, device='cuda'); vc = torch.zeros_like(kc)\n"
              "kn = torch.randn(2, 2, 3, 64, device='cuda')\n"
              "pt.ops.kv_cache_append(kc, vc, kn, kn.clone(), torch.tensor([0, 4], device='cuda'))\n"
              "torch.cuda.synchronize(); ok = torch.equal(kc[1, :, 4:7], kn[1])\n"
              "print(f\"VERDICT append {'OK' if ok else 'FAIL'}: rows written where positions say\")\n",
}

# generate(compile=True) of a tiny GPT-2 on CUDA against its eager tokens.
OP_CALLS["compiled_step"] = (
    "import torch\n"
    "from pytransformer.models import DecoderLM, gpt2_small\n"
    "torch.manual_seed(0)\n"
    "m = DecoderLM(gpt2_small(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64,\n"
    "                         dropout=0.0)).eval().cuda()\n"
    "p = torch.randint(0, 64, (2, 5), device='cuda')\n"
    "with torch.no_grad(): ok = torch.equal(m.generate(p, 6, compile=True), m.generate(p, 6))\n"
    "print('VERDICT compiled_step ' + ('OK' if ok else 'FAIL') + ': the CUDA-graph step gives the eager tokens')\n")
# AOTInductor on CUDA without pytransformer in the process.
OP_CALLS["aoti_plain"] = (
    "import os, tempfile, torch\n"
    "m, x = torch.nn.Linear(8, 8).cuda(), torch.randn(2, 8, device='cuda')\n"
    "path = torch._inductor.aoti_compile_and_package(torch.export.export(m, (x,)),\n"
    "                                                package_path=os.path.join(tempfile.mkdtemp(), 'p.pt2'))\n"
    "with torch.no_grad(): ok = torch.allclose(torch._inductor.aoti_load_package(path)(x), m(x))\n"
    "print('VERDICT aoti_plain ' + ('OK' if ok else 'FAIL') + ': a CUDA package of nn.Linear loads and runs')\n")

# The kernels the glue should launch for float16 attention of each head dim (the tensor-core kernels, padded to 8).
INSTANTIATION_PY = """
import torch, pytransformer as pt
from torch.profiler import profile, ProfilerActivity
expected = {64: 64, 80: 96, 32: 32}
for d, kernel_dim in expected.items():
    q = torch.randn(1, 2, 100, d, device='cuda', dtype=torch.float16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pt.ops.attention(q, q, q); torch.cuda.synchronize()
    names = [e.name for e in prof.events() if 'attention' in e.name]
    want = f'attention_mma_fwd_kernel<__half, {kernel_dim}>'
    ok = any(want in n for n in names)
    print(f"VERDICT instantiation_{d} {'OK' if ok else 'FAIL'}: expected {want}, launched {sorted(set(names))}")
"""


def run(cmd, log: Path, timeout: float, env=None) -> tuple[int, str]:
    """Runs cmd with its output in log; returns (exit status, output). A timeout is status 124; a signal -N."""
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out = res.returncode, res.stdout + res.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}\n(stopped after {timeout} s)"
    except OSError as e:
        rc, out = 127, str(e)
    log.write_text(f"$ {' '.join(map(str, cmd))}\n{out}")
    return rc, out


def verdicts(out: str) -> dict[str, tuple[str, str]]:
    return {m.group(1): (m.group(2), m.group(3)) for m in VERDICT.finditer(out)}


def exit_reason(rc: int) -> str:
    if rc < 0:
        return f"killed by {signal.Signals(-rc).name}"
    return "timed out" if rc == 124 else f"exit status {rc}"


def nvcc_command(nvcc: str, arch: str, source: str, exe: Path, extra: list[str]) -> list[str]:
    """The extension's nvcc flags (tools/build_config.py), torch's headers and csrc/, linked with the static runtime."""
    sys.path.insert(0, str(ROOT / "tools"))
    import build_config  # noqa: E402 (tools/ is not a package on the path)
    import torch.utils.cpp_extension as ext

    flags = build_config.nvcc_flags()
    if exe.name.endswith("_precise"):
        flags = [f for f in flags if f != "--use_fast_math"]
    includes = [f"-I{p}" for p in ext.include_paths()] + [f"-I{ROOT / 'csrc'}", f"-I{HERE}"]
    return [nvcc, *flags, *extra, "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", *includes, f"-arch={arch}", "-cudart", "static",
            str(HERE / source), "-o", str(exe)]


def build_key(nvcc: str, cmd: list[str]) -> str:
    """What a probe's executable depends on: the nvcc version, the torch version, the command without its paths (which
    differ between machines) and the text of every source it can include (tools/gpu_probes/, csrc/)."""
    import torch

    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256(f"{version}\n{torch.__version__}\n".encode())
    h.update(" ".join(a for a in cmd[1:] if not a.startswith("-I") and "/" not in a).encode())
    for f in sorted([*HERE.glob("*.cu"), *HERE.glob("*.h"), *(ROOT / "csrc").rglob("*.h"),
                     *(ROOT / "csrc").rglob("*.cuh")]):
        h.update(f"\n{f.relative_to(ROOT)}\n".encode() + f.read_bytes())
    return h.hexdigest()


def build_probes(out: Path, nvcc: str, arch: str, timeout: float) -> dict[str, str]:
    """Compiles the probes in parallel into out/probes/; returns {name: error} for those that failed. A probe built
    before into the same place (`--build-only` on a machine without a GPU, say) is kept where its build key
    (out/probes/NAME.key) still matches: same nvcc, torch, flags and sources."""
    (out / "probes").mkdir(parents=True, exist_ok=True)

    def build(probe):
        name, source, extra = probe
        exe, key_file = out / "probes" / name, out / "probes" / f"{name}.key"
        cmd = nvcc_command(nvcc, arch, source, exe, extra)
        key = build_key(nvcc, cmd)
        if exe.is_file() and key_file.is_file() and key_file.read_text() == key:
            print(f"{name}: built before with the same key, kept")
            return name, None
        key_file.unlink(missing_ok=True)
        rc, text = run(cmd, out / f"build_{name}.log", timeout)
        if rc == 0:
            key_file.write_text(key)
        return name, None if rc == 0 else f"build failed ({exit_reason(rc)}, build_{name}.log)"

    with ThreadPoolExecutor(len(PROBES)) as pool:
        return {name: err for name, err in pool.map(build, PROBES) if err}


class Triage:
    def __init__(self, out: Path, timeout: float):
        self.out, self.timeout = out, timeout
        self.rows: list[tuple[str, str, str, str]] = []  # (hypothesis, check, verdict, detail)

    def add(self, hypothesis: str, found: dict[str, tuple[str, str]], prefix: str = ""):
        for name, (result, detail) in found.items():
            if name.startswith(prefix):
                self.rows.append((hypothesis, name, result, detail))

    def skip(self, hypothesis: str, reason: str):
        self.rows.append((hypothesis, "-", "SKIP", reason))

    def probe(self, name: str, args=(), log: str | None = None) -> tuple[int, dict[str, tuple[str, str]]]:
        rc, out = run([str(self.out / "probes" / name), *args], self.out / f"{log or name}.log", self.timeout)
        return rc, verdicts(out)

    def crash_verdict(self, hypothesis: str, name: str, rc: int, found: dict):
        if rc not in (0, 1) and not found:
            self.rows.append((hypothesis, name, "FAIL", f"no result: {exit_reason(rc)} (see {name}.log)"))

    def table(self) -> str:
        lines = ["| hypothesis | check | verdict | detail |", "|---|---|---|---|"]
        lines += [f"| {h} | {c} | {v} | {d} |" for h, c, v, d in self.rows]
        return "\n".join(lines)

    def ok(self) -> bool:
        return all(v == "OK" for _, _, v, _ in self.rows)


def run_prebuilt(t: Triage, prebuilt: Path):
    for exe in sorted(p for p in prebuilt.iterdir() if p.is_file() and os.access(p, os.X_OK)):
        rc, out = run([str(exe)], t.out / f"prebuilt_{exe.name}.log", t.timeout)
        wrong = "WRONG" in out
        t.rows.append(("prebuilt", exe.name, "OK" if rc == 0 and not wrong else "FAIL",
                       " / ".join(line.strip() for line in out.splitlines() if "->" in line) or exit_reason(rc)))


def run_kernel_probes(t: Triage, failed_builds: dict[str, str]):
    if "attention_probe" in failed_builds:
        for h in ("kernel_ran", "forward", "backward", "uninitialised"):
            t.skip(h, failed_builds["attention_probe"])
    else:
        rc, plain = t.probe("attention_probe")
        t.add("kernel_ran", plain, "kernel_ran")
        t.add("forward", plain, "forward")
        t.add("backward", plain, "bwd_")
        t.add("backward", plain, "backward")
        t.crash_verdict("forward", "attention_probe", rc, plain)
        rc, poisoned = t.probe("attention_probe", ["--poison"], log="attention_probe_poison")
        changed = [n for n in plain if poisoned.get(n, ("?",))[0] != plain[n][0]]
        t.rows.append(("uninitialised", "attention_probe --poison", "FAIL" if changed or not poisoned else "OK",
                       f"verdicts that change with NaN in shared memory: {changed}" if poisoned else exit_reason(rc)))
        if "attention_probe_precise" in failed_builds:
            t.skip("fast_math", failed_builds["attention_probe_precise"])
        else:
            rc, precise = t.probe("attention_probe_precise")
            only_precise = [n for n in precise if precise[n][0] == "OK" and plain.get(n, ("FAIL",))[0] == "FAIL"]
            t.rows.append(("fast_math", "attention_probe_precise", "FAIL" if only_precise else "OK",
                           f"checks that pass only without --use_fast_math: {only_precise}"))
    if "params_probe" in failed_builds:
        t.skip("params", failed_builds["params_probe"])
    else:
        rc, found = t.probe("params_probe")
        t.add("params", found)
        t.crash_verdict("params", "params_probe", rc, found)


def run_python(t: Triage, hypothesis: str, name: str, code_or_args: list[str], timeout: float | None = None):
    """A Python process of its own; its VERDICT lines, or its crash (then a native backtrace when cuda-gdb or gdb is
    there)."""
    cmd, timeout = [sys.executable, *code_or_args], timeout or t.timeout
    rc, out = run(cmd, t.out / f"{name}.log", timeout)
    found = verdicts(out)
    t.add(hypothesis, found)
    if not found:
        t.rows.append((hypothesis, name, "FAIL", f"no result: {exit_reason(rc)} (see {name}.log)"))
        debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
        if rc < 0 and debugger:
            run([debugger, "-q", "-batch", "-ex", "run", "-ex", "bt", "--args", *cmd], t.out / f"{name}_backtrace.log",
                timeout)


def run_op_probes(t: Triage):
    import importlib.util

    spec = importlib.util.find_spec("pytransformer")
    if spec is None:
        for h in ("fragments", "instantiation", *OP_CALLS):
            t.skip(h, "pytransformer is not importable")
        return
    rc, out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/ops/test_ptx_layouts.py"],
                  t.out / "fragments.log", t.timeout)
    summary = (out.strip().splitlines() or ["(no output)"])[-1]
    t.rows.append(("fragments", "test_ptx_layouts", "OK" if rc == 0 else "FAIL", summary))
    run_python(t, "instantiation", "instantiation", ["-c", INSTANTIATION_PY])
    for name, code in OP_CALLS.items():  # AOTInductor compiles (tens of seconds) before it loads
        run_python(t, name, name, ["-c", code], t.timeout * (4 if name == "aoti_plain" else 1))


def run_host_check(t: Triage, build_dir: Path):
    rc, out = run([sys.executable, str(ROOT / "tools" / "check_host_objects.py"), str(build_dir)],
                  t.out / "host_twice.log", t.timeout)
    last = (out.strip().splitlines() or ["(no output)"])[-1]
    t.rows.append(("host_twice", "check_host_objects", "OK" if rc == 0 else "FAIL" if rc == 1 else "SKIP", last))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, type=Path, help="directory for the probes, logs and triage.md")
    ap.add_argument("--arch", default=None, help="nvcc -arch of the probes (default: GPU 0's, e.g. sm_90)")
    ap.add_argument("--prebuilt", type=Path, default=None, help="a directory of standalone probes to run first")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"), help="the nvcc to build the probes with")
    ap.add_argument("--build-dir", type=Path, default=ROOT / "build", help="the extension's build directory")
    ap.add_argument("--timeout", type=float, default=60, help="seconds a probe or probe build may run (default 60)")
    ap.add_argument("--build-only", action="store_true", help="build the probes and stop (no GPU needed)")
    args = ap.parse_args(argv)
    if args.prebuilt is not None and not args.prebuilt.is_dir():
        ap.error(f"--prebuilt: not a directory: {args.prebuilt}")
    if args.timeout <= 0:
        ap.error(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    if args.arch is not None and not re.fullmatch(r"sm_\d+a?", args.arch):
        ap.error(f"--arch: expected sm_XY (e.g. sm_90), got {args.arch!r}")
    return args


def gpu_arch() -> str | None:
    """sm_XY of GPU 0 from nvidia-smi, or None without a GPU."""
    try:
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"sm_{cap[0].replace('.', '')}" if cap else None


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    arch = args.arch or gpu_arch()
    if arch is None:
        print("triage: no GPU found (nvidia-smi) and no --arch given", file=sys.stderr)
        return 2
    failed_builds = build_probes(out, args.nvcc, arch, args.timeout * 5)
    for name, err in failed_builds.items():
        print(f"{name}: {err}")
    if args.build_only:
        return 1 if failed_builds else 0
    t = Triage(out, args.timeout)
    if args.prebuilt:
        run_prebuilt(t, args.prebuilt)
    run_kernel_probes(t, failed_builds)
    run_op_probes(t)
    run_host_check(t, args.build_dir)
    table = t.table()
    (out / "triage.md").write_text(f"# Triage ({arch})\n\n{table}\n")
    print(table)
    return 0 if t.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
