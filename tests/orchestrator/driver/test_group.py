"""Forming and re-forming the group without Ray: fake learners join (or die, hang, or fail to join)
as a test says; the group drops the dead and the stuck, forms again without them, swaps a gossip
ring in while learners run, and stops the job when every join fails the same way."""

from __future__ import annotations

import pytest

from orchestrator.driver.events import EventLog
from orchestrator.driver.group import JOIN_TIMEOUT_S, Group
from orchestrator.driver.metrics import JobMetrics
from orchestrator.driver.roster import LearnerSlot, Roster
from orchestrator.groups.allreduce import AllreduceMember
from orchestrator.groups.errors import GroupCannotForm
from orchestrator.groups.gossip import GossipMember
from tests.builders import linear_spec
from tests.doubles import FakeLearner, FakeRuntime

pytestmark = pytest.mark.unit


class FakeElastic:
    """What the group asks of `Elastic`: drop a learner, and the job's service (the shard planner)."""

    def __init__(self, roster: Roster):
        self.roster, self.dropped = roster, []
        self.service = FakeLearner(-1)

    def drop(self, learner_id: int, error) -> None:
        self.dropped.append(learner_id)
        self.roster.drop(learner_id, error)


def _group(tmp_path, kind: str, learners: int) -> tuple[Group, Roster, FakeElastic, FakeRuntime, list]:
    metrics = JobMetrics("job", kind, enabled=False)
    events = EventLog(tmp_path / "events.jsonl", metrics, 0.0)
    roster, runtime = Roster(events, metrics), FakeRuntime()
    fakes = []
    for i in range(learners):
        fake = FakeLearner(i, device="cpu", ip=f"10.0.0.{i % 2 + 1}", group_address=f"10.0.0.{i % 2 + 1}")
        roster.live[i] = LearnerSlot(i, fake, node=f"node-{i % 2}")
        fakes.append(fake)
    elastic = FakeElastic(roster)
    spec = linear_spec(learners=learners, group={"kind": kind})
    return Group("job", spec, runtime, roster, elastic, events, runtime.clock), roster, elastic, runtime, fakes


def test_an_allreduce_group_hands_each_learner_its_rank_and_waits_for_the_plan(tmp_path):
    group, roster, elastic, _, fakes = _group(tmp_path, "allreduce", 3)
    assert group.form() is False and group.lockstep and group.name == "allreduce"
    members = [fake.called("join")[0][0] for fake in fakes]
    assert all(isinstance(m, AllreduceMember) for m in members)
    assert [(m.rank, m.world_size) for m in members] == [(0, 3), (1, 3), (2, 3)]
    assert elastic.service.called("set_members") == [([0, 1, 2], None)]
    assert all(slot.in_group for slot in roster.live.values())


def test_a_gossip_leaver_s_weights_go_to_its_ring_neighbour_by_one_average(tmp_path):
    group, roster, _, _, fakes = _group(tmp_path, "gossip", 3)
    for fake in fakes:
        fake.answers.update(weights=f"weights of {fake.id}", average=lambda weights: None)
    assert group.form() is False
    leaver = roster.live[roster.order[-1]]
    keeper = group.handover(leaver)
    assert keeper == roster.order[0]  # the ring wraps round
    assert len(roster.live[keeper].handle.called("average")) == 1 and leaver.handle.called("weights")
    roster.live[keeper].handle.die()
    assert group.handover(leaver) is None  # the keeper died meanwhile: only the average is lost


def test_a_learner_that_dies_while_joining_is_dropped_and_the_group_forms_again_without_it(tmp_path):
    group, roster, elastic, _, fakes = _group(tmp_path, "allreduce", 3)
    fakes[1].die()
    assert group.form() is True  # formed again: learner 1 is gone
    assert elastic.dropped == [1] and 1 not in roster
    assert group.form() is False
    assert [(f.called("join")[-1][0].rank, f.called("join")[-1][0].world_size) for f in (fakes[0], fakes[2])] \
        == [(0, 2), (1, 2)]


def test_a_learner_stuck_in_its_join_is_dropped_after_the_join_timeout(tmp_path):
    group, roster, elastic, runtime, fakes = _group(tmp_path, "allreduce", 2)
    fakes[0].hang("join")
    before = runtime.clock()
    assert group.form() is True
    assert runtime.clock() - before == JOIN_TIMEOUT_S  # it waited the whole bound, no longer
    assert elastic.dropped == [0]
    event = [e for e in roster.events.recorded if e["kind"] == "failure"][0]
    assert "stuck: no answer 60 s into joining its group" in event["error"]


def test_every_join_failing_the_same_way_twice_stops_the_job_naming_the_error(tmp_path):
    group, _, elastic, _, fakes = _group(tmp_path, "allreduce", 2)

    def refuse(member):  # the join raises in a live learner: not a death
        raise ValueError(f"gloo: cannot bind to 10.0.0.{member.rank + 1}")

    for fake in fakes:
        fake.answers["join"] = refuse
    assert group.form() is True  # the first time, it forms again
    with pytest.raises(GroupCannotForm, match=r"all 2 learners failed to join it the same way 2 times"):
        group.form()
    assert elastic.dropped == []


def test_a_gossip_ring_is_swapped_in_while_its_learners_run(tmp_path):
    group, roster, elastic, _, fakes = _group(tmp_path, "gossip", 4)
    assert group.form() is False and not group.lockstep
    assert all(len(f.called("join")) == 1 for f in fakes)
    members = [f.called("join")[0][0] for f in fakes]
    assert all(isinstance(m, GossipMember) for m in members)
    assert roster.order == [0, 2, 1, 3]  # the learners of a node next to each other (topology_aware)
    by_position = {m.position: m for m in members}
    ring = [fakes[i] for i in roster.order]
    assert [by_position[k].partners for k in range(4)] == [[ring[1], ring[3]], [], [ring[1], ring[3]], []]
    roster.drop(3, "gone")
    assert group.form() is False  # learners already in the group get `regroup`, no join
    assert [len(f.called("regroup")) for f in fakes[:3]] == [1, 1, 1]
    assert elastic.service.called("set_members")[-1] == ([0, 2, 1], None)  # the plan follows the ring
