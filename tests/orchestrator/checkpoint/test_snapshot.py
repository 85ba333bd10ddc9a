"""The driver holds no model: checkpoints are a manifest of files the learners and the evaluator
wrote (`state_store.py`, `checkpoint/files.py` format 2), the averaged model is summed among the
learners (`consensus.py`), and what reaches the driver per evaluation is a few kilobytes."""

from __future__ import annotations

import pytest
import torch

from orchestrator.checkpoint import files as checkpoint
from orchestrator.checkpoint.state_store import START, StateStore, model_file, state_file
from orchestrator.cluster.runtime import RayRuntime
from orchestrator.driver.job import TrainingJob
from tests.builders import linear_spec

BIG = {"features": 2048, "classes": 16}  # a 32,784-parameter model: 131 kB of weights


# -- the store and the manifest (no Ray) -------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("uri", [False, True])
def test_store_writes_atomically_reads_with_weights_only_and_prunes_what_no_checkpoint_keeps(tmp_path, uri):
    store = StateStore(f"file://{tmp_path}" if uri else tmp_path)
    for step in (10, 20, 30):
        for learner in (0, 1):
            store.write(state_file(step, learner), {"w": torch.full((4,), float(step))})
        store.write(model_file(step), {"model": {"w": torch.zeros(4)}})
    size = store.write(START, {"w": torch.ones(4)})
    assert size == store.size(START) and store.size("state-99-0.pt") is None
    assert float(store.read(state_file(20, 1))["w"][0]) == 20.0
    assert not list(tmp_path.glob(".*"))  # no temp file left
    store.write(state_file(40, 0), {"w": torch.zeros(4)})  # a checkpoint in the making
    store.prune(kept_steps={30}, newest=30)
    assert store.names() == ["model-30.pt", "state-30-0.pt", "state-30-1.pt", "state-40-0.pt", START]


def _manifest(tmp_path, step: int) -> dict:
    store = StateStore(tmp_path)
    entries = [{"file": state_file(step, i), "counters": {"step": step, "samples": 0, "epoch": 0}} for i in (0, 1)]
    for i, entry in enumerate(entries):
        entry["bytes"] = store.write(entry["file"], {"model": {"w": torch.full((3,), float(i))}, "optimizer": {},
                                                     "counters": entry["counters"]})
    model = {"file": model_file(step), "bytes": store.write(model_file(step), {"model": {"w": torch.ones(3)}})}
    return {"spec": {"name": "m"}, "learners": entries, "learner_ids": [0, 1], "planner": None, "model": model,
            "job": {"wall_s": 0.0, "evals": []}}


@pytest.mark.unit
def test_a_checkpoint_whose_files_are_missing_or_cut_short_is_skipped_naming_the_file(tmp_path):
    checkpoint.save(tmp_path, _manifest(tmp_path, 8), step=8)
    checkpoint.save(tmp_path, _manifest(tmp_path, 9), step=9)
    loaded = checkpoint.load(tmp_path)  # resolved: the learners' states and the model read in
    assert loaded.path.name == "checkpoint-9.pt" and float(loaded.state["learners"][1]["model"]["w"][0]) == 1.0
    assert float(loaded.state["model"]["w"][0]) == 1.0 and loaded.state["learners"][0]["counters"]["step"] == 9
    (tmp_path / state_file(9, 1)).write_bytes((tmp_path / state_file(9, 1)).read_bytes()[:20])
    loaded = checkpoint.load_latest(tmp_path)
    assert loaded.path.name == "checkpoint-8.pt"
    assert loaded.problems == [f"{tmp_path / 'checkpoint-9.pt'}: unusable: the file it names, state-9-1.pt, is "
                               f"20 bytes, not {(tmp_path / state_file(8, 1)).stat().st_size}"]
    (tmp_path / model_file(8)).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="the file it names, model-8.pt, is missing"):
        checkpoint.load_latest(tmp_path)


