"""Batches prepared in worker processes (`data.workers`, jobs/data/worker_batches.py): the same batches
and augmentation draws as the learner's own process prepares, a resumed position and a shard
left midway for another (a resize) as on the thread path, and unreadable files counted in the
learner's corpus, not lost in a worker."""

import multiprocessing
import shutil

import pytest
import torch

from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload

# every augmentation on: the draws depend only on (seed, epoch, utterance), whoever prepares them
AUGMENT = {"speed_factors": [0.9, 1.0, 1.1], "noise_prob": 0.5, "reverb_prob": 0.5, "vtlp_warp": [0.9, 1.1]}


@pytest.fixture
def workload():
    """Workloads made by `workload(train, **data)`, their worker processes stopped when the test
    ends (not whenever the garbage collector gets to them, in another test)."""
    made = []

    def make(train, **data) -> AsrWorkload:
        config = WorkloadConfig(data={"train": train, "max_batch_seconds": 10, **data}, augment=AUGMENT)
        made.append(AsrWorkload(config, seed=0))
        return made[-1]
    yield make
    for each in made:
        each.train.close()
    assert multiprocessing.active_children() == []  # every worker process joined


def _same(got, expected) -> None:
    assert [b.ids for b in got] == [b.ids for b in expected]
    assert [b.feats.shape for b in got] == [b.feats.shape for b in expected]
    # the workers run one torch thread, this process several: sums in another order, not other draws
    assert all(torch.allclose(g.feats, e.feats, atol=1e-4, rtol=1e-4) for g, e in zip(got, expected, strict=True))


@pytest.mark.unit
def test_worker_processes_prepare_the_batches_the_learners_own_process_would(corpus, workload):
    reference = workload(corpus / "train.jsonl", prefetch_batches=0)
    parallel = workload(corpus / "train.jsonl", workers=2)
    for epoch in range(2):
        expected = list(reference.batches(0, 2, epoch))
        shard = parallel.batches(0, 2, epoch)
        _same(list(shard), expected)
        assert shard.position == len(expected)
    resumed = parallel.batches(0, 2, 1, start=3)  # a resumed learner starts at its position
    _same(list(resumed), expected[3:])


@pytest.mark.unit
def test_a_shard_left_midway_for_another_hands_over_none_of_the_first(corpus, workload):
    reference = workload(corpus / "train.jsonl", prefetch_batches=0)
    parallel = workload(corpus / "train.jsonl", workers=2, prefetch_batches=3)
    first = iter(parallel.batches(0, 2, 0))
    next(first)  # the workers have prepared batches of this shard ahead
    resized = iter(parallel.batches(1, 3, 0))  # the group grew: another shard of the same epoch
    got = [next(resized)]
    assert next(first, None) is None  # the left shard's iterator hands over nothing more, nor takes any
    got += list(resized)
    _same(got, list(reference.batches(1, 3, 0)))


@pytest.mark.unit
def test_a_file_a_worker_cannot_read_is_counted_in_the_learners_corpus(corpus, tmp_path, workload):
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    parallel = workload(copy / "train.jsonl", workers=2)
    gone = parallel.train.utterances[0]
    assert copy in gone.path.resolve().parents  # the copy's file, never the session corpus's
    gone.path.unlink()  # lost after indexing, as on a share that drops a file
    ids = [i for b in parallel.batches(0, 1, 0) for i in b.ids]
    assert gone.id not in ids and len(ids) == len(parallel.train) - 1
    assert parallel.train.skipped.total == 1 and str(gone.path) in parallel.train.skipped.keys[0]
    assert parallel.train.tried(0)  # known unreadable here: the learner's own reads skip it too
    again = [i for b in parallel.batches(0, 1, 1) for i in b.ids]
    assert gone.id not in again and parallel.train.skipped.total == 1  # counted once across epochs


@pytest.mark.ray
def test_learner_actors_with_worker_processes_train_every_utterance_once_across_a_resume_and_a_resize(
        ray_session, corpus, tmp_path):
    """Two learner actors, each preparing its batches in 2 worker processes (forked from the
    actor) with features left to the device path, train 2 epochs; the job resumes from its
    checkpoint with 3 learners for 2 more: every utterance once an epoch across both, none
    skipped, the new split used, nothing left behind."""
    from orchestrator.driver.job import TrainingJob
    from tests.builders import assert_nothing_left, make_spec

    def spec(learners: int, epochs: int):
        return make_spec(corpus, name="workers", learners=learners, group={"kind": "allreduce", "balance": False},
                         budget__epochs=epochs, data__workers=2, augment=AUGMENT, features__compute_on="device")

    first = TrainingJob(spec(2, 2), tmp_path).run()
    assert first["samples"] == 2 * 160 and first["skipped_utterances"] == {}
    resumed = TrainingJob(spec(3, 4), tmp_path, resume=True)
    summary = resumed.run()
    assert summary["samples"] == 4 * 160 and summary["skipped_utterances"] == {}
    assert summary["out_of_memory"] == {"splits": 0, "skipped": 0}
    assert [r["epoch"] for r in resumed.evals] == [1, 2, 3, 4] and summary["learners"] == 3  # the curve goes on
    assert_nothing_left("workers-", within=30.0)


@pytest.mark.unit
def test_unset_workers_are_the_learners_cpus_but_one_with_a_gpu_and_none_without(monkeypatch):
    from jobs.data.worker_batches import default_workers

    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)  # cpus_per_learner: 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_workers() == 0  # a CPU learner's step takes its 8 cores
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_workers() == 7  # a GPU learner: one core for the step's host side, 7 prepare batches
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert default_workers() == 0
