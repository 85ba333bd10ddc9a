"""Learner: one model replica, its optimizer, its data shard and its counters, driven by a learner
group. Workload-agnostic: it only calls the workload interface (build model/optimizer, batches,
loss, evaluate, state).

Weights are touched under one lock, so a partner's averaging request (served on the `mix`
concurrency group while this learner computes) and this learner's own optimizer step never
interleave: both sides of a pairwise average end with the same mean.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from contextlib import contextmanager
from functools import partial

import ray
import torch

from orchestrator import flat_state
from orchestrator.data_cursor import DataCursor
from orchestrator.memory_fit import MemoryFit
from orchestrator.runtime import call
from orchestrator.state_store import StateStore
from orchestrator.workload import build_workload

GRAD_TAIL = 4  # slots after the gradients in the flat gradient buffer (`flat_grad_buffer`)


class ReplicaWeights:
    """A learner's trainable weights as one flat tensor, read and written under its weight lock
    (`self.lock`, `self.params`, `self.device` are the learner's)."""

    def flat_weights(self, on_device: bool = False) -> torch.Tensor:
        """A copy of the trainable weights as one flat tensor: on the CPU, or on the learner's
        device (for collectives)."""
        with self.lock:
            return self.flat.clone() if on_device or self.device.type == "cpu" else self.flat.cpu()

    def snapshot(self, out: torch.Tensor) -> int:
        """Copy the trainable weights into the flat CPU tensor `out` (`numel` long); returns their
        `version` (which every change of the weights increments)."""
        with self.lock:
            out.copy_(self.flat)
            return self.version

    def settle_mean(self, active: torch.Tensor, passive: torch.Tensor, mine: torch.Tensor, version: int) -> None:
        """After a pairwise exchange in which this learner sent `mine`, its snapshot at `version`:
        its weights become the mean of the active partner's and the passive's (`assign_mean`). If
        they changed since the snapshot (its own step, a handover), the mean's change is added to
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
        (on the CPU)."""
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


class Learner(ReplicaWeights):
    """Args:
    workload: the registered workload's name (`orchestrator.workload`).
    workload_config: the workload's sections of the job spec (a dict, as sent over Ray).
    seed: the job's seed (every learner starts from the same initial weights).
    learner_id: this learner's id in its job.
    planner: the job's `ShardPlanner` (or its actor), asked for this learner's shard every epoch.
    threads: torch intra-op threads for this learner.
    use_gpu: it reserved a GPU (or a share): the model lives there if the process sees one (one
    that reserved none is also started with CUDA hidden, `runtime.py`), else on the CPU.
    Weights and states cross the learner's boundary as CPU tensors.
    """

    def __init__(self, workload: str, workload_config: dict, seed: int, learner_id: int, planner, threads: int = 1,
                 use_gpu: bool = True):
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
        self.node_address: str | None = None  # its node's address, which its groups bind to (None: this process only)
        self.learner_id, self.planner = learner_id, planner
        self.lock, self.counter_lock = threading.Lock(), threading.Lock()  # weights; counters its links add to
        self.step = self.samples = self.averages = 0
        self.failed_exchanges = self.busy_steps = 0  # gossip: exchanges lost; steps that started none (links busy)
        self.sent_bytes = 0  # what its group sent between hosts (collectives: by their algorithm's count)
        self.progress = 0.0  # fraction of the job's budget spent, set by the driver
        self.lr_scale = 1.0  # times the scheduled learning rate; halved by each rollback, kept in the state
        self._nan_at: int | None = None  # simulate.nan_loss_at_step (tests only)
        self.data = DataCursor(self.workload, planner, learner_id)  # its epoch, part and position in it
        self._slowdown = 1.0
        self.memory_fit = MemoryFit(learner_id)  # batches split or skipped on CUDA out-of-memory
        self.comm_s = 0.0  # communication seconds, added to by the group
        self.first_step_at: float | None = None  # time.time() when this process finished its first step
        # time.time() when the current step's own work (or the last wait on the group) ended; None
        # between steps and while waiting on the group: what the driver's watchdog judges
        self.computing_since: float | None = None
        self._stall_s = 0.0  # simulate_stall: the next step hangs this long (tests of the watchdog)
        self.leaving: str | None = None  # why this learner must leave (drain, SIGTERM): it stops at a step's end
        self.stop_at: float | None = None  # time.time() at which this chunk should end
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

    def wants_to_stop(self) -> bool:
        """Whether this learner would end its chunk after the step in flight (its time is up, or it
        must leave): a collective's members vote with it, and all end after the same step."""
        return self.leaving is not None or (self.stop_at is not None and time.time() >= self.stop_at)

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

    def apply_step(self, loss: float, samples: int) -> None:
        """The optimizer step on the gradients in `.grad`, and the counters that go with it, in
        one atomic change (a state read never sees weights and counters of different steps)."""
        with self.lock:
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

    def timed_step(self, group) -> None:
        """One `group.step`; a step that trained something adds its wall and communication
        seconds to this chunk's timings."""
        step, comm, start, began = self.step, self.comm_s, time.perf_counter(), time.time()
        self.computing_since = began
        try:
            group.step(self)
        finally:
            self.computing_since = None
        if self.step > step:
            self.step_seconds.append(time.perf_counter() - start)
            self.comm_seconds.append(self.comm_s - comm)
            self.step_began.append(began)

    @contextmanager
    def waiting_on_group(self):
        """Time spent waiting for other learners (a collective, a partner's average): the watchdog
        does not count it against this learner."""
        computing, self.computing_since = self.computing_since, None
        try:
            yield
        finally:
            self.computing_since = time.time() if computing is not None else None

    # -- state --------------------------------------------------------------------------------
    def counters(self) -> dict:
        return {"step": self.step, "samples": self.samples, **self.data.state(),
                "averages": self.averages, "failed_exchanges": self.failed_exchanges, "busy_steps": self.busy_steps,
                "lr_scale": self.lr_scale, "sent_bytes": self.sent_bytes, "oom_splits": self.memory_fit.splits,
                "oom_skipped": self.memory_fit.skipped}

    def state(self) -> dict:
        """Model, optimizer and counters: a consistent copy on the CPU, taken under the weight lock."""
        with self.lock:
            return _cpu_copy({**self.workload.state_dict(self.model, self.optimizer), "counters": self.counters()})

    def load_state(self, state: dict, adopt: bool = False) -> None:
        """Take over a state: this learner's own (resume), or with `adopt` another learner's model,
        optimizer, step and epoch, keeping this learner's own (zero) sample count and place in
        the data (a learner joining a running job)."""
        with self.lock:
            self.workload.load_state_dict(state, self.model, self.optimizer)
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
                 "skipped": self.workload.new_skips()}
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


