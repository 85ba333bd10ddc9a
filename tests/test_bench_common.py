"""The benchmark harness (bench/_common.py): contenders interleaved in a rotating order, never fewer
than 5 repeats, a ratio called a win only when the IQRs are apart, and no result written without
its verdict."""

import importlib.util
import json
from pathlib import Path

import pytest

# loaded from its file: bench/ is not put on sys.path, where its scripts would shadow other modules
_spec = importlib.util.spec_from_file_location("_common", Path(__file__).resolve().parents[1] / "bench" / "_common.py")
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

pytestmark = pytest.mark.unit


def test_contenders_run_interleaved_in_an_order_that_rotates_each_repeat():
    order = []
    contenders = {name: (lambda r, name=name: order.append((r, name)) or r) for name in "abc"}
    runs = _common.interleaved(contenders, repeats=5, progress=None)
    assert runs == {n: [0.0, 1.0, 2.0, 3.0, 4.0] for n in "abc"}
    firsts = [name for r, name in order if order.index((r, name)) % 3 == 0]
    assert firsts == ["a", "b", "c", "a", "b"]
    assert [r for r, _ in order] == sorted(r for r, _ in order)  # each repeat ends before the next begins
    with pytest.raises(ValueError, match="at least 5"):
        _common.interleaved(contenders, repeats=3)
    with pytest.raises(ValueError, match="no contenders"):
        _common.interleaved({}, repeats=5)


def test_a_ratio_is_a_win_only_when_the_interquartile_ranges_are_apart():
    slow, fast = _common.summary([10, 11, 12, 13, 14]), _common.summary([14, 15, 16, 17, 18])
    assert slow["median"] == 12 and slow["iqr"] == [11, 13]
    assert _common.compare(fast, slow) == {"ratio": round(16 / 12, 4), "verdict": "higher"}
    assert _common.compare(slow, fast)["verdict"] == "lower"
    close = _common.summary([12.5, 13, 13.5, 14, 20])
    assert _common.compare(close, slow)["verdict"] == "tie"
    assert _common.compare(slow, _common.summary([0.0] * 5))["ratio"] is None  # no division by a zero median


def test_a_result_without_its_verdict_is_not_written(tmp_path):
    plotted = []
    with pytest.raises(ValueError, match="passed"):
        _common.write_results(tmp_path / "x.json", {"ratio": 1.2}, lambda r, p: plotted.append(p))
    assert not (tmp_path / "x.json").exists() and not plotted
    _common.write_results(tmp_path / "x.json", {"ratio": 1.2, "passed": False}, lambda r, p: plotted.append(p))
    assert json.loads((tmp_path / "x.json").read_text())["passed"] is False and plotted == [tmp_path / "x.png"]
