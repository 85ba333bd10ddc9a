"""What a learner offers its driver and its group (`LearnerService`), and the same as a Ray actor in a
process of its own (`LearnerActor`): training chunks, averaging requests and weight reads served
concurrently, states written to and read from the run's store, and the model sums of consensus
checks."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import ray

from orchestrator.base import flat as flat_state
from orchestrator.base import pieces
from orchestrator.groups.errors import GroupBroken
from orchestrator.groups.guard import STRANGER, STRANGERS
from orchestrator.groups.links import bind_address
from orchestrator.groups.registry import kind_of
from orchestrator.learner.faults import SimulatedFaults
from orchestrator.learner.replica import Learner


class LearnerService(SimulatedFaults):
    """What a learner offers its driver and its group: `run` trains; averaging requests and weight
    reads are served on the `mix` concurrency group, concurrently with `run`. `LearnerActor` is
    this class as a Ray actor; one-learner jobs use it in-process."""

    def __init__(self, workload: str, workload_config: dict, seed: int, learner_id: int, planner, threads: int = 1,
                 slowdown: float = 1.0, use_gpu: bool = True, secret=None):
        self.learner = Learner(workload, workload_config, seed, learner_id, planner, threads, use_gpu, secret)
        self.learner._slowdown, self.group = float(slowdown), None
        self._trainable = None  # which entries of the model's flat state are trainable weights
        self._exit_in_join = self._exit_in_average = False

    def device(self) -> str:
        return self.learner.device.type

    def node_id(self) -> str:
        """The Ray node it runs on (`local` in the driver's process)."""
        return "local"

    def ip(self) -> str:
        return ray.util.get_node_ip_address()

    def group_address(self, interface: str | None = None) -> str:
        """The address its process groups and links bind to (`group.interface`'s, else its node's)."""
        return bind_address(self.learner, interface)

    def hello(self) -> dict:
        """Once built (and any state sent before loaded): node, pid, device, CUDA_VISIBLE_DEVICES, counters."""
        return {"node": self.node_id(), "pid": os.getpid(), "ready_at": time.time(), "device": str(self.learner.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **self.learner.counters()}

    def join(self, member) -> None:
        """Attach this learner to its group (a groups.* member object, built by the driver),
        leaving the group it was in."""
        if self._exit_in_join:  # a simulated death while the group forms (tests and bench/faults.py only)
            os._exit(1)
        if self.group is not None:
            self.group.close()
        self.group = member
        self.group.setup(self.learner)

    @ray.method(concurrency_group="mix")
    def ping(self) -> bool:
        """Answers while the learner's process is alive, even in the middle of a step."""
        return True

    @ray.method(concurrency_group="mix")
    def heartbeat(self) -> dict:
        """Its step count and since when its current step has been computing (None while it waits
        on its group or between chunks), and when it answered (its own clock, as `computing_since`),
        answered even in the middle of a step."""
        return {"step": self.learner.step, "computing_since": self.learner.computing_since, "at": time.time()}

    @ray.method(concurrency_group="mix")
    def leave(self, reason: str) -> None:
        """This learner must leave (its node is drained): it ends its chunk at the end of the step
        in flight where its group allows (`stops_alone`), else at the chunk's end."""
        self.learner.leaving = self.learner.leaving or reason

    @ray.method(concurrency_group="mix")
    def regroup(self, member) -> None:
        """Swap in a new member of a group whose `setup` is a no-op (`swaps_running`) while `run`
        goes on: the next step uses it."""
        self.group = member

    def set_slowdown(self, factor: float) -> None:
        self.learner._slowdown = float(factor)

    def set_lr_scale(self, scale: float) -> None:
        """Train at `scale` times the scheduled learning rate (the job halves it on a rollback)."""
        self.learner.lr_scale = float(scale)

    def run(self, steps: int, deadline: float | None, max_epochs: int | None, progress: float,
            seconds: float | None = None) -> dict:
        """Up to `steps` optimizer steps, stopping early at the wall deadline (time.time()), once
        `seconds` have passed since the chunk began (it takes one step at least), or when this
        learner has finished `max_epochs` epochs; returns its stats. (A group step at an epoch
        boundary trains nothing and does not count; two in a row mean an empty shard.)

        A learner that may stop alone (`stops_alone`) checks the time before each step; the
        members of a collective vote in each step's collective (`Learner.wants_to_stop`) and all end
        the chunk after the first step in which any voted: never more than a step past the deadline."""
        learner = self.learner
        learner.progress = progress
        alone = getattr(self.group, "stops_alone", True)
        ends = [t for t in (deadline, time.time() + seconds if seconds else None) if t is not None]
        learner.stop_at, learner.deadline, learner.group_stops = (min(ends) if ends else None), deadline, False
        target, idle, broken, first = learner.step + steps, 0, None, learner.step
        if learner.leaving and alone:
            target = learner.step  # a chunk queued before it was told to leave: it leaves instead
        while learner.step < target and idle < 2:
            if alone and deadline is not None and time.time() >= deadline:
                break
            if alone and learner.step > first and learner.wants_to_stop():
                break
            if max_epochs is not None and learner.epoch >= max_epochs:
                break
            before = learner.step
            try:
                learner.timed_step(self.group)
            except GroupBroken as exc:  # a member of the collective is gone: the driver re-forms it
                broken = str(exc)
                break
            idle = idle + 1 if learner.step == before else 0
            if learner.group_stops or (learner.leaving and alone):
                break  # the members of a collective agreed to end here; one that may stop alone leaves
        learner.stop_at = learner.deadline = None
        for source in STRANGERS.new():  # strangers' connections its group's library kept (`groups/guard.py`)
            learner.refusals.refuse(source, STRANGER)
        return {**learner.take_stats(), "broken": broken, "leaving": learner.leaving}

    def member_call(self, kind: str, call: str, *args):
        """What its group's kind asks of this learner (`GroupKind.calls`: the one way in for a
        kind's own requests, from its peers or the driver); on the concurrency group the caller
        chose (`groups.kind.call`)."""
        plugin = kind_of(kind)
        return plugin.calls[call](self.learner, self.group, self.learner.kind_states.get(plugin, self.learner), *args)

    @ray.method(concurrency_group="mix")
    def average(self, other: pieces.Pieces) -> None:
        """One pairwise average with another learner's `weights` (a leaving learner's handover)."""
        if self._exit_in_average:  # a simulated death mid-exchange (tests and bench/faults.py only)
            os._exit(1)
        self.learner.average(pieces.take(other))

    @ray.method(concurrency_group="mix")
    def weights(self) -> pieces.Pieces:
        """The trainable weights, flat, in pieces (`base/pieces.py`: values that may cross a slow link)."""
        return pieces.put(self.learner.flat_weights())

    @ray.method(concurrency_group="mix")
    def state(self) -> pieces.Pieces:
        """`Learner.state`, in pieces (a newcomer takes it from a live learner, maybe across a slow link)."""
        return pieces.put(self.learner.state())

    def load_state(self, state: pieces.Pieces, adopt: bool = False) -> None:
        self.learner.load_state(pieces.take(state), adopt)

    # -- checkpoints and evaluation, without the driver holding a model ---------------------------
    @ray.method(concurrency_group="mix")
    def save_state(self, store, name: str) -> dict:
        """Write this learner's state as `name` into `store` (the run's `StateStore`, sent by the driver); returns
        the manifest's entry for it: the file, its bytes and the counters it holds."""
        state = self.learner.state()
        return {"file": name, "bytes": store.write(name, state), "counters": state["counters"]}

    def load_state_file(self, store, entry: dict, adopt: bool = False) -> None:
        """`load_state` of a checkpoint's entry: its file read here, its counters (a file shared by
        learners whose weights are equal holds one learner's) taken from the entry."""
        state = store.read(entry["file"])
        self.learner.load_state({**state, "counters": entry.get("counters", state["counters"])}, adopt)

    @ray.method(concurrency_group="mix")
    def model_vector(self) -> pieces.Pieces:
        """The model's floating-point state as one flat CPU tensor (`base/flat.py`), in pieces."""
        with self.learner.lock:
            vector = flat_state.to_vector(self.learner.model)
        return pieces.put(vector)

    @ray.method(concurrency_group="mix")
    def weights_digest(self) -> str:
        """A digest of the model's floating-point state: learners whose digests are equal hold equal
        weights, so a snapshot knows their distance to the mean (0) without moving a model."""
        with self.learner.lock:
            vector = flat_state.to_vector(self.learner.model)
        return hashlib.blake2b(vector.numpy().tobytes(), digest_size=16).hexdigest()

    @ray.method(concurrency_group="mix")
    def add_vectors(self, a: pieces.Pieces, b: pieces.Pieces) -> pieces.Pieces:
        """a + b: one node of the tree in which learners sum their models (`consensus.py`)."""
        return pieces.put(pieces.take(a) + pieces.take(b))

    @ray.method(concurrency_group="mix")
    def distance_to(self, total: pieces.Pieces, count: int) -> float:
        """L2 distance of this learner's trainable weights to those of the mean `total / count`."""
        total = pieces.take(total)
        if self._trainable is None:
            self._trainable = flat_state.trainable_mask(self.learner.model)
        with self.learner.lock:
            mine = flat_state.to_vector(self.learner.model)
        return float((mine - total / count)[self._trainable].norm())

    def counters(self) -> dict:
        return self.learner.counters()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.learner.kind_states.close()


class _LearnerProcess(LearnerService):
    """A learner in a process of its own (a Ray actor): SIGTERM (a preempted node or pod, a
    `kill`) makes it leave gracefully, as a drain does, rather than die."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.learner.node_address = ray.util.get_node_ip_address()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def _on_sigterm(self, signum, frame) -> None:
        self.learner.leaving = self.learner.leaving or "SIGTERM"


LearnerActor = ray.remote(concurrency_groups={"mix": 1, "links": 1})(_LearnerProcess)
