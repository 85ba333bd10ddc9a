"""Elastic membership: the shard planner's epoch splits (no Ray), and jobs whose learners die,
join and wait for capacity on real local Ray clusters."""

import numpy as np
import pytest

from jobs.data.manifests import shard_batches
from orchestrator.service.shards import ShardPlanner


def _covered(planner: ShardPlanner, durations, epoch: int, learners: list[int]) -> list[int]:
    """Utterances the given learners train on in `epoch`, each asking the planner for its shard."""
    seen = []
    for learner_id in learners:
        assignment = planner.assignment(learner_id, epoch)
        if assignment is not None:
            rank, world, weights = assignment
            seen += [i for b in shard_batches(durations, 20.0, epoch, 0, rank, world, weights) for i in b]
    return sorted(seen)


@pytest.mark.unit
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
    # a checkpoint whose learners are all in epoch 2 or later keeps only those epochs' splits
    # (its size does not grow with the epochs behind it), and they are the same splits
    pruned = planner.state(from_epoch=2)
    assert [run[:2] for run in pruned["splits"]] == [[2, 2], [3, 3]]  # epochs 2 and 3 are split differently
    later = ShardPlanner()
    later.load(pruned)
    assert [later.assignment(i, e) for i in (0, 1, 2) for e in (2, 3, 4)] == \
           [planner.assignment(i, e) for i in (0, 1, 2) for e in (2, 3, 4)]
    # epochs split the same way are one run: the plan's size does not grow with epochs
    for epoch in range(5, 300):
        planner.assignment(0, epoch)
    assert [run[:2] for run in planner.state(from_epoch=2)["splits"]] == [[2, 2], [3, 299]]
    # a checkpoint written before the runs (every epoch under "frozen") still loads
    old = ShardPlanner()
    old.load({"members": [0, 2], "weights": [0.75, 0.25], "frozen": {"0": ([0, 1], None), "3": ([0, 2], [0.75, 0.25])}})
    assert old.assignment(1, 0) == (1, 2, None) and old.assignment(2, 3) == (1, 2, [0.75, 0.25])


@pytest.mark.unit
def test_a_learner_that_joined_later_is_told_its_first_epoch_with_a_shard():
    planner = ShardPlanner([0, 1])
    for epoch in range(5):  # free-running learners: the fastest has already split epochs 0-4
        planner.assignment(0, epoch)
    planner.set_members([0, 1, 2])
    # a newcomer that adopted a slow neighbour's epoch 1 goes straight to epoch 5, the first split with it
    assert planner.first_epoch_with(2, 1) == 5
    assert planner.assignment(2, 5) == (2, 3, None)
    assert planner.first_epoch_with(2, 5) == 5 and planner.first_epoch_with(1, 2) == 2  # members stay
    assert planner.first_epoch_with(2, 7) == 7  # an epoch nobody has reached
    planner.set_members([0, 2])
    assert planner.first_epoch_with(1, 6) is None  # no longer a member: no epoch ahead


@pytest.mark.unit
def test_a_free_running_newcomer_moves_to_its_first_epoch_in_one_idle_step():
    from orchestrator.groups.replica import next_batch_or_new_epoch
    from orchestrator.learner.replica import Learner
    from tests.builders import linear_spec

    planner = ShardPlanner([0, 1])
    for epoch in range(5):
        planner.assignment(0, epoch)
    planner.set_members([0, 1, 2])
    config = linear_spec().workload_config.model_dump(mode="json")
    newcomer = Learner("linear", config, seed=0, learner_id=2, planner=planner)
    newcomer.epoch = 1  # adopted from a neighbour still in epoch 1
    assert next_batch_or_new_epoch(newcomer) is None  # no shard in epoch 1: this step trains nothing
    assert newcomer.epoch == 5
    assert next_batch_or_new_epoch(newcomer) is not None  # its shard of epoch 5, at the next step


