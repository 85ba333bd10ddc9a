"""A batch too large for device memory (orchestrator/learner/memory_fit.py): CUDA's out-of-memory error is
raised here by the workload's loss for batches above a size, as a device with room for that many
utterances would; the learner trains the batch in parts with the whole batch's gradient, and
skips, counting it, a batch whose single utterances do not fit."""

import logging

import pytest
import torch

from orchestrator.learner.replica import Learner
from orchestrator.service.shards import ShardPlanner
from tests.builders import make_spec

pytestmark = pytest.mark.unit


def _learner(corpus) -> Learner:
    # nothing random in the loss (no SpecAugment masks, no dropout): parts and whole see the same
    spec = make_spec(corpus, features={"freq_mask": 0, "time_mask": 0}, model__dropout=0.0, data__max_batch_seconds=30)
    return Learner("asr", spec.workload_config.model_dump(mode="json"), seed=0, learner_id=7,
                   planner=ShardPlanner([7]))


def _room_for(learner: Learner, utterances: int) -> list[int]:
    """Make the learner's loss fail as CUDA does for batches over `utterances`; returns the sizes tried."""
    loss, tried = learner.workload.loss, []

    def tight(model, batch):
        tried.append(batch.size)
        if batch.size > utterances:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return loss(model, batch)

    learner.workload.loss = tight
    return tried


def test_a_batch_that_does_not_fit_trains_in_parts_with_the_whole_batchs_gradient(corpus, caplog):
    whole, parts = _learner(corpus), _learner(corpus)
    batch = whole.next_batch()
    assert batch.size >= 5
    expected_loss = whole.forward_backward(batch)
    tried = _room_for(parts, 3)
    with caplog.at_level(logging.WARNING, "chorus.learner"):
        loss = parts.forward_backward(batch)
    final = int(caplog.text.rsplit("trying it in ", 1)[1].split()[0])  # parts of the round that fitted
    assert tried[0] == batch.size and len(tried[-final:]) == final and max(tried[-final:]) <= 3
    assert sum(tried[-final:]) == batch.size  # every utterance once in the end, in parts of at most 3
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert torch.allclose(parts.flat_grads(), whole.flat_grads(), rtol=1e-4, atol=1e-6)
    assert parts.counters()["oom_splits"] == 1 and parts.counters()["oom_skipped"] == 0
    assert f"learner 7: CUDA out of memory on a batch of {batch.size}: trying it in 2 parts" in caplog.text
    parts.apply_step(loss, batch.size)  # and the learner steps on
    assert parts.counters()["step"] == 1


def test_a_batch_whose_single_utterances_do_not_fit_is_skipped_and_counted(corpus, caplog):
    learner = _learner(corpus)
    batch = learner.next_batch()
    _room_for(learner, 0)
    with caplog.at_level(logging.WARNING, "chorus.learner"):
        loss = learner.forward_backward(batch)
    assert loss == 0.0 and float(learner.flat_grads().abs().sum()) == 0.0
    assert learner.counters()["oom_skipped"] == 1
    assert f"CUDA out of memory on a batch of {batch.size} even one sample at a time: skipped" in caplog.text
