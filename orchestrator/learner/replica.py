"""Learner: one model replica, its optimizer, its data shard and its counters, driven by a learner
group (which sees it as a `groups.replica.Replica`). Workload-agnostic: it only calls the
workload interface (build model/optimizer, batches, loss, evaluate, state).

Weights are touched under one lock, so a partner's averaging request (served on the `mix`
concurrency group while this learner computes) and this learner's own optimizer step never
interleave: both sides of a pairwise average end with the same mean.
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from functools import partial

import torch

from orchestrator.base.flat import GRAD_TAIL, cudnn_weights, flat_grad_buffer, flat_weight_buffer
from orchestrator.base.secret import JobSecret
from orchestrator.groups.channel import Refusals
from orchestrator.groups.checks import finite
from orchestrator.groups.kind_states import KindStates
from orchestrator.learner.calls import call
from orchestrator.learner.data_cursor import DataCursor
from orchestrator.learner.memory_fit import MemoryFit
from orchestrator.workload import build_workload


class ReplicaWeights:
    """A learner's trainable weights as one flat tensor, read and written under its weight lock
    (`self.lock`, `self.params`, `self.device` are the learner's)."""

    def flat_weights(self, on_device: bool = False) -> torch.Tensor:
        """A copy of the trainable weights as one flat tensor: on the CPU, or on the learner's
        device (for collectives)."""
        with self.lock:
            return self.flat.clone() if on_device or self.device.type == "cpu" else self.flat.cpu()

    def copy_weights_to(self, out: torch.Tensor) -> int:
        """Copy the trainable weights into the flat CPU tensor `out` (`numel` long); returns their
        `version` (which every change of the weights increments)."""
        with self.lock:
            out.copy_(self.flat)
            return self.version

    def settle_mean(self, active: torch.Tensor, passive: torch.Tensor, mine: torch.Tensor, version: int) -> None:
        """After a pairwise exchange in which this learner sent `mine`, its copy at `version` (`copy_weights_to`):
        its weights become the mean of the active partner's and the passive's (`assign_mean`). If
        they changed since the copy (its own step, a handover), the mean's change is added to
        them instead, so that change is not lost."""
        with self.lock:
            if self.version == version:
                self.assign_mean(active, passive)
            else:
                self.flat.add_(torch.lerp(active, passive, 0.5).sub_(mine).to(self.device))
                self.version += 1

    def add_to_weights(self, delta: torch.Tensor) -> None:
        """Add a flat CPU tensor to the trainable weights (a compressed exchange's move)."""
        with self.lock:
            self.flat.add_(delta.to(self.device))
            self.version += 1

    def load_flat_weights(self, flat: torch.Tensor) -> None:
        with self.lock:
            self.assign(flat)

    def assign(self, flat: torch.Tensor) -> None:
        """Set the trainable weights from a flat tensor (the caller holds the weight lock).
        In place (`self.flat`, which every parameter is a view into, changes invisibly to
        autograd), so a backward pass in flight on the compute thread is not invalidated (AD-PSGD
        tolerates reading slightly stale weights)."""
        self.flat.copy_(flat)
        self.version += 1

    def assign_mean(self, active: torch.Tensor, passive: torch.Tensor) -> None:
        """Set the trainable weights to the mean of two flat CPU tensors, the active partner's and
        the passive's (the caller holds the weight lock), in one pass. Both partners pass the same
        tensors in the same order and get the same bits (`passive` may be `self.flat` itself)."""
        if self.device.type == "cpu":
            torch.lerp(active, passive, 0.5, out=self.flat)
        else:
            self.flat.copy_(torch.lerp(active, passive, 0.5))
        self.version += 1

    def average(self, other: torch.Tensor) -> torch.Tensor:
        """Atomically replace these weights with the mean of these and `other`; return the mean
        (on the CPU). Weights that are not finite are refused: these stay, and are returned."""
        if not finite(other):
            self.refusals.refuse("a leaving learner", "weights that are not finite (a handover)")
            return self.flat_weights()
        other = other.to(self.device)
        with self.lock:
            mean = (self.flat + other) / 2
            self.flat.copy_(mean)
            self.version += 1
        self.count_averages(1)
        return mean.cpu()

    def count_averages(self, n: int) -> None:
        """Pairwise averages settled (from the learner's thread and its links' serving threads)."""
        with self.counter_lock:
            self.averages += n

    def count_sent(self, nbytes: int) -> None:
        """Bytes its group communication sent over the network (`sent_bytes`)."""
        with self.counter_lock:
            self.sent_bytes += nbytes

    def flat_grads(self) -> torch.Tensor:
        """The gradients as one flat tensor (a view: no copy)."""
        return self.grad_buffer[:-GRAD_TAIL]


class StepTimings:
    """How a learner times its group's steps and its waits on the group (`self.step`, `comm_s`,
    `computing_since` and the chunk's lists are the learner's)."""

    def timed_step(self, group) -> None:
        """One `group.step`; a step that trained something adds its wall and communication
        seconds to this chunk's timings (`self.step_seconds`, `comm_seconds`, `step_began`)."""
        step, comm, start, began = self.step, self.comm_s, time.perf_counter(), time.time()
        self.computing_since = began
        try:
            group.step(self)
        finally:
            self.computing_since = None
        if self.step > step:  # a kind's step may be a round of n inner steps: n equal entries
            n = self.step - step
            self.step_seconds += [(time.perf_counter() - start) / n] * n
            self.comm_seconds += [(self.comm_s - comm) / n] * n
            self.step_began += [began] * n

    @contextmanager
    def waiting_on_group(self):
        """Time spent waiting for other learners (a collective, a partner's average): the watchdog
        does not count it against this learner."""
        computing, self.computing_since = self.computing_since, None
        try:
            yield
        finally:
            self.computing_since = time.time() if computing is not None else None


class Learner(ReplicaWeights, StepTimings):
    """One model replica: its model, optimizer, data cursor and counters, stepped by its group.

    Args:
    workload, workload_config: the registered workload's name (`orchestrator.workload`) and its
    sections of the job spec (a dict, as sent over Ray); seed: the job's (every learner starts
    from the same weights); learner_id: this learner's id in its job; planner: the job's
    `ShardPlanner` (or its actor), asked for this learner's shard every epoch; threads: torch
    intra-op threads; secret: the job's `JobSecret`, which its links prove (`groups/channel.py`,
    `groups/guard.py`); use_gpu: it reserved a GPU (or a share): the model lives there if the
    process sees one (one that reserved none is started with CUDA hidden), else on the CPU.
    Weights and states cross the learner's boundary as CPU tensors."""

    def __init__(self, workload: str, workload_config: dict, seed: int, learner_id: int, planner, threads: int = 1,
                 use_gpu: bool = True, secret=None):
        torch.set_num_threads(max(1, threads))
        self.device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        self.workload = build_workload(workload, workload_config, seed)
        self.model = self.workload.build_model().to(self.device).train()
        self.optimizer = self.workload.build_optimizer(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.grad_buffer = flat_grad_buffer(self.params, self.device)
        self.flat = flat_weight_buffer(self.params, self.device, cudnn_weights(self.model))  # which the params view
        self.numel = self.flat.numel()
        self.version = 0  # of the weights: every change increments it (a gossip exchange checks it)
        self.group_links = None  # what a group keeps in this process across re-formed groups (gossip's links)
        self.kind_states = KindStates()  # what the group's kind keeps here; saved with the state where it says so
        self.node_address: str | None = None  # its node's address, which its groups bind to (None: this process only)
        # its job's secret (one started without one, a test's, holds a secret of its own: it links to nobody)
        self.learner_id, self.planner, self.secret = learner_id, planner, secret or JobSecret()
        self.refusals = Refusals(f"learner {learner_id}")  # what it refused of other processes, by reason
        self.lock, self.counter_lock = threading.Lock(), threading.Lock()  # weights; counters its links add to
        self.step = self.samples = self.averages = self.sent_bytes = 0  # sent: by its group, between hosts
        self.failed_exchanges = self.busy_steps = 0  # gossip: exchanges lost; steps that started none (links busy)
        self.progress = 0.0  # fraction of the job's budget spent, set by the driver
        self.lr_scale = 1.0  # times the scheduled learning rate; halved by each rollback, kept in the state
        self._nan_at: int | None = None  # simulate.nan_loss_at_step (tests only)
        self.data = DataCursor(self.workload, planner, learner_id)  # its epoch, part and position in it
        self.memory_fit = MemoryFit(learner_id)  # batches split or skipped on CUDA out-of-memory
        self.comm_s, self.first_step_at = 0.0, None  # communication seconds (the group's); when its 1st step ended
        # time.time() when the current step's own work (or the last wait on the group) ended; None
        # between steps and while waiting on the group: what the driver's watchdog judges
        self.computing_since: float | None = None
        self._slowdown, self._stall_s = 1.0, 0.0  # simulated slowness; simulate_stall: the next step hangs this long
        self.leaving: str | None = None  # why this learner must leave (drain, SIGTERM): it stops at a step's end
        self.stop_at = self.deadline = None  # time.time() at which this chunk, and the job's training, should end
        self.group_stops = False  # a collective's members agreed to end the chunk after its last step
        self._reset_chunk()

    # -- data ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.data.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.data.move_to(epoch)

    def next_batch(self):
        """The next batch of this epoch (its own part, then remainders left by learners that
        left), or None when there is none left (`DataCursor`)."""
        return self.data.next_batch()

    def wants_to_stop(self, chunk: bool = True) -> bool:
        """Whether this learner would end its chunk after the step in flight (its time is up, or it
        must leave): a collective's members vote with it, and all end after the same step. Without
        `chunk`, only the job's deadline counts, not the chunk's own end (a kind whose step is a
        round of inner steps ends it early for the deadline or a leave, not the chunk's seconds)."""
        end = self.stop_at if chunk else self.deadline
        return self.leaving is not None or (end is not None and time.time() >= end)

    def batches_left(self) -> int:
        """Planned batches of this epoch not handed out yet (a waiting remainder taken over first)."""
        return self.data.left()

    def set_counters(self, step: int, epoch: int) -> None:
        """Take a group's step and epoch; a different epoch starts at its beginning."""
        with self.lock:
            self.step = step
            if epoch != self.epoch:
                self.data.move_to(epoch)

    def start_next_epoch(self, move_on: bool = False) -> None:
        """The next epoch. With `move_on` (a free-running learner: its epochs are its own), one
        that had no shard in this epoch (it joined after the epoch was split) moves straight to
        the first epoch in which it has one, rather than one epoch per idle step; while the
        planner does not count it as a member yet (the driver's new members are on their way),
        it stays where it is and asks again at its next step."""
        epoch = self.epoch + 1
        if move_on and not self.data.had_part():
            first = call(self.planner, "first_epoch_with", self.learner_id, self.epoch)
            epoch = self.epoch if first is None else max(epoch, first)
        with self.lock:
            self.data.move_to(epoch)

    # -- compute ------------------------------------------------------------------------------
    def forward_backward(self, batch) -> float:
        """Gradients of one batch into `.grad` (outside the lock), in parts if it does not fit in
        device memory (`memory_fit`); returns the loss."""
        start = time.perf_counter()
        zero_grad = partial(self.optimizer.zero_grad, set_to_none=False)
        zero_grad()
        loss = self.memory_fit.backward(batch, partial(_backward, self), zero_grad)
        if self._slowdown > 1.0:  # simulated slowness (spec: simulate.slowdown), tests and benchmarks only
            time.sleep((time.perf_counter() - start) * (self._slowdown - 1.0))
        if self._stall_s > 0:  # a simulated hang (tests and bench/faults.py only)
            stall, self._stall_s = self._stall_s, 0.0
            time.sleep(stall)
        return loss

    def apply_step(self, loss: float, samples: int, update: bool = True) -> None:
        """The optimizer step on the gradients in `.grad` (without `update`: none, the group's sum
        was refused) and the counters, in one atomic change (a state read never sees both halves)."""
        with self.lock:
            if update:
                self.workload.optimizer_step(self.model, self.optimizer, self.step, self.progress, self.lr_scale)
                self.version += 1
            if not math.isfinite(loss) and self.nonfinite_at is None:
                self.nonfinite_at = self.step
            self.step += 1
            self.samples += samples
            self.data.commit()
        if self.first_step_at is None:
            self.first_step_at = time.time()
        self.chunk_samples += samples
        self.loss_sum += loss
        self.loss_n += 1

    # -- state --------------------------------------------------------------------------------
    def counters(self) -> dict:
        return {"step": self.step, "samples": self.samples, **self.data.state(),
                "averages": self.averages, "failed_exchanges": self.failed_exchanges, "busy_steps": self.busy_steps,
                "lr_scale": self.lr_scale, "sent_bytes": self.sent_bytes, "oom_splits": self.memory_fit.splits,
                "oom_skipped": self.memory_fit.skipped, "group": self.kind_states.counters()}

    def state(self) -> dict:
        """Model, optimizer and counters: a consistent copy on the CPU, taken under the weight lock."""
        with self.lock:
            return _cpu_copy({**self.workload.state_dict(self.model, self.optimizer), "counters": self.counters(),
                              "group": self.kind_states.state_dict()})

    def load_state(self, state: dict, adopt: bool = False) -> None:
        """Take over a state: this learner's own (resume), or with `adopt` another learner's model,
        optimizer, step and epoch, keeping this learner's own (zero) sample count and place in
        the data (a learner joining a running job)."""
        with self.lock:
            self.workload.load_state_dict(state, self.model, self.optimizer)
            self.kind_states.load_state_dict(state.get("group", {}), self)
            self.version += 1
            c = state["counters"]
            self.step = c["step"]
            self.data.load(c, adopt)  # a resumed learner carries on inside the epoch where the checkpoint was
            self.lr_scale = c.get("lr_scale", 1.0)  # a newcomer adopts the group's rate too
            if not adopt:
                self.samples, self.averages = c["samples"], c.get("averages", 0)
                self.sent_bytes = c.get("sent_bytes", 0)

    def take_stats(self) -> dict:
        """Counters, plus this chunk's (since the last call) mean loss, samples, per-step wall
        and communication seconds and start times, and the training files this node skipped
        (`skipped`: what -> reason)."""
        stats = {**self.counters(), "loss": self.loss_sum / self.loss_n if self.loss_n else None,
                 "chunk_samples": self.chunk_samples, "step_seconds": self.step_seconds,
                 "comm_seconds": self.comm_seconds, "first_step_at": self.first_step_at,
                 "step_began": self.step_began, "nonfinite_at": self.nonfinite_at,
                 "skipped": self.workload.new_skips(), "refused": self.refusals.take()}
        self._reset_chunk()
        return stats

    def _reset_chunk(self) -> None:
        self.loss_sum = self.loss_n = 0.0
        self.nonfinite_at: int | None = None  # the step of this chunk's first non-finite loss
        self.chunk_samples = 0
        self.step_seconds: list[float] = []
        self.comm_seconds: list[float] = []
        self.step_began: list[float] = []  # time.time() at the start of each of this chunk's steps


def _backward(learner: Learner, part, weight: float) -> float:
    """The gradient of `part`'s loss times `weight` added into `.grad`; returns the loss."""
    loss = learner.workload.loss(learner.model, part)
    if learner._nan_at == learner.step:  # a simulated divergence (spec: simulate.nan_loss_at_step), tests only
        learner._nan_at, loss = None, loss * float("nan")
    (loss * weight).backward()
    return loss.item()


def _cpu_copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(v) for v in value)
    return value