def cudnn_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The first recurrent module's trainable weights in its own order (w_ih, w_hh, b_ih, b_hh per
    layer and direction). cuDNN runs a recurrent module on its weights in place only when they lie
    back to back in that order from the start of their storage (ATen's `try_get_weight_buf`); else it
    compacts them into a new buffer at every call, with a warning. So the flat weight buffer starts
    with these. Only one module's can: in a model with several, the others are compacted."""
    rnn = next((m for m in model.modules() if isinstance(m, torch.nn.RNNBase)), None)
    return [w for w in rnn._flat_weights if w is not None and w.requires_grad] if rnn is not None else []


def flat_weight_buffer(params: list[torch.Tensor], device: torch.device,
                       first: list[torch.Tensor] = ()) -> torch.Tensor:
    """One flat tensor that every parameter's data becomes a view into (the parameters stay the
    same objects, so the optimizer is unaffected): weights are read, sent and averaged without
    gathering them first. The parameters of `first` (`cudnn_weights`) come first, in their order,
    then the others in theirs: the same layout on every learner, whatever its device."""
    buffer = torch.zeros(sum(p.numel() for p in params), device=device, dtype=params[0].dtype if params else None)
    leading = [p for p in first if any(p is q for q in params)]
    offset = 0
    for p in leading + [p for p in params if not any(p is q for q in leading)]:
        buffer[offset:offset + p.numel()].copy_(p.data.reshape(-1))
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return buffer


def flat_grad_buffer(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One flat buffer that every gradient is a view into (as DDP's gradient_as_bucket_view), so
    groups all-reduce it in place without copies; GRAD_TAIL extra slots after the gradients carry
    what a collective step sums besides them (`groups/allreduce.py`: stop votes, batches left, batch
    size, loss)."""
    buffer = torch.zeros(sum(p.numel() for p in params) + GRAD_TAIL, device=device)
    offset = 0
    for p in params:
        p.grad = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return buffer


def _cpu_copy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu_copy(v) for v in value)
    return value


class SimulatedFaults:
    """Tests and bench/faults.py only: faults a learner can be told to simulate (`LearnerService`
    holds the flags, its learner and its passive links)."""

    @ray.method(concurrency_group="mix")
    def simulate_exit_in_join(self) -> None:
        """Tests and bench/faults.py only: the process exits as its next `join` begins (its peers
        are then waiting for it at the rendezvous)."""
        self._exit_in_join = True

    @ray.method(concurrency_group="mix")
    def simulate_stall(self, seconds: float) -> None:
        """Tests and bench/faults.py only: the next step hangs `seconds` (alive, answering pings)."""
        self.learner._stall_s = float(seconds)

    def perturb(self, scale: float, seed: int) -> None:
        """Tests only: add Gaussian noise to the weights (make replicas disagree)."""
        gen = torch.Generator().manual_seed(seed)
        flat = self.learner.flat_weights()
        self.learner.load_flat_weights(flat + scale * torch.randn(flat.shape, generator=gen))

    def simulate_nan_loss(self, step: int | None) -> None:
        """Tests only (spec: simulate.nan_loss_at_step): the loss of `step` is NaN, once."""
        self.learner._nan_at = step

    @ray.method(concurrency_group="mix")
    def simulate_exit_in_average(self) -> None:
        """Tests and bench/faults.py only: the process exits inside the next averaging request or
        gossip exchange it serves, after its partner sent its request and before it answers."""
        self._exit_in_average = self.passive_links.exit_in_exchange = True


class LearnerService(SimulatedFaults):
    """What a learner offers its driver and its group: `run` trains; averaging requests and weight
    reads are served on the `mix` concurrency group, concurrently with `run`. `LearnerActor` is
    this class as a Ray actor; one-learner jobs use it in-process."""

    def __init__(self, workload: str, workload_config: dict, seed: int, learner_id: int, planner, threads: int = 1,
                 slowdown: float = 1.0, use_gpu: bool = True):
        from orchestrator.groups.links import PassiveLinks

        self.learner = Learner(workload, workload_config, seed, learner_id, planner, threads, use_gpu)
        self.learner._slowdown, self.group = float(slowdown), None
        self.passive_links = PassiveLinks(self.learner)  # gossip links its active partners opened
        self._trainable = None  # which entries of the model's flat state are trainable weights
        self._exit_in_join = self._exit_in_average = False

    def device(self) -> str:
        return self.learner.device.type

    def node_id(self) -> str:
        """The Ray node it runs on (`local` in the driver's process)."""
        return "local"

    def ip(self) -> str:
        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        import socket

        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def hello(self) -> dict:
        """Once built (and any state sent before loaded): node, pid, device, CUDA_VISIBLE_DEVICES, counters."""
        return {"node": self.node_id(), "pid": os.getpid(), "ready_at": time.time(), "device": str(self.learner.device),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **self.learner.counters()}

    def join(self, group_state) -> None:
        """Attach this learner to its group (a groups.* member object, built by the driver),
        leaving the group it was in."""
        if self._exit_in_join:  # a simulated death while the group forms (tests and bench/faults.py only)
            os._exit(1)
        if self.group is not None:
            self.group.close()
        self.group = group_state
        self.group.setup(self.learner)

    @ray.method(concurrency_group="mix")
    def ping(self) -> bool:
        """Answers while the learner's process is alive, even in the middle of a step."""
        return True

    @ray.method(concurrency_group="mix")
    def heartbeat(self) -> dict:
        """Its step count and since when its current step has been computing (None while it waits
        on its group or between chunks), answered even in the middle of a step."""
        return {"step": self.learner.step, "computing_since": self.learner.computing_since}

    @ray.method(concurrency_group="mix")
    def leave(self, reason: str) -> None:
        """This learner must leave (its node is drained): it ends its chunk at the end of the step
        in flight where its group allows (`stops_alone`), else at the chunk's end."""
        self.learner.leaving = self.learner.leaving or reason

    @ray.method(concurrency_group="mix")
    def regroup(self, group_state) -> None:
        """Swap in a new member of a group whose `setup` is a no-op (gossip) while `run` goes on:
        the next step uses it."""
        self.group = group_state

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

        A learner that may stop alone (`stops_alone`: gossip) checks the time before each step; the
        members of a collective vote in each step's collective (`Learner.wants_to_stop`) and all end
        the chunk after the first step in which any voted: never more than a step past the deadline."""
        from orchestrator.groups import GroupBroken

        learner = self.learner
        learner.progress = progress
        alone = getattr(self.group, "stops_alone", True)
        ends = [t for t in (deadline, time.time() + seconds if seconds else None) if t is not None]
        learner.stop_at, learner.group_stops = (min(ends) if ends else None), False
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
        learner.stop_at = None
        return {**learner.take_stats(), "broken": broken, "leaving": learner.leaving}

    def mix(self, rounds: int) -> int:
        """`rounds` gossip exchanges without gradient steps; returns this learner's averages."""
        for _ in range(rounds):
            self.group.mix(self.learner)
        return self.learner.averages

    def settle_exchanges(self) -> None:
        """The job's end, first half, on every learner: settle the gossip exchanges it started."""
        getattr(self.group, "settle_all", lambda learner: None)(self.learner)

    def align_after_exchanges(self) -> None:
        """The job's end, second half: the exchanges it serves settle on its side too, then a hierarchical
        node takes its leader's weights (so the last evaluation holds both halves of every exchange)."""
        self.passive_links.wait_answered()
        getattr(self.group, "align", lambda learner: None)(self.learner)

    @ray.method(concurrency_group="links")
    def open_link(self, key: str, address: str, compression: str = "none", interface: str | None = None) -> str:
        """An active gossip partner opens a link to this learner (`groups/links.py`): this side
        joins its rendezvous in a thread and serves its exchanges there; returns the link's codec."""
        return self.passive_links.open(key, address, compression, interface)

    @ray.method(concurrency_group="mix")
    def average(self, other: torch.Tensor) -> torch.Tensor:
        """One pairwise average through the object store (a leaving learner's handover)."""
        if self._exit_in_average:  # a simulated death mid-exchange (tests and bench/faults.py only)
            os._exit(1)
        return self.learner.average(other)

    @ray.method(concurrency_group="mix")
    def weights(self) -> torch.Tensor:
        return self.learner.flat_weights()

    @ray.method(concurrency_group="mix")
    def load_weights(self, flat: torch.Tensor) -> None:
        self.learner.load_flat_weights(flat)

    @ray.method(concurrency_group="mix")
    def state(self) -> dict:
        return self.learner.state()

    def load_state(self, state: dict, adopt: bool = False) -> None:
        self.learner.load_state(state, adopt)

    # -- checkpoints and evaluation, without the driver holding a model ---------------------------
    @ray.method(concurrency_group="mix")
    def save_state(self, store_root: str, name: str) -> dict:
        """Write this learner's state as `name` into the run's store (`state_store.py`); returns
        the manifest's entry for it: the file, its bytes and the counters it holds."""
        state = self.learner.state()
        return {"file": name, "bytes": StateStore(store_root).write(name, state), "counters": state["counters"]}

    def load_state_file(self, store_root: str, entry: dict, adopt: bool = False) -> None:
        """`load_state` of a checkpoint's entry: its file read here, its counters (a file shared by
        learners whose weights are equal holds one learner's) taken from the entry."""
        state = StateStore(store_root).read(entry["file"])
        self.learner.load_state({**state, "counters": entry.get("counters", state["counters"])}, adopt)

    @ray.method(concurrency_group="mix")
    def model_vector(self) -> torch.Tensor:
        """The model's floating-point state as one flat CPU tensor (`flat_state.py`)."""
        with self.learner.lock:
            return flat_state.to_vector(self.learner.model)

    @ray.method(concurrency_group="mix")
    def add_vectors(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """a + b: one node of the tree in which learners sum their models (`consensus.py`)."""
        return a + b

    @ray.method(concurrency_group="mix")
    def distance_to(self, total: torch.Tensor, count: int) -> float:
        """L2 distance of this learner's trainable weights to those of the mean `total / count`."""
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
