"""bench/gpu.py's figure on a machine with one GPU, where the communication part is not measured
(it crashed there: the plot read the reason, a string, as sizes)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytestmark = pytest.mark.unit


@pytest.fixture
def gpu_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # as when run as a script: it imports bench/_common
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("_common", None)


def test_the_figure_of_a_one_gpu_run_is_drawn_without_communication(gpu_bench, tmp_path):
    step = {"median": 0.01, "iqr": [0.009, 0.011]}
    result = {"device_name": "NVIDIA H200", "communication": "needs 2 devices: not measured",
              "steps": {"seconds_per_step": {"tiny_fp32": step, "tiny_bf16": step}}}
    gpu_bench.plot(result, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").stat().st_size > 1000
