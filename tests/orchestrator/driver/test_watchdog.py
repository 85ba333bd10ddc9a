"""The watchdog without Ray: fake learners' heartbeats on a clock the test moves. A learner is stuck
when one step computes, or it stays silent, longer than its bound; waiting on its group never
counts; a failed heartbeat is silence; an answer read late is judged as of when it was given."""

from __future__ import annotations

import pytest

from orchestrator.driver.watchdog import HEARTBEAT_EVERY_S, Watchdog
from tests.doubles import Clock, FakeLearner, FakeRuntime

pytestmark = pytest.mark.unit


def _watchdog(after_s: float = 30.0, step_multiple: float = 10.0) -> tuple[Watchdog, Clock]:
    clock = Clock()
    return Watchdog(after_s, step_multiple, FakeRuntime(clock), clock), clock


def _rounds(watchdog: Watchdog, clock: Clock, running: dict, seconds: float) -> list[tuple[int, str]]:
    """Heartbeat rounds every HEARTBEAT_EVERY_S for `seconds`; what was found stuck."""
    found = []
    for _ in range(int(seconds / HEARTBEAT_EVERY_S)):
        clock.advance(HEARTBEAT_EVERY_S)
        found += watchdog.stuck(running)
    return found


def test_a_step_computing_past_the_bound_is_stuck_and_one_within_it_is_not():
    watchdog, clock = _watchdog(after_s=30.0)
    began = clock()
    beating = {"step": 7, "computing_since": began}
    learner = FakeLearner(0, heartbeat=lambda: {**beating, "at": clock()})
    assert _rounds(watchdog, clock, {0: learner}, 28) == []
    found = _rounds(watchdog, clock, {0: learner}, 6)
    assert [i for i, _ in found] == [0]
    assert "step 8 computing for" in found[0][1] and "limit 30 s" in found[0][1]


def test_waiting_on_the_group_never_counts():
    watchdog, clock = _watchdog(after_s=5.0)
    learner = FakeLearner(0, heartbeat=lambda: {"step": 3, "computing_since": None, "at": clock()})  # in a collective
    assert _rounds(watchdog, clock, {0: learner}, 120) == []


def test_a_silent_learner_is_stuck_from_when_it_was_first_asked():
    watchdog, clock = _watchdog(after_s=10.0)
    learner = FakeLearner(0)
    learner.hang("heartbeat")  # alive to Ray, answering nothing
    assert _rounds(watchdog, clock, {0: learner}, 10) == []
    found = _rounds(watchdog, clock, {0: learner}, 4)
    assert [i for i, _ in found] == [0] and "no answer for" in found[0][1]


def test_the_bound_grows_with_the_learners_median_step():
    watchdog, clock = _watchdog(after_s=5.0, step_multiple=10.0)
    watchdog.observe(0, [2.0] * 9)  # 2-second steps: the bound is 20 s, not 5
    assert watchdog.limit_s(0) == 20.0
    began = clock()
    learner = FakeLearner(0, heartbeat=lambda: {"step": 1, "computing_since": began, "at": clock()})
    assert _rounds(watchdog, clock, {0: learner}, 18) == []
    assert [i for i, _ in _rounds(watchdog, clock, {0: learner}, 6)] == [0]


def test_a_gone_learners_failed_heartbeat_is_silence_and_silence_restarts_between_chunks():
    watchdog, clock = _watchdog(after_s=10.0)
    gone, quiet = FakeLearner(0), FakeLearner(1)
    gone.die()  # its heartbeats fail (its run's failure drops it first, in a job): no error escapes
    assert [i for i, _ in _rounds(watchdog, clock, {0: gone}, 14)] == [0]
    quiet.hang("heartbeat")
    assert _rounds(watchdog, clock, {1: quiet}, 8) == []
    other = FakeLearner(2, heartbeat=lambda: {"step": 1, "computing_since": None, "at": clock()})
    assert _rounds(watchdog, clock, {2: other}, 20) == []  # it is between chunks while another runs
    assert _rounds(watchdog, clock, {1: quiet, 2: other}, 8) == []  # its silence counts afresh
    assert [i for i, _ in _rounds(watchdog, clock, {1: quiet, 2: other}, 6)] == [1]


def test_an_answer_read_late_is_judged_as_of_when_it_was_given():
    """The loop consults the watchdog only while it waits on chunks: with chunks shorter than a
    heartbeat round it may read an answer minutes after it came. That answer says how long the
    step had computed when the learner answered, not until now (a healthy learner of a DiLoCo
    run with 10-step rounds was killed as "step 59 computing for 122 s")."""
    watchdog, clock = _watchdog(after_s=30.0)
    steps = iter(range(58, 10_000))
    learner = FakeLearner(0, heartbeat=lambda: {"step": next(steps), "computing_since": clock() - 0.1, "at": clock()})
    assert _rounds(watchdog, clock, {0: learner}, HEARTBEAT_EVERY_S) == []  # asked: at step 58, 0.1 s in
    clock.advance(122.0)  # chunks end within a round meanwhile: the watchdog is not consulted
    assert watchdog.stuck({0: learner}) == []
    watchdog, clock = _watchdog(after_s=30.0)
    stalled = FakeLearner(1, heartbeat=lambda: {"step": 3, "computing_since": clock() - 31.0, "at": clock()})
    found = _rounds(watchdog, clock, {1: stalled}, 2 * HEARTBEAT_EVERY_S)  # 31 s into its step when it answered
    assert [i for i, _ in found] == [1] and "step 4 computing for 31 s" in found[0][1]