# -- jobs ---------------------------------------------------------------------------------------------
def _model_bytes(spec) -> int:
    from orchestrator.workload import build_workload

    model = build_workload(spec.workload, spec.workload_config, spec.seed).build_model()
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.mark.slow
def test_gossip_learners_write_their_own_states_and_sum_the_average_among_themselves(ray_session, tmp_path):
    spec = linear_spec(name="snap-gossip", learners=3, group={"kind": "gossip"}, budget__epochs=2,
                       data={**linear_spec(raw=True)["data"], **BIG})
    job = TrainingJob(spec, tmp_path)
    job.run()
    # per evaluation the driver received a few kilobytes (file names, counters, scores): no weights
    assert len(job.snapshots.driver_bytes) == len(job.evals) >= 2
    assert max(job.snapshots.driver_bytes) < _model_bytes(spec) / 10, (job.snapshots.driver_bytes,
                                                                        _model_bytes(spec))
    loaded = checkpoint.load(tmp_path)
    step = int(loaded.path.stem.split("-")[1])
    assert [e["file"] for e in torch.load(loaded.path, weights_only=True)["learners"]] == \
        [state_file(step, i) for i in loaded.state["learner_ids"]]  # one file per learner, each its own
    # the averaged model (what `chorus eval` reads) is the mean of the learners' models: the tree
    # of three (one carried up a level) summed every one of them once
    mean = {k: torch.stack([s["model"][k] for s in loaded.state["learners"]]).mean(0) for k in loaded.state["model"]}
    for key, value in loaded.state["model"].items():
        assert torch.allclose(value, mean[key], atol=1e-6), key
    kept = {int(p.stem.split("-")[1]) for p in checkpoint.numbered(tmp_path)}
    assert {n for n in StateStore(tmp_path).names() if n != START} == \
        {f for s in kept for f in [model_file(s)] + [state_file(s, i) for i in range(3)]}


@pytest.mark.slow
def test_allreduce_checkpoints_one_state_for_its_equal_replicas_and_resumes_from_it(ray_session, tmp_path):
    spec = linear_spec(name="snap-allreduce", learners=2, group={"kind": "allreduce"}, budget__epochs=1,
                       data={**linear_spec(raw=True)["data"], **BIG})
    job = TrainingJob(spec, tmp_path)
    job.run()
    assert max(job.snapshots.driver_bytes) < _model_bytes(spec) / 10
    manifest = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    [written] = {e["file"] for e in manifest["learners"]}  # both learners name one file
    assert written.startswith("state-") and [e["counters"]["samples"] for e in manifest["learners"]] == [256, 256]
    resumed = TrainingJob(linear_spec(name="snap-allreduce", learners=2, group={"kind": "allreduce"},
                                      budget__epochs=2, data={**linear_spec(raw=True)["data"], **BIG}),
                          tmp_path, resume=True)
    summary = resumed.run()
    assert [r["epoch"] for r in resumed.evals] == [1, 2] and summary["samples"] == 2 * 512


@pytest.mark.ray
def test_an_evaluation_slower_than_an_epoch_still_gives_each_epoch_its_own_record(ray_session, tmp_path):
    # an epoch of ~0.3 s, evaluations of >= 1 s: epoch 2 falls due while epoch 1's evaluation runs.
    # Its record must be of epoch 2's weights (a sweep's scheduler counts one report per epoch),
    # not of whatever epoch the learner has reached when epoch 1's is done
    spec = linear_spec(name="snap-slow-eval", budget__epochs=3,
                       data={**linear_spec(raw=True)["data"], "compute_seconds": 0.01, "eval_seconds": 1.0})
    reports = []
    job = TrainingJob(spec, tmp_path, report=reports.append, runtime=RayRuntime())  # as a sweep's trial runs it
    job.run()
    assert [int(r["epoch"]) for r in job.evals] == [1, 2, 3], [r["epoch"] for r in job.evals]
    assert [r["epoch"] for r in reports] == [r["epoch"] for r in job.evals]
    assert [r["step"] for r in job.evals] == sorted({r["step"] for r in job.evals})  # three different steps
