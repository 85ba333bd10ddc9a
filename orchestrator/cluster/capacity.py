"""Capacity: the resources a job holds and asks for, one slot per learner.

On Ray a slot is a single-bundle placement group (`<job>/learner-<id>`), so learners can be added
or lost one at a time and the dashboard shows each; a job that runs as a Tune trial takes the
bundles of the trial's own placement group instead (`BundlePool`), so Tune accounts for every
learner. A pending placement group is the job's only resource demand: Ray places it as soon as
a node can hold it, and an autoscaler launches nodes for it. `release` removes what the job
holds or asks for, on every exit path. A one-learner job in this process has one local slot.

Capacity knows slots, not learners: which learner runs where is `roster.py`'s, starting one is
`runtime.py`'s, and what the cluster could ever hold is `resources.py`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


class CapacityTimeout(RuntimeError):
    """Fewer than `learners.min` learners could be placed within `learners.wait_timeout_s`."""


class PlacementTimeout(RuntimeError):
    pass


def learner_bundle(cpus: float, gpus: float, resources: dict[str, float] | None = None) -> dict:
    """One learner's reservation: its CPUs, its share of a GPU when it asks for one (`gpus`: 0
    none, 1 a whole one; True counts as 1), and custom resources."""
    bundle = {"CPU": cpus, **(resources or {})}
    return {**bundle, "GPU": float(gpus)} if gpus else bundle


@dataclass
class Slot:
    """Where one learner runs: bundle `index` (of resources `bundle`) of placement group `pg`,
    which is either the learner's own (freeing the slot removes it), lent by a `BundlePool`
    (freeing gives it back), or None (this process)."""

    pg: object
    index: int = 0
    pool: BundlePool | None = None
    bundle: dict = field(default_factory=dict)

    def ready(self):
        return self.pg.ready() if self.pg is not None else None

    def free(self) -> None:
        if self.pool is not None:
            self.pool.give_back(self.index)
        elif self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)


@dataclass
class BundlePool:
    """Learner slots inside a placement group that someone else owns and removes (a Tune
    trial's): its bundles `indices`, each the same `bundle` of resources."""

    pg: object
    indices: list[int]
    bundle: dict = field(default_factory=dict)

    def __post_init__(self):
        self._free = list(self.indices)

    @classmethod
    def of_current_trial(cls) -> BundlePool:
        """The bundles after the first (the trial driver's) of the placement group this process
        runs in."""
        import ray

        pg = ray.util.get_current_placement_group()
        if pg is None:
            raise RuntimeError("not running inside a placement group (a Tune trial with a PlacementGroupFactory)")
        specs = pg.bundle_specs
        return cls(pg, list(range(1, len(specs))), dict(specs[1]) if len(specs) > 1 else {})

    def take(self) -> Slot | None:
        return Slot(self.pg, self._free.pop(0), self, self.bundle) if self._free else None

    def give_back(self, index: int) -> None:
        if index not in self._free:
            self._free.append(index)


def request_slot(job_id: str, learner_id: int, bundle: dict, pool: BundlePool | None = None) -> Slot | None:
    """Ask Ray for one learner's placement group (placed when capacity allows), or take a free
    bundle of `pool` (None when all are taken)."""
    if pool is not None:
        return pool.take()
    from ray.util.placement_group import placement_group

    return Slot(placement_group([bundle], strategy="PACK", name=f"{job_id}/learner-{learner_id}"), bundle=bundle)


def release(slots: list[Slot], actors, runtime=None) -> None:
    """Kill learners and free their slots (placed or still pending)."""
    from orchestrator.cluster.runtime import RayRuntime

    (runtime or RayRuntime()).kill(actors)
    for slot in slots:
        try:
            slot.free()
        except Exception:  # noqa: BLE001 - already removed
            pass


class Capacity:
    """The slots a job has asked for and not yet handed to a learner (`pending`), up to
    `learners.max` learners in all.

    Args:
        job_id, spec: the job.
        runtime: where learners run (`runtime.py`); in this process there is one local slot.
        pool: a Tune trial's `BundlePool` to take slots from instead of placement groups.
    """

    def __init__(self, job_id: str, spec, runtime, pool: BundlePool | None = None):
        self.job_id, self.spec, self.runtime, self.pool = job_id, spec, runtime, pool
        self.pending: dict[int, tuple[Slot, object]] = {}  # learner id -> (slot, its ready() ref)
        self.bundle: dict = {}
        self.next_id = 0

    def check(self, ids: list[int] = ()) -> None:
        """Each learner's bundle; fails at once (`cluster.CapacityError`) when `learners.min` can
        never be placed, not even on every node the autoscaler may launch."""
        if not self.runtime.distributed:
            return
        from orchestrator.cluster.resources import check_minimum, use_gpus

        self.next_id = max(ids, default=-1) + 1
        if self.pool is not None:
            self.bundle = self.pool.bundle
            return
        spec = self.spec
        gpus = (spec.gpus_per_learner or 1.0) if use_gpus(spec.accelerator) else 0.0
        self.bundle = learner_bundle(spec.cpus_per_learner or 1.0, gpus, spec.learner_resources)
        check_minimum(self.job_id, [self._bundle_of(k) for k in spec.accelerator_types or [None]], spec.learners.min)

    def ask(self, held: list[Slot], ids: list[int] = ()) -> None:
        """Ask for slots until the learners holding `held` plus those pending reach `learners.max`
        (`ids` first, e.g. those of a checkpoint)."""
        ids = list(ids)
        if not self.runtime.distributed:
            if not held and not self.pending:
                gpu = {"GPU": 1.0} if self.spec.accelerator != "cpu" else {}  # the GPU this process sees, if any
                self.pending[0] = (Slot(None, bundle={"CPU": self.spec.cpus_per_learner, **gpu}), None)
            return
        while len(held) + len(self.pending) < self.spec.learners.max:
            learner_id = ids[0] if ids else self.next_id
            slot = request_slot(self.job_id, learner_id, self._next_bundle(held), self.pool)
            if slot is None:  # the pool's bundles are all taken (until a learner gives one back)
                return
            if ids:
                ids.pop(0)
            else:
                self.next_id += 1
            self.pending[learner_id] = (slot, slot.ready())

    def _bundle_of(self, kind: str | None) -> dict:
        return self.bundle if kind is None else {**self.bundle, kind: 1.0}

    def _next_bundle(self, held: list[Slot]) -> dict:
        """With `accelerator_types`, one unit of the kind that has the fewest learners (live,
        starting or asked for), so learners spread over the kinds."""
        kinds = self.spec.accelerator_types
        if not kinds or self.pool is not None:
            return self.bundle
        bundles = [s.bundle for s in held] + [slot.bundle for slot, _ in self.pending.values()]
        count = {kind: sum(1 for b in bundles if kind in b) for kind in kinds}
        return self._bundle_of(min(kinds, key=lambda kind: count[kind]))

    def placed(self, timeout: float = 0) -> list[tuple[int, Slot]]:
        """The pending slots Ray has placed (within `timeout`); they stop being pending."""
        if not self.runtime.distributed:
            placed = [(i, slot) for i, (slot, _) in self.pending.items()]
            self.pending.clear()
            return placed
        by_ref = {ref: i for i, (_, ref) in self.pending.items()}
        ready = self.runtime.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout)
        return [(by_ref[ref], self.pending.pop(by_ref[ref])[0]) for ref in ready]

    def watched(self) -> list:
        """Refs that become ready when a pending slot is placed."""
        return [ref for _, ref in self.pending.values() if ref is not None]

    def wait(self, also: list, deadline: float, what) -> None:
        """Block until a slot is placed or one of `also` is ready (at most 5 s per call), or raise
        CapacityTimeout (`what()` says what was wanted) once `deadline` has passed."""
        refs = self.watched() + list(also)
        left = deadline - time.time()
        if left <= 0 or not refs:
            raise CapacityTimeout(what())
        self.runtime.wait(refs, num_returns=1, timeout=min(left, 5.0))

    def waiting_message(self, have: int, timed_out: bool = False) -> str:
        """What the job waits for: its learners, the minimum, the bundle and what is free now."""
        want = self.spec.learners
        available = self.runtime.available_resources()
        free = {k: round(available.get(k, 0), 2) for k in self.bundle}
        what = (f"{self.job_id}: {have} of at least {want.min} learners placed; "
                f"{'gave up waiting' if timed_out else 'waiting'} for capacity for {want.min - have} more "
                f"({self.bundle} each; free now: {free})")
        return what + (f" after {want.wait_timeout_s:g} s (learners.wait_timeout_s)" if timed_out
                       else f", for up to {want.wait_timeout_s:g} s (learners.wait_timeout_s)")

    def free(self, slot: Slot, handle=None) -> None:
        """Kill a learner and free its slot."""
        release([slot], [handle] if handle is not None else [], self.runtime)

    def release(self, slots: list[Slot], actors: list) -> None:
        """Kill `actors` and free `slots` and every pending slot: the job's whole demand."""
        if not self.runtime.distributed:
            return
        release(list(slots) + [slot for slot, _ in self.pending.values()], actors, self.runtime)
        self.pending.clear()


