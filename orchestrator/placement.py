"""Placing learners: one single-bundle placement group per learner (`<job>/learner-<id>`) holding
one named learner actor (`<job>/learner-<id>`), so learners can be added or lost one at a time
and the Ray dashboard's Actors and Placement Groups views show each. A job that runs as a Tune
trial instead places its learners in the bundles of the trial's own placement group (a
`BundlePool`), so Tune accounts for every learner. One-learner jobs outside Ray run the same
learner in-process. Also the inventory of the cluster's nodes (what accelerators,
labels and custom resources each offers) and what measured speeds imply: allreduce batch shares
and the gossip ring order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.learner import LearnerActor, LearnerService
from orchestrator.shards import ShardPlanner


class PlacementTimeout(RuntimeError):
    pass


def learner_bundle(cpus: float, use_gpus: bool, resources: dict[str, float] | None = None) -> dict:
    """One learner's reservation: its CPUs, a GPU when it asks for one, and custom resources."""
    bundle = {"CPU": cpus, **(resources or {})}
    return {**bundle, "GPU": 1} if use_gpus else bundle


@dataclass
class Slot:
    """Where one learner runs: bundle `index` (of resources `bundle`) of placement group `pg`,
    which is either the learner's own (freeing the slot removes it) or lent by a `BundlePool`
    (freeing gives it back)."""

    pg: object
    index: int = 0
    pool: BundlePool | None = None
    bundle: dict = field(default_factory=dict)

    def ready(self):
        return self.pg.ready()

    def free(self) -> None:
        if self.pool is not None:
            self.pool.give_back(self.index)
        else:
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
    return Slot(placement_group([bundle], strategy="PACK", name=f"{job_id}/learner-{learner_id}"), bundle=bundle)


def start_learner(job_id: str, learner_id: int, slot: Slot, workload_config: dict, seed: int, planner,
                  slowdown: float = 1.0):
    """The learner actor for a placed slot (returns at once; `ready()` answers once it is built)."""
    bundle = slot.bundle
    cpus = bundle.get("CPU", 1.0)
    return LearnerActor.options(
        name=f"{job_id}/learner-{learner_id}", num_cpus=cpus, num_gpus=bundle.get("GPU", 0),
        resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
        scheduling_strategy=PlacementGroupSchedulingStrategy(slot.pg, placement_group_bundle_index=slot.index),
    ).remote(workload_config, seed, learner_id, planner, max(1, int(cpus)), slowdown)


def place_learners(job_id: str, count: int, cpus_per_learner: float, workload_config: dict, seed: int,
                   timeout_s: float = 120.0):
    """A fixed set of `count` learners sharing one static shard plan (tests); returns (slots, actors)."""
    from orchestrator.capacity import use_gpus

    bundle = learner_bundle(cpus_per_learner, use_gpus("auto"))
    slots = [request_slot(job_id, i, bundle) for i in range(count)]
    ready, _ = ray.wait([slot.ready() for slot in slots], num_returns=count, timeout=timeout_s)
    if len(ready) < count:
        release(slots, [])
        raise PlacementTimeout(
            f"{job_id}: could not reserve {count} learners of {bundle} within {timeout_s:.0f}s; "
            f"the cluster has {ray.available_resources()} available")
    planner = ShardPlanner(list(range(count)))
    actors = [start_learner(job_id, i, slot, workload_config, seed, planner) for i, slot in enumerate(slots)]
    return slots, actors


SIT_OUT_SHARE = 0.5  # x an equal share: below it, a learner that still straggles sits out
NEAR_PROPORTIONAL = 1.25  # ... or under it by speed, and its share now at most this x that
STRAGGLING = 1.1  # ... "straggles": its compute per step exceeds the others' slowest by this factor


