"""In-process doubles of the control plane's outside world, for unit tests of the driver without Ray
(as Ray Train's `DummyWorkerGroup`): `FakeLearner` answers `handle.method.remote(...)` as a
learner actor would, and can be told to die, hang or answer as a test says; `FakeRuntime` is
`RayRuntime` with Ray's primitives (get, wait, kill, is-gone) replaced by those of the fakes; and
`Clock` is a clock a test moves by hand.

What they fake is only Ray: the driver's own parts under test (watchdog, roster, rollbacks, loop,
group) run as they do in a job."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable

import torch

from orchestrator.checkpoint.state_store import StateStore
from orchestrator.cluster.capacity import BundlePool
from orchestrator.cluster.runtime import RayRuntime


class Gone(RuntimeError):
    """A fake learner's actor died (what Ray's RayActorError says of a real one)."""


class TaskError(RuntimeError):
    """What a fake learner's method raised, wrapped as Ray wraps it (RayTaskError): `cause` is
    the learner's own error."""

    def __init__(self, cause: Exception):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class Ref:
    """A fake object ref: ready with a value or an error, or never ready (a hung call)."""

    _ids = itertools.count()

    def __init__(self, value=None, error: Exception | None = None, ready: bool = True):
        self.value, self.error, self.ready = value, error, ready
        self.id = next(self._ids)

    def __repr__(self) -> str:
        return f"Ref({self.id}, {'ready' if self.ready else 'pending'})"


class Clock:
    """time.time for a test: it moves only when told (`advance`) or when a wait times out."""

    def __init__(self, now: float | None = None):
        self.now = time.time() if now is None else now  # where the driver's own time.time() is

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeLearner:
    """A learner actor's handle: `handle.method.remote(*args)` returns a `Ref` of `answers[method]`
    (a value, or what a callable returns or raises); a method without an answer returns None.
    `calls` records (method, args)."""

    def __init__(self, learner_id: int, **answers):
        self.id = learner_id
        self.answers: dict[str, object] = {"ping": True, **answers}
        self.calls: list[tuple[str, tuple]] = []
        self.dead = False
        self.hung: set[str] = set()  # methods whose calls never finish

    def die(self) -> None:
        """Its process is gone: every call from now on fails as Ray's do."""
        self.dead = True

    def hang(self, *methods: str) -> None:
        self.hung.update(methods)

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)

        class Method:
            @staticmethod
            def remote(*args, **kwargs):
                self.calls.append((method, args))
                waiting = [a for a in args if isinstance(a, Ref) and (not a.ready or a.error is not None)]
                if waiting:  # Ray runs a call once its arguments are ready, and fails it with theirs
                    return Ref(ready=False) if not waiting[0].ready else Ref(error=waiting[0].error)
                args = tuple(a.value if isinstance(a, Ref) else a for a in args)
                if self.dead:
                    return Ref(error=Gone(f"learner {self.id} is gone"))
                if method in self.hung:
                    return Ref(ready=False)
                answer = self.answers.get(method)
                if not callable(answer):
                    return Ref(answer)
                try:
                    return Ref(answer(*args, **kwargs))
                except Gone as exc:  # it died in the call
                    return Ref(error=exc)
                except Exception as exc:  # noqa: BLE001 - what the method raised: its ref's error, as Ray's
                    return Ref(error=TaskError(exc))
        return Method

    def called(self, method: str) -> list[tuple]:
        return [args for name, args in self.calls if name == method]


