"""What a Ray cluster can give a job's learners, now and once its autoscaler has grown it.

- `use_gpus(accelerator)`: the spec's `accelerator` (`gpu`, `cpu` or `auto`) made concrete;
  `auto` means GPUs when the cluster has one now or its autoscaler can launch a node type that
  has them (a CPU head with GPU workers at `min_workers: 0` has none until a job asks).
- `autoscaler_node_types()`: the node types the cluster's autoscaler may launch, as Ray reports
  them (the cluster config the autoscaler publishes in the GCS), or None without an autoscaler.
- `most_resources()`: the cluster's resources once every node it may launch is there.
- `check_minimum(...)`: a job whose `learners.min` can never be placed — not on the nodes there
  are, nor on those the autoscaler may add — fails at once with what the cluster has and what to
  change, instead of waiting out `learners.wait_timeout_s`.

- `node_inventory()`: every live node's accelerator, labels, CPUs, GPUs and custom resources.

Learners' demand itself is their pending placement groups (`capacity.Capacity`): Ray's
autoscaler sees them and launches nodes to hold them, and removing them withdraws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

AUTOSCALER_WAIT_S = 10.0  # how long a fresh head's autoscaler may take to publish its node types


class CapacityError(RuntimeError):
    """The cluster can never hold the job's minimum; the message says what it has and what to change."""


@dataclass(frozen=True)
class NodeType:
    """One kind of node the autoscaler can launch: its resources and at most how many (-1: no limit)."""

    name: str
    resources: dict
    max_count: int


def autoscaler_node_types() -> list[NodeType] | None:
    """The worker node types the cluster's autoscaler may launch, or None when the cluster has
    no autoscaler (a local or fixed cluster). Read from Ray: the cluster config in the GCS where
    the autoscaler publishes it (autoscaler v2, KubeRay), else the config file the autoscaler
    process on this node was started with (`ray start --autoscaling-config`; a submitted job's
    driver runs on the head, beside it)."""
    import ray

    config = ray._private.state.state.get_cluster_config()
    if config is not None and config.node_group_configs:
        return [NodeType(g.name, {k: float(v) for k, v in g.resources.items()}, g.max_count)
                for g in config.node_group_configs if g.max_count != 0]
    path = _monitor_config_path(ray.get_runtime_context().gcs_address)
    if path is None:
        return None
    cluster = yaml.safe_load(Path(path).expanduser().read_text())
    return node_types_of(cluster)


def node_types_of(cluster: dict) -> list[NodeType]:
    """The worker node types of an autoscaler cluster config (`cluster.yaml`'s shape): every type
    but the head's that may have a node, at most its `max_workers` (and the cluster's).

    Example:
        >>> node_types_of({"head_node_type": "head", "max_workers": 3, "available_node_types": {
        ...     "head": {"resources": {"CPU": 2}}, "gpu": {"resources": {"GPU": 1}, "max_workers": 4}}})
        [NodeType(name='gpu', resources={'GPU': 1.0}, max_count=3)]
    """
    most = cluster.get("max_workers", -1)
    types = []
    for name, node in cluster.get("available_node_types", {}).items():
        count = node.get("max_workers", most)
        if name == cluster.get("head_node_type") or count == 0:
            continue
        types.append(NodeType(name, {k: float(v) for k, v in (node.get("resources") or {}).items()},
                              min(count, most) if most >= 0 else count))
    return types


def _monitor_config_path(gcs_address: str) -> str | None:
    """The `--autoscaling-config` of the autoscaler (Ray's `monitor.py`) of the cluster at
    `gcs_address`, when it runs on this node."""
    port = gcs_address.rsplit(":", 1)[-1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(a.endswith("autoscaler/_private/monitor.py") for a in args):
            continue
        if not any(a.startswith("--gcs-address=") and a.rsplit(":", 1)[-1] == port for a in args):
            continue
        for a in args:
            if a.startswith("--autoscaling-config="):
                return a.split("=", 1)[1]
    return None


def use_gpus(accelerator: str) -> bool:
    """Whether learners ask for a GPU: `gpu` yes, `cpu` no, `auto` when the cluster has a GPU
    now or can launch a node type that has one."""
    if accelerator != "auto":
        return accelerator == "gpu"
    import ray

    if ray.cluster_resources().get("GPU", 0) >= 1:
        return True
    return any(t.resources.get("GPU", 0) >= 1 for t in autoscaler_node_types() or [])


def most_resources() -> dict:
    """The cluster's resources in all, with every node its autoscaler may launch (a type with no
    limit counts as infinitely many)."""
    import ray

    total = dict(ray.cluster_resources())
    for t in autoscaler_node_types() or []:
        for key, value in t.resources.items():
            total[key] = total.get(key, 0.0) + (math.inf if t.max_count < 0 else t.max_count * value)
    return total


def bundles_fit(resources: dict, bundle: dict) -> int:
    """How many copies of `bundle` one node with `resources` holds.

    Example:
        >>> bundles_fit({"CPU": 2.0, "GPU": 1.0}, {"CPU": 1.0})
        2
        >>> bundles_fit({"CPU": 8.0}, {"CPU": 1.0, "GPU": 1})
        0
    """
    need = {k: v for k, v in bundle.items() if v > 0}
    if not need:
        return 0
    return min(math.floor(resources.get(k, 0.0) / v + 1e-9) for k, v in need.items())


def check_minimum(job_id: str, bundles: list[dict], minimum: int) -> None:
    """Raise `CapacityError` when `minimum` learners, each taking one of `bundles` (one, or one
    per accelerator type), cannot all be placed even on an empty cluster: on the live nodes,
    plus (with an autoscaler) every node it may launch."""
    import ray

    def fit(resources: dict) -> int:
        return max(bundles_fit(resources, b) for b in bundles)

    wanted = " or ".join(_short(b) for b in bundles)
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    fit_now = sum(fit(r) for r in nodes)
    types = autoscaler_node_types()
    if types is not None:
        if any(t.max_count < 0 and fit(t.resources) > 0 for t in types):
            return
        fit_later = fit_now + sum(t.max_count * fit(t.resources) for t in types)
        if fit_later >= minimum:
            return
        offered = ", ".join(f"{t.name} (up to {t.max_count}: {_short(t.resources)})" for t in types) or "none"
        raise CapacityError(
            f"{job_id}: learners.min is {minimum} learners of {wanted}, but this cluster holds at most "
            f"{fit_later} of them, even with every node its autoscaler may launch (node types: {offered}); "
            f"{_advice(bundles[0])}")
    if fit_now >= minimum:
        return
    cpus = sum(r.get("CPU", 0) for r in nodes)
    gpus = sum(r.get("GPU", 0) for r in nodes)
    raise CapacityError(
        f"{job_id}: learners.min is {minimum} learners of {wanted}, but this cluster has no autoscaler and "
        f"holds at most {fit_now} ({len(nodes)} node{'s' if len(nodes) != 1 else ''}: {cpus:g} CPUs, "
        f"{gpus:g} GPUs in all); {_advice(bundles[0])}")


def _advice(bundle: dict) -> str:
    if bundle.get("GPU", 0) > 0:
        return "lower learners.min (or learners), or set accelerator: cpu to train on CPUs"
    cpus = bundle.get("CPU", 1.0)
    return f"lower learners.min (or learners), or cpus_per_learner (now {cpus:g}; e.g. {cpus / 2:g})"


def _short(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def node_inventory() -> list[dict]:
    """Every live node: id, address, accelerator type (from Ray's `accelerator_type:*` resource),
    labels, CPUs, GPUs and custom resources (e.g. those a cluster.yaml node type advertises)."""
    import ray

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
