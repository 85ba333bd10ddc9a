"""The benchmark harness (bench/harness/): contenders interleaved in a rotating order, never fewer
than 5 repeats, a ratio called a win only when the IQRs are apart, no result written without its
verdict, and the Ray Train baseline's plan: when rank 0 says evaluate and stop, and the learning
rate's progress."""

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytestmark = pytest.mark.unit


@pytest.fixture
def harness(monkeypatch):
    """bench/harness as a benchmark script imports it (bench/ first on sys.path, for this test only:
    its scripts would shadow other modules)."""
    monkeypatch.syspath_prepend(str(BENCH))
    modules = {name: importlib.import_module(f"harness.{name}") for name in ("stats", "results", "ray_train")}
    yield type("Harness", (), modules)
    for name in [m for m in sys.modules if m == "harness" or m.startswith("harness.")]:
        sys.modules.pop(name)


def test_contenders_run_interleaved_in_an_order_that_rotates_each_repeat(harness):
    h = harness.stats
    order = []
    contenders = {name: (lambda r, name=name: order.append((r, name)) or r) for name in "abc"}
    runs = h.interleaved(contenders, repeats=5, progress=None)
    assert runs == {n: [0.0, 1.0, 2.0, 3.0, 4.0] for n in "abc"}
    firsts = [name for r, name in order if order.index((r, name)) % 3 == 0]
    assert firsts == ["a", "b", "c", "a", "b"]
    assert [r for r, _ in order] == sorted(r for r, _ in order)  # each repeat ends before the next begins
    with pytest.raises(ValueError, match="at least 5"):
        h.interleaved(contenders, repeats=3)
    with pytest.raises(ValueError, match="no contenders"):
        h.interleaved({}, repeats=5)


def test_a_ratio_is_a_win_only_when_the_interquartile_ranges_are_apart(harness):
    h = harness.stats
    slow, fast = h.summary([10, 11, 12, 13, 14]), h.summary([14, 15, 16, 17, 18])
    assert slow["median"] == 12 and slow["iqr"] == [11, 13]
    assert h.compare(fast, slow) == {"ratio": round(16 / 12, 4), "verdict": "higher"}
    assert h.compare(slow, fast)["verdict"] == "lower"
    close = h.summary([12.5, 13, 13.5, 14, 20])
    assert h.compare(close, slow)["verdict"] == "tie"
    assert h.compare(slow, h.summary([0.0] * 5))["ratio"] is None  # no division by a zero median


def test_a_result_without_its_verdict_is_not_written(harness, tmp_path):
    h = harness.results
    plotted = []
    with pytest.raises(ValueError, match="passed"):
        h.write_results(tmp_path / "x.json", {"ratio": 1.2}, lambda r, p: plotted.append(p))
    assert not (tmp_path / "x.json").exists() and not plotted
    h.write_results(tmp_path / "x.json", {"ratio": 1.2, "passed": False}, lambda r, p: plotted.append(p))
    assert json.loads((tmp_path / "x.json").read_text())["passed"] is False and plotted == [tmp_path / "x.png"]


def test_the_ray_train_plan_stops_and_evaluates_on_rank_0s_clock(harness, tmp_path):
    plan = harness.ray_train.Plan
    first = 1000.0
    # an epoch budget alone: never stops inside an epoch, never evaluates; the rate over the epochs
    budget = plan(workload={}, seed=0, epochs=4)
    assert budget.decide(first + 1e6, first, first) == (False, False)
    assert [budget.progress(e, first, first) for e in (0, 2, 4)] == [0.0, 0.5, 1.0]
    # seconds after the first step, evaluating every 30 s; the rate over the seconds
    wall = plan(workload={}, seed=0, wall_s=60, eval_every_s=30, lr_over="wall")
    assert wall.decide(first + 29, first, first) == (False, False)
    assert wall.decide(first + 31, first, first) == (True, False)
    assert wall.decide(first + 61, first, first + 31) == (False, True)  # no evaluation when stopping
    assert wall.progress(0, first + 15, first) == 0.25 and wall.progress(0, first + 90, first) == 1.0
    # a time to stop at, and a file appearing; a rate that never moves; 40 epochs' rate capped at 1
    assert plan(workload={}, seed=0, until=first + 5).decide(first + 5, first, first) == (False, True)
    stop = tmp_path / "stop"
    by_file = plan(workload={}, seed=0, stop_file=str(stop), lr_over="none")
    assert by_file.decide(first + 1e6, first, first) == (False, False)
    stop.write_text("stop")
    assert by_file.decide(first + 1, first, first) == (False, True) and by_file.progress(9, first, first) == 0.0
    assert plan(workload={}, seed=0, lr_epochs=40).progress(50, first, first) == 1.0
