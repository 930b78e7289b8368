"""The command line: bad arguments, `count` against count_parameters, `bench --json/--plot` on tiny sizes, and a
few-step demo end to end."""
import json
import sys
import re

import pytest
import torch

from pytransformer.__main__ import main
from pytransformer.models import CONFIGS, count_parameters
from pytransformer.models.count import build, parameters_by_component

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def keep_threads():
    """The demo (and bench --threads) set the process's thread count: restore it for the other tests."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("argv", [[], ["train"], ["demo", "--steps", "0"], ["demo", "--steps", "many"],
                                  ["demo", "--device", "tpu"], ["demo", "--device", "cuda:x"],
                                  ["bench", "--only", "matmul"], ["bench", "--json"], ["count", "--config", "gpt5"],
                                  ["count", "extra"], ["bench-generate", "--model", "gpt5"],
                                  ["bench-generate", "--dtypes", "int4"]])
def test_bad_arguments_print_usage_and_fail(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0
    assert "usage: python -m pytransformer" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(CONFIGS))
def test_count_matches_count_parameters(name, capsys):
    assert main(["count", "--config", name]) == 0
    out = capsys.readouterr().out
    model = build(name)
    total = count_parameters(model)
    assert f"{name} ({type(model).__name__}): {total:,} parameters" in out
    parts = parameters_by_component(model)
    assert sum(parts.values()) == total and parts["embeddings"] > 0 and parts["self-attention"] > 0
    rows = dict(re.findall(r"^\| ([a-z-]+) \| ([\d,]+) \|", out, re.M))
    assert int(rows.pop("total").replace(",", "")) == total
    assert {k: int(v.replace(",", "")) for k, v in rows.items()} == {k: v for k, v in parts.items() if v}
    if name == "gpt2_small":  # 2 (K, V) x 12 layers x 768 x 4 bytes
        assert "73,728 bytes per token in float32" in out


def test_count_all_configs(capsys):
    assert main(["count"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} (" in out for name in CONFIGS)


def test_bench_quick_json_and_plot(tmp_path):
    path, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main(["bench", "--quick", "--device", "cpu", "--json", str(path), "--plot", str(png)]) == 0
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
    ops = {row["op"] for row in data["rows"]}
    assert ops == {"layer_norm", "rms_norm", "masked_softmax", "attention", "decode_attention", "kv_cache_append",
                   "int8_linear", "linear"}
    for row in data["rows"]:
        assert row["ours_s"] > 0 and row["torch_s"] > 0 and row["unit"] in ("GB/s", "GFLOP/s", "TFLOP/s")
        assert row["fraction_of_ceiling"] > 0 and row["ratio"] == pytest.approx(row["ours_s"] / row["torch_s"])
    assert data["ceiling_bytes_s"] > 0 and data["ceiling_flops_s"] > 0
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_bench_cold_copies_and_the_decode_cases_held_to_a_read():
    """The copies a case cycles through are distinct memory spanning the bytes asked for, and a decode_attention case
    with copies is held to the read timed with it (its own bandwidth ceiling), not the report's copy bandwidth."""
    from pytransformer.bench import Report, cold_copies, decode_attention
    copies = cold_copies((2, 3), torch.float32, "cpu", cold_bytes=100)
    assert len(copies) == 5 and all(c.shape == (2, 3) for c in copies)  # ceil(100 / 24 bytes)
    starts = sorted(c.data_ptr() for c in copies)
    assert all(b - a >= 24 for a, b in zip(starts, starts[1:]))
    assert len(cold_copies((2, 3), torch.float32, "cpu", cold_bytes=0)) == 1
    report = Report("cpu", ceiling_bytes_s=1.0)
    decode_attention.bench(report, "cpu", cases=[("tiny", 2, 4, 2, 40, 16)], runs=2, cold_bytes=1 << 16)
    (row,) = report.rows
    assert row.bytes == 2 * 2 * 2 * 40 * 16 * 4 and row.ceiling_bytes_s > 1.0
    assert report.fraction(row) == pytest.approx(row.bytes / row.ceiling_bytes_s / row.ours_s)
    assert any(note.startswith("decode_attention, of ceiling") for note in report.notes)


@pytest.mark.parametrize("lscpu,want", [
    ("Architecture: x86_64\nCPU family:  25\nModel:   1\nModel name:    AMD EPYC\nFlags: fpu\n",
     "AMD EPYC (cpu family 25, model 1, {isa}), {threads} threads"),
    ("Model name: Intel(R) Xeon(R) Platinum 8480+\n", "Intel(R) Xeon(R) Platinum 8480+ ({isa}), {threads} threads"),
    (None, "{machine} ({isa}), {threads} threads")])
def test_device_name_says_the_cpu_family_model_and_isa(lscpu, want, monkeypatch):
    """Every record's device line names the CPU with the family and model numbers lscpu gives (what tells a Zen 3 from
    a Zen 4 where the name is only "AMD EPYC") and the ISA the kernels run; without lscpu, what platform says."""
    import platform
    import subprocess
    from pytransformer import _C
    from pytransformer.bench import device_name

    def run(argv, **kwargs):
        assert argv == ["lscpu"]
        if lscpu is None:
            raise FileNotFoundError("lscpu")
        return subprocess.CompletedProcess(argv, 0, stdout=lscpu, stderr="")
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert device_name("cpu") == want.format(isa=_C.cpu_isa(), threads=torch.get_num_threads(),
                                             machine=platform.machine())


