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
    monkeypatch.syspath_prepend(str(BENCH))  # as when run as a script: it imports bench/harness
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in [m for m in sys.modules if m == "harness" or m.startswith("harness.")]:
        sys.modules.pop(name)
    sys.modules.pop("gpu_learners", None)


def test_the_figure_of_a_one_gpu_run_is_drawn_without_communication(gpu_bench, tmp_path):
    step = {"median": 0.01, "iqr": [0.009, 0.011]}
    result = {"device_name": "NVIDIA H200", "communication": "needs 2 devices: not measured",
              "steps": {"seconds_per_step": {"tiny_fp32": step, "tiny_bf16": step}}}
    gpu_bench.plot(result, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").stat().st_size > 1000


def test_the_figure_shows_the_learners_part_and_the_checks_are_issue_40s_targets(gpu_bench, tmp_path):
    def row(median):
        return {"median": median, "iqr": [median * 0.9, median * 1.1], "runs": [median] * 5}

    learners = {name: {"samples_per_s": {"chorus_1": row(12_000), "chorus_2_sharing": row(16_000),
                                         "torch_dataloader": row(3_000)}, "baseline": "torch_dataloader",
                       "gpu_busy_mean": {"chorus_1": row(80.0)}, "chorus_over_baseline": {"verdict": "higher"},
                       "two_sharing_over_one": {"ratio": 1.33, "verdict": "higher"}}
                for name in ("tiny", "conformer", "conformer_gpu")}
    result = {"device_name": "NVIDIA H100", "devices": 1, "communication": "needs 2 devices: not measured",
              "steps": {"seconds_per_step": {}, "bf16_speedup": {"10m": {"ratio": 1.3}},
                        "cudnn_compaction_warning": False},
              "learners": {"recipes": learners, "baseline": {"name": "torch_dataloader", "why": "test"}}}
    gpu_bench.plot(result, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").stat().st_size > 1000
    assert all(gpu_bench.checks(result, {"steps", "learners"}).values())
    learners["conformer_gpu"]["gpu_busy_mean"]["chorus_1"] = row(60.0)  # a GPU left 40% idle fails
    learners["tiny"]["chorus_over_baseline"]["verdict"] = "tie"  # and so does a tie with the baseline
    learners["tiny"]["two_sharing_over_one"]["ratio"] = 1.2  # and two learners on the GPU below 1.3x one
    failed = {k for k, ok in gpu_bench.checks(result, {"steps", "learners"}).items() if not ok}
    assert failed == {"conformer_gpu_chorus_1_gpu_at_least_70_percent_busy", "chorus_above_baseline_every_recipe",
                      "tiny_two_sharing_at_least_1.3x_one"}
    unmeasured = gpu_bench.checks({**result, "learners": None}, {"steps"})  # a part not run: None, not passed
    assert {k for k, ok in unmeasured.items() if ok is None} == {
        "tiny_chorus_1_at_least_10000_samples_per_s", "conformer_chorus_1_at_least_10000_samples_per_s",
        "conformer_gpu_chorus_1_gpu_at_least_70_percent_busy", "chorus_above_baseline_every_recipe",
        "tiny_two_sharing_at_least_1.3x_one"}


def test_where_ray_train_does_not_import_the_baseline_is_the_same_loop_in_a_plain_actor(gpu_bench, monkeypatch):
    learners = sys.modules["gpu_learners"]
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray.train", None)  # as the GPU kit's Ray, which lacks ray.data
        patch.setitem(sys.modules, "ray.train.torch", None)
        chosen = learners.baseline("auto")
        assert chosen["name"] == "torch_dataloader" and "ray.train does not import here" in chosen["why"]
        assert learners.baseline("torch")["name"] == "torch_dataloader"
        with pytest.raises(SystemExit, match="ray.train does not import"):
            learners.baseline("ray_train")
    assert learners.baseline("auto")["name"] == "ray_train"  # this venv's Ray has ray.train
