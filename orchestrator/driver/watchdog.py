"""The watchdog: finds learners that are alive but stuck.

A learner whose process hangs (a deadlocked data loader, a wedged GPU, a stopped process) does
not die, so Ray never reports it; a collective group would wait on it without bound. While a
learner runs a chunk, the driver asks it for a heartbeat every few seconds (served on its `mix`
thread, so a learner mid-step answers; read at the next round, never waited for): its step count
and since when its current step has been computing (time spent waiting on its group does not
count: a learner blocked in an all-reduce by a stuck peer is not stuck itself). A learner is
stuck when it has computed one step, or not answered, for longer than
`max(learners.stuck_after_s, learners.stuck_step_multiple x its median step time)`. An answer
is judged as of when it was given, on the learner's own clock (`at - computing_since`): the loop
consults the watchdog only while it waits on chunks, so an answer may be read long after it came
(with rounds shorter than a heartbeat's, a healthy DiLoCo learner's 2-minute-old answer was once
judged against the driver's clock: "computing for 122 s", and the learner was killed).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

HEARTBEAT_EVERY_S = 2.0  # how often running learners are asked


class Watchdog:
    """Judges the running learners' heartbeats: which are stuck, and why.

    Args:
    after_s, step_multiple: the spec's `learners.stuck_after_s` and `learners.stuck_step_multiple`.
    runtime: where the heartbeats' answers are read (`wait`, `get`, `failed_remotely`).
    clock: time.time, or a test's.
    """

    def __init__(self, after_s: float, step_multiple: float, runtime, clock=time.time):
        self.after_s, self.step_multiple = after_s, step_multiple
        self.runtime, self.clock = runtime, clock
        self._step_s: dict[int, deque] = {}
        self._answered_at: dict[int, float] = {}
        self._last_check = 0.0
        self._asked: dict = {}  # the last round's heartbeat refs -> (learner id, when asked)

    def observe(self, learner_id: int, step_seconds: list[float]) -> None:
        """A chunk's step times (the median of the last 50 sets the learner's bound)."""
        self._step_s.setdefault(learner_id, deque(maxlen=50)).extend(step_seconds)

    def limit_s(self, learner_id: int) -> float:
        steps = self._step_s.get(learner_id)
        median = statistics.median(steps) if steps else 0.0
        return max(self.after_s, self.step_multiple * median)

    def stuck(self, running: dict[int, object]) -> list[tuple[int, str]]:
        """(learner id, why) of the running learners (id -> actor handle) that are stuck. Every
        HEARTBEAT_EVERY_S it judges the answers to the heartbeats it sent the time before (one
        not answered by now is silent) and sends the next round; it never waits, so the driver's
        loop goes on dispatching chunks whatever the number of learners."""
        now = self.clock()
        if not running or now - self._last_check < HEARTBEAT_EVERY_S:
            return []
        self._last_check = now
        for learner_id in list(self._answered_at):
            if learner_id not in running:  # between chunks: its silence starts counting afresh
                del self._answered_at[learner_id]
        asked, self._asked = self._asked, {}
        ready = self.runtime.wait(list(asked), num_returns=len(asked), timeout=0) if asked else []
        answers = {}
        for ref in ready:
            try:
                answers[asked[ref][0]] = self.runtime.get(ref)
            except Exception as exc:  # noqa: BLE001 - gone: its run reports that
                if not self.runtime.failed_remotely(exc):
                    raise
        found = []
        for learner_id, asked_at in asked.values():
            if learner_id in running:
                why = self._judge(learner_id, answers.get(learner_id), asked_at, now)
                if why:
                    found.append((learner_id, why))
        dropped = {i for i, _ in found}
        self._asked = {handle.heartbeat.remote(): (learner_id, now) for learner_id, handle in running.items()
                       if learner_id not in dropped}
        return found

    def _judge(self, learner_id: int, beat: dict | None, asked_at: float, now: float) -> str | None:
        limit = self.limit_s(learner_id)
        if beat is None:
            silent_since = self._answered_at.setdefault(learner_id, asked_at)
            if now - silent_since > limit:
                return f"stuck: no answer for {now - silent_since:.0f} s (limit {limit:.0f} s)"
            return None
        self._answered_at[learner_id] = now
        since = beat["computing_since"]
        if since is not None and beat["at"] - since > limit:
            return (f"stuck: step {beat['step'] + 1} computing for {beat['at'] - since:.0f} s "
                    f"(limit {limit:.0f} s: learners.stuck_after_s / stuck_step_multiple)")
        return None
