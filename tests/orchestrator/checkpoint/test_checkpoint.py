"""Runs never destroy each other: atomic, versioned, verified checkpoints with fallback
(orchestrator/checkpoint/files.py), one live run per output folder (orchestrator/checkpoint/rundir.py), and a
non-finite loss rolled back instead of checkpointed (TrainingJob)."""

import json
import logging
import operator
import os
import subprocess
import sys

import pytest
import torch

from orchestrator.checkpoint import files as checkpoint
from orchestrator.checkpoint.files import CheckpointError
from orchestrator.checkpoint.rundir import RunDir, RunDirError
from orchestrator.checkpoint.state_store import StateStore
from tests.builders import make_spec, run_cli


def _state(value: float = 1.0) -> dict:
    return {"spec": {"name": "t"}, "model": {"w": torch.full((3,), value)}, "learners": [{"counters": {}}],
            "learner_ids": [0], "planner": None, "job": {"wall_s": 0.0, "evals": []}}


def _truncate(path, keep_bytes: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep_bytes)


# -- the format -------------------------------------------------------------------------------------
@pytest.mark.unit
def test_save_is_atomic_keeps_the_newest_two_and_checkpoint_pt_is_the_newest(tmp_path):
    for step in (8, 16, 24):
        path = checkpoint.save(tmp_path, _state(step), step)
    assert path == tmp_path / "checkpoint-24.pt"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-16.pt", "checkpoint-24.pt", "checkpoint.pt"]
    assert os.path.samefile(tmp_path / "checkpoint.pt", path)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["version"] == checkpoint.FORMAT_VERSION and float(state["model"]["w"][0]) == 24
    for step in (32, 40):
        checkpoint.save(tmp_path, _state(step), step, keep=3)
    assert [p.name for p in checkpoint.numbered(tmp_path)] == ["checkpoint-40.pt", "checkpoint-32.pt",
                                                                "checkpoint-24.pt"]


@pytest.mark.unit
def test_a_failed_write_keeps_the_previous_checkpoints_and_no_temp_file(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, _state(1), 8)

    def disk_full(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match=r"checkpoint-16.pt: could not be written \(No space left on device\)"):
        checkpoint.save(tmp_path, _state(2), 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-8.pt", "checkpoint.pt"]
    assert checkpoint.load_latest(tmp_path).path.name == "checkpoint-8.pt"


@pytest.mark.unit
def test_a_truncated_newest_falls_back_to_the_previous_with_one_line(tmp_path, caplog):
    for step in (8, 16):
        checkpoint.save(tmp_path, _state(step), step)
    _truncate(tmp_path / "checkpoint-16.pt")
    with caplog.at_level(logging.WARNING, logger="chorus.checkpoint"):
        loaded = checkpoint.load(tmp_path / "checkpoint.pt")  # the stable name: the run's newest usable
    assert loaded.path == tmp_path / "checkpoint-8.pt" and float(loaded.state["model"]["w"][0]) == 8
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"{tmp_path / 'checkpoint-16.pt'}: truncated or corrupt (")
    assert line.endswith("; falling back to checkpoint-8.pt") and "\n" not in line
    # a run resuming from it sets the bad file aside, so it is neither loaded nor kept as the newest
    checkpoint.resume_from(tmp_path)
    assert (tmp_path / "checkpoint-16.pt.corrupt").is_file()
    assert os.path.samefile(tmp_path / "checkpoint.pt", tmp_path / "checkpoint-8.pt")


@pytest.mark.unit
def test_when_no_checkpoint_is_usable_the_error_is_one_line(tmp_path):
    for step in (8, 16):
        checkpoint.save(tmp_path, _state(step), step)
    _truncate(tmp_path / "checkpoint-16.pt")
    (tmp_path / "checkpoint-8.pt").write_bytes(b"not a zip at all")
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load_latest(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}: no usable checkpoint: {tmp_path / 'checkpoint-16.pt'}: truncated")
    assert "checkpoint-8.pt: truncated or corrupt" in message and "\n" not in message
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        checkpoint.load_latest(tmp_path / "empty")


class _Payload:
    # a callable no library replaces (Ray swaps builtins.print for its own once it has been used,
    # so a payload of `print` would be named differently depending on which tests ran first)
    def __reduce__(self):
        return (operator.truth, ("this ran while loading",))


@pytest.mark.unit
@pytest.mark.parametrize("bad, reason", [
    ({**_state(), "model": {"w": torch.tensor([float("nan")])}}, "its model has non-finite weights"),
    ({k: v for k, v in _state().items() if k != "planner"}, "no planner"),
    ({**_state(), "payload": _Payload()}, "refused: it holds _operator.truth, not only tensors and plain data"),
])
def test_what_is_loaded_is_verified(tmp_path, bad, reason):
    torch.save({"version": checkpoint.FORMAT_VERSION, **bad}, tmp_path / "checkpoint-8.pt")
    with pytest.raises(CheckpointError, match=reason):
        checkpoint.load_file(tmp_path / "checkpoint-8.pt")
    torch.save({**_state(), "version": 99}, tmp_path / "checkpoint-9.pt")
    with pytest.raises(CheckpointError, match="format version 99; this Chorus reads 1"):
        checkpoint.load_file(tmp_path / "checkpoint-9.pt")


