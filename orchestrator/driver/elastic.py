"""Elastic: changing who is in the job while it trains. It starts a learner on every slot that
`Capacity` gets placed (a newcomer first takes a live learner's state: its ring neighbour's for
gossip; for the collectives the re-form's broadcast syncs it too), drops learners that died (their
slot is asked for again), retires learners that must leave (a drained node, SIGTERM), waits while
the job is below `learners.min`, and releases everything at the end. The books are the `Roster`'s;
forming the group over the members is `group.py`'s.

Between chunks of steps the training loop calls `poll`, `check_drains`, `retire_leaving` and,
for a learner whose chunk failed, `drop`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.cluster.capacity import Capacity, CapacityTimeout
from orchestrator.driver.roster import Arrival, Roster, reason

CLOSE_TIMEOUT_S = 10.0  # learners get this long to leave their group at the end
DRAIN_POLL_S = 1.0  # how often the driver asks Ray which nodes are being drained
START_BACKOFF_S = 1.0  # a learner that failed to start is replaced after this, doubled for each failure in a
MAX_START_BACKOFF_S = 30.0  # row, up to this (a node that cannot start one now may well in a minute) ...
MAX_START_FAILURES = 5  # ... until this many in a row (none started meanwhile): the cause will repeat

__all__ = ["CapacityTimeout", "Elastic", "LearnersCannotStart"]


class LearnersCannotStart(RuntimeError):
    """Learners failed to start MAX_START_FAILURES times in a row: the job stops, naming the last cause."""


class Elastic:
    """Membership changes while the job trains: learners placed, started, dropped, retired.

    Args:
    job_id, spec: the job; workload_config: the workload's sections of the spec, as a dict.
    runtime: where learners run; capacity: the job's slots; roster: its books.
    events: the job's EventLog.
    adopt_checkpoint: called with a newcomer's handle when no learner is alive to start it from:
        it loads the job's last checkpointed state (from the files, not through the driver).
    secret: the job's `JobSecret`, handed to its learners and its service as they start.
    """

    def __init__(self, job_id: str, spec, workload_config: dict, runtime, capacity: Capacity, roster: Roster,
                 events, adopt_checkpoint=None, clock=time.time, secret=None):
        self.job_id, self.spec, self.workload_config, self.secret = job_id, spec, workload_config, secret
        self.runtime, self.capacity, self.roster, self.events = runtime, capacity, roster, events
        self.adopt_checkpoint = adopt_checkpoint or (lambda handle: None)
        self.clock = clock  # what drains are polled by
        self.service = None  # the job's JobService: shard planner and evaluator
        self.started = False
        self._drains_checked = 0.0
        self.retries = StartRetries(job_id, clock)  # learners that failed to start: when to replace them

    def start(self, ids: list[int] = ()) -> list:
        """Ask for `learners.max` slots (`ids` first, e.g. those of a checkpoint), wait until at
        least `learners.min` learners are placed and answer; returns them (not yet in a group)."""
        self.capacity.check(ids)
        self.service = self.runtime.start_service(self.job_id, self.spec.service_gpus, secret=self.secret)
        self.capacity.ask([], ids)
        self.runtime.wait(self.capacity.watched(), num_returns=len(self.capacity.pending), timeout=2.0)
        self._start_placed()  # whatever fits now starts together
        want = self.spec.learners
        if self.roster.count() < want.min:
            self._say_waiting()
        deadline = time.time() + want.wait_timeout_s
        while self.roster.count() < want.min or self.roster.arriving:
            self._ask_when_due(wait=not self.capacity.pending and not self.roster.arriving)
            if self.runtime.distributed:
                self.capacity.wait(list(self.roster.arriving), deadline, self._timed_out)
            self._start_placed()
            self._answered(timeout=0)
        self.started = True
        self.roster.changes.clear()  # the first members are no change
        return [self.roster.live[i] for i in sorted(self.roster.live)]

    def _ask(self) -> None:
        self.capacity.ask(self.roster.held_slots())

    def _ask_when_due(self, wait: bool = False) -> None:
        """Ask again for the slots of learners that failed to start, once their back-off is over
        (with `wait`, pausing until then: nothing else is under way)."""
        left = self.retries.left()
        if left is not None and (left <= 0 or wait):
            self.runtime.pause(max(0.0, left))
            self.retries.ask_at = None
            self._ask()

    def _start_placed(self) -> None:
        """Start a learner on every slot placed since the last call."""
        for learner_id, slot in self.capacity.placed():
            slowdown = self.spec.simulate.slowdown.get(learner_id, 1.0)
            handle = self.runtime.start_learner(self.job_id, learner_id, slot, self.spec.workload,
                                                self.workload_config, self.spec.seed, self.service, slowdown,
                                                secret=self.secret)
            if self.started:  # joining a running job: start from a live learner's state
                self._adopt(handle)
            self.roster.arrive(handle.hello.remote(), Arrival(learner_id, handle, slot, time.time()))

    def _adopt(self, handle) -> None:
        """A newcomer takes a live learner's state — the last on the ring, which it joins next to;
        passed as an object ref, learner to learner — or, with nobody alive, the job's last
        checkpointed state."""
        if self.roster.order and self.roster.order[-1] in self.roster:
            handle.load_state.remote(self.roster.live[self.roster.order[-1]].handle.state.remote(), True)
        else:
            self.adopt_checkpoint(handle)

    def _answered(self, timeout: float) -> None:
        """Arrivals that have answered become live (not yet in the group); ones that died while
        starting are reported and their slot asked for again."""
        arriving = self.roster.arriving
        for ref in self.runtime.wait(list(arriving), num_returns=len(arriving), timeout=timeout):
            try:
                hello = self.runtime.get(ref)
            except Exception as exc:  # noqa: BLE001 - only a learner that failed to start; anything else propagates
                if not self.runtime.failed_remotely(exc):
                    raise
                arrival = self.roster.failed_to_start(ref, exc)
                self.capacity.free(arrival.slot, arrival.handle)
                self.retries.failed(arrival.id, exc)
                continue
            self.roster.join(ref, hello)
            self.retries.failures = 0

    def poll(self) -> None:
        """Start learners on newly placed slots; those that answered become live."""
        self._ask_when_due()
        self._start_placed()
        self._answered(timeout=0)

    def watched(self) -> list:
        """Refs whose readiness `poll` acts on: placed slots and newcomers' answers."""
        return self.capacity.watched() + list(self.roster.arriving)

    def below_min(self) -> bool:
        return len(self.roster) < self.spec.learners.min

    def wait_for_min(self) -> None:
        """Block until `learners.min` learners are live again (or CapacityTimeout)."""
        self._say_waiting()
        deadline = time.time() + self.spec.learners.wait_timeout_s
        while self.below_min():
            self._ask_when_due(wait=not self.capacity.pending and not self.roster.arriving)
            self.capacity.wait(list(self.roster.arriving), deadline, self._timed_out)
            self.poll()

    def _message(self, timed_out: bool = False) -> str:
        return self.capacity.waiting_message(self.roster.count(), timed_out)

    def _timed_out(self) -> str:
        return self._message(timed_out=True)

    def _say_waiting(self) -> None:
        self.events.emit("waiting", self._message(), learners=len(self.roster), min=self.spec.learners.min,
                         bundle=self.capacity.bundle)

    # -- leaving ----------------------------------------------------------------------------------
    def drop(self, learner_id: int, error: Exception | str) -> None:
        """A learner died (or its node did, or it is stuck): kill it, free its slot, ask again."""
        slot = self.roster.drop(learner_id, error)
        if slot is not None:
            self.capacity.free(slot.slot, slot.handle)
            self._ask()

    def on_every_learner(self, call: Callable, slots: list | None = None) -> dict[int, object]:
        """`call(slot)` (a remote call) on every live learner (or on `slots`): their answers by id;
        those that are gone are dropped."""
        slots = self.roster.slots() if slots is None else slots
        results, failed = self.runtime.gather({call(s): s.id for s in slots})
        for learner_id, error in failed:
            self.drop(learner_id, error)
        return dict(results)

    def check_drains(self) -> None:
        """Learners on nodes Ray is draining (`ray drain-node`, the autoscaler's preemption and
        idle termination) are told to leave at the end of their step in flight."""
        if self.clock() - self._drains_checked < DRAIN_POLL_S:
            return
        self._drains_checked = self.clock()
        draining = self.runtime.draining_nodes()
        for slot in self.roster.live.values():
            if slot.node in draining and slot.leaving is None:
                left = (draining[slot.node] / 1000 - time.time()) if draining[slot.node] else None
                slot.leaving = f"node {slot.node[:8]} is being drained" + (
                    f" (deadline in {left:.0f} s)" if left is not None else "")
                slot.handle.leave.remote(slot.leaving)

    def leaving(self, learner_id: int, reason: str) -> None:
        """A learner reported it must leave (SIGTERM): it leaves once its chunk is back."""
        slot = self.roster.get(learner_id)
        if slot is not None and slot.leaving is None:
            slot.leaving = reason

    def retire_leaving(self, running: set[int], handover) -> None:
        """Every learner that must leave and is between chunks leaves cleanly: `handover(slot)`
        first passes its weights on where its group needs that (gossip: one last average with its
        ring neighbour), and the rest of its part of the epoch's data goes to the planner, for the
        first learner done with its own part to take over; the collectives re-form without it.
        Its slot is asked for again (Ray places no new one on a draining node)."""
        for slot in [s for s in self.roster.live.values() if s.leaving and s.id not in running]:
            kept_by = handover(slot)
            data_left = slot.stats.get("left") if self._hand_over_data(slot) else 0
            self.roster.retire(slot.id, kept_by, data_left)
            self.capacity.free(slot.slot, slot.handle)
            self._ask()

    def _hand_over_data(self, slot) -> bool:
        """The planner keeps what a leaving learner had not read of its epoch (its last counters say
        where it was); returns whether anything was left."""
        if self.service is None or "epoch" not in slot.stats:
            return False
        return bool(self.runtime.get(self.runtime.submit(self.service, "hand_over", slot.id, slot.stats)))

    def close_and_release(self) -> None:
        """Let the live learners leave their group (for at most CLOSE_TIMEOUT_S: a stuck one is
        not waited for), then kill every learner (live or starting) and the job's service, and free
        every slot, placed or pending: the job's whole demand on the cluster and its autoscaler."""
        live = self.roster.live.values()
        if live:
            self.runtime.wait([s.handle.close.remote() for s in live], num_returns=len(live),
                              timeout=CLOSE_TIMEOUT_S)
        service = [self.service] if self.runtime.distributed and self.service is not None else []
        self.capacity.release(self.roster.held_slots(), self.roster.handles() + service)
        self.roster.clear()


class StartRetries:
    """Learners that failed to start, in a row: each is replaced after a back-off (START_BACKOFF_S,
    doubled per failure, at most MAX_START_BACKOFF_S); the MAX_START_FAILURES-th in a row stops
    the job (`LearnersCannotStart`). A learner that starts resets the count."""

    def __init__(self, job_id: str, clock):
        self.job_id, self.clock = job_id, clock
        self.failures = 0
        self.ask_at: float | None = None  # when to ask again for the failed learners' slots

    def failed(self, learner_id: int, error: Exception) -> None:
        self.failures += 1
        if self.failures >= MAX_START_FAILURES:
            raise LearnersCannotStart(f"{self.job_id}: {self.failures} learners in a row failed to start, so "
                                      f"replacing them again would not help; the last (learner {learner_id}): "
                                      f"{reason(error)}")
        self.ask_at = self.clock() + min(START_BACKOFF_S * 2 ** (self.failures - 1), MAX_START_BACKOFF_S)

    def left(self) -> float | None:
        """Seconds until the failed learners' slots are asked for again (None: nothing to ask)."""
        return None if self.ask_at is None else self.ask_at - self.clock()
