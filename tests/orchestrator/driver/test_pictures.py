"""A run's pictures (orchestrator/driver/pictures.py): TensorBoard's own reader finds the dev WER series
by samples trained, `curves.png` is written and drawn anew at each evaluation, and a resumed run's
event file hides what the stopped run logged after its checkpoint."""

import hashlib
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from orchestrator.driver import pictures as pictures_module
from orchestrator.driver.pictures import CURVES, TENSORBOARD, RunPictures
from orchestrator.testing.cluster import wait_until

pytestmark = pytest.mark.unit


def _record(samples: int, wer: float, learners: int = 2) -> dict:
    return {"epoch": samples / 100, "step": samples // 10, "samples": samples, "train_loss": 100 - wer / 2,
            "dev_loss": 90 - wer / 3, "dev_wer": wer, "learners": learners, "wall_s": samples / 50}


def _series(folder, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(folder / TENSORBOARD))
    events.Reload()
    return [(e.step, round(e.value, 4)) for e in events.Scalars(tag)]


def _digest(path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def test_the_dev_wer_series_reaches_tensorboard_and_curves_png_is_drawn_anew_each_evaluation(tmp_path):
    pictures = RunPictures(tmp_path, "t")
    records = [_record(100, 100.0)]
    now = time.time()
    events = [{"kind": "join", "time": now - 1.5}, {"kind": "rollback", "time": now - 1.0},
              {"kind": "failure", "time": now + 0.5}]
    pictures.add(records[-1], records, events)
    first = wait_until("curves.png", lambda: _digest(tmp_path / CURVES), timeout=60)
    assert (tmp_path / CURVES).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records.append(_record(250, 62.5, learners=1))
    pictures.add(records[-1], records, events)
    pictures.close()
    assert _digest(tmp_path / CURVES) != first
    assert not list(tmp_path.glob(".*.tmp"))  # replaced atomically
    assert _series(tmp_path, "dev_wer") == [(100, 100.0), (250, 62.5)]
    assert _series(tmp_path, "learners") == [(100, 2.0), (250, 1.0)]
    assert _series(tmp_path, "train_loss") == [(100, 50.0), (250, 68.75)]


def test_a_resumed_run_hides_what_the_stopped_run_logged_after_its_checkpoint(tmp_path):
    stopped = RunPictures(tmp_path, "t")
    records = [_record(100, 90.0), _record(200, 80.0), _record(300, 70.0)]
    for k in range(3):
        stopped.add(records[k], records[:k + 1], [])
    stopped.close()
    resumed = RunPictures(tmp_path, "t", resumed_samples=200)  # its checkpoint was the evaluation at 200 samples
    again = records[:2] + [_record(310, 65.0)]
    resumed.add(again[-1], again, [])
    resumed.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2  # each run's own file
    assert _series(tmp_path, "dev_wer") == [(100, 90.0), (200, 80.0), (310, 65.0)]


def test_two_writers_opened_in_the_same_second_keep_their_own_files(tmp_path):
    first, second = RunPictures(tmp_path, "t"), RunPictures(tmp_path, "t")  # (tensorboardX names files by the second)
    first.add(_record(100, 90.0), [_record(100, 90.0)], [])
    second.add(_record(200, 80.0), [_record(200, 80.0)], [])
    first.close()
    second.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert _series(tmp_path, "dev_wer") == [(100, 90.0), (200, 80.0)]


def test_an_evaluation_without_a_dev_split_logs_what_it_has(tmp_path):
    pictures = RunPictures(tmp_path, "t")
    record = {**_record(100, 0.0), "dev_wer": None, "dev_loss": None}
    pictures.add(record, [record], [])
    pictures.close()
    assert _series(tmp_path, "train_loss") == [(100, 100.0)]
    assert (tmp_path / CURVES).is_file()


def test_a_resumed_runs_membership_changes_are_marked_at_its_curves_wall_time(tmp_path, monkeypatch):
    drawn, clock = [], [1000.0]
    monkeypatch.setattr(pictures_module, "draw", lambda path, name, records, events: drawn.append(events))
    monkeypatch.setattr(pictures_module.time, "time", lambda: clock[0])
    pictures = RunPictures(tmp_path, "t", resumed_samples=100)  # its earlier runs trained 500 s
    events = [{"kind": "join", "time": 990.0, "wall_s": 2.0}, {"kind": "leave", "time": 1004.0, "wall_s": 16.0},
              {"kind": "rollback", "time": 995.0, "wall_s": 7.0}]
    pictures.add({**_record(200, 70.0), "wall_s": 500.0}, [], events)  # added at 1000.0
    clock[0] = 1010.0
    pictures.add({**_record(300, 60.0), "wall_s": 510.0}, [], events)
    pictures.close()
    assert [(e["kind"], e["wall_s"]) for e in drawn[-1]] == [("join", 490.0), ("leave", 504.0)]
