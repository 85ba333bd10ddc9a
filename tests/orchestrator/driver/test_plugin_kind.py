"""A group kind is one plug-in: this file defines a new kind ("every-n": learners run free and
average every N steps), registers it, and runs jobs of it through the real driver (job, elastic
membership, group, loop, snapshots, checkpoints) on the in-process doubles (`tests/doubles.py`),
touching nothing in `orchestrator/`. Its spec section is validated with the rest of the spec, its
members reach every learner, its calls reach them through the learner's one `member_call`, what
it settles before the last evaluation is settled after training and before it, and what it keeps
in a learner's process is saved with the learner's state and comes back from it."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.checkpoint.state_store import StateStore
from orchestrator.driver.config import SpecError, parse_spec
from orchestrator.driver.job import TrainingJob
from orchestrator.groups import registry
from orchestrator.groups.kind import GroupKind
from orchestrator.groups.strategies import GroupStrategy
from orchestrator.learner.replica import Learner
from orchestrator.service.shards import ShardPlanner
from tests.builders import linear_spec
from tests.doubles import FakeRuntime, SimulatedLearner, fake_pool

pytestmark = pytest.mark.unit


class EveryNOptions(BaseModel):
    """`group.every-n`: how many steps between averages."""

    model_config = ConfigDict(extra="forbid")
    every: int = Field(4, ge=1)


class EveryNMember:
    """A learner of the kind: after every `every` steps of its own it averages (here: counts it)."""

    lockstep = False
    stops_alone = True

    def __init__(self, position: int, every: int):
        self.position, self.every = position, every

    def after_step(self, learner, step: int) -> None:
        if step % self.every == 0:
            learner.state_of(KIND).averaged_at.append(step)


class Averages:
    """What the kind keeps in a learner's process across re-formed groups; its `state_dict` goes
    into the learner's state (checkpoints, resumes, a newcomer's adoption)."""

    def __init__(self, learner):
        self.averaged_at: list[int] = []
        self.settled = 0
        self.momentum = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"momentum": self.momentum, "averages": len(self.averaged_at)}

    def load_state_dict(self, saved: dict) -> None:
        self.momentum = saved["momentum"].clone()


class EveryNStrategy(GroupStrategy):
    """Free-running learners that average every `group.every-n.every` steps."""

    name = "every-n"
    lockstep = False

    def members(self, roster, rendezvous) -> list:
        return [EveryNMember(i, self.spec.group.options.every) for i in range(len(roster.order))]


def averages(learner, member, state: Averages) -> int:
    return len(state.averaged_at)


def settle(learner, member, state: Averages) -> None:
    state.settled += 1


KIND = GroupKind("every-n", EveryNStrategy, options=EveryNOptions, process_state=Averages,
                 calls={"averages": averages, "settle": settle}, before_last_evaluation=("settle",))


class KindLearner(SimulatedLearner):
    """A simulated learner that runs its member after each step and answers its kind's calls as
    `LearnerService.member_call` does (the plug-in's call, with what the kind keeps in it); `log`
    is the job's sequence of chunks, calls and evaluations."""

    def __init__(self, learner_id: int, clock, node: str, log: list):
        super().__init__(learner_id, clock, node)
        self.member, self.kind_state, self.log = None, None, log
        simulated_run = self.answers["run"]

        def run(*args, **kwargs):
            before = self.step
            result = simulated_run(*args, **kwargs)
            for step in range(before + 1, self.step + 1):
                self.member.after_step(self, step)
            self.log.append(("run", self.id))
            return result

        def member_call(kind: str, name: str, *args):
            plugin = registry.kind_of(kind)
            self.log.append((name, self.id))
            return plugin.calls[name](self, self.member, self.state_of(plugin), *args)

        self.answers.update(join=lambda member: setattr(self, "member", member), run=run, member_call=member_call)

    def state_of(self, plugin: GroupKind):
        """What `plugin` keeps in this learner's process, made on first use."""
        if self.kind_state is None:
            self.kind_state = plugin.process_state(self)
        return self.kind_state


class LoggingRuntime(FakeRuntime):
    """The doubles' runtime, its learners `KindLearner`s and its service's evaluations logged."""

    def __init__(self, nodes: tuple[str, ...]):
        self.log: list[tuple[str, int]] = []
        super().__init__(nodes=nodes, make_learner=lambda i, node: KindLearner(i, self.clock, node, self.log))

    def start_service(self, job_id: str, gpus: float = 0.0, secret=None):
        service = super().start_service(job_id, gpus, secret)
        evaluate = service.answers["evaluate"]
        service.answers["evaluate"] = lambda *args, **kwargs: (self.log.append(("evaluate", -1)),
                                                               evaluate(*args, **kwargs))[1]
        return service


@pytest.fixture(autouse=True)
def every_n():
    registry.register(KIND)
    yield
    registry._registered.pop(KIND.name)


def test_a_kind_defined_here_runs_a_job_through_the_real_driver(tmp_path):
    runtime = LoggingRuntime(nodes=("node-a", "node-b"))
    spec = linear_spec(learners=3, group={"kind": "every-n", "every-n": {"every": 3}}, budget={"epochs": 2})
    assert spec.group.options == EveryNOptions(every=3)
    job = TrainingJob(spec, tmp_path / "run", runtime=runtime, pool=fake_pool(3), clock=runtime.clock)
    summary = job.run()

    assert summary["group"] == "every-n" and summary["epochs"] == 2 and summary["learners"] == 3
    learners = runtime.started
    assert len(learners) == 3 and all(isinstance(s.member, EveryNMember) and s.member.every == 3 for s in learners)
    for learner in learners:  # it averaged every 3 of its steps, and its kind's state saw each
        assert learner.step >= 32 and learner.kind_state.averaged_at == list(range(3, learner.step + 1, 3))
        assert learner.kind_state.settled == 1  # what the kind settles before the last evaluation: once
    log = runtime.log
    settles = [i for i, entry in enumerate(log) if entry[0] == "settle"]
    assert sorted(log[i][1] for i in settles) == [0, 1, 2]
    last_run = max(i for i, entry in enumerate(log) if entry[0] == "run")
    evaluations = [i for i, entry in enumerate(log) if entry[0] == "evaluate"]
    assert last_run < min(settles) and max(settles) < evaluations[-1]  # after training, before the last evaluation
    assert len(job.evals) >= 2


def test_the_kinds_section_is_validated_with_the_spec():
    spec = linear_spec(raw=True, learners=2, group={"kind": "every-n"})
    assert parse_spec(spec).group.options.every == 4  # its section's defaults
    dumped = parse_spec(linear_spec(raw=True, group={"kind": "every-n", "every-n": {"every": 7}})).model_dump()
    assert dumped["group"]["every-n"] == {"every": 7} and "options" not in dumped["group"]  # dumped as written
    with pytest.raises(SpecError, match=r"group\.every-n\.every.*greater than or equal to 1"):
        parse_spec(linear_spec(raw=True, group={"kind": "every-n", "every-n": {"every": 0}}))
    with pytest.raises(SpecError, match=r"group\.every-n\.often"):
        parse_spec(linear_spec(raw=True, group={"kind": "every-n", "every-n": {"often": 2}}))
    with pytest.raises(SpecError, match="takes no options"):
        parse_spec(linear_spec(raw=True, group={"kind": "gossip", "gossip": {"every": 2}}))
    with pytest.raises(SpecError, match="one of the group kinds: allreduce, diloco, every-n, gossip, hierarchical"):
        parse_spec(linear_spec(raw=True, group={"kind": "every-m"}))


def test_what_a_kind_keeps_is_saved_with_a_learners_state_and_comes_back(tmp_path):
    config = linear_spec().workload_config.model_dump(mode="json")
    learner = Learner("linear", config, seed=0, learner_id=0, planner=ShardPlanner([0]))
    learner.kind_states.get(KIND, learner).momentum = torch.tensor([0.5, -1.0, 2.0])
    store = StateStore(str(tmp_path))
    store.write("state-1-0.pt", learner.state())  # as a checkpoint writes it (and reads it: weights only)
    saved = store.read("state-1-0.pt")
    assert torch.equal(saved["group"]["every-n"]["momentum"], torch.tensor([0.5, -1.0, 2.0]))

    resumed = Learner("linear", config, seed=1, learner_id=0, planner=ShardPlanner([0]))
    resumed.load_state(saved)  # a resume; a newcomer adopting a live peer's state takes the same path
    assert torch.equal(resumed.kind_states.get(KIND, resumed).momentum, torch.tensor([0.5, -1.0, 2.0]))
    unknown = {**saved, "group": {"a-kind-nobody-registered": {"x": torch.ones(1)}}}
    resumed.load_state(unknown)  # another job's kind: passed over, not a crash
    assert "a-kind-nobody-registered" not in resumed.kind_states.state_dict()
