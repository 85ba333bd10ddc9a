"""Runtime: where a job's learners run — Ray actors (`RayRuntime`) or this process
(`LocalRuntime`, a one-learner job) — and the calls the driver makes on them: get, wait, gather,
is-gone, ping, kill. It is the only module that knows which of the two a job uses; every other
part calls a learner as `handle.method.remote(...)` and reads answers through its runtime.

It owns no learners and no resources (`capacity.py` places learners, `roster.py` tracks them).

Example:
    >>> runtime = runtime_for(spec)            # Ray when the spec allows more than one learner
    >>> answers, failed = runtime.gather({handle.counters.remote(): 0})
"""

from __future__ import annotations

import os
from types import SimpleNamespace

Results = tuple[list[tuple[int, object]], list[tuple[int, Exception]]]
LEARNER_MALLOC_ARENAS = "1"  # glibc malloc arenas in a learner's process (MALLOC_ARENA_MAX, unless set): one
# keeps the memory its step and prefetch threads free in one place (why: bench/README.md, "Figures
# behind constants")
NO_GPU_ENV = {"CUDA_VISIBLE_DEVICES": ""}  # the environment of a process that reserved no GPU: Ray
# leaves CUDA_VISIBLE_DEVICES alone for an actor with num_gpus=0, so torch would see the node's GPUs


