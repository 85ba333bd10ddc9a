"""Elastic membership: the shard planner's epoch splits (no Ray), and jobs whose learners die,
join and wait for capacity on real local Ray clusters."""

import numpy as np

from jobs.data import shard_batches
from orchestrator.shards import ShardPlanner


def _covered(planner: ShardPlanner, durations, epoch: int, learners: list[int]) -> list[int]:
    """Utterances the given learners train on in `epoch`, each asking the planner for its shard."""
    seen = []
    for learner_id in learners:
        assignment = planner.assignment(learner_id, epoch)
        if assignment is not None:
            rank, world, weights = assignment
            seen += [i for b in shard_batches(durations, 20.0, epoch, 0, rank, world, weights) for i in b]
    return sorted(seen)


def test_planner_fixes_each_epochs_split_when_first_asked():
    durations = np.random.default_rng(3).uniform(0.5, 6.0, size=150)
    planner = ShardPlanner([0, 1])
    assert planner.assignment(0, 0) == (0, 2, None)  # epoch 0 is now split between 0 and 1
    # learner 2 joins while epoch 0 runs: from epoch 1 on (nobody has started it)
    assert planner.set_members([0, 1, 2]) == 1
    assert planner.assignment(2, 0) is None  # no shard in the epoch already split
    assert _covered(planner, durations, 0, [0, 1, 2]) == list(range(150))
    assert _covered(planner, durations, 1, [0, 1, 2]) == list(range(150))
    assert planner.assignment(2, 1) == (2, 3, None)
    # learner 1 dies after learner 0 already reached epoch 2: epoch 2 keeps its split (learner 1's
    # shard of it is lost), epoch 3 is split between the two left, by weight
    planner.assignment(0, 2)
    assert planner.set_members([0, 2], weights=[0.75, 0.25]) == 3
    assert _covered(planner, durations, 3, [0, 2]) == list(range(150))
    rank0 = planner.assignment(0, 3)
    assert rank0 == (0, 2, [0.75, 0.25])
    # its state round-trips (a checkpoint keeps the plan, so a resumed job continues its epoch)
    again = ShardPlanner()
    again.load(planner.state())
    assert [again.assignment(i, e) for i in (0, 1, 2) for e in range(4)] == \
           [planner.assignment(i, e) for i in (0, 1, 2) for e in range(4)]


# -- on a real 3-node cluster -----------------------------------------------------------------------
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from orchestrator.config import parse_spec  # noqa: E402
from orchestrator.job import TrainingJob  # noqa: E402


@pytest.fixture
def chaos_cluster(ray_cluster):
    """The session cluster plus node B (1 CPU, 1 `learner_slot`): three nodes, of which the
    session's worker (node A, 2 slots) and B can hold learners; the head (the driver's node)
    cannot. Nodes the test adds are removed afterwards, so the session keeps its two."""
    import ray

    before = set(ray_cluster.worker_nodes)
    node_b = ray_cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    ray_cluster.wait_for_nodes()
    try:
        yield ray_cluster, ray_cluster.session_worker, node_b
    finally:
        for node in set(ray_cluster.worker_nodes) - before:
            ray_cluster.remove_node(node, allow_graceful=False)
        deadline = time.time() + 30
        while len([n for n in ray.nodes() if n["Alive"]]) > 2 and time.time() < deadline:
            time.sleep(0.2)


