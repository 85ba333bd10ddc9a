"""Chorus on Ray's own autoscaler: a head started with `--autoscaling-config` and Ray's
`fake_multinode` provider, whose monitor launches and terminates real raylets on this machine
as the cluster's demand asks. The node types are generated from `cluster.yaml` (same names,
custom resources and labels; each node scaled down to 1 CPU and 1 GPU), so the test follows
the file when it changes. The cluster starts as the real one does: a CPU head and no GPU node.

Each test runs in a process of its own (`own_process`), with its own head (temp dir and ports),
stopped by the PIDs of its processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cluster.local_head import HeadNode
from orchestrator.driver.job import TrainingJob
from orchestrator.testing.cluster import wait_until as shared_wait_until
from tests.builders import linear_spec, run_in_thread, stop_job

ROOT = Path(__file__).resolve().parents[3]
IDLE_TIMEOUT_S = 15.0  # the test clusters' idle timeout (cluster.yaml's is 10 minutes)
HEARTBEAT_TIMEOUT_S = 5  # a worker node not heard from this long is terminated and replaced

pytestmark = [pytest.mark.own_process, pytest.mark.slow]


def cluster_from_yaml(path: Path = ROOT / "cluster.yaml", max_per_type: int = 2) -> dict:
    """`cluster.yaml`'s node types for this machine: the head keeps its labels and custom
    resources and gets 2 CPUs and no GPU; each GPU type keeps its name, labels and custom
    resources (one unit: its generation) and gets 1 CPU and 1 GPU, at most `max_per_type` nodes."""
    config = yaml.safe_load(path.read_text())
    head = config["head_node_type"]
    types = {}
    for name, node in config["available_node_types"].items():
        custom = {key: 1.0 for key in node.get("resources", {}) if key not in ("CPU", "GPU")}
        resources = {"CPU": 2.0, **custom} if name == head else {"CPU": 1.0, "GPU": 1.0, **custom}
        types[name] = {"resources": resources, "labels": dict(node.get("labels", {})),
                       "min_workers": 0, "max_workers": 0 if name == head else min(node["max_workers"], max_per_type)}
    return {"cluster_name": config["cluster_name"], "head_node_type": head, "available_node_types": types,
            "max_workers": config["max_workers"], "upscaling_speed": config.get("upscaling_speed", 1.0),
            "idle_timeout_minutes": IDLE_TIMEOUT_S / 60}


def _autoscaling_head(max_per_type: int):
    """A head with cluster.yaml's node types (at most `max_per_type` nodes of each) and no worker
    node; the test's driver is connected."""
    import ray

    head = HeadNode(cpus=2, token=False, autoscaling=cluster_from_yaml(max_per_type=max_per_type), dashboard=False,
                    env={"AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S)})
    try:
        ray.init(address=f"127.0.0.1:{head.gcs_port}", log_to_driver=False)
        yield head
    finally:
        ray.shutdown()
        head.stop()
        assert head.pids() == [], "the head's processes (and the nodes it launched) outlived it"


@pytest.fixture
def autoscaling_head():
    yield from _autoscaling_head(max_per_type=2)


@pytest.fixture
def one_node_per_type_head():
    """As `autoscaling_head`, with at most one node of each type: no spare node can stand by."""
    yield from _autoscaling_head(max_per_type=1)


def workers() -> list[dict]:
    """The live nodes other than the head."""
    import ray

    return [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) >= 1]


def head_id() -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and not n["Resources"].get("GPU"))


def job_spec(name: str, **extra):
    """A gossip job of the tiny linear workload (steps of 20 ms) that runs until it is stopped."""
    fields = {"group": {"kind": "gossip"}, "budget": {"epochs": 100_000, "wall_seconds": 300, "eval_every_seconds": 5},
              **extra}
    return linear_spec(name=name, **fields)


def start_job(spec, out: Path):
    """The job, run by this process (the test's driver, on the head) in a thread."""
    job = TrainingJob(spec, out)
    return job, run_in_thread(job)


def joins(job) -> list[dict]:
    return [e for e in (job.events.recorded if job.events else []) if e["kind"] == "join"]


def changes(job) -> list[str]:
    """The job's events other than steps, as it worded them: what a failed assertion shows."""
    return [f"{e['wall_s']:.1f}s {e['message']}" for e in (job.events.recorded if job.events else [])
            if e["kind"] != "step"]


def wait_until(predicate, timeout: float, what: str, thread=None):
    """The shared wait (`orchestrator.testing.cluster.wait_until`), failing as soon as the job ended."""
    return shared_wait_until(what, predicate, timeout, poll=0.5, job=thread)


def test_a_job_grows_the_cluster_with_gpu_nodes_and_they_go_when_it_ends(autoscaling_head, tmp_path):
    """From a CPU head and no worker: the learners' placement groups make the autoscaler launch
    GPU nodes, every learner runs on one with a GPU (none on the head), the job finishes, and
    within the idle timeout after it the worker nodes are gone."""
    out = tmp_path / "run"
    assert workers() == []
    started = time.time()
    job, thread = start_job(job_spec("grow", learners={"min": 2, "max": 4}), out)
    wait_until(workers, 120, "a worker node", thread)
    first_node_s = time.time() - started
    wait_until(lambda: len(joins(job)) >= 4, 180, "4 learners joined", thread)
    joined_s = time.time() - started
    # every learner stepping: the first members' first step, and each later one's first step in the group
    later = lambda: [r for r in job.recoveries if r["cause"] == "join"]  # noqa: E731
    wait_until(lambda: job.first_step_at and all(r["stepping_at"] for r in later()), 120, "every learner stepping",
               thread)
    all_stepping_s = max([job.first_step_at] + [r["stepping_at"] for r in later()]) - started
    summary = stop_job(job, thread)
    ended = time.time()
    hosts = summary["nodes"]
    assert sum(len(n["learners"]) for n in hosts) >= 4
    assert all(n["gpus"] >= 1 and n["node_id"] != head_id() for n in hosts), hosts
    assert {n["labels"]["chorus-accelerator"] for n in hosts} <= {"V100", "A10G"}, hosts
    wait_until(lambda: not workers(), IDLE_TIMEOUT_S + 45, "the worker nodes to go")
    print(f"\nautoscaler: first node {first_node_s:.1f}s, 4 learners joined {joined_s:.1f}s, "
          f"all stepping {all_stepping_s:.1f}s, "
          f"last worker gone {time.time() - ended:.1f}s after the job")


