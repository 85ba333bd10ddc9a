"""The group strategies without Ray (`groups/strategies.py`): what each kind decides from the
roster's books (order, shard weights, when to rebalance, who keeps a leaver's weights, which
learners start chunks together), over fake learners, none of which a strategy calls."""

from __future__ import annotations

import pytest

from orchestrator.driver.events import EventLog
from orchestrator.driver.metrics import JobMetrics
from orchestrator.driver.roster import LearnerSlot, Roster
from orchestrator.groups.allreduce import AllreduceStrategy
from orchestrator.groups.gossip import GossipStrategy
from orchestrator.groups.hierarchical import HierarchicalStrategy
from orchestrator.groups.rendezvous import Meeting
from orchestrator.groups.strategies import Rebalance, strategy_for
from tests.builders import linear_spec
from tests.doubles import FakeLearner

pytestmark = pytest.mark.unit


def _roster(tmp_path, speeds: dict[int, float | None], nodes: dict[int, str] | None = None) -> Roster:
    metrics = JobMetrics("job", "x", enabled=False)
    roster = Roster(EventLog(tmp_path / "events.jsonl", metrics, 0.0), metrics)
    for i, speed in speeds.items():
        roster.live[i] = LearnerSlot(i, FakeLearner(i, average=lambda weights: weights), node=(nodes or {}).get(i, "a"),
                                     speed=speed, step_compute_s=None if speed is None else 8 / speed)
    roster.order = sorted(speeds)
    return roster


def _strategy(kind: str, **group):
    return strategy_for(linear_spec(learners=4, group={"kind": kind, **group}), distributed=True)


class Rendezvous:
    """The group's answers to a strategy (`strategies.Rendezvous`), made up: a board named after the
    learners it is for."""

    def meeting(self, handles) -> Meeting:
        return Meeting(None, "board-" + "-".join(str(h.id) for h in handles), [f"10.0.0.{h.id}" for h in handles])

    def backend(self, handles) -> str:
        return "gloo"


def test_each_kind_has_its_strategy_and_one_process_has_a_group_of_one():
    assert isinstance(_strategy("allreduce"), AllreduceStrategy)
    assert isinstance(_strategy("gossip"), GossipStrategy) and _strategy("gossip").swaps_running
    assert isinstance(_strategy("hierarchical"), HierarchicalStrategy)
    local = strategy_for(linear_spec(learners=1), distributed=False)
    assert local.name == "solo" and local.lockstep


def test_allreduce_shards_by_measured_speed_and_rebalances_only_past_the_threshold(tmp_path):
    strategy = _strategy("allreduce", balance=True)
    roster = _roster(tmp_path, {0: 100.0, 1: 50.0})
    weights = strategy.shard_weights(roster)
    assert weights[0] > weights[1] and sum(weights) == pytest.approx(1.0)
    assert strategy.rebalance(roster) == Rebalance(replan=True)  # nothing planned yet
    strategy.planned = ([0, 1], weights)
    assert strategy.rebalance(roster) is None  # the same speeds: the same shares
    roster.live[1].speed, roster.live[1].step_compute_s = 100.0, 0.08
    assert strategy.rebalance(roster) == Rebalance(replan=True)
    assert _strategy("allreduce", balance=False).shard_weights(roster) is None
    assert strategy.shard_weights(_roster(tmp_path, {0: 100.0, 1: None})) is None  # one not measured yet


def test_gossip_puts_a_clearly_faster_passive_at_an_active_place(tmp_path):
    strategy = _strategy("gossip", balance=True, topology_aware=False)
    roster = _roster(tmp_path, {0: 50.0, 1: 55.0, 2: 50.0, 3: 50.0})
    assert strategy.rebalance(roster) is None  # within the noise
    roster.live[1].speed = 200.0
    assert strategy.rebalance(roster) == Rebalance(regroup=True)
    assert strategy.order(roster)[0] == 1  # the fastest goes first, an active place


def test_a_leaving_gossip_learner_hands_its_weights_to_its_ring_neighbour(tmp_path):
    strategy = _strategy("gossip")
    roster = _roster(tmp_path, {0: 1.0, 1: 1.0, 2: 1.0})
    assert strategy.handover(roster, roster.live[2]) == 0  # the ring wraps round
    assert strategy.handover(roster, roster.live[0]) == 1
    assert not any(slot.handle.calls for slot in roster.live.values())  # it decides; the group averages
    assert _strategy("allreduce").handover(roster, roster.live[2]) is None  # replicas are equal: nothing to keep


def test_hierarchical_members_of_one_node_start_their_chunks_together(tmp_path):
    strategy = _strategy("hierarchical")
    roster = _roster(tmp_path, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, nodes={0: "a", 1: "b", 2: "a", 3: "b"})
    members = strategy.members(roster, Rendezvous())
    assert strategy.node_groups == [[0, 2], [1, 3]]
    assert [m.meeting.name for m in members] == ["board-0-2", "board-1-3"] * 2  # a board for each node's group
    assert members[0].meeting.peers == ["10.0.0.0", "10.0.0.2"]
    assert [m.leader is not None for m in members] == [True, True, False, False]  # a node's first leads it
    roster.drop(3, "gone")
    assert strategy.dispatch_units(roster) == [[0, 2], [1]]
    assert strategy.state_writers([0, 1, 2]) == [0, 1, 2] and _strategy("allreduce").state_writers([0, 1]) == [0]