def _wait_for(what: str, condition, job_thread, timeout: float = 120.0):
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` or
    when the job ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        assert job_thread.is_alive(), f"the job ended while waiting for {what}: {job_thread.outcome}"
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.mark.parametrize("kind", ["gossip", "allreduce", "hierarchical"])
def test_chaos_kill_a_learner_lose_a_node_gain_a_node(chaos_cluster, corpus, tmp_path, kind):
    import ray
    from ray.util import placement_group_table

    cluster, node_a, node_b = chaos_cluster
    spec = parse_spec({
        "name": f"chaos-{kind}", "learners": {"min": 2, "max": 3, "wait_timeout_s": 120},
        "learner_resources": {"learner_slot": 1}, "group": {"kind": kind},
        "data": {"train": str(corpus / "train.jsonl"), "dev": str(corpus / "dev.jsonl"), "max_batch_seconds": 10},
        "optim": {"lr": 3e-3, "warmup_steps": 10, "schedule": "constant"},
        "budget": {"epochs": 10_000, "wall_seconds": 400}})
    job = TrainingJob(spec, tmp_path)
    outcome = {}

    def run():
        try:
            outcome["summary"] = job.run()
        except BaseException as exc:  # noqa: BLE001 - the test asserts none escapes
            import traceback

            outcome["error"] = f"{exc!r}\n{traceback.format_exc()}"

    thread = threading.Thread(target=run, daemon=True)
    thread.outcome = outcome
    thread.start()
    events = lambda kind, **match: [e for e in (job.events.recorded if job.events else [])  # noqa: E731
                                    if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
    stepping = lambda cause, learner: [r for r in job.recoveries  # noqa: E731
                                       if r["cause"] == cause and r["learner"] == learner and r["stepping_at"]]
    _wait_for("3 learners and a first evaluation", lambda: len(events("join")) == 3 and job.evals, thread)

    # 1. kill one learner on node A: it is dropped, its slot is placed again, a new learner joins
    on_a = [s for s in job.membership.live.values() if s.node == node_a.node_id]
    victim = on_a[0].id
    ray.kill(on_a[0].handle)
    _wait_for("the killed learner's failure", lambda: events("failure", learner=victim), thread)
    replacement = _wait_for("a replacement joining", lambda: [e for e in events("join") if e["learner"] > 2],
                            thread)[0]["learner"]
    _wait_for("the group stepping with the replacement", lambda: stepping("join", replacement), thread)

    # 2. remove node B with its learner: dropped, the job goes on with the two on A (= min)
    on_b = [s.id for s in job.membership.live.values() if s.node == node_b.node_id]
    assert len(on_b) == 1
    cluster.remove_node(node_b, allow_graceful=False)
    _wait_for("node B's learner failing", lambda: events("failure", learner=on_b[0]), thread)
    _wait_for("the group stepping without it", lambda: stepping("failure", on_b[0]), thread)
    assert len(job.membership.live) == 2

    # 3. add node C: the slot that was waiting for capacity is placed there and its learner joins
    node_c = cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    newcomer = _wait_for("a learner joining on node C", lambda: events("join", node=node_c.node_id),
                         thread)[0]["learner"]
    _wait_for("the group stepping with it", lambda: stepping("join", newcomer), thread)
    steps_then = max(s.stats["step"] for s in job.membership.live.values())
    _wait_for("a few more steps", lambda: max(s.stats.get("step", 0) for s in job.membership.live.values())
              >= steps_then + 8, thread)
    job.stop()
    thread.join(timeout=180)
    assert not thread.is_alive(), "the job did not stop"
    assert "error" not in outcome, repr(outcome.get("error"))
    summary = outcome["summary"]

    logged = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert logged == job.events.recorded  # every event is in events.jsonl
    kinds = [e["kind"] for e in logged]
    assert kinds.count("failure") == 2 and kinds.count("leave") == 2 and kinds.count("join") == 5, kinds
    assert summary["learners"] == 3 and summary["events"]["join"] == 5
    hosts = {n["node_id"]: n for n in summary["nodes"]}  # the inventory of the nodes learners ran on
    assert set(hosts) == {node_a.node_id, node_b.node_id, node_c.node_id}
    assert hosts[node_b.node_id].get("gone") and hosts[node_c.node_id]["custom"] == {"learner_slot": 1.0}
    assert len(hosts[node_a.node_id]["learners"]) == 3  # two at the start, the replacement
    assert summary["final_train_loss"] < summary["first_train_loss"]
    # the replacement and the newcomer took the group's weights: they started from its step count
    assert all(r["stepping_at"] for r in summary["recoveries"]), summary["recoveries"]
    first_kill = kinds.index("failure")  # every join before it was one of the first members
    changes = [(e["kind"], e["learner"]) for e in logged[first_kill:] if e["kind"] in ("join", "failure")]
    assert sorted((r["cause"], r["learner"]) for r in summary["recoveries"]) == sorted(changes), summary["recoveries"]
    job_id = summary["job_id"]
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"{job_id}/")]
    groups = [g for g in placement_group_table().values() if g["name"].startswith(f"{job_id}/")]
    assert len(groups) == 5 and all(g["state"] == "REMOVED" for g in groups), groups


def test_train_waits_for_min_learners_then_gives_up_cleanly(ray_cluster, corpus, tmp_path):
    """No node offers the resource the learners ask for: `chorus train` says what it waits for,
    exits non-zero after learners.wait_timeout_s and leaves nothing on the cluster."""
    import subprocess
    import sys

    import ray
    from ray.util import placement_group_table

    spec = tmp_path / "wait.yaml"
    spec.write_text(json.dumps({
        "name": "waits", "learners": {"min": 2, "max": 3, "wait_timeout_s": 4},
        "learner_resources": {"a100": 1}, "group": {"kind": "gossip"},
        "data": {"train": str(corpus / "train.jsonl"), "max_batch_seconds": 10}, "budget": {"epochs": 1}}))
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", str(tmp_path / "run"),
                           "--address", ray_cluster.address], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "0 of at least 2 learners placed; waiting for capacity for 2 more ({'CPU': 1.0, 'a100': 1.0} each; " \
        "free now: {'CPU': 4.0, 'a100': 0})" in proc.stderr, proc.stderr
    assert "gave up waiting for capacity for 2 more" in proc.stderr
    assert "after 4 s (learners.wait_timeout_s); nothing of the job is left on the cluster" in proc.stderr
    assert time.time() - started < 60
    waiting = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in waiting] == ["waiting"] and waiting[0]["min"] == 2
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("waits-")]
    groups = [g for g in placement_group_table().values() if g["name"].startswith("waits-")]
    assert len(groups) == 3 and all(g["state"] == "REMOVED" for g in groups), groups


def test_balance_helpers():
    from orchestrator.placement import batch_shares, ring_by_speed

    assert batch_shares([30.0, 10.0]) == [0.75, 0.25]
    with pytest.raises(ValueError, match="positive"):
        batch_shares([1.0, 0.0])
    # a learner already under half an equal share that still straggles sits out, and stays out
    steps = [0.17, 0.18, 0.17, 0.27]
    assert batch_shares([60.0, 60.0, 60.0, 9.0], [0.3, 0.3, 0.3, 0.1], steps) == [0.3333, 0.3333, 0.3333, 0.0]
    assert batch_shares([60.0, 60.0, 60.0, 9.0], [0.33, 0.33, 0.34, 0.0], [0.17, 0.18, 0.17, 0.0])[3] == 0.0
    # ... as does one whose speed gives it under half an equal share and that has about that share
    near = [0.2, 0.21, 0.21, 0.48]
    assert batch_shares([53.0, 51.0, 50.0, 19.0], [0.28, 0.3, 0.29, 0.13], near)[3] == 0.0
    assert batch_shares([53.0, 51.0, 50.0, 19.0], [0.22, 0.22, 0.22, 0.34], near)[3] > 0  # not tried yet
    # at an equal share, or once it keeps up, a slow learner keeps a share proportional to its speed
    assert batch_shares([60.0, 60.0, 60.0, 20.0], [0.25] * 4, steps) == [0.3, 0.3, 0.3, 0.1]
    assert batch_shares([60.0, 60.0, 60.0, 9.0], [0.3, 0.3, 0.3, 0.1], [0.17, 0.18, 0.17, 0.19])[3] > 0
    assert batch_shares([50.0, 9.0], [0.0, 0.1], [0.0, 0.3]) == [0.0, 1.0]  # never everyone out
    # 5 learners: the 3 fastest active (even positions), the 2 slowest passive (odd positions)
    ring = ring_by_speed({7: 10.0, 3: 50.0, 4: 45.0, 9: 60.0, 1: 20.0})
    assert ring[0::2] == [9, 3, 4] and ring[1::2] == [1, 7]


def test_node_inventory_lists_custom_resources(ray_cluster):
    from orchestrator.placement import node_inventory

    nodes = {n["node_id"]: n for n in node_inventory()}
    worker = nodes[ray_cluster.session_worker.node_id]
    assert worker["custom"] == {"learner_slot": 2.0} and worker["cpus"] == 2.0 and worker["accelerator"] is None
    assert len(nodes) == 2