@pytest.mark.unit
def test_a_newcomer_the_planner_does_not_count_yet_neither_splits_epochs_nor_moves_on():
    from orchestrator.groups.replica import next_batch_or_new_epoch
    from orchestrator.learner.replica import Learner
    from tests.builders import linear_spec

    planner = ShardPlanner([0, 1])
    for epoch in range(5):
        planner.assignment(0, epoch)
    config = linear_spec().workload_config.model_dump(mode="json")
    newcomer = Learner("linear", config, seed=0, learner_id=2, planner=planner)
    newcomer.epoch = 3  # adopted; the driver's set_members([0, 1, 2]) has not reached the planner
    for _ in range(3):  # idle steps: it stays in epoch 3 and fixes no epoch ahead of the others
        assert next_batch_or_new_epoch(newcomer) is None
    assert newcomer.epoch == 3 and max(planner.frozen) == 4
    assert planner.assignment(2, 6) is None and 6 not in planner.frozen
    planner.set_members([0, 1, 2])
    assert next_batch_or_new_epoch(newcomer) is None and newcomer.epoch == 5  # now to its first epoch
    assert next_batch_or_new_epoch(newcomer) is not None and planner.frozen[5][0] == [0, 1, 2]


# -- on a real 3-node cluster -----------------------------------------------------------------------
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from orchestrator.cluster.runtime import fetch  # noqa: E402
from orchestrator.driver.config import parse_spec  # noqa: E402
from orchestrator.driver.job import TrainingJob  # noqa: E402
from orchestrator.testing.cluster import wait_until  # noqa: E402
from tests.builders import (  # noqa: E402
    assert_nothing_left,
    leftovers_of,
    linear_spec,
    run_cli,
    run_in_thread,
    stop_job,
)

# the tiny linear workload (tests/builders.py `linear_spec`): these tests are about orchestration
LINEAR = {k: v for k, v in linear_spec(raw=True).items() if k in ("workload", "data", "optim")}


@pytest.fixture
def chaos_cluster(private_cluster):
    """A cluster of the test's own plus node B (1 CPU, 1 `learner_slot`): three nodes, of which
    the worker (node A, 2 slots) and B can hold learners; the head (the driver's node) cannot."""
    node_b = private_cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    private_cluster.wait_for_nodes()
    return private_cluster, private_cluster.session_worker, node_b


