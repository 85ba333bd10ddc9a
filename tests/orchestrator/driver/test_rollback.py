"""The rollback policy without Ray: it decides (back to which states, at what learning rate, or
give up) and the loop carries the decision out; here only the decisions are checked."""

from __future__ import annotations

import math

import pytest

from orchestrator.driver.rollback import Rollbacks, TrainingDiverged
from tests.doubles import FakeLearner, stats

pytestmark = pytest.mark.unit


def _rollbacks(max_rollbacks: int = 2) -> tuple[Rollbacks, list]:
    events = []
    rollbacks = Rollbacks("store", max_rollbacks, lambda kind, text, **fields: events.append((kind, text, fields)))
    rollbacks.states = {0: {"file": "state-40-0.pt", "counters": {"step": 40}},
                        1: {"file": "state-40-1.pt", "counters": {"step": 40}}}
    return rollbacks, events


def test_a_non_finite_loss_or_weights_is_divergence_and_a_finite_one_is_not():
    rollbacks, _ = _rollbacks()
    assert not rollbacks.diverged([(0, stats(loss=2.5)), (1, stats(loss=None))])
    assert rollbacks.diverged([(0, stats(loss=2.5)), (1, stats(loss=math.nan))])
    assert rollbacks.diverged([(0, stats(loss=math.inf))])
    rollbacks.weights_diverged = True  # an evaluation read non-finite weights
    assert rollbacks.diverged([(0, stats(loss=2.5))])


def test_the_decision_halves_the_lowest_rate_and_names_the_first_bad_step(tmp_path):
    rollbacks, events = _rollbacks()
    results = [(0, stats(loss=math.nan, nonfinite_at=57)), (1, stats(loss=math.nan, nonfinite_at=55, broken="x"))]
    decision = rollbacks.decide(results, [1.0, 0.5], tmp_path / "checkpoint.pt")
    assert (decision.scale, decision.at, decision.where, decision.broken) == (0.25, 55, "at step 55", True)
    assert events == [] and rollbacks.count == 0  # deciding changes nothing
    rollbacks.weights_diverged = True
    rollbacks.rolled_back(decision)
    assert rollbacks.count == 1 and not rollbacks.weights_diverged
    kind, text, fields = events[0]
    assert kind == "rollback" and fields == {"at_step": 55, "to_step": 40, "lr_scale": 0.25}
    assert "rollback 1 of at most 2" in text


def test_each_learner_goes_back_to_its_own_state_and_a_newcomer_adopts_the_first():
    rollbacks, _ = _rollbacks()
    assert rollbacks.entry_for(1) == ({"file": "state-40-1.pt", "counters": {"step": 40}}, False)
    assert rollbacks.entry_for(7) == ({"file": "state-40-0.pt", "counters": {"step": 40}}, True)
    newcomer = FakeLearner(7)
    rollbacks.adopt(newcomer)
    assert newcomer.called("load_state_file") == [("store", rollbacks.states[0], True)]


def test_once_the_rollbacks_are_spent_it_gives_up_naming_the_last_good_checkpoint(tmp_path):
    rollbacks, _ = _rollbacks(max_rollbacks=1)
    results = [(0, stats(loss=math.nan, nonfinite_at=12))]
    rollbacks.rolled_back(rollbacks.decide(results, [1.0], tmp_path / "checkpoint.pt"))
    with pytest.raises(TrainingDiverged, match=r"at step 12 after 1 rollback\(s\).*no checkpoint was written"):
        rollbacks.decide(results, [0.5], tmp_path / "checkpoint.pt")
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    with pytest.raises(TrainingDiverged, match="the last good checkpoint is .*checkpoint.pt"):
        rollbacks.decide([(0, stats(loss=math.nan))], [0.5], tmp_path / "checkpoint.pt")
