"""Placing learners: one placement group per job (a bundle per learner), and one named learner
actor per bundle, so the Ray dashboard's Actors and Placement Groups views show `<job>/learner-<i>`
and `<job>/learners`. One-learner jobs outside Ray run the same learner in-process.
"""

from __future__ import annotations

from types import SimpleNamespace

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.learner import LearnerActor, LearnerService


class PlacementTimeout(RuntimeError):
    pass


def learner_bundle(cpus: float, use_gpus: bool) -> dict:
    return {"CPU": cpus, "GPU": 1} if use_gpus else {"CPU": cpus}


def cluster_has_gpus() -> bool:
    return ray.cluster_resources().get("GPU", 0) >= 1


def place_learners(job_id: str, count: int, cpus_per_learner: float, workload_config: dict, seed: int,
                   timeout_s: float = 120.0):
    """Reserve a placement group and start `count` learner actors in it; returns (pg, actors)."""
    gpus = cluster_has_gpus()
    bundle = learner_bundle(cpus_per_learner, gpus)
    pg = placement_group([bundle] * count, strategy="PACK", name=f"{job_id}/learners")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementTimeout(
            f"{job_id}: could not reserve {count} learners of {bundle} within {timeout_s:.0f}s; "
            f"the cluster has {ray.available_resources()} available")
    threads = max(1, int(cpus_per_learner))
    actors = [
        LearnerActor.options(
            name=f"{job_id}/learner-{i}", num_cpus=cpus_per_learner, num_gpus=1 if gpus else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        ).remote(workload_config, seed, i, count, threads)
        for i in range(count)
    ]
    return pg, actors


def release(pg, actors) -> None:
    """Kill the job's learners and free its placement group."""
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # already dead
            pass
    if pg is not None:
        remove_placement_group(pg)


class InProcessLearner:
    """A `LearnerService` in this process behind the same `handle.method.remote(...)` calls."""

    def __init__(self, *args):
        self._service = LearnerService(*args)

    def __getattr__(self, name):
        method = getattr(self._service, name)
        return SimpleNamespace(remote=method)


def fetch(values):
    """ray.get for object refs; in-process results pass through."""
    if isinstance(values, list):
        refs = [v for v in values if isinstance(v, ray.ObjectRef)]
        return ray.get(values) if refs and len(refs) == len(values) else values
    return ray.get(values) if isinstance(values, ray.ObjectRef) else values