def _wait_for(what: str, condition, job_thread, timeout: float = 120.0):
    """The shared wait (`orchestrator.testing.cluster.wait_until`), failing as soon as the job ended."""
    return wait_until(what, condition, timeout, poll=0.2, job=job_thread)


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("kind", ["gossip", "allreduce", "hierarchical"])
def test_chaos_kill_a_learner_lose_a_node_gain_a_node(chaos_cluster, tmp_path, kind):
    import ray

    cluster, node_a, node_b = chaos_cluster
    spec = parse_spec({
        "name": f"chaos-{kind}", "learners": {"min": 2, "max": 3, "wait_timeout_s": 120},
        "learner_resources": {"learner_slot": 1}, "group": {"kind": kind},
        **LINEAR, "budget": {"epochs": 10_000, "wall_seconds": 400}})
    job = TrainingJob(spec, tmp_path)
    thread = run_in_thread(job)
    outcome = thread.outcome
    events = lambda kind, **match: [e for e in (job.events.recorded if job.events else [])  # noqa: E731
                                    if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
    stepping = lambda cause, learner: [r for r in job.recoveries  # noqa: E731
                                       if r["cause"] == cause and r["learner"] == learner and r["stepping_at"]]
    _wait_for("3 learners and a first evaluation", lambda: len(events("join")) == 3 and job.evals, thread)

    # 1. kill one learner on node A: it is dropped, its slot is placed again, a new learner joins
    on_a = [s for s in job.roster.live.values() if s.node == node_a.node_id]
    victim = on_a[0].id
    ray.kill(on_a[0].handle)
    _wait_for("the killed learner's failure", lambda: events("failure", learner=victim), thread)
    replacement = _wait_for("a replacement joining", lambda: [e for e in events("join") if e["learner"] > 2],
                            thread)[0]["learner"]
    _wait_for("the group stepping with the replacement", lambda: stepping("join", replacement), thread)

    # 2. remove node B with its learner: dropped, the job goes on with the two on A (= min)
    on_b = [s.id for s in job.roster.live.values() if s.node == node_b.node_id]
    assert len(on_b) == 1
    cluster.remove_node(node_b, allow_graceful=False)
    _wait_for("node B's learner failing", lambda: events("failure", learner=on_b[0]), thread)
    _wait_for("the group stepping without it", lambda: stepping("failure", on_b[0]), thread)
    assert len(job.roster.live) == 2

    # 3. add node C: the slot that was waiting for capacity is placed there and its learner joins
    node_c = cluster.add_node(num_cpus=1, resources={"learner_slot": 1})
    newcomer = _wait_for("a learner joining on node C", lambda: events("join", node=node_c.node_id),
                         thread)[0]["learner"]
    _wait_for("the group stepping with it", lambda: stepping("join", newcomer), thread)
    steps_then = max(s.stats["step"] for s in job.roster.live.values())
    _wait_for("a few more steps", lambda: max(s.stats.get("step", 0) for s in job.roster.live.values())
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
    assert_nothing_left(f"{job_id}/", placement_groups=5)


@pytest.mark.ray
def test_train_waits_for_min_learners_then_gives_up_cleanly(ray_cluster, tmp_path):
    """The learners' capacity exists but another holder has it: `chorus train` says what it waits
    for, exits non-zero after learners.wait_timeout_s and leaves nothing on the cluster."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    holder = placement_group([{"learner_slot": 2}], name="someone-else")  # both of the cluster's slots
    ray.get(holder.ready(), timeout=60)
    try:
        spec = tmp_path / "wait.yaml"
        spec.write_text(json.dumps({
            "name": "waits", "learners": {"min": 2, "max": 3, "wait_timeout_s": 4},
            "learner_resources": {"learner_slot": 1}, "group": {"kind": "gossip"},
            **LINEAR, "budget": {"epochs": 1}}))
        started = time.time()
        proc = run_cli("train", str(spec), "--out", str(tmp_path / "run"), "--address", ray_cluster.address,
                       timeout=120)
    finally:
        remove_placement_group(holder)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "0 of at least 2 learners placed; waiting for capacity for 2 more ({'CPU': 1.0, 'learner_slot': 1.0} " \
        "each; free now: {'CPU': 4.0, 'learner_slot': 0})" in proc.stderr, proc.stderr
    assert "gave up waiting for capacity for 2 more" in proc.stderr
    assert "after 4 s (learners.wait_timeout_s); nothing of the job is left on the cluster" in proc.stderr
    assert time.time() - started < 60
    waiting = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in waiting] == ["waiting"] and waiting[0]["min"] == 2
    assert_nothing_left("waits-", placement_groups=3)


@pytest.mark.ray
@pytest.mark.parametrize("ask, advice", [
    ({"learners": 5, "cpus_per_learner": 1},
     "learners.min is 5 learners of {CPU: 1}, but this cluster has no autoscaler and holds at most 4 (2 nodes: "
     "4 CPUs, 0 GPUs in all); lower learners.min (or learners), or cpus_per_learner (now 1; e.g. 0.5)"),
    ({"learners": {"min": 2, "max": 3}, "learner_resources": {"a100": 1}},
     "learners.min is 2 learners of {CPU: 1, a100: 1}, but this cluster has no autoscaler and holds at most 0"),
    ({"learners": 2, "accelerator": "gpu"},
     "learners.min is 2 learners of {CPU: 1, GPU: 1}, but this cluster has no autoscaler and holds at most 0 "
     "(2 nodes: 4 CPUs, 0 GPUs in all); lower learners.min (or learners), or set accelerator: cpu"),
])
def test_a_minimum_no_node_can_ever_hold_fails_at_once_with_advice(ray_cluster, tmp_path, ask, advice):
    """On a cluster without an autoscaler, learners that can never all be placed are refused
    at once (not after learners.wait_timeout_s), saying what the cluster has and what to change."""
    spec = tmp_path / "never.yaml"
    spec.write_text(json.dumps({
        "name": "never", "learners": ask["learners"], "group": {"kind": "gossip"},
        **{k: v for k, v in ask.items() if k != "learners"},
        **LINEAR, "budget": {"epochs": 1}}))
    started = time.time()
    proc = run_cli("train", str(spec), "--out", str(tmp_path / "run"), "--address", ray_cluster.address,
                   timeout=120)  # learners.wait_timeout_s: 600 s
    assert proc.returncode == 3, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("chorus:")]
    assert len(said) == 1 and advice in said[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.time() - started < 60  # not learners.wait_timeout_s (600 s)
    assert_nothing_left("never-", placement_groups=0)


@pytest.mark.unit
def test_balance_helpers():
    from orchestrator.groups.balance import batch_shares, ring_by_speed

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


@pytest.mark.ray
def test_node_inventory_lists_custom_resources(ray_cluster):
    from orchestrator.cluster.resources import node_inventory

    nodes = {n["node_id"]: n for n in node_inventory()}
    worker = nodes[ray_cluster.session_worker.node_id]
    assert worker["custom"] == {"learner_slot": 2.0} and worker["cpus"] == 2.0 and worker["accelerator"] is None
    assert len(nodes) == 2



def _running_job(tmp_path, name: str, kind: str, learners: dict):
    """A job of `kind` with `learners` on the session cluster, started in a thread; returns (job,
    thread, events(kind) -> its events of that kind so far)."""
    spec = parse_spec({
        "name": name, "learners": learners, "group": {"kind": kind},
        **LINEAR, "budget": {"epochs": 10_000, "wall_seconds": 300}})
    job = TrainingJob(spec, tmp_path)
    events = lambda kind: [e for e in (job.events.recorded if job.events else []) if e["kind"] == kind]  # noqa: E731
    return job, run_in_thread(job), events


@pytest.mark.ray
@pytest.mark.parametrize("kind", ["gossip", "allreduce"])
def test_a_stuck_learner_is_killed_dropped_and_replaced(ray_session, tmp_path, kind):
    """A learner that hangs inside a step (alive, answering pings) is declared stuck after
    learners.stuck_after_s, killed and dropped; its slot is placed again and the job goes on."""
    job, thread, events = _running_job(tmp_path, f"stuck-{kind}", kind,
                                       {"min": 2, "max": 2, "stuck_after_s": 6, "stuck_step_multiple": 5})
    _wait_for("2 learners and a first evaluation", lambda: len(events("join")) == 2 and job.evals, thread)
    victim = job.roster.live[0]
    stalled_at = time.time()
    victim.handle.simulate_stall.remote(3600)
    failure = _wait_for("the stuck learner's failure", lambda: [e for e in events("failure") if e["learner"] == 0],
                        thread, timeout=60)[0]
    assert failure["error"].startswith("stuck: "), failure
    assert failure["time"] - stalled_at < 6 + 15, failure  # its limit plus a few heartbeats and a chunk
    _wait_for("a replacement joining", lambda: [e for e in events("join") if e["learner"] == 2], thread)
    _wait_for("the group stepping with it", lambda: [r for r in job.recoveries if r["cause"] == "join"
                                                     and r["learner"] == 2 and r["stepping_at"]], thread)
    assert stop_job(job, thread)["learners"] == 2


@pytest.mark.slow
def test_rank_0_dying_while_the_group_re_forms_drops_only_it(ray_session, tmp_path):
    """allreduce, 3 learners: one is killed; while the group re-forms, rank 0 dies as it joins (the
    other member waits for it at the rendezvous). Only those two are dropped: the third stays in
    the job throughout, new learners take the free slots, and the job ends cleanly."""
    job, thread, events = _running_job(tmp_path, "reform", "allreduce",
                                       {"min": 2, "max": 3, "wait_timeout_s": 120})
    _wait_for("3 learners and a first evaluation", lambda: len(events("join")) == 3 and job.evals, thread)
    rank0, healthy, victim = job.roster.order
    fetch(job.roster.live[rank0].handle.simulate_exit_in_join.remote())
    import ray

    ray.kill(job.roster.live[victim].handle)
    _wait_for("both failures", lambda: {e["learner"] for e in events("failure")} >= {rank0, victim}, thread, 90)
    _wait_for("two newcomers stepping", lambda: len([r for r in job.recoveries if r["cause"] == "join"
                                                     and r["stepping_at"]]) == 2, thread)
    summary = stop_job(job, thread)
    assert {e["learner"] for e in events("failure")} == {rank0, victim}, events("failure")
    assert healthy not in {e["learner"] for e in events("leave")}
    assert summary["learners"] == 3


@pytest.mark.ray
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_no_exit_path_of_chorus_train_leaves_anything_on_the_cluster(ray_cluster, tmp_path, how):
    """`chorus train` on the session cluster, ended by Ctrl-C, SIGTERM (what `chorus jobs stop` and
    `ray job stop` send) or SIGKILL once it has evaluated: no actor, placement group or
    autoscaler request of the job is left (Ray removes a dead driver's; a signalled one releases
    its own and says where its checkpoint is)."""
    import signal
    import subprocess
    import sys

    name = f"exit-{how.lower()}"
    spec = tmp_path / "job.yaml"
    spec.write_text(json.dumps({
        "name": name, "learners": 2, "group": {"kind": "gossip"},
        **LINEAR, "budget": {"epochs": 10_000, "wall_seconds": 300}}))
    command = [sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", str(tmp_path / "run"),
               "--address", ray_cluster.address]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            for line in proc.stdout:  # the first evaluation line: learners placed, a checkpoint written
                if line.startswith("epoch "):
                    break
            assert leftovers_of(f"{name}-").get("actors"), "the job's learners were not found"
            proc.send_signal(getattr(signal, how))
            proc.communicate(timeout=60)
        finally:
            proc.kill()
    stderr = (tmp_path / "stderr").read_text()
    if how == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + getattr(signal, how), stderr
        assert "learners released; the last checkpoint is" in stderr and "Traceback" not in stderr, stderr
    assert_nothing_left(f"{name}-", within=30)


def _chaos_job(tmp_path, name: str, kind: str) -> tuple[TrainingJob, threading.Thread]:
    spec = parse_spec({
        "name": name, "learners": {"min": 1, "max": 2}, "learner_resources": {"learner_slot": 1},
        "group": {"kind": kind}, **LINEAR,
        "budget": {"epochs": 10_000, "wall_seconds": 300, "eval_every_seconds": 5}})
    job = TrainingJob(spec, tmp_path)
    return job, run_in_thread(job)


def _events(job, kind: str) -> list[dict]:
    return [e for e in (job.events.recorded if job.events else []) if e["kind"] == kind]


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("kind", ["gossip", "allreduce"])
def test_a_drained_nodes_learners_leave_the_group_cleanly(chaos_cluster, tmp_path, kind):
    """`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION` (what the autoscaler does before a
    spot node goes): its learners finish their step, leave (gossip: a neighbour keeps their last
    average), a `drain` event names the reason, nothing counts as a failure, their slots are asked
    for again and the others step on."""
    import subprocess
    import sys

    cluster, node_a, _ = chaos_cluster
    job, thread = _chaos_job(tmp_path, f"drain-{kind}", kind)
    _wait_for("2 learners and an evaluation", lambda: len(_events(job, "join")) == 2 and job.evals, thread)
    joined = {e["learner"]: e["node"] for e in _events(job, "join")}
    victim = next((n for n in joined.values() if n == node_a.node_id), joined[0])
    on_victim = sorted(i for i, n in joined.items() if n == victim)
    ray_cli = str(Path(sys.executable).parent / "ray")
    drained = subprocess.run([ray_cli, "drain-node", "--address", cluster.address, "--reason",
                              "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot",
                              "--deadline-remaining-seconds", "120", "--node-id", victim],
                             capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0, drained.stderr
    drains = _wait_for("every learner of the node to leave", lambda: len(_events(job, "drain")) == len(on_victim)
                       and _events(job, "drain"), thread, timeout=60)
    assert sorted(e["learner"] for e in drains) == on_victim, drains
    assert all("is being drained" in e["reason"] for e in drains), drains
    if kind == "gossip" and len(on_victim) < 2:
        assert all(e["kept_by"] is not None for e in drains), drains
    _wait_for("the group stepping again", lambda: [r for r in job.recoveries if r["cause"] == "drain"
                                                  and r["stepping_at"]], thread, timeout=90)
    summary = stop_job(job, thread)
    assert summary["events"].get("failure", 0) == 0, summary["events"]
    later = [e for e in _events(job, "join") if e["learner"] not in joined]
    assert all(e["node"] != victim for e in later), later  # no slot asked for again lands on the drained node


@pytest.mark.slow
@pytest.mark.own_process
def test_a_learner_sent_sigterm_leaves_gracefully(chaos_cluster, tmp_path):
    """SIGTERM to a learner's process (a preempted pod, a `kill`): it ends the step in flight and
    leaves like a drained one, its last average kept by its neighbour; nothing counts as a failure."""
    import os
    import signal

    job, thread = _chaos_job(tmp_path, "sigterm", "gossip")
    _wait_for("2 learners and an evaluation", lambda: len(_events(job, "join")) == 2 and job.evals, thread)
    victim = _events(job, "join")[0]
    os.kill(victim["pid"], signal.SIGTERM)
    drain = _wait_for("the learner to leave", lambda: _events(job, "drain"), thread, timeout=60)[0]
    assert drain["learner"] == victim["learner"] and drain["reason"] == "SIGTERM" and drain["kept_by"] is not None
    _wait_for("a replacement joining", lambda: len(_events(job, "join")) == 3, thread, timeout=90)
    summary = stop_job(job, thread)
    assert summary["events"].get("failure", 0) == 0, summary["events"]


@pytest.mark.ray
def test_a_learner_leaving_mid_epoch_hands_over_what_it_had_not_read(ray_session, tmp_path):
    """SIGTERM to one of 3 allreduce learners on an epoch budget: it leaves at its step's end, the
    rest of its part of the epoch goes to the planner, a learner done with its own part reads it,
    and the job trains every sample exactly once an epoch (6 epochs of 4,800) however the
    membership changed."""
    import os
    import signal

    data = {**LINEAR["data"], "samples": 4800, "compute_seconds": 0.02}
    spec = parse_spec({"name": "handover", "learners": {"min": 2, "max": 3}, "group": {"kind": "allreduce",
                       "balance": False}, **LINEAR, "data": data, "budget": {"epochs": 6}})
    job = TrainingJob(spec, tmp_path)
    thread = run_in_thread(job)
    _wait_for("3 learners and an evaluation", lambda: len(_events(job, "join")) == 3 and job.evals, thread)
    os.kill(_events(job, "join")[0]["pid"], signal.SIGTERM)
    drain = _wait_for("the learner to leave", lambda: _events(job, "drain"), thread, timeout=60)[0]
    thread.join(timeout=180)
    assert not thread.is_alive() and "error" not in thread.outcome, thread.outcome.get("error")
    summary = thread.outcome["summary"]
    assert summary["samples"] == 6 * 4800, (summary["samples"], drain)
    assert summary["events"].get("failure", 0) == 0 and drain["reason"] == "SIGTERM"
    assert_nothing_left("handover-", within=30.0)
