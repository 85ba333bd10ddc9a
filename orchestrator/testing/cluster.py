"""What the tests and the benchmarks ask of a Ray cluster they made, written once: what it holds
(live actors, placement groups not removed, alive nodes and held resources, the autoscaler's
resource request), what a run left on it (by the run's name prefix, or against what it held
before, once Ray has settled), whose that is, taking it away, waiting on a condition, and a worker
node of its own (`ray start --block` in a child process, stopped by its process group: never
`ray stop`, which would stop every Ray process of the machine).

Example:
    >>> before = holdings()  # doctest: +SKIP
    >>> ...  # a run
    >>> assert not settled_since(before, grace_s=15.0)  # doctest: +SKIP
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


def holdings(nodes: bool = False) -> dict[str, dict[str, str]]:
    """The connected cluster's live actors and its placement groups not removed: id -> name. With
    `nodes`, also its alive nodes (id -> address) and the resources something holds ("CPU 1.0", Ray's
    view: total minus available), so that an actor's CPU not yet given back counts as held."""
    import ray
    from ray.util import placement_group_table

    held = {"actors": {i: a.get("Name") or "" for i, a in ray._private.state.actors().items()
                       if a["State"] != "DEAD"},
            "placement groups": {i: g["name"] for i, g in placement_group_table().items()
                                 if g["state"] != "REMOVED"}}
    if nodes:
        total, free = ray.cluster_resources(), ray.available_resources()
        held["nodes"] = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        held["held resources"] = {f"{name} {round(amount - free.get(name, 0.0), 4)}": "" for name, amount in
                                  total.items() if not name.startswith("node:")
                                  and name not in ("memory", "object_store_memory")
                                  and amount - free.get(name, 0.0) > 1e-4}
    return held


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
    """The ids of what the cluster holds now and did not hold at `before` (a `holdings()`, of the
    same kinds)."""
    now = holdings(nodes="nodes" in before)
    return {kind: set(now[kind]) - set(before[kind]) for kind in now if set(now[kind]) - set(before[kind])}


def settled_since(before: dict[str, dict[str, str]], grace_s: float) -> dict[str, set[str]]:
    """`added_since(before)` once it is empty, or when `grace_s` seconds have passed: the actors of
    a driver that just exited, and the resources they held, take Ray a moment to mark dead."""
    deadline = time.monotonic() + grace_s
    while (left := added_since(before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def described(left: dict[str, set[str]]) -> dict[str, list[str]]:
    """Those ids by name where Ray knows one (actors: class and name; placement groups: name and
    state), so that a failure says whose they are; the other kinds as they are."""
    import ray
    from ray.util import placement_group_table

    actors, groups = ray._private.state.actors(), placement_group_table()
    named = {"actors": [f"{actors[a]['ActorClassName']} {actors[a].get('Name') or a}"
                        for a in left.get("actors", ()) if a in actors],
             "placement groups": [f"{groups[g]['name'] or g} ({groups[g]['state']})"
                                  for g in left.get("placement groups", ()) if g in groups]}
    rest = {kind: sorted(ids) for kind, ids in left.items() if kind not in named}
    return {kind: names for kind, names in {**named, **rest}.items() if names}


def take_away(left: dict[str, set[str]], cluster=None) -> None:
    """Kill those actors and remove those placement groups (ids, as `added_since` gives them) and,
    of `cluster` (a `ray.cluster_utils.Cluster`), those nodes."""
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
    for node in list(cluster.worker_nodes) if cluster is not None else ():
        if node.node_id in left.get("nodes", ()):
            cluster.remove_node(node, allow_graceful=False)


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
