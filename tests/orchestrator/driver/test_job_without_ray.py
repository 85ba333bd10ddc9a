"""The whole control plane — job, elastic membership, roster, group, loop, watchdog, rollbacks,
snapshots and checkpoints — run without Ray over simulated learners (`tests/doubles.py`): joins,
deaths mid-chunk and while the group re-forms, drains, stuck learners and a diverged loss, each
ending in a finished job with the events and checkpoints it should have."""

from __future__ import annotations

import math

import pytest

from orchestrator.checkpoint.files import load_latest
from orchestrator.driver.job import TrainingJob
from tests.builders import linear_spec
from tests.doubles import FakeRuntime, Gone, SimulatedLearner, fake_pool

pytestmark = pytest.mark.unit


def _job(tmp_path, kind: str = "allreduce", learners: int = 2, epochs: int = 3, make_learner=None,
         nodes=("node-a", "node-b"), **fields) -> tuple[TrainingJob, FakeRuntime]:
    runtime = FakeRuntime(nodes=nodes, make_learner=make_learner)
    spec = linear_spec(learners=learners, group={"kind": kind}, budget={"epochs": epochs}, **fields)
    job = TrainingJob(spec, tmp_path / "run", runtime=runtime, pool=fake_pool(learners), clock=runtime.clock)
    return job, runtime


def _kinds(job: TrainingJob) -> list[str]:
    return [e["kind"] for e in job.events.recorded]


@pytest.mark.parametrize("kind", ["allreduce", "gossip", "hierarchical"])
def test_a_job_runs_to_its_epoch_budget_evaluating_every_epoch(tmp_path, kind):
    job, runtime = _job(tmp_path, kind, learners=4, epochs=3, nodes=("node-a", "node-a", "node-b", "node-b"))
    summary = job.run()
    assert summary["epochs"] == 3 and summary["learners"] == 4 and summary["group"] == kind
    assert [e["epoch"] for e in job.evals][-1] == 3 and len(job.evals) >= 3
    assert all(learner.epoch == 3 for learner in runtime.started)
    checkpoint = load_latest(tmp_path / "run").state  # verified: every file it names is there, at its size
    assert sorted(checkpoint["learner_ids"]) == [0, 1, 2, 3] and checkpoint["job"]["evals"][-1]["epoch"] == 3
    assert _kinds(job).count("join") == 4 and "failure" not in _kinds(job)
    assert runtime.service.called("set_members")  # the planner was told the members


def _dies_at(learner: SimulatedLearner, step: int) -> None:
    """Its process dies as it is asked for a chunk at `step` or later (chunks are 8 steps: at 5, it
    dies as its second chunk, from step 8, begins)."""
    run = learner._run

    def dying(*args):
        if learner.step >= step:
            learner.die()
            raise Gone(f"learner {learner.id} died at step {learner.step}")
        return run(*args)
    learner.answers["run"] = dying


def test_a_learner_that_dies_mid_chunk_is_replaced_and_the_group_formed_again(tmp_path):
    def make(learner_id, node):
        learner = SimulatedLearner(learner_id, runtime.clock, node)
        if learner_id == 1:
            _dies_at(learner, 5)
        return learner

    job, runtime = _job(tmp_path, "allreduce", learners=2, epochs=4, make_learner=make)
    summary = job.run()
    assert _kinds(job)[:5] == ["join", "join", "failure", "leave", "join"]
    assert [e["learner"] for e in job.events.recorded if e["kind"] == "join"] == [0, 1, 2]  # 1's slot went to 2
    assert summary["epochs"] == 4 and 1 in runtime.killed
    newcomer = runtime.learner(2)
    assert newcomer.called("load_state")  # it started from a live learner's state
    assert newcomer.called("join") and job.recoveries[0]["cause"] == "failure"


def test_a_learner_that_dies_while_the_group_re_forms_is_dropped_and_it_forms_without_it(tmp_path):
    def make(learner_id, node):
        learner = SimulatedLearner(learner_id, runtime.clock, node)
        if learner_id == 1:
            _dies_at(learner, 4)
        if learner_id == 2:  # its replacement dies as it joins the re-formed group
            def die_joining(member):
                learner.die()
                raise Gone(f"learner {learner.id} died joining its group")
            learner.answers["join"] = die_joining
        return learner

    job, runtime = _job(tmp_path, "allreduce", learners=2, epochs=3, make_learner=make)
    summary = job.run()
    failures = [e["learner"] for e in job.events.recorded if e["kind"] == "failure"]
    assert failures == [1, 2] and summary["epochs"] == 3
    assert [e["learner"] for e in job.events.recorded if e["kind"] == "join"] == [0, 1, 2, 3]


