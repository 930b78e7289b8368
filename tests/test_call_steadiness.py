"""benchmarks/call_steadiness.py: anchors sized to an engine's call, and the table of calls timed in turns (on a fake
clock: the numbers are exact)."""
import importlib.util
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "call_steadiness.py"


@pytest.fixture
def steadiness(monkeypatch):
    spec = importlib.util.spec_from_file_location("call_steadiness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    clock = [0.0]
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(module, "pause", lambda: None)
    return module, clock


def test_repeat_runs_the_step_as_often_as_fill_the_seconds(steadiness):
    module, clock = steadiness

    def step():  # 2 ms a step
        clock[0] += 0.002
    call = module.repeat(step, 0.5)
    start = clock[0]
    call()
    assert clock[0] - start == pytest.approx(0.5)


def test_timed_rounds_takes_turns_and_uses_an_engines_own_seconds(steadiness):
    module, clock = steadiness
    order, engine_times = [], iter([0.5, 0.6, 0.4, 1.5])

    def engine():  # timed in its process: its reply counts, not the wall time here
        order.append("engine")
        clock[0] += 10.0
        return next(engine_times)

    def anchor():
        order.append("anchor")
        clock[0] += 0.25
    rows = module.timed_rounds({"generate": engine, "compute": anchor}, 4)
    assert order == ["engine", "anchor"] * 4
    # median 0.55 s, range 1.1 s (200%), quartiles 0.475 and 0.825 (64%), the calls over the median in order
    assert rows[0] == "| generate | 550 | 1100 | 200% | 64% | 0.91 1.09 0.73 2.73 |"
    assert rows[1] == "| compute | 250 | 0 | 0% | 0% | 1.00 1.00 1.00 1.00 |"


def test_llamacpp_without_its_package_is_refused_by_name(steadiness, monkeypatch, capsys):
    module, _ = steadiness
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit):
        module.main(["--llamacpp"])
    assert "--llamacpp: llama-cpp-python is not installed" in capsys.readouterr().err
