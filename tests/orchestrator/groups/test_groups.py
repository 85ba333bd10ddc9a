"""Learner groups on a real local Ray instance: gossip averaging, allreduce agreement, jobs."""

import time
import urllib.request

import pytest
import torch

from orchestrator.checkpoint import files as checkpoint
from orchestrator.cluster.runtime import fetch
from orchestrator.driver.config import parse_spec
from orchestrator.driver.job import TrainingJob
from orchestrator.driver.metrics import prometheus_names
from orchestrator.groups.allreduce import AllreduceMember
from orchestrator.groups.gossip import GossipMember, ring_partners
from orchestrator.groups.registry import call
from orchestrator.workload import build_workload
from tests.builders import assert_nothing_left, linear_spec


def _job_metrics(ray, job_id: str) -> dict[str, dict[tuple, float]]:
    """Every Chorus series of `job_id` on every node's metrics exporter: {name: {labels: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    series: dict[str, dict[tuple, float]] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        text = urllib.request.urlopen(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics",
                                      timeout=10).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("ray_chorus_") and sample.labels.get("chorus_job") == job_id:
                    labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                          if k in ("learner", "split", "group", "le")))
                    by_labels = series.setdefault(sample.name, {})
                    by_labels[labels] = by_labels.get(labels, 0.0) + sample.value
    return series


def _consensus(actors):
    w = torch.stack(fetch([a.weights.remote() for a in actors]))
    return float((w - w.mean(0)).norm(dim=1).mean())


@pytest.mark.unit
def test_ring_partners_are_passive_neighbours():
    assert ring_partners(0, 1) == [] and ring_partners(1, 2) == []
    assert ring_partners(0, 2) == [1]
    assert ring_partners(0, 3) == [1] and ring_partners(2, 3) == [1]  # odd ring: both actives reach 1
    assert ring_partners(0, 4) == [1, 3] and ring_partners(2, 4) == [1, 3]
    assert ring_partners(4, 5) == [3]
    for n in range(2, 9):  # every passive position is some active position's partner
        reached = {q for p in range(0, n, 2) for q in ring_partners(p, n)}
        assert reached == set(range(1, n, 2))


@pytest.mark.ray
def test_one_averaging_leaves_both_partners_identical(learners):
    a, b = learners(2)
    fetch([a.join.remote(GossipMember(0, [b])), b.join.remote(GossipMember(1, []))])
    fetch([a.perturb.remote(0.1, 1), b.perturb.remote(0.1, 2)])
    wa, wb = fetch([a.weights.remote(), b.weights.remote()])
    assert not torch.equal(wa, wb)
    fetch(call(a, "gossip", "mix", 1))
    _settled(b, 1)
    wa2, wb2 = fetch([a.weights.remote(), b.weights.remote()])
    assert torch.equal(wa2, wb2)
    assert torch.allclose(wa2, (wa + wb) / 2)


@pytest.mark.ray
def test_a_dead_partner_costs_an_exchange_not_an_error(learners):
    import ray

    a, b = learners(2)
    fetch([a.join.remote(GossipMember(0, [b])), b.join.remote(GossipMember(1, []))])
    before = fetch(a.weights.remote())
    ray.kill(b)
    assert fetch(call(a, "gossip", "mix", 1)) == 0  # no average happened, and no exception reached the caller
    assert torch.equal(fetch(a.weights.remote()), before)
    stats = fetch(a.run.remote(3, None, None, 0.0))  # and the learner keeps training on its own
    assert stats["step"] == 3 and stats["averages"] == 0 and stats["failed_exchanges"] == 4


def _settled(actor, averages: int) -> None:
    """Wait until a passive partner has settled the exchanges its actives have settled (it assigns
    the mean just after the active has it, `groups/links.py`), and check it took `averages`."""
    fetch(call(actor, "gossip", "answered"))
    assert fetch(actor.counters.remote())["averages"] == averages


def _serving_links(actor) -> int:
    """The gossip links `actor` serves as a passive partner (its serving threads, `groups/links.py`)."""
    import threading

    return fetch(actor.__ray_call__.remote(
        lambda service: sum(t.name.startswith("link-served-") for t in threading.enumerate())))


@pytest.mark.ray
def test_a_partner_dying_inside_an_exchange_costs_that_exchange_only(learners):
    a, b = learners(2)
    fetch([a.join.remote(GossipMember(0, [b])), b.join.remote(GossipMember(1, []))])
    assert fetch(call(a, "gossip", "mix", 1)) == 1  # the link is open and has carried one exchange
    before = fetch(a.weights.remote())
    fetch(b.simulate_exit_in_average.remote())  # b dies after a's header arrives, before it answers
    started = time.monotonic()
    assert fetch(call(a, "gossip", "mix", 1)) == 1  # that exchange is lost, not raised
    assert time.monotonic() - started < 5  # the broken link fails at once, not at its timeout
    assert torch.equal(fetch(a.weights.remote()), before)
    stats = fetch(a.run.remote(2, None, None, 0.0))
    assert stats["step"] == 2 and stats["averages"] == 1 and stats["failed_exchanges"] == 3


@pytest.mark.ray
def test_a_re_formed_ring_closes_the_links_to_former_partners(learners):
    a, b, c = learners(3)
    fetch([a.join.remote(GossipMember(0, [b])), b.join.remote(GossipMember(1, [])),
           c.join.remote(GossipMember(1, []))])
    fetch(call(a, "gossip", "mix", 2))
    assert _serving_links(b) == 1 and _serving_links(c) == 0
    fetch(a.regroup.remote(GossipMember(0, [c])))  # as the driver re-forms a ring while `run` goes on
    assert fetch(call(a, "gossip", "mix", 1)) == 3
    deadline = time.monotonic() + 10
    while _serving_links(b) and time.monotonic() < deadline:  # b's serving thread ends on a's close
        time.sleep(0.05)
    assert _serving_links(b) == 0 and _serving_links(c) == 1
    _settled(c, 1)
    wa, wc = fetch([a.weights.remote(), c.weights.remote()])
    assert torch.equal(wa, wc)


@pytest.mark.ray
def test_consensus_distance_falls_to_zero_when_learners_only_average(learners):
    actors = learners(4)
    fetch([a.join.remote(GossipMember(i, [actors[q] for q in ring_partners(i, 4)], seed=3))
           for i, a in enumerate(actors)])
    fetch([a.perturb.remote(0.5, i) for i, a in enumerate(actors)])  # ~0.5 x sqrt(68 weights) apart
    start = _consensus(actors)
    assert start > 1.0
    for _ in range(30):
        fetch([call(actors[0], "gossip", "mix", 1), call(actors[2], "gossip", "mix", 1)])  # both actives, concurrently
    assert _consensus(actors) < 1e-4 * start


@pytest.mark.slow
def test_gossip_ring_of_three_runs_200_steps_without_deadlock_and_everyone_mixes(learners):
    actors = learners(3)
    fetch([a.join.remote(GossipMember(i, [actors[q] for q in ring_partners(i, 3)], seed=1))
           for i, a in enumerate(actors)])
    import ray

    refs = [a.run.remote(200, None, None, 0.0) for a in actors]
    ready, _ = ray.wait(refs, num_returns=3, timeout=240)
    assert len(ready) == 3, "gossip ring did not finish 200 steps in 240 s (deadlock?)"
    stats = ray.get(refs)
    assert [s["step"] for s in stats] == [200, 200, 200]
    assert all(s["averages"] >= 1 for s in stats)
    # exchanges still in flight, as at the job's end: the actives settle theirs, then the passive its side
    fetch([call(a, "gossip", "settle") for a in actors])
    fetch([call(a, "gossip", "answered") for a in actors])
    final = fetch([a.counters.remote() for a in actors])
    # an active starts an exchange every step its link is free (a step while the last is still in
    # flight starts none: busy_steps); each exchange settles once at both ends, none is lost
    assert [final[i]["averages"] + final[i]["busy_steps"] for i in (0, 2)] == [200, 200]
    assert final[1]["averages"] == final[0]["averages"] + final[2]["averages"]  # the passive served both
    assert [f["failed_exchanges"] for f in final] == [0, 0, 0]


@pytest.mark.ray
def test_allreduce_keeps_replicas_identical(learners):
    actors = learners(2)
    meeting = learners.meeting()
    fetch([a.join.remote(AllreduceMember(i, 2, meeting)) for i, a in enumerate(actors)])
    fetch([a.perturb.remote(0.0, 0) for a in actors])
    stats = fetch([a.run.remote(30, None, None, 0.0) for a in actors])
    assert stats[0]["step"] == stats[1]["step"] == 30
    assert stats[0]["samples"] + stats[1]["samples"] > 30
    w0, w1 = fetch([a.weights.remote() for a in actors])
    assert torch.equal(w0, w1)
    fetch([a.close.remote() for a in actors])


@pytest.mark.ray
def test_allreduce_epoch_ends_with_its_last_batch_not_an_extra_round(learners):
    """512 samples in batches of 16, 2 shards of 16 batches: 16 collective steps train the whole
    epoch and move both learners to the next (no round that trains nothing at its end)."""
    actors = learners(2)
    meeting = learners.meeting()
    fetch([a.join.remote(AllreduceMember(i, 2, meeting)) for i, a in enumerate(actors)])
    stats = fetch([a.run.remote(16, None, None, 0.0) for a in actors])
    assert [len(s["step_seconds"]) for s in stats] == [16, 16]
    assert sum(s["samples"] for s in stats) == 512
    assert [s["epoch"] for s in stats] == [1, 1]
    stats = fetch([a.run.remote(16, None, None, 0.0) for a in actors])
    assert [s["epoch"] for s in stats] == [2, 2] and [s["step"] for s in stats] == [32, 32]
    fetch([a.close.remote() for a in actors])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gossip", "allreduce"])
def test_two_learner_job_trains_and_leaves_nothing_behind(ray_session, tmp_path, kind):
    import ray

    slowdown = {1: 3.0} if kind == "gossip" else {}  # simulate.slowdown: learner 1 computes 3x as long
    spec = linear_spec(name=f"g-{kind}", learners=2, group={"kind": kind}, budget__epochs=3,
                       simulate={"slowdown": slowdown}, data__eval_splits=["dev"])
    records = []
    summary = TrainingJob(spec, tmp_path, report=records.append).run()
    epochs = [r["epoch"] for r in records]  # the mean of the learners' epochs
    # allreduce turns epochs together; a gossip learner 3x as fast runs ahead (and waits at the end)
    assert epochs == [1, 2, 3] if kind == "allreduce" else (epochs == sorted(epochs) and epochs[-1] == 3)
    assert summary["learners"] == 2 and summary["samples"] == 3 * 512
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert "consensus_distance" in records[-1]
    if kind == "allreduce":
        assert records[-1]["consensus_distance"] == 0.0
    job_id = summary["job_id"]
    for i in range(2):  # killed actors can no longer be looked up by name
        with pytest.raises(ValueError):
            ray.get_actor(f"{job_id}/learner-{i}")
    assert_nothing_left(f"{job_id}/", placement_groups=2)
    # the job's metrics reach Ray's exporters, tagged by job and learner (exported every second)
    # (each series reaches the exporter on its own schedule: the samples counter can be complete
    # a report before the last evaluation's WER gauge arrives)
    last_wer = {(("split", "dev"),): pytest.approx(records[-1]["dev_wer"], abs=0.01)}
    deadline = time.time() + 30
    while True:
        series = _job_metrics(ray, job_id)
        samples = series.get("ray_chorus_samples_total", {})
        complete = sum(samples.values()) == summary["samples"] and series.get("ray_chorus_wer") == last_wer
        if complete or time.time() > deadline:
            break
        time.sleep(0.5)
    assert set(samples) == {(("learner", "0"),), (("learner", "1"),)} and min(samples.values()) > 0
    assert sum(samples.values()) == summary["samples"]
    assert prometheus_names("chorus_job") <= set(series), prometheus_names("chorus_job") - set(series)
    assert series["ray_chorus_learners"] == {(("group", kind),): 2.0}
    assert series["ray_chorus_wer"] == last_wer
    if slowdown:  # the slowed learner computes about 3x as long per step (each step sleeps 2x its
        # compute). Compared without communication: the fast (active) learner's step also holds its
        # wait for the slowed partner's average, which grows when its chunks run back to back
        # (1.47x with it included, on a loaded clean-clone run at ecef0c2)
        mean_compute = {labels[0][1]: (series["ray_chorus_step_seconds_sum"][labels]
                                       - series["ray_chorus_comm_seconds_sum"][labels]) / count
                        for labels, count in series["ray_chorus_step_seconds_count"].items()}
        assert mean_compute["1"] > 1.5 * mean_compute["0"], mean_compute
    steps = sum(series["ray_chorus_steps_total"].values())
    assert steps == sum(series["ray_chorus_step_seconds_count"].values()) >= summary["steps"]


def _eval_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("epoch ")]


@pytest.mark.slow
def test_job_interrupted_midway_resumes_its_step_count_data_position_and_curve(ray_cluster, tmp_path):
    """`chorus train` on the test cluster, interrupted (SIGINT) after its epoch-2 checkpoint, then
    run again with --resume: it carries on from the checkpoint instead of starting over."""
    import json
    import signal
    import subprocess
    import sys

    spec = tmp_path / "resume.yaml"
    # steps of 0.1 s: an epoch of the two learners takes ~1.6 s, so the stop lands in epoch 3
    spec.write_text(json.dumps(linear_spec(raw=True, name="resume", learners=2, group={"kind": "gossip"},
                                           budget__epochs=5, data__compute_seconds=0.1)))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "orchestrator.cli", "train", str(spec), "--out", str(out),
               "--address", ray_cluster.address]
    stopped = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    before = []
    for line in stopped.stdout:  # eval lines are printed after their checkpoint is written
        if line.startswith("epoch "):
            before.append(line)
            if len(before) == 2:
                stopped.send_signal(signal.SIGINT)
                break
    rest, stderr = stopped.communicate(timeout=120)
    assert stopped.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted, learners released; the last checkpoint is" in stderr
    assert "run the same command with --resume" in stderr
    assert_nothing_left("resume-")
    curve_at_stop = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]

    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    curve = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    after = _eval_lines(resumed.stdout)
    # the curve keeps its first part and goes on from the checkpoint, without repeats
    checkpointed = torch.load(out / "checkpoint.pt", weights_only=True)["job"]["evals"]
    assert curve == checkpointed
    assert len(curve_at_stop) >= 2 and curve[:2] == curve_at_stop[:2]
    assert len(curve) == 2 + len(after) and [r["epoch"] for r in curve] == sorted({r["epoch"] for r in curve})
    assert curve[2]["epoch"] > 2 and curve[-1]["epoch"] == 5
    # from its step count: the first new evaluation is later than the checkpoint's, not step ~1
    assert curve[2]["step"] > curve[1]["step"]
    # from its place in the data: every utterance once per epoch across the stop, none twice
    assert summary["samples"] == 5 * 512
    # the resumed learners start from the checkpoint, not from the untrained model: their first
    # steps' loss and the next dev loss are well below the initial model's
    workload = build_workload("linear", parse_spec(json.loads(spec.read_text())).workload_config, seed=0)
    initial = workload.evaluate(workload.build_model(), "dev")["loss"]
    assert summary["first_train_loss"] < 0.85 * initial and curve[2]["dev_loss"] < 0.85 * initial
    assert curve[2]["wall_s"] > curve[1]["wall_s"]


@pytest.mark.slow
def test_hierarchical_two_nodes_by_two_learners(ray_cluster, tmp_path):
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    spec = linear_spec(name="hier", learners=4, group={"kind": "hierarchical"}, budget__epochs=4)
    job = TrainingJob(spec, tmp_path)
    records = []
    job.report = records.append
    summary = job.run()
    # two nodes of two learners: two intra-node allreduce groups, a ring of the two leaders
    assert sorted(len(g) for g in job.node_groups) == [2, 2]
    state = checkpoint.load(tmp_path).state  # the learners' states, read from the files it names
    # by learner id: the states are listed in the order of `learner_ids`, not by id
    weights = {i: torch.nn.utils.parameters_to_vector(list(s["model"].values()))
               for i, s in zip(state["learner_ids"], state["learners"], strict=True)}
    mean = torch.stack(list(weights.values())).mean(0)
    model = build_workload("linear", spec.workload_config, seed=spec.seed).build_model()
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    moved = float((mean - initial).norm())
    # inside a node replicas are equal at every broadcast, and the job's end broadcasts once every
    # exchange between the leaders has settled on both sides: a node's replicas end identical
    for a, b in job.node_groups:
        assert torch.equal(weights[a], weights[b]), float((weights[a] - weights[b]).norm())
    # the four models converge together: far closer to each other than they moved from the start
    spread = max(float((w - mean).norm()) for w in weights.values())
    assert spread < 0.2 * moved, (spread, moved)
    # it learns: the averaged model's dev loss falls well below the untrained model's
    untrained = build_workload("linear", spec.workload_config, seed=spec.seed)
    untrained_loss = untrained.evaluate(untrained.build_model(), "dev")["loss"]
    assert records[-1]["dev_loss"] < 0.9 * untrained_loss, (records[-1]["dev_loss"], untrained_loss)
    assert summary["learners"] == 4 and summary["group"] == "hierarchical"
    leader_counters = [s["counters"]["averages"] for s in state["learners"]]
    assert sum(1 for c in leader_counters if c > 0) >= 2  # both leaders mixed


@pytest.mark.ray
@pytest.mark.parametrize("kind, learners", [("allreduce", 2), ("hierarchical", 4)])
def test_a_collective_group_ends_its_chunk_at_the_wall_budget_not_after_its_steps(ray_session, tmp_path, kind,
                                                                                 learners):
    """Steps of 1.5 s and a 3 s budget: the members of a collective agree in their steps'
    all-reduce to end the chunk once anyone's time is up, so the job stops within a step of its
    budget rather than after the chunk's 8 steps (a slow link once kept a hierarchical job far
    past its budget this way)."""
    spec = linear_spec(name=f"wall-{kind}", learners=learners, group={"kind": kind}, budget__epochs=100,
                       budget__wall_seconds=3, data__compute_seconds=1.5)
    summary = TrainingJob(spec, tmp_path).run()
    assert 1 <= summary["steps"] <= 4, summary["steps"]  # 8 would be a whole chunk
    assert_nothing_left(f"{summary['job_id']}/")


@pytest.mark.ray
def test_a_member_that_sends_nan_weights_is_refused_its_link_dropped_and_the_others_train_on(ray_session, tmp_path):
    """A 2-learner gossip job; once it has mixed, learner 1 starts sending NaN on every exchange (a
    fault hook installed by the test into its process, not a switch of Chorus's). Its partner
    refuses them, drops the link and trains on (its weights stay finite; it backs off and reopens
    the link, refusing again), the job finishes its budget with a finite loss, and the refusals
    are `refused` events and summary counts."""
    import json

    import ray

    from orchestrator.groups.links import REFUSED_WEIGHTS
    from orchestrator.testing.faulty_peer import send_nan_weights
    from tests.builders import run_in_thread

    spec = linear_spec(name="nan-peer", learners=2, group={"kind": "gossip"}, budget__epochs=60,
                       data__eval_splits=["dev"])
    job = TrainingJob(spec, tmp_path)
    thread = run_in_thread(job)
    deadline = time.time() + 120
    while not (job.roster and len(job.roster) == 2 and job.roster.max_step() >= 20) and thread.is_alive():
        assert time.time() < deadline, "the job did not start stepping"
        time.sleep(0.2)
    faulty = ray.get_actor(f"{job.job_id}/learner-1")
    ray.get(faulty.__ray_call__.remote(send_nan_weights))
    refused_at_step = job.roster.max_step()
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in thread.outcome, thread.outcome.get("error")
    summary = thread.outcome["summary"]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    refusals = [e for e in events if e["kind"] == "refused"]
    assert refusals and all(e["learner"] == 0 for e in refusals), refusals  # the receiver refused, only it
    assert summary["refused"].get(REFUSED_WEIGHTS, 0) >= 2  # refused, the link dropped, reopened, refused again
    assert summary["epochs"] == 60 and summary["steps"] > refused_at_step + 100  # and the job trained on
    assert summary["final_train_loss"] is not None and summary["events"].get("rollback", 0) == 0
    assert job.roster is not None and not job.roster.live  # released
    key = job.secret._key  # and the job's secret is nowhere in what it wrote (checkpoints, events, summary)
    written = [path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()]
    assert len(written) >= 4 and not any(key in data or key.hex().encode() in data for data in written)