def batch_shares(speeds: list[float], current: list[float] | None = None,
                 step_compute_s: list[float] | None = None) -> list[float]:
    """Each learner's share of an allreduce step's global batch (and of the epoch's data):
    proportional to its measured speed, so fast and slow learners finish a step together.

    Proportional shares assume a step's cost grows with its batch. A step also has a fixed cost
    (kernel launches, the recurrent layers' time steps, the optimizer), and a learner slow at
    that too may straggle however small its batch. So, given the `current` shares and each
    learner's mean compute seconds per step at them, a learner whose steps take more than 1.1x
    the slowest of the others' gets share 0 when it has had a small share already: its current
    share is under half an equal one, or its proportional share is and it has about that
    (within 25%) now. It sits out, keeping its replica in step (it takes part in every
    all-reduce without a batch), until the shares are planned afresh (the membership changes).
    At least one learner always keeps a share.

    Example:
        >>> batch_shares([60.0, 60.0, 60.0, 20.0])
        [0.3, 0.3, 0.3, 0.1]
        >>> batch_shares([60.0, 60.0, 60.0, 9.0], current=[0.3, 0.3, 0.3, 0.1],
        ...              step_compute_s=[0.17, 0.18, 0.17, 0.27])
        [0.3333, 0.3333, 0.3333, 0.0]
        >>> batch_shares([53.0, 51.0, 50.0, 19.0], current=[0.28, 0.3, 0.29, 0.13],
        ...              step_compute_s=[0.2, 0.21, 0.21, 0.48])
        [0.3442, 0.3312, 0.3247, 0.0]
    """
    if not speeds or any(s <= 0 for s in speeds):
        raise ValueError(f"speeds must be positive, got {speeds}")
    out = [float(s) for s in speeds]
    if current is not None and step_compute_s is not None:
        n, small = len(speeds), SIT_OUT_SHARE / len(speeds)
        proportional = [s / sum(out) for s in out]
        for i in range(n):
            others = [step_compute_s[j] for j in range(n) if j != i and current[j] > 0]
            had_small = current[i] < small or (proportional[i] < small
                                               and current[i] <= NEAR_PROPORTIONAL * proportional[i])
            sits_out = current[i] == 0 or (had_small and others and step_compute_s[i] > STRAGGLING * max(others))
            if sits_out and sum(1 for v in out if v > 0) > 1:
                out[i] = 0.0
    total = sum(out)
    return [round(s / total, 4) for s in out]


def ring_by_speed(speeds: dict[int, float]) -> list[int]:
    """A gossip ring order (learner ids) with the fastest learners at the active, even positions
    and the slowest at the passive ones: an active learner mixes once per own step, so a slow
    one would mix rarely, while a passive learner is averaged by both neighbours every step
    they take; and no active learner waits on a passive one that is busy being slow.

    Example:
        >>> ring_by_speed({0: 50.0, 1: 20.0, 2: 55.0, 3: 52.0})
        [2, 0, 3, 1]
    """
    by_speed = sorted(speeds, key=lambda i: -speeds[i])
    half = (len(by_speed) + 1) // 2
    actives, passives = by_speed[:half], by_speed[half:]
    return [(actives if k % 2 == 0 else passives).pop(0) for k in range(len(by_speed))]


def node_inventory() -> list[dict]:
    """Every live node: id, address, accelerator type (from Ray's `accelerator_type:*` resource),
    labels, CPUs, GPUs and custom resources (e.g. those a cluster.yaml node type advertises)."""
    nodes = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        resources = node.get("Resources", {})
        accelerators = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")
                  and not k.startswith(("node:", "accelerator_type:"))}
        nodes.append({"node_id": node["NodeID"], "address": node["NodeManagerAddress"],
                      "accelerator": accelerators[0] if accelerators else None,
                      "labels": dict(node.get("Labels", {})), "cpus": resources.get("CPU", 0),
                      "gpus": resources.get("GPU", 0), "custom": custom})
    return nodes


def release(slots: list[Slot], actors) -> None:
    """Kill learners and free their slots (placed or still pending)."""
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # already dead
            pass
    for slot in slots:
        try:
            slot.free()
        except Exception:  # already removed
            pass


class InProcessLearner:
    """A `LearnerService` in this process behind the same `handle.method.remote(...)` calls; each
    call runs at once and returns its result wrapped as a `Done` (hashable, like an object ref)."""

    def __init__(self, *args):
        self._service = LearnerService(*args)

    def __getattr__(self, name):
        method = getattr(self._service, name)
        return SimpleNamespace(remote=lambda *args, **kwargs: Done(method(*args, **kwargs)))


class Done:
    """The result of an in-process call, in place of an object ref."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def gone(exc: Exception) -> bool:
    """Whether an error means a learner's actor or node died."""
    lost = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError)
    return isinstance(exc, lost)  # ObjectLostError: a result that lived on a node that died


def fetch(values):
    """ray.get for object refs; in-process results (`Done`) are unwrapped."""
    if isinstance(values, list):
        if values and all(isinstance(v, ray.ObjectRef) for v in values):
            return ray.get(values)
        return [fetch(v) for v in values]
    if isinstance(values, Done):
        return values.value
    return ray.get(values) if isinstance(values, ray.ObjectRef) else values
