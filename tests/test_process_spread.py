"""benchmarks/process_spread.py: the tables of groups timed in rounds, each cell also over its round's median (the
host's movement taken out), so that a process slow by itself stands out."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "process_spread.py"


def load_script():
    spec = importlib.util.spec_from_file_location("process_spread", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_takes_each_rounds_median_out():
    # round 2 is the host's slow round (every process 1.5x); process 3 is slow by itself (1.2x in every round)
    cells = [[100.0, 150.0, 90.0], [110.0, 165.0, 100.0], [120.0, 180.0, 108.0]]
    lines = load_script().table("Prefill", cells)
    assert lines[:4] == ["### Prefill", "", "| process | round 1 | round 2 | round 3 | median over rounds |",
                         "|---|---|---|---|---|"]
    assert lines[4:7] == ["| 1 | 100.0 | 150.0 | 90.0 | 100.0 |", "| 2 | 110.0 | 165.0 | 100.0 | 110.0 |",
                          "| 3 | 120.0 | 180.0 | 108.0 | 120.0 |"]
    # over the round medians 110, 165, 100
    assert lines[10:13] == ["| 1 | 0.91 | 0.91 | 0.90 | 0.91 |", "| 2 | 1.00 | 1.00 | 1.00 | 1.00 |",
                           "| 3 | 1.09 | 1.09 | 1.08 | 1.09 |"]