class FakeRuntime(RayRuntime):
    """`RayRuntime` (gather, gather_ready, answers as they are) over fake refs: `wait` returns the
    ready ones at once and, when fewer than asked are ready, moves the clock by its timeout as a
    real wait would have waited. `start_learner` starts a `SimulatedLearner` (or what
    `make_learner(learner_id, node)` makes), on the nodes `nodes` name in turn; `start_service` a
    `FakeService`; `draining` is what `draining_nodes` says."""

    name = "fake"
    distributed = True

    def __init__(self, clock: Clock | None = None, nodes: tuple[str, ...] = ("node-a",),
                 make_learner: Callable | None = None):
        self.clock = clock or Clock()
        self.killed: list = []
        self.nodes, self.started = nodes, []
        self.make_learner = make_learner or (lambda learner_id, node: SimulatedLearner(learner_id, self.clock, node))
        self.draining: dict[str, int] = {}
        self.service: FakeService | None = None

    def start_learner(self, job_id: str, learner_id: int, slot, workload: str, workload_config: dict, seed: int,
                      planner, slowdown: float = 1.0, secret=None):
        learner = self.make_learner(learner_id, self.nodes[len(self.started) % len(self.nodes)])
        self.started.append(learner)
        return learner

    def start_service(self, job_id: str, gpus: float = 0.0, secret=None):
        self.service = FakeService()
        return self.service

    @staticmethod
    def available_resources() -> dict[str, float]:
        return {"CPU": 0.0}

    def node_inventory(self) -> list[dict]:
        return [{"node_id": node, "alive": True} for node in self.nodes]

    def learner(self, learner_id: int) -> SimulatedLearner:
        """The newest learner started with this id."""
        return [s for s in self.started if s.id == learner_id][-1]

    def connect(self) -> None:
        pass

    @staticmethod
    def get(values):
        if isinstance(values, list):
            return [FakeRuntime.get(v) for v in values]
        if not isinstance(values, Ref):
            return values
        if not values.ready:
            raise AssertionError(f"{values} was read before it was ready (a real get would block)")
        if values.error is not None:
            raise values.error
        return values.value

    def pause(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def wait(self, refs: list, num_returns: int = 1, timeout: float | None = None) -> list:
        ready = [r for r in refs if r.ready][:num_returns]
        if len(ready) < min(num_returns, len(refs)) and timeout:
            self.clock.advance(timeout)
        return ready

    @staticmethod
    def is_gone(exc: Exception) -> bool:
        return isinstance(exc, Gone)

    @staticmethod
    def failed_remotely(exc: Exception) -> bool:
        return isinstance(exc, Gone | TaskError)

    def kill(self, actors) -> None:
        for actor in actors:
            actor.die()
            self.killed.append(actor.id)

    def draining_nodes(self) -> dict:
        return dict(self.draining)

    @staticmethod
    def submit(target, method: str, *args):
        return getattr(target, method).remote(*args)


def stats(step: int = 0, epoch: int = 0, loss: float | None = 1.0, steps: int = 1, **fields) -> dict:
    """A learner's chunk report (`Learner.take_stats`) of `steps` 0.1-second steps."""
    return {"step": step, "epoch": epoch, "samples": 8 * step, "loss": loss, "chunk_samples": 8 * steps,
            "step_seconds": [0.1] * steps, "comm_seconds": [0.0] * steps, "step_began": [],
            "first_step_at": None, "nonfinite_at": None, "skipped": {}, "lr_scale": 1.0, **fields}


def answering(*values) -> Callable:
    """An answer that is each of `values` in turn, then the last one again."""
    queue = list(values)
    return lambda *args, **kwargs: queue.pop(0) if len(queue) > 1 else queue[0]


STEP_S = 0.1  # a simulated learner's step, on its clock


class SimulatedLearner(FakeLearner):
    """A learner actor that trains nothing: each `run(steps, ...)` advances its step, and its epoch
    every `steps_per_epoch` steps, and reports what `Learner.take_stats` would (loss `loss(step)`);
    it answers heartbeats (a step computing since `computing_since`, None between chunks), joins
    groups, writes its state files into the store it is sent, and its model is a flat tensor of
    its step. A test makes it die, hang or answer otherwise through `FakeLearner`'s means."""

    def __init__(self, learner_id: int, clock: Clock, node: str = "node-a", steps_per_epoch: int = 16,
                 loss: Callable[[int], float] = lambda step: 1.0):
        super().__init__(learner_id)
        self.clock, self.node, self.steps_per_epoch, self.loss = clock, node, steps_per_epoch, loss
        self.step = self.epoch = self.samples = 0
        self.lr_scale, self.leaving, self.computing_since = 1.0, None, None
        self.answers.update(
            hello=lambda: {"node": node, "pid": os.getpid(), "ready_at": clock(), "device": "cpu",
                           "cuda_visible_devices": None, **self._counters()},
            counters=self._counters, run=self._run, heartbeat=lambda: {"step": self.step,
                                                                    "computing_since": self.computing_since,
                                                                    "at": clock()},
            device="cpu", ip="10.0.0.1", group_address="10.0.0.1", leave=self._leave,
            set_lr_scale=self._set_lr_scale, model_vector=lambda: torch.full((4,), float(self.step)),
            add_vectors=lambda a, b: a + b, distance_to=lambda total, count: 0.0,
            weights_digest=lambda: str(self.step),
            save_state=self._save_state, load_state_file=self._load_state_file,
            state=lambda: {"counters": self._counters()}, load_state=self._load_state)

    def _counters(self) -> dict:
        return {"step": self.step, "samples": self.samples, "epoch": self.epoch, "lr_scale": self.lr_scale}

    def _run(self, steps: int, deadline, max_epochs, progress: float, seconds=None) -> dict:
        losses, began = [], []
        for _ in range(steps):
            if (max_epochs is not None and self.epoch >= max_epochs) or self.leaving:
                break
            began.append(self.clock())
            self.clock.advance(STEP_S)  # simulated time passes as learners step
            losses.append(self.loss(self.step))
            self.step, self.samples = self.step + 1, self.samples + 8
            self.epoch = self.step // self.steps_per_epoch
        n = len(losses)
        return {**self._counters(), "loss": sum(losses) / n if n else None, "chunk_samples": 8 * n,
                "step_seconds": [STEP_S] * n, "comm_seconds": [0.0] * n, "first_step_at": began[0] if began else None,
                "step_began": began, "nonfinite_at": next((self.step - n + i for i, v in enumerate(losses)
                                                           if v != v), None),
                "skipped": {}, "broken": None, "leaving": self.leaving}

    def _save_state(self, store, name: str) -> dict:
        counters = self._counters()
        return {"file": name, "bytes": store.write(name, {"counters": counters}), "counters": counters}

    def _load_state_file(self, store, entry: dict, adopt: bool = False) -> None:
        state = store.read(entry["file"])  # as a learner reads it: from the store the driver sent
        self._load_state({**state, "counters": entry.get("counters", state["counters"])}, adopt)

    def _load_state(self, state: dict, adopt: bool = False) -> None:
        counters = state["counters"]
        self.step, self.epoch = counters["step"], counters["epoch"]
        self.lr_scale = counters.get("lr_scale", 1.0)
        if not adopt:
            self.samples = counters["samples"]

    def _leave(self, reason: str) -> None:
        self.leaving = self.leaving or reason

    def _set_lr_scale(self, scale: float) -> None:
        self.lr_scale = scale


class FakeService(FakeLearner):
    """The job's service (shard planner and evaluator): it takes the members, scores a model as
    finite or not by its values (dev WER 50%), and scores the final splits."""

    def __init__(self):
        super().__init__(-1)
        self.answers.update(
            set_members=None, state=lambda epoch: {"epoch": epoch}, hand_over=lambda learner_id, stats: 0,
            evaluate=self._evaluate,
            score=lambda workload, splits: {split: {"wer": 40.0, "utterances": 10} for split in splits})

    @staticmethod
    def _evaluate(workload, total, count: int, splits: list[str], store_root: str | None = None,
                  model_name: str | None = None) -> dict:
        if not bool(torch.isfinite(total / count).all()):
            return {"finite": False}
        written = StateStore(store_root).write(model_name, {"model": total / count})
        return {"finite": True, "scores": {"dev": {"wer": 50.0, "loss": 1.0}},
                "model": {"file": model_name, "bytes": written}}


class FakePlacementGroup:
    """A Tune trial's placement group, as far as `BundlePool` asks: always placed."""

    @staticmethod
    def ready() -> Ref:
        return Ref(True)


def fake_pool(learners: int) -> BundlePool:
    """Slots for `learners` learners (a learner's slot is given back when it leaves, for the next)."""
    return BundlePool(FakePlacementGroup(), list(range(learners)), {"CPU": 1.0})