def test_learners_that_take_either_gpu_generation_land_on_both(autoscaling_head, tmp_path):
    """`accelerator_types: [V100, A10G]`: the learners spread over both kinds, the autoscaler
    launches a node of each, and the summary reports each kind's learners and speed."""
    out = tmp_path / "run"
    spec = job_spec("either", learners=2, accelerator_types=["V100", "A10G"], group={"kind": "allreduce"})
    job, thread = start_job(spec, out)
    wait_until(lambda: job.roster and len(job.roster) == 2 and all(s.speed for s in job.roster.live.values()), 180,
               "both learners stepping", thread)
    summary = stop_job(job, thread)
    labels = sorted(n["labels"]["chorus-accelerator"] for n in summary["nodes"])
    assert labels == ["A10G", "V100"], "\n".join([json.dumps(summary["nodes"]), *changes(job)])  # whole: a str
    kinds = summary["accelerators"]
    assert set(kinds) == {"V100", "A10G"} and all(len(k["learners"]) == 1 for k in kinds.values()), kinds
    assert all(k["samples_per_s"] > 0 for k in kinds.values()), kinds
    assert abs(sum(k["share"] for k in kinds.values()) - 1.0) < 0.01, kinds  # allreduce: shares of each step
    wait_until(lambda: not workers(), IDLE_TIMEOUT_S + 45, "the worker nodes to go")


def test_a_sweep_grows_the_cluster_for_its_trials_and_it_shrinks_after(autoscaling_head, tmp_path):
    """Two concurrent trials of 2 learners each: their placement groups (a driver bundle on the
    head's CPUs, a GPU bundle per learner) grow the cluster; the sweep finishes; nodes go after."""
    import ray

    sweep = {"name": "grow", "method": "random", "trials": 2, "max_concurrent": 2, "learners": 2,
             "driver_cpus": 0.5, "budget": {"max": 1, "min": 1},
             "job": {**{k: v for k, v in linear_spec(raw=True).items() if k != "budget"},
                     "name": "grow", "group": {"kind": "gossip"}},
             "space": {"optim.lr": {"type": "float", "low": 0.05, "high": 0.5, "log": True}}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    seen_gpu_nodes = set()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--out", str(tmp_path / "s"),
                             "--address", f"127.0.0.1:{autoscaling_head.gcs_port}"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while proc.poll() is None:
        seen_gpu_nodes |= {n["NodeID"] for n in workers()}
        time.sleep(0.5)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "s" / "sweep_summary.json").read_text())
    assert summary["trials_by_outcome"] == {"finished": 2}, summary
    assert len(seen_gpu_nodes) >= 2, seen_gpu_nodes  # the trials' learners needed GPU nodes
    wait_until(lambda: not workers(), IDLE_TIMEOUT_S + 45, "the worker nodes to go")
    assert not [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


def node_processes(head: HeadNode, node_id: str) -> list[int]:
    """The processes of `head`'s fake node `node_id`: its raylet and everything under it (the
    provider starts each node's processes with the node's id in their environment). Only among
    the head's own processes: every fake cluster numbers its nodes alike (ff..f00001, ...), so a
    test beside this one (another pytest-xdist worker) has nodes with the same ids."""
    found = []
    for pid in head.pids():
        try:
            if f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node_id}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_worker_node_lost_under_a_job_is_replaced_and_a_learner_joins_there(one_node_per_type_head, tmp_path):
    """A spot loss: every process of one worker node is killed under a running job. The job
    goes on with the learners it has, the autoscaler replaces the node (at most one per type: no
    spare node can take the learner instead), and a learner joins on the new node."""
    job, thread = start_job(job_spec("spot", learners={"min": 1, "max": 2}), tmp_path / "run")
    wait_until(lambda: len(joins(job)) >= 2, 180, "2 learners joined", thread)
    victim = joins(job)[0]["node"]  # a node that hosts a learner (the autoscaler may have launched an idle one too)
    nodes_before = {n["NodeID"] for n in workers()}
    pids = node_processes(one_node_per_type_head, victim)
    assert pids, "found no process of the node to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    lost_at = time.time()
    wait_until(lambda: any(e["kind"] == "failure" for e in job.events.recorded), 60, "the learner's loss", thread)
    newcomer = wait_until(lambda: [e for e in joins(job) if e["node"] not in nodes_before], 180,
                          "a learner joining on a node launched after the loss", thread)[0]["learner"]
    rejoined_s = time.time() - lost_at
    wait_until(lambda: [r for r in job.recoveries if r["cause"] == "join" and r["learner"] == newcomer
                        and r["stepping_at"]], 60, "the newcomer stepping in the group", thread)
    summary = stop_job(job, thread)
    assert summary["events"]["failure"] >= 1 and summary["learners"] == 2, summary
    print(f"\nspot loss: a learner joined on the replacement node {rejoined_s:.1f}s after the kill")
