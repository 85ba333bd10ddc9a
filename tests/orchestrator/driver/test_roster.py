"""The roster's books without Ray: arrivals that answer become live, deaths and drains leave with
their samples counted, the group's order comes first, every change is logged and emitted once."""

from __future__ import annotations

import json

import pytest

from orchestrator.driver.events import EventLog
from orchestrator.driver.metrics import JobMetrics
from orchestrator.driver.roster import Arrival, Roster, reason
from tests.doubles import FakeLearner, Ref

pytestmark = pytest.mark.unit


@pytest.fixture
def roster(tmp_path) -> Roster:
    return Roster(EventLog(tmp_path / "events.jsonl", JobMetrics("job", "allreduce", enabled=False), 0.0),
                  JobMetrics("job", "allreduce", enabled=False))


def _join(roster: Roster, learner_id: int, node: str = "node-a", samples: int = 0):
    ref = Ref()
    roster.arrive(ref, Arrival(learner_id, FakeLearner(learner_id), f"slot-{learner_id}", placed_at=10.0))
    return roster.join(ref, {"node": node, "ready_at": 12.5, "pid": 100 + learner_id, "step": 0,
                             "samples": samples, "epoch": 0})


def test_an_arrival_that_answers_is_live_and_its_join_is_logged(roster, tmp_path):
    ref = Ref()
    roster.arrive(ref, Arrival(3, FakeLearner(3), "slot-3", placed_at=10.0))
    assert roster.count() == 1 and len(roster) == 0 and roster.held_slots() == ["slot-3"]
    slot = roster.join(ref, {"node": "node-abcdefghij", "ready_at": 12.5, "pid": 7, "step": 0, "epoch": 0})
    assert 3 in roster and roster.get(3) is slot and slot.stats == {"step": 0, "epoch": 0}
    assert roster.hosted == {"node-abcdefghij": [3]}
    assert [c[:2] for c in roster.take_changes()] == [("join", 3)] and roster.take_changes() == []
    (event,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "join" and event["ready_s"] == 2.5 and event["learners"] == 1
    assert "learner 3 joined on node node-abc" in event["message"]


def test_a_death_leaves_with_its_samples_counted_once(roster):
    for i in range(3):
        _join(roster, i, samples=0)
    roster.order = [2, 0, 1]
    roster.live[0].stats["samples"] = 64
    roster.live[1].stats["samples"] = 32
    assert [s.id for s in roster.slots()] == [2, 0, 1] and roster.samples() == 96
    gone = roster.drop(0, RuntimeError("actor died"))
    assert gone.id == 0 and roster.order == [2, 1] and roster.samples() == 96 and roster.retired_samples == 64
    assert roster.drop(0, "again") is None  # a second report of the same death changes nothing
    assert [c[:2] for c in roster.take_changes()] == [("join", 0), ("join", 1), ("join", 2), ("failure", 0)]
    kinds = [e["kind"] for e in roster.events.recorded]
    assert kinds == ["join", "join", "join", "failure", "leave"]
    assert roster.events.recorded[3]["error"] == "RuntimeError: actor died"


def test_a_drained_learner_retires_naming_who_keeps_its_average_and_its_data(roster):
    _join(roster, 0)
    _join(roster, 1)
    roster.live[1].leaving = "node drained"
    slot = roster.retire(1, kept_by=0, data_left=5)
    assert slot.id == 1 and 1 not in roster
    event = roster.events.recorded[-1]
    assert event["kind"] == "drain" and event["kept_by"] == 0 and event["data_left"] == 5
    assert "node drained; its last average is kept by learner 0" in event["message"]
    assert "(5 planned units)" in event["message"]
    assert [c[0] for c in roster.changes] == ["join", "join", "drain"]


def test_a_failure_reason_is_one_line_of_what_the_learner_raised():
    class RayTaskError(Exception):
        cause = ValueError("\x1b[31mbad batch\x1b[0m\n  at line 3")

    assert reason(RayTaskError("wrapper text")) == "ValueError: bad batch"
    assert reason("SIGTERM") == "SIGTERM"
    assert reason(RuntimeError("")) == "RuntimeError: RuntimeError"
