"""benchmarks/cpu_stream_probe.py compiles, runs and records its table (a few turns; the numbers are the machine's)."""
import importlib.util
import re
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_stream_probe.py"


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX512"), reason="needs AVX-512")
def test_probe_records_every_case(tmp_path):
    spec = importlib.util.spec_from_file_location("cpu_stream_probe", SCRIPT)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    record = tmp_path / "probe.md"
    probe.main(["--iters", "2", "--pool-mib", "256", "--record", str(record)])
    text = record.read_text()
    peak = re.search(r"FMA peak \(512-bit, all threads\): ([0-9.]+) G instructions/s = ([0-9]+) GFLOP/s", text)
    # printed rounded (G instructions/s to 0.1, GFLOP/s to 1): equal within what rounding allows, at any speed
    assert peak and float(peak.group(1)) > 0
    assert int(peak.group(2)) == pytest.approx(32 * float(peak.group(1)), abs=32 * 0.05 + 0.5)
    rows = [line for line in text.splitlines() if line.startswith("| read")]
    assert [row.split(" | ")[0][2:] for row in rows] == probe.CASES
    for row in rows:
        time_us, gbs = (float(v) for v in row.split(" | ")[1:3])
        assert time_us > 0 and gbs > 0
    assert rows[0].split(" | ")[3] == "100%"
    dots = [line.split(" | ") for line in text.splitlines() if line.startswith("| vp") or line.startswith("| vf")
            or line.startswith("| vd")]
    assert [d[0][2:] for d in dots] == [name for name, _, _ in probe.DOTS]
    fma = dots[0]  # every AVX-512 CPU has it: its rate is the peak's, its ceiling 64 bytes per 8 of them
    assert float(fma[2]) == pytest.approx(float(peak.group(1)), abs=0.051)
    assert float(fma[4].rstrip(" |")) == pytest.approx(float(fma[2]) / 8 * 64, abs=8 * 0.05 + 0.05)