def test_a_drained_node_s_learner_leaves_cleanly_and_its_slot_is_asked_for_again(tmp_path):
    def make(learner_id, node):
        learner = SimulatedLearner(learner_id, runtime.clock, node)
        run = learner._run

        def drain_at_step_8(*args):  # Ray starts draining node-b (`ray drain-node`, a preemption)
            if learner.step >= 8 and not runtime.started[-1].id > 1:
                runtime.draining = {"node-b": 0}
            return run(*args)
        learner.answers["run"] = drain_at_step_8
        return learner

    job, runtime = _job(tmp_path, "gossip", learners=2, epochs=6, nodes=("node-a", "node-b"), make_learner=make)
    job.run()
    drains = [e for e in job.events.recorded if e["kind"] == "drain"]
    assert drains and drains[0]["learner"] == 1 and "node node-b is being drained" in drains[0]["reason"]
    assert drains[0]["kept_by"] == 0  # gossip: its ring neighbour took one last average
    assert runtime.learner(0).called("average")
    assert "failure" not in _kinds(job)


def test_a_stuck_learner_is_dropped_by_the_watchdog_and_the_job_goes_on(tmp_path):
    def make(learner_id, node):
        learner = SimulatedLearner(learner_id, runtime.clock, node)
        if learner_id == 0:
            run = learner._run

            def hangs_from_its_third_chunk(*args):
                if learner.step >= 6:  # this chunk answers; from the next on its step hangs: no run
                    learner.computing_since = runtime.clock()  # answers, its heartbeats do
                    learner.hang("run")
                return run(*args)
            learner.answers["run"] = hangs_from_its_third_chunk
        return learner

    job, runtime = _job(tmp_path, "allreduce", learners=2, epochs=4, make_learner=make)  # stuck after 30 s
    summary = job.run()
    failure = next(e for e in job.events.recorded if e["kind"] == "failure")
    assert failure["learner"] == 0 and "stuck: step" in failure["error"] and "computing for" in failure["error"]
    assert summary["epochs"] == 4 and 0 in runtime.killed


def test_a_non_finite_loss_rolls_every_learner_back_at_half_the_rate(tmp_path):
    def make(learner_id, node):
        seen = {"nan": False}

        def loss(step):
            if step == 20 and not seen["nan"]:
                seen["nan"] = True
                return math.nan
            return 1.0
        return SimulatedLearner(learner_id, runtime.clock, node, loss=loss)

    job, runtime = _job(tmp_path, "allreduce", learners=2, epochs=4, make_learner=make)
    summary = job.run()
    (rollback,) = [e for e in job.events.recorded if e["kind"] == "rollback"]
    assert rollback["at_step"] == 20 and rollback["lr_scale"] == 0.5 and rollback["to_step"] == 16  # epoch 1's
    assert all(learner.called("set_lr_scale") == [(0.5,)] for learner in runtime.started)
    assert all(learner.called("load_state_file") for learner in runtime.started)
    assert summary["epochs"] == 4


def test_learners_that_keep_failing_to_start_are_retried_with_a_back_off_then_the_job_stops_in_one_line(tmp_path):
    from orchestrator.driver.elastic import MAX_START_FAILURES, LearnersCannotStart

    def make(learner_id, node):
        learner = SimulatedLearner(learner_id, runtime.clock, node)

        def broken():
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device")
        learner.answers["hello"] = broken
        return learner

    job, runtime = _job(tmp_path, "allreduce", learners=2, epochs=1, make_learner=make)
    started = runtime.clock()
    with pytest.raises(LearnersCannotStart) as stopped:
        job.run()
    message = str(stopped.value)
    assert "\n" not in message and f"{MAX_START_FAILURES} learners in a row failed to start" in message
    assert "RuntimeError: CUDA error: no kernel image" in message
    assert len(runtime.started) == MAX_START_FAILURES + 1  # two a round: 2, 2, then the fifth fails
    assert runtime.clock() - started >= 2 + 8  # backed off (1 s doubled per failure) before each new round
    assert {s.id for s in runtime.started} <= set(runtime.killed)  # nothing left
