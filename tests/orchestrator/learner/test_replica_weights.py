"""A learner's weights as one flat tensor (`orchestrator/learner/replica.py`): the parameters are views of it, and a
gossip exchange settles its mean without losing a change made while it was under way."""

import pytest
import torch

from orchestrator.learner.replica import Learner
from orchestrator.service.shards import ShardPlanner
from tests.builders import linear_spec


def _learner(seed: int = 0) -> Learner:
    config = linear_spec(model__hidden_layers=1).workload_config.model_dump(mode="json")
    return Learner("linear", config, seed=seed, learner_id=0, planner=ShardPlanner([0]))


@pytest.mark.unit
def test_parameters_are_views_of_the_flat_weights_through_a_training_step():
    learner = _learner()
    learner.load_flat_weights(torch.arange(learner.numel, dtype=torch.float32))
    first = learner.params[0]
    assert torch.equal(first.detach().reshape(-1), torch.arange(first.numel(), dtype=torch.float32))
    loss = learner.forward_backward(learner.next_batch())
    learner.apply_step(loss, 16)  # the optimizer writes the parameters: the flat tensor sees it
    assert torch.equal(learner.flat, torch.cat([p.detach().reshape(-1) for p in learner.params]))


@pytest.mark.unit
def test_an_unchanged_replica_settles_on_the_exact_mean_of_both_partners():
    active, passive = _learner(0), _learner(1)
    a, p = torch.empty(active.numel), torch.empty(passive.numel)
    va, vp = active.copy_weights_to(a), passive.copy_weights_to(p)
    active.settle_mean(a, p, a, va)
    passive.settle_mean(a, p, p, vp)
    assert torch.equal(active.flat, passive.flat)  # the same bits on both sides
    assert torch.allclose(active.flat, (a + p) / 2)


@pytest.mark.unit
def test_a_step_taken_during_the_exchange_is_kept_on_top_of_the_mean():
    active, passive = _learner(0), _learner(1)
    a, p = torch.empty(active.numel), torch.empty(passive.numel)
    active.copy_weights_to(a)
    vp = passive.copy_weights_to(p)
    loss = passive.forward_backward(passive.next_batch())
    passive.apply_step(loss, 16)  # the passive's own step, while its copy is on the wire
    stepped = passive.flat.clone()
    passive.settle_mean(a, p, p, vp)
    assert not torch.equal(stepped, p)
    assert torch.allclose(passive.flat, stepped + ((a + p) / 2 - p), atol=1e-6)  # its step is not lost
