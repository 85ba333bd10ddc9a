"""Elastic membership: which learners a job has right now, and changing that while it trains.

`Membership` owns the job's learners (id -> actor, placement group, node, last stats, measured
speed), the capacity it has asked Ray for (one single-bundle placement group per learner it
still wants, up to `learners.max`; a pending placement group is a resource demand that Ray
places as soon as a node can hold it, and that an autoscaler sees), the `ShardPlanner`, and
forming the group over the current members. The training loop in `job.py` calls it between
chunks of steps:

- `poll()`: learners whose slots were placed are started; a newcomer takes the current model,
  optimizer state, step and epoch from a live learner (its ring neighbour for gossip; for
  allreduce the group's broadcast at the re-form also syncs the weights) and joins.
- `drop(id)`: a learner whose actor or node died leaves; its slot is asked for again.
- `form_group()`: gossip members are swapped in while learners run (the ring changes from their
  next step); allreduce and hierarchical members re-form their process groups from the learners'
  in-memory state (no checkpoint restart), once every learner is between chunks.
- `wait_for_min()`: below `learners.min` the job pauses and waits for capacity, saying what for,
  and gives up with `CapacityTimeout` after `learners.wait_timeout_s`.
- `rebalance()`: with `group.balance`, allreduce shards and batches follow measured speeds;
  gossip puts the slowest learners at passive ring positions.

Shards change only at epoch boundaries (`orchestrator/shards.py`), so every utterance is seen
once in every epoch that starts after a change.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.groups import AllreduceMember, GossipMember, HierarchicalMember, SoloMember, ring_partners
from orchestrator.placement import batch_shares, ring_by_speed
from orchestrator.shards import ShardPlanner


class CapacityTimeout(RuntimeError):
    """Fewer than `learners.min` learners could be placed within `learners.wait_timeout_s`."""


@dataclass
class LearnerSlot:
    """One live learner as the driver sees it."""

    id: int
    handle: Any
    pg: Any = None
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
    pg: Any
    placed_at: float


JOIN_TIMEOUT_S = 60.0  # a member that has not joined its group by then (rendezvous takes <= 15 s) is stuck
MAX_FAILED_FORMS = 5  # failed re-forms in a row in which nobody died: something else is wrong
CLOSE_TIMEOUT_S = 10.0  # learners get this long to leave their group at the end

DRAIN_POLL_S = 1.0  # how often the driver asks Ray which nodes are being drained
REBALANCE_CHANGE = 0.1  # rebalance when a learner's share would move by more than this fraction
# (gossip: when a passive learner is more than twice this fraction faster than an active one)


class Membership:
    """Args:
    job_id, spec: the job.
    workload_config: the workload's sections of the spec, as a dict.
    events: the job's EventLog; metrics: its JobMetrics.
    use_ray: learners are Ray actors (False: one learner in this process, nothing elastic).
    fallback_state: called for a state to start a newcomer from when no learner is alive
        (the job's last checkpointed state).
    pool: a `placement.BundlePool` to place learners in (a Tune trial's bundles) instead of
        asking Ray for a placement group per learner; its bundle is each learner's reservation.
    """

    def __init__(self, job_id: str, spec, workload_config: dict, events, metrics, use_ray: bool,
                 fallback_state=None, pool=None):
        self.job_id, self.spec, self.workload_config = job_id, spec, workload_config
        self.events, self.metrics, self.use_ray = events, metrics, use_ray
        self.kind = spec.group.kind
        self.fallback_state = fallback_state or (lambda: None)
        self.live: dict[int, LearnerSlot] = {}
        self.order: list[int] = []  # ring / rank order of the members
        self.pending: dict[int, tuple[Any, Any]] = {}  # id -> (placement group, its ready() ref)
        self.arriving: dict[Any, Arrival] = {}  # hello() ref -> arrival
        self.retired_samples = 0  # samples of learners that left
        self.node_groups: list[list[int]] = []  # hierarchical: learner ids per node
        self.hosted: dict[str, list[int]] = {}  # node id -> learners that ran there
        self.next_id = 0
        self.started = False
        self.changes: list[tuple[str, int, float]] = []  # (join | failure, learner, time) since the driver looked
        self.planner = None
        self.bundle: dict = {}
        self.pool = pool
        self._failed_forms = 0
        self._drains_checked = 0.0

    # -- capacity -------------------------------------------------------------------------------
    @property
    def collective(self) -> bool:
        """Members step together (allreduce on Ray): the driver runs them in rounds."""
        return self.use_ray and self.kind == "allreduce"

    def start(self, ids: list[int] = ()) -> list[LearnerSlot]:
        """Ask for `learners.max` slots (`ids` first, e.g. those of a checkpoint), wait until at
        least `learners.min` are placed, start those learners; returns them (not yet in a group)."""
        if not self.use_ray:
            import os

            from orchestrator.placement import InProcessLearner

            threads = int(self.spec.cpus_per_learner) if self.spec.cpus_per_learner else (os.cpu_count() or 1)
            self.planner = ShardPlanner([0])
            handle = InProcessLearner(self.workload_config, self.spec.seed, 0, self.planner, threads,
                                      self.spec.simulate.slowdown.get(0, 1.0))
            self.live[0] = LearnerSlot(0, handle, node="local")
            self.order = [0]
            self.started = True
            return [self.live[0]]
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from orchestrator.capacity import check_minimum, use_gpus
        from orchestrator.placement import learner_bundle

        spec = self.spec
        if self.pool is not None:
            self.bundle = self.pool.bundle
        else:
            self.bundle = learner_bundle(spec.cpus_per_learner or 1.0, use_gpus(spec.accelerator),
                                         spec.learner_resources)
            kinds = spec.accelerator_types or [None]  # fails at once when the minimum can never fit:
            check_minimum(self.job_id, [self._bundle_of(k) for k in kinds], spec.learners.min)
        # the planner lives on the driver's node, so losing any other node never loses it
        self.planner = ray.remote(ShardPlanner).options(
            name=f"{self.job_id}/planner", num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)).remote()
        self.next_id = max(ids, default=-1) + 1
        self._ask(list(ids))
        want = spec.learners
        refs = {ref: i for i, (_, ref) in self.pending.items()}
        ray.wait(list(refs), num_returns=len(refs), timeout=2.0)  # whatever fits now starts together
        self._start_placed()
        if len(self.live) + len(self.arriving) < want.min:
            self._say_waiting()
        deadline = time.time() + want.wait_timeout_s
        while len(self.live) + len(self.arriving) < want.min or self.arriving:
            self._wait_for_anything(deadline)
            self._start_placed()
            self._answered(timeout=0)
        self.started = True
        self.changes.clear()  # the first members are no change
        return [self.live[i] for i in sorted(self.live)]

    def _ask(self, ids: list[int] = ()) -> None:
        """Slots (placement groups, or the pool's bundles) for as many learners as it takes to
        reach `learners.max`."""
        from orchestrator.placement import request_slot

        ids = list(ids)
        while len(self.live) + len(self.arriving) + len(self.pending) < self.spec.learners.max:
            learner_id = ids[0] if ids else self.next_id
            slot = request_slot(self.job_id, learner_id, self._next_bundle(), self.pool)
            if slot is None:  # the pool's bundles are all taken (until a learner gives one back)
                return
            if ids:
                ids.pop(0)
            else:
                self._new_id()
            self.pending[learner_id] = (slot, slot.ready())

    def _bundle_of(self, kind: str | None) -> dict:
        return self.bundle if kind is None else {**self.bundle, kind: 1.0}

    def _next_bundle(self) -> dict:
        """The next learner's reservation: with `accelerator_types`, one unit of the kind that has
        the fewest learners (live, starting or asked for), so learners spread over the kinds."""
        kinds = self.spec.accelerator_types
        if not kinds or self.pool is not None:
            return self.bundle
        held = [s.pg.bundle for s in self.live.values()] + [a.pg.bundle for a in self.arriving.values()] + \
            [slot.bundle for slot, _ in self.pending.values()]
        count = {kind: sum(1 for b in held if kind in b) for kind in kinds}
        return self._bundle_of(min(kinds, key=lambda kind: count[kind]))

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _start_placed(self) -> list[Arrival]:
        """Start a learner on every slot Ray has placed since the last call."""
        import ray

        from orchestrator.placement import start_learner

        if not self.pending:
            return []
        by_ref = {ref: i for i, (_, ref) in self.pending.items()}
        placed, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        started = []
        for ref in placed:
            learner_id = by_ref[ref]
            pg, _ = self.pending.pop(learner_id)
            slowdown = self.spec.simulate.slowdown.get(learner_id, 1.0)
            handle = start_learner(self.job_id, learner_id, pg, self.workload_config, self.spec.seed,
                                   self.planner, slowdown)
            if self.started:  # joining a running job: start from a live learner's state
                donor = self._donor_state()
                if donor is not None:
                    handle.load_state.remote(donor, True)
            arrival = Arrival(learner_id, handle, pg, time.time())
            self.arriving[handle.hello.remote()] = arrival  # answers after the state is loaded
            started.append(arrival)
        return started

    def _donor_state(self):
        """A live learner's state (an object ref): the last on the ring, which a newcomer joins
        next to; with nobody alive, the job's last checkpointed state."""
        if self.order:
            return self.live[self.order[-1]].handle.state.remote()
        return self.fallback_state()

    def _answered(self, timeout: float) -> list[LearnerSlot]:
        """Arrivals that have answered become live (not yet in the group); ones that died while
        starting are reported and their slot asked for again."""
        import ray

        if not self.arriving:
            return []
        ready, _ = ray.wait(list(self.arriving), num_returns=len(self.arriving), timeout=timeout)
        joined = []
        for ref in ready:
            arrival = self.arriving.pop(ref)
            try:
                hello = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._failed_to_start(arrival, exc)
                continue
            node, ready_at, pid = hello.pop("node"), hello.pop("ready_at"), hello.pop("pid")
            self.hosted.setdefault(node, []).append(arrival.id)
            slot = LearnerSlot(arrival.id, arrival.handle, arrival.pg, node, stats=hello)
            self.live[slot.id] = slot
            joined.append(slot)
            self.changes.append(("join", slot.id, time.time()))
            self.events.emit("join", f"learner {slot.id} joined on node {node[:8]} "
                             f"({len(self.live)} learner{'s' if len(self.live) > 1 else ''})",
                             learner=slot.id, node=node, pid=pid, learners=len(self.live), ready_at=round(ready_at, 3),
                             ready_s=round(ready_at - arrival.placed_at, 3))
        if joined:
            self.metrics.learners(len(self.live))
        return joined

    def _failed_to_start(self, arrival: Arrival, exc: Exception) -> None:
        from orchestrator.placement import release

        self.events.emit("failure", f"learner {arrival.id} died while starting: {_reason(exc)}",
                         learner=arrival.id, error=_reason(exc))
        release([arrival.pg], [arrival.handle])
        self._ask()

    def _wait_for_anything(self, deadline: float) -> None:
        """Block until a slot is placed or an arrival answers, or raise CapacityTimeout at `deadline`."""
        import ray

        refs = [ref for _, ref in self.pending.values()] + list(self.arriving)
        left = deadline - time.time()
        if left <= 0 or not refs:
            raise CapacityTimeout(self._waiting_message(timed_out=True))
        ray.wait(refs, num_returns=1, timeout=min(left, 5.0))

    def _waiting_message(self, timed_out: bool = False) -> str:
        import ray

        want = self.spec.learners
        have = len(self.live) + len(self.arriving)
        missing = want.min - have
        available = ray.available_resources()
        free = {k: round(available.get(k, 0), 2) for k in self.bundle}
        what = (f"{self.job_id}: {have} of at least {want.min} learners placed; "
                f"{'gave up waiting' if timed_out else 'waiting'} for capacity for {missing} more "
                f"({self.bundle} each; free now: {free})")
        return what + (f" after {want.wait_timeout_s:g} s (learners.wait_timeout_s)" if timed_out
                       else f", for up to {want.wait_timeout_s:g} s (learners.wait_timeout_s)")

    def _say_waiting(self) -> None:
        self.events.emit("waiting", self._waiting_message(), learners=len(self.live),
                         min=self.spec.learners.min, bundle=self.bundle)

    # -- while training --------------------------------------------------------------------------
    def poll(self, timeout: float = 0) -> list[LearnerSlot]:
        """Start learners on newly placed slots; returns the ones that have become live."""
        if not self.use_ray:
            return []
        self._start_placed()
        return self._answered(timeout)

    def watched(self) -> list:
        """Refs whose readiness `poll` acts on: placed slots and newcomers' answers."""
        return [ref for _, ref in self.pending.values()] + list(self.arriving)

    def below_min(self) -> bool:
        return len(self.live) < self.spec.learners.min

    def wait_for_min(self) -> list[LearnerSlot]:
        """Block until `learners.min` learners are live again; returns those that joined."""
        self._say_waiting()
        deadline = time.time() + self.spec.learners.wait_timeout_s
        joined = []
        while self.below_min():
            self._wait_for_anything(deadline)
            joined += self.poll()
        return joined

    def check_drains(self) -> None:
        """Learners on nodes Ray is draining (`ray drain-node`, the autoscaler's preemption and
        idle termination) are told to leave at the end of their step in flight."""
        if not self.use_ray or time.time() - self._drains_checked < DRAIN_POLL_S:
            return
        import ray

        self._drains_checked = time.time()
        draining = ray._private.state.state.get_draining_nodes()
        for slot in self.live.values():
            if slot.node in draining and slot.leaving is None:
                left = (draining[slot.node] / 1000 - time.time()) if draining[slot.node] else None
                slot.leaving = f"node {slot.node[:8]} is being drained" + (
                    f" (deadline in {left:.0f} s)" if left is not None else "")
                slot.handle.leave.remote(slot.leaving)

    def leaving(self, learner_id: int, reason: str) -> None:
        """A learner reported it must leave (SIGTERM): it leaves once its chunk is back."""
        slot = self.live.get(learner_id)
        if slot is not None and slot.leaving is None:
            slot.leaving = reason

    def retire_leaving(self, running: set[int]) -> None:
        """Every learner that must leave and is between chunks leaves cleanly: gossip hands its
        weights to its ring neighbour (one last pairwise average, so its progress stays in the
        group); allreduce and hierarchical re-form without it (replicas agree at a round's end).
        Its slot is asked for again (Ray places no new one on a draining node)."""
        from orchestrator.placement import fetch, release

        for slot in [s for s in self.live.values() if s.leaving and s.id not in running]:
            kept_by = None
            if self.kind == "gossip" and len(self.order) > 1 and slot.id in self.order:
                neighbour = self.order[(self.order.index(slot.id) + 1) % len(self.order)]
                try:
                    fetch(self.live[neighbour].handle.average.remote(slot.handle.weights.remote()))
                    kept_by = neighbour
                except Exception:  # noqa: BLE001 - the neighbour or the leaver died meanwhile: only the average is lost
                    pass
            del self.live[slot.id]
            if slot.id in self.order:
                self.order.remove(slot.id)
            self.retired_samples += slot.stats.get("samples", 0)
            self.changes.append(("drain", slot.id, time.time()))
            self.events.emit("drain", f"learner {slot.id} left the group: {slot.leaving}"
                             + (f"; its last average is kept by learner {kept_by}" if kept_by is not None else ""),
                             learner=slot.id, node=slot.node, reason=slot.leaving, kept_by=kept_by,
                             step=slot.stats.get("step"), learners=len(self.live))
            release([slot.pg], [slot.handle])
            self.metrics.learners(len(self.live))
            self._ask()

    def drop(self, learner_id: int, error: Exception | str) -> None:
        """A learner died (or its node did): record it, free its slot, ask for a new one."""
        from orchestrator.placement import release

        slot = self.live.pop(learner_id, None)
        if slot is None:
            return
        reason = _reason(error)
        self.changes.append(("failure", learner_id, time.time()))
        self.events.emit("failure", f"learner {learner_id} on node {(slot.node or '?')[:8]} died: {reason}",
                         learner=learner_id, node=slot.node, error=reason)
        self.retired_samples += slot.stats.get("samples", 0)
        if learner_id in self.order:
            self.order.remove(learner_id)
        release([slot.pg], [slot.handle])
        self.events.emit("leave", f"learner {learner_id} left the group ({len(self.live)} left)",
                         learner=learner_id, learners=len(self.live))
        self.metrics.learners(len(self.live))
        self._ask()

    def take_changes(self) -> list[tuple[str, int, float]]:
        """The joins and failures since the last call (wherever they were noticed)."""
        changes, self.changes = self.changes, []
        return changes

    def dispatch_units(self) -> list[list[int]]:
        """Free-running learners in the sets the driver starts chunks for together: the learners
        of one hierarchical node (they all-reduce every step), every other learner on its own."""
        if self.kind == "hierarchical":
            units = [[i for i in group if i in self.live] for group in self.node_groups]
            grouped = {i for unit in units for i in unit}
            return [u for u in units if u] + [[s.id] for s in self.slots() if s.id not in grouped]
        return [[s.id] for s in self.slots()]

    def slots(self) -> list[LearnerSlot]:
        return [self.live[i] for i in self.order if i in self.live] + \
               [s for i, s in sorted(self.live.items()) if i not in self.order]

    # -- the group ------------------------------------------------------------------------------
    def form_group(self) -> bool:
        """Build the group over the live learners and hand every learner its member. Gossip
        members are swapped in while learners run; allreduce and hierarchical members re-form
        their process groups, so every learner must be between chunks. Returns whether it must
        be formed again: a learner died or hung meanwhile (it is dropped; only it), or a join
        failed because of another member (the others stay)."""
        self.order = self._ring_order() if self.kind == "gossip" else [s.id for s in self.slots()]
        try:
            members = self._members([self.live[i].handle for i in self.order])
        except Exception as exc:  # noqa: BLE001 - a member died while being asked its device or address
            if not self._drop_silent(exc):
                raise
            return True
        ids = list(self.order)
        self.planner_members()
        refs = []
        for i, member in zip(ids, members, strict=True):
            slot = self.live[i]
            swap = self.kind == "gossip" and slot.in_group  # gossip members need no setup: swap while running
            refs.append(slot.handle.regroup.remote(member) if swap else slot.handle.join.remote(member))
            slot.in_group = True
        if not self.use_ray or self.kind == "gossip":
            return False  # swaps are immediate; a learner that died shows up through its run
        return self._joined(dict(zip(refs, ids, strict=True)))

    def _joined(self, joins: dict) -> bool:
        """Wait (bounded) for every member's join; drop those that died or never answered.
        Returns whether the group must be formed again."""
        import ray

        from orchestrator.placement import gone

        ready, hung = ray.wait(list(joins), num_returns=len(joins), timeout=JOIN_TIMEOUT_S)
        again = bool(hung)
        for ref in hung:
            self.drop(joins[ref], f"stuck: no answer {JOIN_TIMEOUT_S:g} s into joining its group")
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - it died, or a peer did and the join failed
                again = True
                if gone(exc):
                    self.drop(joins[ref], exc)
                else:
                    self.events.emit("regroup", f"learner {joins[ref]} could not join its group "
                                     f"({_reason(exc)}); forming it again", learner=joins[ref])
        if again:
            self._failed_forms += 1
            if self._failed_forms > MAX_FAILED_FORMS:
                raise RuntimeError(f"{self.job_id}: the group failed to form {self._failed_forms} times in a row")
        else:
            self._failed_forms = 0
        return again

    def _drop_silent(self, exc: Exception) -> bool:
        """After `exc` from a call to every member: drop the members that no longer answer a
        ping; returns whether there were any (else `exc` was something else)."""
        import ray

        from orchestrator.placement import gone

        if not gone(exc):
            return False
        pings = {self.live[i].handle.ping.remote(): i for i in self.order if i in self.live}
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=5.0)
        answered = set()
        for ref in ready:
            try:
                ray.get(ref)
                answered.add(pings[ref])
            except ray.exceptions.RayError:
                pass
        silent = [i for i in pings.values() if i not in answered]
        for i in silent:
            self.drop(i, exc)
        return bool(silent)

    def planner_members(self) -> None:
        """Tell the planner the members (and balanced weights) for the next unstarted epoch."""
        from orchestrator.placement import fetch

        if not self.use_ray:
            return
        weights = self._weights()
        ids = list(self.order)
        fetch(self.planner.set_members.remote(ids, weights))
        self._planned = (ids, weights)

    def _weights(self) -> list[float] | None:
        """Shard weights by measured speed (balanced allreduce), once every member has one."""
        if not (self.spec.group.balance and self.kind == "allreduce" and len(self.order) > 1):
            return None
        speeds = [self.live[i].speed for i in self.order]
        if any(s is None for s in speeds):
            return None
        planned_ids, planned = getattr(self, "_planned", (None, None))
        if planned is None or planned_ids != self.order:  # planned afresh: by speed alone
            return batch_shares(speeds)
        return batch_shares(speeds, planned, [self.live[i].step_compute_s or 0.0 for i in self.order])

    def _ring_order(self) -> list[int]:
        """Gossip ring: by measured speed (`placement.ring_by_speed`) with `group.balance` once
        every learner has a speed; until then learners keep their place."""
        slots = self.slots()
        if not (self.spec.group.balance and all(s.speed is not None for s in slots)):
            return [s.id for s in slots]
        return ring_by_speed({s.id: s.speed for s in slots})

    def rebalance(self) -> bool:
        """Adapt to measured speeds (called at evaluations, about once per epoch); returns whether
        the group changed. allreduce: new shard weights from the next unstarted epoch; gossip: a
        new ring order, swapped in at once."""
        if not (self.use_ray and self.spec.group.balance and len(self.live) > 1):
            return False
        if self.kind == "allreduce":
            weights = self._weights()
            old = getattr(self, "_planned", (None, None))[1]
            if weights is None or (old is not None and len(old) == len(weights) and all(
                    abs(a - b) <= REBALANCE_CHANGE * max(a, b) for a, b in zip(weights, old, strict=True))):
                return False
            self.planner_members()
            out = [i for i, w in zip(self.order, weights, strict=True) if w == 0]
            self.events.emit("rebalance", "shard and batch shares by measured speed: " + ", ".join(
                f"learner {i} {w:.2f}" for i, w in zip(self.order, weights, strict=True)) + "".join(
                f"; learner {i} sits out (its {self.live[i].step_compute_s:.2f} s per step at a small share "
                "outlast the others' steps; it keeps its replica in step)" for i in out),
                weights={str(i): w for i, w in zip(self.order, weights, strict=True)},
                speeds={str(i): round(self.live[i].speed, 2) for i in self.order},
                step_compute_s={str(i): round(self.live[i].step_compute_s or 0.0, 4) for i in self.order})
            return True
        if self.kind == "gossip":
            speeds = {i: self.live[i].speed for i in self.order}
            if any(v is None for v in speeds.values()):
                return False
            actives, passives = self.order[0::2], self.order[1::2]
            # only when a passive learner is clearly faster than an active one (not measurement noise)
            if not passives or max(speeds[i] for i in passives) <= (1 + REBALANCE_CHANGE * 2) * min(
                    speeds[i] for i in actives):
                return False
            self.form_group()
            self.events.emit("rebalance", "gossip ring by measured speed (passive: "
                             + ", ".join(str(i) for i in self.order[1::2]) + ")", ring=self.order,
                             speeds={str(i): round(self.live[i].speed, 2) for i in self.order})
            return True
        return False

    def _members(self, handles) -> list:
        n, kind = len(handles), self.kind
        if not self.use_ray or (n == 1 and kind == "gossip"):
            return [SoloMember()] * n
        if kind == "gossip":
            return [GossipMember(i, [handles[q] for q in ring_partners(i, n)], self.spec.seed) for i in range(n)]
        from orchestrator.placement import fetch

        backend = "nccl" if set(fetch([h.device.remote() for h in handles])) == {"cuda"} else "gloo"
        if kind == "hierarchical":
            return self._hierarchical_members(handles, backend)
        ip, port = fetch([handles[0].ip.remote(), handles[0].free_port.remote()])
        return [AllreduceMember(i, n, f"{ip}:{port}", backend) for i in range(n)]

    def _hierarchical_members(self, handles, backend: str) -> list:
        """Learners grouped by the node they run on; each node's first learner leads it on the
        leaders' gossip ring."""
        from orchestrator.placement import fetch

        by_node: dict[str, list[int]] = {}
        for i, slot_id in enumerate(self.order):
            by_node.setdefault(self.live[slot_id].node, []).append(i)
        nodes = list(by_node.values())
        leaders = [idxs[0] for idxs in nodes]
        members: list = [None] * len(handles)
        for k, idxs in enumerate(nodes):
            ip, port = fetch([handles[idxs[0]].ip.remote(), handles[idxs[0]].free_port.remote()])
            ring = GossipMember(k, [handles[leaders[q]] for q in ring_partners(k, len(nodes))], self.spec.seed)
            for j, i in enumerate(idxs):
                members[i] = HierarchicalMember(j, len(idxs), f"{ip}:{port}", ring if j == 0 else None, backend)
        self.node_groups = [[self.order[i] for i in idxs] for idxs in nodes]
        return members

    def nodes_used(self) -> list[dict]:
        """The inventory entries (`placement.node_inventory`) of the nodes that hosted learners,
        with those learners' ids; nodes that are gone by now keep only their id."""
        if not self.use_ray:
            return []
        from orchestrator.placement import node_inventory

        known = {n["node_id"]: n for n in node_inventory()}
        return [{**known.get(node, {"node_id": node, "gone": True}), "learners": ids}
                for node, ids in self.hosted.items()]

    def by_accelerator(self) -> dict[str, dict]:
        """With `accelerator_types`: each kind's live learners, their measured samples/s in all
        and (allreduce) their share of each step's batch: by measured speed once balanced shares
        are planned, equal until then."""
        kinds = self.spec.accelerator_types
        if not kinds or not self.use_ray:
            return {}
        ids, planned = getattr(self, "_planned", (None, None))
        weights = {}
        if self.kind == "allreduce" and self.order:
            weights = dict(zip(ids, planned, strict=True)) if planned and ids == self.order else \
                {i: 1 / len(self.order) for i in self.order}
        out = {}
        for kind in kinds:
            mine = [s for s in self.live.values() if s.pg is not None and kind in s.pg.bundle]
            out[kind] = {"learners": sorted(s.id for s in mine),
                         "samples_per_s": round(sum(s.speed or 0.0 for s in mine), 2),
                         "share": round(sum(weights.get(s.id, 0.0) for s in mine), 4) if weights else None}
        return out

    # -- the end --------------------------------------------------------------------------------
    def close_and_release(self) -> None:
        """Let the live learners leave their group (for at most CLOSE_TIMEOUT_S: a stuck one is
        not waited for), then `release`."""
        if self.use_ray and self.live:
            import ray

            ray.wait([s.handle.close.remote() for s in self.live.values()], num_returns=len(self.live),
                     timeout=CLOSE_TIMEOUT_S)
        self.release()

    def release(self) -> None:
        """Kill every learner (live or starting) and the planner, and free every placement group
        (placed or pending: the job's whole demand on the cluster and its autoscaler)."""
        if not self.use_ray:
            return
        from orchestrator.placement import release

        pgs = [s.pg for s in self.live.values()] + [a.pg for a in self.arriving.values()] + \
              [pg for pg, _ in self.pending.values()]
        actors = [s.handle for s in self.live.values()] + [a.handle for a in self.arriving.values()]
        release(pgs, actors + ([self.planner] if self.planner is not None else []))
        self.live.clear()
        self.arriving.clear()
        self.pending.clear()


def _reason(error: Exception | str) -> str:
    """One line on why a learner is gone (for an error raised inside it: that error, not Ray's wrapper)."""
    if isinstance(error, str):
        return error
    if isinstance(getattr(error, "cause", None), Exception):  # a RayTaskError: what the learner raised
        error = error.cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()  # no terminal colours
    first = next((line for line in text if line.strip()), type(error).__name__)
    return f"{type(error).__name__}: {first[:200]}"
