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
    assert peak and float(peak.group(1)) > 0 and int(peak.group(2)) == pytest.approx(32 * float(peak.group(1)), rel=0.01)
    rows = [line for line in text.splitlines() if line.startswith("| read")]
    assert [row.split(" | ")[0][2:] for row in rows] == probe.CASES
    for row in rows:
        time_us, gbs = (float(v) for v in row.split(" | ")[1:3])
        assert time_us > 0 and gbs > 0
    assert rows[0].split(" | ")[3] == "100%"