def place_learners(job_id: str, count: int, cpus_per_learner: float, workload: str, workload_config: dict,
                   seed: int, timeout_s: float = 120.0, secret=None):
    """A fixed set of `count` learners sharing one static shard plan and `secret` (a `JobSecret`;
    default: a fresh one), for tests and benchmarks; returns (slots, actors)."""
    import ray

    from orchestrator.base.secret import JobSecret
    from orchestrator.cluster.resources import use_gpus
    from orchestrator.cluster.runtime import RayRuntime
    from orchestrator.service.shards import ShardPlanner

    bundle = learner_bundle(cpus_per_learner, use_gpus("auto"))
    slots = [request_slot(job_id, i, bundle) for i in range(count)]
    ready, _ = ray.wait([slot.ready() for slot in slots], num_returns=count, timeout=timeout_s)
    if len(ready) < count:
        release(slots, [])
        raise PlacementTimeout(
            f"{job_id}: could not reserve {count} learners of {bundle} within {timeout_s:.0f}s; "
            f"the cluster has {ray.available_resources()} available")
    planner = ShardPlanner(list(range(count)))
    runtime = RayRuntime()
    secret = secret or JobSecret()
    actors = [runtime.start_learner(job_id, i, slot, workload, workload_config, seed, planner, secret=secret)
              for i, slot in enumerate(slots)]
    return slots, actors
