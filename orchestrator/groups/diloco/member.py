"""One learner's part of a `diloco` group (`DilocoMember`): inner steps, where its round stands
(`RoundClock`), the round's barrier, its fragment's outer sync in a thread of its own (`Sync`) and
the outer step when it lands, the agreement of a (re-)formed group and the end of the run (see the
package's docstring)."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

from orchestrator.groups.collectives import collective, join_process_group, leave_process_group
from orchestrator.groups.diloco.outer import NAME, OuterState, fragment_bounds
from orchestrator.groups.errors import GroupBroken
from orchestrator.groups.guard import STRANGERS, verify_members
from orchestrator.groups.host_reduce import HostReduce, ring_bytes
from orchestrator.groups.registry import kind_of

TAIL = 4  # a sync buffer's exact slots after the fragment: [0, 0, samples weighed, 0]
REFUSED_OUTER = "a DiLoCo outer gradient that is not finite"


class Sync:
    """One fragment's outer sync, in a thread of its own: the members' sum of their weighted
    pseudo-gradients (`HostReduce.sum`), landed later by `OuterStep.land`."""

    def __init__(self, fragment: int, buffer: torch.Tensor, sent: torch.Tensor, weight: int, by_host: HostReduce,
                 learner, blocking: bool = False):
        self.fragment, self.buffer, self.sent, self.weight = fragment, buffer, sent, weight
        self.error: Exception | None = None
        self._by_host, self._learner = by_host, learner
        self._thread = threading.Thread(target=self._run, name=f"diloco-sync-{fragment}", daemon=True)
        if blocking:
            self._run()
        else:
            self._thread.start()

    def _run(self) -> None:
        try:
            self._learner.count_sent(self._by_host.sum(self.buffer))
        except Exception as exc:  # noqa: BLE001 - GroupBroken, or anything the library raised: the main thread's
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        if self._thread.ident is not None:
            self._thread.join()


class RoundClock:
    """Where one learner's round / F stands (a chunk of `group.diloco`'s round): the inner steps
    it took and when it ends, `inner_steps` / F or `round_seconds` / F (one step while the
    learner's step count is under `warmup_steps`); it outlives a chunk that the epoch's end cut
    short, and restarts when the round's sync is sent."""

    def __init__(self, options, fragments: int):
        self.steps = -(-options.inner_steps // fragments) if options.inner_steps else None
        self.seconds = options.round_seconds / fragments if options.round_seconds else None
        self.warmup_steps, self.warming = options.warmup_steps, False
        self.step_s = 0.0  # a rolling mean of the inner steps' seconds (a timed round starts none it cannot end)
        self.restart()

    def restart(self) -> None:
        self.done, self.ends = 0, None

    def begin(self, step: int) -> None:
        """A chunk begins at the learner's step count `step`: a chunk begun in the warm-up is one
        step long; a timed round's clock starts with its first chunk."""
        self.warming = step < self.warmup_steps
        if self.seconds is not None and self.ends is None:
            self.ends = time.time() + self.seconds

    def over(self, taken: int) -> bool:
        """Whether the round is over, `taken` steps into this chunk (a chunk takes one at least): its
        steps done, or the next step would end after its seconds (a fast learner would wait for
        it); a chunk begun in the warm-up, after one step."""
        if self.warming:
            return bool(taken)
        if self.steps is not None:
            return self.done >= self.steps
        return bool(taken) and time.time() + self.step_s > self.ends

    def took(self, seconds: float) -> None:
        self.done += 1
        self.step_s = 0.8 * self.step_s + 0.2 * seconds if self.step_s else seconds


class DilocoMember:
    """One learner's part of a DiLoCo group (see the module's docstring).

    Args:
    rank, world_size, meeting, backend: its place in the group's process group and where it meets.
    options: the spec's `group.diloco` (`DilocoOptions`).
    hosts: every host's ranks (`host_reduce.hosts_of`): sums are taken host by host.
    compression: how sums cross between hosts (`group.compression`).
    interface: `group.interface` (None: the node address's).
    max_epochs: `budget.epochs` (None: none); each member ends its last epoch with the others.
    """

    lockstep = True
    stops_alone = False

    def __init__(self, rank: int, world_size: int, meeting, options, backend: str = "gloo",
                 hosts: list[list[int]] | None = None, compression: str = "none", interface: str | None = None,
                 timeout_s: float = 120, max_epochs: int | None = None):
        self.rank, self.world_size, self.meeting, self.options = rank, world_size, meeting, options
        self.max_epochs = max_epochs
        self.backend, self.hosts, self.compression, self.interface = backend, hosts, compression, interface
        self.timeout_s = timeout_s
        self.fragments = options.streaming.fragments
        self.by_host: HostReduce | None = None  # made in the learner's process, as what follows
        self.outer: OuterState | None = None
        self.bounds: list[tuple[int, int]] = []
        self.in_flight: Sync | None = None
        self._learner = None  # the learner it was set up in (a re-form's `close` lands its sync there)
        self.clock = RoundClock(options, self.fragments)

    # -- forming --------------------------------------------------------------------------------
    def setup(self, learner) -> None:
        guard = join_process_group(self.backend, self.meeting, self.rank, self.world_size, self.timeout_s, learner,
                                   interface=self.interface)
        self.by_host = HostReduce(self.rank, self.hosts or [[r] for r in range(self.world_size)], self.compression,
                                  collective, self.timeout_s,
                                  verify=lambda group, ranks, name: verify_members(
                                      learner.secret, f"{self.meeting.name}/{name}", ranks.index(self.rank),
                                      len(ranks), group, learner.device))
        guard.apply()
        self.outer, self._learner = learner.kind_states.get(kind_of(NAME), learner), learner
        self.outer.begin(learner, self.fragments)
        self.bounds = fragment_bounds(learner.numel, self.fragments)
        self._agree(learner)
        guard.apply()
        STRANGERS.watch(port for _, port in guard.filtered)

    def _agree(self, learner) -> None:
        """Every member takes rank 0's outer state; what members trained since their last sync that
        landed is summed (each fragment one sync, blocking); then every member starts from the
        global weights."""
        outer = self.outer
        own_global = outer.global_weights.clone()
        if not self._states_differ(learner):  # (usually: a first group, a newcomer that adopted a peer's)
            shared = None
        else:  # 2 x the weights: over a 5 Mbit/s link, a 10M model's took longer than a join may
            shared = torch.cat([outer.global_weights, outer.momentum, torch.tensor([float(outer.syncs)])])
            shared = shared.to(learner.device)
            collective(dist.broadcast, shared, src=0)
        if shared is not None and self.rank != 0 and not outer.take(shared.cpu()):
            learner.refusals.refuse("the group's rank 0", "a DiLoCo outer state that is not finite")
            raise GroupBroken("rank 0's outer state is not finite")
        pending = torch.tensor([float(p) for p in outer.pending], device=learner.device)
        collective(dist.all_reduce, pending)
        if float(pending.sum()) > 0:
            local = learner.flat_weights()
            for f, (a, b) in enumerate(self.bounds):  # what each trained, against its own global weights
                if float(pending[f]) > 0:
                    self._land(learner, self._send(learner, f, own_global[a:b] - local[a:b], blocking=True),
                               advance=False)
            with outer.lock:
                outer.catch_ups += 1
        learner.load_flat_weights(outer.global_weights)
        outer.pending = [0] * self.fragments

    def _states_differ(self, learner) -> bool:
        """Whether the members' outer states differ (`OuterState.fingerprint`): rank 0's is sent then."""
        mark = self.outer.fingerprint()
        both = torch.cat([mark, -mark]).to(learner.device)
        collective(dist.all_reduce, both, dist.ReduceOp.MAX)
        return not torch.equal(both[:mark.numel()], -both[mark.numel():])

    # -- training -------------------------------------------------------------------------------
    def step(self, learner) -> None:
        """One round / F (`RoundClock`), ended early by the job's deadline, a leave or its last
        epoch's part used up (an earlier epoch's end it passes alone: `move_on_alone`); the members'
        barrier; the round's fragment sent if any member's round is over (a chunk that all ended at
        their last epoch's end sends none: waiting there for the sync in flight would cost a slow
        link's transfer). All end here."""
        clock, outer = self.clock, self.outer
        clock.begin(learner.step)
        taken, over = 0, True
        while not clock.over(taken):
            if learner.wants_to_stop(chunk=False):
                break
            if self.in_flight is not None and self.in_flight.done():  # landed meanwhile: its outer step now
                self._wait(learner)
            batch = learner.next_batch()
            if batch is None and move_on_alone(learner, self.max_epochs):
                batch = learner.next_batch()
            if batch is None:  # its last epoch's part used up (or a newcomer's first part not yet planned)
                over = False
                break
            started = time.perf_counter()
            learner.apply_step(learner.forward_backward(batch), batch.size)
            clock.took(time.perf_counter() - started)
            outer.pending = [p + batch.size for p in outer.pending]
            taken += 1
            with learner.waiting_on_group():  # each inner step is judged on its own by the watchdog
                pass
        left, over, level = barrier(learner, over, self.world_size)
        if over:
            self._wait(learner)
            fragment = outer.syncs % self.fragments
            a, b = self.bounds[fragment]
            self.in_flight = self._send(learner, fragment, outer.global_weights[a:b] - learner.flat_weights()[a:b])
            clock.restart()
        if left == 0 and level:  # all in their last epoch with nothing left: they turn it together
            learner.start_next_epoch()
        learner.group_stops = True

    def _send(self, learner, fragment: int, delta: torch.Tensor, blocking: bool = False) -> Sync:
        """Fragment `fragment`'s pseudo-gradient `delta` (global - local), weighted by the samples
        trained since its last sync, summed over the members (in a thread unless `blocking`)."""
        a, b = self.bounds[fragment]
        weight = self.outer.pending[fragment]
        buffer = torch.cat([delta * weight, torch.tensor([0.0, 0.0, float(weight), 0.0])])
        self.outer.pending[fragment] = 0
        self.by_host.residual = self.outer.residuals.get(fragment)  # each fragment its own error feedback
        sync = Sync(fragment, buffer.to(learner.device), learner.flat_weights()[a:b], weight, self.by_host, learner,
                    blocking)
        if blocking:
            self.outer.residuals[fragment] = self.by_host.residual
        return sync

    def _wait(self, learner) -> None:
        """The sync in flight, waited for and landed (GroupBroken if a member is gone: what it
        carried is counted as not sent, and the re-formed group sums it)."""
        sync, self.in_flight = self.in_flight, None
        if sync is None:
            return
        start = time.perf_counter()
        with learner.waiting_on_group():
            sync.wait()
        learner.comm_s += time.perf_counter() - start
        self.outer.residuals[sync.fragment] = self.by_host.residual
        if sync.error is not None:
            self.outer.pending[sync.fragment] += sync.weight
            self.outer.lost_syncs += 1
            raise GroupBroken(f"a DiLoCo sync failed: {sync.error}") from sync.error
        self._land(learner, sync)

    def _land(self, learner, sync: Sync, advance: bool = True) -> None:
        """A landed sync's outer step (`OuterState.outer_step`); the learner's fragment becomes the
        new global plus what it trained since the sync was sent."""
        if sync.error is not None:
            raise GroupBroken(f"a DiLoCo sync failed: {sync.error}") from sync.error
        a, b = self.bounds[sync.fragment]
        total = float(sync.buffer[-2])
        mean = sync.buffer[:-TAIL].cpu() / total if total > 0 else None
        if not self.outer.outer_step(a, b, mean, self.options, advance):
            learner.refusals.refuse("the group", REFUSED_OUTER)
        delta = torch.zeros(learner.numel)
        delta[a:b] = self.outer.global_weights[a:b] - sync.sent
        learner.add_to_weights(delta)

    # -- the end --------------------------------------------------------------------------------
    def finish(self, learner) -> bool:
        """Before the last evaluation: the sync in flight landed, what is left synced, every member
        on the global weights; whether it is (a member gone meanwhile: each keeps its own, False)."""
        try:
            self._wait(learner)
            local = learner.flat_weights()
            pending = torch.tensor([float(p) for p in self.outer.pending], device=learner.device)
            collective(dist.all_reduce, pending)
            for f, (a, b) in enumerate(self.bounds):
                if float(pending[f]) > 0:
                    self._land(learner, self._send(learner, f, self.outer.global_weights[a:b] - local[a:b],
                                                   blocking=True))
            learner.load_flat_weights(self.outer.global_weights)
            return True
        except GroupBroken:
            return False

    def close(self) -> None:
        if self.in_flight is not None:  # a re-form: the members' sync in flight lands (or fails) on all alike
            try:
                self._wait(self._learner)
            except GroupBroken:  # what it carried is summed by the next group (`_agree`)
                pass
        if self.by_host is not None:
            self.by_host.close()
        leave_process_group()


def move_on_alone(learner, max_epochs: int | None) -> bool:
    """A learner's part of its epoch is used up: it moves on to its next epoch alone (as a gossip
    learner does: a fast one never waits at an epoch's end), unless that would end its last epoch
    (`budget.epochs`): all members end that one together, at the barrier. Whether it moved."""
    if max_epochs is not None and learner.epoch + 1 >= max_epochs:
        return False
    epoch = learner.epoch
    learner.start_next_epoch(move_on=True)
    return learner.epoch != epoch


def barrier(learner, over: bool, world_size: int) -> tuple[float, bool, bool]:
    """The members' small exact all-reduce at a chunk's end: the batches their shards have left,
    whether any member's round is over, and whether all are in one epoch (n x sum e^2 = (sum e)^2)."""
    epoch = float(learner.epoch)
    tail = torch.tensor([float(learner.batches_left()), float(over), epoch, epoch * epoch], dtype=torch.float64,
                        device=learner.device)
    start = time.perf_counter()
    with learner.waiting_on_group():
        collective(dist.all_reduce, tail)
    learner.comm_s += time.perf_counter() - start
    learner.count_sent(ring_bytes(tail.numel() * 8, world_size))
    return float(tail[0]), float(tail[1]) > 0, float(tail[3]) * world_size == float(tail[2]) ** 2
