"""Roster: who is in the job right now — live learners (id -> handle, slot, node, last stats,
measured speed), arrivals not yet answering, the group's ring/rank order, learners that left
(their samples still count) — and the change log of joins, failures and drains since the driver
last looked. Every change emits its event and updates the learner-count metric.

It only keeps books: starting, killing and freeing learners is `elastic.py`'s and `capacity.py`'s.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LearnerSlot:
    """One live learner as the driver sees it."""

    id: int
    handle: Any
    slot: Any = None  # its `capacity.Slot`
    node: str | None = None
    stats: dict = field(default_factory=dict)
    speed: float | None = None  # utterances per second of its own compute, a rolling mean
    step_compute_s: float | None = None  # seconds of its own compute per step, a rolling mean
    in_group: bool = False
    leaving: str | None = None  # why it must leave (its node is drained, it got SIGTERM)

    def observe(self, stats: dict) -> None:
        self.stats = stats
        compute = sum(stats["step_seconds"]) - sum(stats["comm_seconds"])
        if stats["chunk_samples"] > 0 and compute > 0:
            now = stats["chunk_samples"] / compute
            self.speed = now if self.speed is None else 0.7 * self.speed + 0.3 * now
            per_step = compute / len(stats["step_seconds"])
            self.step_compute_s = per_step if self.step_compute_s is None else \
                0.7 * self.step_compute_s + 0.3 * per_step


@dataclass
class Arrival:
    """A learner started on a freshly placed slot, not yet answering."""

    id: int
    handle: Any
    slot: Any
    placed_at: float


class Roster:
    """The books of who is in the job: live and arriving learners, order, changes.

    Args:
    events: the job's EventLog; metrics: its JobMetrics.
    """

    def __init__(self, events, metrics):
        self.events, self.metrics = events, metrics
        self.live: dict[int, LearnerSlot] = {}
        self.arriving: dict[Any, Arrival] = {}  # hello() ref -> arrival
        self.order: list[int] = []  # ring / rank order of the group's members
        self.retired_samples = 0  # samples of learners that left
        self.hosted: dict[str, list[int]] = {}  # node id -> learners that ran there
        self.changes: list[tuple[str, int, float]] = []  # (join | failure | drain, learner, time)

    # -- reading ----------------------------------------------------------------------------------
    def slots(self) -> list[LearnerSlot]:
        """Live learners, the group's order first."""
        return [self.live[i] for i in self.order if i in self.live] + \
               [s for i, s in sorted(self.live.items()) if i not in self.order]

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, learner_id: int) -> bool:
        return learner_id in self.live

    def get(self, learner_id: int) -> LearnerSlot | None:
        return self.live.get(learner_id)

    def count(self) -> int:
        """Live and arriving learners."""
        return len(self.live) + len(self.arriving)

    def held_slots(self) -> list:
        return [s.slot for s in self.live.values()] + [a.slot for a in self.arriving.values()]

    def handles(self) -> list:
        return [s.handle for s in self.live.values()] + [a.handle for a in self.arriving.values()]

    def epochs(self) -> list[int]:
        return [s.stats.get("epoch", 0) for s in self.live.values()] or [0]

    def samples(self) -> int:
        """Samples trained on by all learners, those that left included."""
        return self.retired_samples + sum(s.stats.get("samples", 0) for s in self.live.values())

    def max_step(self, default: int = 0) -> int:
        return max((s.stats.get("step", 0) for s in self.live.values()), default=default)

    def take_changes(self) -> list[tuple[str, int, float]]:
        """The joins, failures and drains since the last call."""
        changes, self.changes = self.changes, []
        return changes

    # -- changing ---------------------------------------------------------------------------------
    def arrive(self, ref, arrival: Arrival) -> None:
        self.arriving[ref] = arrival

    def join(self, ref, hello: dict) -> LearnerSlot:
        """An arrival answered (`hello`: its node, pid, ready time and counters): it is live."""
        arrival = self.arriving.pop(ref)
        node, ready_at, pid = hello.pop("node"), hello.pop("ready_at"), hello.pop("pid")
        device, visible = hello.pop("device", None), hello.pop("cuda_visible_devices", None)
        self.hosted.setdefault(node, []).append(arrival.id)
        slot = LearnerSlot(arrival.id, arrival.handle, arrival.slot, node, stats=hello)
        self.live[slot.id] = slot
        self.changes.append(("join", slot.id, time.time()))
        self.events.emit("join", f"learner {slot.id} joined on node {node[:8]} "
                         f"({len(self.live)} learner{'s' if len(self.live) > 1 else ''})",
                         learner=slot.id, node=node, pid=pid, device=device, cuda_visible_devices=visible,
                         learners=len(self.live), ready_at=round(ready_at, 3),
                         ready_s=round(ready_at - arrival.placed_at, 3))
        self.metrics.learners(len(self.live))
        return slot

    def failed_to_start(self, ref, error: Exception | str) -> Arrival:
        arrival = self.arriving.pop(ref)
        self.events.emit("failure", f"learner {arrival.id} died while starting: {reason(error)}",
                         learner=arrival.id, error=reason(error))
        return arrival

    def drop(self, learner_id: int, error: Exception | str) -> LearnerSlot | None:
        """A learner died (or its node did): it leaves the roster; returns it (None if it had left)."""
        slot = self._remove(learner_id)
        if slot is None:
            return None
        why = reason(error)
        self.changes.append(("failure", learner_id, time.time()))
        self.events.emit("failure", f"learner {learner_id} on node {(slot.node or '?')[:8]} died: {why}",
                         learner=learner_id, node=slot.node, error=why)
        self.events.emit("leave", f"learner {learner_id} left the group ({len(self.live)} left)",
                         learner=learner_id, learners=len(self.live))
        return slot

    def retire(self, learner_id: int, kept_by: int | None, data_left: int | None = 0) -> LearnerSlot:
        """A learner that had to leave (drain, SIGTERM) left cleanly; `kept_by` holds its last
        average; `data_left` planned units of its epoch's part went to the planner (None: how many
        is not known yet: it never opened its part), for another learner to take over."""
        slot = self._remove(learner_id)
        self.changes.append(("drain", slot.id, time.time()))
        handed = "" if data_left == 0 else "; what it had not read of its epoch's data goes to another learner" + (
            f" ({data_left} planned units)" if data_left else "")
        self.events.emit("drain", f"learner {slot.id} left the group: {slot.leaving}"
                         + (f"; its last average is kept by learner {kept_by}" if kept_by is not None else "") + handed,
                         learner=slot.id, node=slot.node, reason=slot.leaving, kept_by=kept_by,
                         data_left=data_left, step=slot.stats.get("step"), learners=len(self.live))
        return slot

    def _remove(self, learner_id: int) -> LearnerSlot | None:
        slot = self.live.pop(learner_id, None)
        if slot is None:
            return None
        self.retired_samples += slot.stats.get("samples", 0)
        if learner_id in self.order:
            self.order.remove(learner_id)
        self.metrics.learners(len(self.live))
        return slot

    def clear(self) -> None:
        self.live.clear()
        self.arriving.clear()


def reason(error: Exception | str) -> str:
    """One line on why a learner is gone (for an error raised inside it: that error, not Ray's wrapper)."""
    if isinstance(error, str):
        return error
    if isinstance(getattr(error, "cause", None), Exception):  # a RayTaskError: what the learner raised
        error = error.cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()  # no terminal colours
    first = next((line for line in text if line.strip()), type(error).__name__)
    return f"{type(error).__name__}: {first[:200]}"