def test_demo_few_steps_end_to_end(tmp_path, capsys, keep_threads):
    out_dir = tmp_path / "demo"
    assert main(["demo", "--steps", "3", "--held-out", "8", "--no-progress", "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "| greedy |" in out and "| beam 4 |" in out
    for name in ("demo_loss.png", "demo_attention.png"):
        assert (out_dir / name).read_bytes().startswith(PNG_MAGIC)


def test_without_matplotlib_the_demo_runs_and_says_how_to_get_the_figures(tmp_path, capsys, keep_threads, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out_dir = tmp_path / "demo"
    assert main(["demo", "--steps", "2", "--held-out", "4", "--no-progress", "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "| greedy |" in out and "figures skipped" in out and "pytransformer[plot]" in out
    assert not list(out_dir.glob("*.png"))


def test_without_matplotlib_bench_plot_fails_with_the_install_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as e:
        main(["bench", "--quick", "--only", "norm", "--plot", str(tmp_path / "b.png")])
    assert e.value.code == 2 and "pytransformer[plot]" in capsys.readouterr().err


def _few_cases(device, quick=False, ops=None, dump=None, dtypes=None):
    """check.run on a few of the cases (the full CPU run is minutes; the GPU run is what the command is for)."""
    from pytransformer import check
    checks = check.KernelChecks(torch.ops.pytransformer, device)
    checks.check_kv_cache(check.APPEND_SHAPES_QUICK[:1])
    checks.check_decode(check.DECODE_SHAPES_QUICK[1:2])
    return checks


def test_check_prints_the_table_and_fails_on_a_wrong_row(capsys, monkeypatch, tmp_path):
    from pytransformer import check
    monkeypatch.setattr(check, "run", _few_cases)
    assert main(["check", "--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "| op | dtype | cases | worst row error / bound | failed | result |" in out
    assert re.search(r"\| decode_attention \| bfloat16 \| 3 \| [0-9.]+ \| 0 \| pass \|", out)
    assert re.search(r"\| kv_cache_append \| float32 \| 3 \| 0.000 \| 0 \| pass \|", out)

    # One wrong row among many: within the whole-tensor tolerance, caught row by row, exit status 1.
    def one_wrong_row(device, quick=False, ops=None, dump=None, dtypes=None):
        checks = check.KernelChecks(torch.ops.pytransformer, device, dump=dump)
        ref = torch.randn(4096, 64, dtype=torch.float64)
        out = ref.to(torch.bfloat16)
        out[1234] = (ref[1234] * 0.5).to(torch.bfloat16)  # a row off by half its size
        assert check.rel_err(out, ref) <= check.TOL[torch.bfloat16]
        checks.check("attention fwd bfloat16 planted", out, ref, torch.bfloat16)
        return checks
    monkeypatch.setattr(check, "run", one_wrong_row)
    assert main(["check", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "| attention | bfloat16 | 1 |" in out and "FAIL" in out and "attention fwd bfloat16 planted" in out
    assert main(["check", "--device", "cpu", "--dump", str(tmp_path / "cases")]) == 1
    assert f"failing cases saved under {tmp_path / 'cases'}" in capsys.readouterr().out
    saved = torch.load(tmp_path / "cases" / "000.pt")
    assert saved["name"] == "attention fwd bfloat16 planted" and saved["out"].shape == (4096, 64)


def test_check_of_one_dtype(capsys):
    """--dtype runs only that dtype's cases, the attention tile cases included (which name their own dtypes); an
    unknown dtype is a usage error."""
    assert main(["check", "--device", "cpu", "--quick", "--op", "kv_cache_append", "--op", "attention",
                 "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\w+) \| (float32|float16|bfloat16) \|", out, re.M)
    assert {op for op, _ in rows} == {"kv_cache_append", "attention"} and {dt for _, dt in rows} == {"bfloat16"}
    with pytest.raises(SystemExit) as e:
        main(["check", "--device", "cpu", "--dtype", "half"])
    assert e.value.code == 2 and "bfloat16" in capsys.readouterr().err


def test_check_of_one_op(capsys):
    """--op runs only the named op's cases (here the real ones, quick list) and ends with the count that passed; an
    unknown op is a usage error."""
    assert main(["check", "--device", "cpu", "--quick", "--op", "kv_cache_append"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\w+) \| (float32|float16|bfloat16) \|", out, re.M)
    assert rows and {op for op, _ in rows} == {"kv_cache_append"}
    assert re.search(r"\nall \d+ cases pass\n", out)
    with pytest.raises(SystemExit) as e:
        main(["check", "--device", "cpu", "--op", "softmax"])
    assert e.value.code == 2 and "masked_softmax" in capsys.readouterr().err
