"""What the tests and the benchmarks ask of a Ray cluster they made, written once: what it holds
(live actors, placement groups not removed, the autoscaler's resource request), what a run left on
it (by the run's name prefix, or against what it held before), taking that away, waiting on a
condition, and a worker node of its own (`ray start --block` in a child process, stopped by its
process group: never `ray stop`, which would stop every Ray process of the machine).

Example:
    >>> before = holdings()  # doctest: +SKIP
    >>> ...  # a run
    >>> assert not added_since(before), added_since(before)  # doctest: +SKIP
    >>> assert not leftovers_of("chorus-test-")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from threading import Thread
from typing import TypeVar

T = TypeVar("T")
KINDS = ("actors", "placement groups")


def holdings() -> dict[str, dict[str, str]]:
    """The connected cluster's live actors and its placement groups not removed: id -> name."""
    import ray
    from ray.util import placement_group_table

    return {"actors": {i: a.get("Name") or "" for i, a in ray._private.state.actors().items()
                       if a["State"] != "DEAD"},
            "placement groups": {i: g["name"] for i, g in placement_group_table().items()
                                 if g["state"] != "REMOVED"}}


def resource_request() -> list:
    """The autoscaler resource request on the connected cluster (Ray's v1 key), [] when none."""
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


def leftovers_of(prefix: str, request: bool = True) -> dict[str, list]:
    """What runs whose names start with `prefix` hold on the connected cluster: their named actors
    alive, their placement groups not removed and (with `request`) the autoscaler resource request,
    if any; only the kinds that are not empty."""
    held = holdings()
    left: dict[str, list] = {kind: sorted(n for n in held[kind].values() if n.startswith(prefix)) for kind in KINDS}
    if request:
        left["resource request"] = resource_request()
    return {k: v for k, v in left.items() if v}


def added_since(before: dict[str, dict[str, str]]) -> dict[str, set[str]]:
    """The ids of what the cluster holds now and did not hold at `before` (a `holdings()`)."""
    now = holdings()
    return {kind: set(now[kind]) - set(before[kind]) for kind in KINDS if set(now[kind]) - set(before[kind])}


def take_away(left: dict[str, set[str]]) -> None:
    """Kill those actors and remove those placement groups (ids, as `added_since` gives them)."""
    import ray
    from ray._private.worker import global_worker
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for actor_id in left.get("actors", ()):
        try:
            global_worker.core_worker.kill_actor(ray.ActorID(bytes.fromhex(actor_id)), True)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
    for pg_id in left.get("placement groups", ()):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass


def wait_until(what: str, condition: Callable[[], T], timeout: float = 180.0, poll: float = 0.05,
               job: Thread | None = None) -> T:
    """Poll `condition` until it returns something truthy, and return that. Raises TimeoutError
    naming `what` after `timeout` seconds, or RuntimeError as soon as `job` (a thread running the
    job, with its `outcome` when it has one) has ended first."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if job is not None and not job.is_alive():
            raise RuntimeError(f"the job ended before {what}: {getattr(job, 'outcome', None)}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def start_worker_node(address: str, cpus: int, resources: dict | None = None) -> subprocess.Popen:
    """A worker node of the cluster at `address`, as `ray start --block` in a child process of its
    own process group (`Cluster.add_node` installs signal handlers, which only the main thread
    may do). Stop it with `stop_worker_node`."""
    ray_cli = Path(sys.executable).parent / "ray"
    return subprocess.Popen([str(ray_cli), "start", "--address", address, "--num-cpus", str(cpus), "--resources",
                             json.dumps(resources or {}, allow_nan=False), "--block", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop_worker_node(proc: subprocess.Popen) -> None:
    """Stop that node and every process it started (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
