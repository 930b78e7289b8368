"""The GPU triage (benchmarks/gpu_check.sh triage, tools/gpu_probes/triage.py) without a GPU: its argument handling,
the probes' build commands and the verdict table. The probes themselves need nvcc and a GPU."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu_probes"))
import triage  # noqa: E402


def gpu_check(*args, script="gpu_check.sh", env=None):
    return subprocess.run(["bash", str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def stand_ins(tmp_path):
    """The environment of a GPU machine played by stand-ins: python (which prints three ops when asked for check's),
    compute-sanitizer and nvidia-smi, the first two logging their arguments to tmp_path/calls.txt (python with
    PYTEST_ADDOPTS in brackets)."""
    log, bin_dir = tmp_path / "calls.txt", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$* [$PYTEST_ADDOPTS]" >> {log}\ncase "$*" in *"import OPS"*) '
                                    r'printf "norm\nattention\ndecode_attention\n";; esac' '\n')
    (bin_dir / "compute-sanitizer").write_text(f'#!/bin/sh\necho "compute-sanitizer $*" >> {log}\n')
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho a GPU\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(bin_dir / "python")}  # "import xdist" succeeds


def test_gpu_check_help_lists_the_triage_step_and_its_option():
    res = gpu_check("--help")
    assert res.returncode == 0
    assert "  triage " in res.stdout and "--probes DIR" in res.stdout
    assert "default: env build triage ptx" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--probes"], "--probes needs a directory"),
    (["--probes", "/nonexistent/probes", "triage"], "--probes: not a directory"),
    (["--probes=", "triage"], "--probes needs a directory"),
    (["triage", "nosuchstep"], "unknown step: nosuchstep"),
    (["--op", "softmax", "check"], "unknown op: softmax (ops: norm masked_softmax"),
    (["--op"], "--op needs an op"),
    (["--dtype", "half", "check"], "unknown dtype: 'half'"),
    (["--dtype=", "check"], "unknown dtype: ''"),
])
def test_gpu_check_rejects_bad_arguments(args, message, tmp_path):
    res = gpu_check("--out", str(tmp_path), *args)
    assert res.returncode == 2
    assert message in res.stderr


@pytest.mark.parametrize("args, message", [
    (["--arch", "90"], "--arch: expected sm_XY"),
    (["--timeout", "0"], "--timeout: expected a positive number"),
    (["--prebuilt", "/nonexistent/probes"], "--prebuilt: not a directory"),
])
def test_triage_rejects_bad_arguments(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        triage.parse_args(["--out", str(tmp_path), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_triage_needs_its_output_directory(capsys):
    with pytest.raises(SystemExit) as exc:
        triage.parse_args([])
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err


def test_probe_builds_use_the_extension_flags_and_the_precise_build_drops_fast_math(tmp_path):
    fast = triage.nvcc_command("nvcc", "sm_90", "attention_probe.cu", tmp_path / "attention_probe", ["-DX"])
    precise = triage.nvcc_command("nvcc", "sm_90", "attention_probe.cu", tmp_path / "attention_probe_precise", [])
    assert "--use_fast_math" in fast and "--use_fast_math" not in precise
    for cmd in (fast, precise):
        assert "-arch=sm_90" in cmd and "-std=c++20" in cmd and "--expt-relaxed-constexpr" in cmd
        assert f"-I{ROOT / 'csrc'}" in cmd and cmd[cmd.index("-cudart") + 1] == "static"
    assert "-DX" in fast


def test_verdict_lines_and_table():
    found = triage.verdicts("noise\nVERDICT forward_64 OK: max|err| 1e-3\nVERDICT kernel_ran_fwd_64 FAIL: 3 of 9\n")
    assert found == {"forward_64": ("OK", "max|err| 1e-3"), "kernel_ran_fwd_64": ("FAIL", "3 of 9")}
    t = triage.Triage(Path("."), 1)
    t.add("forward", found, "forward")
    assert t.ok()
    t.add("kernel_ran", found, "kernel_ran")
    t.skip("params", "build failed")
    assert not t.ok()
    assert t.table().splitlines()[2:] == ["| forward | forward_64 | OK | max|err| 1e-3 |",
                                          "| kernel_ran | kernel_ran_fwd_64 | FAIL | 3 of 9 |",
                                          "| params | - | SKIP | build failed |"]


def test_a_crashed_probe_is_a_verdict(tmp_path):
    """A probe killed by a signal gives a FAIL row naming the signal, and the triage goes on."""
    t = triage.Triage(tmp_path, 30)
    triage.run_python(t, "decode", "decode", ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert t.rows[0][:3] == ("decode", "decode", "FAIL") and "SIGSEGV" in t.rows[0][3]
    assert (tmp_path / "decode.log").exists()


def test_probes_built_before_are_kept_while_their_build_key_matches(tmp_path):
    """--build-only ahead of a GPU run: the run with the same --out compiles only what changed (here, a new arch)."""
    calls = tmp_path / "calls"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "nvcc fake 1.0"; exit 0; }\necho "$@" >> ' f"{calls}\n"
                    'while [ $# -gt 1 ]; do [ "$1" = -o ] && : > "$2"; shift; done\n')
    nvcc.chmod(0o755)
    out = tmp_path / "triage"

    def builds(arch):
        before = calls.read_text().count("\n") if calls.exists() else 0
        assert triage.build_probes(out, str(nvcc), arch, 60) == {}
        return calls.read_text().count("\n") - before

    assert builds("sm_90") == len(triage.PROBES)
    assert all((out / "probes" / f"{name}.key").is_file() for name, _, _ in triage.PROBES)
    assert builds("sm_90") == 0
    assert builds("sm_80") == len(triage.PROBES)
    (out / "probes" / "params_probe").unlink()
    assert builds("sm_80") == 1


@pytest.mark.parametrize("name", sorted(triage.OP_CALLS))
def test_op_calls_print_a_verdict_the_triage_reads(name, capsys):
    """The last line of each op call, run with its result at hand, prints a line that verdicts() reads."""
    import types
    *_, last = triage.OP_CALLS[name].strip().splitlines()
    last = last.replace("torch.cuda.synchronize(); ", "")
    for ok in (True, False):
        exec(last, {"ok": ok, "out": types.SimpleNamespace(shape=(2,))})
        assert name in triage.verdicts(capsys.readouterr().out)


def test_check_host_objects_without_a_build_finds_no_objects(tmp_path, capsys):
    """A checkout with a prebuilt extension and no build directory: exit 2 (the triage's SKIP), not a crash."""
    from tools import check_host_objects
    assert check_host_objects.main([str(tmp_path / "build")]) == 2
    assert "no object files" in capsys.readouterr().err


def test_gpu_check_records_its_ops(tmp_path):
    """--op is part of the recorded command; without a CUDA build the check step is skipped, which fails the run."""
    res = gpu_check("--out", str(tmp_path), "--op", "norm", "--op=attention", "check")
    summary = (tmp_path / "summary.md").read_text()
    assert res.returncode == 1 and "--op norm --op attention check" in summary and "| check | skipped:" in summary


def test_gpu_check_bench_step_times_generation_against_hugging_face(tmp_path):
    """The bench step runs every op benchmark and the generation benchmark (a Llama shape, each dtype, against Hugging
    Face) on CUDA, each with a record of its own, attention, decode and generation first: seen through stand-ins
    (stand_ins)."""
    res = gpu_check("--out", str(tmp_path / "out"), "bench", env=stand_ins(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    benches = [line.split() for line in calls if line.startswith("benchmarks/bench_")]
    names = [f"benchmarks/bench_{n}.py" for n in ("attention", "decode_attention", "generate")]
    assert [b[0] for b in benches[:3]] == names  # the numbers most wanted first, in case a budget cuts the rest
    generate = next(b for b in benches if b[0] == "benchmarks/bench_generate.py")
    assert " ".join(generate[1:]).startswith(f"--device cuda --record {tmp_path}/out/bench_generate_default.md --model "
                                             "llama --dtypes float32 bfloat16 int8")


def test_gpu_check_budget_stops_the_step_at_hand_and_skips_the_rest(tmp_path):
    """--budget: a step still running when the budget is spent is stopped, the steps after it are skipped as out of
    time, the run fails and its summary is written, all within seconds of the budget."""
    env = stand_ins(tmp_path)
    (tmp_path / "bin" / "compute-sanitizer").write_text("#!/bin/sh\nsleep 60\n")
    start = time.monotonic()
    res = gpu_check("--out", str(tmp_path / "out"), "--budget", "3", "racecheck", env=env)
    assert time.monotonic() - start < 20
    rows = [line.split(" | ")[:2] for line in (tmp_path / "out" / "summary.md").read_text().splitlines()
            if line.startswith("| racecheck_")]
    assert res.returncode == 1
    assert rows[0][1].startswith("TIMEOUT (after ") and len(rows) == 3
    assert all(r[1] == "skipped: out of time (--budget 3)" for r in rows[1:])


def test_gpu_check_fast_runs_the_checks_side_by_side_then_the_benchmarks(tmp_path):
    """gpu_check_fast.sh: the build first; then the CUDA tests, every op's cases, racecheck of attention one dtype an
    instance and of the other ops, and the other sanitizers, each in a directory of its own, all within --budget; the
    benchmarks after them all. Seen through stand-ins (stand_ins)."""
    res = gpu_check("--out", str(tmp_path / "out"), "--budget", "50", script="gpu_check_fast.sh",
                    env=stand_ins(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    commands = {d.name: next(line for line in (d / "summary.md").read_text().splitlines() if "- command:" in line)
                for d in (tmp_path / "out").iterdir() if d.is_dir()}
    assert {name for name, c in commands.items() if "--budget 50" in c} == set(commands) - {"build", "bench"}
    sanitized = [c.split() for c in calls if c.startswith("compute-sanitizer") and "--tool" in c]
    race = {(c[c.index("--op") + 1], c[c.index("--dtype") + 1] if "--dtype" in c else None)
            for c in sanitized if "racecheck" in c}
    assert race == {("attention", "float32"), ("attention", "float16"), ("attention", "bfloat16"),
                    ("norm", None), ("decode_attention", None)}
    assert {c[c.index("--tool") + 1] for c in sanitized} == {"memcheck", "racecheck", "synccheck", "initcheck"}
    # racecheck patches only pytransformer's kernels (tools/ptxas_gate.py holds every kernel to that namespace)
    assert {("--kernel-name" in c and c[c.index("--kernel-name") + 1], c[c.index("--tool") + 1] == "racecheck")
            for c in sanitized} == {("kns=13pytransformer4cuda", True), (False, False)}
    builds = [i for i, c in enumerate(calls) if c.startswith("setup.py")]
    tests = [i for i, c in enumerate(calls) if c.startswith("-m pytest tests -m cuda")]
    benches = [i for i, c in enumerate(calls) if c.startswith("benchmarks/bench_")]
    assert len(builds) == 1 and len(tests) == 1 and benches and calls[tests[0]].endswith("[-n 10]")
    checks = [i for i, c in enumerate(calls) if "check --device cuda" in c]
    assert builds[0] < min(tests + checks) and max(tests + checks) < min(benches)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "failed instances: none" in summary
    assert [line[3:] for line in summary.splitlines() if line.startswith("## ")] == [
        "build", "test", "check", "racecheck_attention_float32", "racecheck_attention_float16",
        "racecheck_attention_bfloat16", "racecheck_others", "sanitizers", "bench"]  # in the order they ran