class RayRuntime:
    """Learners are Ray actors (one process each, placed by `capacity.py`)."""

    name = "ray"
    distributed = True

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init()

    @staticmethod
    def get(values):
        import ray

        return ray.get(values)

    @staticmethod
    def wait(refs: list, num_returns: int = 1, timeout: float | None = None) -> list:
        """The refs of `refs` that are ready: `num_returns` of them, or fewer once `timeout` passes."""
        import ray

        if not refs:
            return []
        ready, _ = ray.wait(list(refs), num_returns=min(num_returns, len(refs)), timeout=timeout)
        return ready

    @staticmethod
    def is_gone(exc: Exception) -> bool:
        """Whether an error means a learner's actor or node died (ObjectLostError: a result that
        lived on a node that died)."""
        import ray

        return isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.NodeDiedError
                          | ray.exceptions.ObjectLostError)

    @staticmethod
    def failed_remotely(exc: Exception) -> bool:
        """Whether an error came from a learner's side (its actor, its node or its call failed)."""
        import ray

        return isinstance(exc, ray.exceptions.RayError)

    def gather(self, pending: dict) -> Results:
        """Every pending result: (learner id, value) for those that answered, (learner id, error)
        for those whose actor or node died. Empties `pending` (ref -> learner id)."""
        results, failed = [], []
        for ref, learner_id in list(pending.items()):
            try:
                results.append((learner_id, self.get(ref)))
            except Exception as exc:  # noqa: BLE001 - only a learner that is gone; a bug in it propagates
                if not self.is_gone(exc):
                    raise
                failed.append((learner_id, exc))
        pending.clear()
        return results, failed

    def gather_ready(self, pending: dict, ready: list) -> Results:
        """`gather` of the refs of `pending` that are in `ready` (they leave `pending`)."""
        return self.gather({ref: pending.pop(ref) for ref in ready if ref in pending})

    def answers(self, handle, timeout: float = 2.0) -> bool:
        """Whether a learner answers a ping (served while it computes) within `timeout`."""
        if handle is None:
            return False
        ready = self.wait([handle.ping.remote()], timeout=timeout)
        if not ready:
            return False
        try:
            self.get(ready[0])
            return True
        except Exception:  # noqa: BLE001 - any error: it did not answer
            return False

    @staticmethod
    def pause(seconds: float) -> None:
        """Wait `seconds` (a back-off with nothing else under way)."""
        import time

        time.sleep(seconds)

    @staticmethod
    def kill(actors) -> None:
        import ray

        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass

    @staticmethod
    def draining_nodes() -> dict:
        """Node id -> drain deadline (ms since the epoch; 0: none) of the nodes Ray is draining."""
        import ray

        return ray._private.state.state.get_draining_nodes()

    @staticmethod
    def available_resources() -> dict[str, float]:
        """What the cluster has free now."""
        import ray

        return ray.available_resources()

    @staticmethod
    def node_inventory() -> list[dict]:
        """The cluster's nodes (`resources.node_inventory`)."""
        from orchestrator.cluster.resources import node_inventory

        return node_inventory()

    @staticmethod
    def start_learner(job_id: str, learner_id: int, slot, workload: str, workload_config: dict, seed: int,
                      planner, slowdown: float = 1.0, secret=None):
        """The learner actor `<job>/learner-<id>` in a placed slot (returns at once; its `hello()`
        answers once it is built); `secret` (the job's) reaches it only as an argument of this call."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from orchestrator.learner.service import LearnerActor

        cpus, gpus = slot.bundle.get("CPU", 1.0), slot.bundle.get("GPU", 0)
        env = {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", LEARNER_MALLOC_ARENAS)}
        if not gpus:
            env.update(NO_GPU_ENV)  # Ray shows a node's GPUs to an actor that reserves none
        return LearnerActor.options(
            name=f"{job_id}/learner-{learner_id}", num_cpus=cpus, num_gpus=gpus, runtime_env={"env_vars": env},
            resources={k: v for k, v in slot.bundle.items() if k not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(slot.pg, placement_group_bundle_index=slot.index),
        ).remote(workload, workload_config, seed, learner_id, planner, max(1, int(cpus)), slowdown, bool(gpus), secret)

    @staticmethod
    def start_service(job_id: str, gpus: float = 0.0, secret=None):
        """The job's service (shard planner, evaluator and rendezvous boards, `job_service.py`) as
        an actor on the driver's node (losing any other node never loses it), with `gpus` of a GPU
        (`service_gpus`); `secret` (the job's) reaches it only as an argument of this call."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from orchestrator.cluster.resources import CapacityError
        from orchestrator.service.job_service import JobServiceActor

        node = ray.get_runtime_context().get_node_id()
        has = next((n["Resources"].get("GPU", 0) for n in ray.nodes() if n["NodeID"] == node), 0)
        if gpus > has:  # it must sit on the driver's node: asking it of another would wait forever
            raise CapacityError(f"{job_id}: service_gpus is {gpus:g}, but the driver's node has {has:g} GPUs: "
                                f"set service_gpus: 0 (evaluate on the CPU) or run the driver on a GPU node")
        return JobServiceActor.options(  # reserving no GPU, it must not take one
            name=f"{job_id}/service", num_cpus=0, num_gpus=gpus, runtime_env={"env_vars": {} if gpus else NO_GPU_ENV},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote((), gpus > 0, secret)

    @staticmethod
    def submit(target, method: str, *args):
        """Start `method` on an actor; returns its object ref."""
        return getattr(target, method).remote(*args)


class LocalRuntime:
    """One learner in this process (`InProcessLearner`): every call runs at once; nothing is
    ever gone or pending."""

    name = "local"
    distributed = False

    def connect(self) -> None:
        pass

    @staticmethod
    def get(values):
        if isinstance(values, list):
            return [LocalRuntime.get(v) for v in values]
        return values.value if isinstance(values, Done) else values

    @staticmethod
    def wait(refs: list, num_returns: int = 1, timeout: float | None = None) -> list:
        return list(refs)

    @staticmethod
    def is_gone(exc: Exception) -> bool:
        return False

    @staticmethod
    def failed_remotely(exc: Exception) -> bool:
        return False

    def gather(self, pending: dict) -> Results:
        results = [(learner_id, self.get(ref)) for ref, learner_id in pending.items()]
        pending.clear()
        return results, []

    def gather_ready(self, pending: dict, ready: list) -> Results:
        return self.gather({ref: pending.pop(ref) for ref in ready if ref in pending})

    def answers(self, handle, timeout: float = 2.0) -> bool:
        return handle is not None

    pause = RayRuntime.pause

    @staticmethod
    def kill(actors) -> None:
        pass

    @staticmethod
    def draining_nodes() -> dict:
        return {}

    @staticmethod
    def available_resources() -> dict[str, float]:
        return {}

    @staticmethod
    def node_inventory() -> list[dict]:
        return []

    @staticmethod
    def start_learner(job_id: str, learner_id: int, slot, workload: str, workload_config: dict, seed: int,
                      planner, slowdown: float = 1.0, secret=None):
        """The learner, in this process: torch uses the slot's CPUs, or torch's default (the
        machine's cores, or OMP_NUM_THREADS where that is set)."""
        import torch

        cpus = slot.bundle.get("CPU")
        threads = int(cpus) if cpus else torch.get_num_threads()
        return InProcessLearner(workload, workload_config, seed, learner_id, planner, threads, slowdown,
                                bool(slot.bundle.get("GPU")), secret)

    @staticmethod
    def start_service(job_id: str, gpus: float = 0.0, secret=None):
        from orchestrator.service.job_service import JobService

        return JobService([0], use_gpu=gpus > 0, secret=secret)  # in this process, which may see a GPU

    @staticmethod
    def submit(target, method: str, *args):
        """Run `method` of an object in this process now; its result as a `Done`."""
        return Done(getattr(target, method)(*_values(args)))


class InProcessLearner:
    """A `LearnerService` in this process behind the same `handle.method.remote(...)` calls; each
    call runs at once and returns its result wrapped as a `Done` (hashable, like an object ref)."""

    def __init__(self, *args):
        from orchestrator.learner.service import LearnerService

        self._service = LearnerService(*args)

    def __getattr__(self, name):
        method = getattr(self._service, name)
        call = SimpleNamespace(remote=lambda *args, **kwargs: Done(method(*_values(args), **kwargs)))
        call.options = lambda **_: call  # a concurrency group: every call runs at once anyway
        return call


class Done:
    """The result of an in-process call, in place of an object ref."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def runtime_for(spec, distributed: bool | None = None) -> RayRuntime | LocalRuntime:
    """Ray when `distributed` (default: when the spec allows more than one learner), else this
    process."""
    distributed = spec.learners.max > 1 if distributed is None else distributed
    return RayRuntime() if distributed else LocalRuntime()


def fetch(values):
    """ray.get for object refs, in-process results (`Done`) unwrapped, values sent in pieces
    (`base/pieces.py`) put together: for tests and benchmarks that hold learner handles of either kind."""
    import ray

    from orchestrator.base import pieces

    if isinstance(values, list):
        if values and all(isinstance(v, ray.ObjectRef) for v in values):
            return [fetch(v) for v in ray.get(values)]
        return [fetch(v) for v in values]
    if isinstance(values, Done):
        return fetch(values.value)
    if isinstance(values, ray.ObjectRef):
        return fetch(ray.get(values))
    return pieces.take(values) if isinstance(values, pieces.Pieces) else values


def _values(args: tuple) -> list:
    """Arguments with each `Done` replaced by its value (as Ray resolves object refs)."""
    return [a.value if isinstance(a, Done) else a for a in args]