def _manifest(tmp_path, step: int, model_file: str = "", learner_file: str = "") -> dict:
    """A format-2 checkpoint's state naming a model and a learner's state (written into the run's
    folder under their proper names unless the names are given)."""
    store = StateStore(tmp_path)
    model_name, learner_name = f"model-{step}.pt", f"state-{step}-0.pt"
    model_bytes = store.write(model_name, {"model": {"w": torch.ones(3)}})
    learner_bytes = store.write(learner_name, {"model": {"w": torch.ones(3)}, "counters": {"step": step}})
    return {**_state(), "model": {"file": model_file or model_name, "bytes": model_bytes},
            "learners": [{"file": learner_file or learner_name, "bytes": learner_bytes, "counters": {"step": step}}]}


@pytest.mark.unit
@pytest.mark.parametrize("name", ["../secret.pt", "/etc/secret.pt", "sub/model-16.pt", "model-16.pt\n", 16])
def test_a_checkpoint_naming_a_file_outside_its_run_is_refused_naming_it_and_a_resume_falls_back(tmp_path, name):
    """The names became paths unchecked: `../` or an absolute name was read from outside the run."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.zeros(3)}}, tmp_path / "secret.pt")  # what a name must not reach
    checkpoint.save(run, _manifest(run, 8), 8)
    checkpoint.save(run, _manifest(run, 16, learner_file=name), 16)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load_file(run / "checkpoint-16.pt")
    assert str(caught.value).startswith(f"{run / 'checkpoint-16.pt'}: refused: it names ")
    assert str(caught.value).endswith(", which is not a state or model file of its run")
    assert "\n" not in str(caught.value)
    loaded = checkpoint.resume_from(run)
    assert loaded.path == run / "checkpoint-8.pt" and loaded.problems == [str(caught.value)]
    assert (run / "checkpoint-16.pt.corrupt").is_file() and os.path.samefile(run / "checkpoint.pt", loaded.path)
    assert checkpoint.load(run).state["learners"][0]["counters"] == {"step": 8}
    with pytest.raises(ValueError, match="is not the name of a checkpoint's state or model file"):
        StateStore(run).read("../secret.pt")  # whoever else reads a name from a manifest (a learner)


# -- the run folder ---------------------------------------------------------------------------------
@pytest.mark.unit
def test_a_folder_holding_a_run_is_refused_and_overwrite_clears_only_the_runs_files(tmp_path):
    for name in ("checkpoint-8.pt", "evals.jsonl", "summary.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    with pytest.raises(RunDirError, match=r"already holds a run \(checkpoint-8.pt, evals.jsonl, notes.txt, "
                                          r"summary.json\): pass --resume to continue it or --overwrite"):
        RunDir(tmp_path).claim()
    run_dir = RunDir(tmp_path)
    run_dir.claim(overwrite=True)
    assert run_dir.contents() == ["notes.txt"]
    run_dir.release()


@pytest.mark.unit
def test_the_lock_keeps_a_second_live_run_out_naming_the_holder(tmp_path):
    holder = RunDir(tmp_path)
    holder.claim()
    # another process: the lock is on the folder, not on this process
    code = ("import sys; from orchestrator.checkpoint.rundir import RunDir, RunDirError\n"
            f"try:\n    RunDir({str(tmp_path)!r}).claim(resume=True)\n"
            "except RunDirError as exc:\n    print(exc); sys.exit(7)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path} is in use by another run (pid {os.getpid()} on ")
    holder.release()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- jobs ---------------------------------------------------------------------------------------------
def _steps_per_epoch(spec) -> int:
    from jobs.workload import AsrWorkload

    return len(AsrWorkload(spec.workload_config, seed=spec.seed).batches(0, 1, 0))


@pytest.mark.unit
def test_a_second_live_run_into_the_same_folder_is_refused(corpus, tmp_path):
    from orchestrator.driver.job import TrainingJob

    holder = RunDir(tmp_path)
    holder.claim()
    try:
        with pytest.raises(RunDirError, match=rf"{tmp_path} is in use by another run \(pid {os.getpid()} on "):
            TrainingJob(make_spec(corpus, "train", "dev"), tmp_path).run()
    finally:
        holder.release()
    assert RunDir(tmp_path).contents() == []  # the refused run wrote nothing


@pytest.mark.slow
def test_a_job_checkpoint_loads_with_weights_only_and_resume_falls_back_past_a_truncated_one(corpus, tmp_path,
                                                                                           caplog):
    from orchestrator.driver.job import TrainingJob

    TrainingJob(make_spec(corpus, "train", "dev", budget__epochs=2), tmp_path).run()
    newest, previous = checkpoint.numbered(tmp_path)
    state = torch.load(tmp_path / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert set(checkpoint.KEYS) <= set(state) and state["job"]["evals"][-1]["epoch"] == 2
    assert checkpoint.load_file(previous)["job"]["evals"][-1]["epoch"] == 1
    _truncate(newest, newest.stat().st_size // 2)
    epoch_2 = (tmp_path / "evals.jsonl").read_text().splitlines()[1]  # its checkpoint is the truncated one
    records = []
    with caplog.at_level(logging.WARNING, logger="chorus.checkpoint"):
        TrainingJob(make_spec(corpus, "train", "dev", budget__epochs=3), tmp_path, report=records.append,
                    resume=True).run()
    assert any(r.getMessage().startswith(f"{newest}: truncated or corrupt") for r in caplog.records)
    assert [r["epoch"] for r in records] == [2, 3]  # went on from epoch 1's checkpoint
    evals = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in evals] == [1, 2, 3]
    # the record whose checkpoint was lost is not: it is kept aside
    assert (tmp_path / "evals.superseded.jsonl").read_text().splitlines() == [epoch_2]
    assert checkpoint.load_latest(tmp_path).state["job"]["evals"][-1]["epoch"] == 3


@pytest.mark.slow
def test_a_nan_loss_rolls_back_to_the_last_checkpoint_at_half_the_learning_rate(corpus, tmp_path):
    from orchestrator.driver.job import TrainingJob

    spec = make_spec(corpus, "train", "dev", budget__epochs=2)
    nan_at = _steps_per_epoch(spec) + 17  # in epoch 2, after epoch 1's checkpoint (chunks are 8 steps)
    spec = make_spec(corpus, "train", "dev", budget__epochs=2, simulate__nan_loss_at_step=nan_at)
    summary = TrainingJob(spec, tmp_path).run()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    [rollback] = [e for e in events if e["kind"] == "rollback"]
    assert 0 < rollback["to_step"] < nan_at and rollback["lr_scale"] == 0.5
    assert summary["events"]["rollback"] == 1
    evals = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in evals] == [1, 2]
    assert all(r["train_loss"] == r["train_loss"] and r["dev_loss"] == r["dev_loss"] for r in evals)  # no NaN
    state = checkpoint.load(tmp_path).state  # verified, with the learners' states read in
    learner = state["learners"][0]
    assert learner["counters"]["lr_scale"] == 0.5
    assert learner["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.5 * 3e-3)


# -- the command line ---------------------------------------------------------------------------------
def _error_line(proc) -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    return lines[-1]


@pytest.mark.slow
def test_cli_refuses_a_non_empty_out_unless_resume_or_overwrite(corpus, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(make_spec(corpus, "train", "dev", raw=True)))  # JSON is YAML
    out = tmp_path / "run"
    assert run_cli("train", str(spec), "--out", str(out)).returncode == 0
    curve = (out / "evals.jsonl").read_text()
    proc = run_cli("train", str(spec), "--out", str(out))
    assert _error_line(proc) == (f"Error: {out} already holds a run (checkpoint-{_last_step(out)}.pt, checkpoint.pt, "
                                 "curves.png, evals.jsonl...): pass --resume to continue it or --overwrite to "
                                 "replace it")
    assert (out / "evals.jsonl").read_text() == curve  # nothing of the first run was touched
    proc = run_cli("train", str(spec), "--out", str(out), "--resume", "--set", "budget.epochs=2")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["epoch"] for line in (out / "evals.jsonl").read_text().splitlines()] == [1, 2]
    proc = run_cli("train", str(spec), "--out", str(out), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["epoch"] for line in (out / "evals.jsonl").read_text().splitlines()] == [1]
    assert len(checkpoint.numbered(out)) == 1  # the replaced run's checkpoints went with it
    # `chorus eval` of the stable name falls back past a truncated newest checkpoint, saying so
    checkpoint.save(out, {**checkpoint.load_file(out / "checkpoint.pt")}, 10_000)
    _truncate(out / "checkpoint-10000.pt")
    proc = run_cli("eval", str(out / "checkpoint.pt"), str(corpus / "dev.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert f"{out / 'checkpoint-10000.pt'}: truncated or corrupt (" in proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["utterances"] == 20


def _last_step(out) -> int:
    return int(checkpoint.numbered(out)[0].stem.partition("-")[2])


@pytest.mark.unit
def test_cli_stops_with_one_line_when_the_loss_stays_non_finite(corpus, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps(make_spec(corpus, "train", "dev", raw=True, optim__max_rollbacks=0,
                                         simulate__nan_loss_at_step=3)))
    proc = run_cli("train", str(spec), "--out", str(tmp_path / "run"))
    line = _error_line(proc)
    assert line.startswith("Error: the training loss became non-finite at step 3") and "optim.max_rollbacks" in line
    assert not checkpoint.numbered(tmp_path / "run")  # nothing non-finite was checkpointed
